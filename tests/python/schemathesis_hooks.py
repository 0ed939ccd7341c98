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
- GET /shard-of: `index` and `sub_key` choose among an `account`'s keys, so they come with
  `account` only, not both, and `index` is below the account's fanout (`shard_of`): two
  parameters again, and the fanout is the account's, not the document's.
- POST /keys/{account}, POST /keys/batch items, PATCH /keys/{account}: the weight is at least
  the fanout (each key carries at least 1), and a PATCH gives at least one of them
  (`shares`). A bound relating two properties is again beyond JSON Schema; "at least one"
  is an `anyOf` of `required` lists that utoipa's derive does not produce.
- PUT /streams/{name}: the open shards of `Shards` tile [0, 2^128) with no gap or overlap,
  and exactly one of `Shards`, `shard_count` is given, or neither with `"watch": true`
  (`put_stream`). Tiling relates the values of different items, which no JSON Schema
  keyword does. "Exactly one" could be a `oneOf` of `required` lists, which utoipa's
  derive does not produce; the description says it.

- GET /rebalance/preview with `by=load`: it plans over a registered stream's observed load,
  so it takes `stream`, not `shards` (`preview`): two parameters again.
- PATCH /keys/{account}: `max_fanout` is at least the account's fanout (`reweight`), which
  is the account's, not the document's.
- PUT /streams/{name}/workers/{worker}: a load entry names a shard of the stream's map and
  the lease the worker holds on it (`heartbeat`): the stream's state, not the document's.
- GET /load: `after` is a cursor an earlier page answered (`load_page`), opaque by design.
- GET /events: `after` is a position in the server's log, at most its newest event
  (`log_position`; past it is 410): the log's state, not the document's.
- Every change: an `Idempotency-Key` names one request, so sent with another request it is
  422, and while its first request is in flight, 409 (`fresh_key`): uniqueness across
  requests, which no schema of one request states.

A request that the schema allows but that breaks one of them is rightly refused (400 or 422),
which the positive_data_acceptance check would report. So positive cases are brought within
these rules before they are sent; negative cases are sent as generated. One more hook keeps
shard counts, fanouts and long-polls' waits small in every case, for run time only (see
`sizes`). Loaded by
tests/api/schemathesis.rs through SCHEMATHESIS_HOOKS.
"""

import uuid

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
MAX_FANOUT = 1024
# Fanouts up to 1024 are valid, but every registered map then re-plans tens of thousands
# of keys in the debug build; valid fanouts are lowered to this, for run time only.
MOST_KEYS = 16
# GET /events waits up to `wait_s` (at most 60) when nothing follows `after`; valid waits
# are lowered to this, for run time only (tests/api/long_poll.rs covers the waits).
MAX_WAIT_S = 60
MOST_WAIT_S = 0


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
    if "account" not in query:
        query.pop("index", None)
        query.pop("sub_key", None)
    elif query.get("index") is not None:
        # Every account has key 0; which others it has is its own.
        query["index"] = 0
        query.pop("sub_key", None)
    key = query.get("hash_key")
    if isinstance(key, str) and key.isdigit():
        query["hash_key"] = str(int(key) % KEYSPACE)


def shares(body, patch=False):
    """At least one of weight and fanout in a PATCH; the weight at least the fanout."""
    if not isinstance(body, dict):
        return
    if patch and body.get("weight") is None and body.get("fanout") is None:
        body["weight"] = 1
    fanout, weight = body.get("fanout"), body.get("weight")
    number = (int, float)
    if isinstance(fanout, number):
        if weight is None and patch:
            body["weight"] = fanout
        elif isinstance(weight, number) and weight < fanout:
            body["weight"] = fanout
    elif patch and isinstance(weight, number) and weight < MAX_FANOUT:
        # A new weight alone must be at least the account's fanout, whatever it is.
        body["weight"] = MAX_FANOUT


def allocate(case):
    account_path(case)
    shares(case.body)


def reweight(case):
    account_path(case)
    shares(case.body, patch=True)
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("max_fanout"), (int, float)):
        # At least any fanout the account may have.
        body["max_fanout"] = MAX_FANOUT


def preview(case):
    map_params(case)
    if case.query.get("by") == "load":
        case.query.pop("shards", None)
        case.query.setdefault("stream", "s")


def heartbeat(case):
    if isinstance(case.body, dict) and case.body.get("load"):
        case.body["load"] = []


def load_page(case):
    case.query.pop("after", None)


def log_position(case):
    # The log's start is a position in every log.
    case.query.pop("after", None)


def map_params(case):
    exactly_one(case.query, ["shards", "stream"], ("shards", 4))


def page(case):
    """The page shows one map: `shards` or `stream`, or by default the primary stream."""
    present = [n for n in ("shards", "stream") if case.query.get(n) is not None]
    for extra in present[1:]:
        del case.query[extra]


def cap(params, name, most, limit=LIMIT):
    """Lowers a valid count above `most` to `most`; invalid ones stay as generated."""
    # Some phases hand over query values already written as strings.
    value = params.get(name)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and most < value <= limit:
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
            shares(item)
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
    # `"watch": true` takes no map and lists the stream in Kinesis, which this run has none
    # of (tests/api/watch.rs covers it): positive cases give the map instead.
    if body.get("watch"):
        del body["watch"]


RULES = {
    ("GET", "/shard-of"): shard_of,
    ("GET", "/distribution"): map_params,
    ("GET", "/rebalance/preview"): preview,
    ("GET", "/load"): load_page,
    ("GET", "/events"): log_position,
    ("PUT", "/streams/{name}/workers/{worker}"): heartbeat,
    ("GET", "/keys"): list_keys,
    ("POST", "/keys/batch"): batch,
    ("GET", "/keys/{account}"): account_path,
    ("POST", "/keys/{account}"): allocate,
    ("PATCH", "/keys/{account}"): reweight,
    ("DELETE", "/keys/{account}"): account_path,
    ("PUT", "/streams/{name}"): put_stream,
    ("GET", "/ui"): page,
}


def sizes(case):
    """Every case, valid or not: shard counts within the limit are kept small."""
    for params in (case.query, case.body):
        if isinstance(params, dict):
            for name in ("shards", "target"):
                cap(params, name, MAX_SHARDS)
            cap(params, "shard_count", MAX_STREAM_SHARDS)
            cap(params, "fanout", MOST_KEYS, MAX_FANOUT)
            cap(params, "wait_s", MOST_WAIT_S, MAX_WAIT_S)
    if isinstance(case.body, dict) and isinstance(case.body.get("accounts"), list):
        for item in case.body["accounts"]:
            if isinstance(item, dict):
                cap(item, "fanout", MOST_KEYS, MAX_FANOUT)


def fresh_key(case):
    """A key of its own for each request that sends one."""
    headers = case.headers or {}
    for name in list(headers):
        if name.lower() == "idempotency-key":
            headers[name] = uuid.uuid4().hex


@schemathesis.hook
def map_case(ctx, case):
    if case.query is None:
        case.query = {}
    sizes(case)
    meta = case._meta
    if meta is None or meta.generation.mode != GenerationMode.POSITIVE:
        return case
    rule = RULES.get((case.method.upper(), case.path))
    if rule is not None:
        rule(case)
    if case.method.upper() in ("POST", "PUT", "PATCH", "DELETE"):
        fresh_key(case)
    return case
