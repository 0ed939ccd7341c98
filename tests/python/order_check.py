"""The order proofs' checker: records handed on, per (account, sub-key), in the order they
were numbered, each once, none missing."""

import json


def check_order(handed, produced):
    """`handed`: the records handed on, in order, each `{"data": json, "shard"}` with `a`
    (account), `s` (sub-key) and `n` (its number) in its data; `produced`: every
    ((account, sub-key), n) written. Counts inversions (a number after a higher one of the
    same key), duplicates and lost records, with up to three examples of inversions."""
    last, seen = {}, set()
    inversions = duplicates = 0
    examples = []
    for record in handed:
        data = json.loads(record["data"])
        key, n = (data["a"], data["s"]), data["n"]
        if (key, n) in seen:
            duplicates += 1
            continue
        seen.add((key, n))
        if key in last and n < last[key]:
            inversions += 1
            if len(examples) < 3:
                examples.append(f"{key}: {n} after {last[key]} (shard {record['shard']})")
        last[key] = max(n, last.get(key, -1))
    return {"inversions": inversions, "duplicates": duplicates, "lost": len(set(produced) - seen),
            "inversion_examples": examples}
