"""The table a mirror holds: every account's keys, built from a snapshot and the log.

The fold follows the server's (src/registry/follow.rs): every event changes one key of one
account; a staged move or a key a raised fanout adds takes over at its ``switch_at``, by the
local clock. Entries are immutable, so a lookup never sees an account half changed.
"""

import calendar
import functools
import re


class Unapplicable(Exception):
    """An event the table cannot apply exactly: the mirror must take a new snapshot."""


_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:([Zz])|([+-])(\d\d):(\d\d))$"
)


def unix_ms(stamp):
    """An RFC 3339 time as Unix milliseconds."""
    m = _RFC3339.match(stamp)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    seconds = calendar.timegm(tuple(int(g) for g in m.group(1, 2, 3, 4, 5, 6)))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        seconds -= offset if m.group(9) == "+" else -offset
    millis = int((m.group(7) or "0")[:3].ljust(3, "0"))
    return seconds * 1000 + millis


@functools.lru_cache(maxsize=4096)
def key_weights(weight, fanout):
    """Each key's share of an account's weight: key ``i`` carries ``weight // fanout``, plus
    1 when ``i < weight % fanout`` (one shared tuple per pair: most accounts weigh alike)."""
    share, rest = divmod(weight, fanout)
    return tuple(share + (1 if i < rest else 0) for i in range(fanout))


class Switch:
    """Key ``index`` of an account keeps ``old`` (``None``: the key is new and not sent
    yet) until ``at`` (Unix milliseconds)."""

    __slots__ = ("at", "index", "old")

    def __init__(self, index, old, at):
        self.index, self.old, self.at = index, old, at

    def __eq__(self, other):
        return (self.index, self.old, self.at) == (other.index, other.old, other.at)

    def __repr__(self):
        return f"Switch({self.index}, {self.old!r}, {self.at})"


class Entry:
    """One account: its keys by index as the table holds them (a switching key's new
    value), their weights, and the switches still pending."""

    __slots__ = ("created_at", "keys", "max_fanout", "switches", "until", "weights")

    def __init__(self, keys, weights, created_at, max_fanout=None, switches=()):
        self.keys = tuple(keys)
        self.weights = tuple(weights)
        self.created_at = created_at
        self.max_fanout = max_fanout
        self.switches = tuple(switches)
        # 0 when nothing switches: lookups then need no clock.
        self.until = max((s.at for s in self.switches), default=0)

    @property
    def weight(self):
        return sum(self.weights)

    def keys_at(self, now_ms):
        """The keys to send at ``now_ms``: each switching key's old value until its switch,
        and not yet the new keys of a raised fanout."""
        keys = list(self.keys)
        fanout = len(keys)
        for s in self.switches:
            if s.at > now_ms:
                if s.old is not None:
                    keys[s.index] = s.old
                else:
                    # New keys are the last ones; key 0 is never new.
                    fanout = min(fanout, max(s.index, 1))
        del keys[fanout:]
        return keys

    def next_at(self, now_ms):
        """``(keys, switch_at_ms)`` of the nearest switch after ``now_ms``, or ``None``."""
        ahead = [s.at for s in self.switches if s.at > now_ms]
        if not ahead:
            return None
        first = min(ahead)
        return self.keys_at(first), first

    def replace(self, **changes):
        fields = {name: getattr(self, name) for name in self.__slots__ if name != "until"}
        fields.update(changes)
        return Entry(**fields)

    def __eq__(self, other):
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self):
        return f"Entry({self.keys}, {self.weights}, switches={self.switches})"


def entry_of(assignment):
    """An Assignment as ``GET /snapshot`` and ``POST /keys`` answer it (the keys in force
    at the server's clock, plus ``next`` while a switch is pending) as a table entry.

    ``next`` names only the nearest switch: an account with two pending switches at
    different times would lose the later one (a plan never moves a switching account).
    """
    now = [str(k) for k in assignment["hash_keys"]]
    nxt = assignment.get("next")
    keys, switches = now, []
    if nxt:
        at = unix_ms(nxt["switch_at"])
        keys = [str(k) for k in nxt["hash_keys"]]
        for i, key in enumerate(keys):
            if i >= len(now):
                switches.append(Switch(i, None, at))
            elif now[i] != key:
                switches.append(Switch(i, now[i], at))
    weights = key_weights(int(assignment["weight"]), len(keys))
    return Entry(keys, weights, assignment.get("created_at"), assignment.get("max_fanout"), switches)


