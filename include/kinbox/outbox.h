/**
 * @file outbox.h
 * @brief The transactional outbox: append messages in your own transaction,
 *        a relay delivers them to Kafka (or to a local action) at least
 *        once, in per-aggregate order, across any number of relay replicas.
 *
 * Writer: kinbox_outbox_append() inside a kinbox handler transaction, or
 * kinbox_outbox_append_pg() / kinbox_outbox_append_mysql() on the caller's
 * own connection inside the caller's own transaction. The row commits or
 * rolls back with the caller's state change.
 *
 * Relay: kinbox_relay_new() → kinbox_relay_register_action() (optional) →
 * kinbox_relay_run() (blocks) → kinbox_relay_stop() → kinbox_relay_destroy().
 * Each row goes through claim (lease, version bump, committed before any
 * side effect) → publish / run action → mark sent with a version check.
 * A relay that dies leaves its rows pending; their lease expires and another
 * relay takes over. Delivery is therefore at least once: downstream kinbox
 * consumers drop the duplicates by the `message_id` header the relay sets.
 *
 * Operators: kinbox_outbox_requeue(), kinbox_outbox_cancel() and
 * kinbox_outbox_list() on the operator handle, ::kinbox_admin_t (admin.h).
 */
#ifndef KINBOX_OUTBOX_H
#define KINBOX_OUTBOX_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "error.h"
#include "conf.h"
#include "handler.h"

KINBOX_BEGIN_DECLS

/** Destination prefix that makes a row a local action instead of a Kafka
 *  message: `action:NAME`. */
#define KINBOX_OUTBOX_ACTION_PREFIX "action:"

/** Longest destination, idempotency key and aggregate id, in bytes. */
#define KINBOX_OUTBOX_NAME_MAX 255

/**
 * One message to append. Every pointer is the caller's and only read during
 * the call.
 */
typedef struct kinbox_outbox_msg {
        /** Kafka topic, or `action:NAME` for a local action. Required. */
        const char *destination;
        /** Stable business identity (e.g. "order-42-paid"), unique per
         *  destination. Required. Appending the same (destination, idem_key)
         *  again is harmless: see ::KINBOX_ERR_DUPLICATE. */
        const char *idem_key;
        /** Ordering key and Kafka message key (e.g. the order id). NULL: no
         *  ordering with other rows, null Kafka key. */
        const char *aggregate_id;
        /** Payload bytes; NULL with size 0 for a null (tombstone) value. */
        const void *payload;
        size_t payload_size;
        /** Headers published with the message, in this order. */
        const kinbox_header_t *headers;
        size_t header_count;
        /** Attempts before the row goes dead; 0 = the relay's
         *  `relay.max_attempts`. */
        int max_attempts;
} kinbox_outbox_msg_t;

/**
 * @brief Append a message inside a kinbox handler transaction.
 *
 * The row commits together with the handler's inbox row (hop-by-hop
 * consistency: a consumer emits its next event in the same transaction).
 * @param idp  NULL: the insert is queued like kinbox_tx_exec() (pipelined,
 *             no round trip); a duplicate (destination, idem_key) is then
 *             silently ignored and the call returns ::KINBOX_OK. Not NULL:
 *             the insert runs now (one round trip) and *idp receives the new
 *             row's id, or the existing row's id for a duplicate.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DUPLICATE (only when @p idp is not
 *          NULL) when the row already existed — the transaction stays
 *          usable; ::KINBOX_ERR_INVALID for a missing/over-long destination
 *          or key; a database error as kinbox_tx_query(), among them
 *          ::KINBOX_ERR_TRANSIENT for a deadlock, serialization failure or
 *          lock wait timeout (details in kinbox_tx_errstr(); the
 *          transaction is aborted then and kinbox runs the batch again).
 * @remark Handler thread only, during the handler call. The row is the
 *         call's effect: a message the call rejects or retries (its
 *         result, or a batch handler's `results[i]`) undoes it with the
 *         call's other statements. In a batch handler call of several
 *         messages it belongs to the call, not to one message: name the
 *         message in @p m's idem_key (docs/handlers.md).
 */
KINBOX_API kinbox_err_t kinbox_outbox_append(kinbox_tx_t *tx,
                                             const kinbox_outbox_msg_t *m,
                                             int64_t *idp);

