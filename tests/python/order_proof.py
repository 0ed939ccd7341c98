#!/usr/bin/env python3
"""Proof on a real Kinesis (kinesalite) that staged moves keep every account in order.

Two producer processes write numbered records for 56 accounts (6 of them with 3 keys,
written under 3 sub-keys each) while a rebalance runs in the middle; 10 % of the entries of
every PutRecords call fail on purpose (dropped from the call and reported failed at their
position, as Kinesis does). The producers take turns: each account's numbers form one
sequence, written by one process at a time and handed over once all its records are in
(a fleet behind a load balancer, serialised per account). Their caches expire at different
moments: just before the rebalance the second process looks every key up again (so it
keeps the old keys for the whole `max-age`), and just after it the first does (so it knows
the move at once). That is the case a staged move exists for, made to happen every run
rather than by the luck of the caches' timing.

The order-aware consumer of examples/ reads every shard meanwhile and hands records on;
the checker counts, per (account, sub-key), numbers handed on out of order (inversions),
twice (duplicates) or never (lost).

Modes: `staged` (the order-safe producer, a move staged `--switch-after` seconds ahead:
0 inversions expected), `mirror` (the same, each producer reading its keys from a
`keyspread_client.Mirror` of clients/python, which learns of the move from the log: 0
inversions expected), `immediate` (the same producer, the move at once: producers with
cached lookups write to both shards), `naive` (a staged move, but a producer that puts
several records per key in one call and resends failures at the end of the batch).

Prints progress lines, then one JSON line with the figures.
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time

from order_check import check_order


def kinesis_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "kinesis",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=10),
    )


class FailingKinesis:
    """A Kinesis client whose PutRecords fails a share of the entries, as Kinesis may:
    the failed entries are not sent, and the answer reports them failed in place."""

    def __init__(self, kinesis, rate, rng):
        self.kinesis, self.rate, self.rng = kinesis, rate, rng
        self.failed = 0

    def put_records(self, StreamName, Records):
        fails = [self.rng.random() < self.rate for _ in Records]
        kept = [r for r, f in zip(Records, fails) if not f]
        answer = self.kinesis.put_records(StreamName=StreamName, Records=kept) if kept else {"Records": []}
        results = iter(answer["Records"])
        merged = []
        for failed in fails:
            if failed:
                self.failed += 1
                merged.append({"ErrorCode": "ProvisionedThroughputExceededException",
                               "ErrorMessage": "Rate exceeded for shard (failed on purpose)"})
            else:
                merged.append(next(results))
        return {"FailedRecordCount": sum(1 for m in merged if "ErrorCode" in m), "Records": merged}

    def __getattr__(self, name):
        return getattr(self.kinesis, name)


class NaiveProducer:
    """What seed 003 warns against: records buffered for half a second (as the KPL's
    RecordMaxBufferedTime does) and sent together, several per key in one call, failures
    resent after the rest."""

    LINGER = 0.5

    def __init__(self, kinesis, stream, lookups):
        self.kinesis, self.stream, self.lookups = kinesis, stream, lookups
        self.queue = []
        self.sent = self.resent = 0
        self.last_call = time.time()

    def put(self, account, data, sub_key=None):
        from order_safe_producer import sub_key_index

        fanout = len(self.lookups.assignment(account).hash_keys)
        index = sub_key_index(sub_key, fanout) if sub_key is not None and fanout > 1 else 0
        self.queue.append((account, index, data))

    def send_once(self, force=False):
        if not force and time.time() < self.last_call + self.LINGER and len(self.queue) < 500:
            return 0
        self.last_call = time.time()
        batch, self.queue = self.queue[:500], self.queue[500:]
        if not batch:
            return 0
        entries = [{"Data": d, "PartitionKey": a, "ExplicitHashKey": self.lookups.keys(a)[i]}
                   for a, i, d in batch]
        answer = self.kinesis.put_records(StreamName=self.stream, Records=entries)
        taken = 0
        for item, result in zip(batch, answer["Records"]):
            if "ErrorCode" in result:
                self.queue.append(item)
                self.resent += 1
            else:
                taken += 1
        self.sent += taken
        return taken

    def flush(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while self.queue and time.monotonic() < deadline:
            self.send_once(force=True)


# The rebalance's steps, in `refresh`: the main process asks (ASK_BEFORE), the second
# producer looks its keys up again (BEFORE_DONE), the main process applies the plan and
# says so (APPLIED), the first producer looks its keys up again (AFTER_DONE).
ASK_BEFORE, BEFORE_DONE, APPLIED, AFTER_DONE = 1, 2, 3, 4


def refresh_if_asked(p, refresh, lookups, streams):
    """Looks every key up again when it is producer `p`'s step of the rebalance."""
    mine, done = (ASK_BEFORE, BEFORE_DONE) if p == 1 else (APPLIED, AFTER_DONE)
    if refresh.value == mine:
        # A mirror has no cache to refresh: it follows the log.
        if hasattr(lookups, "cache"):
            lookups.cache.clear()
            for account, _ in streams:
                lookups.assignment(account)
        refresh.value = done


