-- The window a shard's last counted report covered: its rates stay current until the next
-- report is due, one window later (see held_ms in src/keyspace/load.rs).
ALTER TABLE shard_load ADD COLUMN window_ms BIGINT NOT NULL DEFAULT 0 CHECK (window_ms >= 0);
