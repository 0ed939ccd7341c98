#!/usr/bin/env python3
"""Proof on kinesalite that keyspread's leases give every shard one reader at a time.

Runs examples/lease_worker.py processes against a real keyspread and kinesalite while a
producer writes numbered records, and checks what the workers printed:

- every record written was read;
- per shard, each epoch was read by one worker, and the reads of each epoch all came
  before any read of a later epoch (one reader at a time);
- a record was read twice only after a worker was killed (its batch in flight, handed on
  but not checkpointed), never after a clean hand-over;
- `--mode churn`: 8 shards, 4 workers, one killed with SIGKILL, two more started;
- `--mode reshard`: 2 shards, 2 workers, a real SplitShard and a real MergeShards halfway,
  the stream registered again from ListShards; every child is read only after each of its
  parents was read to SHARD_END.

Prints the figures as one JSON line last.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

TTL = 3


def kinesis_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "kinesis", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=10),
    )


def http(method, url, body=None):
    """The harness's own calls, with the admin token when the server has tokens
    (KEYSPREAD_ADMIN_TOKEN); the workers get KEYSPREAD_WORKER_TOKEN, a consume token."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"} if data else {}
    if os.environ.get("KEYSPREAD_ADMIN_TOKEN"):
        headers["authorization"] = f"Bearer {os.environ['KEYSPREAD_ADMIN_TOKEN']}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=20) as response:
        text = response.read()
        return json.loads(text) if text else None


def wait_active(kinesis, stream):
    for _ in range(200):
        if kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
            return
        time.sleep(0.05)
    raise SystemExit(f"{stream} never became ACTIVE")


def register(keyspread, kinesis, stream):
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    http("PUT", f"{keyspread}/streams/{stream}", {"Shards": shards})
    return shards


class Producer(threading.Thread):
    """Writes `rate` numbered records a second over `keys` partition keys until stopped."""

    def __init__(self, kinesis, stream, keys=40, rate=80):
        super().__init__(daemon=True)
        self.kinesis, self.stream, self.keys, self.rate = kinesis, stream, keys, rate
        self.sent = {}  # (shard, seq) -> "key:n"
        self.stop = threading.Event()
        self.error = None

    def run(self):
        n = 0
        try:
            while not self.stop.is_set():
                batch = [{"PartitionKey": f"k{(n + i) % self.keys}", "Data": f"k{(n + i) % self.keys}:{n + i}".encode()}
                         for i in range(8)]
                answer = self.kinesis.put_records(StreamName=self.stream, Records=batch)
                for record, result in zip(batch, answer["Records"]):
                    if "SequenceNumber" in result:
                        self.sent[(result["ShardId"], result["SequenceNumber"])] = record["Data"].decode()
                n += len(batch)
                time.sleep(len(batch) / self.rate)
        except Exception as err:  # reported by the checker
            self.error = repr(err)


