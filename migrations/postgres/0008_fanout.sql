-- Hot accounts hold several keys (their fanout K), one row per key, numbered 0..K by `idx`.
-- An account's rows are (account, 0), (account, 1), ...; its weight is the sum of theirs.
-- Every existing row is key 0; earlier releases, which know nothing of `idx`, keep
-- writing key 0 rows and events.
ALTER TABLE assignments ADD COLUMN idx BIGINT NOT NULL DEFAULT 0 CHECK (idx BETWEEN 0 AND 1023);
ALTER TABLE assignments DROP CONSTRAINT assignments_pkey;
ALTER TABLE assignments ADD PRIMARY KEY (account, idx);

ALTER TABLE events ADD COLUMN idx BIGINT NOT NULL DEFAULT 0;

-- keyspread_insert_allocations and keyspread_allocate (migration 0004), with each row's
-- key index; they answer (account, idx, id) per row.
CREATE FUNCTION keyspread_insert_keys(
    accounts   TEXT[],
    idxs       BIGINT[],
    keys       BYTEA[],
    weights    BIGINT[],
    created    BIGINT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, idx BIGINT, id BIGINT) LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        WITH new AS (
            SELECT * FROM UNNEST(accounts, idxs, keys, weights, created)
                WITH ORDINALITY AS n (a, i, k, w, c, position)),
        assigned AS (
            INSERT INTO assignments (account, idx, hash_key, weight, created_at)
            SELECT n.a, n.i, n.k, n.w, n.c FROM new n ORDER BY n.position)
        INSERT INTO events AS e (at, kind, account, idx, key_after, weight)
        SELECT logged_at, 'allocate', n.a, n.i, n.k, n.w FROM new n ORDER BY n.position
        RETURNING e.account, e.idx, e.id;
END
$$;

CREATE FUNCTION keyspread_allocate_keys(
    lock_key   BIGINT,
    seen       BIGINT,
    accounts   TEXT[],
    idxs       BIGINT[],
    keys       BYTEA[],
    weights    BIGINT[],
    created    BIGINT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, idx BIGINT, id BIGINT) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    IF (SELECT coalesce(max(e.id), 0) FROM events e) > seen THEN
        RAISE EXCEPTION 'the event log moved past %', seen USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN QUERY SELECT * FROM keyspread_insert_keys(accounts, idxs, keys, weights, created, logged_at);
END
$$;

-- keyspread_delete_assignments (migration 0006) with each row's key index: deletes each
-- (account, idx, hash key) row and logs a `release` for it, or nothing at all if any row
-- is not there as given.
CREATE FUNCTION keyspread_delete_keys(
    accounts   TEXT[],
    idxs       BIGINT[],
    keys       BYTEA[],
    weights    BIGINT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, idx BIGINT, id BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    deleted BIGINT;
BEGIN
    DELETE FROM assignments s
        USING UNNEST(accounts, idxs, keys) AS g (a, i, k)
        WHERE s.account = g.a AND s.idx = g.i AND s.hash_key = g.k;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted <> cardinality(accounts) THEN
        RETURN;
    END IF;
    RETURN QUERY
        INSERT INTO events AS e (at, kind, account, idx, key_before, weight)
        SELECT logged_at, 'release', g.a, g.i, g.k, g.w
            FROM UNNEST(accounts, idxs, keys, weights) WITH ORDINALITY AS g (a, i, k, w, position)
            ORDER BY g.position
        RETURNING e.account, e.idx, e.id;
END
$$;
