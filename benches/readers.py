#!/usr/bin/env python3
"""Readers hold no one up: other requests beside a client trickling a snapshot, lookups
beside a thousand long polls, and how long SIGTERM takes beside a client that reads
nothing (Python standard library only).

    python3 benches/readers.py                             # 100,000 accounts, default flags
    python3 benches/readers.py --baseline OLD              # another build first, to compare
    python3 benches/readers.py --accounts 1000000 --trickle-kbps 300 --polls 1000

The server (default flags, unpinned: 2 cores as deployed) runs on a copy of load.py's
cached SQLite database (built once with `keyspread import`). Three parts, each on a fresh
server:

1. A burst of heavy reads (four `GET /distribution?shards=N`, a `GET
   /rebalance/preview`, a second `GET /snapshot` read whole, and `keyspread export --from`)
   sent all at once, first with the server otherwise idle, then while one client trickles
   `GET /snapshot` at --trickle-kbps (a 16 KiB receive buffer, read in pieces every 100 ms).
   Each request's status and seconds, and `GET /keys/{account}` every 20 ms meanwhile.
2. `GET /keys/{account}` on a new connection each, every 10 ms for --lookup-s seconds,
   while --polls long polls (`GET /events?after=HEAD&wait_s=60`, each on its own
   connection) wait; with the default --max-connections and with it at --polls (so the
   polls alone fill it).
3. SIGTERM while a client that asked for the whole snapshot reads nothing: seconds until
   the process exits (given up at 40 s, then killed).

Latencies count from when a probe was due, so a stall counts against every probe it
delays. Servers and temporary files are removed on exit, failure or Ctrl-C.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import threading
import time

import load

DISTRIBUTION_SHARDS = (4, 16, 64, 256)
PREVIEW = "/rebalance/preview?shards=64"


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def latency_summary(samples):
    """`n, p50 / p99 / max ms, failures` of (ok, ms) samples."""
    ms = [t for _, t in samples]
    bad = sum(1 for ok, _ in samples if not ok)
    if not ms:
        return "no probes"
    return (f"{len(ms)} probes, p50 {statistics.median(ms):.1f} / p99 {percentile(ms, 99):.1f}"
            f" / max {max(ms):.0f} ms, {bad} failed")


def get(port, path, timeout=120):
    """(status, seconds, bytes) of one GET on a new connection, its body read whole."""
    started = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("GET", path)
        response = conn.getresponse()
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
        conn.close()
        return response.status, time.perf_counter() - started, size
    except (OSError, http.client.HTTPException) as err:
        return f"error: {type(err).__name__}", time.perf_counter() - started, 0


def export(binary, port, workdir):
    """(status, seconds, bytes) of `keyspread export --from` into a file."""
    out = os.path.join(workdir, "export.ndjson")
    started = time.perf_counter()
    done = subprocess.run([binary, "export", "--from", f"http://127.0.0.1:{port}", "--output", out],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300,
                          stdin=subprocess.DEVNULL)
    took = time.perf_counter() - started
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.decode()[-120:].strip()}", took, 0
    size = os.path.getsize(out)
    os.remove(out)
    return "ok", took, size


def probe_lookups(port, accounts, every, stop, out, fresh=False, timeout=5.0):
    """`GET /keys/acct-…` due every `every` s until `stop` is set; (ok, ms) into `out`. On
    a new connection each with `fresh`, else on one kept alive."""
    conn = None
    start, i = time.perf_counter(), 0
    while not stop.is_set():
        due = start + i * every
        i += 1
        time.sleep(max(0.0, due - time.perf_counter()))
        account = f"acct-{(i * 7919) % accounts + 1:07d}"
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            conn.request("GET", f"/keys/{account}")
            response = conn.getresponse()
            response.read()
            ok = response.status == 200
            if fresh:
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException):
            ok = False
            if conn is not None:
                conn.close()
            conn = None
        out.append((ok, (time.perf_counter() - due) * 1000))


def ask_for_snapshot(port):
    """A socket that asked for `GET /snapshot` with a 16 KiB receive buffer."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return s


def trickle(port, kbps, stop, read):
    """Reads `GET /snapshot` at about `kbps` KB/s until `stop` or its end; bytes into `read`."""
    s = ask_for_snapshot(port)
    piece = max(1, int(kbps * 1000 / 10))
    s.settimeout(30)
    try:
        while not stop.is_set():
            got = s.recv(piece)
            if not got:
                break
            read[0] += len(got)
            if got.endswith(b"\r\n0\r\n\r\n"):
                read[1] = True
                break
            time.sleep(0.1)
    except OSError:
        pass
    s.close()


def burst(args, server):
    """Every heavy read at once: [(what, status, seconds, bytes)]."""
    requests = [(f"GET /distribution?shards={n}", lambda n=n: get(server.port, f"/distribution?shards={n}"))
                for n in DISTRIBUTION_SHARDS]
    requests.append((f"GET {PREVIEW}", lambda: get(server.port, PREVIEW)))
    requests.append(("GET /snapshot (read whole)", lambda: get(server.port, "/snapshot")))
    requests.append(("keyspread export --from", lambda: export(args.binary, server.port,
                                                                  args.workdir)))
    results = [None] * len(requests)

    def one(i, call):
        results[i] = call()

    threads = [threading.Thread(target=one, args=(i, call)) for i, (_, call) in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(what, *result) for (what, _), result in zip(requests, results)]


