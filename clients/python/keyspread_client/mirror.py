"""The mirror: keyspread's whole table in the producer, following the server's event log."""

import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
import uuid
from collections import namedtuple

from .report import Reporter, Tally, is_producer_id
from .selector import sub_key_index
from .table import Batch, Unapplicable, apply, entry_of

log = logging.getLogger("keyspread_client")

#: What :meth:`Mirror.lookup` answers: the keys to send now, and the next switch, if any.
Lookup = namedtuple("Lookup", "keys next")
#: The keys that take over at ``switch_at`` (Unix seconds, by the local clock).
Next = namedtuple("Next", "keys switch_at")

_PAGE = 1000
_LONGEST_POLL_S = 25
_BACKOFF_S = (0.1, 5.0)
# How much before max_age_s the watcher marks the table stale: more than it takes to wake.
_WAKE_S = 0.05


class Stale(Exception):
    """The mirror has not heard from the server for longer than the snapshot's
    ``max_age_s``: it may have missed a switch whose time has come."""


class KeyspreadError(Exception):
    """The server refused a request; ``status`` and ``detail`` say why."""

    def __init__(self, status, detail):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class _Gone(Exception):
    """The log the table followed has ended for the mirror: ``GET /events`` answered 410
    (compacted past its position, or the position is past the end of the server's log), or
    a page of another log."""


