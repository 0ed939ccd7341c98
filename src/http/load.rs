//! Observed load: the `load` entries heartbeats carry, producers' reports of what they
//! sent (`POST /load/producers`), and `GET /load`, a stream's load as the database holds
//! it now.

use std::collections::BTreeMap;
use std::ops::Bound;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem, in_time};
use super::extract::whole_number;
use super::idempotency;
use crate::AppState;
use crate::keyspace::{
    AccountId, HashKey, Keyspace, Limits, Rate, is_kinesis_name, suggested_fanout,
};
use crate::registry::{
    AccountReport, IgnoreReason, IgnoredLoad, KeyReport, LoadReport, MAX_REPORT_ACCOUNTS,
    MAX_WINDOW_MS, ProducerReport, ShardReport, Ticket,
};
use crate::store::Actor;
use crate::store::load::LoadSource;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(load))
}

/// `POST /load/producers`, under heartbeats' body limit: a report names as many keys as a
/// heartbeat's entry names accounts.
pub fn producers_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(producers))
}

/// What a worker read from one shard it holds since its last report.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LoadEntry {
    /// A shard of the stream's map.
    pub shard_id: String,
    /// The lease's epoch the worker read the shard at, as its heartbeat answered it.
    #[serde(deserialize_with = "whole_number::required")]
    pub epoch: u64,
    /// Milliseconds the report covers, 1..=3600000.
    #[schema(minimum = 1, maximum = 3_600_000)]
    #[serde(deserialize_with = "whole_number::required")]
    pub window_ms: u64,
    /// Records read in the window.
    #[serde(deserialize_with = "whole_number::required")]
    pub records: u64,
    /// Bytes of record data read in the window.
    #[serde(deserialize_with = "whole_number::required")]
    pub bytes: u64,
    /// The worker's top accounts of the shard by records (a record's account is its
    /// PartitionKey), at most 1,000; the rest counts in the shard's totals only.
    #[schema(max_items = 1000)]
    #[serde(default)]
    pub accounts: Vec<AccountEntry>,
}

/// One account's part of a load entry.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AccountEntry {
    #[schema(value_type = AccountId)]
    pub account: String,
    #[serde(deserialize_with = "whole_number::required")]
    pub records: u64,
    #[serde(deserialize_with = "whole_number::required")]
    pub bytes: u64,
}

super::extract::objects_only!(LoadEntry, AccountEntry);

/// `window_ms` of a report, checked: `at` names where it was.
fn window(at: &str, window_ms: u64) -> Result<u64, ApiError> {
    if (1..=MAX_WINDOW_MS).contains(&window_ms) {
        Ok(window_ms)
    } else {
        Err(ApiError::unprocessable(format!(
            "{at}window_ms must be between 1 and {MAX_WINDOW_MS} milliseconds, got {window_ms}"
        )))
    }
}

/// An account id of a report, checked: `at` names where it was.
fn account(at: impl std::fmt::Display, account: String) -> Result<String, ApiError> {
    match AccountId::parse(account) {
        Ok(account) => Ok(account.into_string()),
        Err(err) => Err(ApiError::unprocessable(format!("{at}.account: {err}"))),
    }
}

/// Checks what the database need not know to judge: windows, account counts and ids.
pub(super) fn reports(entries: Vec<LoadEntry>) -> Result<Vec<LoadReport>, ApiError> {
    entries
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let window_ms = window(&format!("load[{i}]."), e.window_ms)?;
            if e.accounts.len() > MAX_REPORT_ACCOUNTS {
                return Err(ApiError::unprocessable(format!(
                    "load[{i}].accounts may name at most {MAX_REPORT_ACCOUNTS} accounts (the top ones by records), got {}",
                    e.accounts.len()
                )));
            }
            let accounts = (e.accounts.into_iter().enumerate())
                .map(|(j, a)| {
                    Ok(AccountReport {
                        account: account(format_args!("load[{i}].accounts[{j}]"), a.account)?,
                        records: a.records,
                        bytes: a.bytes,
                    })
                })
                .collect::<Result<_, ApiError>>()?;
            Ok(LoadReport {
                epoch: e.epoch,
                read: ShardReport {
                    shard_id: e.shard_id,
                    window_ms,
                    records: e.records,
                    bytes: e.bytes,
                    accounts,
                },
            })
        })
        .collect()
}

