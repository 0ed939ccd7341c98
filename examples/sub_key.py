#!/usr/bin/env python3
"""Which of an account's keys a record uses, by its sub-key (the code README.md shows).

Usage: sub_key.py FANOUT SUB_KEY...   prints each sub-key's index in 0..FANOUT, one a line.
Standard library only.
"""

import hashlib


def jump(key, buckets):
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * 2**31 / ((key >> 33) + 1))
    return b


def sub_key_index(sub_key, fanout):
    digest = hashlib.md5(sub_key.encode("utf-8")).digest()
    return jump(int.from_bytes(digest[:8], "big"), fanout)


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 2 or not sys.argv[1].isdigit() or not 1 <= int(sys.argv[1]) <= 1024:
        sys.exit(__doc__)
    for sub_key in sys.argv[2:]:
        print(sub_key_index(sub_key, int(sys.argv[1])))
