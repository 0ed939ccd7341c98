#!/usr/bin/env python3
"""The Python mirror's lookups in process, next to `GET /keys` over HTTP.

    python3 benches/mirror.py                  # 100,000 accounts (every 1000th on 16 keys)
    python3 benches/mirror.py --seconds 5

The server runs on a copy of load.py's cached SQLite database of that size (built once
with `keyspread import`), pinned to CPU 0; this script runs on CPU 1, one thread (the
mirror's follower waits in a long-poll meanwhile). It times the mirror's start (snapshot
read to a ready table), then for `--seconds` each: `Mirror.keys` and `Mirror.key_for` over
every account in random order (per second of this thread's CPU, so that other processes on
the machine do not count, and per wall second), and `GET /keys/{account}` on one keep-alive
connection (per wall second: it waits on the server).
"""

import argparse
import http.client
import os
import random
import sys
import time

import load

sys.path.insert(0, os.path.join(load.REPO, "clients", "python"))
from keyspread_client import Mirror


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def per_second(run, seconds, clock):
    """Calls per second of `clock` (`time.process_time`: per second of this thread's CPU, so
    other processes on the core do not count; `time.perf_counter`: of the wall clock) of
    `run()`, which answers how many calls it made, for about `seconds` of that clock."""
    calls, started = 0, clock()
    deadline = started + seconds
    while True:
        calls += run()
        now = clock()
        if now >= deadline:
            return calls / (now - started)


def bench(args):
    server = load.serve_copy(args)
    url = f"http://127.0.0.1:{server.port}"
    before = rss_kib()
    started = time.perf_counter()
    mirror = Mirror(url)
    ready = time.perf_counter() - started
    grown = rss_kib() - before
    names = list(mirror._table)
    random.Random(1).shuffle(names)
    subs = [(name, f"order-{i}") for i, name in enumerate(names)]

    def keys_round():
        keys = mirror.keys
        for name in names:
            keys(name)
        return len(names)

    def key_for_round():
        key_for = mirror.key_for
        for name, sub in subs:
            key_for(name, sub)
        return len(subs)

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)

    def http_round():
        for name in names[:2000]:
            conn.request("GET", f"/keys/{name}")
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        return 2000

    cpu, wall = time.process_time, time.perf_counter
    figures = [
        ("`Mirror.keys` (in process), per CPU second", per_second(keys_round, args.seconds, cpu)),
        ("`Mirror.keys` (in process), per wall second", per_second(keys_round, args.seconds, wall)),
        ("`Mirror.key_for` (MD5 + jump), per CPU second",
         per_second(key_for_round, args.seconds, cpu)),
        (
            "`GET /keys/{account}` (HTTP, one keep-alive connection), per wall second",
            per_second(http_round, args.seconds, wall),
        ),
    ]
    mirror.close()
    server.stop()
    hot = f"every {args.hot_every}th on {args.hot_fanout} keys" if args.hot_every else "none hot"
    heading = (
        f"Python mirror, {len(names):,} accounts ({hot}), Python "
        f"{sys.version.split()[0]}, one thread on CPU {load.CLIENT_CPU}, server on CPU "
        f"{load.SERVER_CPU}, load average {os.getloadavg()[0]:.2f}"
    )
    lines = [
        heading,
        (
            f"mirror ready (snapshot read) in {ready:.2f} s; it added {grown / 1024:.0f} MiB "
            f"to this process ({grown * 1024 / len(names):.0f} bytes an account)"
        ),
        "",
        "| lookup | per second |",
        "| --- | ---: |",
    ]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in figures]
    print("\n".join(lines))
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load.database_script_arguments(parser, hot_every=1000)
    parser.set_defaults(accounts=100_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
