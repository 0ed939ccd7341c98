"""The mirror against a live keyspread.

KEYSPREAD_TEST_URL      a running server (allocations, changes made elsewhere, the
                        selector against GET /shard-of); it may hold other data.
KEYSPREAD_TEST_EMPTY_URL  a running server with an empty table, which the staged move
                        test makes uneven and rebalances.
KEYSPREAD_TEST_BIN      the keyspread binary, and
KEYSPREAD_TEST_DATABASE_URL  a database of its own: the tests that stop, freeze and restart
                        a server start it themselves.

    KEYSPREAD_TEST_URL=http://127.0.0.1:8080 python -m unittest -v tests/test_mirror.py
"""

import http.client
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.parse
import uuid

from keyspread_client import Mirror, Stale, jump, sub_key_index

URL = os.environ.get("KEYSPREAD_TEST_URL")
EMPTY_URL = os.environ.get("KEYSPREAD_TEST_EMPTY_URL")
BIN = os.environ.get("KEYSPREAD_TEST_BIN")
DATABASE_URL = os.environ.get("KEYSPREAD_TEST_DATABASE_URL")


def call(url, method, path, body=None):
    """``(status, parsed body)`` of one request to the server at ``url``."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=10)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None)
    finally:
        conn.close()


def until(check, timeout, step=0.01):
    """Polls ``check`` until it answers something true; answers it, or the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step)


def quoted(account):
    return urllib.parse.quote(account, safe="")


class SelectorVectors(unittest.TestCase):
    def test_the_jump_selector_answers_designs_vectors(self):
        fanouts = (1, 2, 3, 4, 5, 8, 16, 100)
        vectors = {
            "order-1": (0, 0, 2, 3, 3, 3, 11, 44),
            "user-42": (0, 1, 2, 3, 3, 7, 7, 45),
            "": (0, 1, 1, 3, 3, 3, 11, 11),
        }
        for sub_key, expected in vectors.items():
            got = tuple(sub_key_index(sub_key, k) for k in fanouts)
            self.assertEqual(got, expected, f"sub-key {sub_key!r}")
        self.assertEqual(jump(0, 1), 0)


