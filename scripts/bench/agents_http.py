#!/usr/bin/env python3
"""The agent patterns driven from the host over HTTP: the peer `octoflow agents` is measured
against (docs/PERFORMANCE.md).

An asyncio client runs the *queue* or *debate* workload against any OpenAI-compatible
/v1/completions server (`octoflow serve`, llama.cpp's llama-server), the way agent frameworks
do it today: every generation is a request, and every round of a debate re-sends the whole
conversation. The workloads mirror the shipped programs (crates/octoflow-agents/src/programs/):

- queue: --concurrency workers drain the task file; each task one completion of -n tokens
  (stop "END_ACTION").
- debate: for each task, --instances debaters answer; for --rounds - 1 more rounds each one
  sends its conversation so far + its answer + every other debater's answer (after the same
  "Another agent answered:" text) + the same revision request, and answers again. Tasks run
  --concurrency at a time.

Prints tasks/s, generated tokens/s (the server's usage counts) and the client's CPU time.
Standard library only; a new connection per request (llama-server drops kept-alive ones
under load).

  python3 scripts/bench/agents_http.py --url http://127.0.0.1:8080 --tasks T.jsonl -n 64 queue
  python3 scripts/bench/agents_http.py --url ... --tasks T.jsonl debate --instances 3 --rounds 2
"""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse

OTHER = "\n\nAnother agent answered: "
REVISE = "\n\nUsing the other answers as additional information, give your updated answer."


async def post_json(url, path, doc):
    """POSTs `doc` as JSON on a new connection (closed after the answer): (status, body)."""
    u = urllib.parse.urlsplit(url)
    body = json.dumps(doc).encode()
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {u.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode() + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"?"
    if b"transfer-encoding: chunked" in head.lower():
        payload = dechunk(payload)
    return status.decode(errors="replace"), payload


async def complete(url, prompt, n, temp, seed):
    """One non-streaming completion: (text, completion tokens)."""
    status, payload = await post_json(url, "/v1/completions", {
        "prompt": prompt, "max_tokens": n, "temperature": temp, "seed": seed,
        "stop": ["END_ACTION"],
    })
    if status != "200":
        sys.exit(f"HTTP {status}: {payload[:300]!r}")
    doc = json.loads(payload)
    return doc["choices"][0]["text"], doc["usage"]["completion_tokens"]


def dechunk(data):
    out = bytearray()
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += data[:n]
        data = data[n + 2:]
    return bytes(out)


def read_tasks(path):
    tasks = []
    with open(path) as f:
        for line in f:
            if line.strip():
                t = json.loads(line)
                if "prompt" not in t:
                    sys.exit("this client takes tasks with a \"prompt\"")
                tasks.append(t)
    return tasks


async def queue(a, tasks, tokens):
    todo = list(enumerate(tasks))

    async def worker():
        while todo:
            i, t = todo.pop(0)
            _, n = await complete(a.url, t["prompt"], a.n, a.temp, a.seed + i)
            tokens.append(n)

    await asyncio.gather(*(worker() for _ in range(a.concurrency)))


async def debate_one(a, i, task, tokens):
    k = a.instances
    contexts = [task["prompt"]] * k
    answers = [None] * k

    async def answer(d):
        text, n = await complete(a.url, contexts[d], a.n, a.temp, a.seed + i * k + d)
        tokens.append(n)
        answers[d] = text

    await asyncio.gather(*(answer(d) for d in range(k)))
    for _ in range(1, a.rounds):
        contexts = [
            contexts[d] + answers[d]
            + "".join(OTHER + answers[o] for o in range(k) if o != d) + REVISE
            for d in range(k)
        ]
        await asyncio.gather(*(answer(d) for d in range(k)))


async def debate(a, tasks, tokens):
    todo = list(enumerate(tasks))

    async def worker():
        while todo:
            i, t = todo.pop(0)
            await debate_one(a, i, t, tokens)

    await asyncio.gather(*(worker() for _ in range(a.concurrency)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--concurrency", type=int, default=64,
                    help="queue: workers; debate: tasks at a time")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    sub = ap.add_subparsers(dest="pattern", required=True)
    sub.add_parser("queue")
    d = sub.add_parser("debate")
    d.add_argument("--instances", type=int, default=3)
    d.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    tasks = read_tasks(a.tasks)
    tokens = []
    cpu0, t0 = time.process_time(), time.monotonic()
    asyncio.run((queue if a.pattern == "queue" else debate)(a, tasks, tokens))
    secs, cpu = time.monotonic() - t0, time.process_time() - cpu0
    print(f"{a.pattern}: {len(tasks)} tasks, {len(tokens)} completions, {sum(tokens)} tokens "
          f"in {secs:.2f} s: {len(tasks) / secs:.1f} tasks/s, {sum(tokens) / secs:.1f} tok/s | "
          f"client CPU {cpu:.2f} s")


if __name__ == "__main__":
    main()