class Workers:
    def __init__(self, args, work):
        self.args, self.work, self.procs = args, work, {}

    def start(self, name):
        out = open(os.path.join(self.work, f"{name}.jsonl"), "w")
        env = dict(os.environ, PYTHONPATH=self.args.client_dir, AWS_DEFAULT_REGION="us-east-1",
                   AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
        env.pop("KEYSPREAD_TOKEN", None)
        if os.environ.get("KEYSPREAD_WORKER_TOKEN"):
            env["KEYSPREAD_TOKEN"] = os.environ["KEYSPREAD_WORKER_TOKEN"]
        self.procs[name] = subprocess.Popen(
            [sys.executable, os.path.join(self.args.examples, "lease_worker.py"),
             "--keyspread", self.args.keyspread, "--stream", self.args.stream, "--worker", name,
             "--ttl", str(TTL), "--endpoint-url", self.args.kinesis],
            stdout=out, stderr=open(os.path.join(self.work, f"{name}.err"), "w"), env=env,
        )

    def kill(self, name):
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise SystemExit(f"{name} did not stop on SIGTERM")

    def lines(self):
        out = []
        for name in self.procs:
            with open(os.path.join(self.work, f"{name}.jsonl")) as f:
                # A line still being written (no newline yet) is read next time.
                out.extend(json.loads(line) for line in f if line.endswith("\n") and line.strip())
        return out

    def errors(self):
        text = ""
        for name in self.procs:
            with open(os.path.join(self.work, f"{name}.err")) as f:
                text += f.read()
        return text


def read_all(workers, producer, timeout):
    """Waits until every record written was read."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        seen = {(r["shard"], r["seq"]) for r in workers.lines() if "seq" in r}
        if set(producer.sent) <= seen:
            return
        time.sleep(0.5)


def check(lines, producer, killed):
    # By time: the output files are read worker by worker.
    reads = sorted((r for r in lines if "seq" in r), key=lambda r: r["t"])
    events = [r for r in lines if "event" in r]
    seen = {}
    for r in reads:
        seen.setdefault((r["shard"], r["seq"]), []).append(r)
    missing = [k for k in producer.sent if k not in seen]
    wrong = [k for k, rs in seen.items() if k in producer.sent and rs[0]["data"] != producer.sent[k]]
    # One reader at a time: per shard, each epoch one worker, epochs' reads in order.
    overlaps = []
    by_shard = {}
    for r in reads:
        by_shard.setdefault(r["shard"], {}).setdefault(r["epoch"], []).append(r)
    hand_overs = 0
    for shard, epochs in by_shard.items():
        spans = []
        for epoch, rs in sorted(epochs.items()):
            workers = {r["worker"] for r in rs}
            if len(workers) != 1:
                overlaps.append(f"{shard} epoch {epoch} read by {sorted(workers)}")
            spans.append((epoch, min(r["t"] for r in rs), max(r["t"] for r in rs), rs[0]["worker"]))
        for (e1, _, last, w1), (e2, first, _, w2) in zip(spans, spans[1:]):
            if first <= last:
                overlaps.append(f"{shard}: {w2} read epoch {e2} at {first:.3f} before {w1} stopped epoch {e1} at {last:.3f}")
            if w1 != w2:
                hand_overs += 1
    duplicates = [rs for rs in seen.values() if len(rs) > 1]
    # Excused: the killed worker handed the record on first, then died before its checkpoint.
    clean_duplicates = [rs for rs in duplicates if rs[0]["worker"] != killed]
    per_worker = {}
    for r in reads:
        per_worker[r["worker"]] = per_worker.get(r["worker"], 0) + 1
    return {
        "records": len(producer.sent),
        "reads": len(reads),
        "missing": len(missing),
        "wrong_data": len(wrong),
        "overlaps": overlaps[:10],
        "overlap_count": len(overlaps),
        "hand_overs": hand_overs,
        "duplicates": len(duplicates),
        "duplicates_after_clean_hand_over": len(clean_duplicates),
        "per_worker": per_worker,
        "events": {e: sum(1 for x in events if x["event"] == e) for e in ("held", "revoking", "lost", "shard_end")},
    }


def begin(args, kinesis, work, shards, workers):
    """A registered stream of `shards` shards, a producer writing to it, and `workers`
    workers reading it."""
    kinesis.create_stream(StreamName=args.stream, ShardCount=shards)
    wait_active(kinesis, args.stream)
    register(args.keyspread, kinesis, args.stream)
    producer = Producer(kinesis, args.stream)
    producer.start()
    group = Workers(args, work)
    for n in range(workers):
        group.start(f"w{n}")
    return producer, group


def has_read(workers, name, timeout):
    """Waits until `name` has read a record (a slow machine starts Python slowly)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r.get("worker") == name and "seq" in r for r in workers.lines()):
            return
        time.sleep(0.5)
    raise SystemExit(f"{name} read nothing in {timeout} s")


def churn(args, kinesis, work):
    producer, workers = begin(args, kinesis, work, shards=8, workers=4)
    time.sleep(7)
    has_read(workers, "w1", 30)
    workers.kill("w1")
    time.sleep(4)
    workers.start("w4")
    workers.start("w5")
    time.sleep(9)
    producer.stop.set()
    producer.join()
    read_all(workers, producer, 30)
    # Settled: five live workers over eight equal shards.
    time.sleep(2 * TTL)
    leases = http("GET", f"{args.keyspread}/streams/{args.stream}/leases")
    workers.stop_all()
    figures = check(workers.lines(), producer, killed="w1")
    counts = sorted(len(w["shards"]) for w in leases["workers"])
    figures.update(mode="churn", producer_error=producer.error, final_lease_counts=counts,
                   final_states=sorted({s["state"] for s in leases["shards"]}))
    return figures, workers


