/**
 * @file handler.h
 * @brief What a handler sees: the message, the transaction, results.
 *
 * A handler runs inside the consumer's database transaction. Everything it
 * writes through the transaction commits together with the inbox row (the
 * record that this message id was processed) and the offset watermark, or
 * not at all. Handlers must not have effects outside the database: they may
 * run again after a rollback (a RETRY, a failed neighbour in the batch, a
 * lost connection) — only the committed run counts.
 */
#ifndef KINBOX_HANDLER_H
#define KINBOX_HANDLER_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "error.h"

KINBOX_BEGIN_DECLS

/** libpq's connection type, without including libpq-fe.h. */
struct pg_conn;
/** libmysqlclient's connection type, without including mysql.h. */
struct st_mysql;

/** A Kafka message as handed to a handler. Opaque. */
typedef struct kinbox_msg_s kinbox_msg_t;
/** The consumer's transaction as handed to a handler. Opaque. */
typedef struct kinbox_tx_s kinbox_tx_t;
/** Rows returned by kinbox_tx_query(). Opaque. */
typedef struct kinbox_rows_s kinbox_rows_t;

/** What a handler says about a message. */
typedef enum kinbox_result {
        /** Effect applied: commit it with the inbox row. */
        KINBOX_RESULT_OK = 0,
        /** Transient failure: roll back, back off, try again (up to
         *  `retry.max` attempts, then dead-letter). */
        KINBOX_RESULT_RETRY = 1,
        /** The message can never succeed: roll back its effect and move it
         *  to the dead-letter table with the reason. */
        KINBOX_RESULT_REJECT = 2,
        /** A *business duplicate*: the event this message carries was
         *  already applied (under another message id: an upstream retry
         *  that minted a new id, a replayed export). Its inbox row commits,
         *  it is counted as a business duplicate (beside redeliveries), it
         *  is never retried or dead-lettered. Whatever statements the
         *  handler queued for it in this call commit as with
         *  ::KINBOX_RESULT_OK: return it after finding the business key
         *  taken, e.g. by an `INSERT ... ON CONFLICT DO NOTHING RETURNING`
         *  that returned no row. To have kinbox undo the handler's other
         *  statements instead, queue the business insert with
         *  kinbox_tx_exec_unique(). */
        KINBOX_RESULT_DUPLICATE = 3
} kinbox_result_t;

/** Database backends. */
typedef enum kinbox_backend {
        KINBOX_BACKEND_POSTGRESQL = 1,
        KINBOX_BACKEND_MYSQL = 2
} kinbox_backend_t;

/** A message header or an outbox header. Pointers owned by the caller. */
typedef struct kinbox_header {
        const char *name; /**< NUL-terminated header name. */
        const void *value; /**< Value bytes; may be NULL (null header). */
        size_t size; /**< Value length in bytes. */
} kinbox_header_t;

/**
 * @brief Per-message handler.
 * @param tx   the open transaction; valid only during the call.
 * @param msg  the message; valid only during the call.
 * @returns A ::kinbox_result_t. Give a reason for RETRY/REJECT with
 *          kinbox_tx_set_error().
 * @remark Runs on a worker thread. Messages of one partition are handed
 *         over in offset order and never before the previous message's
 *         transaction has committed; different partitions run concurrently
 *         on different workers (each with its own transaction).
 */
typedef kinbox_result_t (*kinbox_handler_fn)(kinbox_tx_t *tx,
                                             const kinbox_msg_t *msg,
                                             void *opaque);

/**
 * @brief Batch handler: all new (non-duplicate) messages of a batch at once,
 *        for set-based SQL.
 * @param msgs     @p count messages, in partition order; valid during the
 *                 call.
 * @param results  @p count entries, all ::KINBOX_RESULT_OK on entry; set an
 *                 entry to RETRY or REJECT to single a message out (its
 *                 effect is then rolled back by re-running the batch without
 *                 it; give the reason with kinbox_tx_set_msg_error()).
 * @returns ::KINBOX_RESULT_OK to proceed; ::KINBOX_RESULT_RETRY to retry the
 *          whole batch later (transient trouble). A statement error that
 *          cannot be pinned on one message makes kinbox split the batch
 *          until it can.
 */
