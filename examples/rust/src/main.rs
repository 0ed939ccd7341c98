//! keyspread from Rust: a client progenitor generated from openapi/openapi-3.0.json (see
//! build.rs). It applies a rebalance, so a server it runs against sees keys move (staged,
//! 30 s ahead); every name it makes starts with one prefix, random unless given, so it runs
//! on a server that holds other accounts, as often as you like.
//!
//!     cargo run -- http://127.0.0.1:8080 [NAME_PREFIX]    # KEYSPREAD_TOKEN=... if set
//!
//! Prints one line per step; at the first answer that is not what the contract says, prints
//! one line saying what and why on stderr and exits 1.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::num::NonZeroU64;

use futures::TryStreamExt;
use keyspread::types::{
    AllocateRequest, ApplyRequest, Assignment, HeartbeatRequest, IdempotencyKey, OwnLeaseState,
    Problem, PutStream,
};
use keyspread::{ByteStream, Client, ClientInfo, Error, ResponseValue};

/// The generated client: `Client`, one method per operation, and `types` (some, such as
/// the problem types only the document's readers need, this driver never builds).
#[allow(dead_code)]
mod keyspread {
    include!(concat!(env!("OUT_DIR"), "/keyspread.rs"));
}

type Outcome<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Fails the run with `what` unless `condition` holds.
macro_rules! ensure {
    ($condition:expr, $($what:tt)+) => {
        if !$condition {
            return Err(format!($($what)+).into());
        }
    };
}

fn step(what: &str) {
    println!("ok    {what}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(base_url), prefix) = (args.next(), args.next()) else {
        eprintln!("usage: keyspread-rust-client BASE_URL [NAME_PREFIX]");
        std::process::exit(2);
    };
    // Six hex digits from the standard library's random hasher keys.
    let prefix = prefix.unwrap_or_else(|| {
        let random = RandomState::new().hash_one(std::process::id());
        format!("rs-{:06x}-", random & 0xff_ffff)
    });
    if let Err(error) = run(&base_url, &prefix).await {
        eprintln!("failed: {error}");
        std::process::exit(1);
    }
}

async fn run(base_url: &str, prefix: &str) -> Outcome {
    // On loopback with no token configured, mutations need no Authorization header.
    let mut http = reqwest::Client::builder();
    if let Ok(token) = std::env::var("KEYSPREAD_TOKEN") {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {token}").parse()?);
        http = http.default_headers(headers);
    }
    let client = Client::new_with_client(base_url, http.build()?);

    let hot = allocate_hot(&client, &format!("{prefix}hot")).await?;
    revalidate(&client, &hot).await?;
    sub_key(&client, &hot).await?;
    staged_rebalance(&client, prefix).await?;
    heartbeat(&client, prefix).await?;
    release(&client, &hot.account).await?;
    step("done");
    Ok(())
}

/// A fresh Idempotency-Key: 128 random bits from the standard library's hasher keys, in hex.
fn idempotency_key() -> Outcome<IdempotencyKey> {
    let (high, low) = (RandomState::new(), RandomState::new());
    let key = format!("{:016x}{:016x}", high.hash_one(1u8), low.hash_one(2u8));
    Ok(key.parse()?)
}

/// A hot account: three keys on distinct shards, one allocate call, sent with an
/// Idempotency-Key so a retry after a lost answer is answered, not applied, again.
async fn allocate_hot(client: &Client, account: &str) -> Outcome<Assignment> {
    let id = account.parse()?;
    let three = AllocateRequest {
        fanout: NonZeroU64::new(3),
        weight: None,
    };
    let key = idempotency_key()?;
    let made = answered(
        client,
        &format!("allocate {account}"),
        client.allocate(&id, Some(&key), &three),
    )
    .await?;
    ensure!(
        made.status() == 201,
        "allocate {account}: {}",
        made.status()
    );
    let hot = made.into_inner();
    ensure!(
        hot.fanout.get() == 3 && hot.hash_keys.len() == 3,
        "allocate: {hot:?}"
    );
    ensure!(
        hot.hash_key == hot.hash_keys[0],
        "allocate: hash_key is not hash_keys[0]"
    );
    let retried = answered(
        client,
        "allocate with the same key",
        client.allocate(&id, Some(&key), &three),
    )
    .await?;
    let replayed = retried.headers().get("idempotent-replayed");
    ensure!(
        retried.status() == 201 && replayed.is_some_and(|v| v == "true"),
        "allocate with the same key: {} without Idempotent-Replayed",
        retried.status()
    );
    ensure!(
        retried.hash_keys == hot.hash_keys,
        "allocate with the same key: other keys"
    );
    let again = answered(
        client,
        "allocate again",
        client.allocate(&id, None, &AllocateRequest::default()),
    )
    .await?;
    ensure!(again.status() == 200, "allocate again: {}", again.status());
    ensure!(
        again.hash_keys == hot.hash_keys,
        "allocate again: other keys"
    );
    let keys: Vec<&str> = hot.hash_keys.iter().map(|k| k.as_str()).collect();
    step(&format!(
        "allocate {account} fanout 3 -> 201, keys {}; sent again with its Idempotency-Key -> 201 replayed; again -> 200",
        keys.join(", ")
    ));
    Ok(hot)
}

