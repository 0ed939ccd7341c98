#!/usr/bin/env python3
"""A load generator: accounts with Zipf-distributed record rates, through the order-safe producer.

Real load is Zipf-shaped and moves: this week's hot customer is next week's quiet one. This
writes `--accounts` accounts (`acct-000`, `acct-001`, ...) to a stream for `--seconds`, the
account of rank r (1 = hottest) at `--rate` x r^-s / H records a second (s = `--zipf`, H the
sum of r^-s over the ranks), paced by the clock rather than drawn at random, so each
account's share of a window is its share of the rate. The ranks are a seeded permutation
of the accounts; at `--rotate-at` seconds (default: the midpoint) they become a different
one, so the hot accounts change.

Each record carries a sub-key (an order id, say) from a pool of 12 per account, used in
turn and chosen so that an account with 2, 3 or 4 keys spreads its records evenly over
them: examples/order_safe_producer.py picks the account's key by it, as it does for any
producer, so an account may fan out to 4 keys. A record's data is
`{"a": account, "s": sub_key, "n": number}`, numbered from 0 per (account, sub-key): what a
consumer needs to check order, loss and duplicates.

`--mirror` takes the keys from a mirror of keyspread's table (clients/python) instead of
lookups, and the mirror reports what was sent to keyspread every `--report-interval-s`
(`POST /load/producers`): load reaches keyspread from the producer, with no consumer
reporting it.

`--md5` sends no ExplicitHashKey at all (Kinesis places each record by the MD5 of its
PartitionKey, the account): the scheme keyspread is measured against. Otherwise the
accounts must be allocated first (`POST /keys/{account}` or `/keys/batch`).

Usage:

    load_generator.py --keyspread http://127.0.0.1:8080 --stream orders \\
        [--endpoint-url http://127.0.0.1:4567] [--seconds 180] [--accounts 300] [--zipf 1.1] \\
        [--rate 160] [--rotate-at 90] [--seed 1] [--md5 | --mirror [--report-interval-s 10]]

prints `started` as it starts writing, and one JSON line when done: when it started and
rotated (Unix seconds), the ranks before and after, how many records it numbered per
account and sub-key, and the producer's figures (records sent, resent after a failure, the
most ever queued).
"""

import argparse
import collections
import json
import random
import sys
import time
import types

from order_safe_producer import OrderSafeProducer
from sub_key import sub_key_index

# Sub-keys per account, and the fanouts over which they spread evenly (12 = lcm(2, 3, 4)).
SUB_KEYS = 12
FANOUTS = (2, 3, 4)
# Seconds between rounds of the generator: records due are queued, then sent.
TICK = 0.05


def account_names(count):
    return [f"acct-{i:03}" for i in range(count)]


def zipf_rates(ranked, total, exponent):
    """Records a second for each account of `ranked` (hottest first), summing to `total`."""
    weights = [(r + 1) ** -exponent for r in range(len(ranked))]
    norm = sum(weights)
    return {account: total * w / norm for account, w in zip(ranked, weights)}


def rotations(accounts, seed):
    """Two different permutations of `accounts` (hottest first): before and after the rotation."""
    rng = random.Random(seed)
    first = accounts[:]
    rng.shuffle(first)
    second = first[:]
    while second[0] in first[:8]:  # a new hottest account, not one that was hot
        rng.shuffle(second)
    return first, second


# How many of the sub-keys have each index for 2, 3 and 4 keys: 6 each for 2, 4 each for 3
# and 3 each for 4. Jump hashing is consistent (growing the fanout only moves a sub-key to
# the new index), so these are the index triples there are, in counts that make it so.
QUOTAS = {(0, 0, 0): 3, (1, 1, 1): 3, (0, 2, 2): 2, (1, 2, 2): 1, (0, 0, 3): 1, (1, 1, 3): 1, (1, 2, 3): 1}


def balanced_sub_keys():
    """`SUB_KEYS` sub-keys (`o0`, `o2`, ...) that split evenly over 2, 3 and 4 keys."""
    left = dict(QUOTAS)
    chosen = []
    n = 0
    while len(chosen) < SUB_KEYS:
        candidate = f"o{n}"
        n += 1
        at = tuple(sub_key_index(candidate, k) for k in FANOUTS)
        if left.get(at, 0) > 0:
            left[at] -= 1
            chosen.append(candidate)
    return chosen


class PartitionKeyOnly:
    """Lookups for a producer that sends no ExplicitHashKey: one key per account, none named."""

    NONE = types.SimpleNamespace(hash_keys=[None])

    def assignment(self, account):
        return self.NONE

    def keys(self, account, guard=0.0):
        return [None]


