"""The mirror's fold, when it starts over, and what it reports of what it handed out,
against a scripted server (no keyspread)."""

import http.server
import json
import threading
import time
import unittest
import uuid

from keyspread_client import KeyspreadError, Mirror
from keyspread_client.report import Tally
from keyspread_client.table import Batch, Entry, Unapplicable, apply, entry_of, unix_ms

AT = "2026-01-01T00:00:00.000Z"
LATER = "2026-01-01T00:01:00.000Z"
T0, T1 = unix_ms(AT), unix_ms(LATER)


def event(kind, account="a", index=0, **fields):
    return dict(fields, id=1, kind=kind, at=AT, account=account, index=index)


def folded(table, *events):
    batch = Batch(table)
    for e in events:
        apply(batch, e)
    batch.commit()
    return table


class Fold(unittest.TestCase):
    def test_allocate_move_and_release_follow_the_servers_fold(self):
        table = folded({}, event("allocate", key_after="10", weight=2),
                       event("allocate", index=1, key_after="20", weight=1))
        self.assertEqual(table["a"].keys, ("10", "20"))
        self.assertEqual(table["a"].weight, 3)
        folded(table, event("move", index=1, key_before="20", key_after="30", switch_at=LATER))
        self.assertEqual(table["a"].keys_at(T1 - 1), ["10", "20"])
        self.assertEqual(table["a"].keys_at(T1), ["10", "30"])
        self.assertEqual(table["a"].next_at(T0), (["10", "30"], T1))
        folded(table, event("release", index=1, key_before="30", weight=1))
        self.assertEqual(table["a"].keys_at(T0), ["10"], "the release ends the switch")
        folded(table, event("release", key_before="10", weight=2))
        self.assertNotIn("a", table)

    def test_a_key_a_raised_fanout_adds_is_sent_from_its_switch(self):
        table = folded({}, event("allocate", key_after="10"),
                       event("allocate", index=1, key_after="20", switch_at=LATER))
        self.assertEqual(table["a"].keys_at(T1 - 1), ["10"])
        self.assertEqual(table["a"].keys_at(T1), ["10", "20"])

    def test_a_snapshot_line_with_next_is_the_same_entry_as_the_events(self):
        line = {"account": "a", "hash_keys": ["10", "20"], "weight": 3, "created_at": AT,
                "next": {"hash_keys": ["10", "30", "40"], "switch_at": LATER}}
        entry = entry_of(line)
        self.assertEqual(entry.keys_at(T0), ["10", "20"])
        self.assertEqual(entry.keys_at(T1), ["10", "30", "40"])
        self.assertEqual(entry.weights, (1, 1, 1))

    def test_events_that_do_not_fit_the_table_are_refused(self):
        table = folded({}, event("allocate", key_after="10"))
        for bad in (event("allocate", index=2, key_after="20"),
                    event("move", key_before="99", key_after="30", switch_at=LATER),
                    event("release", key_before="99"),
                    event("reweight", index=1, weight=4)):
            with self.assertRaises(Unapplicable, msg=bad["kind"]):
                folded(dict(table), bad)
        # Kinds that change no key, and kinds newer than the mirror, are skipped.
        folded(table, {"id": 2, "kind": "stream_put", "at": AT, "stream": "s"},
               event("split", key_after="1"))
        self.assertEqual(table["a"], Entry(("10",), (1,), AT))

    def test_a_batch_is_invisible_until_committed(self):
        table = folded({}, event("allocate", key_after="10"))
        batch = Batch(table)
        apply(batch, event("release", key_before="10"))
        apply(batch, event("allocate", account="b", key_after="20"))
        self.assertEqual(set(table), {"a"})
        batch.commit()
        self.assertEqual(set(table), {"b"})


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers the snapshot it is given, then each /events answer in turn (the last one
    over and over): ``(status, body)`` or ``(status, body, headers)``. Answers each
    ``POST /load/producers`` with ``report_status[0]``, noting ``(status, body)`` in
    ``reports``; refuses every other POST (409), noting its headers."""

    snapshot, answers, calls, posted = "", [], [], []
    report_status, reports = [200], []

    def do_GET(self):
        self.calls.append(self.path)
        headers = {}
        if self.path == "/snapshot":
            status, body = 200, self.snapshot
        else:
            answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
            status, body, headers = (answer + ({},))[:3]
            time.sleep(0.02)
        self.answer(status, body, headers)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/load/producers":
            status = self.report_status[0]
            self.reports.append((status, json.loads(body)))
            self.answer(status, {"counted": True} if status == 200 else {"title": "Unavailable"})
            return
        self.posted.append(dict(self.headers))
        self.answer(409, {"title": "Conflict", "detail": "refused here"})

    def answer(self, status, body, headers=None):
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):
        pass


class Quiet(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a mirror that closes cuts its long-poll


def serve(snapshot, answers):
    handler = type("Handler", (Scripted,),
                   {"snapshot": snapshot, "answers": answers, "calls": [], "posted": [],
                    "report_status": [200], "reports": []})
    server = Quiet(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


HEAD = json.dumps({"event_id": 5, "accounts": 1, "max_age_s": 60})
LINE = json.dumps({"account": "a", "hash_keys": ["10"], "weight": 1, "created_at": AT})
EMPTY = (200, {"events": [], "next": 5})


LOG, OTHER = str(uuid.uuid4()), str(uuid.uuid4())
NAMED_HEAD = json.dumps({"event_id": 5, "accounts": 1, "max_age_s": 60, "log_id": LOG})
NAMED_EMPTY = (200, {"events": [], "next": 5, "log_id": LOG})


class Scripting(unittest.TestCase):
    """A mirror of a scripted server."""

    def started(self, answers, head=HEAD, **options):
        server, handler = serve(head + "\n" + LINE + "\n", answers)
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        mirror = Mirror(f"http://127.0.0.1:{server.server_address[1]}", **options)
        self.addCleanup(mirror.close)
        return mirror, handler

    def wait_snapshots(self, mirror, n):
        deadline = time.monotonic() + 5
        while mirror.snapshots < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return mirror.snapshots


class StartsOver(Scripting):
    def test_gone_takes_a_new_snapshot(self):
        mirror, _handler = self.started([(410, {"title": "Gone", "detail": "compacted"}), EMPTY])
        self.assertEqual(self.wait_snapshots(mirror, 2), 2)
        self.assertEqual(mirror.event_id, 5)
        self.assertEqual(mirror.keys("a"), ("10",))

    def test_an_unknown_kind_is_passed_over_without_a_new_snapshot(self):
        odd = {"id": 6, "kind": "teleport", "at": AT, "account": "a", "key_after": "9"}
        mirror, _ = self.started([(200, {"events": [odd], "next": 6}),
                                  (200, {"events": [], "next": 6})])
        self.assertTrue(mirror.wait_for(6, 5), "the event is passed")
        self.assertEqual(mirror.snapshots, 1)
        self.assertEqual(mirror.keys("a"), ("10",))

    def test_a_page_of_another_log_takes_a_new_snapshot(self):
        other = (200, {"events": [event("release", key_before="10")], "next": 6,
                       "log_id": OTHER})
        mirror, _ = self.started([NAMED_EMPTY, other, NAMED_EMPTY], head=NAMED_HEAD)
        self.assertEqual(self.wait_snapshots(mirror, 2), 2)
        self.assertEqual(mirror.keys("a"), ("10",), "the other log's events are not applied")

    def test_a_header_naming_another_log_takes_a_new_snapshot(self):
        other = (200, {"events": [], "next": 5}, {"X-Keyspread-Log": OTHER})
        mirror, _ = self.started([other, NAMED_EMPTY], head=NAMED_HEAD)
        self.assertEqual(self.wait_snapshots(mirror, 2), 2)

    def test_a_position_past_the_logs_end_takes_a_new_snapshot(self):
        gone = (410, {"type": "urn:keyspread:problem:past-end", "detail": "past the end",
                      "log_id": OTHER, "end": 2})
        mirror, _ = self.started([gone, NAMED_EMPTY], head=NAMED_HEAD)
        self.assertEqual(self.wait_snapshots(mirror, 2), 2)

    def test_each_allocation_sends_an_idempotency_key_of_its_own(self):
        mirror, handler = self.started([NAMED_EMPTY], head=NAMED_HEAD)
        for _ in range(2):
            with self.assertRaises(KeyspreadError):
                mirror.allocate("acme")
        keys = [h.get("Idempotency-Key") for h in handler.posted]
        self.assertEqual(len(keys), 2)
        for key in keys:
            self.assertEqual(str(uuid.UUID(key)), key)
        self.assertNotEqual(keys[0], keys[1])

    def test_a_snapshot_cut_short_is_not_taken(self):
        server, _ = serve(HEAD + "\n", [EMPTY])
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        with self.assertRaisesRegex(ValueError, "cut short: 0 of 1"):
            Mirror(f"http://127.0.0.1:{server.server_address[1]}")


class Counting(unittest.TestCase):
    def test_a_tally_adds_up_per_account_and_key_and_starts_over_when_cut(self):
        now = [100.0]
        tally = Tally(lambda: now[0])
        for account, key, size in (("a", "1", 10), ("a", "1", 5), ("a", "2", 1), ("b", "1", 7)):
            tally.count(account, key, size)
        now[0] += 2.5
        keys, window_ms = tally.cut()
        self.assertEqual(window_ms, 2500)
        self.assertEqual(sorted((k["account"], k["hash_key"], k["records"], k["bytes"]) for k in keys),
                         [("a", "1", 2, 15), ("a", "2", 1, 1), ("b", "1", 1, 7)])
        self.assertEqual(tally.cut()[0], [])

    def test_a_window_over_an_hour_is_reported_as_its_last_hour_at_the_same_rate(self):
        now = [0.0]
        tally = Tally(lambda: now[0])
        for _ in range(7200):
            tally.count("a", "1", 2)
        now[0] += 7200
        keys, window_ms = tally.cut()
        self.assertEqual((keys[0]["records"], keys[0]["bytes"], window_ms), (3600, 7200, 3_600_000))


STREAM_HEAD = json.dumps({"event_id": 5, "accounts": 1, "max_age_s": 60, "stream": "s"})


def until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


class Reports(Scripting):
    def records(self, reports, status=200):
        return sum(k["records"] for s, body in reports if s == status for k in body["keys"])

    def test_record_answers_key_for_and_close_reports_what_it_counted(self):
        mirror, handler = self.started([EMPTY], head=STREAM_HEAD, report_interval_s=0,
                                       producer="p-1")
        for n in range(3):
            self.assertEqual(mirror.record("a", f"order-{n}", 10), mirror.key_for("a", "x"))
        self.assertIsNone(mirror.record("nobody", "x", 10), "no keys: nothing counted")
        time.sleep(0.1)
        self.assertEqual(handler.reports, [], "only on close")
        mirror.close()
        [(status, body)] = handler.reports
        self.assertEqual({k: body[k] for k in ("stream", "producer", "keys")},
                         {"stream": "s", "producer": "p-1",
                          "keys": [{"account": "a", "hash_key": "10", "records": 3, "bytes": 30}]})
        self.assertGreaterEqual(body["window_ms"], 100)
        self.assertIsInstance(body["seq"], int)

    def test_sent_counts_a_record_under_the_key_given_as_record_does(self):
        mirror, handler = self.started([EMPTY], head=STREAM_HEAD, report_interval_s=0,
                                       producer="p-1")
        mirror.record("a", "order-1", 10)
        mirror.sent("a", "10", 5)
        mirror.sent("a", "99", 7)
        mirror.close()
        [(status, body)] = handler.reports
        self.assertEqual(sorted(body["keys"], key=lambda k: k["hash_key"]),
                         [{"account": "a", "hash_key": "10", "records": 2, "bytes": 15},
                          {"account": "a", "hash_key": "99", "records": 1, "bytes": 7}])

    def test_a_producer_id_the_server_would_refuse_is_refused_at_once(self):
        for producer in ("", "a b", "p" * 129):
            with self.assertRaisesRegex(ValueError, "producer"):
                Mirror("http://127.0.0.1:9", producer=producer)

    def test_without_a_primary_stream_nothing_is_reported(self):
        mirror, handler = self.started([EMPTY], report_interval_s=0)
        self.assertEqual(mirror.record("a", "x", 1), "10")
        mirror.close()
        self.assertEqual(handler.reports, [])

    def test_reports_go_periodically_and_one_refused_is_sent_again_as_it_was(self):
        mirror, handler = self.started([EMPTY], head=STREAM_HEAD, report_interval_s=0.05,
                                       producer="p")
        for _ in range(5):
            mirror.record("a", "x", 1)
        self.assertTrue(until(lambda: self.records(handler.reports) == 5), handler.reports)
        taken_before = len(handler.reports)

        handler.report_status[0] = 503
        for _ in range(7):
            mirror.record("a", "x", 1)
        self.assertTrue(until(lambda: len(handler.reports) >= taken_before + 2), handler.reports)
        for _ in range(3):  # records and lookups go on meanwhile
            self.assertEqual(mirror.record("a", "x", 1), "10")
        refused = [body for status, body in handler.reports if status == 503]
        self.assertTrue(all(body == refused[0] for body in refused), "sent again as it was")
        self.assertIn(self.records([(503, refused[0])], 503), range(1, 8))

        handler.report_status[0] = 200
        self.assertTrue(until(lambda: self.records(handler.reports) == 15), handler.reports)
        taken = [body for status, body in handler.reports if status == 200]
        self.assertEqual(taken[taken_before], refused[0])
        seqs = [body["seq"] for body in taken]
        self.assertEqual(seqs, sorted(set(seqs)), "numbered upwards")
        mirror.close()
        self.assertEqual(self.records(handler.reports), 15, "nothing left to report")


if __name__ == "__main__":
    unittest.main()
