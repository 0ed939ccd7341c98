-- Releases in one round trip: a group of releases deletes its assignments and logs a
-- `release` event each in one call, whatever its size.
--
-- keyspread_delete_assignments deletes each (account, hash key) row and answers each
-- account's event id; it answers nothing, and logs nothing, if any row is not there as
-- given (another writer changed it): the caller rolls back. The caller holds the write
-- lock and has caught up with the log, so that does not happen in practice.
CREATE FUNCTION keyspread_delete_assignments(
    accounts   TEXT[],
    keys       BYTEA[],
    weights    BIGINT[],
    logged_at  BIGINT
) RETURNS TABLE (account TEXT, id BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    deleted BIGINT;
BEGIN
    DELETE FROM assignments s
        USING UNNEST(accounts, keys) AS g (a, k)
        WHERE s.account = g.a AND s.hash_key = g.k;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted <> cardinality(accounts) THEN
        RETURN;
    END IF;
    RETURN QUERY
        INSERT INTO events AS e (at, kind, account, key_before, weight)
        SELECT logged_at, 'release', g.a, g.k, g.w
            FROM UNNEST(accounts, keys, weights) WITH ORDINALITY AS g (a, k, w, position)
            ORDER BY g.position
        RETURNING e.account, e.id;
END
$$;
