-- Who made each change: a token's name, `admin` (--token), `loopback` (no token),
-- `controller` (the closed loop), `import` (`keyspread import`) or `config` (the primary
-- stream named at start-up); never a token. Every insert names it; events logged before
-- this migration (or by an older keyspread, which knows nothing of it) read `unrecorded`.
ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT 'unrecorded';
