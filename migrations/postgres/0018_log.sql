-- The log's name: a random UUID drawn when the database is created (or first migrated by a
-- keyspread that knows it). Event ids mean something only within one log, so readers
-- (replicas, mirrors) that find another name start again from a snapshot. A replica that
-- finds this log rewound (a point-in-time restore) draws a new name.
INSERT INTO meta (name, value) VALUES ('log_id', gen_random_uuid()::text)
ON CONFLICT (name) DO NOTHING;

-- keyspread_allocate_keys_by (migration 0017) for a writer that names the log it follows:
-- the rows go in only while the log is that one and still ends at `seen` (a log that ends
-- before it was rewound under the writer). The old one stays for older replicas.
CREATE FUNCTION keyspread_allocate_keys_in(
    lock_key   BIGINT,
    log        TEXT,
    seen       BIGINT,
    accounts   TEXT[],
    idxs       BIGINT[],
    keys       BYTEA[],
    weights    BIGINT[],
    created    BIGINT[],
    actors     TEXT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, idx BIGINT, id BIGINT) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    IF (SELECT coalesce(max(e.id), 0) FROM events e) <> seen
        OR (SELECT m.value FROM meta m WHERE m.name = 'log_id') IS DISTINCT FROM log THEN
        RAISE EXCEPTION 'the event log is not log % at %', log, seen USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN QUERY SELECT * FROM keyspread_insert_keys_by(accounts, idxs, keys, weights, created, actors, logged_at);
END
$$;
