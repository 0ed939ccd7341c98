-- Streams whose map keyspread reads from Kinesis itself (`PUT /streams/{name}` with
-- `{"watch": true}`), and what the last listing of each found.
--   watch              whether Kinesis is the map's source: one replica lists it again
--                      every --stream-sync-interval-s, and a PUT of a map is refused.
--   kinesis_arn,       the stream Kinesis last answered under this name (its ARN and
--   kinesis_created_at creation time, Unix ms): another one is a stream created again,
--                      whose shards inherit no lease or checkpoint. Kept when watching
--                      stops, so that watching again still tells.
--   synced_at          when a listing last succeeded (Unix ms, the database's clock).
--   sync_error         why the last listing failed; NULL once one succeeds.
--   sync_claimed_at    the last listing claimed (Unix ms): a replica lists only when its
--                      UPDATE of this column is the one that took the round; pushed into
--                      the future while Kinesis throttles.
--   sync_throttled     listings throttled in a row, for the back-off.
ALTER TABLE streams ADD COLUMN watch BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE streams ADD COLUMN kinesis_arn TEXT;
ALTER TABLE streams ADD COLUMN kinesis_created_at BIGINT;
ALTER TABLE streams ADD COLUMN synced_at BIGINT;
ALTER TABLE streams ADD COLUMN sync_error TEXT;
ALTER TABLE streams ADD COLUMN sync_claimed_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE streams ADD COLUMN sync_throttled BIGINT NOT NULL DEFAULT 0 CHECK (sync_throttled >= 0);
