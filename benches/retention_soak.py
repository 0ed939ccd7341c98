#!/usr/bin/env python3
"""A soak of allocations and releases with a bounded event log: does the database stay flat?

    python3 benches/retention_soak.py                       # 10 minutes at 1,500 requests/s
    python3 benches/retention_soak.py --seconds 60 --retention 1m,20000

A release server on a fresh SQLite file (CPU 0, `--mutation-rate 0`, `--event-retention`
as given, compacting every `--compaction-interval-s`) takes `POST /keys/{account}` and
`DELETE /keys/{account}` at random over `--accounts` names from wrk (CPU 1, load.py's
connections, each paced so that together they send about `--rate` requests a second).
Every `--every` seconds it prints the events the log holds, the newest event id (every
change ever logged), and the database's size on disk (file and WAL): with retention, the
held events and the size level off while the ids keep growing. Needs wrk and taskset.
"""

import argparse
import os
import sqlite3
import time

import load

LUA = """
math.randomseed(20261127)
function delay() return %(delay_ms)d end
request = function()
  local account = "soak-" .. math.random(%(accounts)d)
  local method = math.random(2) == 1 and "POST" or "DELETE"
  return wrk.format(method, "/keys/" .. account, {["content-type"] = "application/json"},
                    method == "POST" and "{}" or nil)
end
"""


def held(database):
    """(events held, newest event id, bytes on disk) of the SQLite file."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10) as db:
        count, newest = db.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM events").fetchone()
    size = sum(os.path.getsize(database + suffix) for suffix in ("", "-wal")
               if os.path.exists(database + suffix))
    return count, newest, size


def run(args):
    workdir = load.tempdir()
    database = os.path.join(workdir, "soak.db")

    flags = ["--event-retention", args.retention,
             "--event-compaction-interval-s", str(args.compaction_interval_s)]
    server = load.Server(args, f"sqlite://{database}", workdir, flags=flags)
    server.wait_ready(30)
    delay_ms = max(1, round(1000 * load.CONNECTIONS / args.rate))
    script = load.write_lua(workdir, "soak.lua", LUA % {"delay_ms": delay_ms,
                                                         "accounts": args.accounts})
    rows = ["| after | requests/s | non-2xx | events held | newest event id | on disk |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    started = time.monotonic()
    total = 0
    while time.monotonic() - started < args.seconds:
        chunk = min(args.every, args.seconds - (time.monotonic() - started))
        if chunk < 1:
            break
        result = load.wrk(server.port, script, int(chunk))
        total += result["requests"]
        count, newest, size = held(database)
        row = (f"| {time.monotonic() - started:.0f} s | {result['rps']:,.0f} | "
               f"{result['non2xx']:,} | {count:,} | {newest:,} | {size / 2**20:.1f} MiB |")
        print(row, flush=True)
        rows.append(row)
    rss, hwm = server.memory_kib()
    server.stop()
    head = (f"Retention soak: {total:,} requests over {args.accounts:,} accounts in "
            f"{time.monotonic() - started:.0f} s (target {args.rate:,}/s, {load.CONNECTIONS} connections), "
            f"--event-retention {args.retention}, compaction every "
            f"{args.compaction_interval_s} s; server VmRSS {rss / 1024:.0f} MiB at the end "
            f"({hwm / 1024:.0f} MiB at most). 404s are releases of accounts not held.")
    return head + "\n\n" + "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=os.path.join(load.TARGET_DIR, "release", "keyspread"))
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--rate", type=int, default=1500)
    parser.add_argument("--accounts", type=int, default=2000)
    parser.add_argument("--retention", default="2m,100000")
    parser.add_argument("--compaction-interval-s", type=int, default=30)
    parser.add_argument("--every", type=int, default=60, help="seconds between two samples")
    parser.add_argument("--output", help="also write the figures to this file")
    args = parser.parse_args()
    load.run_database_script(args, run)


if __name__ == "__main__":
    main()
