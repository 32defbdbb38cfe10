-- kinbox 0011: until when a converted partitioned inbox may hold rows
-- written before msg_at (issue 36). Mirrors
-- migrations/postgresql/0011_inbox_legacy.sql (see there). TIMESTAMP, as
-- processed_at it is computed from.
ALTER TABLE kinbox_partitioning
    ADD COLUMN IF NOT EXISTS legacy_until TIMESTAMP(6) NULL;
