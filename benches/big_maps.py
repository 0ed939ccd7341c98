#!/usr/bin/env python3
"""Sizes of the open reads and the server's peak memory with large shard maps (stdlib only).

    python3 benches/big_maps.py [--binary PATH] [--shards 100000] [--readers 8] [--duration 20]

Starts the server on a fresh SQLite file (127.0.0.1, a free port), registers three uniform
maps of `--shards` shards (or the maximum the server names in its 422), then prints the byte size of `GET /events?limit=1000`, `GET /streams` and
one `GET /streams/{name}`, and the server's peak resident memory (VmHWM) while `--readers`
clients fetch those pages in a loop for `--duration` seconds. The server is stopped on exit.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_DIR = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
READS = ["/events?limit=1000", "/streams?limit=1000", "/streams/big-0"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def memory(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # MiB
    return 0.0


def register(base, name, count):
    """PUTs a uniform map of `count` shards, or the largest the server takes; answers its
    shard count."""
    status, body = call(base, "PUT", f"/streams/{name}", {"shard_count": count})
    if status == 422:
        # "shard count must be between 1 and N, got M": retry with N.
        count = int(re.search(rb"between 1 and (\d+)", body).group(1))
        status, body = call(base, "PUT", f"/streams/{name}", {"shard_count": count})
    if status not in (200, 201):
        sys.exit(f"PUT /streams/{name}: {status} {body[:200]!r}")
    return count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(TARGET_DIR, "debug", "keyspread"))
    ap.add_argument("--shards", type=int, default=100_000)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0)
    args = ap.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [args.binary, "serve", "--listen", f"127.0.0.1:{port}",
             "--database-url", f"sqlite://{tmp}/big.db", "--request-timeout-secs", "120"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if call(base, "GET", "/healthz", timeout=1)[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("the server did not start")
                time.sleep(0.2)
            counts = [register(base, f"big-{i}", args.shards) for i in range(3)]
            print(f"binary {args.binary}")
            print(f"3 streams of {counts[0]} shards registered; "
                  f"RSS {memory(server.pid, 'VmRSS'):.0f} MiB")
            for path in READS:
                status, body = call(base, "GET", path)
                print(f"GET {path}: {status}, {len(body):,} bytes")

            stop = time.monotonic() + args.duration
            done = [0]
            lock = threading.Lock()

            def reader(i):
                while time.monotonic() < stop:
                    call(base, "GET", READS[i % len(READS)])
                    with lock:
                        done[0] += 1

            threads = [threading.Thread(target=reader, args=(i,)) for i in range(args.readers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print(f"{args.readers} readers for {args.duration:.0f} s: {done[0]} reads; "
                  f"peak RSS (VmHWM) {memory(server.pid, 'VmHWM'):.0f} MiB")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
