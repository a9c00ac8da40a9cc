#!/usr/bin/env python3
"""Warm start of `octoflow serve`: start time, and time to first token of the first requests
against later ones (docs/PERFORMANCE.md).

Starts the server, times how long it takes until /health answers 200 (before, while the engine
is built and warmed up, the port answers 503 "Loading model"), then sends waves of STREAMS concurrent streaming completions
and reports each wave's time to first token (median and max over its streams). The first wave is
what the first users after a start wait; the later waves are warm. Run it twice to see the
second start with the pipeline cache on disk ($OCTOFLOW_HOME/pipelines); --cold deletes that
cache first.

  python3 scripts/bench/warm_start.py --bin target/release/octoflow -m MODEL.gguf --cold
  python3 scripts/bench/warm_start.py --bin target/release/octoflow -m MODEL.gguf

Standard library only.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, proc, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"the server was not healthy within {timeout} s")


def ttft(url, prompt, max_tokens):
    """Seconds from sending a streaming completion to its first text chunk."""
    body = json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    first = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - t0
    return first


def wave(url, streams, max_tokens, index):
    out = [None] * streams
    # different prompt lengths, as real traffic has (each a new shape on a cold engine)
    prompts = [f"Request {index}.{i}: " + "tell me about the sea " * (1 + 3 * i)
               for i in range(streams)]

    def one(i):
        out[i] = ttft(url, prompts[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/octoflow")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--cold", action="store_true",
                    help="delete $OCTOFLOW_HOME/pipelines first")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--idle", type=float, default=0,
                    help="seconds to wait between the server being healthy and the first wave")
    ap.add_argument("--server-log", help="write the server's whole stderr here")
    ap.add_argument("serve_args", nargs="*", help="more `octoflow serve` flags (after --)")
    a = ap.parse_args()
    home = os.environ.get("OCTOFLOW_HOME") or os.path.expanduser("~/.cache/octoflow")
    if a.cold:
        shutil.rmtree(os.path.join(home, "pipelines"), ignore_errors=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [a.bin, "serve", "-m", a.model, "--port", str(port),
           "--instances", str(a.streams), *a.serve_args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    try:
        wait_healthy(url, proc, a.timeout)
        start = time.monotonic() - t0
        print(f"start until healthy: {start:.2f} s")
        time.sleep(a.idle)
        for w in range(a.waves):
            t = wave(url, a.streams, a.max_tokens, w)
            print(f"wave {w + 1} ({a.streams} streams): time to first token "
                  f"median {statistics.median(t) * 1e3:.0f} ms, max {max(t) * 1e3:.0f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    for line in log:
        if "warm-up" in line or "pipeline cache" in line:
            print("server:", line.rstrip())
    if a.server_log:
        with open(a.server_log, "w") as f:
            f.writelines(log)


if __name__ == "__main__":
    main()