class WithoutExplicitKeys:
    """A Kinesis client that leaves out an ExplicitHashKey of None: Kinesis hashes the
    PartitionKey instead."""

    def __init__(self, kinesis):
        self.kinesis = kinesis

    def put_records(self, StreamName, Records):
        records = [{k: v for k, v in r.items() if not (k == "ExplicitHashKey" and v is None)} for r in Records]
        return self.kinesis.put_records(StreamName=StreamName, Records=records)

    def __getattr__(self, name):
        return getattr(self.kinesis, name)


class LoadGenerator:
    """Queues each account's records as they fall due and sends them with `producer`."""

    def __init__(self, producer, accounts, rate, exponent, seed):
        self.producer = producer
        self.before, self.after = rotations(accounts, seed)
        self.rates = [zipf_rates(self.before, rate, exponent), zipf_rates(self.after, rate, exponent)]
        self.sub_keys = balanced_sub_keys()
        self.due = dict.fromkeys(accounts, 0.0)
        self.made = collections.Counter()  # account -> records numbered
        self.numbers = collections.Counter()  # (account, sub_key) -> records numbered
        self.most_queued = 0

    def queue(self, rates, dt):
        for account, rate in rates.items():
            self.due[account] += rate * dt
            while self.due[account] >= 1:
                self.due[account] -= 1
                sub_key = self.sub_keys[self.made[account] % SUB_KEYS]
                self.made[account] += 1
                n = self.numbers[(account, sub_key)]
                self.numbers[(account, sub_key)] += 1
                data = json.dumps({"a": account, "s": sub_key, "n": n}).encode()
                self.producer.put(account, data, sub_key=sub_key)
        self.most_queued = max(self.most_queued, self.producer.pending())

    def run(self, seconds, rotate_at):
        started = time.time()
        last = started
        rotated_at = None
        while (now := time.time()) < started + seconds:
            phase = 0 if now < started + rotate_at else 1
            if phase and rotated_at is None:
                rotated_at = now
            self.queue(self.rates[phase], now - last)
            last = now
            # Send until the queues are empty or the next round is due.
            while self.producer.send_once() and time.time() < now + TICK:
                pass
            time.sleep(max(0.0, now + TICK - time.time()))
        self.producer.flush(timeout=60)
        return {
            "started": started,
            "rotated_at": rotated_at,
            "ranks_before": self.before,
            "ranks_after": self.after,
            "records": sum(self.made.values()),
            "numbered": [[a, s, n] for (a, s), n in sorted(self.numbers.items())],
            "sent": self.producer.sent,
            "resent": self.producer.resent,
            "most_queued": self.most_queued,
        }


def kinesis_client(endpoint_url):
    import boto3
    from botocore.config import Config

    return boto3.client("kinesis", endpoint_url=endpoint_url,
                        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=10))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keyspread", help="e.g. http://127.0.0.1:8080 (not with --md5)")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--endpoint-url", help="a Kinesis endpoint other than AWS's (kinesalite)")
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--accounts", type=int, default=300)
    parser.add_argument("--zipf", type=float, default=1.1, help="the exponent s (default 1.1)")
    parser.add_argument("--rate", type=float, default=160, help="records a second, all accounts (default 160)")
    parser.add_argument("--rotate-at", type=float, help="seconds in (default: the midpoint)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--md5", action="store_true", help="no ExplicitHashKey: MD5 of the account name")
    parser.add_argument("--mirror", action="store_true",
                        help="keys from a mirror of keyspread's table, which reports what was sent")
    parser.add_argument("--report-interval-s", type=float, default=10,
                        help="with --mirror: seconds between its load reports (default 10)")
    args = parser.parse_args()
    if not args.md5 and not args.keyspread:
        parser.error("--keyspread is needed unless --md5")

    kinesis = kinesis_client(args.endpoint_url)
    mirror = None
    if args.md5:
        producer = OrderSafeProducer(WithoutExplicitKeys(kinesis), args.stream, None)
        producer.lookups = PartitionKeyOnly()
    elif args.mirror:
        from keyspread_client import Mirror

        mirror = Mirror(args.keyspread, report_interval_s=args.report_interval_s)
        producer = OrderSafeProducer(kinesis, args.stream, mirror=mirror)
    else:
        from keyspread_api import Client

        producer = OrderSafeProducer(kinesis, args.stream, Client(base_url=args.keyspread, timeout=10))
    generator = LoadGenerator(producer, account_names(args.accounts), args.rate, args.zipf, args.seed)
    rotate_at = args.seconds / 2 if args.rotate_at is None else args.rotate_at
    print("started", flush=True)
    try:
        figures = generator.run(args.seconds, rotate_at)
    except LookupError as e:
        sys.exit(f"{e}\n(allocate the accounts first: POST /keys/batch)")
    finally:
        if mirror is not None:
            mirror.close()  # reports what was sent since its last report
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
