#!/usr/bin/env python3
"""Drives a live keyspread through the client openapi-python-client generated.

Usage: drive_client.py --client-dir DIR --base-url http://127.0.0.1:PORT

DIR holds the generated package `keyspread_client`. Every call goes through a
generated `sync_detailed`, so the status codes and bodies the server sends are
checked against what openapi/openapi.json promised. Prints one line per step;
exits 1 with the reason on the first mismatch.
"""

import argparse
import sys

# MD5("1") read as a big-endian integer, from DESIGN.md.
MD5_OF_1 = "261578874264819908609102035485573088411"
SPACE = 2**128


class Mismatch(Exception):
    """The server or the generated client did not do what the contract says."""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-dir", required=True, help="directory holding keyspread_client/")
    parser.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT of a running keyspread")
    return parser.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.client_dir)

# Generated names: if the document renames an operation or schema, this is
# where the client breaks, exactly as it would for a platform team.
from keyspread_client import Client  # noqa: E402
from keyspread_client.api.keys import allocate, list_, lookup, release  # noqa: E402
from keyspread_client.api.rebalance import apply, preview  # noqa: E402
from keyspread_client.api.shards import shard_of  # noqa: E402
from keyspread_client.errors import UnexpectedStatus  # noqa: E402
from keyspread_client.models import AllocateRequest, ApplyRequest, Assignment, Problem, RebalancePlan, ShardOf  # noqa: E402
from keyspread_client.types import UNSET  # noqa: E402


def step(message):
    print(f"ok  {message}", flush=True)


def expect(condition, message):
    if not condition:
        raise Mismatch(message)


def call(what, endpoint, status, parsed_type, *args, **kwargs):
    """Calls `endpoint.sync_detailed` and checks the status and the parsed body's type."""
    response = endpoint.sync_detailed(*args, client=CLIENT, **kwargs)
    body = response.content.decode(errors="replace")
    expect(
        response.status_code == status,
        f"{what}: expected HTTP {status}, got {int(response.status_code)}: {body}",
    )
    if parsed_type is not None:
        expect(
            isinstance(response.parsed, parsed_type),
            f"{what}: expected a {parsed_type.__name__}, the client parsed {response.parsed!r} from {body}",
        )
    return response


def expect_hash_key(what, value):
    expect(
        isinstance(value, str) and value.isdigit() and int(value) < SPACE,
        f"{what}: hash_key must be a decimal string below 2^128, got {value!r}",
    )


def check_assignment(what, assignment, account, weight):
    expect(assignment.account == account, f"{what}: account {assignment.account!r}, wanted {account!r}")
    expect_hash_key(what, assignment.hash_key)
    expect(assignment.weight == weight, f"{what}: weight {assignment.weight!r}, wanted {weight}")
    expect(assignment.created_at is not None, f"{what}: created_at missing")


def allocate_twice(account, weight, body):
    """POST /keys/{account}: 201 the first time, 200 and the same key after."""
    label = "no body" if body is UNSET else f"body {body.to_dict()}"
    first = call(f"allocate {account} ({label})", allocate, 201, Assignment, account, body=body).parsed
    check_assignment(f"allocate {account}", first, account, weight)
    step(f"allocate {account} ({label}) -> 201 hash_key={first.hash_key} weight={first.weight}")
    again = call(f"allocate {account} again", allocate, 200, Assignment, account, body=body).parsed
    expect(
        again.hash_key == first.hash_key,
        f"allocate {account} again: hash_key {again.hash_key}, wanted the first answer {first.hash_key}",
    )
    step(f"allocate {account} again -> 200 same hash_key")
    return first


def check_lookup(assignment):
    found = call(f"lookup {assignment.account}", lookup, 200, Assignment, assignment.account).parsed
    expect(
        found.to_dict() == assignment.to_dict(),
        f"lookup {assignment.account}: got {found.to_dict()}, allocate said {assignment.to_dict()}",
    )
    step(f"lookup {assignment.account} -> 200 same Assignment")


def check_list(assignments):
    """GET /keys?limit=1, then follow `next` until it is null."""
    want = sorted(a.account for a in assignments)
    seen = []
    after = UNSET
    for _ in range(len(want) + 1):
        page = call(f"list after={after!r}", list_, 200, None, after=after, limit=1).parsed
        expect(len(page.items) <= 1, f"list limit=1: got {len(page.items)} items")
        seen += [item.account for item in page.items]
        if page.next_ is None or page.next_ is UNSET:
            break
        after = page.next_
    expect(seen == want, f"list: paging with limit=1 gave {seen}, wanted {want}")
    step(f"list limit=1 paged through {seen}")


