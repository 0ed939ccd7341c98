-- Accounts that opted in with `max_fanout`, hold several keys, and whose load the load
-- controller last found at or below the hot share: since when (Unix milliseconds, the
-- database's clock). Their fanout comes down once cold for ten half-lives; a round that
-- finds one hot again, or at one key, deletes its row.
CREATE TABLE fanout_cold (
    account TEXT    NOT NULL PRIMARY KEY,
    since   BIGINT  NOT NULL
);
