/**
 * @file admin.h
 * @brief Operations: retention (pruning and the start-up retention check),
 *        reconciliation, the operator's database handle (status counts;
 *        the outbox: pause, summaries, requeue, cancel, list; dead
 *        letters: list, show, discard, replay, the messages parked behind
 *        them; verification; start positions).
 *
 * Unless a call says otherwise: a ::kinbox_admin_t is used by one thread
 * at a time; rows handed out are the caller's (kinbox_rows_destroy());
 * strings are copied, not kept; a failure leaves its reason in
 * kinbox_admin_errstr() until the next call.
 *
 * These are the calls the `kinbox` command's `prune`, `status`, `outbox`,
 * `dead`, `verify` and `run` (pruner thread, `[metrics] listen`) are built
 * on.
 */
#ifndef KINBOX_ADMIN_H
#define KINBOX_ADMIN_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "error.h"
#include "conf.h"
#include "handler.h"
#include "consumer.h"

KINBOX_BEGIN_DECLS

/* ------------------------------------------------------------------------
 * Retention
 */

/** What one pruning run deleted (or, dry, would delete). */
typedef struct kinbox_prune_result {
        uint64_t inbox_rows; /**< inbox rows older than inbox.retention */
        uint64_t outbox_rows; /**< sent outbox rows older than
                                   outbox.retention */
        int skipped; /**< 1: another instance holds the pruning
                                   lock, nothing was done */
        /* A partitioned inbox (`inbox.layout = partitioned`): */
        uint64_t partitions_dropped; /**< whole ranges dropped (their
                                        rows count in inbox_rows as the
                                        catalog estimates them) */
        uint64_t partitions_created; /**< ranges created ahead */
        uint64_t rows_kept; /**< rows of dropped ranges kept because a dead
                                 letter or parked message needs them */
        uint64_t outbox_log_rows; /**< `relay.source = wal | binlog`:
                                       event rows (not action rows) created
                                       more than outbox.retention ago,
                                       whatever their status but dead */
} kinbox_prune_result_t;

/**
 * @brief Delete inbox rows older than `inbox.retention` and sent outbox
 *        rows older than `outbox.retention`, `prune.batch` rows per
 *        statement with a short pause between statements.
 *
 * A partitioned inbox is pruned by whole partitions instead: ranges are
 * created `inbox.partition.ahead` ahead of now, a range whose whole span
 * is older than `inbox.retention` is dropped (the rows of it that an
 * unresolved dead letter or a parked message needs are kept), and the
 * catch-all is pruned row by row (docs/operations.md, Daily partitions).
 *
 * Only one instance prunes at a time: the run first takes a named lock
 * (PostgreSQL advisory lock, MySQL `GET_LOCK`) on its own connection and
 * returns with `skipped = 1` when another instance holds it. Dead outbox
 * rows and dead letters are never deleted; canceled rows neither, except
 * as below.
 *
 * With `relay.source = wal | binlog` the log relay publishes event rows
 * from the database's log and never marks them: event rows (every
 * destination but `action:NAME`) created more than `outbox.retention` ago
 * are deleted too, pending, sent or canceled (not dead), counted in
 * `outbox_log_rows` (docs/outbox.md, the log relay).
 * @param conf    reads `database.*`, `inbox.retention`, `outbox.retention`,
 *                `prune.batch`, `relay.source`; not kept.
 * @param dry_run non-zero: count what would go, delete nothing (the lock
 *                is not taken); each day partition the run would drop
 *                (inbox ranges, outbox days, with their estimated rows)
 *                and each outbox day the database refuses yet is logged
 *                (NOTICE, through the configuration's logger).
 * @param stop    optional flag checked between statements: non-zero stops
 *                the run early (what was deleted stays deleted).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN; ::KINBOX_ERR_DB.
 * @remark Thread-safe (own connection).
 */
KINBOX_API kinbox_err_t kinbox_prune(const kinbox_conf_t *conf, int dry_run,
                                     const volatile int *stop,
                                     kinbox_prune_result_t *out, char *errstr,
                                     size_t errstr_size);

/**
 * @brief Check that `inbox.retention` exceeds the redelivery window of the
 *        topics in @p conf's `topics`.
 *
 * The window is the largest `retention.ms` of those topics, asked of the
 * broker (`kafka.*` settings) with the Admin API DescribeConfigs and a
 * short timeout; where the broker cannot answer, `kafka.redelivery.window`.
 * A topic with infinite retention (-1) cannot be covered by any inbox
 * retention and fails the check.
 * @param window_ms receives the window used (may be NULL).
 * @param source    receives "broker" or "kafka.redelivery.window" (may be
 *                  NULL; static string).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_CONFIG with both numbers in @p errstr
 *          when the retention is too short.
 */
KINBOX_API kinbox_err_t kinbox_retention_check(const kinbox_conf_t *conf,
                                               int64_t *window_ms,
                                               const char **source,
                                               char *errstr,
                                               size_t errstr_size);

/* ------------------------------------------------------------------------
 * Reconciliation
 */

/**
 * A named business check: one query per backend that returns one row per
 * discrepancy (for example a deposit marked paid without its ledger
 * posting), and no rows when all is well.
 *
 * The query gets one parameter, `$1`: `reconcile.grace` in whole seconds.
 * It should return only discrepancies older than that, so that work still
 * in flight (an event not yet consumed) is not reported. Queries run in
 * autocommit on their own connection and must only read.
 */
typedef struct kinbox_check {
        const char *name; /**< e.g. "ledger.unbalanced_postings";
                                         the `check` label of the gauge */
        const char *description; /**< one line for humans */
        const char *sql_postgresql; /**< NULL: not available there */
        const char *sql_mysql; /**< NULL: not available there */
} kinbox_check_t;

/**
 * @brief Called by kinbox_reconcile() once per check that ran.
 * @param rows the discrepancy rows (0 rows: clean); owned by kinbox, valid
 *             only during the call.
 * @remark Runs on the thread that called kinbox_reconcile().
 */
typedef void (*kinbox_reconcile_cb)(const kinbox_check_t *check,
                                    const kinbox_rows_t *rows, void *opaque);

