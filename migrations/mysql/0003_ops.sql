-- kinbox 0003: operations (MySQL 8 / MariaDB 10.6+). Mirrors
-- migrations/postgresql/0003_ops.sql.
--
-- Paused outbox destinations: relays claim no row of a destination listed
-- here; its rows stay pending until the destination is resumed.
CREATE TABLE IF NOT EXISTS kinbox_outbox_paused (
    destination VARBINARY(255) NOT NULL,
    paused_at   TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (destination)
) ENGINE = InnoDB;
