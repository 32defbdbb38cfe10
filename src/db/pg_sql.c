/*
 * pg_sql.c -- PostgreSQL's text of the statements that differ between
 * the backends (struct kinbox__sql, db/sql.h).
 */
#include "../db.h"
#include "opsql.h"

#include <inttypes.h>

const struct kinbox__sql kinbox__pg_sql = {
    .offsets_upsert =
        "INSERT INTO kinbox_offsets (consumer, topic, kafka_partition, "
        "next_offset, last_ts, last_hash, updated_at) VALUES ($1, $2, $3, "
        "$4, $5, $6, now()) "
        "ON CONFLICT (consumer, topic, kafka_partition) DO UPDATE SET "
        "last_ts = CASE WHEN EXCLUDED.next_offset >= "
        "kinbox_offsets.next_offset THEN EXCLUDED.last_ts ELSE "
        "kinbox_offsets.last_ts END, "
        "last_hash = CASE WHEN EXCLUDED.next_offset >= "
        "kinbox_offsets.next_offset THEN EXCLUDED.last_hash ELSE "
        "kinbox_offsets.last_hash END, "
        "next_offset = GREATEST(kinbox_offsets.next_offset, "
        "EXCLUDED.next_offset), updated_at = now()",
    .dead_letter_insert =
        "INSERT INTO kinbox_dead_letter (consumer, message_id, topic, "
        "kafka_partition, kafka_offset, msg_key, headers, payload, error, "
        "attempts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    .outbox_append = NULL,
    .try_lock = "SELECT pg_try_advisory_lock(hashtext($1))",
    .unlock = "SELECT pg_advisory_unlock(hashtext($1))",
    .lock_wait = "SELECT 1 FROM pg_advisory_lock(hashtext($1))",
    .range_count = "SELECT count(*) FROM %.0s%s",
    .migrations_table =
        "CREATE TABLE IF NOT EXISTS kinbox_schema_migrations ("
        " component text NOT NULL, version integer NOT NULL,"
        " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (component, version))",
    .migrations_exists =
        "SELECT CASE WHEN to_regclass('kinbox_schema_migrations') IS NULL "
        "THEN 0 ELSE 1 END",
    .script_begin = "BEGIN;\n",
    .script_commit = "COMMIT;\n",
    /* Deleting by ctid / id from an index scan of processed_at / sent_at
     * keeps each statement to one batch of the oldest rows. */
    .prune_count =
        {"SELECT count(*) FROM kinbox_inbox WHERE processed_at < now() - "
         "%" PRId64 " * interval '1 millisecond'",
         "SELECT count(*) FROM kinbox_outbox WHERE status = 'sent' AND "
         "sent_at < now() - %" PRId64 " * interval '1 millisecond'",
         "SELECT count(*) FROM kinbox_outbox WHERE kind = 'event' AND "
         "status <> 'dead' AND created_at < now() - %" PRId64
         " * interval '1 millisecond'"},
    .prune_delete =
        {"WITH d AS (DELETE FROM kinbox_inbox WHERE ctid IN (SELECT ctid "
         "FROM kinbox_inbox WHERE processed_at < now() - %" PRId64
         " * interval '1 millisecond' LIMIT %" PRId64 ") RETURNING 1) "
         "SELECT count(*) FROM d",
         "WITH d AS (DELETE FROM kinbox_outbox WHERE id IN (SELECT id FROM "
         "kinbox_outbox WHERE status = 'sent' AND sent_at < now() - "
         "%" PRId64 " * interval '1 millisecond' ORDER BY sent_at LIMIT "
         "%" PRId64 ") RETURNING 1) SELECT count(*) FROM d",
         /* kinbox_outbox_created_at (migration 0013) finds the oldest
          * rows. = ANY(ARRAY(...)) deletes by primary key lookups: IN
          * (subquery) planned a hash join over a sequential scan of the
          * whole table for every batch. */
         "WITH d AS (DELETE FROM kinbox_outbox WHERE id = ANY(ARRAY(SELECT "
         "id FROM kinbox_outbox WHERE kind = 'event' AND status <> 'dead' "
         "AND created_at < now() - %" PRId64 " * interval '1 millisecond' "
         "ORDER BY created_at LIMIT %" PRId64 ")) RETURNING 1) SELECT "
         "count(*) FROM d"},
    .prune_age_scale = 1,
    .dead_letter_lock =
        "SELECT consumer, message_id, topic, kafka_partition, kafka_offset,"
        " msg_key, headers, payload, status FROM kinbox_dead_letter"
        " WHERE id = $1::bigint FOR UPDATE",
    .inbox_insert_one =
        "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
        "kafka_partition, kafka_offset, part_at) VALUES ($1, $2, $3, "
        "$4::integer, $5::bigint, to_timestamp($6::bigint))",
    .inbox_undo =
        "DELETE FROM kinbox_inbox WHERE consumer = $1 AND message_id = $2 "
        "AND part_at = to_timestamp($3::bigint) AND topic = $4 AND "
        "kafka_partition = $5::integer AND kafka_offset = $6::bigint",
    .dead_letter_replayed =
        "UPDATE kinbox_dead_letter SET status = 'replayed' WHERE id = "
        "$1::bigint",
    .outbox_gauges =
        "SELECT destination, count(*) FILTER (WHERE status = 'pending'"
        " AND (kind = 'action' OR $1::int = 0)),"
        " COALESCE(extract(epoch FROM now() - min(created_at) FILTER"
        " (WHERE status = 'pending' AND (kind = 'action' OR $1::int = 0))),"
        " 0), count(*) FILTER (WHERE status = 'dead')"
        " FROM kinbox_outbox WHERE status IN ('pending', 'dead')"
        " GROUP BY destination",
    .outbox_pause = "INSERT INTO kinbox_outbox_paused (destination) VALUES "
                    "($1) ON CONFLICT DO NOTHING",
    .outbox_wake = "SELECT pg_notify('kinbox_outbox', '')",
    .outbox_summary =
        "SELECT destination,"
        " count(*) FILTER (WHERE status = 'pending'"
        "  AND (kind = 'action' OR $1::int = 0)),"
        " COALESCE(floor(extract(epoch FROM now() - min(created_at) FILTER"
        "  (WHERE status = 'pending' AND (kind = 'action' OR $1::int = 0))))"
        "  ::bigint, 0),"
        " count(*) FILTER (WHERE status = 'dead'),"
        " count(*) FILTER (WHERE status = 'sent' AND sent_at >="
        "  now() - interval '1 hour'),"
        " EXISTS (SELECT 1 FROM kinbox_outbox_paused z"
        "  WHERE z.destination = o.destination)::int"
        " FROM kinbox_outbox o GROUP BY destination ORDER BY destination",
    .outbox_stuck =
        "SELECT destination, count(*), min(id),"
        " floor(extract(epoch FROM now() - min(created_at)))::bigint"
        " FROM kinbox_outbox WHERE status = 'pending' AND created_at <"
        " now() - $1::bigint * interval '1 millisecond'"
        " AND (kind = 'action' OR $2::int = 0)"
        " GROUP BY destination ORDER BY destination",
    .counters_put =
        "INSERT INTO kinbox_consumer_counters (consumer, instance,"
        " duplicates, business_duplicates, updated_at) VALUES ($1, $2,"
        " $3::bigint, $4::bigint, now()) ON CONFLICT (consumer, instance)"
        " DO UPDATE SET duplicates = EXCLUDED.duplicates,"
        " business_duplicates = EXCLUDED.business_duplicates,"
        " updated_at = now()",
    .counters_remove =
        "DELETE FROM kinbox_consumer_counters WHERE consumer = $1 AND"
        " (instance = $2 OR updated_at < now() - interval '1 hour')",
    .counters_read = "SELECT count(*), COALESCE(sum(duplicates), 0),"
                     " COALESCE(sum(business_duplicates), 0)"
                     " FROM kinbox_consumer_counters WHERE consumer = $1"
                     " AND updated_at > now() - interval '150 seconds'",
    .dead_letter_gauges =
        "SELECT consumer, count(*), extract(epoch FROM now() - min(dead_at)) "
        "FROM kinbox_dead_letter WHERE status = 'dead' GROUP BY consumer",
    .hold_upsert =
        "INSERT INTO kinbox_hold (consumer, topic, kafka_partition, "
        "hold_key, blocker_id) SELECT $1, $2, $3::integer, $4, max(id) FROM "
        "kinbox_dead_letter WHERE consumer = $1 AND topic = $2 AND "
        "kafka_partition = $3::integer AND kafka_offset = $5::bigint ON "
        "CONFLICT (consumer, topic, kafka_partition, hold_key) DO UPDATE "
        "SET blocker_id = kinbox_hold.blocker_id",
    .parked_delete = "WITH d AS (DELETE FROM kinbox_parked WHERE id = "
                     "$1::bigint RETURNING 1) SELECT count(*) FROM d",
    .hold_gauges =
        "SELECT consumer, sum(parked), sum(held), max(age) FROM ("
        " SELECT consumer, count(*) AS parked, 0 AS held,"
        "  extract(epoch FROM now() - min(parked_at)) AS age"
        "  FROM kinbox_parked GROUP BY consumer"
        " UNION ALL SELECT consumer, 0, count(*), 0 FROM kinbox_hold"
        "  GROUP BY consumer) x GROUP BY consumer",
    KINBOX__OPSQL,
    .console_timeout = "SET statement_timeout = 5000",
};