def reshard(args, kinesis, work):
    producer, workers = begin(args, kinesis, work, shards=2, workers=2)
    time.sleep(5)
    shards = kinesis.list_shards(StreamName=args.stream)["Shards"]
    first = shards[0]
    lo, hi = int(first["HashKeyRange"]["StartingHashKey"]), int(first["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=args.stream, ShardToSplit=first["ShardId"],
                        NewStartingHashKey=str((lo + hi + 1) // 2))
    wait_active(kinesis, args.stream)
    time.sleep(1.5)  # records for the split's children, before one of them is merged
    listed = kinesis.list_shards(StreamName=args.stream)["Shards"]
    upper = next(s for s in listed if s.get("ParentShardId") == first["ShardId"]
                 and int(s["HashKeyRange"]["StartingHashKey"]) > lo)
    kinesis.merge_shards(StreamName=args.stream, ShardToMerge=upper["ShardId"],
                         AdjacentShardToMerge=shards[1]["ShardId"])
    wait_active(kinesis, args.stream)
    listed = register(args.keyspread, kinesis, args.stream)
    time.sleep(6)
    producer.stop.set()
    producer.join()
    read_all(workers, producer, 30)
    leases = http("GET", f"{args.keyspread}/streams/{args.stream}/leases")
    workers.stop_all()
    lines = workers.lines()
    figures = check(lines, producer, killed=None)
    ends = {e["shard"]: e["t"] for e in lines if e.get("event") == "shard_end"}
    first_read, first_held = {}, {}
    for r in lines:
        if "seq" in r:
            first_read[r["shard"]] = min(first_read.get(r["shard"], r["t"]), r["t"])
        if r.get("event") == "held":
            first_held[r["shard"]] = min(first_held.get(r["shard"], r["t"]), r["t"])
    early = []
    parents_of = {s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
                  for s in listed}
    children = [s for s, ps in parents_of.items() if ps]
    for child in children:
        for parent in parents_of[child]:
            if parent not in ends:
                early.append(f"{parent} never reached SHARD_END")
            elif child in first_held and first_held[child] <= ends[parent]:
                early.append(f"{child} leased at {first_held[child]:.3f} before {parent}'s end at {ends[parent]:.3f}")
            elif child in first_read and first_read[child] <= ends[parent]:
                early.append(f"{child} read at {first_read[child]:.3f} before {parent}'s end at {ends[parent]:.3f}")
    figures.update(
        mode="reshard", producer_error=producer.error, shards=len(listed), children=len(children),
        children_read=sum(1 for c in children if c in first_read), early_children=early,
        final_states={s["shard_id"]: s["state"] for s in leases["shards"]},
    )
    return figures, workers


def self_test():
    """The checker on made-up reads: it must blame what it should and excuse what it should."""

    class Sent:
        sent = {("s0", "1"): "k:1", ("s0", "2"): "k:2"}

    def read(worker, epoch, seq, t):
        return {"worker": worker, "shard": "s0", "epoch": epoch, "seq": seq, "data": f"k:{seq}", "t": t}

    # Output files are read worker by worker: w0's lines come first whatever their times.
    # Record 2: w1 handed it on and was killed before its checkpoint; w0 read it again.
    killed_in_flight = [read("w0", 2, "2", 3.0), read("w1", 1, "1", 1.0), read("w1", 1, "2", 2.0)]
    figures = check(killed_in_flight, Sent, killed="w1")
    assert figures["duplicates"] == 1, figures
    assert figures["duplicates_after_clean_hand_over"] == 0, figures
    # The same, read first by a worker that was not killed: a clean hand-over's duplicate.
    clean = [read("w0", 1, "1", 1.0), read("w0", 1, "2", 2.0), read("w1", 2, "2", 3.0)]
    figures = check(clean, Sent, killed="w9")
    assert figures["duplicates_after_clean_hand_over"] == 1, figures
    print("the checker's self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-dir", required=True, help="holds the generated keyspread_api")
    parser.add_argument("--keyspread", required=True)
    parser.add_argument("--kinesis", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--mode", choices=["churn", "reshard"], required=True)
    parser.add_argument("--work", required=True, help="directory for the workers' output")
    args = parser.parse_args()
    args.keyspread = args.keyspread.rstrip("/")
    args.examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    kinesis = kinesis_client(args.kinesis)
    figures, workers = (churn if args.mode == "churn" else reshard)(args, kinesis, args.work)
    errors = workers.errors().strip()
    if errors:
        print(errors, file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
