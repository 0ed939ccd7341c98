#!/usr/bin/env python3
"""Heartbeat latency while load reports name ever new accounts (stdlib only).

    python3 benches/heartbeat_names.py [--binary PATH] [--rounds 150]

Starts the server on a fresh SQLite file (127.0.0.1, a port picked here), registers a stream
of one shard, joins one worker, then sends `--rounds` heartbeats one after another, each
carrying a report of 1,000 accounts never named before (the most a report may name). Prints
the median latency of the first ten heartbeats and of the last ten: a shard keeps its 2,000
heaviest accounts, so the row each heartbeat rewrites stops growing. The server is killed on
exit.
"""
import argparse, http.client, json, os, random, socket, subprocess, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_DIR = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
parser = argparse.ArgumentParser()
parser.add_argument("--binary", default=os.path.join(TARGET_DIR, "release", "keyspread"))
parser.add_argument("--rounds", type=int, default=150)
args = parser.parse_args()

probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
work = tempfile.mkdtemp()
env = dict(os.environ, DATABASE_URL=f"sqlite://{work}/k.db", KEYSPREAD_LISTEN=f"127.0.0.1:{port}",
           KEYSPREAD_LEASE_JOIN_BATCH_MS="0", KEYSPREAD_MUTATION_RATE="0", RUST_LOG="warn")
server = subprocess.Popen([args.binary, "serve"], env=env, stderr=subprocess.DEVNULL)
try:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    deadline = time.time() + 30
    while True:
        try:
            conn.request("GET", "/readyz")
            answer = conn.getresponse()
            answer.read()
            if answer.status == 200:
                break
        except OSError:
            conn = http.client.HTTPConnection("127.0.0.1", port)
        if time.time() > deadline:
            raise SystemExit("the server was not ready after 30 s")
        time.sleep(0.05)

    def call(method, path, body=None):
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        answer = conn.getresponse()
        text = answer.read()
        if answer.status >= 300:
            raise SystemExit(f"{method} {path}: {answer.status} {text[:200]!r}")
        return json.loads(text) if text else None

    call("PUT", "/streams/s", {"shard_count": 1})
    lease = call("PUT", "/streams/s/workers/w1", {"ttl_s": 600})["leases"][0]
    rng = random.Random(1)
    times = []
    for i in range(args.rounds):
        accounts = [{"account": f"acct-{i:05}-{j:04}", "records": rng.randint(1, 1000), "bytes": 100}
                    for j in range(1000)]
        entry = {"shard_id": lease["shard_id"], "epoch": lease["epoch"], "window_ms": 10_000,
                 "records": 600_000, "bytes": 100_000, "accounts": accounts}
        started = time.perf_counter()
        call("PUT", "/streams/s/workers/w1", {"ttl_s": 600, "load": [entry]})
        times.append(time.perf_counter() - started)
    median = lambda xs: sorted(xs)[len(xs) // 2] * 1000
    print(f"first 10 heartbeats: median {median(times[:10]):.1f} ms; last 10, after "
          f"{args.rounds * 1000:,} names: median {median(times[-10:]):.1f} ms")
finally:
    server.kill()
    server.wait()