def keyspread_client(url, token_variable, timeout):
    """The generated client, with the token the environment names if the server has tokens:
    the producers hold a produce token, the consumer a read one, the harness an admin one."""
    from keyspread_api import AuthenticatedClient, Client

    token = os.environ.get(token_variable)
    if token:
        return AuthenticatedClient(base_url=url, token=token, timeout=timeout)
    return Client(base_url=url, timeout=timeout)


def producer(p, cfg, streams, turn, refresh, counters, stop_at, report):
    """One producer process: writes during its turns until `stop_at`."""
    sys.path.insert(0, cfg["client_dir"])
    sys.path.insert(0, cfg["examples"])
    from order_safe_producer import Lookups, OrderSafeProducer

    client = keyspread_client(cfg["keyspread"], "KEYSPREAD_PRODUCER_TOKEN", timeout=10)
    kinesis = FailingKinesis(kinesis_client(cfg["kinesis"]), cfg["fail_rate"], random.Random(cfg["seed"] + p))
    if cfg["mode"] == "naive":
        out = NaiveProducer(kinesis, cfg["stream"], Lookups(client))
    elif cfg["mode"] == "mirror":
        sys.path.insert(0, os.path.join(cfg["examples"], "..", "clients", "python"))
        from keyspread_client import Mirror

        out = OrderSafeProducer(kinesis, cfg["stream"],
                                mirror=Mirror(cfg["keyspread"],
                                              token=os.environ.get("KEYSPREAD_PRODUCER_TOKEN")))
    else:
        out = OrderSafeProducer(kinesis, cfg["stream"], client)
    lookups = out.lookups
    # Staggered caches: the second process looks its keys up later than the first.
    time.sleep(p * cfg["stagger"])
    for account, _ in streams:
        if hasattr(lookups, "assignment"):
            lookups.assignment(account)
    tick = 0.1
    while time.time() < stop_at:
        refresh_if_asked(p, refresh, lookups, streams)
        if turn.value != p:
            time.sleep(0.002)
            continue
        window_end = min(time.time() + cfg["window"], stop_at)
        while time.time() < window_end:
            refresh_if_asked(p, refresh, lookups, streams)
            started = time.time()
            for i, (account, sub_key) in enumerate(streams):
                record = {"a": account, "s": sub_key, "n": counters[i], "p": p}
                counters[i] += 1
                out.put(account, json.dumps(record).encode(), sub_key=sub_key)
            while time.time() < started + tick and out.send_once():
                pass
            time.sleep(max(0.0, started + tick - time.time()))
        out.flush()
        turn.value = 1 - p
    report.put({"producer": p, "sent": out.sent, "resent": out.resent, "failed": kinesis.failed})


