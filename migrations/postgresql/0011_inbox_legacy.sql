-- kinbox 0011: until when a converted partitioned inbox may hold rows
-- written before msg_at (issue 36). Mirrored by
-- migrations/mysql/0011_inbox_legacy.sql.
--
-- A plain inbox row without msg_at (written before 0008) has no record
-- time to place it by: the conversion keys it by the epoch's range (the
-- catch-all, like a record without a timestamp) and sets legacy_until to
-- the latest such row's processed_at + inbox.retention, when the pruner
-- has deleted the last of them. Until then consumers also look a batch's
-- new messages up among those rows by (consumer, message_id), as the plain
-- table's key did. NULL: no such rows.
ALTER TABLE kinbox_partitioning
    ADD COLUMN IF NOT EXISTS legacy_until timestamptz;
