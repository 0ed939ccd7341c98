//! Kinesis' control plane through the AWS SDK for Rust: list a stream's shards, describe
//! it, split and merge. Nothing here runs on a lookup's path.

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_sdk_kinesis::config::timeout::TimeoutConfig;
use aws_sdk_kinesis::config::{Credentials, ProvideCredentials, Region};
use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::types::{self, StreamMode};

use crate::keyspace::{self, HashKey, Keyspace, ListShards};
use crate::registry::StreamMap;

mod error;

pub use crate::config::KinesisConfig;
pub use crate::keyspace::ListedShard;
pub use error::KinesisError;

/// A Kinesis client: timeouts on every call, and the SDK's retries with backoff.
#[derive(Debug, Clone)]
pub struct Kinesis {
    client: aws_sdk_kinesis::Client,
}

/// A Kinesis client made on first use, so that a server that watches no stream never
/// needs AWS; made again after a failure (credentials may come later, from a role).
#[derive(Debug)]
pub struct KinesisLink {
    config: KinesisConfig,
    client: tokio::sync::Mutex<Option<Kinesis>>,
}

impl KinesisLink {
    /// A link that connects at its first use.
    pub fn new(config: KinesisConfig) -> KinesisLink {
        KinesisLink {
            config,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// The client, connected now if it is not yet.
    pub async fn client(&self) -> Result<Kinesis, KinesisError> {
        let mut client = self.client.lock().await;
        if let Some(client) = &*client {
            return Ok(client.clone());
        }
        let connected = Kinesis::connect(&self.config).await?;
        *client = Some(connected.clone());
        Ok(connected)
    }
}

/// A stream's shards as ListShards answers them, and the map they make.
#[derive(Debug)]
pub struct Listing {
    /// Open map, every shard consumers read, next shard number: what the registry takes.
    pub map: StreamMap,
    /// Every shard listed, closed ones included, in Kinesis' order.
    pub shards: Vec<ListedShard>,
}

/// What DescribeStreamSummary says about a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub arn: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    pub status: StreamStatus,
    pub on_demand: bool,
    pub open_shards: u32,
}

/// A stream's life: only an ACTIVE stream takes SplitShard and MergeShards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStatus {
    Creating,
    Active,
    Updating,
    Deleting,
}

/// The account's shard limit (DescribeLimits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub shard_limit: u32,
    pub open_shards: u32,
}

/// Seconds to open a connection to Kinesis.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Seconds one attempt may take; a hung endpoint costs this much per attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Seconds a call may take with its retries: under a request's default 10 s.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(8);
/// Attempts per call (the first and its retries); throttling backs off between them.
const MAX_ATTEMPTS: u32 = 4;
/// ListShards pages (of up to 1,000 shards) read at most for one stream.
const MAX_PAGES: usize = 100;
/// The access key id keyspread signs with at an endpoint of its own when the chain has no
/// credentials (kinesalite and LocalStack take any).
pub const DUMMY_ACCESS_KEY_ID: &str = "keyspread-local";

