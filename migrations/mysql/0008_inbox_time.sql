-- kinbox 0008: the message time of each inbox row, and the record of a
-- partitioned inbox (issue 25). Mirrors migrations/postgresql/0008_inbox_time.sql.
--
-- msg_at and part_at are DATETIME holding UTC (kinbox renders them; no
-- session time zone applies), because RANGE COLUMNS partitioning takes
-- DATETIME and not TIMESTAMP. part_at is the start of the partition range
-- that msg_at falls in; shadow marks a boundary marker row (see the
-- PostgreSQL file). Appended nullable/defaulted columns: an instant ALTER.
ALTER TABLE kinbox_inbox
    ADD COLUMN IF NOT EXISTS msg_at  DATETIME(3) NULL,
    ADD COLUMN IF NOT EXISTS part_at DATETIME NULL,
    ADD COLUMN IF NOT EXISTS shadow  TINYINT(1) NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS kinbox_partitioning (
    table_name  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    width_s     BIGINT NOT NULL,
    skew_s      BIGINT NOT NULL,
    since       TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (table_name)
) ENGINE = InnoDB;