/// Lookups carry an ETag; sending it back answers 304 while the keys hold.
async fn revalidate(client: &Client, hot: &Assignment) -> Outcome {
    let id = hot.account.parse()?;
    let first = answered(client, "lookup", client.lookup(&id, None)).await?;
    let etag = first.headers()["etag"].to_str()?.to_owned();
    ensure!(first.hash_keys == hot.hash_keys, "lookup: other keys");
    // progenitor models 2xx and 4xx/5xx answers only: a 304 comes back as unexpected.
    match client.lookup(&id, Some(&etag)).await {
        Err(Error::UnexpectedResponse(answer)) if answer.status() == 304 => {}
        other => return Err(format!("lookup If-None-Match: {other:?}").into()),
    }
    step(&format!(
        "lookup {} -> 200 ETag {etag}; with If-None-Match -> 304",
        hot.account
    ));
    Ok(())
}

/// Records of one sub-key stay in order under one of the account's keys.
async fn sub_key(client: &Client, hot: &Assignment) -> Outcome {
    let id = hot.account.parse()?;
    let shards = NonZeroU64::new(4);
    let call = client.shard_of(Some(&id), None, None, None, shards, None, Some("order-1"));
    let got = answered(client, "shard-of", call).await?.into_inner();
    // The jump hash of "order-1" over 3 keys is 2 (DESIGN.md's test vectors).
    ensure!(
        got.index == Some(2) && got.hash_key == hot.hash_keys[2],
        "shard-of: {got:?}"
    );
    let id = format!("shardId-{:012}", got.shard_index);
    ensure!(
        got.shard_id == id,
        "shard-of: {}, wanted {id}",
        got.shard_id
    );
    step(&format!(
        "shard-of account={} sub_key=order-1 shards=4 -> key 2 on {}",
        hot.account, got.shard_id
    ));
    Ok(())
}

/// Preview a rebalance onto 3 shards, apply it staged, and see `next` on a lookup.
async fn staged_rebalance(client: &Client, prefix: &str) -> Outcome {
    for i in 1..=6 {
        let account = format!("{prefix}{i}");
        let id = account.parse()?;
        let one = AllocateRequest::default();
        let call = client.allocate(&id, None, &one);
        let made = answered(client, &format!("allocate {account}"), call).await?;
        ensure!(
            made.status() == 201,
            "allocate {prefix}{i}: {}",
            made.status()
        );
    }
    // On a server that holds other accounts, 3 shards may already be even: the first shard
    // count whose plan moves something.
    let mut shards = 3;
    let plan = loop {
        let call = client.preview(None, NonZeroU64::new(shards), None);
        let plan = answered(client, "preview", call).await?.into_inner();
        if !plan.moves.is_empty() || shards == 64 {
            break plan;
        }
        shards += 1;
    };
    let Some(first) = plan.moves.first() else {
        return Err("preview: no shard count up to 64 needs a move".into());
    };
    ensure!(
        plan.switch_at.is_none(),
        "preview: a switch_at before any apply"
    );
    let moved = first.account.parse()?;
    let before = answered(client, "lookup", client.lookup(&moved, None)).await?;
    let etag = before.headers()["etag"].to_str()?.to_owned();
    step(&format!(
        "rebalance preview shards={shards} -> {} move(s), {} key {} first",
        plan.moves.len(),
        first.account,
        first.index
    ));

    let staged = ApplyRequest {
        plan_id: plan.plan_id.parse()?,
        switch_after_s: Some(30),
        replan: None,
    };
    let applied = answered(client, "apply", client.apply(None, &staged))
        .await?
        .into_inner();
    let Some(switch_at) = applied.switch_at else {
        return Err("apply: no switch_at".into());
    };
    ensure!(
        applied.moves.iter().all(|m| m.switch_at == Some(switch_at)),
        "apply: moves switch apart"
    );
    let ahead = (switch_at - chrono::Utc::now()).num_milliseconds();
    ensure!(
        (20_000..=31_000).contains(&ahead),
        "apply: switch_at {switch_at} is not 30 s ahead"
    );

    // The old tag no longer matches: the answer changed with the apply.
    let now = answered(client, "lookup", client.lookup(&moved, Some(&etag))).await?;
    let max_age = now.headers()["cache-control"].to_str()?.to_owned();
    let Some(next) = &now.next else {
        return Err(format!("lookup after apply: no next in {:?}", &*now).into());
    };
    let index = usize::try_from(first.index)?;
    ensure!(next.switch_at == switch_at, "lookup: next {next:?}");
    ensure!(
        now.hash_keys[index] == first.from && next.hash_keys[index] == first.to,
        "lookup: keys {:?}, move {first:?}",
        &*now
    );
    let seconds: u64 = max_age.trim_start_matches("max-age=").parse()?;
    ensure!(seconds <= 30, "lookup: {max_age} outlives the switch");
    step(&format!(
        "rebalance apply switch_after_s=30 -> 200; lookup {} -> next until {}",
        first.account,
        switch_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    ));
    Ok(())
}

