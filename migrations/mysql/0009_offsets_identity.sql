-- kinbox 0009: what identifies the log a watermark came from (issue 36).
-- Mirrors migrations/postgresql/0009_offsets_identity.sql (see there).
-- Appended nullable columns: an instant ALTER.
ALTER TABLE kinbox_offsets
    ADD COLUMN IF NOT EXISTS last_ts   BIGINT NULL,
    ADD COLUMN IF NOT EXISTS last_hash BIGINT NULL;