/** What one reconciliation run found. */
typedef struct kinbox_reconcile_result {
        int checks; /**< checks that ran */
        uint64_t discrepancies; /**< rows returned by all checks */
        int skipped; /**< 1: another instance holds the lock */
} kinbox_reconcile_result_t;

/**
 * @brief Run reconciliation checks against the configured database.
 *
 * Each check's query for the backend of `database.url` runs with `$1` =
 * `reconcile.grace` in seconds; a check without SQL for that backend is
 * left out. After each check the gauge
 * `kinbox_reconcile_discrepancies{check="NAME"}` is set to its row count,
 * and @p cb (if not NULL) sees the rows.
 * @param checks  @p nchecks pointers; neither array nor checks are kept.
 * @param lock    non-zero: first take the named database lock
 *                `kinbox_reconcile` (PostgreSQL advisory lock, MySQL
 *                `GET_LOCK`) on the run's own connection; when another
 *                instance holds it nothing runs and `skipped = 1` (what
 *                `kinbox run` does on every replica).
 * @returns ::KINBOX_OK (discrepancies are results, not errors);
 *          ::KINBOX_ERR_CONFIG (bad URL or password file);
 *          ::KINBOX_ERR_DB_CONN; ::KINBOX_ERR_DB (a check's query failed;
 *          @p errstr names the check; checks before it have reported).
 * @remark Thread-safe (own connection).
 */
KINBOX_API kinbox_err_t kinbox_reconcile(const kinbox_conf_t *conf,
                                         const kinbox_check_t *const *checks,
                                         size_t nchecks, int lock,
                                         kinbox_reconcile_cb cb, void *opaque,
                                         kinbox_reconcile_result_t *out,
                                         char *errstr, size_t errstr_size);

/* ------------------------------------------------------------------------
 * A Kafka client for health checks and operator commands
 */

/** A librdkafka client that joins no group. Opaque. */
typedef struct kinbox_kafka_s kinbox_kafka_t;

/**
 * @brief Create a librdkafka client (a consumer handle outside any group)
 *        from every `kafka.*` setting of @p conf, as the consumers pass
 *        them to librdkafka (bootstrap, security, SASL, TLS, timeouts),
 *        then @p extra.
 *
 * `kafka.group.id` and `kafka.group.instance.id` are left out (this client
 * must not join or fence a consumer's group) unless @p extra sets them.
 * librdkafka's log lines go through @p conf's logger
 * (kinbox_conf_set_log_cb(), `log.level`, `log.format`).
 * @param conf  read now, not kept.
 * @param extra NULL, or librdkafka name/value pairs ending with a NULL
 *              name, e.g. `{"group.id", "g", "log_level", "0", NULL}`.
 * @returns The client, or NULL with @p errstr set (an invalid setting).
 * @remark Thread-safe, as librdkafka's handle is.
 */
KINBOX_API kinbox_kafka_t *kinbox_kafka_new(const kinbox_conf_t *conf,
                                            const char *const *extra,
                                            char *errstr, size_t errstr_size);

/**
 * @brief Whether the cluster answers with these settings: a metadata
 *        request (brokers only) within @p timeout_ms.
 * @returns 0 when it answered; -1 with librdkafka's reason in @p why.
 * @remark Thread-safe.
 */
KINBOX_API int kinbox_kafka_ready(kinbox_kafka_t *k, int timeout_ms, char *why,
                                  size_t why_size);

/** @brief Free the client. NULL is a no-op. */
KINBOX_API void kinbox_kafka_destroy(kinbox_kafka_t *k);

/* ------------------------------------------------------------------------
 * An operator's database handle
 */

/** A connection to kinbox's database for operators. Opaque; one thread at
 *  a time. */
typedef struct kinbox_admin_s kinbox_admin_t;

/**
 * @brief Create a handle from `database.url` / `database.password_file`
 *        (read now, not kept). Connects lazily. `relay.source` (read now)
 *        tells how the outbox is relayed: not `poll`, event rows are not
 *        counted as pending (kinbox_admin_outbox_summary()).
 * @returns The handle, or NULL with @p errstr set (bad URL, unreadable
 *          password file).
 */
KINBOX_API kinbox_admin_t *kinbox_admin_new(const kinbox_conf_t *conf,
                                            char *errstr, size_t errstr_size);

/** @brief Free the handle. NULL is a no-op. */
KINBOX_API void kinbox_admin_destroy(kinbox_admin_t *adm);

/** @brief Last error text, "" if none. Owned by @p adm. */
KINBOX_API const char *kinbox_admin_errstr(const kinbox_admin_t *adm);

/** @brief The backend of the configured URL. */
KINBOX_API kinbox_backend_t kinbox_admin_backend(const kinbox_admin_t *adm);

/**
 * @brief Pause (@p pause true) or resume relays claiming @p destination's
 *        outbox rows, for every relay at once (stored in the database).
 *        Paused rows stay pending and keep their order; resuming wakes
 *        listening relays (PostgreSQL NOTIFY).
 * @param was_paused receives whether it was paused before; may be NULL.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN (unreachable; the next call
 *          reconnects); ::KINBOX_ERR_DB; the reason in
 *          kinbox_admin_errstr().
 */
KINBOX_API kinbox_err_t kinbox_admin_outbox_pause(kinbox_admin_t *adm,
                                                  const char *destination,
                                                  int pause, int *was_paused);

/**
 * @brief The outbox per destination, ordered by destination: columns
 *        destination, pending rows, age of the oldest pending row
 *        (whole seconds), dead rows, rows sent in the last hour, paused
 *        (1/0). With `relay.source = wal | binlog` in the handle's conf,
 *        pending rows and their age count action rows only: event rows
 *        are published from the log and never marked (their backlog is
 *        the log relay's slot or binlog lag).
 * @param rowsp receives the rows (kinbox_rows_destroy()).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN (unreachable; the next call
 *          reconnects); ::KINBOX_ERR_DB; the reason in
 *          kinbox_admin_errstr().
 */
KINBOX_API kinbox_err_t kinbox_admin_outbox_summary(kinbox_admin_t *adm,
                                                    kinbox_rows_t **rowsp);

