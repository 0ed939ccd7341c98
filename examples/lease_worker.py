#!/usr/bin/env python3
"""A Kinesis consumer worker that reads the shards keyspread leases to it.

keyspread assigns a stream's shards to its workers by weight (the keys on each shard),
moves as few leases as it can when workers come and go, and hands a lease over only once
its old owner has let go. This worker keeps to its side of that:

- it heartbeats (`PUT /streams/{stream}/workers/{worker}`) every third of its ttl;
- it reads each shard answered `held`, after the lease's checkpoint (TRIM_HORIZON when
  there is none), and checkpoints the last record of every batch it has handed on, with
  the lease's epoch;
- a shard answered `revoking` it stops reading at once (its last batch is already
  checkpointed): the next heartbeat hands the lease over;
- a checkpoint answered 409 means the lease has passed: it stops reading that shard;
- a closed shard read to its end (no NextShardIterator) is checkpointed `SHARD_END`, so
  that its children may be leased;
- while no heartbeat has been answered for ttl (counted from the send time of the last
  answered one), it reads nothing;
- on SIGTERM or SIGINT it stops and leaves (`DELETE`), so its leases move at once;
- with `--report-load`, each heartbeat reports what it read from each shard it holds since
  the last one (records, bytes, the window, and its top accounts by records, the account
  being the record's PartitionKey): keyspread smooths these into the load it balances
  producers' keys and consumers' leases by.

One thread does it all, a heartbeat between batches, so nothing is handed on after an
answer that took the shard away. The generated client (`keyspread_api`, see
python_client.md) talks to keyspread; boto3 to Kinesis. A program that keeps accounts in
order across keyspread's moves hands each batch to the order-aware consumer's logic
(`consumer=`, see order_aware_consumer.py) instead of printing it.

Usage:

    lease_worker.py --keyspread http://127.0.0.1:8080 --stream orders --worker host-a:1 \\
        [--ttl 30] [--endpoint-url http://127.0.0.1:4567] [--token T] [--report-load]

prints one JSON line per record it hands on (worker, shard, epoch, sequence number,
partition key, data, time), and one per lease event (`"event": "held"`, `"revoking"`,
`"lost"`, `"shard_end"`).
"""

import argparse
import collections
import json
import os
import signal
import sys
import time
import urllib.parse

from keyspread_api import AuthenticatedClient, Client
from keyspread_api.api.leases import checkpoint as checkpoint_api
from keyspread_api.api.leases import leave as leave_api
from keyspread_api.models import CheckpointRequest, OwnLeaseState, WorkerBody

# Records per GetRecords call: a batch is what a revocation may leave unprocessed.
BATCH = 100

# At most this many accounts per shard in a load report, over at most this long
# (keyspread's limits).
TOP_ACCOUNTS = 1000
MAX_WINDOW_S = 3600


class Tally:
    """What was read from one shard since the last answered report, from `since` on."""

    def __init__(self, since):
        self.since = since
        self.records = self.bytes = 0
        self.accounts = collections.defaultdict(lambda: [0, 0])  # account -> [records, bytes]

    def add(self, record):
        size = len(record["Data"]) + len(record["PartitionKey"].encode())
        self.records += 1
        self.bytes += size
        counts = self.accounts[record["PartitionKey"]]
        counts[0] += 1
        counts[1] += size

    def report(self, lease, now):
        """The heartbeat's `load` entry for this shard, the window ending at `now`."""
        top = sorted(self.accounts.items(), key=lambda item: -item[1][0])[:TOP_ACCOUNTS]
        return {"shard_id": lease.shard_id, "epoch": lease.epoch,
                "window_ms": max(1, round((now - self.since) * 1000)),
                "records": self.records, "bytes": self.bytes,
                "accounts": [{"account": a, "records": r, "bytes": b} for a, (r, b) in top]}


class Lease:
    def __init__(self, shard_id, epoch, checkpoint):
        self.shard_id, self.epoch, self.checkpoint = shard_id, epoch, checkpoint
        self.iterator = None