@unittest.skipUnless(URL, "KEYSPREAD_TEST_URL is not set")
class Live(unittest.TestCase):
    def setUp(self):
        self.prefix = f"py-{uuid.uuid4().hex[:8]}-"

    def mirror(self, url=None, **kwargs):
        mirror = Mirror(url or URL, **kwargs)
        self.addCleanup(mirror.close)
        return mirror

    def assert_same_as_lookup(self, mirror, account, url=None):
        """The mirror's keys and next switch are the server's lookup's."""
        status, server = call(url or URL, "GET", "/keys/" + quoted(account))
        self.assertEqual(status, 200, server)
        got = mirror.lookup(account)
        self.assertEqual(got.keys, tuple(server["hash_keys"]), account)
        if "next" in server:
            self.assertIsNotNone(got.next, f"{account}: the server has {server['next']}")
            self.assertEqual(got.next.keys, tuple(server["next"]["hash_keys"]))
        else:
            self.assertIsNone(got.next, account)

    def test_allocate_answers_from_the_mirror(self):
        mirror = self.mirror()
        account = self.prefix + "a"
        self.assertIsNone(mirror.keys(account), "an account the server has never seen")
        keys = mirror.allocate(account)
        self.assertEqual(len(keys), 1)
        self.assertEqual(mirror.keys(account), keys)
        self.assert_same_as_lookup(mirror, account)
        hot = self.prefix + "hot"
        keys = mirror.allocate(hot, weight=9, fanout=3)
        self.assertEqual(len(keys), 3)
        self.assert_same_as_lookup(mirror, hot)
        self.assertEqual(mirror.allocate(hot), keys, "allocate is idempotent")
        self.assertIn(mirror.key_for(hot, "order-1"), keys)
        self.assertLess(mirror.lag_s, mirror.max_age_s)

    def test_a_change_made_elsewhere_is_seen_within_a_second(self):
        mirror = self.mirror()
        account = self.prefix + "elsewhere"
        before = mirror.event_id

        status, made = call(URL, "POST", "/keys/" + quoted(account))
        self.assertEqual(status, 201, made)
        self.assertEqual(until(lambda: mirror.keys(account), 1.0), tuple(made["hash_keys"]))
        self.assertGreater(mirror.event_id, before)

        status, grown = call(URL, "PATCH", "/keys/" + quoted(account), {"fanout": 4, "weight": 4})
        self.assertEqual(status, 200, grown)
        self.assertEqual(until(lambda: len(mirror.keys(account)) == 4, 1.0), True)
        self.assert_same_as_lookup(mirror, account)

        status, _ = call(URL, "DELETE", "/keys/" + quoted(account))
        self.assertEqual(status, 204)
        self.assertTrue(until(lambda: mirror.keys(account) is None, 1.0), "release not seen")
        self.assertIsNone(mirror.key_for(account, "x"))

    @unittest.skipUnless(EMPTY_URL, "KEYSPREAD_TEST_EMPTY_URL is not set")
    def test_a_staged_move_switches_at_switch_at_by_the_local_clock(self):
        offset = [0.0]
        mirror = self.mirror(url=EMPTY_URL, clock=lambda: time.time() + offset[0])
        url = EMPTY_URL  # the server this test rebalances
        # Eight accounts over two shards of an empty table, those on shard 1 released:
        # 4 against 0.
        accounts = [f"{self.prefix}s-{i}" for i in range(8)]
        for account in accounts:
            self.assertEqual(call(url, "POST", "/keys/" + quoted(account))[0], 201)
        for account in accounts:
            status, on = call(url, "GET", f"/shard-of?account={quoted(account)}&shards=2")
            if on["shard_index"] == 1:
                self.assertEqual(call(url, "DELETE", "/keys/" + quoted(account))[0], 204)
        status, plan = call(url, "GET", "/rebalance/preview?shards=2")
        self.assertEqual(status, 200, plan)
        self.assertTrue(plan["moves"], f"an uneven table plans moves: {plan}")
        status, applied = call(url, "POST", "/rebalance",
                               {"plan_id": plan["plan_id"], "switch_after_s": 2})
        self.assertEqual(status, 200, applied)
        moves = applied["moves"]
        switch_at = {m["switch_at"] for m in moves}
        self.assertEqual(len(switch_at), 1, moves)
        at_s = _unix_s(switch_at.pop())
        self.assertGreater(at_s, time.time(), "the switch is ahead")

        def staged():
            return all(mirror.lookup(m["account"]).next for m in moves)

        self.assertTrue(until(staged, 1.0), "the mirror has not seen the moves")
        for m in moves:
            account, index = m["account"], m["index"]
            self.assertEqual(mirror.keys(account)[index], m["from"], "before the switch")
            self.assertEqual(mirror.lookup(account).next.switch_at, at_s)
            self.assert_same_as_lookup(mirror, account, url)
        # By the injected clock: the old key up to the millisecond before, the new one at.
        offset[0] = at_s - 0.001 - time.time()
        for m in moves:
            self.assertEqual(mirror.keys(m["account"])[m["index"]], m["from"])
        offset[0] = at_s - time.time()
        for m in moves:
            self.assertEqual(mirror.keys(m["account"])[m["index"]], m["to"])
            self.assertIsNone(mirror.lookup(m["account"]).next)
        # And by the real clock once it gets there.
        offset[0] = 0.0
        time.sleep(max(0.0, at_s - time.time()) + 0.05)
        for m in moves:
            self.assertEqual(mirror.keys(m["account"])[m["index"]], m["to"])
            self.assert_same_as_lookup(mirror, m["account"], url)

    def test_the_jump_selector_matches_the_servers_shard_of(self):
        mirror = self.mirror()
        account = self.prefix + "sub-keys"
        keys = mirror.allocate(account, fanout=7)
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(urllib.parse.urlsplit(URL).netloc, timeout=10)
        self.addCleanup(conn.close)
        for _ in range(10_000):
            sub_key = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_é")
                              for _ in range(rng.randrange(0, 24)))
            conn.request("GET", f"/shard-of?account={quoted(account)}"
                                f"&sub_key={quoted(sub_key)}&shards=8")
            response = conn.getresponse()
            answer = json.loads(response.read())
            self.assertEqual(response.status, 200, answer)
            self.assertEqual(sub_key_index(sub_key, 7), answer["index"],
                             f"sub-key {sub_key!r} (seed {seed})")
            self.assertEqual(mirror.key_for(account, sub_key), answer["hash_key"])
            self.assertEqual(keys[answer["index"]], answer["hash_key"])


def _unix_s(stamp):
    from keyspread_client.table import unix_ms

    return unix_ms(stamp) / 1000


