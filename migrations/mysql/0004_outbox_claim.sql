-- kinbox 0004: an outbox claim whose cost does not grow with sent rows
-- (issue 11). Mirrors migrations/postgresql/0004_outbox_claim.sql.
--
-- MariaDB/MySQL have no partial indexes. kinbox_outbox_pending leads with
-- status, so the claim's walk "pending rows in id order" is a range of the
-- index that holds only pending rows: sent rows sit under another status
-- prefix and are never stepped over. It covers every column the candidate
-- read needs (InnoDB appends the primary key), so that read is index-only;
-- the old (status, next_attempt_at, id) index gave no id order and made
-- every claim sort all pending rows. The per-aggregate check keeps using
-- kinbox_outbox_aggregate (aggregate_id, status, id).
CREATE INDEX IF NOT EXISTS kinbox_outbox_pending
    ON kinbox_outbox (status, id, next_attempt_at, destination, aggregate_id);
DROP INDEX IF EXISTS kinbox_outbox_claim ON kinbox_outbox;