def with_probes(args, port, work):
    """Runs `work()` while lookups are probed every 20 ms: (its result, the probes)."""
    stop, samples = threading.Event(), []
    prober = threading.Thread(target=probe_lookups,
                              args=(port, args.accounts, 0.02, stop, samples))
    prober.start()
    try:
        return work(), samples
    finally:
        stop.set()
        prober.join()


def part_trickle(args):
    server = load.serve_copy(args, pinned=False)
    args.workdir = load.tempdir()
    idle, idle_probes = with_probes(args, server.port, lambda: burst(args, server))
    stop, read = threading.Event(), [0, False]
    slow = threading.Thread(target=trickle, args=(server.port, args.trickle_kbps, stop, read))
    slow.start()
    time.sleep(1.0)
    busy, busy_probes = with_probes(args, server.port, lambda: burst(args, server))
    stop.set()
    slow.join()
    server.stop()
    rows = []
    for (what, s0, t0, b0), (_, s1, t1, b1) in zip(idle, busy):
        rows.append(f"| {what} | {s0} in {t0:.2f} s | {s1} in {t1:.2f} s | {max(b0, b1) / 1e6:.1f} MB |")
    return {
        "rows": rows,
        "lookups_idle": latency_summary(idle_probes),
        "lookups_busy": latency_summary(busy_probes),
        "slow_read": read[0],
        "slow_ended": read[1],
    }


def snapshot_head(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/snapshot")
    head = json.loads(conn.getresponse().readline())
    conn.close()
    return head["event_id"]


def part_polls(args, max_connections):
    flags = ["--max-connections", str(max_connections)] if max_connections else []
    server = serve_copy_with(args, flags)
    after = snapshot_head(server.port)
    polls = []
    request = f"GET /events?after={after}&wait_s=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    for _ in range(args.polls):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(request)
        polls.append(s)
    time.sleep(1.0)
    stop, samples = threading.Event(), []
    prober = threading.Thread(target=probe_lookups,
                              args=(server.port, args.accounts, 0.01, stop, samples, True, 2.0))
    prober.start()
    time.sleep(args.lookup_s)
    stop.set()
    prober.join()
    for s in polls:
        s.close()
    server.stop()
    return latency_summary(samples)


def serve_copy_with(args, flags):
    """load.serve_copy() with more flags for the server."""
    workdir = load.tempdir()
    cached = load.accounts_db(args)
    db = os.path.join(workdir, "keyspread.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(cached + suffix):
            load.shutil.copy(cached + suffix, db + suffix)
    server = load.Server(args, f"sqlite://{db}", workdir, pinned=False, flags=flags)
    server.wait_ready(timeout=180)
    return server


def part_sigterm(args):
    server = load.serve_copy(args, pinned=False)
    stalled = ask_for_snapshot(server.port)
    time.sleep(1.0)
    started = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=40)
        took = f"{time.perf_counter() - started:.1f} s (exit {server.proc.returncode})"
    except subprocess.TimeoutExpired:
        took = "still running after 40 s (killed)"
        server.proc.kill()
        server.proc.wait()
    stalled.close()
    return took


def run_one(args):
    load.log(f"{args.binary}: a client trickling /snapshot ...")
    trickled = part_trickle(args)
    load.log(f"{args.binary}: {args.polls} long polls ...")
    polls = {cap: part_polls(args, cap) for cap in (None, args.polls)}
    load.log(f"{args.binary}: SIGTERM beside a client that reads nothing ...")
    return trickled, polls, part_sigterm(args)


def run(args):
    results = []
    for binary in [b for b in (args.baseline, args.binary) if b]:
        args.binary = os.path.abspath(binary)
        results.append((binary, run_one(args)))
    out = [f"- {args.accounts:,} accounts in SQLite, server unpinned with default flags; "
           f"load average {os.getloadavg()[0]:.1f} at the end"]
    for binary, (trickled, polls, sigterm) in results:
        out += ["", f"`{binary}`:", "",
                f"| request (all at once) | server otherwise idle | beside a client trickling "
                f"`/snapshot` at {args.trickle_kbps} KB/s | body |",
                "| --- | --- | --- | --- |", *trickled["rows"], "",
                f"- lookups every 20 ms during the idle burst: {trickled['lookups_idle']}",
                f"- lookups every 20 ms during the burst beside the slow client: "
                f"{trickled['lookups_busy']}",
                f"- the slow client read {trickled['slow_read'] / 1e6:.1f} MB meanwhile"
                f"{' (all of it)' if trickled['slow_ended'] else ', its answer not yet whole'}",
                f"- lookups on a new connection every 10 ms for {args.lookup_s} s beside "
                f"{args.polls} long polls, default --max-connections: {polls[None]}",
                f"- the same with --max-connections {args.polls}: {polls[args.polls]}",
                f"- SIGTERM beside a client that asked for the snapshot and reads nothing: "
                f"exited after {sigterm}"]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    load.database_script_arguments(parser, hot_every=0)
    parser.set_defaults(accounts=100_000)
    parser.add_argument("--trickle-kbps", type=int, default=300,
                        help="KB/s the slow client reads the snapshot at")
    parser.add_argument("--polls", type=int, default=1000, help="long polls held open")
    parser.add_argument("--lookup-s", type=int, default=5,
                        help="seconds of lookups beside the long polls")
    parser.add_argument("--baseline", help="another server build, measured first the same way")
    args = parser.parse_args()
    load.run_database_script(args, run)


if __name__ == "__main__":
    main()
