-- The first committed answer to each change sent with an Idempotency-Key, per actor (the
-- token's name): a repeat with the same key and request is answered this again instead of
-- being applied again. Written in the change's own transaction; kept 24 h, and at most a
-- bounded number per actor (the oldest go first).
CREATE TABLE idempotency (
    actor TEXT NOT NULL,
    key TEXT NOT NULL,
    -- SHA-256 of the request's method, path and body: "the same request".
    fingerprint BLOB NOT NULL,
    status INTEGER NOT NULL,
    content_type TEXT,
    -- The body's length in bytes, for the bound per actor.
    size INTEGER NOT NULL,
    body BLOB NOT NULL,
    -- Unix milliseconds, by the database's clock.
    created_at INTEGER NOT NULL,
    PRIMARY KEY (actor, key)
);
CREATE INDEX idempotency_age ON idempotency (created_at);
CREATE INDEX idempotency_actor_age ON idempotency (actor, created_at);