/**
 * @brief Destinations with rows pending longer than @p older_ms:
 *        destination, such rows, their smallest id, the oldest one's age
 *        (whole seconds), ordered by destination. Action rows only with
 *        `relay.source = wal | binlog` (as kinbox_admin_outbox_summary()).
 * @param rowsp receives the rows (kinbox_rows_destroy()).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN (unreachable; the next call
 *          reconnects); ::KINBOX_ERR_DB; the reason in
 *          kinbox_admin_errstr().
 */
KINBOX_API kinbox_err_t kinbox_admin_outbox_stuck(kinbox_admin_t *adm,
                                                  int64_t older_ms,
                                                  kinbox_rows_t **rowsp);

/** Outbox row status: a filter of kinbox_outbox_list() and a listed row's
 *  value. */
typedef enum kinbox_outbox_status {
        KINBOX_OUTBOX_ANY = 0,
        KINBOX_OUTBOX_PENDING = 1,
        KINBOX_OUTBOX_SENT = 2,
        KINBOX_OUTBOX_DEAD = 3,
        KINBOX_OUTBOX_CANCELED = 4
} kinbox_outbox_status_t;

/** An outbox row as listed; strings owned by the library, valid during the
 *  callback. */
typedef struct kinbox_outbox_row {
        int64_t id;
        kinbox_outbox_status_t status;
        const char *destination;
        const char *idem_key;
        const char *aggregate_id; /**< NULL if none */
        int attempts;
        int max_attempts; /**< 0 = relay default */
        const char *last_error; /**< NULL if none */
        const char *created_at; /**< database text form */
        /** Pending rows: when the row is due (a retry's backoff, or the
         *  end of a relay's lease while it is being published). NULL for
         *  sent, dead and canceled rows, whose next_attempt_at column
         *  only holds a stale lease deadline. */
        const char *next_attempt_at;
        size_t payload_size;
        /** When the relay marked the row sent (database text form); NULL
         *  unless sent. */
        const char *sent_at;
        /** The row's version: bumped by every claim and every mark (the
         *  relays' compare-and-set guard). */
        int64_t version;
} kinbox_outbox_row_t;

/** kinbox_outbox_list()'s callback: return 0 to continue, non-zero to
 *  stop. Runs on the calling thread. */
typedef int (*kinbox_outbox_row_fn)(const kinbox_outbox_row_t *row,
                                    void *opaque);

/**
 * @brief Put a dead or canceled outbox row back to pending: attempts reset
 *        to 0, its last error cleared (`outbox list` shows only what
 *        happened since), due now (relays listening are woken).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID (@p id not positive);
 *          ::KINBOX_ERR_NOT_FOUND when no dead or canceled row has that
 *          id; ::KINBOX_ERR_DB_CONN (unreachable; the next call
 *          reconnects); ::KINBOX_ERR_DB; the reason in
 *          kinbox_admin_errstr().
 */
KINBOX_API kinbox_err_t kinbox_outbox_requeue(kinbox_admin_t *adm, int64_t id);

/**
 * @brief Cancel a pending outbox row: it will not be sent. A relay that
 *        holds the row's lease right now may still publish it (its mark
 *        then counts as a conflict; the row stays canceled).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID (@p id not positive);
 *          ::KINBOX_ERR_NOT_FOUND when no pending row has that id; as
 *          kinbox_outbox_requeue().
 */
KINBOX_API kinbox_err_t kinbox_outbox_cancel(kinbox_admin_t *adm, int64_t id);

/**
 * @brief Requeue every dead row of @p destination (NULL: every
 *        destination).
 * @param countp receives how many (may be NULL).
 * @returns ::KINBOX_OK (also when there were none); as
 *          kinbox_outbox_requeue().
 */
KINBOX_API kinbox_err_t kinbox_outbox_requeue_destination(
    kinbox_admin_t *adm, const char *destination, uint64_t *countp);

/**
 * @brief Cancel every pending row of @p destination.
 * @param destination required: ::KINBOX_ERR_INVALID when NULL or "".
 * @param countp      receives how many (may be NULL).
 * @returns ::KINBOX_OK (also when there were none); as
 *          kinbox_outbox_requeue().
 */
KINBOX_API kinbox_err_t kinbox_outbox_cancel_destination(
    kinbox_admin_t *adm, const char *destination, uint64_t *countp);

/**
 * @brief List outbox rows with id > @p after_id in id order, at most
 *        @p limit (0, or over 100000: 100000), handing each to @p fn.
 * @param status      filter, ::KINBOX_OUTBOX_ANY for all.
 * @param destination filter, NULL for all.
 * @returns ::KINBOX_OK (also when the callback stopped early);
 *          ::KINBOX_ERR_INVALID (no callback, unknown status); as
 *          kinbox_outbox_requeue().
 */
KINBOX_API kinbox_err_t kinbox_outbox_list(kinbox_admin_t *adm,
                                           kinbox_outbox_status_t status,
                                           const char *destination,
                                           int64_t after_id, size_t limit,
                                           kinbox_outbox_row_fn fn,
                                           void *opaque);

/**
 * @brief Whether the database answers: one trivial statement.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN (the reason in
 *          kinbox_admin_errstr(); the next call reconnects);
 *          ::KINBOX_ERR_DB.
 */
KINBOX_API kinbox_err_t kinbox_admin_ping(kinbox_admin_t *adm);

/** What the database holds for one consumer (`kinbox status`). */
typedef struct kinbox_consumer_status {
        const char *name; /**< the consumer's `name`, as asked */
        int64_t inbox_rows; /**< its inbox rows */
        int64_t dead; /**< dead letters with status dead */
        int64_t replayed; /**< ... replayed */
        int64_t discarded; /**< ... discarded */
        int64_t parked; /**< messages parked behind a held key */
        int64_t held_keys; /**< keys held by a dead letter */
        /** When the oldest parked message was parked, as the database
         *  prints it; "-" when none is parked. */
        char oldest_parked_at[64];
        /** Messages skipped as applied already (a redelivery) and as
         *  business duplicates, counted by the running `kinbox run`
         *  processes of this consumer since their start
         *  (kinbox_consumer_stats()) as they last recorded them in the
         *  database (a change within a second, an unchanged record
         *  rewritten every 60 s; table `kinbox_consumer_counters`);
         *  -1 when no process records them (none running: no record of
         *  the last 150 s). */
        int64_t duplicates;
        int64_t business_duplicates; /**< as duplicates */
} kinbox_consumer_status_t;

