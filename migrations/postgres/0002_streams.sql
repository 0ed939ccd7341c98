-- Streams: each one's open shard map, and which one new keys balance on.
CREATE TABLE streams (
    name       TEXT    NOT NULL PRIMARY KEY,
    -- JSON array of [shard_id, starting_hash_key, ending_hash_key] in key order.
    shards     TEXT    NOT NULL,
    -- One past the highest shard number the stream ever used.
    next_shard BIGINT  NOT NULL CHECK (next_shard >= 0),
    is_primary BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at BIGINT  NOT NULL
);
CREATE UNIQUE INDEX streams_one_primary ON streams (is_primary) WHERE is_primary;

-- The event log now records stream changes too.
ALTER TABLE events DROP CONSTRAINT events_kind;
ALTER TABLE events ADD CONSTRAINT events_kind
    CHECK (kind IN ('allocate', 'release', 'move', 'reweight', 'stream_put', 'stream_delete'));
ALTER TABLE events ALTER COLUMN account DROP NOT NULL;
ALTER TABLE events ALTER COLUMN weight DROP NOT NULL;
-- Set for stream events; `detail` holds the new map as JSON.
ALTER TABLE events ADD COLUMN stream TEXT;
ALTER TABLE events ADD COLUMN detail TEXT;
ALTER TABLE events ADD CONSTRAINT events_subject CHECK ((account IS NULL) <> (stream IS NULL));
