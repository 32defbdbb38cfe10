-- kinbox 0015: the counters of running consumers (PostgreSQL). Mirrored by
-- migrations/mysql/0015_counters.sql.
--
-- Duplicates are not stored (a redelivered message leaves no row): each
-- `kinbox run` records, every second, what its consumers counted since its
-- start, one row per (consumer, process), and deletes its rows when it
-- stops. `kinbox status` sums the rows updated in the last 10 seconds
-- (the running processes); a crashed process's row goes stale and is
-- deleted by the next clean stop of that consumer after an hour.
CREATE TABLE IF NOT EXISTS kinbox_consumer_counters (
    consumer            text        NOT NULL,
    instance            text        NOT NULL,
    duplicates          bigint      NOT NULL DEFAULT 0,
    business_duplicates bigint      NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, instance)
);
