#!/usr/bin/env python3
"""Drives a live keyspread through the client openapi-python-client generated.

Usage: drive_client.py --client-dir DIR --base-url http://127.0.0.1:PORT

DIR holds the generated package `keyspread_api`. Every call goes through a
generated `sync_detailed`, so the status codes and bodies the server sends are
checked against what openapi/openapi.json promised. Prints one line per step;
exits 1 after listing every mismatch.
"""

import argparse
import datetime
import hashlib
import os
import sys
import time

# MD5("1") read as a big-endian integer, from DESIGN.md.
MD5_OF_1 = "261578874264819908609102035485573088411"
SPACE = 2**128
SHARDS = 4


class Mismatch(Exception):
    """The server or the generated client did not do what the contract says."""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-dir", required=True, help="directory holding keyspread_api/")
    parser.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT of a running keyspread")
    return parser.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.client_dir)

# Generated names: if the document renames an operation or schema, this is
# where the client breaks, exactly as it would for a platform team.
from keyspread_api import AuthenticatedClient, Client  # noqa: E402
from keyspread_api.api.keys import allocate, list_keys, lookup, release, reweight  # noqa: E402
from keyspread_api.api.rebalance import apply, preview  # noqa: E402
from keyspread_api.api.leases import checkpoint, heartbeat, leases, leave  # noqa: E402
from keyspread_api.api.shards import shard_of  # noqa: E402
from keyspread_api.api.streams import put_stream  # noqa: E402
from keyspread_api.errors import UnexpectedStatus  # noqa: E402
from keyspread_api.models import (  # noqa: E402
    AllocateRequest,
    ApplyRequest,
    Assignment,
    AssignmentPage,
    CheckpointBody,
    CheckpointRequest,
    HeartbeatRequest,
    LeasesBody,
    OwnLeaseState,
    PutStream,
    ShardLeaseState,
    StreamChange,
    WorkerBody,
    Problem,
    RebalancePlan,
    ReweightRequest,
    ShardOf,
)
from keyspread_api.types import UNSET, Unset  # noqa: E402

# Plain Client: on loopback with no token configured, mutations need no auth. With
# KEYSPREAD_TOKEN, every call carries it (a server with closed reads wants it on reads too).
if os.environ.get("KEYSPREAD_TOKEN"):
    CLIENT = AuthenticatedClient(base_url=ARGS.base_url, token=os.environ["KEYSPREAD_TOKEN"],
                                 raise_on_unexpected_status=True, httpx_args={"trust_env": False})
else:
    CLIENT = Client(base_url=ARGS.base_url, raise_on_unexpected_status=True,
                    httpx_args={"trust_env": False})
FAILURES = []


def step(message):
    print(f"ok    {message}", flush=True)


def expect(condition, message):
    if not condition:
        raise Mismatch(message)


def call(what, endpoint, status, parsed_type, *args, **kwargs):
    """Calls `endpoint.sync_detailed`; checks the status and the parsed body's type."""
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