typedef kinbox_result_t (*kinbox_batch_handler_fn)(
    kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, size_t count,
    kinbox_result_t *results, void *opaque);

/* ---- message accessors (all: thread-safe for a message the caller holds,
 *      returned pointers valid as long as the message) ---- */

/** @brief Topic name. */
KINBOX_API const char *kinbox_msg_topic(const kinbox_msg_t *msg);
/** @brief Partition. */
KINBOX_API int32_t kinbox_msg_partition(const kinbox_msg_t *msg);
/** @brief Offset. */
KINBOX_API int64_t kinbox_msg_offset(const kinbox_msg_t *msg);
/** @brief Kafka timestamp in milliseconds since the epoch, -1 if none. */
KINBOX_API int64_t kinbox_msg_timestamp(const kinbox_msg_t *msg);
/** @brief Key bytes (NULL for a null key), not NUL-terminated; length in
 *  @p sizep. */
KINBOX_API const void *kinbox_msg_key(const kinbox_msg_t *msg, size_t *sizep);
/**
 * @brief Payload bytes (NULL for a null payload); length in @p sizep.
 *
 * The bytes are followed by a NUL that @p sizep does not count (as
 * hiredis does for replies), so a text payload can be read as a C string:
 * `sscanf(p, ...)` and `strtol(p, ...)` stop at the payload's end. The
 * payload may itself contain NUL bytes; @p sizep is its true length.
 */
KINBOX_API const void *kinbox_msg_payload(const kinbox_msg_t *msg,
                                          size_t *sizep);
/** @brief The message id used for deduplication (NUL-terminated). */
KINBOX_API const char *kinbox_msg_id(const kinbox_msg_t *msg);
/** @brief Attempt number, 1 for the first delivery to the handler. */
KINBOX_API int kinbox_msg_attempt(const kinbox_msg_t *msg);
/** @brief Number of headers. */
KINBOX_API size_t kinbox_msg_header_count(const kinbox_msg_t *msg);
/**
 * @brief Header by index, in wire order.
 * @returns ::KINBOX_OK or ::KINBOX_ERR_NOT_FOUND when @p idx is out of range.
 */
KINBOX_API kinbox_err_t kinbox_msg_header_at(const kinbox_msg_t *msg,
                                             size_t idx, kinbox_header_t *hdr);
/**
 * @brief Last header named @p name.
 * @returns ::KINBOX_OK or ::KINBOX_ERR_NOT_FOUND.
 */
KINBOX_API kinbox_err_t kinbox_msg_header(const kinbox_msg_t *msg,
                                          const char *name,
                                          const void **valuep, size_t *sizep);

/* ---- the transaction (use only on the handler's thread, during the call) */

/** @brief Which backend this transaction runs on. */
KINBOX_API kinbox_backend_t kinbox_tx_backend(const kinbox_tx_t *tx);

/** @brief The consumer name (the inbox key's first half). */
KINBOX_API const char *kinbox_tx_consumer(const kinbox_tx_t *tx);

