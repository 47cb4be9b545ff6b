#!/usr/bin/env python3
# Latency of Anthropic Message Threads continues against stateless re-sends through one
# `gyre proxy` (see docs/benchmarks.md, session 34). Start the proxy first:
#   target/release/gyre proxy --listen 127.0.0.1:0 --engine deterministic --log /tmp/t.log --open 2
# then: python3 scripts/bench_threads.py HOST:PORT TOKEN_STATELESS TOKEN_THREAD [TURNS]
# (the two tokens the proxy printed). Standard library only.
import json, sys, time, http.client, statistics
base = sys.argv[1]  # host:port
tokens = sys.argv[2:4]
turns = int(sys.argv[4]) if len(sys.argv) > 4 else 60
host, port = base.split(':')
conn = http.client.HTTPConnection(host, int(port))
def post(token, body):
    data = json.dumps(body)
    t = time.perf_counter()
    conn.request('POST', '/v1/messages', data, {'content-type': 'application/json', 'x-api-key': token})
    r = conn.getresponse(); out = r.read()
    dt = time.perf_counter() - t
    assert r.status == 200, (r.status, out[:300])
    return json.loads(out), dt
system = "You are a careful agent. " * 200
filler = "tool output line with some words in it. " * 40
stateless, threaded = [], []
hist = [{"role": "user", "content": "Start the task."}]
first, _ = post(tokens[1], {"model": "m", "max_tokens": 32, "system": system, "messages": hist, "thread": {"type": "create"}})
prev = first
hist_s = list(hist)
a, _ = post(tokens[0], {"model": "m", "max_tokens": 32, "system": system, "messages": hist_s})
hist_s.append({"role": "assistant", "content": a["content"]})
for i in range(turns):
    turn = {"role": "user", "content": f"turn {i}: " + filler}
    hist_s.append(turn)
    a, dt = post(tokens[0], {"model": "m", "max_tokens": 32, "system": system, "messages": hist_s})
    stateless.append(dt)
    hist_s.append({"role": "assistant", "content": a["content"]})
    b, dt = post(tokens[1], {"model": "m", "max_tokens": 32, "messages": [turn], "thread": {"type": "continue", "previous_message_id": prev["id"]}})
    threaded.append(dt)
    prev = b
q = lambda xs, p: sorted(xs)[min(len(xs)-1, int(p*len(xs)))]
for name, xs in [("stateless re-send", stateless), ("thread continue", threaded)]:
    print(f"{name}: p50 {1000*statistics.median(xs):.2f} ms, p90 {1000*q(xs,0.9):.2f} ms, n={len(xs)}")