/** One outbox destination (`kinbox status`). */
typedef struct kinbox_destination_status {
        const char *destination;
        int64_t pending; /**< pending rows (`relay.source = wal |
                              binlog`: action rows only, see
                              kinbox_admin_outbox_summary()) */
        int64_t oldest_pending_age_s; /**< the oldest pending row's age,
                                           whole seconds; 0: none */
        int64_t dead; /**< dead rows */
        int64_t sent_last_hour; /**< rows sent in the last hour */
        int paused; /**< 1: relays do not claim its rows
                         (kinbox_admin_outbox_pause()) */
} kinbox_destination_status_t;

/** What kinbox_admin_status() read. */
typedef struct kinbox_status {
        size_t nconsumers;
        kinbox_consumer_status_t *consumers; /**< in the order asked */
        size_t ndestinations;
        kinbox_destination_status_t *destinations; /**< by destination */
        int64_t inbox_rows; /**< inbox rows of all consumers */
        /* A partitioned inbox (`inbox.layout = partitioned`; all 0 for
         * the plain table): */
        int64_t partition_width_s; /**< range width in seconds */
        size_t npartitions; /**< range partitions */
        int64_t partitions_from; /**< start of the oldest range, Unix s */
        int64_t partitions_until; /**< end of the newest range, Unix s */
        int64_t catchall_rows; /**< rows in the catch-all */
        /** This host's clock minus the database's, ms (a partitioned
         * inbox only; its ranges follow the database's clock). */
        int64_t db_clock_skew_ms;
} kinbox_status_t;

/**
 * @brief What the database holds for `kinbox status`: each consumer's
 *        counts (inbox rows, dead letters by status, parked messages,
 *        held keys; the same tables as the gauges `kinbox run` samples at
 *        each scrape), the outbox per destination, the inbox's size
 *        and, when it is partitioned, its ranges. Kafka's lag is the
 *        caller's to ask (kinbox_kafka_new()).
 * @param consumers  @p nconsumers consumer names (a consumer with no rows
 *                   reads all 0); not kept.
 * @param statusp    receives the result (kinbox_status_destroy()), NULL on
 *                   error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID (NULL arguments);
 *          ::KINBOX_ERR_NOMEM; as kinbox_admin_ping().
 */
KINBOX_API kinbox_err_t kinbox_admin_status(kinbox_admin_t *adm,
                                            const char *const *consumers,
                                            size_t nconsumers,
                                            kinbox_status_t **statusp);

/**
 * @brief The consumers the database knows: one row per (consumer, topic)
 *        that has a watermark (`kinbox_offsets`, written with every
 *        message a consumer applies) or a dead letter, ordered by
 *        consumer and topic; columns: consumer, topic. How `kinbox status`
 *        and `kinbox verify` find consumers that a configuration does not
 *        name (a program embedding the library runs them).
 * @param rowsp receives the rows (kinbox_rows_destroy()), NULL on error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID (NULL arguments); as
 *          kinbox_admin_ping().
 */
KINBOX_API kinbox_err_t kinbox_admin_consumers(kinbox_admin_t *adm,
                                               kinbox_rows_t **rowsp);

/** @brief Free kinbox_admin_status()'s result. NULL is a no-op. */
KINBOX_API void kinbox_status_destroy(kinbox_status_t *s);

/**
 * @brief Record this process's counters of consumer @p consumer for
 *        kinbox_admin_status() (`kinbox run` does, for each consumer it
 *        runs, on a change at most once a second, and every 60 s when
 *        nothing changed: kinbox_admin_status() counts the records of the
 *        last 150 s); @p remove non-zero deletes the record (a clean
 *        stop).
 * @param instance names the process among those running the consumer
 *                 (e.g. "host:pid:start"); not kept.
 * @param st       the consumer's kinbox_consumer_stats(); ignored with
 *                 @p remove.
 * @returns As kinbox_admin_ping(); ::KINBOX_ERR_INVALID (NULL names).
 */
KINBOX_API kinbox_err_t kinbox_admin_counters_record(
    kinbox_admin_t *adm, const char *consumer, const char *instance,
    const kinbox_consumer_stats_t *st, int remove);

/* ------------------------------------------------------------------------
 * A consumer group's lag (`kinbox status`, `kinbox verify`)
 */

/** One partition of kinbox_admin_lag(). */
typedef struct kinbox_lag_partition {
        char topic[256];
        int32_t partition;
        int64_t committed; /**< the group's committed offset; negative:
                                none committed (librdkafka's
                                RD_KAFKA_OFFSET_INVALID, -1001) */
        int64_t high; /**< the log's end offset; -1: not answered */
        int64_t lag; /**< high - committed (none committed: high), 0 when
                          high is unknown or behind */
} kinbox_lag_partition_t;

/** What kinbox_admin_lag() read of a consumer's group. */
typedef struct kinbox_lag {
        char group[256]; /**< `group.id`, or the consumer's `name` */
        int64_t total; /**< the sum of the partitions' lag */
        size_t npartitions;
        kinbox_lag_partition_t *partitions; /**< by topic, partition */
} kinbox_lag_t;

/**
 * @brief A consumer group's committed offsets, the log end offsets and the
 *        lag, per partition of the consumer's `topics`, asked of the broker
 *        by a client that joins no group (5 s per request at most).
 * @param adm  the handle whose kinbox_admin_errstr() receives the reason of
 *             a failure (its database is not used).
 * @param conf a consumer's configuration: `name`, `group.id`, `topics`,
 *             `kafka.*`; not kept.
 * @param lagp receives the result (kinbox_lag_destroy()), NULL on error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_CONFIG (no `kafka.bootstrap.servers`,
 *          a bad `kafka.*` setting); ::KINBOX_ERR_KAFKA (metadata or
 *          committed offsets not answered); ::KINBOX_ERR_INVALID (NULL
 *          arguments); ::KINBOX_ERR_NOMEM.
 * @remark Same thread rules as @p adm.
 */
KINBOX_API kinbox_err_t kinbox_admin_lag(kinbox_admin_t *adm,
                                         const kinbox_conf_t *conf,
                                         kinbox_lag_t **lagp);

