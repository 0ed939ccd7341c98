//! `/keys`: allocate, look up, change (weight, fanout), release and list assignments.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem, in_time};
use super::extract::{IfNoneMatch, OptionalJson, whole_number};
use super::idempotency;
use crate::AppState;
use crate::keyspace::{self, AccountId, HashKey};
use crate::registry::{Allocated, NewAccount, Ticket, Update};
use crate::store::{self, Actor, MoveReason};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(allocate, lookup, reweight, release))
        .routes(routes!(list))
}

/// `POST /keys/batch`, apart because it takes larger bodies.
pub fn batch_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(allocate_batch))
}

/// Most accounts one batch may allocate.
pub const MAX_BATCH: usize = 10_000;

/// Most keys one batch may allocate, over all its accounts' fanouts: one transaction's
/// work and memory stay bounded (16 accounts of the largest fanout; about the work of the
/// largest batch of accounts of one key, which Postgres takes well within the 4 s bound).
pub const MAX_BATCH_KEYS: u64 = 16_384;

/// An account's hash keys.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    pub account: String,
    /// Send this as the record's `ExplicitHashKey`; with several keys, key 0
    /// (`hash_keys[0]`).
    pub hash_key: HashKey,
    /// Every key of the account, by index (`fanout` of them). A record whose order matters
    /// within a sub-key goes under `hash_keys[index]` with `index` the sub-key's jump hash
    /// (see the README's "Hot accounts"); any other record under any of them.
    pub hash_keys: Vec<HashKey>,
    /// How many keys the account holds, 1..=1024: the length of `hash_keys`. (While new
    /// keys of a fanout raised by load wait for their switch, the keys in force now; `next`
    /// lists them all.)
    #[schema(minimum = 1, maximum = 1024)]
    pub fanout: u32,
    /// The account's weight; key `i` carries ⌊weight/fanout⌋, plus 1 when
    /// `i < weight mod fanout`.
    pub weight: u64,
    /// When the account first got a key (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Only when the account opted in (`PATCH`): the most keys the load controller may
    /// raise its fanout to while it is hot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1, maximum = 1024)]
    pub max_fanout: Option<u32>,
    /// Only while a rebalance is moving one of the account's keys: the keys that take over
    /// at `switch_at`. Send `hash_keys` until then, these from then on (by your clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<NextKeys>,
}

/// The keys an account sends from the switch of a staged move on.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NextKeys {
    /// Key 0 from `switch_at` on (`hash_keys[0]`).
    pub hash_key: HashKey,
    /// Every key from `switch_at` on, by index.
    pub hash_keys: Vec<HashKey>,
    /// When these keys take over (RFC 3339, milliseconds, UTC).
    #[schema(format = DateTime)]
    pub switch_at: String,
}

impl Assignment {
    /// The assignment as producers must use it at `now` (Unix milliseconds).
    pub fn at(a: store::Assignment, now: i64) -> Self {
        let keys = a.keys_at(now);
        Assignment {
            hash_key: keys.keys.as_slice()[0],
            hash_keys: keys.keys.as_slice().to_vec(),
            fanout: keys.keys.len() as u32,
            account: a.account.into_string(),
            weight: a.weight,
            created_at: super::timestamp(a.created_at),
            max_fanout: a.max_fanout,
            next: keys.next.map(|next| NextKeys {
                hash_key: next.keys.as_slice()[0],
                hash_keys: next.keys.as_slice().to_vec(),
                switch_at: super::timestamp_ms(next.switch_at),
            }),
        }
    }
}

impl From<store::Assignment> for Assignment {
    /// The assignment as producers must use it now.
    fn from(a: store::Assignment) -> Self {
        Assignment::at(a, crate::registry::now_ms())
    }
}

/// [`Assignment`]'s JSON, borrowed from the registry's value rather than copied into
/// strings: the lookup route answers one on every request.
#[derive(Debug, Serialize)]
struct AssignmentRef<'a> {
    account: &'a str,
    hash_key: HashKey,
    hash_keys: &'a [HashKey],
    fanout: u32,
    weight: u64,
    created_at: super::Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_fanout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<NextRef<'a>>,
}

#[derive(Debug, Serialize)]
struct NextRef<'a> {
    hash_key: HashKey,
    hash_keys: &'a [HashKey],
    switch_at: super::TimestampMs,
}