impl Kinesis {
    /// A client for the configured endpoint and the chain's region and credentials. Fails
    /// with MissingRegion / MissingCredentials saying which and how to give it; with an
    /// endpoint and no credentials in the chain, signs with dummy ones instead.
    pub async fn connect(config: &KinesisConfig) -> Result<Kinesis, KinesisError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(https_client())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .operation_timeout(OPERATION_TIMEOUT)
                    .build(),
            )
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(MAX_ATTEMPTS)
                    .with_initial_backoff(Duration::from_millis(200))
                    .with_max_backoff(Duration::from_secs(2)),
            );
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(KinesisError::MissingRegion);
        }
        let mut builder = aws_sdk_kinesis::config::Builder::from(&sdk);
        let missing = match sdk.credentials_provider() {
            Some(chain) => (chain.provide_credentials().await.err())
                .map(|e| DisplayErrorContext(e).to_string()),
            None => Some("no credentials provider".to_owned()),
        };
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint);
            if let Some(why) = missing {
                tracing::info!(endpoint, %why, "no AWS credentials in the chain: signing with dummy ones, which kinesalite and LocalStack take");
                builder = builder.credentials_provider(Credentials::new(
                    DUMMY_ACCESS_KEY_ID,
                    "keyspread-local",
                    None,
                    None,
                    "keyspread-dummy",
                ));
            }
        } else if let Some(why) = missing {
            tracing::warn!(%why, "no AWS credentials in the chain");
            return Err(KinesisError::MissingCredentials);
        }
        Ok(Kinesis {
            client: aws_sdk_kinesis::Client::from_conf(builder.build()),
        })
    }

    /// ListShards, every page, closed shards included, as the registry's [`StreamMap`].
    pub async fn list_shards(
        &self,
        stream: &str,
        keyspace: Keyspace,
    ) -> Result<Listing, KinesisError> {
        let mut shards = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            // Kinesis takes the stream's name on the first page only, the token after.
            let call = match next.take() {
                None => self.client.list_shards().stream_name(stream),
                Some(token) => self.client.list_shards().next_token(token),
            };
            let page = call
                .max_results(1000)
                .send()
                .await
                .map_err(|e| KinesisError::from_sdk("ListShards", e))?;
            for shard in page.shards() {
                shards.push(listed(shard)?);
            }
            match page.next_token() {
                Some(token) if !page.shards().is_empty() => next = Some(token.to_owned()),
                _ => return listing(ListShards { shards }, keyspace),
            }
        }
        Err(KinesisError::Other(format!(
            "ListShards: stream {stream} has more than {MAX_PAGES} pages of shards"
        )))
    }

    /// DescribeStreamSummary: arn, creation time (Unix ms), status, on-demand or not, open
    /// shard count.
    pub async fn summary(&self, stream: &str) -> Result<Summary, KinesisError> {
        let out = self
            .client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk("DescribeStreamSummary", e))?;
        let Some(s) = out.stream_description_summary() else {
            return Err(KinesisError::Other(
                "DescribeStreamSummary answered no summary".into(),
            ));
        };
        let other = |what: String| KinesisError::Other(format!("DescribeStreamSummary: {what}"));
        let status = match s.stream_status() {
            types::StreamStatus::Creating => StreamStatus::Creating,
            types::StreamStatus::Active => StreamStatus::Active,
            types::StreamStatus::Updating => StreamStatus::Updating,
            types::StreamStatus::Deleting => StreamStatus::Deleting,
            unknown => return Err(other(format!("unknown StreamStatus {}", unknown.as_str()))),
        };
        let created_at_ms = s
            .stream_creation_timestamp()
            .to_millis()
            .map_err(|e| other(format!("StreamCreationTimestamp: {e}")))?;
        Ok(Summary {
            arn: s.stream_arn().to_owned(),
            created_at_ms,
            status,
            on_demand: s
                .stream_mode_details()
                .is_some_and(|m| *m.stream_mode() == StreamMode::OnDemand),
            open_shards: u32::try_from(s.open_shard_count()).unwrap_or(0),
        })
    }

    /// SplitShard: `shard_id` becomes two shards, the upper starting at
    /// `new_starting_hash_key`. Sent once: see [`once`].
    pub async fn split_shard(
        &self,
        stream: &str,
        shard_id: &str,
        new_starting_hash_key: HashKey,
    ) -> Result<(), KinesisError> {
        self.client
            .split_shard()
            .stream_name(stream)
            .shard_to_split(shard_id)
            .new_starting_hash_key(new_starting_hash_key.to_string())
            .customize()
            .config_override(once())
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk("SplitShard", e))?;
        Ok(())
    }

    /// MergeShards: `shard_id` and the shard whose range follows it become one. Sent once:
    /// see [`once`].
    pub async fn merge_shards(
        &self,
        stream: &str,
        shard_id: &str,
        adjacent_shard_id: &str,
    ) -> Result<(), KinesisError> {
        self.client
            .merge_shards()
            .stream_name(stream)
            .shard_to_merge(shard_id)
            .adjacent_shard_to_merge(adjacent_shard_id)
            .customize()
            .config_override(once())
            .send()
            .await
            .map_err(|e| KinesisError::from_sdk("MergeShards", e))?;
        Ok(())
    }

    /// DescribeLimits: the account's shard limit and open shards; `None` where the endpoint
    /// does not implement it (kinesalite).
    pub async fn shard_limit(&self) -> Result<Option<Limits>, KinesisError> {
        match self.client.describe_limits().send().await {
            Ok(out) => Ok(Some(Limits {
                shard_limit: u32::try_from(out.shard_limit()).unwrap_or(0),
                open_shards: u32::try_from(out.open_shard_count()).unwrap_or(0),
            })),
            Err(e) if e.code() == Some("UnknownOperationException") => Ok(None),
            Err(e) => Err(KinesisError::from_sdk("DescribeLimits", e)),
        }
    }
}

/// The SDK's HTTPS client, on rustls with ring rather than the SDK's default aws-lc (a
/// larger C library to build); for the credential chain's calls too.
fn https_client() -> aws_sdk_kinesis::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// A call sent once, not retried: a SplitShard or MergeShards whose answer was lost may
/// have been made, and sent again it would split or merge a shard closed by the first. The
/// reshard's next look at the stream finds out what was made.
fn once() -> aws_sdk_kinesis::config::Builder {
    aws_sdk_kinesis::config::Builder::default().retry_config(RetryConfig::disabled())
}

/// One SDK shard as list-shards prints it, for the list-shards reader to check.
fn listed(shard: &types::Shard) -> Result<ListedShard, KinesisError> {
    let id = shard.shard_id();
    let range = shard.hash_key_range().ok_or_else(|| {
        KinesisError::Other(format!("ListShards: shard {id} has no HashKeyRange"))
    })?;
    let sequence = shard.sequence_number_range();
    Ok(ListedShard {
        shard_id: id.to_owned(),
        parent_shard_id: shard.parent_shard_id().map(str::to_owned),
        adjacent_parent_shard_id: shard.adjacent_parent_shard_id().map(str::to_owned),
        hash_key_range: keyspace::HashKeyRange {
            starting_hash_key: range.starting_hash_key().to_owned(),
            ending_hash_key: range.ending_hash_key().to_owned(),
        },
        sequence_number_range: keyspace::SequenceNumberRange {
            starting_sequence_number: sequence.map(|s| s.starting_sequence_number().to_owned()),
            ending_sequence_number: sequence.and_then(|s| s.ending_sequence_number.clone()),
        },
    })
}

/// The registry's map of a listing, checked as a pasted list-shards output is.
fn listing(listed: ListShards, keyspace: Keyspace) -> Result<Listing, KinesisError> {
    let refused = |e: keyspace::Error| KinesisError::Other(format!("ListShards: {e}"));
    let map = StreamMap {
        map: listed.open_map(keyspace).map_err(refused)?,
        lease_shards: Some(listed.lease_shards(keyspace).map_err(refused)?),
        next_shard: listed.next_shard_number(),
    };
    Ok(Listing {
        map,
        shards: listed.shards,
    })
}