class LeaseWorker:
    def __init__(self, kinesis, client, stream, worker, ttl_s=30, emit=None, clock=time.monotonic,
                 report_load=False, consumer=None, pause_s=0.05):
        self.kinesis, self.client = kinesis, client
        self.stream, self.worker, self.ttl = stream, worker, ttl_s
        self.emit = emit or (lambda line: print(json.dumps(line), flush=True))
        self.clock = clock
        self.report_load, self.consumer, self.pause = report_load, consumer, pause_s
        self.leases = {}  # shard id -> Lease, the ones held
        self.tallies = {}  # shard id -> Tally, for the held ones
        self.valid_until = 0.0
        self.next_beat = 0.0
        self.stopping = False

    def heartbeat(self):
        sent = self.clock()
        self.next_beat = sent + self.ttl / 3
        body = {"ttl_s": self.ttl}
        if self.report_load:
            # After an hour of failed heartbeats the counts are too old to report: start over.
            body["load"] = [self.tallies[s].report(lease, sent) for s, lease in self.leases.items()
                            if sent - self.tallies[s].since <= MAX_WINDOW_S]
            for shard_id, tally in self.tallies.items():
                if sent - tally.since > MAX_WINDOW_S:
                    self.tallies[shard_id] = Tally(sent)
        path = "/streams/{}/workers/{}".format(*(urllib.parse.quote(p, safe="") for p in (self.stream, self.worker)))
        try:
            response = self.client.get_httpx_client().put(path, json=body)
        except Exception as err:  # the network: keep reading only while the leases last
            print(f"heartbeat failed: {err}", file=sys.stderr, flush=True)
            return
        if response.status_code != 200:
            if response.status_code == 404:
                sys.exit(f"keyspread: {response.text}\nregister the stream first: PUT /streams/{self.stream}")
            print(f"heartbeat answered {response.status_code}: {response.text}", file=sys.stderr, flush=True)
            return
        answer = response.json()
        if answer.get("ignored_load"):
            print(f"load not counted: {json.dumps(answer['ignored_load'])}", file=sys.stderr, flush=True)
        # Reported (counted or not): the next window starts at this heartbeat.
        for entry in body.get("load", ()):
            self.tallies[entry["shard_id"]] = Tally(sent)
        self.valid_until = sent + self.ttl
        answered = {lease.shard_id: lease for lease in WorkerBody.from_dict(answer).leases}
        for shard_id in list(self.leases):
            lease = answered.get(shard_id)
            if lease is None or lease.state != OwnLeaseState.HELD or lease.epoch != self.leases[shard_id].epoch:
                event = "revoking" if lease is not None and lease.state == OwnLeaseState.REVOKING else "lost"
                self.drop(shard_id, event)
        for shard_id, lease in answered.items():
            if lease.state == OwnLeaseState.HELD and shard_id not in self.leases:
                self.leases[shard_id] = Lease(shard_id, lease.epoch, lease.checkpoint)
                self.tallies[shard_id] = Tally(self.clock())
                self.emit({"event": "held", "worker": self.worker, "shard": shard_id,
                           "epoch": lease.epoch, "checkpoint": lease.checkpoint, "t": time.time()})

    def drop(self, shard_id, event):
        lease = self.leases.pop(shard_id)
        self.tallies.pop(shard_id, None)
        self.emit({"event": event, "worker": self.worker, "shard": shard_id, "epoch": lease.epoch,
                   "t": time.time()})

    def save(self, lease, sequence_number):
        """Checkpoints; False when the lease has passed (409)."""
        response = checkpoint_api.sync_detailed(
            self.stream, lease.shard_id, client=self.client,
            body=CheckpointRequest(worker=self.worker, epoch=lease.epoch, sequence_number=sequence_number),
        )
        if response.status_code == 200:
            lease.checkpoint = sequence_number
            return True
        if response.status_code == 409:
            self.drop(lease.shard_id, "lost")
            return False
        raise RuntimeError(f"checkpoint answered {int(response.status_code)}: {response.content!r}")

    def read(self, lease):
        """One batch of `lease`'s shard: hands the records on, then checkpoints them."""
        if lease.iterator is None:
            where = ({"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": lease.checkpoint}
                     if lease.checkpoint else {"ShardIteratorType": "TRIM_HORIZON"})
            lease.iterator = self.kinesis.get_shard_iterator(
                StreamName=self.stream, ShardId=lease.shard_id, **where)["ShardIterator"]
        asked = time.time()
        answer = self.kinesis.get_records(ShardIterator=lease.iterator, Limit=BATCH)
        if self.clock() >= self.valid_until or lease.shard_id not in self.leases:
            return  # the lease may have passed while the call was out: hand nothing on
        tally = self.tallies[lease.shard_id]
        for record in answer["Records"]:
            tally.add(record)
        if self.consumer is not None:
            self.consumer.take(lease.shard_id, answer, asked, worker=self.worker, epoch=lease.epoch)
        else:
            for record in answer["Records"]:
                self.emit({"worker": self.worker, "shard": lease.shard_id, "epoch": lease.epoch,
                           "seq": record["SequenceNumber"], "key": record["PartitionKey"],
                           "data": record["Data"].decode(errors="replace"), "t": time.time()})
        if answer["Records"] and not self.save(lease, answer["Records"][-1]["SequenceNumber"]):
            return
        lease.iterator = answer.get("NextShardIterator")
        if lease.iterator is None:
            # A closed shard read to its end: its children may be leased now.
            if self.save(lease, "SHARD_END"):
                self.drop(lease.shard_id, "shard_end")

    def run(self, seconds=None):
        until = None if seconds is None else self.clock() + seconds
        while not self.stopping and (until is None or self.clock() < until):
            if self.clock() >= self.next_beat:
                self.heartbeat()
            if self.clock() >= self.valid_until:
                # No answered heartbeat for ttl: the leases may be others' now.
                for shard_id in list(self.leases):
                    self.drop(shard_id, "lost")
                time.sleep(0.1)
                continue
            for shard_id in list(self.leases):
                if self.stopping or self.clock() >= self.next_beat:
                    break
                lease = self.leases.get(shard_id)
                if lease is not None:
                    self.read(lease)
            time.sleep(self.pause)
        self.leave()

    def leave(self):
        # Every batch handed on is checkpointed already: leaving hands the leases over.
        self.leases.clear()
        response = leave_api.sync_detailed(self.stream, self.worker, client=self.client)
        if response.status_code not in (204, 404):
            print(f"leave answered {int(response.status_code)}", file=sys.stderr, flush=True)