/// A consumer worker joins a stream's group and is told which shards to read.
async fn heartbeat(client: &Client, prefix: &str) -> Outcome {
    let name = format!("{prefix}orders");
    let four = PutStream {
        shard_count: NonZeroU64::new(4),
        ..Default::default()
    };
    let put = answered(
        client,
        &format!("put stream {name}"),
        client.put_stream(&name.parse()?, None, &four),
    )
    .await?;
    ensure!(put.status() == 201, "put stream: {}", put.status());
    let worker = format!("{prefix}worker-1");
    let ttl = HeartbeatRequest {
        ttl_s: NonZeroU64::new(30),
        ..Default::default()
    };
    let (stream, member) = (name.parse()?, worker.parse()?);
    let call = client.heartbeat(&stream, &member, None, &ttl);
    let beat = answered(client, "heartbeat", call).await?.into_inner();
    let leases = &beat.leases;
    ensure!(leases.len() == 4, "heartbeat: {beat:?}");
    ensure!(
        leases
            .iter()
            .all(|l| l.state == OwnLeaseState::Held && l.epoch == 1 && l.checkpoint.is_none()),
        "heartbeat: {beat:?}"
    );
    ensure!(beat.expires_at > chrono::Utc::now(), "heartbeat: {beat:?}");
    let held: Vec<&str> = leases.iter().map(|l| l.shard_id.as_str()).collect();
    step(&format!(
        "heartbeat {worker} on {name} -> holds {}",
        held.join(", ")
    ));
    let left = answered(
        client,
        "leave",
        client.leave(&name.parse()?, &worker.parse()?, None),
    )
    .await?;
    ensure!(left.status() == 204, "leave: {}", left.status());
    step(&format!("leave {worker} -> 204"));
    Ok(())
}

async fn release(client: &Client, account: &str) -> Outcome {
    let id = account.parse()?;
    let gone = answered(client, &format!("release {account}"), client.release(&id, None)).await?;
    ensure!(gone.status() == 204, "release: {}", gone.status());
    let after = client.lookup(&id, None).await;
    let (status, detail) = match after {
        Err(Error::ErrorResponse(answer)) => {
            (answer.status(), problem(answer.into_inner()).await?.detail)
        }
        other => return Err(format!("lookup after release: {other:?}").into()),
    };
    ensure!(status == 404, "lookup after release: {status}");
    step(&format!(
        "release {account} -> 204; lookup -> 404: {detail}"
    ));
    Ok(())
}

/// An error answer's problem document. progenitor types `application/json` bodies only, so
/// `application/problem+json` errors arrive as bytes.
async fn problem(body: ByteStream) -> Outcome<Problem> {
    let chunks: Vec<_> = body.into_inner().try_collect().await?;
    Ok(serde_json::from_slice(&chunks.concat())?)
}

/// Waits for `call` and says in one line why it failed, if it did: the answer's status and
/// its problem's detail, or why keyspread could not be reached.
async fn answered<T>(
    client: &Client,
    what: &str,
    call: impl Future<Output = Result<ResponseValue<T>, Error<ByteStream>>>,
) -> Outcome<ResponseValue<T>> {
    match call.await {
        Ok(answer) => Ok(answer),
        Err(Error::ErrorResponse(answer)) => {
            let status = answer.status();
            let detail = match problem(answer.into_inner()).await {
                Ok(problem) => format!(": {}", problem.detail),
                Err(_) => String::new(),
            };
            Err(format!("{what}: {status}{detail}").into())
        }
        Err(Error::CommunicationError(error)) => {
            // reqwest's own text is "error sending request"; the cause is at the bottom.
            let mut cause: &dyn std::error::Error = &error;
            while let Some(source) = cause.source() {
                cause = source;
            }
            let base = client.baseurl();
            Err(format!("cannot reach keyspread at {base}: {cause}").into())
        }
        Err(other) => Err(format!("{what}: {other}").into()),
    }
}
