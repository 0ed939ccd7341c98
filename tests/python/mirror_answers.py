#!/usr/bin/env python3
"""A Python mirror of the server at URL, asked over standard input (for tests/api).

    mirror_answers.py URL

Prints `{"ready": EVENT_ID}` once the mirror holds its snapshot; then for each line of
account names read, one JSON line: each account's keys as the mirror answers them now (a
list, `null` when it holds none, `"stale"` when it refuses to answer), and `"snapshots"`.
Ends, closing the mirror, at the end of its input.
"""

import json
import sys

from keyspread_client import Mirror, Stale


def answer(mirror, account):
    """The keys ``mirror`` answers for ``account``, ``None``, or ``"stale"``."""
    try:
        keys = mirror.keys(account)
    except Stale:
        return "stale"
    return None if keys is None else list(keys)


def main():
    with Mirror(sys.argv[1], timeout=2.0) as mirror:
        print(json.dumps({"ready": mirror.event_id}), flush=True)
        for line in sys.stdin:
            answers = {account: answer(mirror, account) for account in line.split()}
            answers["snapshots"] = mirror.snapshots
            print(json.dumps(answers), flush=True)


if __name__ == "__main__":
    main()
