-- Staged moves: a rebalance gives a key its new value at once (`hash_key`) but producers
-- keep sending the old one (`prev_hash_key`) until `switch_at` (Unix milliseconds); until
-- then the account holds both. `moved_by` is the id of the `move` event that set them.
-- The columns stay as they were once the switch has passed: a row is switching only while
-- `switch_at` is in the future. Earlier releases never write them.
ALTER TABLE assignments ADD COLUMN prev_hash_key BYTEA CHECK (prev_hash_key IS NULL OR octet_length(prev_hash_key) = 16);
ALTER TABLE assignments ADD COLUMN switch_at BIGINT;
ALTER TABLE assignments ADD COLUMN moved_by BIGINT;
-- Pending moves are the rows with a future switch_at: few, found without a scan.
CREATE INDEX assignments_switch_at ON assignments (switch_at) WHERE switch_at IS NOT NULL;

-- When a `move` event's new key takes over (NULL for moves logged before staging: at once).
ALTER TABLE events ADD COLUMN switch_at BIGINT;
