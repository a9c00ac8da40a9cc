#!/usr/bin/env python3
"""Prefix caching measured over HTTP (issue #27): time to first token and total time of requests
that share a long system prompt, and what a multi-turn chat's later turns prefill.

- shared: one warm-up request, then --questions requests at once, each the same --system-words-word
  system prompt and a different question (streamed, --max-tokens each, ignore_eos). Prints
  TTFT (time to the first streamed event) median / p90 / max and the wall time of the batch. Run it against `octoflow serve` and against the same
  server with --no-prefix-cache.
- chat: a --turns-turn conversation, one request per turn (the history so far, a new question);
  per turn the prompt tokens and, from /metrics, the positions the server reused, so what was
  prefilled is prompt - reused.

Plain /v1/completions (any model, chat template or not); the prompt sizes printed are the
server's counts. Standard library only; a new connection per request.

  python3 scripts/bench/prefix_http.py --url http://127.0.0.1:8080 shared
  python3 scripts/bench/prefix_http.py --url http://127.0.0.1:8080 chat --turns 10
"""

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
import urllib.parse

WORDS = ("river stone lantern harbor orchard meadow copper violet signal engine quiet market "
         "winter ladder canvas thunder garden silver pocket mirror basket candle forest island "
         "compass feather marble rocket saddle temple velvet window yellow zebra anchor breeze").split()

QUESTIONS = [f"In one sentence, what is the {w} in the rules above for case {i}?"
             for i, w in enumerate(WORDS * 3)]

FIRST = re.compile(rb'data: \{')


def system_prompt(words):
    """Deterministic rule text of `words` words or a few more."""
    lines, i = [], 0
    while len(" ".join(lines).split()) < words:
        a, b, c = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)], WORDS[(i * 13 + 5) % len(WORDS)]
        lines.append(f"Rule {i + 1}: when the {a} meets the {b}, report the {c} and count {i * 3 + 1}.")
        i += 1
    return "You follow these rules exactly.\n" + "\n".join(lines)


async def request(url, path, doc, stream):
    """POSTs `doc`; returns (status, seconds to the first content byte or None, body)."""
    u = urllib.parse.urlsplit(url)
    body = json.dumps(doc).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {u.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode() + body)
    await writer.drain()
    raw, first = b"", None
    while True:
        piece = await reader.read(65536)
        if not piece:
            break
        raw += piece
        if stream and first is None and FIRST.search(raw):
            first = time.perf_counter() - t0
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "?"
    return status, first, payload


async def metric(url, name):
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: {u.hostname}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read(-1)
    writer.close()
    for line in raw.decode(errors="replace").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def usage(payload):
    doc = json.loads(payload[payload.index(b"{"):payload.rindex(b"}") + 1])
    return doc, doc["usage"]["prompt_tokens"]


async def shared(args):
    system = system_prompt(args.system_words)

    def doc(q, stream=True):
        return {"prompt": f"{system}\n\nQuestion: {q}\nAnswer:", "max_tokens": args.max_tokens,
                "temperature": 0, "stream": stream, "ignore_eos": True}

    status, _, body = await request(args.url, "/v1/completions", doc("Say ready.", False), False)
    if status != "200":
        sys.exit(f"warm-up: HTTP {status}: {body[:300]!r}")
    print(f"warm-up request: prompt {usage(body)[1]} tokens")
    cached0 = await metric(args.url, "octoflow_prefix_cache_tokens_total")
    t0 = time.perf_counter()
    results = await asyncio.gather(*[request(args.url, "/v1/completions", doc(q), True)
                                     for q in QUESTIONS[:args.questions]])
    wall = time.perf_counter() - t0
    bad = [r for r in results if r[0] != "200" or r[1] is None]
    if bad:
        sys.exit(f"{len(bad)} requests failed: {bad[0][0]} {bad[0][2][:300]!r}")
    ttfts = sorted(r[1] for r in results)
    cached = await metric(args.url, "octoflow_prefix_cache_tokens_total") - cached0
    p90 = ttfts[int(0.9 * (len(ttfts) - 1))]
    print(f"{args.questions} questions at once: TTFT median {statistics.median(ttfts):.3f} s, "
          f"p90 {p90:.3f} s, max {ttfts[-1]:.3f} s; all done in {wall:.3f} s; "
          f"positions reused {cached:.0f}")


async def chat(args):
    text = system_prompt(args.system_words)
    for turn in range(args.turns):
        text += f"\n\nQuestion: {QUESTIONS[turn]}\nAnswer:"
        before = await metric(args.url, "octoflow_prefix_cache_tokens_total")
        t0 = time.perf_counter()
        status, _, body = await request(args.url, "/v1/completions", {
            "prompt": text, "max_tokens": args.max_tokens, "temperature": 0,
            "ignore_eos": True}, False)
        wall = time.perf_counter() - t0
        if status != "200":
            sys.exit(f"turn {turn + 1}: HTTP {status}: {body[:300]!r}")
        doc, prompt = usage(body)
        reused = await metric(args.url, "octoflow_prefix_cache_tokens_total") - before
        print(f"turn {turn + 1}: prompt {prompt} tokens, reused {reused:.0f}, prefilled "
              f"{prompt - reused:.0f}, {wall:.3f} s")
        text += doc["choices"][0]["text"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--system-words", type=int, default=800)
    p.add_argument("--max-tokens", type=int, default=32)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("shared")
    s.add_argument("--questions", type=int, default=64)
    c = sub.add_parser("chat")
    c.add_argument("--turns", type=int, default=10)
    args = p.parse_args()
    asyncio.run(shared(args) if args.what == "shared" else chat(args))


if __name__ == "__main__":
    main()
