/*
 * db/sql.h -- the dialect statement table (internal; included by db.h,
 * which users include): struct kinbox__sql, filled by db/pg.c and
 * db/mysql.c, read as db->ops->sql->FIELD by the modules above.
 */
#ifndef KINBOX_DB_SQL_H
#define KINBOX_DB_SQL_H

/*
 * Statements whose spelling differs between backends. Parameters in the
 * order given in each comment.
 */
struct kinbox__sql {
        /* $1 consumer $2 topic $3 partition $4 next_offset $5 last_ts
         * $6 last_hash (the record at next_offset - 1, startpos.h): upsert;
         * the offset never goes back, the identity goes with it. */
        const char *offsets_upsert;
        /* $1 consumer $2 message_id $3 topic $4 partition $5 offset $6 key
         * (binary) $7 headers (text, JSON) $8 payload (binary) $9 error
         * $10 attempts */
        const char *dead_letter_insert;
        /* Outbox append: $1 kind $2 destination $3 idem_key $4 aggregate_id
         * $5 payload (binary) $6 headers (JSON) $7 max_attempts; must not
         * abort the transaction on a duplicate (destination, idem_key);
         * returns the id of a new row, no row for a duplicate. */
        const char *outbox_append;
        /* Single-instance lock for the pruner: $1 lock name. Returns one
         * row, '1'/'t' when acquired. */
        const char *try_lock;
        const char *unlock;
        /* $1 lock name: wait for it (up to 10 minutes on MySQL), held by
         * the session until its connection closes (kinbox migrate: one at
         * a time per database). One row, '1' when acquired. */
        const char *lock_wait;
        /* printf format of (table, range partition name): the exact row
         * count of one range (kinbox__ranges_read() when the catalog has
         * no estimate yet). */
        const char *range_count;
        /* Migrations: the kinbox_schema_migrations table (idempotent DDL)
         * and the text around a migration script so that it applies
         * atomically ("" where DDL commits implicitly: those scripts are
         * idempotent instead). */
        const char *migrations_table;
        /* One row, one column: 1 when kinbox_schema_migrations exists in
         * the connection's database (schema), else 0. */
        const char *migrations_exists;
        const char *script_begin, *script_commit;
        /* Pruning, [0] the inbox, [1] sent outbox rows, [2] event rows
         * (kind 'event') but dead ones by created_at, whatever their status
         * (relay.source = wal | binlog: the log relay never marks them; see
         * prune.c for why deleting them is safe): printf formats of
         * (int64 age) for the count and (int64 age, int64 batch) for one
         * batched delete returning (PG) or affecting (MySQL) the rows
         * deleted. The age is in milliseconds times prune_age_scale. */
        const char *prune_count[3], *prune_delete[3];
        int prune_age_scale;
        /* Replay: $1 id: consumer, message_id, topic, kafka_partition,
         * kafka_offset, msg_key, headers, payload, status of the dead
         * letter, locked FOR UPDATE. */
        const char *dead_letter_lock;
        /* $1 consumer $2 message_id $3 topic $4 partition $5 offset $6
         * part_at in seconds since the epoch (kinbox__inbox_part_of()). */
        const char *inbox_insert_one;
        /* $1 consumer $2 message_id $3 part_at (seconds since the epoch)
         * $4 topic $5 partition $6 offset: delete that row
         * (kinbox__inbox_undo()). */
        const char *inbox_undo;
        /* $1 id: the dead letter is replayed. */
        const char *dead_letter_replayed;
        /* Per destination: pending rows, oldest pending age (s), dead rows
         * (gauges sampled at scrape). $1 '1': pending counts action rows
         * only (relay.source = wal | binlog: event rows are never marked,
         * their backlog is the log relay's), '0': every row. */
        const char *outbox_gauges;
        /* Per consumer: dead letters (status dead), oldest one's age (s). */
        const char *dead_letter_gauges;
        /* $1 destination: pause it (no error when paused already). */
        const char *outbox_pause;
        /* After a resume: wake listening relays, or NULL. */
        const char *outbox_wake;
        /* dead_letter.hold_key (hold.c): $1 consumer $2 topic $3 partition
         * $4 hold_key (binary) $5 offset of the blocking dead letter.
         * Inserts the hold row, or locks and keeps an existing one (so a
         * release of the key waits for the inserting transaction). */
        const char *hold_upsert;
        /* Per consumer: parked messages, held keys, oldest parked
         * message's age (s) (gauges sampled at scrape). */
        const char *hold_gauges;
        /* $1 parked row id: delete it, for outbox->affected() (the
         * number of rows deleted). */
        const char *parked_delete;
        /* See kinbox_admin_outbox_summary() ($1 as for outbox_gauges) /
         * kinbox_admin_outbox_stuck() ($1 older than, in ms; $2 as $1 of
         * outbox_gauges). */
        const char *outbox_summary, *outbox_stuck;
        /* kinbox_consumer_counters (kinbox_admin_counters_record(),
         * kinbox_admin_status()): counters_put: $1 consumer $2 instance
         * $3 duplicates $4 business duplicates, now. counters_remove: $1
         * consumer $2 instance (with the consumer's rows stale for an
         * hour). counters_read: $1 consumer: one row of the rows updated
         * in the last 150 s (a running process rewrites an unchanged row
         * every 60 s: src/cli/counters.c): their number, duplicates,
         * business duplicates. */
        const char *counters_put, *counters_remove, *counters_read;
        /* The operator statements, alike on both backends (src/db/opsql.h).
         * ping: reachability. outbox_paused / outbox_resume: $1
         * destination (a row when paused / unpause). consumer_status: $1
         * consumer: one row of inbox rows, dead letters dead / replayed /
         * discarded, parked messages, held keys, oldest parked_at.
         * inbox_rows: one row, one count. consumers: (consumer, topic)
         * pairs of the watermarks and dead letters, in order.
         * dead_list: printf format of
         * (long limit), $1 consumer $2 status (NULL: any). dead_show,
         * dead_status, dead_discard, dead_held, dead_last_follower: $1
         * dead letter id. dead_parked: printf format of (long limit), $1
         * consumer (NULL: any). dead_follower_state: $1 parked row id, $2
         * dead letter id. dead_at: $1 consumer $2 topic $3 partition $4
         * offset. verify_ahead, verify_cover: $1 consumer. Columns as in
         * the callers (dead.c, verify.c, admin.c). */
        const char *ping, *outbox_paused, *outbox_resume;
        const char *consumer_status, *inbox_rows, *consumers;
        const char *dead_list, *dead_show, *dead_parked, *dead_status;
        const char *dead_discard, *dead_held, *dead_last_follower;
        const char *dead_follower_state, *dead_at;
        const char *verify_ahead, *verify_cover;
        /* The console (src/console_data.c): console_dead_page, printf
         * format of (long limit), $1 consumer $2 status $3 topic (NULL:
         * any) $4 ids below this, newest first; columns as dead_list's
         * plus first_failed_at after attempts. console_timeout: the
         * session's statement time limit (5 s). */
        const char *console_dead_page, *console_timeout;
};

/* PostgreSQL's (db/pg_sql.c). */
extern const struct kinbox__sql kinbox__pg_sql;

#endif