/// What a producer sent since its last report.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ProducerLoad {
    /// The stream the records went to.
    #[schema(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub stream: String,
    /// The producer's id: 1 to 128 of `a-z A-Z 0-9 . _ : -`.
    #[schema(pattern = r"^[a-zA-Z0-9._:-]{1,128}$")]
    pub producer: String,
    /// The report's number, 0..=2^63-1: number each report above the last. A report
    /// numbered at or below the producer's highest counted was counted before (a retry of
    /// one whose answer was lost) and counts no more.
    #[schema(maximum = 9_223_372_036_854_775_807_i64)]
    #[serde(deserialize_with = "whole_number::required")]
    pub seq: u64,
    /// Milliseconds the report covers, 1..=3600000.
    #[schema(minimum = 1, maximum = 3_600_000)]
    #[serde(deserialize_with = "whole_number::required")]
    pub window_ms: u64,
    /// What it sent under each key, at most 1,000 (send more in several reports).
    #[schema(max_items = 1000)]
    pub keys: Vec<KeyEntry>,
}

/// What a producer sent under one key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct KeyEntry {
    #[schema(value_type = AccountId)]
    pub account: String,
    /// The ExplicitHashKey the records were sent with: it names their shard.
    #[schema(value_type = HashKey)]
    pub hash_key: String,
    /// Records sent in the window.
    #[serde(deserialize_with = "whole_number::required")]
    pub records: u64,
    /// Bytes of record data sent in the window.
    #[serde(deserialize_with = "whole_number::required")]
    pub bytes: u64,
}

super::extract::objects_only!(ProducerLoad, KeyEntry);

/// Whether a producer's report counted.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProducerLoadAnswer {
    /// True when counted now; false when a report of its producer numbered as high was
    /// counted before (this one counts no more).
    pub counted: bool,
}

