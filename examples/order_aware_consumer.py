#!/usr/bin/env python3
"""An order-aware Kinesis consumer: each account's records in order across keyspread's moves.

Kinesis orders records within a shard only. When a rebalance moves account X's key from
shard A to shard B, producers switch at the move's `switch_at` T (see
order_safe_producer.py), so X's records before T are on A and those after are on B. This
consumer reads every shard and hands X's records from B on only once A has been read past
arrival time T plus a clock-skew allowance: any record of X a producer with a slow clock
still sent to A comes out first.

A fanout the load controller raises is staged the same way: the account's new keys take
over at T, and sub-keys come to a new key from any of the keys the account sent before, so
X's records on the new key's shard wait until each of those shards is read past T (`GET
/moves` lists them as the move's `from_keys`).

It learns of moves from `GET /moves` (the moves not switched yet) every round, and keeps
each until its boundary is behind it; a move is announced `switch_after_s` before its
switch, so a consumer that polls more often than that knows of it before the first record
of X reaches B. A consumer that reads history (from TRIM_HORIZON, say) gives
`--after-event ID` to learn the moves of the event log (`GET /events`) from there on, the
switched ones too.

The account of a record is its PartitionKey (what order_safe_producer.py sends). A move is
kept by its keys, not its shards, so it holds through splits and merges: its old key's
records are read far enough once the open shard that holds that key now is (its parents
are read to their end before it), and a record waits when its shard's range holds the new
key. Reading the children of a split after their parents is left to the Kinesis Client
Library, keyspread's consumer leases, or the readers that hand batches to `take`, which
tell the consumer the stream's shards with `follow`; `poll` reads the shards listed at the
start.

Usage:

    order_aware_consumer.py --keyspread http://127.0.0.1:8080 --stream orders \\
        [--endpoint-url http://127.0.0.1:4567] [--skew-ms 1000] [--seconds 60]

prints one JSON line per record, in the order it hands them on.
"""

import argparse
import bisect
import collections
import json
import sys
import time

from keyspread_api import Client
from keyspread_api.api.observability import events as events_api
from keyspread_api.api.rebalance import moves as moves_api
from keyspread_api.models import EventKind, EventPage, MovesPage


