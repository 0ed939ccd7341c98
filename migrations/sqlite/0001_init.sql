-- The authoritative account -> hash key table, and the append-only log of every change to it.

CREATE TABLE assignments (
    account    TEXT    NOT NULL PRIMARY KEY,
    -- 16-byte big-endian: byte order is numeric order.
    hash_key   BLOB    NOT NULL UNIQUE CHECK (length(hash_key) = 16),
    weight     INTEGER NOT NULL CHECK (weight BETWEEN 1 AND 1000000),
    -- Unix milliseconds.
    created_at INTEGER NOT NULL
);

CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('allocate', 'release', 'move', 'reweight')),
    account    TEXT    NOT NULL,
    key_before BLOB    CHECK (key_before IS NULL OR length(key_before) = 16),
    key_after  BLOB    CHECK (key_after IS NULL OR length(key_after) = 16),
    weight     INTEGER NOT NULL
);

-- Settings a database is bound to, such as the keyspace width.
CREATE TABLE meta (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
);
