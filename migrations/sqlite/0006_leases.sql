-- Consumer leases: which worker reads which shard of a stream.

-- Every shard the stream's list-shards output named, closed ones and their parents
-- included, as JSON [{"id", "start", "end", "parents"?, "closed"?}]; NULL when the map was
-- given as a shard count (every shard open, no parents).
ALTER TABLE streams ADD COLUMN listed TEXT;

-- The workers of a stream's consumer group, live until `expires_at` (Unix milliseconds).
CREATE TABLE lease_workers (
    stream     TEXT    NOT NULL,
    worker     TEXT    NOT NULL,
    ttl_ms     INTEGER NOT NULL CHECK (ttl_ms > 0),
    expires_at INTEGER NOT NULL,
    joined_at  INTEGER NOT NULL,
    PRIMARY KEY (stream, worker)
);
-- Whether any worker has expired, without a scan.
CREATE INDEX lease_workers_expiry ON lease_workers (stream, expires_at);

-- A shard's lease: its owner; `next_owner` while the owner is revoking it (`told` once the
-- owner has been answered so); `epoch`, raised each time the lease passes to an owner; the
-- owner's last checkpoint. A shard with no row has never been leased.
CREATE TABLE leases (
    stream     TEXT    NOT NULL,
    shard_id   TEXT    NOT NULL,
    owner      TEXT,
    next_owner TEXT,
    told       INTEGER NOT NULL DEFAULT 0 CHECK (told IN (0, 1)),
    epoch      INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    checkpoint TEXT,
    PRIMARY KEY (stream, shard_id)
);
-- A heartbeat reads its own leases only.
CREATE INDEX leases_owner ON leases (stream, owner) WHERE owner IS NOT NULL;

-- When each stream's leases were last assigned: over which map (the streams row's
-- `version`), at what time and with the weights of which event; and whether a worker has
-- joined since (joins close together wait for one assignment).
CREATE TABLE lease_groups (
    stream        TEXT    NOT NULL PRIMARY KEY,
    map_version   INTEGER NOT NULL,
    assigned_at   INTEGER NOT NULL,
    weights_event INTEGER NOT NULL,
    pending_join  INTEGER NOT NULL DEFAULT 0 CHECK (pending_join IN (0, 1))
);
