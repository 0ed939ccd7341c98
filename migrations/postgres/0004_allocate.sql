-- Allocation in one round trip.
--
-- keyspread_insert_allocations inserts new assignments with an `allocate` event each and
-- answers each account's event id; a writer that already holds the write lock calls it
-- inside its transaction.
--
-- keyspread_allocate does the whole write: take the write lock, check that the log is
-- where the caller last saw it, insert. Called as a statement of its own, it is its own
-- transaction, committed before the answer is sent. `lock_key` is the store's write lock
-- (src/store/postgres.rs), `seen` the last event the caller applied. A log that moved on
-- (another replica wrote) fails with serialization_failure and changes nothing: the
-- caller catches up and tries again.
CREATE FUNCTION keyspread_insert_allocations(
    accounts   TEXT[],
    keys       BYTEA[],
    weights    BIGINT[],
    created    BIGINT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, id BIGINT) LANGUAGE plpgsql AS $$
BEGIN
    -- PL/pgSQL, not SQL: it keeps the statement's plan for the session.
    RETURN QUERY
        WITH new AS (
            SELECT * FROM UNNEST(accounts, keys, weights, created)
                WITH ORDINALITY AS n (a, k, w, c, position)),
        assigned AS (
            INSERT INTO assignments (account, hash_key, weight, created_at)
            SELECT n.a, n.k, n.w, n.c FROM new n ORDER BY n.position)
        INSERT INTO events AS e (at, kind, account, key_after, weight)
        SELECT logged_at, 'allocate', n.a, n.k, n.w FROM new n ORDER BY n.position
        RETURNING e.account, e.id;
END
$$;

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
    RETURN QUERY SELECT * FROM keyspread_insert_allocations(accounts, keys, weights, created, logged_at);
END
$$;