def uniform_shard(hash_key, shards):
    """Index of the shard that owns hash_key in a uniform map of `shards` (DESIGN.md)."""
    return min(int(hash_key) // (SPACE // shards), shards - 1)


def check_shard_of(assignment):
    got = call("shard-of hash_key", shard_of, 200, None, hash_key=assignment.hash_key, shards=4).parsed
    index = uniform_shard(assignment.hash_key, 4)
    expect(got.hash_key == assignment.hash_key, f"shard-of: hash_key {got.hash_key}, sent {assignment.hash_key}")
    expect(got.shard_index == index, f"shard-of: shard_index {got.shard_index}, wanted {index}")
    expect(got.shard_id == f"shardId-{index:012d}", f"shard-of: shard_id {got.shard_id!r}")
    start, end = int(got.starting_hash_key), int(got.ending_hash_key)
    expect(start <= int(got.hash_key) <= end, f"shard-of: {got.hash_key} outside [{start}, {end}]")
    step(f"shard-of hash_key={assignment.hash_key} shards=4 -> {got.shard_id}")

    got = call("shard-of partition_key", shard_of, 200, None, partition_key="1", shards=2).parsed
    expect(got.hash_key == MD5_OF_1, f"shard-of partition_key=1: hash_key {got.hash_key}, wanted {MD5_OF_1}")
    expect(got.shard_index == 1, f"shard-of partition_key=1 shards=2: shard_index {got.shard_index}, wanted 1")
    step(f"shard-of partition_key=1 shards=2 -> hash_key={got.hash_key} shard_index=1")


def check_rebalance(accounts):
    plan = call("rebalance preview", preview, 200, None, shards=4).parsed
    expect(plan.plan_id, f"rebalance preview: empty plan_id {plan.plan_id!r}")
    expect(plan.before.accounts == len(accounts), f"rebalance preview: before.accounts {plan.before.accounts}")
    step(f"rebalance preview shards=4 -> plan {plan.plan_id}, {len(plan.moves)} moves")

    applied = call("rebalance apply", apply, 200, None, body=ApplyRequest(plan_id=plan.plan_id)).parsed
    step(f"rebalance apply plan {plan.plan_id} -> 200")
    for move in plan.moves:
        now = call(f"lookup {move.account} after rebalance", lookup, 200, Assignment, move.account).parsed
        expect(now.hash_key == move.to, f"rebalance: {move.account} holds {now.hash_key}, plan moved it to {move.to}")
    return applied


def check_release(account):
    response = call(f"release {account}", release, 204, None, account)
    expect(not response.content, f"release {account}: 204 with a body {response.content!r}")
    step(f"release {account} -> 204")

    response = call(f"lookup {account} after release", lookup, 404, Problem, account)
    problem = response.parsed
    content_type = response.headers.get("content-type", "")
    expect(
        content_type.startswith("application/problem+json"),
        f"lookup {account} after release: content-type {content_type!r}, wanted application/problem+json",
    )
    expect(problem.status == 404, f"lookup {account} after release: problem status {problem.status}")
    expect(problem.title and problem.detail, f"lookup {account} after release: problem {problem.to_dict()}")
    step(f"lookup {account} after release -> 404 problem: {problem.detail}")


def main():
    acme = allocate_twice("acme", 1, UNSET)
    globex = allocate_twice("globex", 3, AllocateRequest(weight=3))
    check_lookup(acme)
    check_lookup(globex)
    check_list([acme, globex])
    check_shard_of(acme)
    check_rebalance([acme, globex])
    check_release("acme")


CLIENT = Client(base_url=ARGS.base_url, raise_on_unexpected_status=True, httpx_args={"trust_env": False})

if __name__ == "__main__":
    try:
        main()
    except UnexpectedStatus as err:
        print(f"FAIL undocumented status {err.status_code}: {err.content.decode(errors='replace')}")
        sys.exit(1)
    except Mismatch as err:
        print(f"FAIL {err}")
        sys.exit(1)
    print("all steps passed")