/**
 * @brief Queue a statement that returns no rows the handler needs.
 *
 * Placeholders are `$1`, `$2`, ... on both backends. Parameters are text
 * (NULL = SQL NULL), copied before the call returns. On PostgreSQL the
 * statement is prepared once per connection and sent in pipeline mode: its
 * result is checked when the batch is flushed, so an error surfaces at the
 * batch end and is attributed to the message whose handler queued it (that
 * message is then retried or dead-lettered; its neighbours commit once). On
 * MySQL statements are sent together at the flush in one multi-statement
 * round trip.
 *
 * What a failing statement does to its message (docs/failures.md has the
 * table per backend): a unique-key violation, a CHECK or NOT NULL
 * violation or a data exception (SQLSTATE class 22) can never succeed: the
 * message is dead-lettered at once; anything else (a foreign-key violation, an
 * unknown error) is retried with backoff. Deadlocks, serialization
 * failures and lost connections retry the whole batch.
 * @returns ::KINBOX_OK when queued; an immediate error (::KINBOX_ERR_INVALID
 *          for a bad placeholder, ::KINBOX_ERR_DB_CONN) otherwise. Errors
 *          found later fail the message, not the caller.
 *          ::KINBOX_ERR_ABORTED: a statement of *another* message failed
 *          and voided this transaction; return any result (it is ignored:
 *          kinbox runs this message again, without charging it an attempt).
 */
KINBOX_API kinbox_err_t kinbox_tx_exec(kinbox_tx_t *tx, const char *sql,
                                       int nparams, const char *const *params);

/**
 * @brief Queue the statement that claims a message's business key, at
 *        full speed.
 *
 * Like kinbox_tx_exec(), for a statement written so that a taken business
 * key makes it affect no row instead of failing: PostgreSQL
 * `INSERT ... ON CONFLICT (order_id, biz_type) DO NOTHING`, MySQL
 * `INSERT ... ON DUPLICATE KEY UPDATE order_id = order_id`. When it
 * affects no row the event was already applied: the message is counted as
 * a *business duplicate* (as with ::KINBOX_RESULT_DUPLICATE, decided when
 * the result is read, after the handler returned). Nothing is undone, so
 * write the handler's other statements to change nothing in that case:
 * on PostgreSQL one statement whose second part reads the first's
 * `RETURNING` (a data-modifying CTE), on MySQL a following statement
 * guarded by `ROW_COUNT() > 0` (docs/handlers.md,
 * kinbox_tx_exec_claim()). It costs no round trip, no savepoint and no
 * rollback: use it when business duplicates are frequent;
 * kinbox_tx_exec_unique() when the handler cannot be written so.
 *
 * @returns as kinbox_tx_exec().
 * @remark Per-message handlers, and batch handlers called with one message
 *         (kinbox hands a failing group's messages over one at a time): in
 *         a batch handler called with several the statement is queued like
 *         kinbox_tx_exec() (its row count names no one message; set
 *         `results[i] = KINBOX_RESULT_DUPLICATE` instead). On
 *         MySQL the statement is never merged with others (its row count
 *         must be its own).
 */
KINBOX_API kinbox_err_t kinbox_tx_exec_claim(kinbox_tx_t *tx, const char *sql,
                                             int nparams,
                                             const char *const *params);

/**
 * @brief Queue the statement that records a message's business key.
 *
 * Like kinbox_tx_exec(), for the statement whose unique key is the business
 * idempotency check (e.g. `INSERT INTO user_points_flow ...` with
 * `UNIQUE (order_id, biz_type)`). If it violates a unique key (SQLSTATE
 * 23505 / MySQL 1062) named @p key, or any unique key when @p key is NULL,
 * the event was already applied: the message is a *business duplicate*.
 * kinbox then undoes everything the handler did for this message, commits
 * its inbox row, counts it as a business duplicate and never retries or
 * dead-letters it; the other messages of the batch are not charged. Any
 * other error of the statement is handled as for kinbox_tx_exec().
 *
 * Cost: a business duplicate found this way rolls back to a savepoint and
 * runs the handlers of at most one group of the batch again (about
 * `batch.max / 32` messages). For duplicates at full speed, write the
 * statement so it cannot fail (`ON CONFLICT DO NOTHING`) and return
 * ::KINBOX_RESULT_DUPLICATE when it inserted nothing (batch handlers: one
 * set-based `... RETURNING` per batch, see docs/handlers.md).
 *
 * @param key   the constraint (PostgreSQL) or unique index (MySQL) name
 *              whose violation means "already applied", or NULL for any
 *              unique key of this statement. Copied.
 * @returns as kinbox_tx_exec().
 * @remark Usable from per-message and batch handlers; in a batch handler a
 *         violation first narrows the batch down to the message whose row
 *         violated the key.
 */
