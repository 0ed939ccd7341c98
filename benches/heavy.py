#!/usr/bin/env python3
"""Liveness under the heaviest reads: /healthz latency while split plans run (stdlib only).

    python3 benches/heavy.py                   # 1M accounts, plans from 1 to 100,000 shards
    python3 benches/heavy.py --accounts 100000 --duration 10 --unpinned
    python3 benches/heavy.py --path '/rebalance/preview?shards=10000'   # any other GET

The server runs on a copy of load.py's cached SQLite database (built once with
`keyspread import`), pinned to CPU 0 unless --unpinned; this script's probes run on CPU 1.
A stream `big` of --shards uniform shards is registered, then for --duration seconds two
clients ask for `GET /streams/big/split-plan?target=--target` (or --path) back to back
while a third probes `GET /healthz` every 10 ms. It prints the probe latencies (p50, p99, max;
from when each probe was due, so a stall counts once per probe it delays) with the server
idle and under the split plans, and every split plan's status and duration. The server
and the copy are removed on exit, failure or Ctrl-C.
"""

import argparse
import http.client
import multiprocessing
import os
import statistics
import time

import load

PROBE_EVERY_S = 0.01


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def get(conn, path):
    """Status, body size and seconds of one GET on a kept-alive connection."""
    started = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    size = len(response.read())
    return response.status, size, time.perf_counter() - started


def probe(port, seconds, out):
    """`GET /healthz` due every PROBE_EVERY_S for `seconds`; (status, ms) into `out`.

    Latency counts from when a probe was due, not when it was sent: a stall delays every
    probe due during it, and each of them counts it (no coordinated omission).
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.perf_counter()
    for i in range(int(seconds / PROBE_EVERY_S)):
        due = start + i * PROBE_EVERY_S
        time.sleep(max(0.0, due - time.perf_counter()))
        status, _, _ = get(conn, "/healthz")
        out.append((status, (time.perf_counter() - due) * 1000))
    conn.close()


def plan_loop(port, path, deadline, results):
    """Split plans back to back until `deadline`; their (status, seconds, bytes) as one
    list into `results`. Runs in its own process: reading 75 MB answers holds no lock the
    probes need (Python's GIL)."""
    out = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.monotonic() < deadline:
        try:
            status, size, took = get(conn, path)
        except (OSError, http.client.HTTPException) as err:
            out.append((f"error: {err}", 0.0, 0))
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            continue
        out.append((status, took, size))
    conn.close()
    results.put(out)


def summary(samples):
    ms = [t for _, t in samples]
    bad = sum(1 for s, _ in samples if s != 200)
    return (f"{len(ms)} probes, p50 {statistics.median(ms):.1f} ms, p99 "
            f"{percentile(ms, 99):.1f} ms, max {max(ms):.1f} ms, non-200 {bad}")


def put_stream(port, shards):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    conn.request("PUT", "/streams/big", body=f'{{"shard_count": {shards}}}',
                 headers={"content-type": "application/json"})
    response = conn.getresponse()
    body = response.read()
    if response.status not in (200, 201):
        raise SystemExit(f"PUT /streams/big answered {response.status}: {body[:500]!r}")
    return time.perf_counter() - started


def run(args):
    server = load.serve_copy(args, pinned=not args.unpinned)
    put_s = put_stream(server.port, args.shards)
    load.log(f"PUT /streams/big ({args.shards} shards): {put_s:.2f} s")

    idle = []
    probe(server.port, args.idle, idle)
    load.log(f"idle: {summary(idle)}")

    busy = []
    path = args.path or f"/streams/big/split-plan?target={args.target}"
    deadline = time.monotonic() + args.duration
    results = multiprocessing.Queue()
    clients = [multiprocessing.Process(target=plan_loop,
                                       args=(server.port, path, deadline, results))
               for _ in range(2)]
    for c in clients:
        c.start()
    probe(server.port, args.duration, busy)
    plans = [results.get() for _ in clients]
    for c in clients:
        c.join()
    server.stop()
    load.log(f"under two clients of {path}: {summary(busy)}")
    lines = [
        f"- server: `{args.binary}`, {'unpinned' if args.unpinned else 'pinned to CPU 0'}; "
        f"{args.accounts:,} accounts in SQLite; stream `big` of {args.shards:,} uniform "
        f"shards (PUT took {put_s:.2f} s)",
        f"- `/healthz` idle ({args.idle} s): {summary(idle)}",
        f"- `/healthz` while 2 clients run `GET {path}` back to back ({args.duration} s): "
        f"{summary(busy)}",
    ]
    for i, out in enumerate(plans):
        answers = ", ".join(f"{s} in {t:.2f} s" for s, t, _ in out) or "none finished"
        size = max((b for _, _, b in out), default=0)
        lines.append(f"- client {i + 1}: {answers}; largest body {size / 1e6:.1f} MB")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    load.database_script_arguments(parser, hot_every=0)
    parser.add_argument("--shards", type=int, default=1, help="shards of the stream `big`")
    parser.add_argument("--target", type=int, default=10_000, help="split-plan target (the largest allowed)")
    parser.add_argument("--path", help="another GET to run instead of the split plan")
    parser.add_argument("--duration", type=int, default=20,
                        help="seconds of split plans; a plan in flight at the end is awaited")
    parser.add_argument("--idle", type=int, default=3, help="seconds of probes before")
    parser.add_argument("--unpinned", action="store_true",
                        help="let the server and the probes use every core")
    args = parser.parse_args()
    load.run_database_script(args, run)


if __name__ == "__main__":
    main()