impl<'a> AssignmentRef<'a> {
    /// `a` with the keys to send at some moment (as [`store::Assignment::keys_at`]
    /// answers them).
    fn new(a: &'a store::Assignment, keys: &'a store::KeysAt) -> Self {
        AssignmentRef {
            account: a.account.as_str(),
            hash_key: keys.keys.as_slice()[0],
            hash_keys: keys.keys.as_slice(),
            fanout: keys.keys.len() as u32,
            weight: a.weight,
            created_at: super::Timestamp(a.created_at),
            max_fanout: a.max_fanout,
            next: keys.next.as_ref().map(|next| NextRef {
                hash_key: next.keys.as_slice()[0],
                hash_keys: next.keys.as_slice(),
                switch_at: super::TimestampMs(next.switch_at),
            }),
        }
    }
}

/// Optional settings for a new assignment.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AllocateRequest {
    /// Relative load of the account, 1..=1000000 (default 1); balance compares weight sums.
    #[schema(minimum = 1, maximum = 1000000)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub weight: Option<u64>,
    /// How many keys the account holds, 1..=1024 (default 1), on distinct shards: for an
    /// account that produces more than one shard takes. Weight defaults to the fanout.
    #[schema(minimum = 1, maximum = 1024)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub fanout: Option<u64>,
}

/// A new weight for an account, a new fanout, a new cap on its fanout, or several (at
/// least one).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ReweightRequest {
    #[schema(minimum = 1, maximum = 1000000)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub weight: Option<u64>,
    /// Growing keeps keys `0..k` and adds the rest; shrinking releases the keys with
    /// index at or above the new fanout. At most `max_fanout` when one is set.
    #[schema(minimum = 1, maximum = 1024)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub fanout: Option<u64>,
    /// Opts in to the load controller's fanout: "my records may spread over up to this
    /// many keys by sub-key". While the account is hot the controller raises its fanout
    /// up to this, and lowers it again once it has cooled. 1..=1024, at least the fanout;
    /// null clears it.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1024)]
    #[serde(default, deserialize_with = "nullable_whole_number")]
    pub max_fanout: Option<Option<u64>>,
}

/// A field that may be absent (`None`), null (`Some(None)`) or a count.
fn nullable_whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<u64>>, D::Error> {
    whole_number::optional(d).map(Some)
}

/// Most assignments one page of `GET /keys` holds.
const MAX_PAGE: u32 = 1000;

/// Most keys one page of `GET /keys` holds over its accounts' fanouts (about 700 KB of
/// JSON): a page of hot accounts ends early, its `next` naming where to go on.
pub const MAX_PAGE_KEYS: u32 = 16_384;

/// Paging through assignments by account.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Start after this account (the `next` of the previous page).
    #[param(value_type = Option<AccountId>)]
    pub after: Option<String>,
    /// Page size, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// One page of assignments.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AssignmentPage {
    pub items: Vec<Assignment>,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<String>,
}

/// An account id in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AccountPath {
    /// The account.
    #[param(value_type = AccountId)]
    pub account: String,
}

fn account_id(raw: String) -> Result<AccountId, ApiError> {
    AccountId::parse(raw).map_err(ApiError::from)
}

/// Accounts to allocate together.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct BatchRequest {
    /// 1..=10000 distinct accounts.
    #[schema(min_items = 1, max_items = 10000)]
    pub accounts: Vec<BatchItem>,
}

/// One account of a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct BatchItem {
    #[schema(value_type = AccountId)]
    pub account: String,
    /// 1..=1000000, default the fanout.
    #[schema(minimum = 1, maximum = 1000000)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub weight: Option<u64>,
    /// 1..=1024, default 1.
    #[schema(minimum = 1, maximum = 1024)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub fanout: Option<u64>,
}

super::extract::objects_only!(AllocateRequest, ReweightRequest, BatchRequest, BatchItem);

/// The batch's assignments, in request order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchAnswer {
    pub items: Vec<Assignment>,
    /// How many accounts got a new key.
    pub created: usize,
    /// How many already had one (their assignment is answered unchanged).
    pub existing: usize,
}

