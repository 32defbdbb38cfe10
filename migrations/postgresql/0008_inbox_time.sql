-- kinbox 0008: the message time of each inbox row, and the record of a
-- partitioned inbox (issue 25). Mirrored by migrations/mysql/0008_inbox_time.sql.
--
-- msg_at:  the message's own time (its Kafka record timestamp), UTC.
-- part_at: the start of the partition range (inbox.partition.width) that
--          msg_at falls in. In the partitioned layout it is the partition
--          key and part of the primary key (consumer, message_id, part_at);
--          the plain layout writes it too, so a later conversion keeps
--          every row where its redeliveries will look for it.
-- shadow:  a marker row written in the neighbouring range by a message
--          within inbox.partition.skew of a boundary (partitioned only):
--          a copy of the message whose time lands on the other side
--          collides with it. Not an applied message of its own.
-- All three are nullable or defaulted: adding them rewrites no row.
ALTER TABLE kinbox_inbox
    ADD COLUMN IF NOT EXISTS msg_at  timestamptz,
    ADD COLUMN IF NOT EXISTS part_at timestamptz,
    ADD COLUMN IF NOT EXISTS shadow  boolean NOT NULL DEFAULT false;

-- One row per partitioned table: its range width and boundary skew, in
-- seconds. No row: kinbox_inbox is the plain table. Written by kinbox
-- migrate when inbox.layout = partitioned; read by every consumer.
CREATE TABLE IF NOT EXISTS kinbox_partitioning (
    table_name  text        PRIMARY KEY,
    width_s     bigint      NOT NULL CHECK (width_s > 0),
    skew_s      bigint      NOT NULL CHECK (skew_s >= 0),
    since       timestamptz NOT NULL DEFAULT now()
);
