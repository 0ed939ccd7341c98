#!/usr/bin/env python3
"""An order-safe Kinesis producer: keyspread's keys, switched on time, PutRecords in order.

Three rules keep each account's records (each sub-key's, for an account with several
keys) in order on the stream, through rebalances and partial failures:

1. Send each record with the key whose time has come: a lookup's `hash_keys` until its
   `next.switch_at`, then `next.hash_keys` (by this machine's clock). Lookups are cached
   by ETag for their `max-age`; keyspread cuts that short before a switch. In the last
   half second before a switch the account's records wait for it, so that none sent with
   the old key arrives late on the old shard.
2. Put at most one record per account key in each PutRecords call: Kinesis
   orders a call's records only within a shard and may fail any of them.
3. Resend a failed record before that key's next one: it stays at the head of its queue.

Usage as a library (boto3 + the generated client, see examples/python_client.md):

    producer = OrderSafeProducer(boto3.client("kinesis"), "orders",
                                 Client(base_url="http://127.0.0.1:8080"))
    producer.put("acme", b"...")                       # or sub_key="order-17"
    producer.flush()                                   # until every record is in

With a mirror (clients/python: the whole table in this process, following keyspread's log;
no lookup round trips, and sending goes on while keyspread is away, until the mirror is
stale), the same rules with the mirror's keys; each record's key comes from the mirror's
`key_for`, and each record Kinesis took is counted with the mirror's `sent` for its load
reports (`POST /load/producers`), once however often it was resent, so keyspread
balances by what the stream carries. A record without a sub-key goes under its account's
name as sub-key (one key of the account, as `key_for` picks it):

    producer = OrderSafeProducer(kinesis, "orders", mirror=Mirror("http://127.0.0.1:8080"))

Usage from the command line (one record per line of stdin, `ACCOUNT<TAB>DATA`):

    order_safe_producer.py --keyspread http://127.0.0.1:8080 --stream orders [--mirror] < records.tsv

On a server with tokens, give it a token with the `produce` role, the least it needs (it
reads keys; `produce` may also allocate): `KEYSPREAD_TOKEN=... order_safe_producer.py ...`.
"""

import argparse
import collections
import os
import re
import sys
import time

from keyspread_api import AuthenticatedClient, Client
from keyspread_api.api.keys import lookup
from keyspread_api.models import Assignment
from sub_key import sub_key_index  # examples/sub_key.py: DESIGN.md's jump hash of the MD5

# Kinesis takes at most 500 records in one PutRecords call.
MAX_RECORDS_PER_CALL = 500

# Seconds before a switch during which an account's records wait for it: a record sent
# with the old key must reach the old shard before consumers stop reading it for the
# account (its switch_at plus their skew allowance).
SWITCH_GUARD = 0.5


def unix_seconds(stamp):
    """A `switch_at` as the generated client parses it (a datetime), in Unix seconds."""
    return stamp.timestamp()


class Lookups:
    """Each account's lookup, cached by its ETag for its `max-age`."""

    def __init__(self, client, clock=time.time):
        self.client = client
        self.clock = clock
        # account -> (assignment, etag, fresh until)
        self.cache = {}

    def assignment(self, account):
        now = self.clock()
        cached = self.cache.get(account)
        if cached and now < cached[2]:
            return cached[0]
        tag = cached[1] if cached else None
        kwargs = {"if_none_match": tag} if tag else {}
        response = lookup.sync_detailed(account, client=self.client, **kwargs)
        max_age = _max_age(response.headers.get("cache-control", ""))
        if response.status_code == 304 and cached:
            assignment = cached[0]
        elif response.status_code == 200 and isinstance(response.parsed, Assignment):
            assignment = response.parsed
        else:
            raise LookupError(f"lookup {account}: HTTP {response.status_code} {response.content!r}")
        self.cache[account] = (assignment, response.headers.get("etag"), now + max_age)
        return assignment

    def keys(self, account, guard=0.0):
        """The keys to send `account`'s records with now: `next` once its time has come;
        `None` within `guard` seconds before a switch (wait for it)."""
        a = self.assignment(account)
        nxt = a.next_ if a.next_ else None
        if nxt:
            left = unix_seconds(nxt.switch_at) - self.clock()
            if left <= 0:
                return list(nxt.hash_keys)
            if left < guard:
                return None
        return list(a.hash_keys)


class MirrorLookups:
    """Each account's keys from a `keyspread_client.Mirror`: in memory, no request."""

    def __init__(self, mirror, clock=time.time):
        self.mirror = mirror
        self.clock = clock

    def keys(self, account, guard=0.0):
        """The keys to send `account`'s records with now; `None` within `guard` seconds
        before a switch, and while the mirror is stale (it may have missed a switch)."""
        from keyspread_client import Stale

        try:
            found = self.mirror.lookup(account)
        except Stale:
            return None
        if found is None:
            raise LookupError(f"lookup {account}: keyspread holds no such account")
        if found.next and found.next.switch_at - self.clock() < guard:
            return None
        return found.keys