def uniform_shard(hash_key, shards):
    """Index of the shard owning hash_key in a uniform map of `shards` (DESIGN.md)."""
    return min(int(hash_key) // (SPACE // shards), shards - 1)


def check_assignment(what, assignment, account, weight):
    expect(assignment.account == account, f"{what}: account {assignment.account!r}, wanted {account!r}")
    key = assignment.hash_key
    expect(
        isinstance(key, str) and key.isdigit() and int(key) < SPACE,
        f"{what}: hash_key must be a decimal string below 2^128, got {key!r}",
    )
    expect(assignment.weight == weight, f"{what}: weight {assignment.weight!r}, wanted {weight}")
    expect(assignment.created_at is not None, f"{what}: created_at missing")


def allocate_twice(account, weight, body):
    """POST /keys/{account}: 201 the first time, 200 and the same key after."""
    label = "no body" if body is UNSET else f"body {body.to_dict()}"
    what = f"allocate {account} ({label})"
    first = call(what, allocate, 201, Assignment, account, body=body).parsed
    check_assignment(what, first, account, weight)
    step(f"{what} -> 201 hash_key={first.hash_key} weight={first.weight}")
    again = call(f"{what} again", allocate, 200, Assignment, account, body=body).parsed
    expect(
        again.to_dict() == first.to_dict(),
        f"{what} again: got {again.to_dict()}, the first answer was {first.to_dict()}",
    )
    step(f"{what} again -> 200 same Assignment")
    return first


def allocate_without_body(account):
    """The plain `allocate.sync_detailed(account, client=...)` call a caller writes first.

    DESIGN.md says the body is optional. If this fails, the failure is recorded
    and the account is allocated with `{}` so the later steps still run.
    """
    try:
        return allocate_twice(account, 1, UNSET)
    except (Mismatch, TypeError) as err:
        fail(f"allocate {account} (no body): {type(err).__name__}: {err}")
        return allocate_twice(account, 1, AllocateRequest())


def check_lookup(assignment):
    found = call(f"lookup {assignment.account}", lookup, 200, Assignment, assignment.account).parsed
    expect(
        found.to_dict() == assignment.to_dict(),
        f"lookup {assignment.account}: got {found.to_dict()}, allocate said {assignment.to_dict()}",
    )
    step(f"lookup {assignment.account} -> 200 same Assignment")


def check_list(assignments):
    """GET /keys?limit=1, then follow `next` as `after` until it is null."""
    want = sorted(a.account for a in assignments)
    seen = []
    after = UNSET
    for _ in range(len(want) + 1):
        page = call(f"list after={after!r} limit=1", list_keys, 200, AssignmentPage, after=after, limit=1).parsed
        expect(len(page.items) <= 1, f"list limit=1: got {len(page.items)} items")
        seen += [item.account for item in page.items]
        if page.next_ is None or page.next_ is UNSET:
            break
        after = page.next_
    expect(seen == want, f"list: paging with limit=1 gave {seen}, wanted {want}")
    step(f"list limit=1, following next -> {seen}")


def check_shard_of(assignment):
    key = assignment.hash_key
    index = uniform_shard(key, SHARDS)
    got = call("shard-of hash_key", shard_of, 200, ShardOf, hash_key=key, shards=SHARDS).parsed
    expect(got.hash_key == key, f"shard-of: hash_key {got.hash_key}, sent {key}")
    expect(got.shard_index == index, f"shard-of: shard_index {got.shard_index}, wanted {index}")
    expect(got.shard_id == f"shardId-{index:012d}", f"shard-of: shard_id {got.shard_id!r}")
    start, end = int(got.starting_hash_key), int(got.ending_hash_key)
    expect(start <= int(key) <= end, f"shard-of: {key} outside [{start}, {end}]")
    step(f"shard-of hash_key={key} shards={SHARDS} -> {got.shard_id} [{start}, {end}]")

    by_account = call("shard-of account", shard_of, 200, ShardOf, account=assignment.account, shards=SHARDS).parsed
    expect(
        by_account.to_dict() == got.to_dict(),
        f"shard-of account={assignment.account}: {by_account.to_dict()}, by its hash_key {got.to_dict()}",
    )
    step(f"shard-of account={assignment.account} shards={SHARDS} -> {by_account.shard_id}")

    got = call("shard-of partition_key", shard_of, 200, ShardOf, partition_key="1", shards=2).parsed
    expect(got.hash_key == MD5_OF_1, f"shard-of partition_key=1: hash_key {got.hash_key}, wanted {MD5_OF_1}")
    expect(got.shard_index == 1, f"shard-of partition_key=1 shards=2: shard_index {got.shard_index}, wanted 1")
    step(f"shard-of partition_key=1 shards=2 -> hash_key={got.hash_key} shard_index=1")


def crowd_shard_of(assignment):
    """Leaves `assignment`'s shard holding more accounts than its share, so a plan must move some."""
    crowded = uniform_shard(assignment.hash_key, SHARDS)
    helpers = {}
    for i in range(6):
        name = f"helper-{i}"
        helpers[name] = call(f"allocate {name}", allocate, 201, Assignment, name, body=AllocateRequest()).parsed
    # Released only after all are allocated: a freed key is the next one handed out.
    kept = 0
    for name, helper in helpers.items():
        if uniform_shard(helper.hash_key, SHARDS) == crowded:
            kept += 1
        else:
            call(f"release {name}", release, 204, None, name)
    expect(kept > 0, f"rebalance setup: none of 6 helpers landed on shard {crowded}")
    step(f"allocated 6 helpers, released those off shard {crowded}; it holds {kept + 1} accounts")
    return crowded


def check_rebalance(assignment):
    crowded = crowd_shard_of(assignment)
    plan = call(f"rebalance preview shards={SHARDS}", preview, 200, RebalancePlan, shards=SHARDS).parsed
    expect(plan.plan_id, f"rebalance preview: empty plan_id {plan.plan_id!r}")
    expect(plan.moves, f"rebalance preview: no moves although shard {crowded} is over cap {plan.cap}")
    expect(plan.after.max_ <= plan.cap < plan.before.max_, f"rebalance preview: {plan.to_dict()}")
    for move in plan.moves:
        expect(
            move.from_shard == crowded == uniform_shard(move.from_, SHARDS)
            and move.to_shard == uniform_shard(move.to, SHARDS) != crowded,
            f"rebalance preview: move {move.to_dict()} does not leave shard {crowded}",
        )
    step(f"rebalance preview shards={SHARDS} -> plan {plan.plan_id}: {len(plan.moves)} move(s) off shard {crowded}")

    body = ApplyRequest(plan_id=plan.plan_id, switch_after_s=2)
    applied = call("rebalance apply", apply, 200, RebalancePlan, body=body).parsed
    unstaged = [{k: v for k, v in m.to_dict().items() if k != "switch_at"} for m in applied.moves]
    expect(
        unstaged == [m.to_dict() for m in plan.moves],
        f"rebalance apply: applied {applied.to_dict()}, previewed {plan.to_dict()}",
    )
    switch_at = applied.switch_at
    expect(
        isinstance(switch_at, datetime.datetime) and all(m.switch_at == switch_at for m in applied.moves),
        f"rebalance apply: switch_at {switch_at!r} on the plan and each move",
    )
    for move in plan.moves:
        now = call(f"lookup {move.account} before the switch", lookup, 200, Assignment, move.account).parsed
        expect(
            now.hash_key == move.from_ and now.next_.hash_key == move.to and now.next_.switch_at == switch_at,
            f"rebalance: before {switch_at} {move.account} answers {now.to_dict()}, plan moves it {move.to_dict()}",
        )
    step(f"rebalance apply {plan.plan_id} -> 200; moved accounts answer their old keys and next until {switch_at}")
    time.sleep(max(0.0, (switch_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) + 0.05)
    for move in plan.moves:
        now = call(f"lookup {move.account} after the switch", lookup, 200, Assignment, move.account).parsed
        expect(
            now.hash_key == move.to and isinstance(now.next_, Unset),
            f"rebalance: after {switch_at} {move.account} answers {now.to_dict()}, plan moved it to {move.to}",
        )
    step("after switch_at, moved accounts answer their new keys")

    stale = call("rebalance apply again", apply, 409, Problem, body=body).parsed
    step(f"rebalance apply {plan.plan_id} again -> 409 problem: {stale.detail}")


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


def jump(key, buckets):
    """DESIGN.md's jump consistent hash, independently of the server's."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (1 << 31) / ((key >> 33) + 1))
    return b


def sub_key_index(sub_key, fanout):
    return jump(int.from_bytes(hashlib.md5(sub_key.encode()).digest()[:8], "big"), fanout)


def check_fanout():
    """A hot account: several keys, grown from the top, a record's key chosen by sub-key."""
    what = "allocate hot (fanout 4, weight 10)"
    hot = call(what, allocate, 201, Assignment, "hot", body=AllocateRequest(fanout=4, weight=10)).parsed
    expect(hot.fanout == 4 and len(hot.hash_keys) == 4, f"{what}: {hot.to_dict()}")
    expect(hot.hash_key == hot.hash_keys[0], f"{what}: hash_key is not hash_keys[0]: {hot.to_dict()}")
    quarters = sorted(uniform_shard(k, 4) for k in hot.hash_keys)
    expect(quarters == [0, 1, 2, 3], f"{what}: keys not on 4 distinct quarters: {quarters}")
    step(f"{what} -> 201 fanout=4, keys on quarters {quarters}")

    what = "reweight hot (fanout 6)"
    grown = call(what, reweight, 200, Assignment, "hot", body=ReweightRequest(fanout=6)).parsed
    expect(grown.hash_keys[:4] == hot.hash_keys and len(grown.hash_keys) == 6, f"{what}: {grown.to_dict()}")
    expect(grown.weight == 10, f"{what}: weight {grown.weight}, wanted 10")
    step(f"{what} -> 200, keys 0..4 kept, 2 added")

    for sub_key in ["order-1", "user-42", ""]:
        index = sub_key_index(sub_key, 6)
        got = call("shard-of sub_key", shard_of, 200, ShardOf, account="hot", sub_key=sub_key, shards=4).parsed
        expect(
            got.index == index and got.hash_key == grown.hash_keys[index],
            f"shard-of account=hot sub_key={sub_key!r}: {got.to_dict()}, wanted index {index}",
        )
    step("shard-of account=hot sub_key=... -> the key of the sub-key's jump hash")

    shrunk = call("reweight hot (fanout 2)", reweight, 200, Assignment, "hot", body=ReweightRequest(fanout=2)).parsed
    expect(shrunk.hash_keys == hot.hash_keys[:2], f"reweight hot (fanout 2): {shrunk.to_dict()}")
    check_lookup(shrunk)
    step("reweight hot (fanout 2) -> 200, keys 0..2 kept")


def check_leases():
    """A worker joins, a second one joins, the first hands two leases over (DESIGN.md)."""
    call("put stream readers", put_stream, 201, StreamChange, "readers", body=PutStream(shard_count=4))
    first = call("heartbeat w1", heartbeat, 200, WorkerBody, "readers", "w1", body=HeartbeatRequest(ttl_s=30)).parsed
    expect(
        [(lease.state, lease.epoch) for lease in first.leases] == [(OwnLeaseState.HELD, 1)] * 4,
        f"heartbeat w1: a lone worker holds every shard at epoch 1: {first.to_dict()}",
    )
    second = call("heartbeat w2", heartbeat, 200, WorkerBody, "readers", "w2").parsed
    expect(second.leases == [] and second.ttl_s == 30, f"heartbeat w2: nothing until w1 lets go: {second.to_dict()}")
    # Joins within a second of the last assignment are assigned together, after it.
    time.sleep(1.1)
    told = call("heartbeat w1 again", heartbeat, 200, WorkerBody, "readers", "w1").parsed
    going = [lease for lease in told.leases if lease.state == OwnLeaseState.REVOKING]
    # The shards carry the keys allocated above, so they weigh differently: w2's share
    # is one shard or more, by weight.
    expect(1 <= len(going) <= 3, f"heartbeat w1 again: some revoking: {told.to_dict()}")
    shard = going[0].shard_id
    done = call(
        "checkpoint while revoking", checkpoint, 200, CheckpointBody, "readers", shard,
        body=CheckpointRequest(worker="w1", epoch=1, sequence_number="4959"),
    ).parsed
    expect(done.checkpoint == "4959", f"checkpoint: {done.to_dict()}")
    step(f"heartbeat w1, w2, w1 -> 4 held, then {len(going)} revoking; checkpoint -> 200")

    call("heartbeat w1 (hands over)", heartbeat, 200, WorkerBody, "readers", "w1")
    taken = call("heartbeat w2 (takes)", heartbeat, 200, WorkerBody, "readers", "w2").parsed
    got = {lease.shard_id: lease for lease in taken.leases}
    expect(
        sorted(got) == sorted(lease.shard_id for lease in going)
        and got[shard].epoch == 2 and got[shard].checkpoint == "4959",
        f"heartbeat w2: the leases w1 gave up, at epoch 2, with w1's checkpoint: {taken.to_dict()}",
    )
    stale = call(
        "stale checkpoint", checkpoint, 409, Problem, "readers", shard,
        body=CheckpointRequest(worker="w1", epoch=1, sequence_number="4960"),
    ).parsed
    expect(stale.status == 409, f"stale checkpoint: {stale.to_dict()}")
    step("heartbeat w1, w2 -> handed over at epoch 2 with the checkpoint; w1's checkpoint -> 409")

    call("leave w1", leave, 204, None, "readers", "w1")
    call("leave w1 again", leave, 404, Problem, "readers", "w1")
    view = call("leases", leases, 200, LeasesBody, "readers").parsed
    expect(
        [w.worker for w in view.workers] == ["w2"]
        and all(s.owner == "w2" and s.state == ShardLeaseState.HELD for s in view.shards),
        f"leases after w1 left: {view.to_dict()}",
    )
    step("leave w1 -> 204, then 404; GET leases -> every shard w2's")


def fail(message):
    FAILURES.append(message)
    print(f"FAIL  {message}", flush=True)


def main():
    acme = allocate_without_body("acme")
    globex = allocate_twice("globex", 3, AllocateRequest(weight=3))
    check_lookup(acme)
    check_lookup(globex)
    check_list([acme, globex])
    check_shard_of(acme)
    check_rebalance(acme)
    check_release("acme")
    check_fanout()
    check_leases()


if __name__ == "__main__":
    try:
        main()
    except UnexpectedStatus as err:
        fail(f"undocumented status {err.status_code}: {err.content.decode(errors='replace')}")
    except Mismatch as err:
        fail(str(err))
    if FAILURES:
        print(f"{len(FAILURES)} mismatch(es) between the server, its OpenAPI document and DESIGN.md")
        sys.exit(1)
    print("all steps passed")
