-- Observed load as producers report it: what each producer sent, by the shard its hash
-- keys fall on, smoothed per shard and per account like the consumers' reports in
-- `shard_load` (see src/store/load.rs), and kept apart from them: a shard's figures come
-- from its consumer's reports while they are current, else from these.
CREATE TABLE producer_load (
    stream        TEXT             COLLATE "C" NOT NULL,
    shard_id      TEXT             COLLATE "C" NOT NULL,
    records_per_s DOUBLE PRECISION NOT NULL CHECK (records_per_s >= 0),
    bytes_per_s   DOUBLE PRECISION NOT NULL CHECK (bytes_per_s >= 0),
    at_ms         BIGINT           NOT NULL,
    accounts_at   BIGINT           NOT NULL,
    window_ms     BIGINT           NOT NULL CHECK (window_ms >= 0),
    accounts      BYTEA            NOT NULL,
    PRIMARY KEY (stream, shard_id)
);
-- Stored out of line uncompressed: rates compress poorly, and each report rewrites them.
ALTER TABLE producer_load ALTER COLUMN accounts SET STORAGE EXTERNAL;

-- Each producer's highest report number counted: a report numbered at or below it was
-- counted before (a retry whose answer was lost), on whichever replica. Rows not reported
-- for a day go (a few at each report).
CREATE TABLE producer_seqs (
    producer    TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    seq         BIGINT NOT NULL,
    reported_at BIGINT NOT NULL
);
CREATE INDEX producer_seqs_age ON producer_seqs (reported_at);

-- A deleted stream's load goes with it.
CREATE FUNCTION keyspread_forget_producer_load() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM producer_load WHERE stream = OLD.name;
    RETURN OLD;
END
$$;

CREATE TRIGGER producer_load_stream_deleted AFTER DELETE ON streams
FOR EACH ROW EXECUTE FUNCTION keyspread_forget_producer_load();
