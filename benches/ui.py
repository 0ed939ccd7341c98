#!/usr/bin/env python3
"""The operator page at scale: GET /ui of a 1,024-shard stream over 1,000,000 accounts
(Python 3 standard library only).

    cargo build --release
    python3 benches/ui.py                              # 1M accounts (1 % hot), 1,024 shards
    python3 benches/ui.py --accounts 100000 --renders 5 --unpinned
    python3 benches/ui.py --save /tmp/ui.html          # keep one page to look at

Copies load.py's cached 1M-account SQLite database (built once with `keyspread import`),
starts the release server on the copy (pinned to CPU 0 unless --unpinned; this script then
runs on CPU 1), registers a primary stream `big` of --shards uniform shards, applies a
rebalance onto --moves-shards uniform shards that switches in a day (so moves are
pending), joins --workers consumer workers to `big`, then asks for `GET /ui?stream=big`
--renders times, after one untimed request. For each page it records the server's own time
(the page's `Server-Timing` header: from the request's arrival to the page made), the
time to the last byte at this client, and the size; then the same for
`GET /distribution?stream=big`, the JSON route whose figures the page shows. Each timed
request comes in a pair: one right after an allocation, so the MD5 comparison is hashed
anew, and one with nothing changed since, which the server answers from what it kept. The server
and the copy are removed on exit, failure or Ctrl-C.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import time

import load


def request(port, method, path, body=None, timeout=600):
    """Status, headers, body bytes and seconds to the last byte of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    headers = {"content-type": "application/json"} if body is not None else {}
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = conn.getresponse()
    data = response.read()
    took = time.perf_counter() - started
    conn.close()
    return response.status, dict(response.getheaders()), data, took


def must(port, method, path, body=None):
    status, _, data, took = request(port, method, path, body)
    if status not in (200, 201):
        raise SystemExit(f"{method} {path} answered {status}: {data[:500]!r}")
    return json.loads(data), took


def server_ms(headers):
    """The page's own figure: `Server-Timing: render;dur=12.3`."""
    found = re.search(r"dur=([0-9.]+)", headers.get("server-timing", ""))
    return float(found.group(1)) if found else None


def prepare(port, args):
    """The stream, pending moves and workers the page shows."""
    _, took = must(port, "PUT", "/streams/big", {"shard_count": args.shards, "primary": True})
    load.log(f"PUT /streams/big ({args.shards} shards): {took:.2f} s")
    plan, took = must(port, "GET", f"/rebalance/preview?shards={args.moves_shards}")
    load.log(f"preview onto {args.moves_shards} shards: {len(plan['moves'])} moves, {took:.2f} s")
    _, took = must(port, "POST", "/rebalance", {"plan_id": plan["plan_id"], "switch_after_s": 86400})
    load.log(f"applied, switching in a day: {took:.2f} s")
    # Joins within a second of an assignment wait for the next: heartbeat again after it.
    for round_no in range(2):
        for w in range(args.workers):
            must(port, "PUT", f"/streams/big/workers/worker-{w:04d}", {"ttl_s": 600})
        if round_no == 0:
            time.sleep(1.2)
    leases, _ = must(port, "GET", "/streams/big/leases")
    load.log(f"{len(leases['workers'])} workers hold leases")
    return len(plan["moves"])


def measure(port, path, renders, save=None):
    """`renders` pairs of requests: the first right after an allocation (so nothing kept
    from an earlier request holds: the MD5 comparison is hashed again), the second with
    nothing changed in between."""
    request(port, "GET", path)  # untimed: the first touch of every page of the database
    cold, warm = [], []
    for i in range(renders):
        must(port, "POST", f"/keys/ui-bench-{time.time_ns()}-{i}")
        for runs in (cold, warm):
            status, headers, data, took = request(port, "GET", path)
            if status != 200:
                raise SystemExit(f"GET {path} answered {status}: {data[:500]!r}")
            runs.append((server_ms(headers), took * 1000, len(data)))
            if save:
                with open(save, "wb") as f:
                    f.write(data)
    return cold, warm


def describe(path, when, runs):
    server = [s for s, _, _ in runs if s is not None]
    wall = [w for _, w, _ in runs]
    size = max(b for _, _, b in runs)
    parts = [f"`GET {path}` {when}, {len(runs)} runs:"]
    if server:
        parts.append(f"server {statistics.median(server):.0f} ms median "
                     f"({min(server):.0f}–{max(server):.0f}),")
    parts.append(f"last byte at the client {statistics.median(wall):.0f} ms median "
                 f"({min(wall):.0f}–{max(wall):.0f}), {size:,} bytes ({size / 1024:.0f} KiB)")
    return " ".join(parts)


def run(args):
    server = load.serve_copy(args, pinned=not args.unpinned)
    moves = prepare(server.port, args)
    page = measure(server.port, "/ui?stream=big", args.renders, args.save)
    distribution = measure(server.port, "/distribution?stream=big", args.renders)
    server.stop()
    lines = [
        f"- server: `{args.binary}`, {'unpinned' if args.unpinned else 'pinned to CPU 0'}; "
        f"{args.accounts:,} accounts in SQLite (every {args.hot_every}th with "
        f"{args.hot_fanout} keys); primary stream `big` of {args.shards:,} uniform shards; "
        f"{moves:,} moves pending; {args.workers} workers",
    ]
    for path, (cold, warm) in [("/ui?stream=big", page),
                               ("/distribution?stream=big", distribution)]:
        lines.append(f"- {describe(path, 'right after an allocation', cold)}")
        lines.append(f"- {describe(path, 'again, nothing changed', warm)}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    load.database_script_arguments(parser, hot_every=100)
    parser.add_argument("--shards", type=int, default=1024, help="shards of the stream `big`")
    parser.add_argument("--moves-shards", type=int, default=1000,
                        help="uniform shards the pending rebalance plans onto")
    parser.add_argument("--workers", type=int, default=100, help="consumer workers of `big`")
    parser.add_argument("--renders", type=int, default=10, help="timed requests per route")
    parser.add_argument("--save", help="write the page to this file")
    parser.add_argument("--unpinned", action="store_true",
                        help="let the server and this script use every core")
    args = parser.parse_args()
    load.run_database_script(args, run)


if __name__ == "__main__":
    main()