/**
 * @brief Append a message on the caller's own PostgreSQL connection, inside
 *        the caller's open transaction (BEGIN ... COMMIT are the caller's).
 *
 * Uses `INSERT ... ON CONFLICT DO NOTHING`, so a duplicate does not abort
 * the transaction. The `kinbox_outbox` table (migration 0002) must be on
 * the connection's search_path. The connection must not be in pipeline
 * mode. A committed row wakes listening relays (NOTIFY from the table's
 * trigger).
 * @param idp receives the new (or, for a duplicate, existing) id; may be
 *            NULL.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DUPLICATE; ::KINBOX_ERR_INVALID;
 *          ::KINBOX_ERR_TRANSIENT for a deadlock (40P01), serialization
 *          failure (40001) or lock timeout (55P03): the transaction is
 *          aborted, roll back and run it again; ::KINBOX_ERR_DB for any
 *          other statement error (SQLSTATE in @p errstr; the transaction
 *          is aborted); ::KINBOX_ERR_DB_CONN when the connection is lost.
 * @remark Thread-safe for different connections.
 */
KINBOX_API kinbox_err_t kinbox_outbox_append_pg(struct pg_conn *conn,
                                                const kinbox_outbox_msg_t *m,
                                                int64_t *idp, char *errstr,
                                                size_t errstr_size);

/**
 * @brief Append a message on the caller's own MySQL/MariaDB connection,
 *        inside the caller's open transaction.
 *
 * Uses `INSERT ... ON DUPLICATE KEY UPDATE` (not INSERT IGNORE, which would
 * hide other errors): a duplicate leaves the transaction usable. Two round
 * trips (the insert, then the id).
 * @returns as kinbox_outbox_append_pg() (MySQL errno in @p errstr);
 *          ::KINBOX_ERR_TRANSIENT for a deadlock (1213) or lock wait
 *          timeout (1205): roll back and run the transaction again.
 */
KINBOX_API kinbox_err_t
kinbox_outbox_append_mysql(struct st_mysql *conn, const kinbox_outbox_msg_t *m,
                           int64_t *idp, char *errstr, size_t errstr_size);

/**
 * @brief Append a message with no table row (PostgreSQL, the log relay):
 *        a transactional logical message in the caller's open transaction.
 *
 * Writes `pg_logical_emit_message(true, 'kinbox.outbox.v1', envelope)`:
 * WAL only (no heap row, index entry or dead tuple, nothing to prune),
 * decoded with the transaction and dropped on rollback. Only a relay with
 * `relay.source = wal` publishes it (with the key, headers and
 * `message_id` of a table row; the record's timestamp is the commit
 * time); the polling relay never sees it, and nothing in the database
 * can list, requeue or cancel it afterwards. The envelope (versioned,
 * length-prefixed: destination, aggregate id, idem key, headers,
 * payload) is documented in docs/outbox.md. No duplicate check: the same
 * (destination, idem_key) emitted twice is published twice, with one
 * `message_id` (consumers' inboxes absorb it). The connection must not be
 * in pipeline mode. Every pointer is the caller's and only read during
 * the call.
 * @param max_attempts of @p m is ignored (a log relay retries without
 *        limit).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID for a missing or over-long
 *          field, a header without name or an `action:` destination (local
 *          actions need the table); ::KINBOX_ERR_TRANSIENT for a deadlock,
 *          serialization failure or lock timeout; ::KINBOX_ERR_DB for
 *          another statement error (SQLSTATE in @p errstr; the transaction
 *          is aborted); ::KINBOX_ERR_DB_CONN when the connection is lost.
 * @remark Thread-safe for different connections.
 */
KINBOX_API kinbox_err_t kinbox_outbox_emit_pg(struct pg_conn *conn,
                                              const kinbox_outbox_msg_t *m,
                                              char *errstr,
                                              size_t errstr_size);

/**
 * @brief kinbox_outbox_emit_pg() inside a kinbox handler transaction
 *        (PostgreSQL): the logical message commits with the handler's
 *        inbox row.
 *
 * Queued like kinbox_tx_exec() (pipelined, no round trip).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID as kinbox_outbox_emit_pg(),
 *          and on MariaDB (no logical messages: use
 *          kinbox_outbox_append()); a database error as kinbox_tx_exec().
 * @remark Handler thread only, during the handler call.
 */
KINBOX_API kinbox_err_t kinbox_outbox_emit(kinbox_tx_t *tx,
                                           const kinbox_outbox_msg_t *m);

/* ------------------------------------------------------------------------
 * Local actions
 */

