-- Two accounts never share a key, pending old keys included, whichever keyspread writes: a
-- key that a staged move is switching away from stays its account's until `switch_at` (by
-- the database server's clock), so no row may take it before then. The unique index on
-- `hash_key` already refuses a second holder of a current key; this trigger refuses the
-- pending old ones (as a unique violation), so a release that predates it fails instead of
-- handing such a key out.
CREATE INDEX assignments_prev_hash_key ON assignments (prev_hash_key) WHERE prev_hash_key IS NOT NULL;

CREATE FUNCTION keyspread_refuse_pending_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM assignments
        WHERE prev_hash_key = NEW.hash_key
          AND switch_at > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
          AND NOT (account = NEW.account AND idx = NEW.idx)
    ) THEN
        RAISE EXCEPTION 'hash key is the pending old key of a staged move'
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER assignments_pending_key BEFORE INSERT OR UPDATE OF hash_key ON assignments
FOR EACH ROW WHEN (NEW.hash_key IS NOT NULL)
EXECUTE FUNCTION keyspread_refuse_pending_key();
