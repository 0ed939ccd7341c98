-- The load controller: accounts may opt in to a fanout raised by load up to `max_fanout`
-- (kept on the account's key 0, NULL when it did not opt in); move events say why they were
-- made; controller rounds are claimed per stream so that one replica acts per round.
ALTER TABLE assignments ADD COLUMN max_fanout BIGINT
    CONSTRAINT assignments_max_fanout CHECK (max_fanout IS NULL OR (idx = 0 AND max_fanout BETWEEN 1 AND 1024));
-- Start-up reads the few accounts that opted in without a scan.
CREATE INDEX assignments_max_fanout ON assignments (account) WHERE max_fanout IS NOT NULL;

-- A `max_fanout` event records an account's new cap (`max_fanout`, NULL once cleared), and a
-- `move` event its `reason` ('admin' or 'load'; NULL for moves logged before reasons).
ALTER TABLE events DROP CONSTRAINT events_kind;
ALTER TABLE events ADD CONSTRAINT events_kind
    CHECK (kind IN ('allocate', 'release', 'move', 'reweight', 'stream_put', 'stream_delete', 'max_fanout'));
ALTER TABLE events ADD COLUMN reason TEXT
    CONSTRAINT events_reason CHECK (reason IS NULL OR reason IN ('admin', 'load'));
ALTER TABLE events ADD COLUMN max_fanout BIGINT
    CONSTRAINT events_max_fanout CHECK (max_fanout IS NULL OR max_fanout BETWEEN 1 AND 1024);

-- One row per stream the controller balances: the last round claimed and when (Unix
-- milliseconds, the database's clock). A replica acts on a round only when its UPDATE of
-- this row is the one that took it.
CREATE TABLE controller_rounds (
    stream TEXT   NOT NULL PRIMARY KEY,
    round  BIGINT NOT NULL DEFAULT 0 CHECK (round >= 0),
    at_ms  BIGINT NOT NULL DEFAULT 0
);

-- The cooldown reads the controller's recent moves without a scan of the log.
CREATE INDEX events_load_moves ON events (at) WHERE reason = 'load';
