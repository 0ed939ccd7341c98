"""What a mirror handed out, counted per account and key by ``Mirror.record``, and reported
to ``POST /load/producers`` off the callers' path: every ``report_interval_s``, and once
more on close.

At most one cut report waits for the server at a time: a report the server did not answer
is sent again as it was (same numbers, so the server counts it once however often it
arrives), and what is recorded meanwhile adds up in the tally, so memory stays bounded by
the keys handed out, however long the server is away."""

import http.client
import re
import threading
import time

#: Most keys one report names: the server's cap (more go in several reports).
MAX_KEYS = 1000
#: Longest window one report may cover (the server's cap): a longer one is reported as its
#: last hour, at its average rate.
MAX_WINDOW_MS = 3_600_000

_PRODUCER_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def is_producer_id(text):
    """Whether ``text`` is a producer id the server takes: 1 to 128 of ``a-z A-Z 0-9 . _ : -``."""
    return isinstance(text, str) and _PRODUCER_ID.fullmatch(text) is not None


class Tally:
    """Records and bytes handed out per ``(account, key)`` since the last cut."""

    def __init__(self, monotonic=time.monotonic):
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._counts = {}
        self._since = monotonic()

    def count(self, account, key, size):
        """Counts one record of ``size`` bytes sent to ``account`` under ``key``."""
        with self._lock:
            sent = self._counts.get((account, key))
            if sent is None:
                self._counts[(account, key)] = [1, size]
            else:
                sent[0] += 1
                sent[1] += size

    def cut(self):
        """Takes the counts as report lines, and the milliseconds they cover (at most an
        hour, see :data:`MAX_WINDOW_MS`), leaving an empty tally from now."""
        with self._lock:
            now = self._monotonic()
            counts, self._counts = self._counts, {}
            since, self._since = self._since, now
        window_ms = max(1, int((now - since) * 1000))
        keep = min(1.0, MAX_WINDOW_MS / window_ms)
        keys = [{"account": account, "hash_key": key,
                 "records": int(records * keep), "bytes": int(size * keep)}
                for (account, key), (records, size) in counts.items()]
        return keys, min(window_ms, MAX_WINDOW_MS)


class Reporter:
    """Cuts reports from a :class:`Tally` and sends them with ``post(body)``, which answers
    the HTTP status or raises ``OSError`` / ``http.client.HTTPException`` when there is no
    answer."""

    def __init__(self, tally, producer, post, stream):
        self._tally, self._producer, self._post, self._stream = tally, producer, post, stream
        self._seq = 0
        self._unsent = []

    def report(self):
        """Sends what waits from before, then, if all of it was answered, what was recorded
        since."""
        if not self._send_unsent():
            return
        stream = self._stream()
        if stream is None:
            return  # no primary stream to report on yet: the counts keep adding up
        keys, window_ms = self._tally.cut()
        for start in range(0, len(keys), MAX_KEYS):
            # Numbers from the clock on: a producer id reused after a restart numbers
            # above its reports before.
            self._seq = max(self._seq + 1, int(time.time() * 1000))
            self._unsent.append({"stream": stream, "producer": self._producer,
                                 "seq": self._seq, "window_ms": window_ms,
                                 "keys": keys[start:start + MAX_KEYS]})
        self._send_unsent()

    def _send_unsent(self):
        """Sends the reports that wait, in order, until one gets no answer; answers whether
        none is left."""
        while self._unsent:
            try:
                status = self._post(self._unsent[0])
            except (OSError, http.client.HTTPException):
                return False
            if status in (408, 429) or status >= 500:
                return False
            # Answered 2xx (counted now or before), or refused for good (another 4xx).
            self._unsent.pop(0)
        return True