/** @brief Free kinbox_admin_lag()'s result. NULL is a no-op. Thread-safe
 *         (no handle). */
KINBOX_API void kinbox_lag_destroy(kinbox_lag_t *l);

/* ------------------------------------------------------------------------
 * Dead letters (the operator's side; replay below)
 */

/**
 * A dead letter as kinbox_dead_list() and kinbox_dead_show() return it.
 * Strings and bytes point into the result that holds the dead letter and
 * are valid until it is freed; byte fields (`*_len`) may hold any byte,
 * NUL included, and are NUL-terminated after their length.
 */
typedef struct kinbox_dead_letter {
        int64_t id;
        const char *consumer; /**< the consumer's `name` */
        const char *topic;
        int32_t partition;
        int64_t offset;
        const char *message_id; /**< bytes; NULL: none */
        size_t message_id_len;
        const char *status; /**< "dead", "replayed" or "discarded" */
        int attempts;
        const char *dead_at; /**< database text form */
        const char *error; /**< NULL: none */
        /** kinbox_dead_list(): messages parked behind it (its held key);
         *  kinbox_dead_show(): -1 (not read). */
        int64_t holds_back;
        /* kinbox_dead_show() only (NULL / 0 in a list): */
        const char *first_failed_at; /**< database text form */
        const char *key; /**< bytes; NULL: none */
        size_t key_len;
        const char *headers; /**< bytes, stored format (docs/operations.md,
                                  Stored headers); NULL: none */
        size_t headers_len;
        const char *payload; /**< bytes; NULL: none */
        size_t payload_len;
} kinbox_dead_letter_t;

/** What kinbox_dead_list() found. */
typedef struct kinbox_dead_list {
        size_t count;
        kinbox_dead_letter_t *letters; /**< in id order */
} kinbox_dead_list_t;

/**
 * @brief Dead letters in id order, at most @p limit.
 * @param consumer NULL: every consumer's.
 * @param status   "dead", "replayed", "discarded"; NULL: any.
 * @param listp    receives the list (kinbox_dead_list_destroy()), NULL on
 *                 error.
 * @returns As kinbox_admin_ping(); ::KINBOX_ERR_INVALID (@p listp NULL);
 *          ::KINBOX_ERR_NOMEM.
 */
KINBOX_API kinbox_err_t kinbox_dead_list(kinbox_admin_t *adm,
                                         const char *consumer,
                                         const char *status, long limit,
                                         kinbox_dead_list_t **listp);

/** @brief Free kinbox_dead_list()'s result. NULL is a no-op. Thread-safe
 *         (no handle). */
KINBOX_API void kinbox_dead_list_destroy(kinbox_dead_list_t *l);

/**
 * @brief Dead letter @p id with its stored message (key, headers,
 *        payload) and when it first failed.
 * @param dlp receives the dead letter (kinbox_dead_letter_destroy()); NULL
 *            on error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_NOT_FOUND ("no dead letter with id
 *          N" in kinbox_admin_errstr()); ::KINBOX_ERR_INVALID (@p dlp
 *          NULL); ::KINBOX_ERR_NOMEM; as kinbox_admin_ping().
 */
KINBOX_API kinbox_err_t kinbox_dead_show(kinbox_admin_t *adm, int64_t id,
                                         kinbox_dead_letter_t **dlp);

/** @brief Free kinbox_dead_show()'s result (only that: a list's letters
 *         go with kinbox_dead_list_destroy()). NULL is a no-op.
 *         Thread-safe (no handle). */
KINBOX_API void kinbox_dead_letter_destroy(kinbox_dead_letter_t *dl);

/** A message parked behind a held key (`dead_letter.hold_key`). Strings
 *  and bytes as ::kinbox_dead_letter_t's. */
typedef struct kinbox_parked {
        int64_t id; /**< its parked row */
        const char *consumer;
        const char *topic;
        int32_t partition;
        int64_t offset;
        const char *message_id; /**< bytes; NULL: none */
        size_t message_id_len;
        const char *key; /**< the held key, bytes */
        size_t key_len;
        int64_t blocker_id; /**< the dead letter holding the key; 0: none
                                 now (being released) */
        const char *parked_at; /**< database text form */
} kinbox_parked_t;

/** What kinbox_dead_parked() found. */
typedef struct kinbox_parked_list {
        size_t count;
        kinbox_parked_t *parked; /**< by consumer, topic, partition, key,
                                      offset */
} kinbox_parked_list_t;

/**
 * @brief Messages parked behind a held key, at most @p limit.
 * @param consumer NULL: every consumer's.
 * @param listp    receives the list (kinbox_parked_list_destroy()), NULL
 *                 on error.
 * @returns As kinbox_admin_ping(); ::KINBOX_ERR_INVALID (@p listp NULL);
 *          ::KINBOX_ERR_NOMEM.
 */
KINBOX_API kinbox_err_t kinbox_dead_parked(kinbox_admin_t *adm,
                                           const char *consumer, long limit,
                                           kinbox_parked_list_t **listp);

/** @brief Free kinbox_dead_parked()'s result. NULL is a no-op.
 *         Thread-safe (no handle). */
KINBOX_API void kinbox_parked_list_destroy(kinbox_parked_list_t *l);

/**
 * @brief Discard dead letter @p id: its status becomes `discarded`, and
 *        the running consumer releases the messages parked behind it.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_NOT_FOUND ("no dead letter with id
 *          N"); ::KINBOX_ERR_STATE ("dead letter N is replayed already");
 *          as kinbox_admin_ping().
 */
KINBOX_API kinbox_err_t kinbox_dead_discard(kinbox_admin_t *adm, int64_t id);

/** The last message parked behind a dead letter (highest offset). */
typedef struct kinbox_dead_follower {
        int64_t parked_id; /**< its parked row; 0: none held back */
        char consumer[256];
        char topic[256];
        int32_t partition;
        int64_t offset;
} kinbox_dead_follower_t;

/**
 * @brief The messages dead letter @p id holds back: their number and the
 *        last of them. Asked before a replay or discard, for
 *        kinbox_dead_wait().
 * @param count receives their number, -1 on error (may be NULL).
 * @param last  receives the last one (`parked_id` 0: none; may be NULL).
 * @returns As kinbox_admin_ping().
 */
