-- Every committed change writes an event: announce new events from the database itself,
-- so that a writer spends no round trip of its own on the notice. Postgres delivers a
-- notice on commit (never for a rolled-back transaction) and folds the same notice sent
-- twice in one transaction into one.
CREATE FUNCTION keyspread_announce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('keyspread_events', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER events_announce AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION keyspread_announce();