class Shards:
    """A stream's shards, closed ones too: which open shard holds a key now, and whether a
    shard's range holds a key."""

    def __init__(self, listed):
        self.ranges = {s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]),
                                      int(s["HashKeyRange"]["EndingHashKey"])) for s in listed}
        self.parents = {s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
                        for s in listed}
        opened = [s for s in listed if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})]
        self.shards = sorted(opened, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
        self.starts = [int(s["HashKeyRange"]["StartingHashKey"]) for s in self.shards]

    def of(self, key):
        """The open shard that holds `key`."""
        return self.shards[bisect.bisect_right(self.starts, int(key)) - 1]["ShardId"]

    def holds(self, shard, key):
        """Whether `shard`'s hash key range holds `key` (false for a shard not listed)."""
        low, high = self.ranges.get(shard, (1, 0))
        return low <= int(key) <= high

    def ancestors(self, shard):
        """The shards `shard` descends from by splits and merges (read to their end before it)."""
        found, todo = set(), list(self.parents.get(shard, ()))
        while todo:
            parent = todo.pop()
            if parent not in found:
                found.add(parent)
                todo += self.parents.get(parent, ())
        return found

    def ids(self):
        """The open shards, in hash key order."""
        return [s["ShardId"] for s in self.shards]


class Move:
    """Account `account`'s records go under `to_key` instead of `from_key` from `switch_at` on."""

    def __init__(self, event_id, account, from_key, to_key, applied_at, switch_at):
        self.event_id, self.account, self.from_key, self.to_key = event_id, account, from_key, to_key
        self.applied_at, self.switch_at = applied_at, switch_at


class OrderAwareConsumer:
    def __init__(self, kinesis, stream, client, skew_ms=1000, deliver=None, after_event=None,
                 clock=time.time, read=True):
        self.kinesis = kinesis
        self.stream = stream
        self.client = client
        self.skew = skew_ms / 1000
        self.deliver = deliver or (lambda shard, record: print(json.dumps(record), flush=True))
        self.clock = clock
        self.after_event = after_event
        listed = kinesis.list_shards(StreamName=stream)["Shards"]
        self.shards = Shards(listed)
        # With `read` off, others read the shards and hand each batch to `take`.
        self.iterators = {
            shard["ShardId"]: kinesis.get_shard_iterator(
                StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            for shard in (listed if read else ())
        }
        # How far each shard has been read: the newest arrival time handed on or held, and
        # when it was last read to its tip (Unix seconds).
        self.read_to = collections.defaultdict(float)
        self.tip_at = collections.defaultdict(float)
        # account -> moves whose boundary is not behind us yet
        self.moves = collections.defaultdict(list)
        # (account, shard) -> records held back, in arrival order
        self.held = collections.defaultdict(list)
        self.delivered = 0
        self.held_back = 0
        self.rounds = 0

    def learn_moves(self):
        """Learns the moves not switched yet (or, with `after_event`, every move the event
        log holds after it, read on from the last look)."""
        if self.after_event is not None:
            self.learn_logged_moves()
            return
        after = 0
        while True:
            page = moves_api.sync(client=self.client, after=after, limit=1000)
            if not isinstance(page, MovesPage):
                raise RuntimeError(f"GET /moves failed: {page}")
            for m in page.items:
                # A new key of a fanout raised by load takes sub-keys from every key the
                # account sends until the switch: wait for each of their shards.
                for from_key in m.from_keys or [m.from_]:
                    self.remember(m.event_id, m.account, from_key, m.to, m.applied_at, m.switch_at)
            if not page.next_:
                return
            after = page.next_

    def learn_logged_moves(self):
        while True:
            page = events_api.sync(client=self.client, after=self.after_event, limit=1000)
            if not isinstance(page, EventPage):
                raise RuntimeError(f"GET /events failed: {page}")
            for e in page.events:
                if e.kind == EventKind.MOVE and e.switch_at:
                    self.remember(e.id, e.account, e.key_before, e.key_after, e.at, e.switch_at)
                elif e.kind == EventKind.ALLOCATE and e.switch_at:
                    # A new key of a fanout raised by load: the log does not say which keys
                    # its sub-keys come from, so every other shard is read to the switch.
                    for start in self.shards.starts:
                        self.remember(e.id, e.account, start, e.key_after, e.at, e.switch_at)
            self.after_event = page.next_
            if len(page.events) < 1000:
                return

    def remember(self, event_id, account, from_key, to_key, applied_at, switch_at):
        if any(m.event_id == event_id and m.from_key == from_key for m in self.moves.get(account, ())):
            return
        self.moves[account].append(Move(
            event_id, account, from_key, to_key, applied_at.timestamp(), switch_at.timestamp(),
        ))

    def follow(self, listed):
        """Takes the stream's shards as ListShards now answers them (after a split or merge)."""
        self.shards = Shards(listed)

    def read_past(self, shard, moment):
        """Whether every record `shard` got up to arrival time `moment` has been read."""
        return self.read_to[shard] > moment or self.tip_at[shard] > moment + self.skew

    def blocking(self, account, shard, arrival):
        """The moves of `account` into `shard` whose old key's shard is not read far enough."""
        return [
            m for m in self.moves.get(account, ())
            if self.shards.holds(shard, m.to_key) and not self.shards.holds(shard, m.from_key)
            and arrival >= m.applied_at - self.skew
            and not self.read_past(self.shards.of(m.from_key), m.switch_at + self.skew)
        ]

    def poll(self):
        """One round: learn moves, read every shard once, hand on what may go."""
        self.learn_moves()
        # Each round starts at the next shard, so that none is always read first: like
        # workers reading shards side by side, at their own pace.
        ids = list(self.iterators)
        self.rounds += 1
        start = self.rounds % len(ids)
        for shard in ids[start:] + ids[:start]:
            iterator = self.iterators.get(shard)
            if iterator is None:
                continue
            started = self.clock()
            answer = self.kinesis.get_records(ShardIterator=iterator, Limit=10000)
            self.iterators[shard] = answer.get("NextShardIterator")
            self.take(shard, answer, started)

    def take(self, shard, answer, started, **extra):
        """Hands on (or holds back) the records of one GetRecords `answer` from `shard`,
        asked for at `started`; `extra` fields are added to each record handed on."""
        records = answer["Records"]
        for r in records:
            arrival = r["ApproximateArrivalTimestamp"].timestamp()
            self.read_to[shard] = max(self.read_to[shard], arrival)
            account = r["PartitionKey"]
            record = {"shard": shard, "account": account, "arrival": arrival,
                      "sequence": r["SequenceNumber"], "data": r["Data"].decode(), **extra}
            if self.behind(account, shard) or self.blocking(account, shard, arrival):
                self.held[(account, shard)].append(record)
                self.held_back += 1
            else:
                self.hand_on(record)
        if not records and answer.get("MillisBehindLatest", 0) == 0:
            self.tip_at[shard] = started
        self.release()

    def behind(self, account, shard):
        """Whether records of `account` are held on `shard` or on a shard it descends from: a
        record held for a move of one of the account's keys holds the account's later ones
        on that shard and on its children, whichever key they went under."""
        return bool(self.held.get((account, shard))) or any(
            self.held.get((account, parent)) for parent in self.shards.ancestors(shard))

    def release(self):
        """Hands on held records whose moves' old shards are read far enough, a shard's after
        those held on the shards it descends from (held first, so handed on first here)."""
        for (account, shard), records in list(self.held.items()):
            waiting = any(self.held.get((account, parent)) for parent in self.shards.ancestors(shard))
            if records and not waiting and not self.blocking(account, shard, records[0]["arrival"]):
                for record in records:
                    self.hand_on(record)
                del self.held[(account, shard)]
        # Moves whose boundary is behind us need no more looking at.
        for account, moves in list(self.moves.items()):
            moves[:] = [m for m in moves
                        if not self.read_past(self.shards.of(m.from_key), m.switch_at + self.skew)]
            if not moves:
                del self.moves[account]

    def hand_on(self, record):
        self.delivered += 1
        self.deliver(record["shard"], record)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keyspread", required=True, help="e.g. http://127.0.0.1:8080")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--endpoint-url", help="a Kinesis endpoint other than AWS's (kinesalite)")
    parser.add_argument("--skew-ms", type=int, default=1000,
                        help="how far producers' clocks may be off keyspread's (default 1000)")
    parser.add_argument("--seconds", type=float, default=60, help="how long to read")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between rounds")
    parser.add_argument("--after-event", type=int,
                        help="learn moves from the event log after this id (when reading history)")
    args = parser.parse_args()

    import boto3  # credentials and region as boto3 reads them (AWS_DEFAULT_REGION, ...)

    kinesis = boto3.client("kinesis", endpoint_url=args.endpoint_url)
    consumer = OrderAwareConsumer(kinesis, args.stream, Client(base_url=args.keyspread),
                                  skew_ms=args.skew_ms, after_event=args.after_event)
    until = time.monotonic() + args.seconds
    while time.monotonic() < until:
        consumer.poll()
        time.sleep(args.every)
    print(f"handed on {consumer.delivered} records, {consumer.held_back} of them held back "
          f"behind a move", file=sys.stderr)


if __name__ == "__main__":
    main()
