#!/usr/bin/env python3
"""Proof on kinesalite that load reported by producers alone keeps a stream balanced while
its shards change.

`run` makes one run on a fresh 4-shard stream that keyspread watches (its primary):
examples/load_generator.py writes 300 accounts with Zipf(1.1) record rates through the
order-safe producer on a mirror (`--mirror`), whose `record()` picks each record's key and
counts it, and which reports what was sent to `POST /load/producers` every
`--report-interval-s`; the hot accounts rotate at the midpoint. Every account opted in to
`max_fanout` 4. Consumers are plain readers: a thread per shard reading it with
GetShardIterator and GetRecords from TRIM_HORIZON, the children of a split or merge only
once every parent is read to its end (as the Kinesis Client Library does), each batch handed
to the order-aware consumer's logic (examples/order_aware_consumer.py, which learns staged
moves from `GET /moves`). No keyspread leases, no heartbeats: keyspread hears of load from
the producers only.

`--split-at` seconds in, the harness splits a shard itself with SplitShard (as on-demand
scaling does, outside keyspread); keyspread's watch registers it and the loop rebalances.
The harness prints `producing` when the generator starts writing, so that its caller can reshard
the stream through keyspread during the run; at the end the job is read from `GET
/streams/{name}/reshard`.

The changes are the start, the split (from the call until the watch has registered it: the
listing that follows), the rotation, and the reshard (from the job's start to its end). Per
10-s window from the generator's start, by the records' arrival, the busiest shard's records
over the mean of the shards open then. A window is judged when it starts `--settle-s` or
more after the end of every change before it and ends before the next change begins: only
windows whose open shards did not change are judged, so a shard's records are never split
between a closing parent and its children within one. Also, per (account, sub-key),
records out of order, twice or never; and from `GET /events`, the load moves by round.
Prints a line per window, then the figures as one JSON line (also to `--out`).

`plot` draws a run's figures as an SVG with the changes marked.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import load_proof
from load_proof import Gate, Keyspread, kinesis_client, ratios

SHARDS = 4


class Readers:
    """Plain readers of a stream: a thread per shard, started once every parent listed is
    read to its end; a lister looks at the stream's shards every second and tells the
    order-aware consumer's logic (`gate`) what it found."""

    def __init__(self, endpoint, stream, gate):
        self.endpoint, self.stream, self.gate = endpoint, stream, gate
        self.kinesis = kinesis_client(endpoint)
        self.threads = {}
        self.ended = set()
        self.stop = threading.Event()
        self.lister = threading.Thread(target=self.list, daemon=True)
        self.lister.start()

    def list(self):
        while not self.stop.is_set():
            self.look()
            self.stop.wait(1.0)

    def look(self):
        listed = listing(self.kinesis, self.stream)
        self.gate.follow(listed)
        ids = {s["ShardId"] for s in listed}
        for shard in listed:
            parents = [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId"))
                       if p in ids]
            if shard["ShardId"] not in self.threads and all(p in self.ended for p in parents):
                thread = threading.Thread(target=self.read, args=(shard["ShardId"],), daemon=True)
                self.threads[shard["ShardId"]] = thread
                thread.start()

    def read(self, shard):
        kinesis = kinesis_client(self.endpoint)
        iterator = kinesis.get_shard_iterator(StreamName=self.stream, ShardId=shard,
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator and not self.stop.is_set():
            started = time.time()
            answer = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            self.gate.take(shard, answer, started)
            iterator = answer.get("NextShardIterator")
            if not answer["Records"]:
                self.stop.wait(0.2)
        if iterator is None:
            self.ended.add(shard)  # read to its end: its children may start

    def close(self):
        self.stop.set()
        self.lister.join(timeout=10)
        for thread in self.threads.values():
            thread.join(timeout=10)


def listing(kinesis, stream):
    """Every shard of `stream`, closed ones too, every page."""
    shards, token = [], None
    while True:
        page = kinesis.list_shards(NextToken=token) if token else kinesis.list_shards(StreamName=stream)
        shards += page["Shards"]
        token = page.get("NextToken")
        if not token:
            return shards


def open_ids(listed):
    return sorted(s["ShardId"] for s in listed if "EndingSequenceNumber" not in s["SequenceNumberRange"])


def prepare(args, keyspread, kinesis):
    """A 4-shard stream, watched as the primary; the accounts allocated and opted in to
    `max_fanout`."""
    kinesis.create_stream(StreamName=args.stream, ShardCount=SHARDS)
    for _ in range(200):
        summary = kinesis.describe_stream_summary(StreamName=args.stream)["StreamDescriptionSummary"]
        if summary["StreamStatus"] == "ACTIVE":
            break
        time.sleep(0.05)
    keyspread.call("PUT", f"/streams/{args.stream}", {"watch": True, "primary": True})
    from load_generator import account_names

    accounts = account_names(args.accounts)
    weight = load_proof.WEIGHT
    keyspread.call("POST", "/keys/batch", {"accounts": [{"account": a, "weight": weight} for a in accounts]})
    for account in accounts:
        keyspread.call("PATCH", f"/keys/{account}", {"max_fanout": load_proof.MAX_FANOUT})


def split(args, keyspread, kinesis):
    """Splits the stream's first open shard in half, outside keyspread; answers when the call
    was made and when keyspread had registered it."""
    shard = next(s for s in listing(kinesis, args.stream)
                 if "EndingSequenceNumber" not in s["SequenceNumberRange"])
    low, high = (int(shard["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    made = time.time()
    kinesis.split_shard(StreamName=args.stream, ShardToSplit=shard["ShardId"],
                        NewStartingHashKey=str(low + (high - low + 1) // 2))
    want = len(open_ids(listing(kinesis, args.stream)))
    deadline = made + 60
    while len(keyspread.call("GET", f"/streams/{args.stream}")["shards"]) != want:
        if time.time() > deadline:
            raise SystemExit("keyspread's watch did not register the split within 60 s")
        time.sleep(0.2)
    return made, time.time()


def generate(args):
    """Starts the load generator on a mirror as its own process."""
    command = [sys.executable, os.path.join(args.examples, "load_generator.py"), "--stream", args.stream,
               "--endpoint-url", args.kinesis, "--seconds", str(args.seconds), "--accounts", str(args.accounts),
               "--rate", str(args.rate), "--seed", str(args.seed), "--keyspread", args.keyspread,
               "--mirror", "--report-interval-s", str(args.report_interval_s)]
    mirror = os.path.join(args.examples, "..", "clients", "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([args.client_dir, args.examples, mirror]),
               AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(generator, args):
    """The generator's figures once it exits."""
    out, err = generator.communicate(timeout=args.seconds + 120)
    if generator.returncode != 0:
        raise SystemExit(f"load_generator.py exited {generator.returncode}:\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def seconds_of(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def windows(handed, start, seconds, changes, phases, settle_s):
    """Per full window: records per shard open then, busiest / mean, and whether judged.
    `changes`: (name, from, until) in Unix seconds; `phases`: (from, open shard ids), the
    open shards from each moment on."""
    counts = {}
    for r in handed:
        i = int((r["arrival"] - start) // load_proof.WINDOW)
        counts.setdefault(i, {}).setdefault(r["shard"], 0)
        counts[i][r["shard"]] += 1
    out = []
    for i in range(int(seconds // load_proof.WINDOW)):
        t = i * load_proof.WINDOW
        begin, end = start + t, start + t + load_proof.WINDOW
        shards = counts.get(i, {})
        opened = [ids for at, ids in phases if at <= begin][-1]
        judged = all(begin >= until + settle_s or end <= since for _, since, until in changes)
        # A shard outside the open set would be one the phases missed: never judged then.
        strays = sorted(set(shards) - set(opened))
        names = opened + strays
        out.append({"t": t, "records": sum(shards.values()), "shard": ratios(shards, names),
                    "judged": judged and not strays, "open": len(opened), "strays": strays,
                    "per_shard": [shards.get(s, 0) for s in names]})
    return out


def inverted(handed, events, listed, start):
    """For up to three (account, sub-key)s handed on out of order: their records as handed
    on, their account's key events, and the shards: what it takes to say why."""
    last, keys = {}, []
    for r in handed:
        data = json.loads(r["data"])
        key = (data["a"], data["s"])
        if data["n"] < last.get(key, -1) and key not in keys:
            keys.append(key)
        last[key] = max(data["n"], last.get(key, -1))
    out = []
    for account, sub_key in keys[:3]:
        seen = [(json.loads(r["data"])["n"], r["shard"], round(r["arrival"] - start, 3), i)
                for i, r in enumerate(handed) if r["account"] == account and json.loads(r["data"])["s"] == sub_key]
        moved = [{k: e.get(k) for k in ("id", "kind", "index", "key_before", "key_after", "at", "switch_at",
                                         "reason", "actor")} for e in events if e.get("account") == account]
        out.append({"account": account, "sub_key": sub_key, "records": seen, "events": moved})
    shards = [(s["ShardId"], s["HashKeyRange"]["StartingHashKey"], s.get("ParentShardId"),
               s.get("AdjacentParentShardId")) for s in listed]
    return {"keys": out, "shards": shards} if out else None


def run(args):
    sys.path.insert(0, args.client_dir)
    sys.path.insert(0, args.examples)
    from keyspread_api import Client
    from order_aware_consumer import OrderAwareConsumer

    client = Client(base_url=args.keyspread, timeout=30)
    keyspread = Keyspread(client)
    kinesis = kinesis_client(args.kinesis)
    prepare(args, keyspread, kinesis)
    handed = []
    consumer = OrderAwareConsumer(kinesis, args.stream, client, skew_ms=args.skew_ms,
                                  deliver=lambda shard, record: handed.append(record), read=False)
    gate = Gate(consumer)
    readers = Readers(args.kinesis, args.stream, gate)
    phases = [(0.0, open_ids(listing(kinesis, args.stream)))]
    cpu_before = os.times()

    generator = generate(args)
    if generator.stdout.readline().strip() != "started":
        raise SystemExit(f"load_generator.py did not start:\n{generator.communicate()[1]}")
    started = time.time()
    print("producing", flush=True)
    time.sleep(max(0.0, started + args.split_at - time.time()))
    split_made, split_registered = split(args, keyspread, kinesis)
    phases.append((split_made, open_ids(listing(kinesis, args.stream))))
    produced = finished(generator, args)
    load = load_proof.observed(keyspread, args.stream)  # while the reports are fresh
    deadline = time.time() + 60
    while time.time() < deadline and (len(handed) < produced["records"] or gate.held()):
        time.sleep(0.5)
    readers.close()
    gate.stop.set()
    cpu = os.times()

    job = keyspread.call("GET", f"/streams/{args.stream}/reshard", ok=(200, 404))
    events = keyspread.events()
    start = produced["started"]
    changes = [("start", start, start), ("split", split_made, split_registered)]
    if produced["rotated_at"]:
        changes.append(("rotation", produced["rotated_at"], produced["rotated_at"]))
    if job and job.get("state"):
        resharded = (seconds_of(job["started_at"]), seconds_of(job["updated_at"]))
        changes.append(("reshard", *resharded))
        phases.append((resharded[1], open_ids(listing(kinesis, args.stream))))
    figures = {
        "scheme": "producers",
        "started": start,
        "records": produced["records"],
        "handed_on": len(handed),
        "held_back": consumer.held_back,
        "resent": produced["resent"],
        "seconds": args.seconds,
        "changes": [{"change": name, "from_s": round(since - start, 1), "until_s": round(until - start, 1)}
                    for name, since, until in changes],
        "open_shards": [len(ids) for _, ids in phases],
        "reshard": {k: job.get(k) for k in ("state", "done", "shard_count", "target", "error")} if job else None,
        "windows": windows(handed, start, args.seconds, changes, phases, args.settle_s),
        **load_proof.order(handed, produced),
        **load_proof.moves(events, args.cooldown_s),
        "inverted": inverted(handed, events, listing(kinesis, args.stream), start),
        "hottest": load_proof.hottest(keyspread, produced, "producers"),
        "hottest_account": produced["ranks_after"][0],
        "load": load,
        "harness_cpu_s": round(sum(cpu[:4]) - sum(cpu_before[:4]), 1),
    }
    for w in figures["windows"]:
        print(f"t={w['t']:>3}s records={w['records']:>5} open={w['open']} busiest shard/mean={w['shard']}"
              f"{' (judged)' if w['judged'] else ''} per shard={w['per_shard']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f)
    print(json.dumps(figures), flush=True)


def plot(args):
    """The SVG of a run, the changes marked, and its windows as a table."""
    with open(args.figures) as f:
        figures = json.load(f)
    marks = [(c["from_s"], c["change"]) for c in figures["changes"] if c["change"] != "start"]
    if args.killed_at is not None:
        marks.append((args.killed_at - figures["started"], "keyspread SIGKILLed"))
    load_proof.draw([figures], args.svg, "Busiest shard ÷ mean records per 10-s window, from what plain "
                    "readers read", "300 accounts at Zipf(1.1) rates, load reported by the producers' mirrors; "
                    f"{' → '.join(str(n) for n in figures['open_shards'])} shards on kinesalite", marks)
    print("| window | open shards | busiest shard ÷ mean | per shard |")
    print("| --- | ---: | ---: | --- |")
    for w in figures["windows"]:
        mark = "\\*" if w["judged"] else ""
        print(f"| {w['t']}-{w['t'] + load_proof.WINDOW} s | {w['open']} | {w['shard']}{mark} | "
              f"{' '.join(str(n) for n in w['per_shard'])} |")
    worst = max((w["shard"] for w in figures["windows"] if w["judged"]), default=None)
    print(f"| worst judged window | | **{worst}** | |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="one run on a fresh stream")
    one.add_argument("--client-dir", required=True, help="holds the generated keyspread_api")
    one.add_argument("--keyspread", required=True)
    one.add_argument("--kinesis", required=True)
    one.add_argument("--stream", required=True)
    one.add_argument("--seconds", type=float, default=300)
    one.add_argument("--split-at", type=float, default=75, help="seconds in: the outside split")
    one.add_argument("--accounts", type=int, default=300)
    one.add_argument("--rate", type=float, default=160, help="records a second, all accounts")
    one.add_argument("--seed", type=int, default=1)
    one.add_argument("--skew-ms", type=int, default=1000)
    one.add_argument("--report-interval-s", type=float, default=2, help="the mirror's load reports")
    one.add_argument("--settle-s", type=float, default=33,
                     help="windows starting this long after every change before them are judged")
    one.add_argument("--cooldown-s", type=float, default=600, help="the server's --move-cooldown-s")
    one.add_argument("--out", help="also write the figures here")
    draw = sub.add_parser("plot", help="the SVG of a run")
    draw.add_argument("--svg", required=True)
    draw.add_argument("--killed-at", type=float, help="when keyspread was SIGKILLed (Unix seconds)")
    draw.add_argument("figures")
    args = parser.parse_args()
    args.examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    if args.command == "run":
        args.keyspread = args.keyspread.rstrip("/")
        run(args)
    else:
        plot(args)


if __name__ == "__main__":
    main()
