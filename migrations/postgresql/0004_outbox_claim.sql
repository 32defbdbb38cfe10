-- kinbox 0004: an outbox claim whose cost does not grow with sent rows and
-- does not depend on the planner's statistics (issue 11).
--
-- The claim first reads candidate heads without locking them. That read is
-- an index-only scan of kinbox_outbox_pending: the partial index holds only
-- pending rows, in id order, and every column the read needs, so an
-- analyzed table (where most rows are 'sent', or where every row was still
-- pending when it was analyzed) cannot make a walk of the primary key and
-- its sent rows look cheaper. The per-aggregate check ("an older pending
-- row of this aggregate?") and the run of an aggregate's next rows read
-- kinbox_outbox_agg_pending the same way.
CREATE INDEX IF NOT EXISTS kinbox_outbox_pending
    ON kinbox_outbox (id) INCLUDE (next_attempt_at, aggregate_id, destination)
    WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS kinbox_outbox_agg_pending
    ON kinbox_outbox (aggregate_id, id) INCLUDE (next_attempt_at, destination)
    WHERE status = 'pending';
-- Superseded by the two above.
DROP INDEX IF EXISTS kinbox_outbox_claim;
DROP INDEX IF EXISTS kinbox_outbox_aggregate;