/// Checks a producer's report as far as the stream's map is not needed: its producer id,
/// number, window, key count, accounts and keys.
fn producer_report(body: ProducerLoad, keyspace: Keyspace) -> Result<ProducerReport, ApiError> {
    if !super::leases::is_worker_id(&body.producer) {
        return Err(ApiError::unprocessable(format!(
            "producer {:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '.', '_', ':', '-'",
            super::clip(&body.producer)
        )));
    }
    let seq = i64::try_from(body.seq).map_err(|_| {
        ApiError::unprocessable(format!(
            "seq must be at most {}, got {}",
            i64::MAX,
            body.seq
        ))
    })?;
    let window_ms = window("", body.window_ms)?;
    if body.keys.len() > MAX_REPORT_ACCOUNTS {
        return Err(ApiError::unprocessable(format!(
            "keys may name at most {MAX_REPORT_ACCOUNTS} keys, got {}: send the rest in another report",
            body.keys.len()
        )));
    }
    let keys = (body.keys.into_iter().enumerate())
        .map(|(j, k)| {
            let hash_key = keyspace
                .parse(&k.hash_key)
                .map_err(|err| ApiError::unprocessable(format!("keys[{j}].hash_key: {err}")))?;
            Ok(KeyReport {
                account: account(format_args!("keys[{j}]"), k.account)?,
                hash_key,
                records: k.records,
                bytes: k.bytes,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(ProducerReport {
        producer: body.producer,
        seq,
        window_ms,
        keys,
    })
}

/// Report what a producer sent: records and bytes per account and key since its last
/// report.
///
/// Reports of many producers add up; each key's records count on the shard of the
/// stream's map its hash key falls in. A shard's figures in `GET /load` come from its
/// consumer's reports while they are current, else from producers'. Number reports upwards
/// per producer: one numbered at or below the producer's highest counted is answered
/// `counted: false` and counts no more, on every replica, so a report whose answer was
/// lost may be sent again as it was.
#[utoipa::path(
    post, path = "/load/producers", tag = "load",
    request_body = ProducerLoad,
    responses(
        (status = 200, description = "Counted now, or counted before", body = ProducerLoadAnswer),
        (status = 400, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 4 MiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid field (the detail names it, such as `keys[2].hash_key`): a stream name or producer id of the wrong form, a count that is not a whole number from 0, seq above 2^63-1, window_ms outside 1..=3600000, more than 1,000 keys, an invalid account id or hash key", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn producers(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Json(body): Json<ProducerLoad>,
) -> Result<Json<ProducerLoadAnswer>, ApiError> {
    if !is_kinesis_name(&body.stream) {
        return Err(ApiError::unprocessable(format!(
            "stream name {:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '.', '-'",
            super::clip(&body.stream)
        )));
    }
    let stream = body.stream.clone();
    let report = producer_report(body, state.registry.keyspace())?;
    idempotency::tell_json(&ticket, |counted: bool| {
        (StatusCode::OK, Json(ProducerLoadAnswer { counted }))
    });
    let counted = in_time(
        &state,
        &ticket,
        (state.registry).report_producer_load(&stream, report, &actor, &ticket),
    )
    .await?;
    Ok(Json(ProducerLoadAnswer { counted }))
}

/// Why a load entry was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IgnoredReason {
    /// The worker does not hold the shard's lease (another worker does, or nobody).
    NotHeld,
    /// The worker holds the lease at another epoch than the entry names.
    StaleEpoch,
    /// The worker's lease is being revoked.
    Revoking,
    /// The stream's map no longer lists the shard (the worker read it before the change).
    NotListed,
}

/// A load entry that was not counted.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct IgnoredLoadBody {
    pub shard_id: String,
    pub epoch: u64,
    pub reason: IgnoredReason,
}

impl From<IgnoredLoad> for IgnoredLoadBody {
    fn from(i: IgnoredLoad) -> Self {
        IgnoredLoadBody {
            shard_id: i.shard_id,
            epoch: i.epoch,
            reason: match i.reason {
                IgnoreReason::NotHeld => IgnoredReason::NotHeld,
                IgnoreReason::StaleEpoch => IgnoredReason::StaleEpoch,
                IgnoreReason::Revoking => IgnoredReason::Revoking,
                IgnoreReason::NotListed => IgnoredReason::NotListed,
            },
        }
    }
}

/// A stream, and paging through its accounts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LoadParams {
    /// The stream.
    #[param(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub stream: String,
    /// `account` (the default): every account once, in byte order of their names, paged
    /// with `after`, whatever reports come between the pages. `load`: the `limit`
    /// heaviest accounts, heaviest first, in one page (`next` is null; `after` is refused).
    #[param(value_type = Option<LoadOrder>, inline)]
    pub order: Option<String>,
    /// Start after this cursor (the `next` of the previous page).
    pub after: Option<String>,
    /// Accounts per page, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// How `GET /load` lists a stream's accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadOrder {
    /// Every account once, by account, paged: an order no report changes.
    Account,
    /// The heaviest accounts, heaviest first, in one page: loads move with every report,
    /// so this order is never paged.
    Load,
}

/// Whose reports a shard's figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadSourceBody {
    /// The consumer worker holding its lease, on its heartbeats (while current).
    Consumers,
    /// Producers, by the hash keys they sent records under.
    Producers,
}

impl From<LoadSource> for LoadSourceBody {
    fn from(source: LoadSource) -> Self {
        match source {
            LoadSource::Consumers => LoadSourceBody::Consumers,
            LoadSource::Producers => LoadSourceBody::Producers,
        }
    }
}

/// A shard's observed load.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardLoadBody {
    pub shard_id: String,
    pub records_per_s: f64,
    pub bytes_per_s: f64,
    /// The larger of records/s and bytes/s over the shard's write limits.
    pub utilisation: f64,
    /// Whose reports the figures come from: its consumer's while they are current (up to
    /// two of their windows after the last), else producers'; null when nobody reported it.
    pub source: Option<LoadSourceBody>,
}

