-- kinbox 0015: the counters of running consumers (MySQL 8 / MariaDB
-- 10.6+). Mirrors migrations/postgresql/0015_counters.sql.
--
-- Duplicates are not stored (a redelivered message leaves no row): each
-- `kinbox run` records, every second, what its consumers counted since its
-- start, one row per (consumer, process), and deletes its rows when it
-- stops. `kinbox status` sums the rows updated in the last 10 seconds
-- (the running processes); a crashed process's row goes stale and is
-- deleted by the next clean stop of that consumer after an hour.
CREATE TABLE IF NOT EXISTS kinbox_consumer_counters (
    consumer            VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    instance            VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    duplicates          BIGINT       NOT NULL DEFAULT 0,
    business_duplicates BIGINT       NOT NULL DEFAULT 0,
    updated_at          TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, instance)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