KINBOX_API kinbox_err_t kinbox_tx_exec_unique(kinbox_tx_t *tx, const char *key,
                                              const char *sql, int nparams,
                                              const char *const *params);

/**
 * @brief Queue a batch handler's multi-row INSERT, one row per message:
 *        a poison row costs its own message, and nothing else.
 *
 * The statement is @p head, then @p tuple once per row (rows joined by
 * ", "), then @p tail, e.g. head `"INSERT INTO user_points_flow (user_id,
 * order_id, biz_type, points_delta) VALUES "`, tuple `"($1, $2,
 * 'ORDER_REWARD', $3)"`, tail `""` or `" ON DUPLICATE KEY UPDATE ..."`.
 * The tuple's placeholders `$1..$nparams` are its row's parameters:
 * row i takes `params[i * nparams]` .. `params[i * nparams + nparams - 1]`
 * (text, NULL = SQL NULL, copied before the call returns). Row i carries
 * the effect of message `owners[i]` and of no other; a message may own
 * several rows.
 *
 * What a failing row does:
 * - It is always charged to its own message, like a statement that message
 *   queued itself (see kinbox_tx_exec() and docs/failures.md).
 * - Where the server names the failing row (MariaDB 10.7 and later; one
 *   extra statement, only after a failure) and the failure can never
 *   succeed (a CHECK, NOT NULL or data violation: dead letter; a unique
 *   violation: dead letter, or a business duplicate with
 *   kinbox_tx_exec_values_unique()), kinbox takes that message's rows out
 *   of this statement and out of the call's later exec_values()
 *   statements and sends them again: the transaction goes on, no handler
 *   runs again, no savepoint, no backoff. This holds when every statement
 *   the call queued after this one is an exec_values() one, nothing the
 *   call ran earlier carries the message's effect (queries starting with
 *   `SELECT` are taken to change nothing), the failure is found after the
 *   call returned, and `dead_letter.hold_key` is off.
 * - Otherwise (PostgreSQL, MySQL, older MariaDB, a retryable error such
 *   as a foreign-key violation, the conditions above not met) kinbox
 *   undoes the call and runs it again without the message, narrowing a
 *   failure the server does not pin down (docs/failures.md, failure
 *   isolation). The outcome is the same on every server; only the cost
 *   differs.
 *
 * So write a batch as one exec_values() per table, each row built from its
 * own message. On MySQL `INSERT ... ON DUPLICATE KEY UPDATE points =
 * points + VALUES(points)` applies rows one after the other; PostgreSQL's
 * `ON CONFLICT ... DO UPDATE` meets a key only once per statement (else
 * SQLSTATE 21000 and a batch split), so sum per key in SQL there:
 * `INSERT INTO t (k, v) SELECT k, sum(v) FROM (VALUES ($1, $2::bigint))
 * AS r (k, v) GROUP BY k ON CONFLICT (k) DO UPDATE ...` with the tuple
 * `($1, $2::bigint)` (docs/handlers.md has both in full).
 *
 * @param owners  @p nrows messages of this call (read during the call
 *                only). An entry that is NULL or not a message of this call
 *                charges its row to the whole call.
 * @returns as kinbox_tx_exec(); ::KINBOX_ERR_INVALID for no rows, a NULL
 *          head or tuple, or a tuple with a `;`.
 * @remark Batch handlers. In a per-message handler (or a batch handler
 *         called with one message) every row is that message's anyway and
 *         this is kinbox_tx_exec() of the assembled statement. Placeholders
 *         inside quoted text or comments are left alone; PostgreSQL
 *         dollar-quoted strings are not understood in @p tuple.
 */