class Batch:
    """Changes folded over a table without touching it: :meth:`commit` installs them all
    at once, so a lookup sees a batch of events whole or not at all."""

    def __init__(self, table):
        self.table = table
        self.changes = {}

    def get(self, account):
        if account in self.changes:
            return self.changes[account]
        return self.table.get(account)

    def put(self, account, entry):
        self.changes[account] = entry

    def commit(self):
        # One dict.update is one step for other threads; removed accounts are None first.
        self.table.update(self.changes)
        for account, entry in self.changes.items():
            if entry is None:
                self.table.pop(account, None)
        self.changes = {}


def _unstaged(switches, index):
    return [s for s in switches if s.index != index]


def apply(batch, event):
    """Applies one event of ``GET /events`` to ``batch``; raises :class:`Unapplicable`
    when the event does not fit the table (a key it does not hold). Kinds that change no
    key (streams, and kinds newer than this mirror) are skipped: a server that logs more
    never costs mirrors a snapshot."""
    kind = event.get("kind")
    fold = _FOLDS.get(kind)
    if fold is None:
        return
    account = event.get("account")
    if account is None:
        raise Unapplicable(f"event {event.get('id')}: {kind} without an account")
    try:
        fold(batch, account, batch.get(account), event)
    except (KeyError, TypeError, ValueError) as malformed:
        raise _mismatch(event, f"malformed ({malformed!r})") from malformed


def _mismatch(event, what):
    return Unapplicable(f"event {event.get('id')} ({event.get('kind')} of key "
                        f"{event.get('index', 0)} of {event.get('account')!r}): {what}")


def _allocate(batch, account, entry, event):
    index = event.get("index", 0)
    key = str(event["key_after"])
    weight = int(event.get("weight") or 1)
    if index == 0:
        max_fanout = entry.max_fanout if entry else None
        batch.put(account, Entry((key,), (weight,), event.get("at"), max_fanout))
        return
    if entry is None or len(entry.keys) != index:
        raise _mismatch(event, f"the mirror holds {len(entry.keys) if entry else 0} keys")
    switches = list(entry.switches)
    switch_at = event.get("switch_at")
    if switch_at is not None and unix_ms(switch_at) > unix_ms(event["at"]):
        switches.append(Switch(index, None, unix_ms(switch_at)))
    batch.put(account, entry.replace(keys=entry.keys + (key,), weights=entry.weights + (weight,),
                                     switches=switches))


def _release(batch, account, entry, event):
    if entry is None:
        return
    index = event.get("index", 0)
    if len(entry.keys) != index + 1 or entry.keys[index] != str(event.get("key_before")):
        raise _mismatch(event, f"the mirror holds {entry.keys}")
    if index == 0:
        batch.put(account, None)
        return
    batch.put(account, entry.replace(keys=entry.keys[:index], weights=entry.weights[:index],
                                     switches=_unstaged(entry.switches, index)))


def _move(batch, account, entry, event):
    index = event.get("index", 0)
    old = str(event.get("key_before"))
    if entry is None or index >= len(entry.keys) or entry.keys[index] != old:
        raise _mismatch(event, f"the mirror holds {entry.keys if entry else None}")
    keys = list(entry.keys)
    keys[index] = str(event["key_after"])
    switches = _unstaged(entry.switches, index)
    switch_at = unix_ms(event["switch_at"])
    if switch_at > unix_ms(event["at"]):
        switches.append(Switch(index, old, switch_at))
    batch.put(account, entry.replace(keys=keys, switches=switches))


def _reweight(batch, account, entry, event):
    if entry is None:
        return
    index = event.get("index", 0)
    if index >= len(entry.keys):
        raise _mismatch(event, f"the mirror holds {len(entry.keys)} keys")
    weights = list(entry.weights)
    weights[index] = int(event["weight"])
    batch.put(account, entry.replace(weights=weights))


def _max_fanout(batch, account, entry, event):
    if entry is not None:
        batch.put(account, entry.replace(max_fanout=event.get("max_fanout")))


_FOLDS = {
    "allocate": _allocate,
    "release": _release,
    "move": _move,
    "reweight": _reweight,
    "max_fanout": _max_fanout,
}
