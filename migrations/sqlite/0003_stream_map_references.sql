-- Stream events name the map instead of carrying it, so that pages of the log stay small
-- however large the maps: a `stream_put` event records the new map's shard count, and the
-- map itself is the streams row, whose `version` is the id of the event that last wrote it.
ALTER TABLE events ADD COLUMN shard_count INTEGER;
ALTER TABLE streams ADD COLUMN version INTEGER NOT NULL DEFAULT 0;

UPDATE events SET shard_count = json_array_length(detail), detail = NULL
    WHERE kind = 'stream_put' AND detail IS NOT NULL;
UPDATE streams SET version = coalesce(
    (SELECT max(e.id) FROM events e WHERE e.kind = 'stream_put' AND e.stream = streams.name), 0);

-- Earlier releases, still running beside this one during an upgrade, inline the map and
-- know nothing of `version`: the database turns their events into the new form, and sets
-- `version` for every writer.
CREATE TRIGGER events_stream_put AFTER INSERT ON events WHEN NEW.kind = 'stream_put'
BEGIN
    UPDATE events SET shard_count = json_array_length(NEW.detail), detail = NULL
        WHERE id = NEW.id AND NEW.detail IS NOT NULL;
    UPDATE streams SET version = NEW.id WHERE name = NEW.stream;
END;
