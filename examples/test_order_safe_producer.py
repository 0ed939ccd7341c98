"""Tests of order_safe_producer.py with a mirror, against a Kinesis that fails entries.

Run from examples/ with the generated client (keyspread_api) and clients/python on
PYTHONPATH, as tests/api/python_client.rs does.
"""

import unittest

from keyspread_client.mirror import Lookup
from order_safe_producer import OrderSafeProducer

KEY = "10"


class Mirror:
    """What the producer asks of a `keyspread_client.Mirror`: one key for every account,
    and every record counted, by `record` or by `sent`."""

    def __init__(self):
        self.counted = []

    def lookup(self, account):
        return Lookup((KEY,), None)

    def key_for(self, account, sub_key):
        return KEY

    def record(self, account, sub_key, size):
        self.counted.append((account, KEY, size))
        return KEY

    def sent(self, account, key, size):
        self.counted.append((account, key, size))


class Kinesis:
    """PutRecords that fails the first entry of each of the first `failures` calls."""

    def __init__(self, failures):
        self.failures = failures
        self.sent = []

    def put_records(self, StreamName, Records):
        self.sent.extend(r["Data"] for r in Records)
        answers = [{"SequenceNumber": "1", "ShardId": "shardId-000000000000"} for _ in Records]
        if self.failures:
            self.failures -= 1
            answers[0] = {"ErrorCode": "ProvisionedThroughputExceededException",
                          "ErrorMessage": "Rate exceeded for shard shardId-000000000000"}
        failed = sum("ErrorCode" in a for a in answers)
        return {"FailedRecordCount": failed, "Records": answers}


class MirrorCounts(unittest.TestCase):
    def test_a_record_resent_after_failures_is_counted_once_when_kinesis_takes_it(self):
        mirror, kinesis = Mirror(), Kinesis(failures=2)
        producer = OrderSafeProducer(kinesis, "orders", mirror=mirror)
        for n in range(3):
            producer.put("acme", b"x" * (n + 1))
        producer.flush(timeout=10)
        self.assertEqual(producer.resent, 2)
        self.assertEqual(kinesis.sent, [b"x", b"x", b"x", b"xx", b"xxx"], "in order, resent first")
        self.assertEqual(mirror.counted, [("acme", KEY, 1), ("acme", KEY, 2), ("acme", KEY, 3)])


if __name__ == "__main__":
    unittest.main()
