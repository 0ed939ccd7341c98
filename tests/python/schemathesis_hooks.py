"""Rules of keyspread's API that OpenAPI cannot state, for schemathesis' positive cases.

The document states every bound on a single value that the handlers enforce (lengths,
patterns, minimum and maximum, minItems and maxItems; src/http/openapi.rs tests that they are
there). What is left are rules it cannot state, each in the operation's description and
each brought about here by the function named, with why the document cannot say it:

- GET /shard-of: exactly one of `hash_key`, `account`, `partition_key`, and exactly one of
  `shards`, `stream` (`shard_of`); GET /distribution and GET /rebalance/preview: exactly one
  of `shards`, `stream` (`map_params`). OpenAPI describes each query parameter on its own: it
  has no way to relate two of them.
- `hash_key` is at most 2^128 - 1 (`shard_of`). The pattern bounds its digits (1 to 39), not
  its value; a regular expression for "at most 340282366920938463463374607431768211455" needs
  a branch per digit and would be unreadable in the document and in generated clients.
- An account id is at most 256 bytes of UTF-8 (`fit`, in `account_path`, `shard_of`,
  `list_keys` and `batch`). `maxLength` counts characters, not bytes: 256 characters may be 1,024 bytes.
- POST /keys/batch: no account twice (`batch`). `uniqueItems` compares whole items: two items
  with the same account and different weights are unique to it.
- PUT /streams/{name}: the open shards of `Shards` tile [0, 2^128) with no gap or overlap,
  and exactly one of `Shards`, `shard_count` is given (`put_stream`). Tiling relates the
  values of different items, which no JSON Schema keyword does. "Exactly one" could be a
  `oneOf` of two `required` lists, which utoipa's derive does not produce; the description
  says it.

A request that the schema allows but that breaks one of them is rightly refused (400 or 422),
which the positive_data_acceptance check would report. So positive cases are brought within
these rules before they are sent; negative cases are sent as generated. One more hook keeps
shard counts small in every case, for run time only (see `sizes`). Loaded by
tests/api/schemathesis.rs through SCHEMATHESIS_HOOKS.
"""

import schemathesis
from schemathesis import GenerationMode

KEYSPACE = 2**128
ACCOUNT_BYTES = 256
# Maps of up to 100,000 shards are valid, but each answer about one runs to tens of MB,
# which the debug-build server and the response validator take seconds over, and a
# registered stream is repeated by every later GET /streams. Valid counts are lowered to
# these sizes; out-of-range ones are sent as generated. (tests/api covers the limits.)
LIMIT = 100_000
MAX_SHARDS = 1_000
MAX_STREAM_SHARDS = 64


def exactly_one(params, names, default):
    """Keeps the first of `names` that is present; adds `default` when none is."""
    present = [n for n in names if params.get(n) is not None]
    for extra in present[1:]:
        del params[extra]
    if not present:
        name, value = default
        params[name] = value


def shard_of(case):
    query = case.query
    exactly_one(query, ["hash_key", "account", "partition_key"], ("partition_key", "k"))
    if "account" in query:
        query["account"] = fit(query["account"])
    exactly_one(query, ["shards", "stream"], ("shards", 4))
    key = query.get("hash_key")
    if isinstance(key, str) and key.isdigit():
        query["hash_key"] = str(int(key) % KEYSPACE)


def map_params(case):
    exactly_one(case.query, ["shards", "stream"], ("shards", 4))


def cap(params, name, most):
    """Lowers a valid count above `most` to `most`; invalid ones stay as generated."""
    # Some phases hand over query values already written as strings.
    value = params.get(name)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and most < value <= LIMIT:
        params[name] = most


def fit(account):
    """The longest prefix of `account` of at most 256 bytes of UTF-8."""
    if not isinstance(account, str):
        return account
    while len(account.encode()) > ACCOUNT_BYTES:
        account = account[:-1]
    return account


def account_path(case):
    if "account" in (case.path_parameters or {}):
        case.path_parameters["account"] = fit(case.path_parameters["account"])


def list_keys(case):
    if "after" in case.query:
        case.query["after"] = fit(case.query["after"])


def batch(case):
    if not isinstance(case.body, dict):
        return
    seen, items = set(), []
    for item in case.body["accounts"]:
        item["account"] = fit(item["account"])
        if item["account"] not in seen:
            seen.add(item["account"])
            items.append(item)
    case.body["accounts"] = items


def put_stream(case):
    # Generated list-shards output never tiles [0, 2^128) (tests/api/streams.rs covers real
    # maps): positive cases ask for a uniform map of as many shards instead.
    body = case.body
    if not isinstance(body, dict):
        return
    shards = body.pop("Shards", None)
    if body.get("shard_count") is None:
        body["shard_count"] = max(len(shards or []), 1)


RULES = {
    ("GET", "/shard-of"): shard_of,
    ("GET", "/distribution"): map_params,
    ("GET", "/rebalance/preview"): map_params,
    ("GET", "/keys"): list_keys,
    ("POST", "/keys/batch"): batch,
    ("GET", "/keys/{account}"): account_path,
    ("POST", "/keys/{account}"): account_path,
    ("PATCH", "/keys/{account}"): account_path,
    ("DELETE", "/keys/{account}"): account_path,
    ("PUT", "/streams/{name}"): put_stream,
}


def sizes(case):
    """Every case, valid or not: shard counts within the limit are kept small."""
    for params in (case.query, case.body):
        if isinstance(params, dict):
            for name in ("shards", "target"):
                cap(params, name, MAX_SHARDS)
            cap(params, "shard_count", MAX_STREAM_SHARDS)


@schemathesis.hook
def map_case(ctx, case):
    if case.query is None:
        case.query = {}
    sizes(case)
    meta = case._meta
    rule = RULES.get((case.method.upper(), case.path))
    if rule is not None and meta is not None and meta.generation.mode == GenerationMode.POSITIVE:
        rule(case)
    return case
