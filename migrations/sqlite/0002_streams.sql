-- Streams: each one's open shard map, and which one new keys balance on.
CREATE TABLE streams (
    name       TEXT    NOT NULL PRIMARY KEY,
    -- JSON array of [shard_id, starting_hash_key, ending_hash_key] in key order.
    shards     TEXT    NOT NULL,
    -- One past the highest shard number the stream ever used.
    next_shard INTEGER NOT NULL CHECK (next_shard >= 0),
    is_primary INTEGER NOT NULL DEFAULT 0 CHECK (is_primary IN (0, 1)),
    updated_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX streams_one_primary ON streams (is_primary) WHERE is_primary = 1;

-- The event log now records stream changes too. SQLite cannot alter a CHECK constraint,
-- so the table is rebuilt; ids are kept.
CREATE TABLE events_v2 (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('allocate', 'release', 'move', 'reweight', 'stream_put', 'stream_delete')),
    -- Set for account events.
    account    TEXT,
    key_before BLOB    CHECK (key_before IS NULL OR length(key_before) = 16),
    key_after  BLOB    CHECK (key_after IS NULL OR length(key_after) = 16),
    weight     INTEGER,
    -- Set for stream events; `detail` holds the new map as JSON.
    stream     TEXT,
    detail     TEXT,
    CHECK ((account IS NULL) <> (stream IS NULL))
);
INSERT INTO events_v2 (id, at, kind, account, key_before, key_after, weight)
    SELECT id, at, kind, account, key_before, key_after, weight FROM events;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
