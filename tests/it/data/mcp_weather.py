#!/usr/bin/env python3
"""A one-tool MCP server over stdio (JSON-RPC lines) for the Codex harness test: `lookup_weather`
answers with text; anything else is a tool error."""
import json
import sys

TOOLS = [{
    "name": "lookup_weather",
    "description": "Look up the weather for a city.",
    "inputSchema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"],
    },
}]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        continue
    ident, method = message.get("id"), message.get("method")
    if method == "initialize":
        version = message.get("params", {}).get("protocolVersion", "2024-11-05")
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": version, "capabilities": {"tools": {}},
            "serverInfo": {"name": "wx", "version": "0.1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        params = message.get("params", {})
        if params.get("name") == "lookup_weather":
            city = params.get("arguments", {}).get("city", "?")
            content = [{"type": "text", "text": "Sunny, 21 C in " + city}]
            send({"jsonrpc": "2.0", "id": ident, "result": {"content": content}})
        else:
            content = [{"type": "text", "text": "unknown tool"}]
            send({"jsonrpc": "2.0", "id": ident, "result": {"content": content, "isError": True}})
    elif ident is not None:
        send({"jsonrpc": "2.0", "id": ident, "result": {}})
