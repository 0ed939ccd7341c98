-- Reshards keyspread carries out. A job's row says what is wanted (the open shard count,
-- the shards the split plan cut for it, how long after the end the staged rebalance
-- switches) and how it stands (state, calls made, why it failed); each call is worked out
-- from the stream's real shards, listed just before it is made, so a replica that takes a
-- job over goes on from what Kinesis says.
CREATE TABLE reshard_jobs (
    id              BIGSERIAL PRIMARY KEY,
    stream          TEXT   NOT NULL,
    target          BIGINT NOT NULL CHECK (target BETWEEN 1 AND 10000),
    -- Where the wanted shards start, but the first (at 0): 16-byte big-endian hash keys, in
    -- key order.
    starts          BYTEA  NOT NULL CHECK (length(starts) = 16 * (target - 1)),
    switch_after_ms BIGINT NOT NULL CHECK (switch_after_ms BETWEEN 0 AND 86400000),
    state           TEXT   NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    -- SplitShard / MergeShards calls made: those the stream's lineage shows since first_shard.
    done            BIGINT NOT NULL DEFAULT 0 CHECK (done >= 0),
    error           TEXT,
    -- The actor who asked for it (a token's name, never a token).
    started_by      TEXT   NOT NULL,
    -- Unix milliseconds, by the database's clock.
    started_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    -- The number Kinesis was to give the stream's next shard when the job started: shards
    -- from it on are its calls' results.
    first_shard     BIGINT NOT NULL CHECK (first_shard >= 0),
    -- The replica driving the job and until when (Unix ms, the database's clock): another
    -- takes it over only after that.
    holder          TEXT,
    held_until      BIGINT NOT NULL DEFAULT 0
);
-- One running job per stream: a second is refused by the database itself.
CREATE UNIQUE INDEX reshard_jobs_running ON reshard_jobs (stream) WHERE state = 'running';
CREATE INDEX reshard_jobs_latest ON reshard_jobs (stream, id);

-- Moves the rebalance at a reshard's end makes say `reason` 'reshard'.
ALTER TABLE events DROP CONSTRAINT events_reason;
ALTER TABLE events ADD CONSTRAINT events_reason
    CHECK (reason IS NULL OR reason IN ('admin', 'load', 'reshard'));
