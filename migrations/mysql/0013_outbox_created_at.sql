-- kinbox 0013: an index on kinbox_outbox.created_at (issue 38). Mirrors
-- migrations/postgresql/0013_outbox_created_at.sql.
--
-- With relay.source = binlog the prune deletes event rows by created_at
-- (the log relay never marks them sent); without this index each batch
-- scanned the table. A partitioned outbox (outbox.layout = partitioned)
-- is created with it too.
CREATE INDEX IF NOT EXISTS kinbox_outbox_created_at
    ON kinbox_outbox (created_at);