class Mirror:
    """keyspread's table in memory, kept in step with the server.

    ``Mirror(url)`` reads ``GET /snapshot`` (line by line) before it returns, then a daemon
    thread long-polls ``GET /events`` from the snapshot's event id and applies each batch of
    events at once. A lookup of an account the table does not hold answers ``None``; every
    lookup raises :class:`Stale` once the last successful sync is older than the snapshot's
    ``max_age_s``. The server going away changes nothing until then: the thread retries
    with backoff and resumes from its event id; it takes a new snapshot only when the
    server no longer has that position (410), answers from another log (``log_id``: a
    database restored or imported afresh on its address) or an event does not fit the
    table. Until the new snapshot is in, lookups answer the old table while it is fresh.

    :meth:`record` answers :meth:`key_for`'s key and counts the record; a third thread
    reports what was counted to ``POST /load/producers`` every ``report_interval_s``
    (never if 0) and once more on :meth:`close`, on the primary stream the snapshot names,
    as ``producer`` (a random id per mirror unless given). A report the server does not
    take is sent again with the next one; lookups and records never wait for it.

    ``clock`` (Unix seconds, ``time.time`` by default) decides when staged switches take
    over; ``monotonic`` measures how old the last sync is.
    """

    def __init__(self, url, token=None, timeout=10.0, clock=time.time, monotonic=time.monotonic,
                 report_interval_s=10, producer=None):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://HOST[:PORT][/PREFIX], got {url!r}")
        if producer is not None and not is_producer_id(producer):
            raise ValueError(f"producer must be 1 to 128 of a-z A-Z 0-9 . _ : -, got {producer!r}")
        self._scheme, self._netloc = parts.scheme, parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._headers = {"User-Agent": "keyspread-client-python/0.1", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._clock, self._monotonic = clock, monotonic
        self._table = {}
        self._event_id = 0
        self._log_id = None
        self._stream = None
        self._max_age_s = 0
        self._synced_at = None
        self._fresh_until = float("-inf")
        # Lookups read this flag, not a clock: the watcher clears it when the sync ages.
        self._fresh = False
        self._snapshots = 0
        self._applied = threading.Condition()
        self._closing = threading.Event()
        self._polling = None  # the connection a long-poll waits on, for close()
        self._snapshot()
        self._thread = threading.Thread(target=self._follow, name="keyspread-mirror", daemon=True)
        self._thread.start()
        self._watcher = threading.Thread(target=self._watch, name="keyspread-mirror-watch",
                                         daemon=True)
        self._watcher.start()
        self._report_interval_s = report_interval_s
        self._tally = Tally(monotonic)
        self._reporter = Reporter(self._tally, producer or f"mirror-{uuid.uuid4()}",
                                  self._post_report, lambda: self._stream)
        self._reporting = threading.Thread(target=self._report, name="keyspread-mirror-report",
                                           daemon=True)
        self._reporting.start()

    # Lookups: in memory, no lock.

    def keys(self, account):
        """The keys (a tuple of decimal strings, by index) to send ``account``'s records with
        now, or ``None`` when the table does not hold the account. A tuple, not a list: the
        table's own, handed out without a copy and unchangeable by the caller."""
        if not self._fresh:
            raise self._stale()
        entry = self._table.get(account)
        if entry is None:
            return None
        if entry.until:
            now = self._clock() * 1000
            if entry.until > now:
                return tuple(entry.keys_at(now))
        return entry.keys

    def key_for(self, account, sub_key):
        """The key records of ``sub_key`` (an order id, a user id) of ``account`` go under
        now: the jump hash of its MD5 picks one of the account's keys. ``None`` when the
        table does not hold the account."""
        keys = self.keys(account)
        if keys is None:
            return None
        return keys[sub_key_index(sub_key, len(keys))] if len(keys) > 1 else keys[0]

    def record(self, account, sub_key, size):
        """The key a record of ``sub_key`` of ``size`` bytes goes under (:meth:`key_for`'s),
        counted as sent: one record and ``size`` bytes for the account and key, in the next
        report. ``None``, and nothing counted, when the table does not hold the account."""
        key = self.key_for(account, sub_key)
        if key is not None:
            self.sent(account, key, size)
        return key

    def sent(self, account, key, size):
        """Counts one record of ``size`` bytes sent to ``account`` under ``key``, for
        producers that pick among :meth:`lookup`'s keys themselves (holding records back
        before a switch, resending failed ones, counting a record once Kinesis took it):
        reported with the next report, as :meth:`record`'s are."""
        self._tally.count(account, key, size)

    def lookup(self, account):
        """:class:`Lookup` of ``account`` (keys now, and the nearest switch still ahead), or
        ``None``: both read at one instant, for producers that hold records back just before
        a switch."""
        if not self._fresh:
            raise self._stale()
        entry = self._table.get(account)
        if entry is None:
            return None
        now = self._clock() * 1000
        ahead = entry.next_at(now)
        nxt = Next(tuple(ahead[0]), ahead[1] / 1000) if ahead else None
        return Lookup(tuple(entry.keys_at(now)), nxt)

    def __len__(self):
        return len(self._table)

    @property
    def lag_s(self):
        """Seconds since the last successful sync with the server."""
        return self._monotonic() - self._synced_at

    @property
    def event_id(self):
        """The newest event the table holds."""
        return self._event_id

    @property
    def max_age_s(self):
        """How long the table may be used without a sync (the server's lookup max-age)."""
        return self._max_age_s

    @property
    def snapshots(self):
        """How many snapshots the mirror has taken (1 unless it had to start over)."""
        return self._snapshots

    def _stale(self):
        return Stale(f"no sync with {self._netloc} for {self.lag_s:.1f} s, longer than "
                     f"max_age_s {self._max_age_s}: a switch may have been missed")

    # Changes.

    def allocate(self, account, weight=None, fanout=None, timeout=5.0):
        """Allocates keys for ``account`` (``POST /keys/{account}``, idempotent, with an
        ``Idempotency-Key`` of its own) and answers its keys from the mirror once the mirror
        holds the account, or from the server's answer if the mirror has not heard of it
        within ``timeout`` seconds."""
        body = {k: v for k, v in (("weight", weight), ("fanout", fanout)) if v is not None}
        path = "/keys/" + urllib.parse.quote(account, safe="")
        once = {"Idempotency-Key": str(uuid.uuid4())}
        answer = json.loads(self._request("POST", path, body, self._timeout, once))
        with self._applied:
            self._applied.wait_for(lambda: self._table.get(account) is not None, timeout)
        keys = self.keys(account)
        if keys is None:
            keys = tuple(entry_of(answer).keys_at(self._clock() * 1000))
        return keys

    def wait_for(self, event_id, timeout):
        """Waits until the table holds event ``event_id``; answers whether it does."""
        with self._applied:
            return self._applied.wait_for(lambda: self._event_id >= event_id, timeout)

    def close(self):
        """Stops following the log (a long-poll in flight is cut) and reports what was
        counted since the last report (waiting for the server at most ``timeout`` for it
        and for one left from before)."""
        self._closing.set()
        with self._applied:
            self._applied.notify_all()  # the watcher
        polling = self._polling
        if polling is not None and polling.sock is not None:
            try:
                polling.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join(self._timeout)
        if threading.current_thread() is not self._reporting:
            self._reporting.join(2 * self._timeout)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    # Reporting what was sent.

    def _report(self):
        """Reports every ``report_interval_s`` until closed, then once more."""
        interval = self._report_interval_s if self._report_interval_s > 0 else None
        while True:
            closed = self._closing.wait(interval)
            try:
                self._reporter.report()
            except Exception:  # the thread must outlive a bug: the counts wait meanwhile
                log.exception("keyspread mirror failed to report what was sent")
            if closed:
                return

    def _post_report(self, body):
        """The status ``POST /load/producers`` of ``body`` answers."""
        conn = self._connect(self._timeout)
        try:
            headers = dict(self._headers, **{"Content-Type": "application/json"})
            conn.request("POST", self._prefix + "/load/producers", json.dumps(body), headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    # Following the log.

    def _follow(self):
        backoff = _BACKOFF_S[0]
        must_snapshot = False
        conn = None
        while not self._closing.is_set():
            try:
                if must_snapshot:
                    self._snapshot()
                    must_snapshot = False
                else:
                    conn = conn or self._connect(self._poll_s() + self._timeout)
                    self._polling = conn
                    self._poll(conn)
                backoff = _BACKOFF_S[0]
            except (_Gone, Unapplicable) as why:
                log.warning("keyspread mirror takes a new snapshot: %s", why)
                must_snapshot = True
            except (OSError, http.client.HTTPException, KeyspreadError, ValueError) as err:
                if self._closing.is_set():
                    break
                log.warning("keyspread mirror cannot sync (%s); retrying in %.1f s", err, backoff)
                _close(conn)
                conn = None
                self._closing.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_S[1])
            except Exception:  # the thread must outlive a bug: lookups go stale meanwhile
                log.exception("keyspread mirror failed to sync; retrying in %.1f s", backoff)
                _close(conn)
                conn = None
                self._closing.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_S[1])
        _close(conn)

    def _poll_s(self):
        """How long a long-poll waits: well inside ``max_age_s``, so that an idle log keeps
        the mirror fresh."""
        return min(_LONGEST_POLL_S, self._max_age_s // 4)

    def _poll(self, conn):
        """One long-poll, then the pages behind it until the log's end, applied at once."""
        wait_s = self._poll_s()
        started = self._monotonic()
        events, after = [], self._event_id
        while True:
            path = f"/events?after={after}&limit={_PAGE}&wait_s={0 if events else wait_s}"
            body, named = self._get(conn, path)
            page = json.loads(body)
            if not _same_log(self._log_id, named, page.get("log_id")):
                raise _Gone(f"the server follows another log ({named or page.get('log_id')})")
            events.extend(page["events"])
            after = page["next"]
            if len(page["events"]) < _PAGE:
                break
        batch = Batch(self._table)
        for event in events:
            apply(batch, event)
        with self._applied:
            batch.commit()
            self._event_id = after
            self._synced(started)
            self._applied.notify_all()
        if not events and wait_s == 0:
            # A server whose max-age is under 4 s is asked every quarter of it.
            self._closing.wait(self._max_age_s / 4 if self._max_age_s else 1.0)

    def _snapshot(self):
        """Reads ``GET /snapshot`` line by line into a new table, then puts it in place."""
        started = self._monotonic()
        conn = self._connect(self._timeout)
        try:
            conn.request("GET", self._prefix + "/snapshot", headers=self._headers)
            response = conn.getresponse()
            if response.status != 200:
                raise KeyspreadError(response.status, _detail(response.read()))
            head = json.loads(response.readline())
            table = {}
            for line in response:
                a = json.loads(line)
                table[a["account"]] = entry_of(a)
            if len(table) != head["accounts"]:
                raise ValueError(f"snapshot cut short: {len(table)} of {head['accounts']} accounts")
        finally:
            conn.close()
        with self._applied:
            self._table = table
            self._event_id = head["event_id"]
            self._log_id = head.get("log_id")
            self._stream = head.get("stream")
            self._max_age_s = head["max_age_s"]
            self._snapshots += 1
            self._synced(started)
            self._applied.notify_all()
        log.info("keyspread mirror holds %d accounts as of event %d", len(table), head["event_id"])

    def _synced(self, started):
        """Notes a sync whose request was sent at ``started`` (the answer holds every event
        committed before then); the caller holds ``_applied`` and notifies the watcher."""
        self._synced_at = started
        self._fresh_until = started + self._max_age_s
        self._fresh = self._max_age_s > 0

    def _watch(self):
        """Clears ``_fresh`` once the last sync is ``max_age_s`` old (a little before, for
        the time this thread takes to wake), and waits for the next sync."""
        with self._applied:
            while not self._closing.is_set():
                left = self._fresh_until - _WAKE_S - self._monotonic()
                if left <= 0:
                    self._fresh = False
                self._applied.wait(left if left > 0 else None)

    # HTTP.

    def _connect(self, timeout):
        kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return kind(self._netloc, timeout=timeout)

    def _get(self, conn, path):
        """The body of a 200 to ``GET path``, and the log its ``X-Keyspread-Log`` names."""
        conn.request("GET", self._prefix + path, headers=self._headers)
        response = conn.getresponse()
        body = response.read()
        if response.status == 410:
            raise _Gone(_detail(body))
        if response.status != 200:
            raise KeyspreadError(response.status, _detail(body))
        return body, response.getheader("X-Keyspread-Log")

    def _request(self, method, path, body, timeout, headers=None):
        conn = self._connect(timeout)
        try:
            headers = dict(self._headers, **{"Content-Type": "application/json"}, **(headers or {}))
            conn.request(method, self._prefix + path, json.dumps(body), headers=headers)
            response = conn.getresponse()
            answer = response.read()
            if response.status >= 300:
                raise KeyspreadError(response.status, _detail(answer))
            return answer
        finally:
            conn.close()


def _same_log(ours, header, body):
    """Whether an answer naming ``header`` and ``body`` (either may be ``None``) belongs to
    the log ``ours``. A server older than log names names none, and neither does a table it
    made."""
    named = [name for name in (header, body) if name is not None]
    if not named:
        return ours is None
    return all(name == ours for name in named)


def _detail(body):
    """A problem+json answer's ``detail`` (else its text)."""
    try:
        problem = json.loads(body)
        return problem.get("detail") or problem.get("title") or body.decode(errors="replace")
    except (ValueError, AttributeError):
        return body.decode(errors="replace")


def _close(conn):
    """Closes ``conn``, if any."""
    if conn is not None:
        conn.close()



