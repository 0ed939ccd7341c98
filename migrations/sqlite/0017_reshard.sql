-- Reshards keyspread carries out. A job's row says what is wanted (the open shard count,
-- the shards the split plan cut for it, how long after the end the staged rebalance
-- switches) and how it stands (state, calls made, why it failed); each call is worked out
-- from the stream's real shards, listed just before it is made, so a replica that takes a
-- job over goes on from what Kinesis says.
CREATE TABLE reshard_jobs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    stream          TEXT    NOT NULL,
    target          INTEGER NOT NULL CHECK (target BETWEEN 1 AND 10000),
    -- Where the wanted shards start, but the first (at 0): 16-byte big-endian hash keys, in
    -- key order.
    starts          BLOB    NOT NULL CHECK (length(starts) = 16 * (target - 1)),
    switch_after_ms INTEGER NOT NULL CHECK (switch_after_ms BETWEEN 0 AND 86400000),
    state           TEXT    NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    -- SplitShard / MergeShards calls made: those the stream's lineage shows since first_shard.
    done            INTEGER NOT NULL DEFAULT 0 CHECK (done >= 0),
    error           TEXT,
    -- The actor who asked for it (a token's name, never a token).
    started_by      TEXT    NOT NULL,
    -- Unix milliseconds, by the database's clock.
    started_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    -- The number Kinesis was to give the stream's next shard when the job started: shards
    -- from it on are its calls' results.
    first_shard     INTEGER NOT NULL CHECK (first_shard >= 0),
    -- The replica driving the job and until when (Unix ms, the database's clock): another
    -- takes it over only after that.
    holder          TEXT,
    held_until      INTEGER NOT NULL DEFAULT 0
);
-- One running job per stream: a second is refused by the database itself.
CREATE UNIQUE INDEX reshard_jobs_running ON reshard_jobs (stream) WHERE state = 'running';
CREATE INDEX reshard_jobs_latest ON reshard_jobs (stream, id);

-- Moves the rebalance at a reshard's end makes say `reason` 'reshard'. SQLite cannot alter a
-- CHECK constraint, so the table is rebuilt with its trigger and index; ids and the
-- AUTOINCREMENT high-water mark are kept.
CREATE TABLE events_v4 (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          INTEGER NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('allocate', 'release', 'move', 'reweight', 'stream_put', 'stream_delete', 'max_fanout')),
    -- Set for account events.
    account     TEXT,
    key_before  BLOB    CHECK (key_before IS NULL OR length(key_before) = 16),
    key_after   BLOB    CHECK (key_after IS NULL OR length(key_after) = 16),
    weight      INTEGER,
    -- Set for stream events.
    stream      TEXT,
    detail      TEXT,
    shard_count INTEGER,
    idx         INTEGER NOT NULL DEFAULT 0,
    switch_at   INTEGER,
    reason      TEXT    CHECK (reason IS NULL OR reason IN ('admin', 'load', 'reshard')),
    max_fanout  INTEGER CHECK (max_fanout IS NULL OR max_fanout BETWEEN 1 AND 1024),
    actor       TEXT    NOT NULL DEFAULT 'unrecorded',
    CHECK ((account IS NULL) <> (stream IS NULL))
);
INSERT INTO events_v4 (id, at, kind, account, key_before, key_after, weight, stream, detail, shard_count, idx, switch_at, reason, max_fanout, actor)
    SELECT id, at, kind, account, key_before, key_after, weight, stream, detail, shard_count, idx, switch_at, reason, max_fanout, actor FROM events;
UPDATE sqlite_sequence SET seq = (SELECT seq FROM sqlite_sequence WHERE name = 'events')
    WHERE name = 'events_v4' AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'events');
DROP TABLE events;
ALTER TABLE events_v4 RENAME TO events;

CREATE TRIGGER events_stream_put AFTER INSERT ON events WHEN NEW.kind = 'stream_put'
BEGIN
    UPDATE events SET shard_count = json_array_length(NEW.detail), detail = NULL
        WHERE id = NEW.id AND NEW.detail IS NOT NULL;
    UPDATE streams SET version = NEW.id WHERE name = NEW.stream;
END;
CREATE INDEX events_load_moves ON events (at) WHERE reason = 'load';