KINBOX_API kinbox_err_t kinbox_dead_followers(kinbox_admin_t *adm, int64_t id,
                                              int64_t *count,
                                              kinbox_dead_follower_t *last);

/**
 * @brief After dead letter @p id was replayed or discarded: wait until the
 *        running consumer applied its followers up to @p last (polling
 *        every 200 ms, at most @p timeout_ms).
 * @param blocker receives the id of a dead letter that holds the key again
 *                (::KINBOX_ERR_STATE); may be NULL.
 * @returns ::KINBOX_OK (applied); ::KINBOX_ERR_STATE (a released message
 *          failed: its dead letter holds the key again);
 *          ::KINBOX_ERR_TIMEOUT; as kinbox_admin_ping().
 */
KINBOX_API kinbox_err_t kinbox_dead_wait(kinbox_admin_t *adm, int64_t id,
                                         const kinbox_dead_follower_t *last,
                                         int timeout_ms, int64_t *blocker);

/* ------------------------------------------------------------------------
 * Verification (`kinbox verify`)
 */

/** Rows at or above their partition's watermark, or with none: a gap. */
typedef struct kinbox_verify_ahead {
        const char *source; /**< "inbox" or "dead_letter" */
        const char *topic;
        int32_t partition;
        int64_t rows; /**< how many */
        int64_t lowest, highest; /**< their offsets */
        int64_t watermark; /**< -1: the partition has none */
} kinbox_verify_ahead_t;

/** One partition's watermark and the offsets below it with a row. */
typedef struct kinbox_verify_partition {
        const char *topic;
        int32_t partition;
        int64_t watermark; /**< next offset to consume (kinbox_offsets) */
        int64_t rows; /**< distinct offsets with an inbox row or dead
                           letter */
        int64_t lowest; /**< the lowest of them; -1: none */
} kinbox_verify_partition_t;

/** What kinbox_verify() found for one consumer. */
typedef struct kinbox_verify_result {
        size_t nahead;
        kinbox_verify_ahead_t *ahead; /**< by topic, partition */
        size_t npartitions;
        kinbox_verify_partition_t *partitions; /**< by topic, partition */
} kinbox_verify_result_t;

/**
 * @brief Check one consumer's rows against its watermarks: rows at or past
 *        a partition's watermark (gaps), and per partition what lies
 *        below it. Kafka's committed offsets are the caller's to compare
 *        with the watermarks (kinbox_kafka_new()).
 * @param resultp receives the findings (kinbox_verify_result_destroy()),
 *                NULL on error.
 * @returns As kinbox_admin_ping(); ::KINBOX_ERR_NOMEM.
 */
KINBOX_API kinbox_err_t kinbox_verify(kinbox_admin_t *adm,
                                      const char *consumer,
                                      kinbox_verify_result_t **resultp);

/** @brief Free kinbox_verify()'s result. NULL is a no-op. */
KINBOX_API void kinbox_verify_result_destroy(kinbox_verify_result_t *r);

/* ------------------------------------------------------------------------
 * Start positions (`kinbox offsets`, `kinbox run`'s assignment, `verify`)
 */

/**
 * Where a consumer may start on a partition, from the database's watermark
 * W (`kinbox_offsets.next_offset`), Kafka's committed offset C of the
 * group and the log's range [L, H). The values 3 and up are refusals:
 * `kinbox run` keeps such a partition assigned but paused, consumes
 * nothing of it and stores no offset for it until an operator resolved it
 * with `kinbox offsets reset` (kinbox_offsets_reset()); docs/failures.md.
 */
typedef enum kinbox_startpos {
        /** No W, no C: a new consumer, starts per auto.offset.reset. */
        KINBOX_STARTPOS_NEW = 0,
        /** W present, C absent or equal: starts at W. */
        KINBOX_STARTPOS_WATERMARK = 1,
        /** C < W: starts at W (records C..W-1 were applied here: a crash
         *  between the database's commit and Kafka's offset commit, or an
         *  offset reset to an earlier position). Logged at warning. */
        KINBOX_STARTPOS_BEHIND = 2,
        /** Refused: no W but C present (a new or restored database under a
         *  group that already committed offsets). */
        KINBOX_STARTPOS_UNKNOWN_GROUP = 3,
        /** Refused: W > H, the log is shorter than the watermark (the topic
         *  was deleted and created again, or the log was truncated). */
        KINBOX_STARTPOS_PAST_END = 4,
        /** Refused: W < L, records W..L-1 are gone from the log before
         *  they were applied. */
        KINBOX_STARTPOS_BEFORE_START = 5,
        /** Refused: C > W, starting at C would skip W..C-1, never applied
         *  here (an offset reset forward, or a database restored from an
         *  older backup). */
        KINBOX_STARTPOS_COMMITTED_AHEAD = 6,
        /** Refused: the record at W-1 is not the one this database applied
         *  there (a different incarnation of the topic). Found by reading
         *  the log, never by kinbox_startpos_classify(). */
        KINBOX_STARTPOS_INCARNATION = 7
} kinbox_startpos_t;

/**
 * @brief Classify a partition's start position: the one rule `kinbox run`
 *        applies at each assignment and `kinbox offsets`, `verify` and
 *        `status` report.
 * @param watermark the database's W; negative: no row.
 * @param committed Kafka's C for the group; negative: none committed.
 * @param low       the log's first offset L; negative: unknown (not
 *                  checked).
 * @param high      the log's end offset H; negative: unknown (not
 *                  checked).
 * @returns The class; never ::KINBOX_STARTPOS_INCARNATION.
 * @remark Thread-safe, pure.
 */
KINBOX_API kinbox_startpos_t kinbox_startpos_classify(int64_t watermark,
                                                      int64_t committed,
                                                      int64_t low,
                                                      int64_t high);

/** @brief Non-zero when @p v is a refusal (3 and up). Thread-safe. */
KINBOX_API int kinbox_startpos_refused(kinbox_startpos_t v);

/** @brief A short stable name for @p v ("new", "watermark", "behind",
 *         "unknown_group", "past_end", "before_start", "committed_ahead",
 *         "incarnation"); static string. Thread-safe. */