/// An account's observed load, summed over the shards it was read from.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AccountLoadBody {
    #[schema(value_type = AccountId)]
    pub account: String,
    pub records_per_s: f64,
    pub bytes_per_s: f64,
    /// Its rates' share of one shard's write limits.
    pub load: f64,
    /// How many keys it holds; null when it has none.
    pub fanout: Option<u32>,
    /// The most keys it opted in to spread over; null when it did not opt in.
    pub max_fanout: Option<u32>,
    /// ⌈load ÷ the hot-account share⌉ when above 1: the fanout that keeps each of its keys
    /// within that share of a shard; null otherwise.
    pub suggested_fanout: Option<u32>,
}

/// A stream's observed load, decayed to `at`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LoadPage {
    pub stream: String,
    /// The database's clock the rates are decayed to (RFC 3339, milliseconds, UTC).
    #[schema(format = DateTime)]
    pub at: String,
    /// Its open shards, in key order.
    pub shards: Vec<ShardLoadBody>,
    /// The busiest shard's utilisation over the mean; 0 when no shard has load.
    pub max_over_mean: f64,
    /// By account (byte order of their names), or heaviest first with `order=load`.
    pub accounts: Vec<AccountLoadBody>,
    /// Pass as `after` for the next page of accounts; null on the last page (and always
    /// with `order=load`).
    pub next: Option<String>,
}

/// Most accounts one page holds.
const MAX_PAGE: u32 = 1000;

