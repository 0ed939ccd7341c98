//! The rows behind consumer leases: each stream's workers, the lease of each shard, and
//! when the stream's leases were last assigned.

use crate::keyspace::lease_state::Holder;

/// The leases a worker owns (`$1` the stream, `$2` the worker), read at every heartbeat:
/// one range of the `leases_owner` index. In no order: `ORDER BY shard_id` steers SQLite
/// to the primary key, a walk of every shard of the stream (the caller sorts its few).
pub const OWNED_LEASES: &str = "SELECT shard_id, owner, next_owner, told, epoch, checkpoint \
    FROM leases WHERE stream = $1 AND owner = $2";

/// A worker of a stream's consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRow {
    pub worker: String,
    pub ttl_ms: i64,
    /// Unix milliseconds: the worker is live until then.
    pub expires_at: i64,
}

/// A shard's lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub shard_id: String,
    pub holder: Holder<String>,
    /// The owner's last checkpoint: a sequence number, or `SHARD_END`.
    pub checkpoint: Option<String>,
}

/// When a stream's leases were last assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGroup {
    /// The `version` of the stream's map they were assigned over.
    pub map_version: i64,
    /// Unix milliseconds.
    pub assigned_at: i64,
    /// The newest event whose weights the assignment saw.
    pub weights_event: i64,
    /// Whether a worker joined since, its share not assigned yet.
    pub pending_join: bool,
}
