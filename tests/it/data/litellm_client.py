"""LiteLLM's Python SDK as a harness's model client through `gyre proxy`.

Usage: python litellm_client.py OPENAI_BASE_URL API_KEY

Agent harnesses such as SWE-agent, mini-swe-agent and OpenHands call their model through
`litellm.completion`, which speaks each provider's API from one OpenAI-shaped interface. Three
tool loops, each until the model answers without a tool call (the SDK's answer message is
appended to the history as LiteLLM returns it, then one `tool` message per call):

1. `openai/…` through `/v1/chat/completions`, not streamed: LiteLLM keeps the answer's
   `reasoning_content` and sends it back.
2. `anthropic/…` through `/v1/messages` with extended thinking, not streamed: LiteLLM turns the
   answer's `thinking_blocks` (with their signatures) back into `thinking` blocks.
3. The same, streamed, its chunks assembled with `litellm.stream_chunk_builder`.

Prints one line per call: the loop, the finish reason, the content and the reasoning.
"""

import json
import os
import sys

# No network: LiteLLM reads its bundled model list instead of fetching one.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

openai_base, key = sys.argv[1], sys.argv[2]
anthropic_base = openai_base.removesuffix("/v1")
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
thinking = {"type": "enabled", "budget_tokens": 1024}


def tool_loop(name, model, base, city, stream=False, **settings):
    messages = [{"role": "user", "content": f"Weather in {city}?"}]
    for _ in range(4):
        if stream:
            chunks = list(
                litellm.completion(
                    model=model, api_base=base, api_key=key, messages=messages,
                    tools=tools, stream=True, **settings,
                )
            )
            response = litellm.stream_chunk_builder(chunks, messages=messages)
        else:
            response = litellm.completion(
                model=model, api_base=base, api_key=key, messages=messages, tools=tools,
                **settings,
            )
        choice = response.choices[0]
        message = choice.message
        reasoning = getattr(message, "reasoning_content", None)
        print(
            f"{name}: finish={choice.finish_reason} content={message.content!r} "
            f"reasoning={reasoning!r}",
            flush=True,
        )
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": f"sunny in {city}"}
            )
    raise SystemExit(f"{name}: the model kept calling tools")


tool_loop("chat", "openai/gyre-policy", openai_base, "Paris")
tool_loop("messages", "anthropic/claude-sonnet-4-5", anthropic_base, "Oslo", thinking=thinking)
tool_loop(
    "messages-streamed", "anthropic/claude-sonnet-4-5", anthropic_base, "Rome", stream=True,
    thinking=thinking,
)