/// Where a page of accounts ended, as `next` gives it: the last account's name in hex, so
/// that the cursor stays opaque and any text that is not one is told apart.
fn encode_cursor(account: &str) -> String {
    account.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The account a cursor [`encode_cursor`] wrote ends at.
fn decode_cursor(text: &str) -> Option<String> {
    if text.is_empty() || !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// `order` as `GET /load` takes it.
fn load_order(order: Option<&str>, after: Option<&str>) -> Result<LoadOrder, ApiError> {
    match (order.unwrap_or("account"), after) {
        ("account", _) => Ok(LoadOrder::Account),
        ("load", None) => Ok(LoadOrder::Load),
        ("load", Some(_)) => Err(ApiError::bad_request(
            "order=load answers one page, the heaviest accounts: page through every account \
             with order=account",
        )),
        (other, _) => Err(ApiError::bad_request(format!(
            "order must be account or load, got {:?}",
            super::clip(other)
        ))),
    }
}

/// An account's load, name and rate, as a page lists it.
type Rated = (f64, String, Rate);

/// The page of `sums` (every account's rate, by account) `order` asks for, after the
/// account `after`, and the cursor of the next page when another follows.
fn page_of(
    sums: BTreeMap<String, Rate>,
    order: LoadOrder,
    after: Option<String>,
    limit: usize,
    limits: Limits,
) -> (Vec<Rated>, Option<String>) {
    let rated = |(account, rate): (String, Rate)| (rate.utilisation(limits), account, rate);
    match order {
        LoadOrder::Account => {
            let from = after.map_or(Bound::Unbounded, Bound::Excluded);
            let mut page: Vec<Rated> = (sums.range((from, Bound::Unbounded)))
                .take(limit + 1)
                .map(|(account, rate)| rated((account.clone(), *rate)))
                .collect();
            let more = page.len() > limit;
            page.truncate(limit);
            let next = more.then(|| page.last().map(|(_, a, _)| encode_cursor(a)));
            (page, next.flatten())
        }
        LoadOrder::Load => {
            let mut ranked: Vec<Rated> = sums.into_iter().map(rated).collect();
            ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            ranked.truncate(limit);
            (ranked, None)
        }
    }
}

/// A stream's observed load: per shard rates and utilisation, and its accounts, paged by
/// account (or the heaviest, with `order=load`).
///
/// Every replica answers the same: rates are read from the database and decayed to its
/// clock. Rates come from the `load` entries of consumer workers' heartbeats, or, for a
/// shard without current ones, from producers' reports (each shard says which); each shard
/// keeps its 2,000 heaviest accounts. A walk of the pages lists every account exactly
/// once, whatever reports come between them.
#[utoipa::path(
    get, path = "/load", tag = "load",
    params(LoadParams),
    responses(
        (status = 200, description = "The stream's load now", body = LoadPage),
        (status = 400, description = "Invalid stream name, order, cursor or paging parameters", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn load(
    State(state): State<AppState>,
    Query(params): Query<LoadParams>,
) -> Result<Json<LoadPage>, ApiError> {
    if !is_kinesis_name(&params.stream) {
        return Err(ApiError::bad_request(format!(
            "stream name {:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '.', '-'",
            super::clip(&params.stream)
        )));
    }
    let limit = super::page_limit(params.limit, MAX_PAGE)? as usize;
    let order = load_order(params.order.as_deref(), params.after.as_deref())?;
    let after = match params.after.as_deref() {
        None => None,
        Some(text) => Some(decode_cursor(text).ok_or_else(|| {
            ApiError::bad_request("after is not a cursor GET /load answered: pass its `next`")
        })?),
    };
    let (load, now) = state.registry.stream_load_at(&params.stream).await?;
    let config = state.registry.load_config();
    let hl = config.half_life_ms;
    let utilisations: Vec<f64> = load.shards.iter().map(|s| s.utilisation).collect();
    let total: f64 = utilisations.iter().sum();
    let max_over_mean = if total > 0.0 {
        utilisations.iter().copied().fold(0.0, f64::max) * utilisations.len() as f64 / total
    } else {
        0.0
    };
    let mut sums: BTreeMap<String, Rate> = BTreeMap::new();
    for a in load.accounts {
        let sum = sums.entry(a.account).or_insert(Rate {
            at_ms: now,
            ..Rate::default()
        });
        *sum = sum.plus(a.rate, now, hl);
    }
    let (page, next) = page_of(sums, order, after, limit, config.limits);
    let share = config.hot_account_share;
    let accounts = page
        .into_iter()
        .map(|(load, account, rate)| {
            let suggested = suggested_fanout(load, share);
            let held = state.registry.lookup(&account);
            AccountLoadBody {
                fanout: held.as_ref().map(|a| a.fanout()),
                max_fanout: held.and_then(|a| a.max_fanout),
                suggested_fanout: (suggested > 1).then_some(suggested),
                records_per_s: rate.records_per_s,
                bytes_per_s: rate.bytes_per_s,
                load,
                account,
            }
        })
        .collect();
    Ok(Json(LoadPage {
        stream: params.stream,
        at: super::timestamp_ms(now),
        shards: load
            .shards
            .into_iter()
            .map(|s| ShardLoadBody {
                shard_id: s.shard_id,
                records_per_s: s.rate.records_per_s,
                bytes_per_s: s.rate.bytes_per_s,
                utilisation: s.utilisation,
                source: s.source.map(LoadSourceBody::from),
            })
            .collect(),
        max_over_mean,
        accounts,
        next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_cursor_reads_back_as_it_was_written(account in "\\PC{1,40}") {
            prop_assert_eq!(decode_cursor(&encode_cursor(&account)), Some(account));
        }
    }

    #[test]
    fn text_that_is_not_a_cursor_is_told_apart() {
        for text in [
            "",
            "nonsense",
            "6",
            "ff",
            "1732000000000.3ff0000000000000.6162",
        ] {
            assert_eq!(decode_cursor(text), None, "{text:?}");
        }
    }
}