KINBOX_API kinbox_err_t
kinbox_tx_exec_values(kinbox_tx_t *tx, const char *head, const char *tuple,
                      const char *tail, int nparams, const char *const *params,
                      const kinbox_msg_t *const *owners, size_t nrows);

/**
 * @brief kinbox_tx_exec_values() for the INSERT that records the batch's
 *        business keys (kinbox_tx_exec_unique() with one row per message).
 *
 * A unique violation of @p key (or of any unique key when NULL) on row i
 * makes `owners[i]` a business duplicate: its inbox row commits, whatever
 * the handler queued for it is undone (on MariaDB 10.7+ by dropping its
 * rows, see kinbox_tx_exec_values()).
 * @returns as kinbox_tx_exec_values().
 */
KINBOX_API kinbox_err_t kinbox_tx_exec_values_unique(
    kinbox_tx_t *tx, const char *key, const char *head, const char *tuple,
    const char *tail, int nparams, const char *const *params,
    const kinbox_msg_t *const *owners, size_t nrows);

/**
 * @brief Run a statement and return its rows now (flushes queued
 *        statements first).
 * @param rowsp receives rows owned by the caller (kinbox_rows_destroy());
 *              may be NULL when the rows are not wanted.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB with details in kinbox_tx_errstr()
 *          (return RETRY or REJECT then: the transaction is aborted);
 *          ::KINBOX_ERR_DUPLICATE for a unique-key violation (SQLSTATE 23505
 *          / MySQL 1062).
 */
KINBOX_API kinbox_err_t kinbox_tx_query(kinbox_tx_t *tx, const char *sql,
                                        int nparams, const char *const *params,
                                        kinbox_rows_t **rowsp);

/**
 * @brief kinbox_tx_query() for a batch handler's set-based statement whose
 *        rows belong to messages: row r of the statement is owners[r]'s,
 *        and keys[r] is a value of that row the server shows when it
 *        rejects the row (its business key, say).
 *
 * When the statement fails on a row and the server describes it
 * (PostgreSQL: "Failing row contains (...)" of a CHECK or NOT NULL
 * violation; values longer than 64 bytes are cut and do not match), the
 * first row whose key is one of the described values makes its owner a
 * suspect. A suspect is only a hint: kinbox runs the batch again with the
 * suspect in a call of its own, and charges a message only when its own
 * one-message call fails. A wrong hint costs time, never another
 * message's retry or dead letter. Elsewhere, and for one message's call,
 * this is kinbox_tx_query().
 * @param owners, keys nrows each (keys may be NULL: no hint).
 * @returns as kinbox_tx_query().
 */
KINBOX_API kinbox_err_t kinbox_tx_query_owned(
    kinbox_tx_t *tx, const char *sql, int nparams, const char *const *params,
    const kinbox_msg_t *const *owners, const char *const *keys, size_t nrows,
    kinbox_rows_t **rowsp);