KINBOX_API const char *kinbox_startpos_name(kinbox_startpos_t v);

/** @brief One sentence on what @p v means and which
 *         `kinbox offsets reset --to` resolves it; static string.
 *         Thread-safe. */
KINBOX_API const char *kinbox_startpos_reason(kinbox_startpos_t v);

/** One partition of kinbox_offsets_list() / kinbox_offsets_reset(). */
typedef struct kinbox_offsets_partition {
        char topic[256];
        int32_t partition;
        int64_t watermark; /**< W; -1: no row in kinbox_offsets */
        int64_t committed; /**< C; -1: none committed */
        int64_t low; /**< L; -1: unknown (no such partition now) */
        int64_t high; /**< H; -1: unknown */
        int identity; /**< 1: the watermark carries the identity of the
                           record at W-1 (0: written before schema 0009
                           or cleared by a reset) */
        kinbox_startpos_t verdict; /**< as kinbox_startpos_classify(), or
                                        ::KINBOX_STARTPOS_INCARNATION */
        /** With ::KINBOX_OFFSETS_READ_LOG: 1 the record at W-1 matched,
         *  0 it did not (verdict INCARNATION), -1 not read (no identity,
         *  W-1 outside the log, compacted away, or no answer). */
        int identity_checked;
        int64_t target; /**< kinbox_offsets_reset(): the new position;
                             else -1 */
} kinbox_offsets_partition_t;

/** What kinbox_offsets_list() / kinbox_offsets_reset() found. */
typedef struct kinbox_offsets {
        char consumer[256]; /**< the consumer's `name` */
        char group[256]; /**< its `group.id` */
        size_t npartitions;
        kinbox_offsets_partition_t *partitions; /**< by topic, partition */
} kinbox_offsets_t;

/** kinbox_offsets_list() flag: read the record at W-1 of each partition
 *  with a stored identity (one fetch per partition) and compare. */
#define KINBOX_OFFSETS_READ_LOG 1

/**
 * @brief Per partition of a consumer's topics: W, C, L, H and the verdict
 *        (`kinbox offsets list`, `kinbox verify`, `kinbox status`).
 *
 * The partitions are those the broker has for `topics` plus those with a
 * watermark row of this consumer for one of these topics (a deleted topic
 * shows with L and H -1).
 * @param adm       the database (its errstr receives any failure).
 * @param conf      a consumer's configuration: `name`, `group.id`,
 *                  `topics`, `kafka.*` (a client that joins no group
 *                  reads the committed offsets); not kept.
 * @param topic     NULL: every topic; else only this one.
 * @param partition negative: every partition; else only this one.
 * @param flags     0 or ::KINBOX_OFFSETS_READ_LOG.
 * @param outp      receives the result (kinbox_offsets_destroy()), NULL on
 *                  error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_KAFKA (the broker did not answer);
 *          ::KINBOX_ERR_CONFIG; ::KINBOX_ERR_NOMEM; as kinbox_admin_ping().
 * @remark Same thread rules as @p adm.
 */
KINBOX_API kinbox_err_t kinbox_offsets_list(kinbox_admin_t *adm,
                                            const kinbox_conf_t *conf,
                                            const char *topic,
                                            int32_t partition, int flags,
                                            kinbox_offsets_t **outp);

/**
 * @brief Move a consumer's start position, on both sides: Kafka's
 *        committed offset of its group and the database's watermark
 *        (`kinbox offsets reset`).
 *
 * @p to is "earliest" (L), "latest" (H), "committed" (C), "watermark" (W)
 * or an offset within [L, H]. Without @p dry_run, for each selected
 * partition: the offsets are committed to the group first (Kafka refuses
 * while the group has live members: ::KINBOX_ERR_STATE, "stop the
 * consumers of group G first", nothing changed), then in one transaction
 * each watermark row is set to the new position with its identity
 * cleared. A failure between the two leaves Kafka moved and the database
 * not: run the command again.
 * @param dry_run non-zero: compute and return the plan, change nothing.
 * @param outp    receives each partition's W, C, L, H, verdict and
 *                `target` (kinbox_offsets_destroy()), NULL on error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID (bad @p to, an offset outside
 *          [L, H], "committed"/"watermark" where there is none; the
 *          partition named in kinbox_admin_errstr()); ::KINBOX_ERR_NOT_FOUND
 *          (no partition selected); ::KINBOX_ERR_STATE (live group);
 *          ::KINBOX_ERR_KAFKA; as kinbox_offsets_list().
 * @remark Same thread rules as @p adm. Stop every consumer of the group
 *         first: a running one would overwrite the watermark.
 */
KINBOX_API kinbox_err_t kinbox_offsets_reset(
    kinbox_admin_t *adm, const kinbox_conf_t *conf, const char *topic,
    int32_t partition, const char *to, int dry_run, kinbox_offsets_t **outp);

/** @brief Free a kinbox_offsets_list() / kinbox_offsets_reset() result.
 *         NULL is a no-op. */
KINBOX_API void kinbox_offsets_destroy(kinbox_offsets_t *o);

/**
 * @brief Replay dead letter @p id: run the handler on its stored copy
 *        (original topic, partition, offset, key, headers, payload) in one
 *        transaction with its inbox row, exactly as if it arrived again.
 *
 * In that transaction: the dead letter is locked and must have status
 * `dead`; the inbox row of its message id is removed when it is the dead
 * letter's own (same coordinates) and inserted again; the handler runs;
 * the dead letter becomes `replayed`; COMMIT. If the message id was
 * applied by another delivery meanwhile (an inbox row at other
 * coordinates), nothing runs: ::KINBOX_ERR_DUPLICATE.
 * @param fn / bfn the consumer's handler (one of them; a batch handler
 *                 gets a batch of one).
 * @param resultp  receives the handler's result (may be NULL).
 * @returns ::KINBOX_OK (committed); ::KINBOX_ERR_NOT_FOUND (no such id);
 *          ::KINBOX_ERR_STATE (already replayed or discarded, or no
 *          message id); ::KINBOX_ERR_DUPLICATE; ::KINBOX_ERR_INVALID when
 *          the handler did not return OK (rolled back; reason in
 *          kinbox_admin_errstr()); database errors.
 */
