#!/usr/bin/env python3
"""A sustained serving load for a bounded time: the power-pacing measurement of
docs/HOMEOSTASIS.md and docs/PERFORMANCE.md ("Homeostasis").

--concurrency workers each send one /v1/completions request after another (-n tokens,
`ignore_eos`, a new connection per request) until --duration seconds have passed; the
requests running then finish and count, and the window ends when the last one does. At both
ends the server's /metrics is read: the energy counter's difference divided by the tokens
generated is the J/token the server used (octoflow serve exports
octoflow_gpu_energy_joules_total where the GPU has a sensor).

Prints one JSON line: tokens, seconds, tok/s, joules, J/token, tokens/J, requests, errors.
Standard library only.

  python3 scripts/bench/serve_load.py --url http://127.0.0.1:8080 --concurrency 128 \
      --duration 120 -n 128
"""

import argparse
import asyncio
import json
import sys
import time
import urllib.request

from agents_http import post_json  # beside this script

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator works to a curious ten-year-old.",
    "List the steps to plant a tree and keep it alive in its first year.",
    "Describe a walk through a busy market in the early morning.",
]


# --schema: every request's output constrained to this JSON schema (structured output's cost)
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "steps": {"type": "array", "items": {"type": "string"}},
    "done": {"type": "boolean"}}, "required": ["title", "steps", "done"]}


async def complete(url, prompt, n, schema=False):
    """One completion: (completion tokens, None), or (None, the error)."""
    doc = {"prompt": prompt, "max_tokens": n, "temperature": 0.7, "ignore_eos": not schema}
    if schema:
        doc["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "plan", "schema": SCHEMA}}
    status, payload = await post_json(url, "/v1/completions", doc)
    if status != "200":
        return None, f"HTTP {status}: {payload[:200]!r}"
    return json.loads(payload)["usage"]["completion_tokens"], None


def energy(url):
    """The server's energy counter in joules, or None where it exports none."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("octoflow_gpu_energy_joules_total "):
                return float(line.split()[1])
    return None


async def main(a):
    deadline = time.monotonic() + a.duration
    tokens, requests, errors = [0], [0], []

    async def worker(w):
        i = w
        while time.monotonic() < deadline:
            n, err = await complete(a.url, PROMPTS[i % len(PROMPTS)], a.n, a.schema)
            i += a.concurrency
            if err:
                errors.append(err)
                if len(errors) > 20:
                    return
                continue
            tokens[0] += n
            requests[0] += 1

    e0 = energy(a.url)
    t0, unix0 = time.monotonic(), time.time()
    await asyncio.gather(*(worker(w) for w in range(a.concurrency)))
    seconds = time.monotonic() - t0
    e1 = energy(a.url)
    joules = e1 - e0 if e0 is not None and e1 is not None else None
    out = {
        "unix_start": round(unix0, 3), "unix_end": round(time.time(), 3),
        "concurrency": a.concurrency, "max_tokens": a.n, "schema": a.schema, "seconds": round(seconds, 2),
        "requests": requests[0], "tokens": tokens[0],
        "tok_per_s": round(tokens[0] / seconds, 1),
        "joules": joules and round(joules, 1),
        "j_per_token": joules and tokens[0] and round(joules / tokens[0], 5),
        "tokens_per_j": joules and round(tokens[0] / joules, 2),
        "errors": len(errors),
    }
    print(json.dumps(out), flush=True)
    for e in errors[:3]:
        print(e, file=sys.stderr)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--duration", type=float, default=120)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--schema", action="store_true",
                   help="constrain every output to a JSON schema (no ignore_eos)")
    asyncio.run(main(p.parse_args()))
