-- Who made each change: a token's name, `admin` (--token), `loopback` (no token),
-- `controller` (the closed loop), `import` (`keyspread import`) or `config` (the primary
-- stream named at start-up); never a token. Every insert names it; events logged before
-- this migration (or by an older keyspread, which knows nothing of it) read `unrecorded`.
ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT 'unrecorded';

-- keyspread_insert_keys, keyspread_allocate_keys and keyspread_delete_keys (migration
-- 0008) with each row's actor (the rows of one call may come from several requests). The
-- old ones stay for older replicas during an upgrade; this keyspread calls only these.
CREATE FUNCTION keyspread_insert_keys_by(
    accounts   TEXT[],
    idxs       BIGINT[],
    keys       BYTEA[],
    weights    BIGINT[],
    created    BIGINT[],
    actors     TEXT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, idx BIGINT, id BIGINT) LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(actors) <> cardinality(accounts) THEN
        RAISE EXCEPTION '% actors for % rows', cardinality(actors), cardinality(accounts);
    END IF;
    RETURN QUERY
        WITH new AS (
            SELECT * FROM UNNEST(accounts, idxs, keys, weights, created, actors)
                WITH ORDINALITY AS n (a, i, k, w, c, who, position)),
        assigned AS (
            INSERT INTO assignments (account, idx, hash_key, weight, created_at)
            SELECT n.a, n.i, n.k, n.w, n.c FROM new n ORDER BY n.position)
        INSERT INTO events AS e (at, kind, account, idx, key_after, weight, actor)
        SELECT logged_at, 'allocate', n.a, n.i, n.k, n.w, n.who FROM new n ORDER BY n.position
        RETURNING e.account, e.idx, e.id;
END
$$;

CREATE FUNCTION keyspread_allocate_keys_by(
    lock_key   BIGINT,
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
    IF (SELECT coalesce(max(e.id), 0) FROM events e) > seen THEN
        RAISE EXCEPTION 'the event log moved past %', seen USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN QUERY SELECT * FROM keyspread_insert_keys_by(accounts, idxs, keys, weights, created, actors, logged_at);
END
$$;

CREATE FUNCTION keyspread_delete_keys_by(
    accounts   TEXT[],
    idxs       BIGINT[],
    keys       BYTEA[],
    weights    BIGINT[],
    actors     TEXT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, idx BIGINT, id BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    deleted BIGINT;
BEGIN
    IF cardinality(actors) <> cardinality(accounts) THEN
        RAISE EXCEPTION '% actors for % rows', cardinality(actors), cardinality(accounts);
    END IF;
    DELETE FROM assignments s
        USING UNNEST(accounts, idxs, keys) AS g (a, i, k)
        WHERE s.account = g.a AND s.idx = g.i AND s.hash_key = g.k;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted <> cardinality(accounts) THEN
        RETURN;
    END IF;
    RETURN QUERY
        INSERT INTO events AS e (at, kind, account, idx, key_before, weight, actor)
        SELECT logged_at, 'release', g.a, g.i, g.k, g.w, g.who
            FROM UNNEST(accounts, idxs, keys, weights, actors) WITH ORDINALITY AS g (a, i, k, w, who, position)
            ORDER BY g.position
        RETURNING e.account, e.idx, e.id;
END
$$;
