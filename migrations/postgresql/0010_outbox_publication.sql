-- kinbox 0010: the publication the log relay (relay.source = wal) streams
-- (PostgreSQL only; MariaDB's binlog relay needs no schema object).
--
-- Only INSERTs into kinbox_outbox are published: the log relay never
-- updates a row, and the polling relay's claims and marks stay out of the
-- stream. A publication can be created whatever wal_level is; it is
-- read only by a logical replication slot (docs/outbox.md, "The log
-- relay").
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication
                   WHERE pubname = 'kinbox_outbox_pub') THEN
        CREATE PUBLICATION kinbox_outbox_pub FOR TABLE kinbox_outbox
            WITH (publish = 'insert');
    END IF;
END
$$;
