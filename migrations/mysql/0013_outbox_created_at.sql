-- kinbox 0013: an index on kinbox_outbox.created_at (issue 38). Mirrors
-- migrations/postgresql/0013_outbox_created_at.sql.
--
-- With relay.source = binlog the prune deletes event rows by created_at
-- (the log relay never marks them sent); without this index each batch
-- scanned the table. A partitioned outbox (outbox.layout = partitioned)
-- is created with it too.
CREATE INDEX IF NOT EXISTS kinbox_outbox_created_at
    ON kinbox_outbox (created_at);

-- outbox.layout = partitioned with relay.source = binlog: where the log
-- stood (pos, @@gtid_binlog_pos) at the database's time at, one row per
-- pruner run, kept two days. A day's range is dropped only once the
-- relay's stored position (kinbox_relay_position) is past a mark taken
-- after the day ended (docs/outbox.md, Write-only retention).
CREATE TABLE IF NOT EXISTS kinbox_outbox_marks (
    at  TIMESTAMP(6)  NOT NULL,
    pos VARCHAR(2048) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    PRIMARY KEY (at)
) ENGINE = InnoDB;