/// Allocate hash keys for up to 10,000 accounts (16,384 keys over their fanouts) in one
/// transaction (idempotent).
#[utoipa::path(
    post, path = "/keys/batch", tag = "keys",
    request_body = BatchRequest,
    responses(
        (status = 200, description = "Every account's assignment, committed together", body = BatchAnswer),
        (status = 409, description = "The keyspace is full", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 4 MiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid, duplicate or too many accounts, or more than 16,384 keys in all (the detail names the first)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn allocate_batch(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Json(body): Json<BatchRequest>,
) -> Result<(StatusCode, Json<BatchAnswer>), ApiError> {
    let n = body.accounts.len();
    if !(1..=MAX_BATCH).contains(&n) {
        return Err(ApiError::unprocessable(format!(
            "a batch holds 1 to {MAX_BATCH} accounts, got {n}"
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut requests = Vec::with_capacity(n);
    let mut keys = 0u64;
    for (i, item) in body.accounts.into_iter().enumerate() {
        let bad = |e: keyspace::Error| ApiError::unprocessable(format!("accounts[{i}]: {e}"));
        let account = AccountId::parse(item.account).map_err(bad)?;
        let (weight, fanout) = weight_and_fanout(item.weight, item.fanout).map_err(bad)?;
        if !seen.insert(account.clone()) {
            return Err(ApiError::unprocessable(format!(
                "accounts[{i}]: {account} appears twice"
            )));
        }
        keys += u64::from(fanout);
        if keys > MAX_BATCH_KEYS {
            return Err(ApiError::unprocessable(format!(
                "accounts[{i}]: a batch holds at most {MAX_BATCH_KEYS} keys over all its \
                 accounts' fanouts; send the rest in another batch"
            )));
        }
        requests.push(NewAccount {
            account,
            weight,
            fanout,
            key: None,
        });
    }
    idempotency::tell_json(&ticket, batch_answer);
    let change = state.registry.allocate_many(requests, &actor, &ticket);
    Ok(batch_answer(in_time(&state, &ticket, change).await?))
}

/// A batch's answer: every account's assignment, and how many were new.
fn batch_answer(answers: Vec<Allocated>) -> (StatusCode, Json<BatchAnswer>) {
    let created = answers
        .iter()
        .filter(|a| matches!(a, Allocated::Created(_)))
        .count();
    let items: Vec<Assignment> = answers
        .into_iter()
        .map(|a| match a {
            Allocated::Created(a) | Allocated::Existing(a) => a.into(),
        })
        .collect();
    let body = BatchAnswer {
        existing: items.len() - created,
        created,
        items,
    };
    (StatusCode::OK, Json(body))
}

/// Allocate a hash key for an account (idempotent).
#[utoipa::path(
    post, path = "/keys/{account}", tag = "keys",
    params(AccountPath),
    request_body(content = Option<AllocateRequest>, description = "Optional (an empty body is fine); fanout defaults to 1, weight to the fanout"),
    responses(
        (status = 201, description = "New assignment, committed", body = Assignment),
        (status = 200, description = "The account already had this assignment", body = Assignment),
        (status = 400, description = "Invalid account id, or a body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The keyspace is full", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body, weight or fanout, or a weight below the fanout", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn allocate(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(AccountPath { account }): Path<AccountPath>,
    OptionalJson(body): OptionalJson<AllocateRequest>,
) -> Result<(StatusCode, Json<Assignment>), ApiError> {
    let account = account_id(account)?;
    let body = body.unwrap_or_default();
    let (weight, fanout) = weight_and_fanout(body.weight, body.fanout)?;
    idempotency::tell_json(&ticket, allocated);
    let change = (state.registry).allocate(account, weight, fanout, &actor, &ticket);
    Ok(allocated(in_time(&state, &ticket, change).await?))
}

/// An allocation's answer: 201 with a new assignment, 200 with the one it had.
fn allocated(a: Allocated) -> (StatusCode, Json<Assignment>) {
    match a {
        Allocated::Created(a) => (StatusCode::CREATED, Json(a.into())),
        Allocated::Existing(a) => (StatusCode::OK, Json(a.into())),
    }
}

/// Look up an account's hash key.
///
/// Answers carry a strong `ETag` and the configured `Cache-Control`; a request whose
/// `If-None-Match` holds the current tag is answered 304 with no body.
#[utoipa::path(
    get, path = "/keys/{account}", tag = "keys",
    params(
        AccountPath,
        // Optional, yet never null: a header is there or not (utoipa makes an Option
        // in a header nullable, which generated Rust clients cannot compile).
        ("If-None-Match" = Option<String>, Header, nullable = false,
            description = "ETag of a cached answer"),
    ),
    responses(
        (status = 200, description = "The account's assignment", body = Assignment,
            headers(("ETag" = String, description = "Changes whenever the assignment does"),
                    ("Cache-Control" = String, description = "As configured (--lookup-cache-control)"))),
        (status = 304, description = "The cached answer with this ETag is still current",
            headers(("ETag" = String), ("Cache-Control" = String))),
        (status = 400, description = "Invalid account id", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The account has no hash key", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn lookup(
    State(state): State<AppState>,
    Path(AccountPath { account }): Path<AccountPath>,
    cached: IfNoneMatch,
) -> Result<Response, ApiError> {
    let account = account_id(account)?;
    state
        .registry
        .vouch(std::time::Duration::from_secs(
            state.lookup_cache.lifetime(),
        ))
        .await?;
    let a = state
        .registry
        .lookup_id(account)
        .map_err(|account| ApiError::not_found(format!("account {account} has no hash key")))?;
    let now = crate::registry::now_ms();
    let keys = a.keys_at(now);
    let etag = etag(&a, &keys);
    let fresh = cached.matches(etag.to_str().expect("ascii tag"));
    let cache_control = match &keys.next {
        // No cache may keep the answer past the switch.
        Some(next) => state
            .lookup_cache
            .until(((next.switch_at - now) / 1000) as u64),
        None => state.lookup_cache.header().clone(),
    };
    let validators = [(header::ETAG, etag), (header::CACHE_CONTROL, cache_control)];
    Ok(if fresh {
        (StatusCode::NOT_MODIFIED, validators).into_response()
    } else {
        (validators, Json(AssignmentRef::new(&a, &keys))).into_response()
    })
}

/// A strong entity tag for what a lookup answers, nothing else: an account with several
/// keys, or with a switch ahead, adds a digest of all its keys (and of the switch). Hex
/// digits written by hand: this is on every lookup.
fn etag(a: &store::Assignment, at: &store::KeysAt) -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let keys = at.keys.as_slice();
    let digest = (keys.len() > 1 || at.next.is_some()).then(|| {
        use md5::{Digest, Md5};
        let mut md5 = Md5::new();
        for key in keys {
            md5.update(key.to_be_bytes());
        }
        if let Some(next) = &at.next {
            md5.update(b"next");
            md5.update(next.switch_at.to_be_bytes());
            for key in next.keys.as_slice() {
                md5.update(key.to_be_bytes());
            }
        }
        u128::from_be_bytes(md5.finalize().into())
    });
    let fields = [
        (Some(keys[0].0), 32),
        (Some(u128::from(a.weight)), 16),
        (Some(u128::from(a.created_at as u64)), 16),
        (digest, 32),
    ];
    let mut tag = [b'"'; 1 + 32 + 16 + 16 + 32 + 1];
    let mut at = 1;
    for (value, digits) in fields {
        let Some(value) = value else { continue };
        for nibble in (0..digits).rev() {
            tag[at] = HEX[((value >> (4 * nibble)) & 0xf) as usize];
            at += 1;
        }
    }
    tag[at] = b'"';
    HeaderValue::from_bytes(&tag[..=at]).expect("quotes and hex digits")
}

/// A request's weight and fanout, checked: fanout defaults to 1, weight to the fanout,
/// and the weight must be at least the fanout (each key carries at least 1).
fn weight_and_fanout(
    weight: Option<u64>,
    fanout: Option<u64>,
) -> Result<(u64, u32), keyspace::Error> {
    let fanout = keyspace::check_fanout(fanout.unwrap_or(1))?;
    let weight = keyspace::check_weight(weight.unwrap_or(u64::from(fanout)))?;
    keyspace::check_shares(weight, fanout)?;
    Ok((weight, fanout))
}

/// Change an account's weight, its fanout, or both; key `i` stays for every `i` below
/// both fanouts.
#[utoipa::path(
    patch, path = "/keys/{account}", tag = "keys",
    params(AccountPath),
    request_body = ReweightRequest,
    responses(
        (status = 200, description = "The updated assignment", body = Assignment),
        (status = 400, description = "Invalid account id, or a body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The account has no hash key", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body, weight, fanout or max_fanout, none given, a weight below the fanout, or a fanout above max_fanout", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn reweight(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(AccountPath { account }): Path<AccountPath>,
    Json(body): Json<ReweightRequest>,
) -> Result<Json<Assignment>, ApiError> {
    let account = account_id(account)?;
    if body.weight.is_none() && body.fanout.is_none() && body.max_fanout.is_none() {
        return Err(ApiError::unprocessable(
            "give a weight, a fanout, or both, and/or a max_fanout".to_owned(),
        ));
    }
    let max_fanout = match body.max_fanout {
        Some(Some(cap)) if !(1..=keyspace::MAX_FANOUT as u64).contains(&cap) => {
            return Err(ApiError::unprocessable(format!(
                "max_fanout must be between 1 and {}, got {cap}",
                keyspace::MAX_FANOUT
            )));
        }
        cap => cap.map(|cap| cap.map(|c| c as u32)),
    };
    let change = Update {
        weight: body.weight.map(keyspace::check_weight).transpose()?,
        fanout: body.fanout.map(keyspace::check_fanout).transpose()?,
        max_fanout,
        reason: MoveReason::Admin,
    };
    idempotency::tell_json(&ticket, |a: store::Assignment| {
        (StatusCode::OK, Json(Assignment::from(a)))
    });
    let change = state.registry.update(account, change, &actor, &ticket);
    Ok(Json(in_time(&state, &ticket, change).await?.into()))
}

/// Release an account's hash key.
#[utoipa::path(
    delete, path = "/keys/{account}", tag = "keys",
    params(AccountPath),
    responses(
        (status = 204, description = "Released; the key may be handed out again"),
        (status = 400, description = "Invalid account id", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The account has no hash key", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn release(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(AccountPath { account }): Path<AccountPath>,
) -> Result<StatusCode, ApiError> {
    let account = account_id(account)?;
    idempotency::tell(&ticket, |_: &store::Assignment| {
        idempotency::empty(StatusCode::NO_CONTENT)
    });
    let change = state.registry.release(account, &actor, &ticket);
    in_time(&state, &ticket, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List assignments, paged by account. A page holds at most 16,384 keys over its accounts'
/// fanouts: with hot accounts it may hold fewer accounts than `limit`, and `next` says
/// where the following page starts.
#[utoipa::path(
    get, path = "/keys", tag = "keys", operation_id = "list_keys",
    params(ListParams),
    responses(
        (status = 200, description = "One page, ordered by account", body = AssignmentPage),
        (status = 400, description = "Invalid paging parameters", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list(
    State(state): State<AppState>,
    Query(params): Query<ListParams>,
) -> Result<Json<AssignmentPage>, ApiError> {
    let limit = super::page_limit(params.limit, MAX_PAGE)?;
    // A cursor is an account id; other text (a NUL) may not even compare on Postgres.
    let after = params.after.map(account_id).transpose()?;
    // One extra row tells whether another page follows; so does a page cut short by the
    // bound on keys.
    let (mut rows, cut) = state
        .registry
        .list(
            after.as_ref().map(AccountId::as_str),
            limit + 1,
            MAX_PAGE_KEYS,
        )
        .await?;
    let next = if cut || rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|a| a.account.to_string())
    } else {
        None
    };
    Ok(Json(AssignmentPage {
        items: rows.into_iter().map(Assignment::from).collect(),
        next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn lookups_answer_the_same_json_as_the_assignment_type(
            account in "\\PC{1,40}",
            key: u128,
            weight in 1u64..=1_000_000,
            created_at in -100_000_000_000_000i64..300_000_000_000_000,
        ) {
            let Ok(account) = AccountId::parse(account) else {
                return Ok(());
            };
            let a = store::Assignment { account, hash_keys: store::HashKeys::One(HashKey(key)), weight, created_at, switching: Vec::new(), max_fanout: None };
            let keys = a.keys_at(0);
            prop_assert_eq!(
                serde_json::to_string(&AssignmentRef::new(&a, &keys)).unwrap(),
                serde_json::to_string(&Assignment::at(a, 0)).unwrap()
            );
        }
    }
}
