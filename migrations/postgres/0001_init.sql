-- The authoritative account -> hash key table, and the append-only log of every change to it.

CREATE TABLE assignments (
    -- "C" collation: paging by account sorts bytewise, as on SQLite.
    account    TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    -- 16-byte big-endian: byte order is numeric order.
    hash_key   BYTEA  NOT NULL UNIQUE CHECK (octet_length(hash_key) = 16),
    weight     BIGINT NOT NULL CHECK (weight BETWEEN 1 AND 1000000),
    -- Unix milliseconds.
    created_at BIGINT NOT NULL
);

CREATE TABLE events (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         BIGINT NOT NULL,
    kind       TEXT   NOT NULL CONSTRAINT events_kind CHECK (kind IN ('allocate', 'release', 'move', 'reweight')),
    account    TEXT   NOT NULL,
    key_before BYTEA  CHECK (key_before IS NULL OR octet_length(key_before) = 16),
    key_after  BYTEA  CHECK (key_after IS NULL OR octet_length(key_after) = 16),
    weight     BIGINT NOT NULL
);

-- Settings a database is bound to, such as the keyspace width.
CREATE TABLE meta (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
);
