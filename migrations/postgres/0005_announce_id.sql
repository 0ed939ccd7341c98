-- Commit notices name an event their transaction logged, so that a replica can tell the
-- notice of its own commit, applied already, from another writer's news: it reads the
-- log only for news.
--
-- One notice per transaction, however many statements log events (a rebalance logs one
-- per move): the id of the newest event of the first statement that logged any. A
-- replica that has applied that event has applied, or is applying under its write lock,
-- the whole transaction: a writer applies its own events together after the commit.
CREATE OR REPLACE FUNCTION keyspread_announce() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    newest BIGINT;
BEGIN
    IF current_setting('keyspread.announced', true) IS DISTINCT FROM 'yes' THEN
        newest := (SELECT max(id) FROM logged);
        IF newest IS NOT NULL THEN
            -- Set for this transaction only.
            PERFORM set_config('keyspread.announced', 'yes', true);
            PERFORM pg_notify('keyspread_events', newest::text);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER events_announce ON events;
CREATE TRIGGER events_announce AFTER INSERT ON events REFERENCING NEW TABLE AS logged
    FOR EACH STATEMENT EXECUTE FUNCTION keyspread_announce();