/** A claimed local action as handed to its callback. Opaque. */
typedef struct kinbox_action_s kinbox_action_t;

/**
 * @brief Local action callback (destination `action:NAME`).
 *
 * Runs the side effect the row stands for, e.g. "ask the payment channel
 * to pay channel order X". The relay guarantees at-least-once calls, not
 * exactly once: after a timeout, a crash or a lost lease the same row runs
 * again. The callback must make the external effect idempotent itself —
 * hand kinbox_action_idem_key() to the external system as its idempotency
 * key, or check the external state first.
 * @param a      the action; valid only during the call.
 * @returns ::KINBOX_RESULT_OK (row sent), ::KINBOX_RESULT_RETRY (try again
 *          after a backoff; dead after max attempts), ::KINBOX_RESULT_REJECT
 *          (dead now). Give the reason with kinbox_action_set_error().
 * @remark Runs on a relay worker thread, one action at a time per relay —
 *         except that a callback still running past `relay.action.timeout.ms`
 *         is abandoned (counted as RETRY) and the next action starts
 *         meanwhile, so callbacks must be thread-safe. It must not call
 *         kinbox_relay_destroy().
 */
typedef kinbox_result_t (*kinbox_action_fn)(kinbox_action_t *a, void *opaque);

/** @brief The outbox row id. */
KINBOX_API int64_t kinbox_action_id(const kinbox_action_t *a);
/** @brief The action name (destination without `action:`). */
KINBOX_API const char *kinbox_action_name(const kinbox_action_t *a);
/** @brief The idempotency key: hand it to the external system. */
KINBOX_API const char *kinbox_action_idem_key(const kinbox_action_t *a);
/** @brief The aggregate id, NULL if none. */
KINBOX_API const char *kinbox_action_aggregate_id(const kinbox_action_t *a);
/** @brief Payload bytes (NULL for a null payload); length in @p sizep. */
KINBOX_API const void *kinbox_action_payload(const kinbox_action_t *a,
                                             size_t *sizep);
/** @brief Attempt number: 1 for the first call. */
KINBOX_API int kinbox_action_attempt(const kinbox_action_t *a);
/** @brief Number of headers. */
KINBOX_API size_t kinbox_action_header_count(const kinbox_action_t *a);
/**
 * @brief Header by index, in append order.
 * @returns ::KINBOX_OK or ::KINBOX_ERR_NOT_FOUND.
 */
KINBOX_API kinbox_err_t kinbox_action_header_at(const kinbox_action_t *a,
                                                size_t idx,
                                                kinbox_header_t *hdr);
/**
 * @brief Reason recorded in `last_error` for a RETRY or REJECT (truncated to
 *        500 bytes; never put secrets in it).
 */
KINBOX_API void kinbox_action_set_error(kinbox_action_t *a, const char *fmt,
                                        ...) KINBOX_PRINTF(2, 3);

/* ------------------------------------------------------------------------
 * Relay
 */

/** An outbox relay. Opaque. */
typedef struct kinbox_relay_s kinbox_relay_t;

/** Counters of one relay since it was created. */
typedef struct kinbox_relay_stats {
        uint64_t claimed; /**< rows claimed (leased) */
        uint64_t published; /**< Kafka messages acknowledged and marked */
        uint64_t actions_ok; /**< local actions done and marked */
        uint64_t retried; /**< failures recorded with a backoff */
        uint64_t dead; /**< rows moved to dead */
        uint64_t conflicts; /**< version checks that found another owner */
        uint64_t released; /**< claimed rows handed back unprocessed */
        uint64_t batches; /**< claim rounds that returned rows */
        uint64_t db_errors; /**< database errors ridden out */
} kinbox_relay_stats_t;

/**
 * @brief Create a relay.
 * @param conf configuration; owned by the relay on success only (set your
 *             pointer to NULL then), still the caller's on failure. Reads
 *             `name`, `database.url`, `database.password_file`, `relay.*`
 *             and the `kafka.*` producer properties (`enable.idempotence`
 *             is forced on; `message.timeout.ms` defaults to half the
 *             lease and must be shorter than `relay.lease.ms`).
 * @returns A relay, or NULL with @p errstr set. No connection is made yet.
 */
KINBOX_API kinbox_relay_t *kinbox_relay_new(kinbox_conf_t *conf, char *errstr,
                                            size_t errstr_size);

