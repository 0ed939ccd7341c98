"""keyspread's table in the producer.

``Mirror(url)`` holds every account's Kinesis ExplicitHashKeys in memory and follows the
server's event log, so lookups cost no round trip and go on while the server is away
(until the snapshot's ``max_age_s`` passes without a sync: then they raise ``Stale``).

    from keyspread_client import Mirror

    with Mirror("http://127.0.0.1:8080") as mirror:
        keys = mirror.keys("acme") or mirror.allocate("acme")
        key = mirror.key_for("acme", "order-17")   # the sub-key's key, for accounts with several
        key = mirror.record("acme", "order-17", len(data))  # the same, counted for load reports
"""

from .mirror import KeyspreadError, Lookup, Mirror, Next, Stale
from .selector import jump, sub_key_index

__all__ = ["KeyspreadError", "Lookup", "Mirror", "Next", "Stale", "jump", "sub_key_index"]
