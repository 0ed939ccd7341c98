//! A recording HTTP proxy in front of kinesalite for the reshard tests: every Kinesis action
//! keyspread sends through it is kept, and it answers as real Kinesis would where kinesalite
//! cannot (on-demand mode, DescribeLimits, the shard limit met), or holds a call's answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// How long a held answer waits to be released before it is sent anyway.
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// What the proxy answers itself instead of kinesalite.
#[derive(Debug, Default, Clone)]
pub(crate) struct Rules {
    /// DescribeStreamSummary says the stream is in on-demand mode.
    pub(crate) on_demand: bool,
    /// DescribeLimits answers this shard limit and open shard count.
    pub(crate) limits: Option<(u32, u32)>,
    /// SplitShard is refused for the shard limit once this many splits were made.
    pub(crate) splits_allowed: Option<usize>,
    /// The answer of this call (1-based, counting SplitShard and MergeShards made) is held
    /// until [`Proxy::release`]: made in Kinesis, unknown to its caller.
    pub(crate) hold: Option<usize>,
    /// The answer of this call (1-based, as `hold` counts) is lost: made in Kinesis, its
    /// caller is answered 500 InternalFailure, which the SDK would retry.
    pub(crate) lose: Option<usize>,
    /// The first ListShards is held until [`Proxy::release_listing`] (at most 60 s; the
    /// SDK gives an attempt 5 s).
    pub(crate) hold_listing: Option<ListingHold>,
}

/// Which half of a ListShards [`Rules::hold_listing`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListingHold {
    /// The request, before it is sent on: its answer is Kinesis' map once released.
    Request,
    /// The answer: Kinesis' map when the request came, told once released.
    Answer,
}

/// One Kinesis action as the proxy saw it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) action: String,
    pub(crate) body: Value,
    /// What the caller was answered.
    pub(crate) status: u16,
}

impl Call {
    /// Whether this is a SplitShard or MergeShards that Kinesis made.
    pub(crate) fn reshaped(&self) -> bool {
        self.status == 200 && matches!(self.action.as_str(), "SplitShard" | "MergeShards")
    }

    /// The shards a SplitShard or MergeShards names.
    pub(crate) fn shards(&self) -> Vec<String> {
        ["ShardToSplit", "ShardToMerge", "AdjacentShardToMerge"]
            .iter()
            .filter_map(|field| self.body[field].as_str().map(str::to_owned))
            .collect()
    }
}

/// What the proxy saw since [`Proxy::set`], and the signals of that setting's held call
/// (new with each setting, so that a release nobody waited for holds for no later call).
#[derive(Default)]
struct Seen {
    rules: Rules,
    calls: Vec<Call>,
    /// ListShards requests still to refuse as throttled.
    throttled: usize,
    held: Arc<Notify>,
    release: Arc<Notify>,
    /// Whether the ListShards [`Rules::hold_listing`] names came, and its signals.
    listing_came: bool,
    listing_held: Arc<Notify>,
    listing_release: Arc<Notify>,
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    seen: Mutex<Seen>,
}

