-- Stream events name the map instead of carrying it, so that pages of the log stay small
-- however large the maps: a `stream_put` event records the new map's shard count, and the
-- map itself is the streams row, whose `version` is the id of the event that last wrote it.
ALTER TABLE events ADD COLUMN shard_count BIGINT;
ALTER TABLE streams ADD COLUMN version BIGINT NOT NULL DEFAULT 0;

UPDATE events SET shard_count = json_array_length(detail::json), detail = NULL
    WHERE kind = 'stream_put' AND detail IS NOT NULL;
UPDATE streams s SET version = coalesce(
    (SELECT max(e.id) FROM events e WHERE e.kind = 'stream_put' AND e.stream = s.name), 0);

-- Earlier releases, still running beside this one during an upgrade, inline the map and
-- know nothing of `version`: the database turns their events into the new form, and sets
-- `version` for every writer.
CREATE FUNCTION keyspread_stream_put() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.detail IS NOT NULL THEN
        NEW.shard_count := json_array_length(NEW.detail::json);
        NEW.detail := NULL;
    END IF;
    UPDATE streams SET version = NEW.id WHERE name = NEW.stream;
    RETURN NEW;
END
$$;

CREATE TRIGGER events_stream_put BEFORE INSERT ON events FOR EACH ROW
    WHEN (NEW.kind = 'stream_put') EXECUTE FUNCTION keyspread_stream_put();