def wait_for(refresh, step, timeout=15.0):
    deadline = time.monotonic() + timeout
    while refresh.value != step:
        assert time.monotonic() < deadline, f"no producer took step {step} of the rebalance"
        time.sleep(0.005)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-dir", required=True, help="holds the generated keyspread_api")
    parser.add_argument("--keyspread", required=True)
    parser.add_argument("--kinesis", required=True, help="kinesalite's endpoint")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--mode", choices=["staged", "mirror", "immediate", "naive"], required=True)
    parser.add_argument("--seconds", type=float, default=22)
    parser.add_argument("--rebalance-at", type=float, default=7)
    parser.add_argument("--switch-after", type=int, default=6)
    parser.add_argument("--fail-rate", type=float, default=0.1)
    parser.add_argument("--window", type=float, default=1.0, help="seconds a producer writes per turn")
    parser.add_argument("--stagger", type=float, default=2.5, help="seconds between the producers' first lookups")
    parser.add_argument("--skew-ms", type=int, default=2000)
    parser.add_argument("--every", type=float, default=1.5, help="seconds between consumer rounds")
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--blind-consumer", action="store_true",
                        help="the consumer ignores moves (hands every record on as read)")
    args = parser.parse_args()

    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    sys.path.insert(0, args.client_dir)
    sys.path.insert(0, examples)
    from keyspread_api.api.keys import allocate, release
    from keyspread_api.api.rebalance import apply, preview
    from keyspread_api.api.shards import shard_of
    from keyspread_api.models import AllocateRequest, ApplyRequest, RebalancePlan
    from order_aware_consumer import OrderAwareConsumer

    client = keyspread_client(args.keyspread, "KEYSPREAD_ADMIN_TOKEN", timeout=30)
    kinesis = kinesis_client(args.kinesis)
    kinesis.create_stream(StreamName=args.stream, ShardCount=3)
    while kinesis.describe_stream_summary(StreamName=args.stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        time.sleep(0.05)

    # Accounts placed before the stream is registered, those on its last shard released:
    # two shards of three hold them all, and the hot accounts' keys share shards, so the
    # rebalance has moves to make.
    singles = []
    for i in range(80):
        assert allocate.sync_detailed(f"acct-{i:02}", client=client).status_code == 201, i
    for i in range(80):
        account = f"acct-{i:02}"
        if shard_of.sync(client=client, account=account, shards=3).shard_index == 2:
            assert release.sync_detailed(account, client=client).status_code == 204
        else:
            singles.append(account)
    hot = [f"hot-{i}" for i in range(6)]
    for account in hot:
        answer = allocate.sync_detailed(account, client=client, body=AllocateRequest(fanout=3))
        assert answer.status_code == 201, answer.content
    put = client.get_httpx_client().put(
        f"/streams/{args.stream}", json={"shard_count": 3, "primary": True})
    assert put.status_code in (200, 201), put.text
    streams = [(a, None) for a in singles] + [(a, f"s{j}") for a in hot for j in range(3)]
    turn = mp.Value("i", 0)
    refresh = mp.Value("i", 0)
    counters = mp.Array("q", len(streams))
    report = mp.Queue()
    started = time.time()
    stop_at = started + args.seconds
    cfg = {"client_dir": args.client_dir, "examples": examples, "keyspread": args.keyspread,
           "kinesis": args.kinesis, "stream": args.stream, "mode": args.mode,
           "fail_rate": args.fail_rate, "seed": args.seed, "stagger": args.stagger,
           "window": args.window}
    procs = [mp.Process(target=producer, args=(p, cfg, streams, turn, refresh, counters, stop_at, report))
             for p in (0, 1)]
    for proc in procs:
        proc.start()

    handed = []
    if args.blind_consumer:
        OrderAwareConsumer.learn_moves = lambda self: None
    reader = keyspread_client(args.keyspread, "KEYSPREAD_READER_TOKEN", timeout=30)
    consumer = OrderAwareConsumer(kinesis, args.stream, reader, skew_ms=args.skew_ms,
                                  deliver=lambda shard, record: handed.append(record))
    applied = None
    while time.time() < stop_at + 1:
        consumer.poll()
        if applied is None and time.time() >= started + args.rebalance_at:
            plan = preview.sync(client=client, stream=args.stream)
            assert isinstance(plan, RebalancePlan), plan
            switch_after = 0 if args.mode == "immediate" else args.switch_after
            refresh.value = ASK_BEFORE
            wait_for(refresh, BEFORE_DONE)
            applied = apply.sync(client=client, body=ApplyRequest(plan_id=plan.plan_id, switch_after_s=switch_after))
            assert isinstance(applied, RebalancePlan), applied
            refresh.value = APPLIED
            wait_for(refresh, AFTER_DONE)
            print(f"t={time.time() - started:.1f}s applied {len(applied.moves)} moves, "
                  f"switch_at {applied.switch_at} ({switch_after} s on)", flush=True)
        time.sleep(args.every)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"a producer exited with {proc.exitcode}"
    reports = [report.get(timeout=5) for _ in procs]
    # Drain: every record in, nothing held back.
    quiet = 0
    for _ in range(40):
        before = len(handed)
        consumer.poll()
        quiet = quiet + 1 if len(handed) == before and not any(consumer.held.values()) else 0
        if quiet >= 2:
            break
        time.sleep(0.5)

    produced = {(s, n) for i, s in enumerate(streams) for n in range(counters[i])}
    order = check_order(handed, produced)
    moved_accounts = sorted({m.account for m in applied.moves}) if applied else []
    summary = {
        "mode": args.mode + (" (blind consumer)" if args.blind_consumer else ""),
        "records": len(produced),
        "handed_on": len(handed),
        "held_back": consumer.held_back,
        "moves": len(applied.moves) if applied else 0,
        "moved_accounts": len(moved_accounts),
        "inversions": order["inversions"],
        "duplicates": order["duplicates"],
        "lost": order["lost"],
        "failed_entries": sum(r["failed"] for r in reports),
        "resent": sum(r["resent"] for r in reports),
        "seconds": round(time.time() - started, 1),
        "examples": order["inversion_examples"],
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
