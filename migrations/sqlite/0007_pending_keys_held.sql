-- Two accounts never share a key, pending old keys included, whichever keyspread writes: a
-- key that a staged move is switching away from stays its account's until `switch_at` (by
-- the database's clock: SQLite reads this host's), so no row may take it before then. The
-- unique index on `hash_key` already refuses a second holder of a current key; these
-- triggers refuse the pending old ones, so a release that predates them fails instead of
-- handing such a key out.
CREATE INDEX assignments_prev_hash_key ON assignments (prev_hash_key) WHERE prev_hash_key IS NOT NULL;

CREATE TRIGGER assignments_pending_key_insert BEFORE INSERT ON assignments
WHEN EXISTS (
    SELECT 1 FROM assignments
    WHERE prev_hash_key = NEW.hash_key
      AND switch_at > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
)
BEGIN
    SELECT RAISE(ABORT, 'hash key is the pending old key of a staged move');
END;

CREATE TRIGGER assignments_pending_key_update BEFORE UPDATE OF hash_key ON assignments
WHEN NEW.hash_key <> OLD.hash_key AND EXISTS (
    SELECT 1 FROM assignments
    WHERE prev_hash_key = NEW.hash_key
      AND switch_at > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)
      AND NOT (account = NEW.account AND idx = NEW.idx)
)
BEGIN
    SELECT RAISE(ABORT, 'hash key is the pending old key of a staged move');
END;
