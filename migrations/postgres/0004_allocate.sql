-- Allocation in one round trip: take the write lock, check that the log is where the
-- caller last saw it, insert the new assignments with an `allocate` event each, and answer
-- each account's event id. Called as a statement of its own, it is its own transaction,
-- committed before the answer is sent.
--
-- `lock_key` is the store's write lock (src/store/postgres.rs), `seen` the last event the
-- caller applied. A log that moved on (another replica wrote) fails with
-- serialization_failure and changes nothing: the caller catches up and tries again.
CREATE FUNCTION keyspread_allocate(
    lock_key   BIGINT,
    seen       BIGINT,
    accounts   TEXT[],
    keys       BYTEA[],
    weights    BIGINT[],
    created    BIGINT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, id BIGINT) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    -- A statement of a volatile function sees what committed before it started: after the
    -- lock, every other writer's events. (max() reads one end of the primary key whatever
    -- `seen` is; `id > seen` would be planned once for any value, as a scan of the table.)
    IF (SELECT coalesce(max(e.id), 0) FROM events e) > seen THEN
        RAISE EXCEPTION 'the event log moved past %', seen USING ERRCODE = 'serialization_failure';
    END IF;
    INSERT INTO assignments (account, hash_key, weight, created_at)
        SELECT * FROM UNNEST(accounts, keys, weights, created);
    RETURN QUERY
        INSERT INTO events AS e (at, kind, account, key_after, weight)
            SELECT logged_at, 'allocate', n.a, n.k, n.w
            FROM UNNEST(accounts, keys, weights) WITH ORDINALITY AS n (a, k, w, position)
            ORDER BY n.position
        RETURNING e.account, e.id;
END
$$;
