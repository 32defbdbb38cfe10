-- kinbox 0003: operations (PostgreSQL). Mirrored by migrations/mysql/0003_ops.sql.
--
-- Paused outbox destinations: relays claim no row of a destination listed
-- here (`kinbox outbox pause DEST`); its rows stay pending, in order, until
-- `kinbox outbox resume DEST` deletes the row.
CREATE TABLE IF NOT EXISTS kinbox_outbox_paused (
    destination text        PRIMARY KEY,
    paused_at   timestamptz NOT NULL DEFAULT now()
);