class Server:
    """``keyspread serve`` as a child process on a loopback port, its log in a file."""

    def __init__(self, env=(), port=0):
        fd, self.log = tempfile.mkstemp(prefix="keyspread-", suffix=".log")
        environ = dict(os.environ, DATABASE_URL=DATABASE_URL,
                       KEYSPREAD_LISTEN=f"127.0.0.1:{port}", RUST_LOG="info")
        for name in ("KEYSPREAD_TOKEN", "KEYSPREAD_PRIMARY_STREAM", "KEYSPREAD_KEYSPACE_BITS"):
            environ.pop(name, None)
        environ.update(env)
        self.env = env
        self.process = subprocess.Popen([BIN, "serve"], env=environ,
                                        stdout=subprocess.DEVNULL, stderr=fd)
        os.close(fd)
        self.url = until(self._listening, 30, step=0.05)
        if not self.url:
            raise AssertionError(f"keyspread did not start: {self.text()[-2000:]}")
        ready = until(lambda: _ready(self.url), 30, step=0.05)
        if not ready:
            raise AssertionError(f"keyspread is not ready: {self.text()[-2000:]}")
        self.port = int(self.url.rsplit(":", 1)[1])

    def text(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _listening(self):
        if self.process.poll() is not None:
            raise AssertionError(f"keyspread exited: {self.text()[-2000:]}")
        found = re.search(r" listening addr=(\S+)", self.text())
        return found and "http://" + found.group(1)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _ready(url):
    try:
        return call(url, "GET", "/readyz")[0] == 200
    except OSError:
        return False


@unittest.skipUnless(BIN and DATABASE_URL,
                     "KEYSPREAD_TEST_BIN and KEYSPREAD_TEST_DATABASE_URL are not set")
class Process(unittest.TestCase):
    def server(self, **kwargs):
        server = Server(**kwargs)
        self.addCleanup(server.stop)
        return server

    def test_lookups_raise_stale_once_max_age_passes_without_a_sync(self):
        server = self.server(env={"KEYSPREAD_LOOKUP_CACHE_CONTROL": "max-age=2"})
        account = f"stale-{uuid.uuid4().hex[:8]}"
        self.assertIn(call(server.url, "POST", "/keys/" + account)[0], (200, 201))
        mirror = Mirror(server.url)
        self.addCleanup(mirror.close)
        self.assertEqual(mirror.max_age_s, 2)
        self.assertIsNotNone(mirror.keys(account))
        # A server that stops answering: the last sync ages.
        server.process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()

        def stale():
            try:
                mirror.keys(account)
                return False
            except Stale:
                return True

        self.assertTrue(until(stale, 4.0), "no Stale 4 s after the server froze")
        # Marked a moment before max_age_s (the watcher's wake-up time), never later.
        self.assertGreater(mirror.lag_s, 2.0 - 0.1)
        self.assertGreater(time.monotonic() - stopped, 2.0 - 0.6, "Stale came too early")
        with self.assertRaises(Stale):
            mirror.key_for(account, "x")
        with self.assertRaises(Stale):
            mirror.lookup(account)
        server.process.send_signal(signal.SIGCONT)
        self.assertTrue(until(lambda: not stale(), 5.0), "still Stale 5 s after the server woke")
        self.assertLess(mirror.lag_s, 2.0)

    def test_what_a_mirror_recorded_is_the_load_of_its_keys_shards(self):
        server = self.server()
        stream = f"py-load-{uuid.uuid4().hex[:8]}"
        status, put = call(server.url, "PUT", f"/streams/{stream}",
                           {"shard_count": 4, "primary": True})
        self.assertEqual(status, 201, put)
        keys = {}
        for account in (f"{stream}-a", f"{stream}-b"):
            status, made = call(server.url, "POST", "/keys/" + account)
            self.assertEqual(status, 201, made)
            keys[account] = made["hash_key"]
        a, b = keys
        mirror = Mirror(server.url, report_interval_s=0)
        self.addCleanup(mirror.close)
        for n in range(30):
            self.assertEqual(mirror.record(a, f"order-{n}", 100), keys[a])
        for _ in range(10):
            self.assertEqual(mirror.record(b, "x", 50), keys[b])
        mirror.close()

        status, load = call(server.url, "GET", f"/load?stream={stream}")
        self.assertEqual(status, 200, load)
        shards = {s["shard_id"]: s for s in load["shards"]}
        for key in keys.values():
            shard = shards[f"shardId-{int(key) >> 126:012d}"]
            self.assertEqual(shard["source"], "producers", load)
            self.assertGreater(shard["records_per_s"], 0, load)
        accounts = {x["account"]: x for x in load["accounts"]}
        # One report, one window: the rates stand as the counts do.
        self.assertAlmostEqual(accounts[a]["records_per_s"] / accounts[b]["records_per_s"], 3.0)
        self.assertAlmostEqual(accounts[a]["bytes_per_s"] / accounts[b]["bytes_per_s"], 6.0)

    def test_a_restarted_server_is_followed_from_the_mirrors_event_id(self):
        server = self.server()
        before, after = (f"restart-{uuid.uuid4().hex[:8]}-{n}" for n in ("before", "after"))
        self.assertIn(call(server.url, "POST", "/keys/" + before)[0], (200, 201))
        mirror = Mirror(server.url)
        self.addCleanup(mirror.close)
        self.assertEqual(mirror.snapshots, 1)
        position = mirror.event_id
        keys = mirror.keys(before)

        server.stop()
        time.sleep(0.5)  # the mirror's polls fail meanwhile
        self.assertEqual(mirror.keys(before), keys, "answers from the table while the server is away")
        server = self.server(port=server.port)
        status, made = call(server.url, "POST", "/keys/" + after)
        self.assertEqual(status, 201, made)

        self.assertEqual(until(lambda: mirror.keys(after), 10.0), tuple(made["hash_keys"]))
        self.assertEqual(mirror.snapshots, 1, "it resumed without a new snapshot")
        self.assertGreater(mirror.event_id, position)
        self.assertEqual(mirror.keys(before), keys)


if __name__ == "__main__":
    unittest.main()
