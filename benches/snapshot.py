#!/usr/bin/env python3
"""What `GET /snapshot` costs at scale: time to read it whole, and the server's memory.

    python3 benches/snapshot.py                     # 1M accounts (built once, cached)
    python3 benches/snapshot.py --accounts 100000 --runs 1

The server runs on a copy of load.py's cached SQLite database (built once with `keyspread
import`; every 1000th account on 16 keys), pinned to CPU 0; this script reads on CPU 1.
Each run reads `GET /snapshot` to its end on one connection, counting lines against the
head's `accounts`, while a thread samples the server's VmRSS every 20 ms: it prints the
time to the head line and to the last, the bytes, and the resident memory before and at
its highest during the read (the goal: under 50 MB added at a million accounts).
"""

import argparse
import http.client
import json
import os
import threading
import time

import load


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def read_snapshot(port):
    """(seconds to the head, seconds to the end, bytes, lines after the head, head)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    conn.request("GET", "/snapshot")
    response = conn.getresponse()
    if response.status != 200:
        raise SystemExit(f"GET /snapshot answered {response.status}: {response.read()[:500]!r}")
    head = json.loads(response.readline())
    to_head = time.perf_counter() - started
    size, lines = 0, 0
    while chunk := response.read(1 << 20):
        size += len(chunk)
        lines += chunk.count(b"\n")
    conn.close()
    return to_head, time.perf_counter() - started, size, lines, head


def run(args):
    server = load.serve_copy(args)
    out = [f"GET /snapshot, {args.accounts} accounts (SQLite, release, server on CPU "
           f"{load.SERVER_CPU}, reader on CPU {load.CLIENT_CPU}), load average "
           f"{os.getloadavg()[0]:.2f}:"]
    for i in range(args.runs):
        before = rss_kib(server.proc.pid)
        peak = [before]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_kib(server.proc.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            to_head, took, size, lines, head = read_snapshot(server.port)
        finally:
            done.set()
            sampler.join()
        if lines != head["accounts"]:
            raise SystemExit(f"{lines} lines for {head['accounts']} accounts")
        out.append(
            f"- run {i + 1}: head after {to_head * 1000:.0f} ms, all {lines} lines in "
            f"{took:.2f} s ({size / 1e6:.0f} MB, {lines / took:,.0f} accounts/s); VmRSS "
            f"{before / 1024:.0f} MiB before, {peak[0] / 1024:.0f} MiB at most during: "
            f"{(peak[0] - before) / 1024:+.1f} MiB")
    server.stop()
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    load.database_script_arguments(parser, hot_every=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    load.run_database_script(args, run)


if __name__ == "__main__":
    main()
