-- Observed load: what consumer workers report reading, smoothed per shard and per
-- account (see src/keyspace/load.rs). A rate is stored as of `at_ms` (Unix milliseconds,
-- the database's clock) and decays from there with the clock.

-- Streams that have had a report counted, and the map (the streams row's `version`) whose
-- shards their rows were last checked against: rows of shards a newer map dropped go.
CREATE TABLE load_streams (
    stream      TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    map_version BIGINT NOT NULL,
    reported_at BIGINT NOT NULL
);

-- Each shard's smoothed rate, as of `at_ms`, and the instant its accounts' rates are
-- stored as of (`accounts_at`).
CREATE TABLE shard_load (
    stream        TEXT             COLLATE "C" NOT NULL,
    shard_id      TEXT             COLLATE "C" NOT NULL,
    records_per_s DOUBLE PRECISION NOT NULL CHECK (records_per_s >= 0),
    bytes_per_s   DOUBLE PRECISION NOT NULL CHECK (bytes_per_s >= 0),
    at_ms         BIGINT           NOT NULL,
    accounts_at   BIGINT           NOT NULL,
    PRIMARY KEY (stream, shard_id)
);

-- Each account's smoothed rate on one shard, as of its shard's `accounts_at` (a report
-- adds to it; see src/store/load.rs). Once both rates fall below a tiny one, the next
-- report on the shard deletes the row, so the table holds the accounts lately reported.
-- Stored by its key alone: a report rewrites a thousand rows, and every other index would
-- rewrite them again.
CREATE TABLE account_load (
    stream        TEXT             COLLATE "C" NOT NULL,
    shard_id      TEXT             COLLATE "C" NOT NULL,
    account       TEXT             COLLATE "C" NOT NULL,
    records_per_s DOUBLE PRECISION NOT NULL CHECK (records_per_s >= 0),
    bytes_per_s   DOUBLE PRECISION NOT NULL CHECK (bytes_per_s >= 0),
    PRIMARY KEY (stream, shard_id, account)
);

-- A deleted stream's load goes with it.
CREATE FUNCTION keyspread_forget_load() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM account_load WHERE stream = OLD.name;
    DELETE FROM shard_load WHERE stream = OLD.name;
    DELETE FROM load_streams WHERE stream = OLD.name;
    RETURN OLD;
END
$$;

CREATE TRIGGER load_stream_deleted AFTER DELETE ON streams
FOR EACH ROW EXECUTE FUNCTION keyspread_forget_load();
