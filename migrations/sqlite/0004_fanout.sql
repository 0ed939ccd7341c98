-- Hot accounts hold several keys (their fanout K), one row per key, numbered 0..K by `idx`.
-- An account's rows are (account, 0), (account, 1), ...; its weight is the sum of theirs.
-- SQLite cannot change a primary key, so the table is rebuilt; every row is key 0.
CREATE TABLE assignments_v2 (
    account    TEXT    NOT NULL,
    idx        INTEGER NOT NULL DEFAULT 0 CHECK (idx BETWEEN 0 AND 1023),
    -- 16-byte big-endian: byte order is numeric order.
    hash_key   BLOB    NOT NULL UNIQUE CHECK (length(hash_key) = 16),
    -- This key's share of the account's weight.
    weight     INTEGER NOT NULL CHECK (weight BETWEEN 1 AND 1000000),
    -- Unix milliseconds.
    created_at INTEGER NOT NULL,
    PRIMARY KEY (account, idx)
);
INSERT INTO assignments_v2 (account, idx, hash_key, weight, created_at)
    SELECT account, 0, hash_key, weight, created_at FROM assignments;
DROP TABLE assignments;
ALTER TABLE assignments_v2 RENAME TO assignments;

-- Which of the account's keys an account event is about (0 for every earlier event).
ALTER TABLE events ADD COLUMN idx INTEGER NOT NULL DEFAULT 0;