KINBOX_API kinbox_err_t kinbox_dead_replay(kinbox_admin_t *adm, int64_t id,
                                           kinbox_handler_fn fn,
                                           kinbox_batch_handler_fn bfn,
                                           void *opaque,
                                           kinbox_result_t *resultp);

/* ------------------------------------------------------------------------
 * `kinbox status` and `kinbox verify`, each in one call
 */

/** kinbox_admin_report() flag: ask the broker too (each consumer's lag
 *  and start positions). */
#define KINBOX_REPORT_KAFKA 1

/** One consumer's part of kinbox_admin_report() beyond the database's. */
typedef struct kinbox_consumer_report {
        const char *name; /**< the consumer's `name` */
        const char *group; /**< its `group.id`, or its name */
        /** The group's lag (kinbox_admin_lag()); NULL: not asked, or not
         *  answered (the reason in lag_error). */
        kinbox_lag_t *lag;
        char lag_error[512];
        /** Where `kinbox run` would start each partition
         *  (kinbox_offsets_list() on the consumer's own database); NULL:
         *  not asked, or not read (the reason in start_error). */
        kinbox_offsets_t *start;
        char start_error[512];
        int refused; /**< partitions `kinbox run` refuses to start; -1:
                          unknown */
} kinbox_consumer_report_t;

/** What kinbox_admin_report() read: `kinbox status` in one call. */
typedef struct kinbox_report {
        kinbox_status_t *status; /**< the database's part, as
                                      kinbox_admin_status() */
        kinbox_consumer_report_t *consumers; /**< status->nconsumers, in
                                                  the same order */
        /** The log relay (`relay.source = wal | binlog` in the relay's
         *  configuration): 0 when there is none. */
        int log_relay;
        char log_slot[128]; /**< its slot (reader) */
        int64_t log_retained_bytes; /**< log the server keeps for it; -1:
                                         unknown */
        char log_state[64]; /**< PostgreSQL's wal_status; "": unknown */
        char log_error[512]; /**< "" unless the figures were not read */
} kinbox_report_t;

/**
 * @brief Everything `kinbox status` shows, in one call: the database's
 *        counts (kinbox_admin_status()), and per consumer its group's lag
 *        and its start refusals (with ::KINBOX_REPORT_KAFKA), and the log
 *        relay's slot.
 *
 * A failure of the broker or of a consumer's own database is reported in
 * the consumer's `lag_error` / `start_error`, not as the call's result.
 * @param consumers  @p nconsumers consumer configurations (`name`,
 *                   `group.id`, `topics`, `kafka.*`, `database.*`); not
 *                   kept.
 * @param relay      the relay's configuration (its `relay.source`,
 *                   `relay.slot`), or NULL: no log relay part.
 * @param flags      0 or ::KINBOX_REPORT_KAFKA.
 * @param reportp    receives the result (kinbox_report_destroy()), NULL on
 *                   error.
 * @returns As kinbox_admin_status().
 * @remark Same thread rules as @p adm.
 */
KINBOX_API kinbox_err_t
kinbox_admin_report(kinbox_admin_t *adm, const kinbox_conf_t *const *consumers,
                    size_t nconsumers, const kinbox_conf_t *relay, int flags,
                    kinbox_report_t **reportp);

/** @brief Free kinbox_admin_report()'s result. NULL is a no-op.
 *         Thread-safe (no handle). */
KINBOX_API void kinbox_report_destroy(kinbox_report_t *r);

/** An outbox destination with rows pending too long. */
typedef struct kinbox_verify_stuck {
        const char *destination;
        int64_t rows; /**< rows pending longer than asked */
        int64_t oldest_id; /**< the smallest id among them */
        int64_t oldest_age_s; /**< the oldest one's age, whole seconds */
} kinbox_verify_stuck_t;

/** One consumer's part of kinbox_admin_verify(). */
typedef struct kinbox_verify_consumer {
        const char *name; /**< the consumer's `name` */
        kinbox_verify_result_t *rows; /**< its rows against its
                                           watermarks (kinbox_verify()) */
        /** Where `kinbox run` would start (kinbox_offsets_list() with
         *  ::KINBOX_OFFSETS_READ_LOG): every refusal is a gap. NULL: not
         *  read (the reason in start_error). */
        kinbox_offsets_t *start;
        char start_error[512];
        /** The group's committed offsets (kinbox_admin_lag()); NULL: the
         *  broker did not answer (the reason in lag_error). */
        kinbox_lag_t *lag;
        char lag_error[512];
} kinbox_verify_consumer_t;

/** What kinbox_admin_verify() found: `kinbox verify` in one call. */
typedef struct kinbox_verify_report {
        size_t nconsumers;
        kinbox_verify_consumer_t *consumers; /**< in the order asked */
        size_t nstuck;
        kinbox_verify_stuck_t *stuck; /**< by destination */
        size_t ndestinations; /**< outbox destinations with rows */
} kinbox_verify_report_t;

/**
 * @brief Everything `kinbox verify` checks, in one call: per consumer its
 *        rows against its watermarks, its start positions (the record at
 *        W-1 read again) and Kafka's committed offsets; the outbox's rows
 *        pending longer than @p older_ms.
 * @param consumers @p nconsumers consumer configurations; not kept. The
 *                  rows are read on @p adm's database, the start positions
 *                  on each consumer's own.
 * @param reportp   receives the result (kinbox_verify_report_destroy()),
 *                  NULL on error.
 * @returns As kinbox_verify() (a database failure of @p adm); a broker's
 *          or a consumer database's failure is in the consumer's
 *          `start_error` / `lag_error`.
 * @remark Same thread rules as @p adm.
 */
KINBOX_API kinbox_err_t kinbox_admin_verify(
    kinbox_admin_t *adm, const kinbox_conf_t *const *consumers,
    size_t nconsumers, int64_t older_ms, kinbox_verify_report_t **reportp);

/** @brief Free kinbox_admin_verify()'s result. NULL is a no-op.
 *         Thread-safe (no handle). */
KINBOX_API void kinbox_verify_report_destroy(kinbox_verify_report_t *r);

KINBOX_END_DECLS

#endif
