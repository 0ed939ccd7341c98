-- The load controller: accounts may opt in to a fanout raised by load up to `max_fanout`
-- (kept on the account's key 0, NULL when it did not opt in); move events say why they were
-- made; controller rounds are claimed per stream so that one replica acts per round.
ALTER TABLE assignments ADD COLUMN max_fanout INTEGER
    CHECK (max_fanout IS NULL OR (idx = 0 AND max_fanout BETWEEN 1 AND 1024));
-- Start-up reads the few accounts that opted in without a scan.
CREATE INDEX assignments_max_fanout ON assignments (account) WHERE max_fanout IS NOT NULL;

-- A `max_fanout` event records an account's new cap (`max_fanout`, NULL once cleared), and a
-- `move` event its `reason` ('admin' or 'load'; NULL for moves logged before reasons). SQLite
-- cannot alter a CHECK constraint, so the table is rebuilt; ids are kept.
CREATE TABLE events_v3 (
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
    reason      TEXT    CHECK (reason IS NULL OR reason IN ('admin', 'load')),
    max_fanout  INTEGER CHECK (max_fanout IS NULL OR max_fanout BETWEEN 1 AND 1024),
    CHECK ((account IS NULL) <> (stream IS NULL))
);
INSERT INTO events_v3 (id, at, kind, account, key_before, key_after, weight, stream, detail, shard_count, idx, switch_at)
    SELECT id, at, kind, account, key_before, key_after, weight, stream, detail, shard_count, idx, switch_at FROM events;
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;

CREATE TRIGGER events_stream_put AFTER INSERT ON events WHEN NEW.kind = 'stream_put'
BEGIN
    UPDATE events SET shard_count = json_array_length(NEW.detail), detail = NULL
        WHERE id = NEW.id AND NEW.detail IS NOT NULL;
    UPDATE streams SET version = NEW.id WHERE name = NEW.stream;
END;

-- One row per stream the controller balances: the last round claimed and when (Unix
-- milliseconds, the database's clock). A replica acts on a round only when its UPDATE of
-- this row is the one that took it.
CREATE TABLE controller_rounds (
    stream TEXT    NOT NULL PRIMARY KEY,
    round  INTEGER NOT NULL DEFAULT 0 CHECK (round >= 0),
    at_ms  INTEGER NOT NULL DEFAULT 0
);

-- The cooldown reads the controller's recent moves without a scan of the log.
CREATE INDEX events_load_moves ON events (at) WHERE reason = 'load';