def kinesis_client(endpoint_url):
    import boto3
    from botocore.config import Config

    return boto3.client("kinesis", endpoint_url=endpoint_url,
                        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=10))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keyspread", required=True, help="e.g. http://127.0.0.1:8080")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--worker", default=f"{os.uname().nodename}:{os.getpid()}",
                        help="1 to 128 of a-z A-Z 0-9 . _ : - (default host:pid)")
    parser.add_argument("--ttl", type=int, default=30, help="seconds, 1..600 (default 30)")
    parser.add_argument("--endpoint-url", help="a Kinesis endpoint other than AWS's (kinesalite)")
    parser.add_argument("--token", default=os.environ.get("KEYSPREAD_TOKEN"),
                        help="a token with the consume role, the least a worker needs, if the "
                             "server has tokens (default $KEYSPREAD_TOKEN; the environment keeps "
                             "it out of `ps`)")
    parser.add_argument("--seconds", type=float, help="stop after this long (default: until SIGTERM)")
    parser.add_argument("--report-load", action="store_true",
                        help="report what was read from each shard with every heartbeat")
    args = parser.parse_args()
    client = (AuthenticatedClient(base_url=args.keyspread, token=args.token) if args.token
              else Client(base_url=args.keyspread))
    worker = LeaseWorker(kinesis_client(args.endpoint_url), client, args.stream, args.worker, args.ttl,
                         report_load=args.report_load)

    def stop(*_):
        worker.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run(args.seconds)


if __name__ == "__main__":
    main()