/// The proxy, serving until dropped.
pub(crate) struct Proxy {
    pub(crate) endpoint: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy on 127.0.0.1 in front of the Kinesis endpoint `upstream`.
    pub(crate) async fn start(upstream: &str) -> Proxy {
        let shared = Arc::new(Shared {
            upstream: upstream.to_owned(),
            client: reqwest::Client::new(),
            seen: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Proxy {
            endpoint,
            shared,
            task,
        }
    }

    /// Sets what the proxy answers itself from now on, and forgets the calls seen so far.
    pub(crate) fn set(&self, rules: Rules) {
        let mut seen = self.shared.seen.lock().unwrap();
        *seen = Seen {
            rules,
            ..Seen::default()
        };
    }

    /// Refuses the next `n` ListShards requests as Kinesis does when it throttles.
    pub(crate) fn throttle(&self, n: usize) {
        self.shared.seen.lock().unwrap().throttled = n;
    }

    /// Every action seen since the last [`Proxy::set`], in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.shared.seen.lock().unwrap().calls.clone()
    }

    /// Waits (at most 60 s) until the call [`Rules::hold`] names is made and held.
    pub(crate) async fn held(&self) {
        let held = Arc::clone(&self.shared.seen.lock().unwrap().held);
        tokio::time::timeout(HOLD_AT_MOST, held.notified())
            .await
            .expect("the held call was not made within 60 s");
    }

    /// Sends the held answer.
    pub(crate) fn release(&self) {
        self.shared.seen.lock().unwrap().release.notify_one();
    }

    /// Waits (at most 60 s) until the ListShards [`Rules::hold_listing`] names is held.
    pub(crate) async fn listing_held(&self) {
        let held = Arc::clone(&self.shared.seen.lock().unwrap().listing_held);
        tokio::time::timeout(HOLD_AT_MOST, held.notified())
            .await
            .expect("no ListShards request within 60 s");
    }

    /// Lets the held ListShards go on.
    pub(crate) fn release_listing(&self) {
        self.shared
            .seen
            .lock()
            .unwrap()
            .listing_release
            .notify_one();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let action = headers
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or_default()
        .to_owned();
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let rules = shared.seen.lock().unwrap().rules.clone();
    let listing_hold = match rules.hold_listing {
        Some(half) if action == "ListShards" => {
            let mut seen = shared.seen.lock().unwrap();
            let first = !seen.listing_came;
            seen.listing_came = true;
            let signals = (
                Arc::clone(&seen.listing_held),
                Arc::clone(&seen.listing_release),
            );
            first.then_some((half, signals))
        }
        _ => None,
    };
    let hold_listing = async |half: ListingHold| {
        if let Some((_, (held, release))) = listing_hold.as_ref().filter(|(h, _)| *h == half) {
            held.notify_one();
            let _ = tokio::time::timeout(HOLD_AT_MOST, release.notified()).await;
        }
    };
    hold_listing(ListingHold::Request).await;
    let splits = |seen: &Seen| {
        (seen.calls.iter())
            .filter(|c| c.reshaped() && c.action == "SplitShard")
            .count()
    };
    let own = match action.as_str() {
        "DescribeLimits" => rules.limits.map(|(limit, open)| {
            let limits = json!({"ShardLimit": limit, "OpenShardCount": open,
                "OnDemandStreamCount": 0, "OnDemandStreamCountLimit": 50});
            (200, limits)
        }),
        "SplitShard"
            if rules
                .splits_allowed
                .is_some_and(|n| splits(&shared.seen.lock().unwrap()) >= n) =>
        {
            let refusal = json!({"__type": "LimitExceededException",
                "message": "This request would exceed the shard limit for the account \
                            000000000000 in us-east-1. Current shard limit is 3."});
            Some((400, refusal))
        }
        "ListShards" => throttled(&mut shared.seen.lock().unwrap()).then(|| {
            let refusal = json!({"__type": "LimitExceededException",
                "message": "Rate exceeded for stream under account 000000000000."});
            (400, refusal)
        }),
        _ => None,
    };
    let (mut status, mut answer) = match own {
        Some(own) => own,
        None => upstream(&shared, &headers, body).await,
    };
    if action == "DescribeStreamSummary" && rules.on_demand && status == 200 {
        answer["StreamDescriptionSummary"]["StreamModeDetails"] =
            json!({"StreamMode": "ON_DEMAND"});
    }
    let call = Call {
        action,
        body: request,
        status,
    };
    let (hold, lost) = {
        let mut seen = shared.seen.lock().unwrap();
        let reshaped = call.reshaped();
        seen.calls.push(call);
        let made = seen.calls.iter().filter(|c| c.reshaped()).count();
        let hold = reshaped && rules.hold == Some(made);
        let lost = reshaped && rules.lose == Some(made);
        let hold = hold.then(|| (Arc::clone(&seen.held), Arc::clone(&seen.release)));
        (hold, lost)
    };
    if lost {
        (status, answer) = (500, json!({"__type": "InternalFailure"}));
    }
    hold_listing(ListingHold::Answer).await;
    if let Some((held, release)) = hold {
        held.notify_one();
        let _ = tokio::time::timeout(HOLD_AT_MOST, release.notified()).await;
    }
    let status = StatusCode::from_u16(status).unwrap();
    let content_type = [(header::CONTENT_TYPE, "application/x-amz-json-1.1")];
    (status, content_type, answer.to_string()).into_response()
}

/// Whether this request is one of those to refuse as throttled.
fn throttled(seen: &mut Seen) -> bool {
    let refuse = seen.throttled > 0;
    seen.throttled = seen.throttled.saturating_sub(1);
    refuse
}

/// `body` sent on to kinesalite with the caller's headers: its status and JSON answer.
async fn upstream(shared: &Shared, headers: &HeaderMap, body: Bytes) -> (u16, Value) {
    let mut sent = HeaderMap::new();
    for (name, value) in headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            sent.insert(name.clone(), value.clone());
        }
    }
    let response = shared
        .client
        .post(&shared.upstream)
        .headers(sent)
        .body(body)
        .send()
        .await;
    match response {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or_default())
        }
        Err(err) => (
            502,
            json!({"__type": "ProxyError", "message": err.to_string()}),
        ),
    }
}
