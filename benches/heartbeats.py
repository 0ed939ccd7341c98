#!/usr/bin/env python3
"""Heartbeats a server takes at its most, and its CPU time per heartbeat (stdlib only).

    python3 benches/heartbeats.py [--binary PATH] [--shards 10000] [--workers 1000] [--secs 15]
                                  [--accounts 0] [--database-url URL]

Starts the server on a fresh SQLite file (127.0.0.1, a port it picks), registers a uniform
stream of `--shards` shards, joins `--workers` workers (ttl 600 s) and waits until every
lease is held, then 8 clients heartbeat round the workers as fast as they are answered for
`--secs` seconds. Prints heartbeats/s and the server's user + system CPU (`/proc/PID/stat`)
per heartbeat: a heartbeat costs O(its own leases), so that figure stays flat as the stream
grows. With `--accounts N`, each steady heartbeat also carries a load report of N accounts
(the same N names each time, as a worker's top accounts of a shard) on the first shard the
worker holds; the answers must count it (empty `ignored_load`). `--database-url` runs the
server on that (empty) database instead, e.g. a fresh Postgres one; the CPU figure is then
keyspread's alone, not the database server's. `--read-load N` then times N reads of the
stream's whole load (`GET /load?stream=s&limit=1`: every shard's and account's rate, what a
controller round read before 2026-11-27), one at a time, with the server's CPU per read.
`--read-round N` times N plans by load (`GET /rebalance/preview?stream=s&by=load`): the
round's own read, the rows opened straight into each account's total; the reports' accounts
are not allocated, so the plan weighs no key and the read is all it costs. The server is
killed on exit.
"""
import argparse, http.client, json, os, re, subprocess, tempfile, threading, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_DIR = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
parser = argparse.ArgumentParser()
parser.add_argument("--binary", default=os.path.join(TARGET_DIR, "release", "keyspread"))
parser.add_argument("--shards", type=int, default=10000)
parser.add_argument("--workers", type=int, default=1000)
parser.add_argument("--secs", type=int, default=15)
parser.add_argument("--accounts", type=int, default=0)
parser.add_argument("--database-url")
parser.add_argument("--read-load", type=int, default=0, metavar="N",
                    help="then time N reads of GET /load (every account's rate on every shard)")
parser.add_argument("--read-round", type=int, default=0, metavar="N",
                    help="then time N plans by load over no allocated account (a round's read)")
args = parser.parse_args()
binary, shards, workers, secs = args.binary, args.shards, args.workers, min(args.secs, 600)
d = tempfile.mkdtemp()
log = open(os.path.join(d, "log"), "w")
env = dict(os.environ, DATABASE_URL=args.database_url or f"sqlite://{d}/k.db", KEYSPREAD_LISTEN="127.0.0.1:0",
           KEYSPREAD_MUTATION_RATE="0", RUST_LOG="warn,keyspread=info")
p = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=log)
try:
    addr = None
    for _ in range(300):
        m = re.search(r"listening addr=(\S+)", open(os.path.join(d, "log")).read())
        if m: addr = m.group(1); break
        time.sleep(0.1)
    host, port = addr.rsplit(":", 1)
    local = threading.local()
    def call(method, path, body=None, again=True):
        if not hasattr(local, "c"): local.c = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            local.c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
            r = local.c.getresponse(); data = r.read(); return r.status, data
        except (http.client.HTTPException, OSError):
            if not again: raise
            local.c.close(); del local.c; return call(method, path, body, False)
    for _ in range(100):
        try:
            if call("GET", "/readyz")[0] == 200: break
        except Exception: time.sleep(0.1)
    print("put", call("PUT", "/streams/s", {"shard_count": shards})[0])
    def beat(w): return call("PUT", f"/streams/s/workers/w{w}", {"ttl_s": 600})
    held = {}  # worker -> (shard, epoch) of the first lease it holds
    def report(w):
        if w not in held: return beat(w)
        shard, epoch = held[w]
        accounts = [{"account": f"acct-{shard}-{i}", "records": 1000 - i % 1000, "bytes": 100 * (1000 - i % 1000)}
                    for i in range(args.accounts)]
        load = [{"shard_id": shard, "epoch": epoch, "window_ms": 5000, "records": 600_000,
                 "bytes": 60_000_000, "accounts": accounts}]
        return call("PUT", f"/streams/s/workers/w{w}", {"ttl_s": 600, "load": load})
    threads = 8
    def joiner(k):
        for w in range(k, workers, threads):
            s, b = beat(w)
            assert s == 200, b
    t0 = time.time(); ts = [threading.Thread(target=joiner, args=(k,)) for k in range(threads)]
    [t.start() for t in ts]; [t.join(timeout=300) for t in ts]
    print(f"joined {workers} in {time.time()-t0:.1f}s")
    deadline = time.time() + 60
    while time.time() < deadline:  # settle: every hand-over done
        for w in range(workers): beat(w)
        s, b = call("GET", "/streams/s/leases")
        group = json.loads(b)
        busy = sum(1 for x in group["workers"] if x["shards"])  # joins wait to be assigned together
        if all(x["state"] == "held" for x in group["shards"]) and busy == min(workers, shards): break
    if args.accounts:
        for w in range(workers):
            own = [l for l in json.loads(beat(w)[1])["leases"] if l["state"] == "held"]
            if own: held[w] = (own[0]["shard_id"], own[0]["epoch"])
        print(f"{len(held)} of {workers} workers report {args.accounts} accounts at each heartbeat")
    def cpu():
        f = open(f"/proc/{p.pid}/stat").read().split(")")[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    counts = [0] * threads; stop = time.time() + secs; leases = [0] * threads; ignored = [0] * threads
    def runner(k):
        w = k
        while time.time() < stop:
            s, b = report(w) if args.accounts else beat(w); assert s == 200, b
            answer = json.loads(b)
            counts[k] += 1; leases[k] += len(answer["leases"]); ignored[k] += len(answer["ignored_load"])
            w = (w + threads) % workers
    c0, t0 = cpu(), time.time()
    ts = [threading.Thread(target=runner, args=(k,)) for k in range(threads)]
    [t.start() for t in ts]; [t.join(timeout=secs + 30) for t in ts]
    c1, t1 = cpu(), time.time(); n = sum(counts)
    assert sum(ignored) == 0, f"{sum(ignored)} load entries ignored"
    print(f"shards {shards} workers {workers} accounts per heartbeat {args.accounts}: {n} heartbeats in {t1-t0:.1f}s = {n/(t1-t0):.0f}/s, "
          f"{sum(leases)/n:.1f} leases each, server CPU {(c1-c0)/(t1-t0)*100:.0f}% of a core, {(c1-c0)/n*1000:.2f} ms CPU per heartbeat")
    if args.read_load:
        times = []; c0 = cpu()
        for _ in range(args.read_load):
            t = time.time(); s, b = call("GET", "/load?stream=s&limit=1"); times.append(time.time() - t)
            assert s == 200, b
        c1 = cpu(); times.sort()
        print(f"GET /load over {shards} shards: median {times[len(times)//2]*1000:.0f} ms, min {times[0]*1000:.0f} ms, "
              f"max {times[-1]*1000:.0f} ms, server CPU {(c1-c0)/len(times)*1000:.0f} ms per read ({len(times)} reads)")
    if args.read_round:
        times = []; c0 = cpu()
        for _ in range(args.read_round):
            t = time.time(); s, b = call("GET", "/rebalance/preview?stream=s&by=load"); times.append(time.time() - t)
            assert s == 200, b
        c1 = cpu(); times.sort()
        print(f"a round's read over {shards} shards (plan by load, no key): median {times[len(times)//2]*1000:.0f} ms, "
              f"min {times[0]*1000:.0f} ms, max {times[-1]*1000:.0f} ms, "
              f"server CPU {(c1-c0)/len(times)*1000:.0f} ms per read ({len(times)} reads)")
finally:
    p.kill(); p.wait()
