"""Which of an account's keys a record uses, by its sub-key (DESIGN.md, "Hot accounts").

The index is Lamping and Veach's jump consistent hash of the first 8 bytes of the sub-key's
MD5 (big-endian), so that growing an account's fanout moves as few sub-keys as it can.
"""

import hashlib

_MASK = 2**64 - 1


def jump(key, buckets):
    """The bucket in ``0..buckets`` of the 64-bit ``key`` (the division in f64, as the
    server computes it)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK
        j = int((b + 1) * 2147483648 / ((key >> 33) + 1))
    return b


def sub_key_index(sub_key, fanout):
    """The index of the key, among ``fanout``, that records of ``sub_key`` go under."""
    if fanout == 1:
        return 0
    digest = hashlib.md5(sub_key.encode("utf-8")).digest()
    return jump(int.from_bytes(digest[:8], "big"), fanout)