/**
 * @brief Queue a batch handler's set-based statement that claims its
 *        messages' business keys, at full speed: the handler does not wait
 *        for its rows.
 *
 * The set-based kinbox_tx_exec_claim(). Row r of the statement is
 * `owners[r]`'s and carries business key `keys[r]` (text, copied). The
 * statement must return, in its first column, the key of each row it
 * claimed, and change nothing for a key already taken, e.g. on
 * PostgreSQL `INSERT INTO user_points_flow ... SELECT ... FROM unnest(...)
 * ON CONFLICT (order_id, biz_type) DO NOTHING RETURNING order_id` (a
 * data-modifying CTE may credit the rows it inserted, see
 * docs/handlers.md, kinbox_tx_exec_claims()). When its result is read
 * (after the handler returned), each returned key goes to the first row
 * (in @p owners order) carrying it; a message none of whose rows got a
 * key was already applied and is counted as a *business duplicate* (as with
 * ::KINBOX_RESULT_DUPLICATE: its inbox row commits, it is never retried
 * or dead-lettered). Two messages of one batch with the same key: the
 * first one applies it, the second is a business duplicate.
 *
 * A failing statement is handled like one of kinbox_tx_query_owned():
 * @p keys double as the hint that makes a suspect when the server
 * describes the failing row (PostgreSQL), and only a message's own
 * one-message call charges it.
 *
 * On PostgreSQL the statement is pipelined: a batch handler that queues
 * only statements and claims costs no round trip of its own, so kinbox
 * can cut a batch into more savepoint groups after a failure (a poison
 * message re-does a smaller group) at no extra wait. Elsewhere (MySQL,
 * MariaDB) the rows are read at once, as by kinbox_tx_query().
 *
 * @param owners, keys @p nrows each, not NULL. An owner that is not a
 *              message of this call owns nothing (its rows count for no
 *              message).
 * @returns as kinbox_tx_exec(); ::KINBOX_ERR_INVALID for no rows, no keys
 *          or no owners. A statement that returns no column fails (found
 *          when its result is read) as a permanent error naming the
 *          mistake: its messages are dead-lettered with that reason.
 * @remark Per-message handlers and replays may call it too: every row is
 *         then the message's own (a replay counts no duplicates).
 */
KINBOX_API kinbox_err_t kinbox_tx_exec_claims(
    kinbox_tx_t *tx, const char *sql, int nparams, const char *const *params,
    const kinbox_msg_t *const *owners, const char *const *keys, size_t nrows);

/** @brief Number of rows. */
KINBOX_API size_t kinbox_rows_count(const kinbox_rows_t *rows);
/** @brief Number of columns. */
KINBOX_API int kinbox_rows_columns(const kinbox_rows_t *rows);
/**
 * @brief Name of column @p col as the server reported it, owned by
 *        @p rows; NULL when @p col is out of range.
 */
KINBOX_API const char *kinbox_rows_column_name(const kinbox_rows_t *rows,
                                               int col);
/**
 * @brief Value as text (bytea/blob columns: the raw bytes, NUL-terminated),
 *        NULL for SQL NULL; owned by @p rows. Length in @p sizep if not NULL.
 */
KINBOX_API const char *kinbox_rows_value(const kinbox_rows_t *rows, size_t row,
                                         int col, size_t *sizep);
/** @brief Free rows. NULL is a no-op. */
KINBOX_API void kinbox_rows_destroy(kinbox_rows_t *rows);

/**
 * @brief The native PostgreSQL connection, for anything the helpers do not
 *        cover; NULL on MySQL. Queued statements are flushed first, and the
 *        connection is out of pipeline mode until the handler returns. Do
 *        not COMMIT, ROLLBACK or close it.
 */
KINBOX_API struct pg_conn *kinbox_tx_pgconn(kinbox_tx_t *tx);

/** @brief The native MySQL connection (see kinbox_tx_pgconn()); NULL on
 *         PostgreSQL. */
KINBOX_API struct st_mysql *kinbox_tx_mysql(kinbox_tx_t *tx);

/**
 * @brief Set the reason recorded with a RETRY or REJECT of the current
 *        message (per-message handler).
 */
KINBOX_API void kinbox_tx_set_error(kinbox_tx_t *tx, const char *fmt, ...)
    KINBOX_PRINTF(2, 3);

/** @brief Set the reason for one message of a batch handler. */
KINBOX_API void kinbox_tx_set_msg_error(kinbox_tx_t *tx,
                                        const kinbox_msg_t *msg,
                                        const char *fmt, ...)
    KINBOX_PRINTF(3, 4);

/** @brief Last database error seen on this transaction (one line, with
 *         SQLSTATE or MySQL errno), "" if none. Owned by @p tx. */
KINBOX_API const char *kinbox_tx_errstr(const kinbox_tx_t *tx);

KINBOX_END_DECLS

#endif
