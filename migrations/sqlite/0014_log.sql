-- The log's name: a random UUID (version 4) drawn when the database is created (or first
-- migrated by a keyspread that knows it). Event ids mean something only within one log, so
-- readers (replicas, mirrors) that find another name start again from a snapshot. A
-- replica that finds this log rewound (an older copy of the file) draws a new name.
INSERT INTO meta (name, value)
SELECT 'log_id', lower(
    hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2)
    || '-' || substr('89ab', 1 + abs(random() % 4), 1) || substr(hex(randomblob(2)), 2)
    || '-' || hex(randomblob(6)))
ON CONFLICT (name) DO NOTHING;