def _max_age(cache_control):
    found = re.search(r"max-age=(\d+)", cache_control)
    return int(found.group(1)) if found else 0


class OrderSafeProducer:
    """Queues records per account key and sends them by the three rules above."""

    def __init__(self, kinesis, stream, client=None, clock=time.time, mirror=None):
        self.kinesis = kinesis
        self.stream = stream
        self.lookups = MirrorLookups(mirror, clock) if mirror else Lookups(client, clock)
        self.mirror = mirror
        # (account, index) -> records waiting, oldest first; the head goes next.
        self.queues = collections.OrderedDict()
        self.sent = 0
        self.resent = 0

    def put(self, account, data, sub_key=None):
        """Queues `data` for `account` (under `sub_key`'s key, if the account has several)."""
        if sub_key is None and self.mirror is not None:
            sub_key = account  # the mirror counts records by sub-key (`record`)
        self.queues.setdefault((account, sub_key), collections.deque()).append(data)

    def pending(self):
        return sum(len(q) for q in self.queues.values())

    def send_once(self):
        """One PutRecords call carrying the head record of up to 500 account keys.

        A record's key is chosen when it is sent, by its sub-key and the keys in force then
        (a fanout that grows at a switch moves sub-keys at that instant, like a move).
        Answers how many of them Kinesis took; the failed ones stay at their queues' heads.
        """
        heads, entries, used = [], [], set()
        for (account, sub_key), queue in self.queues.items():
            if not queue:
                continue
            keys = self.lookups.keys(account, guard=SWITCH_GUARD)
            if keys is None:
                continue
            index = sub_key_index(sub_key, len(keys)) if sub_key is not None and len(keys) > 1 else 0
            if (account, index) in used:
                continue  # one record per account key in a call
            key = keys[index]
            if self.mirror is not None:
                key = self.mirror_key(account, sub_key)
                if key is None:
                    continue  # the mirror went stale: the record waits
            used.add((account, index))
            heads.append((account, sub_key, key))
            entries.append({
                "Data": queue[0],
                "PartitionKey": account[:256],
                "ExplicitHashKey": key,
            })
            if len(heads) == MAX_RECORDS_PER_CALL:
                break
        if not heads:
            return 0
        answer = self.kinesis.put_records(StreamName=self.stream, Records=entries)
        taken = 0
        for (account, sub_key, key), result in zip(heads, answer["Records"]):
            if "ErrorCode" in result:
                self.resent += 1
                continue
            data = self.queues[(account, sub_key)].popleft()
            if self.mirror is not None:
                self.mirror.sent(account, key, len(data))
            taken += 1
        self.sent += taken
        # Keys with nothing left to send leave the rotation.
        for key in [k for k, q in self.queues.items() if not q]:
            del self.queues[key]
        return taken

    def mirror_key(self, account, sub_key):
        """The mirror's key for `sub_key` of `account` (the key `lookups` gave, unless the
        mirror went stale meanwhile: `None`)."""
        from keyspread_client import Stale

        try:
            return self.mirror.key_for(account, sub_key)
        except Stale:
            return None

    def flush(self, timeout=30.0):
        """Sends until every queued record is in, or raises after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.queues:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.pending()} records still queued after {timeout} s")
            if self.send_once() == 0:
                time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keyspread", required=True, help="e.g. http://127.0.0.1:8080")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--endpoint-url", help="a Kinesis endpoint other than AWS's (kinesalite)")
    parser.add_argument("--mirror", action="store_true",
                        help="keys from a mirror of keyspread's table (pip install ./clients/python)")
    parser.add_argument("--token", default=os.environ.get("KEYSPREAD_TOKEN"),
                        help="a token with the produce role, if the server has tokens "
                             "(default $KEYSPREAD_TOKEN; the environment keeps it out of `ps`)")
    args = parser.parse_args()

    import boto3  # credentials and region as boto3 reads them (AWS_DEFAULT_REGION, ...)

    kinesis = boto3.client("kinesis", endpoint_url=args.endpoint_url)
    if args.mirror:
        from keyspread_client import Mirror

        producer = OrderSafeProducer(kinesis, args.stream,
                                     mirror=Mirror(args.keyspread, token=args.token))
    else:
        client = (AuthenticatedClient(base_url=args.keyspread, token=args.token) if args.token
                  else Client(base_url=args.keyspread))
        producer = OrderSafeProducer(kinesis, args.stream, client)
    try:
        for line in sys.stdin:
            account, _, data = line.rstrip("\n").partition("\t")
            producer.put(account, data.encode())
            producer.send_once()
        producer.flush()
    except LookupError as e:
        sys.exit(f"{e}\n(allocate the account first: POST /keys/{{account}})")
    print(f"sent {producer.sent} records, {producer.resent} resent after a failure")


if __name__ == "__main__":
    main()
