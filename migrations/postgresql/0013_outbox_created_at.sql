-- kinbox 0013: an index on kinbox_outbox.created_at (issue 38).
--
-- With relay.source = wal the prune deletes event rows by created_at
-- (the log relay never marks them sent); without this index each batch
-- walked the primary key and the last batch of a run read the rest of the
-- table. A partitioned outbox (outbox.layout = partitioned) is created
-- with it too (it prunes its catch-all partition by created_at).
CREATE INDEX IF NOT EXISTS kinbox_outbox_created_at
    ON kinbox_outbox (created_at);

-- outbox.layout = partitioned with relay.source = wal: where the log
-- stood (pos, pg_current_wal_lsn()) at the database's time at, one row
-- per pruner run, kept two days. A day's range is dropped only once the
-- relay's slot confirmed past a mark taken after the day ended
-- (docs/outbox.md, Write-only retention).
CREATE TABLE IF NOT EXISTS kinbox_outbox_marks (
    at  timestamptz PRIMARY KEY,
    pos text        NOT NULL
);
