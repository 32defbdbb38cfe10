-- kinbox 0009: what identifies the log a watermark came from (issue 36).
-- Mirrored by migrations/mysql/0009_offsets_identity.sql.
--
-- The record at next_offset - 1 (the last one applied on the partition):
-- last_ts:   its Kafka timestamp in ms since the epoch (-1: it had none).
-- last_hash: FNV-1a 64 of its key and payload (src/startpos.c,
--            kinbox__record_hash()), as a signed 64-bit integer.
-- On assignment the consumer reads that record again and refuses the
-- partition when it is not the same (the topic was deleted and created
-- again). Both NULL: not known (rows written before 0009, or cleared by
-- `kinbox offsets reset`). Nullable: adding them rewrites no row.
ALTER TABLE kinbox_offsets
    ADD COLUMN IF NOT EXISTS last_ts   bigint,
    ADD COLUMN IF NOT EXISTS last_hash bigint;