/**
 * @brief Register the callback of `action:NAME` rows. Call before
 *        kinbox_relay_run(). Rows of an unregistered action fail (RETRY,
 *        then dead after max attempts).
 * @param name   the NAME part; copied.
 * @param opaque handed to every call; owned by the caller, must outlive the
 *               relay.
 * @returns ::KINBOX_OK, ::KINBOX_ERR_INVALID, ::KINBOX_ERR_NOMEM,
 *          ::KINBOX_ERR_STATE while running.
 */
KINBOX_API kinbox_err_t kinbox_relay_register_action(kinbox_relay_t *r,
                                                     const char *name,
                                                     kinbox_action_fn fn,
                                                     void *opaque);

/**
 * @brief Connect and relay rows until kinbox_relay_stop().
 *
 * Blocks the calling thread. Database and broker outages are ridden out
 * with backoff; they do not make this call return.
 * @returns ::KINBOX_OK after kinbox_relay_stop() (the batch in flight is
 *          finished first); ::KINBOX_ERR_DB_CONN when the database was
 *          unreachable at start; ::KINBOX_ERR_KAFKA when the producer could
 *          not be created; ::KINBOX_ERR_STATE when already running. Details
 *          in kinbox_relay_errstr().
 * @remark Returning is bounded: the producer's rd_kafka_destroy() gets
 *         10 s (some librdkafka releases, 2.0 among them, can wait for
 *         ever for their own threads under load). Past that an error is
 *         logged ("Kafka producer did not shut down"), the handle is left
 *         to those threads and run() returns; nothing is lost (a row is
 *         marked sent only on its delivery report), and
 *         kinbox_relay_destroy() then keeps the relay's memory.
 */
KINBOX_API kinbox_err_t kinbox_relay_run(kinbox_relay_t *r);

/**
 * @brief Ask a running relay to finish its batch and return. Returns at
 *        once. Also makes a later kinbox_relay_run() return at once.
 * @remark Thread-safe and async-signal-safe.
 */
KINBOX_API void kinbox_relay_stop(kinbox_relay_t *r);

/** @brief Copy the counters. Thread-safe. */
KINBOX_API void kinbox_relay_stats(const kinbox_relay_t *r,
                                   kinbox_relay_stats_t *out);

/** @brief Last fatal error text, "" if none. Owned by @p r. */
KINBOX_API const char *kinbox_relay_errstr(const kinbox_relay_t *r);

/**
 * @brief Free a stopped (or never run) relay. NULL is a no-op. Waits for
 *        abandoned (timed-out) action callbacks to return.
 *
 * Not while kinbox_relay_run() runs. Bounded like run()'s return: a
 * librdkafka handle that does not shut down within 10 s is left to its
 * threads with the relay's memory (an error is logged: "a Kafka client
 * did not shut down"), instead of hanging the caller.
 */
KINBOX_API void kinbox_relay_destroy(kinbox_relay_t *r);

/**
 * @brief Publish again, from the table, every outbox row of a Kafka
 *        destination created at or after @p since_ms (ms since the epoch,
 *        UTC): the way back when a log relay lost its place (relay.source
 *        = binlog: the binlog after its position was purged).
 *
 * Rows are published as the relay publishes them (key, headers, record
 * timestamp), in id order, each waiting for its acknowledgement; the
 * consumers' inboxes absorb the copies of rows they already had. Canceled
 * rows and local actions are left out. No row is updated.
 *
 * relay.source = binlog: refuses (KINBOX_ERR_STATE) while a relay of the
 * same name (relay.slot, else name) reads the binlog; the binlog's
 * position when it starts is stored as that relay's position once every
 * row is acknowledged, so the relay then resumes from there.
 *
 * @param conf       the relay's configuration (database.url, kafka.*,
 *                   relay.*); not modified, not kept.
 * @param published  out, may be NULL: the rows acknowledged.
 * @return KINBOX_OK; KINBOX_ERR_CONFIG, KINBOX_ERR_DB / DB_CONN,
 *         KINBOX_ERR_KAFKA (a row was not acknowledged: run it again),
 *         KINBOX_ERR_STATE, with @p errstr set. Blocks; thread-safe on
 *         distinct confs.
 */
KINBOX_API kinbox_err_t kinbox_outbox_resend(kinbox_conf_t *conf,
                                             int64_t since_ms,
                                             int64_t *published, char *errstr,
                                             size_t errstr_size);

KINBOX_END_DECLS

#endif
