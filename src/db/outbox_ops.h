/*
 * db/outbox_ops.h -- the outbox's and relay's statements per backend
 * (internal): struct kinbox__outbox_ops, filled by db/pg_outbox.c and
 * db/mysql_outbox.c, used by outbox.c, relay*.c and hold.c through
 * db->ops->outbox. db.h includes it at its end (it uses the connection's
 * types); include db.h.
 */
#ifndef KINBOX_DB_OUTBOX_OPS_H
#define KINBOX_DB_OUTBOX_OPS_H

#include "../db.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The outbox writer's, operator calls' and relay's statements, one table
 * per backend, so outbox.c and relay*.c hold no dialect SQL. Every call
 * runs on db's connection in the calling thread; return codes as for
 * kinbox__db_ops. Counts (done) say how many rows a guarded UPDATE changed:
 * fewer than asked means another relay or an operator changed them first.
 */

/* One claim: up to limit rows, heads of their aggregates first, then runs
 * of those aggregates' next pending rows (same destination, due, in id
 * order; run_max rows of one aggregate at most). Leases for lease_ms to
 * owner. $4 of the PostgreSQL claim is run_max.
 *
 * With lock set (relay.claim = lock): the same rows, locked FOR UPDATE
 * SKIP LOCKED and nothing written; the transaction stays open when rows
 * came back (the caller marks them in it and commits, or writes their
 * leases with lease() and commits; rollback() hands them back), and is
 * ended when none did. Versions are the rows' current ones. Run rows are
 * locked too, and an aggregate keeps only the prefix of its run that it
 * could lock (head first, in id order): a row skipped (locked elsewhere)
 * or no longer pending and due ends the run there, so nothing is claimed
 * past a row this claim does not hold. idle_ms > 0: the server ends the
 * session when that transaction sits idle longer (a relay that hangs
 * holding the locks does not hold them for ever). */
typedef struct kinbox__claim_req {
        int64_t limit;
        int64_t lease_ms;
        const char *owner;
        int64_t run_max; /* rows of one aggregate at most, head included */
        /* > 0: look for heads among the first window due pending rows
         * only (cheap when a hot aggregate's rows fill the front of the
         * backlog); 0: walk every pending row. */
        int64_t window;
        bool lock;
        int64_t idle_ms;
        /* > 0: most candidate heads read before locking (lock-held
         * claims: other relays' held rows look due and are skipped, so
         * more candidates than limit are needed); 0: the backend's own. */
        int64_t cand;
        /* Local action rows only (relay.source = wal | binlog: the log
         * relay publishes the events, which stay pending): event rows are
         * not claimed and do not hold back an action of their aggregate.
         * Both backends (MariaDB: one action per aggregate per claim). */
        bool actions_only;
} kinbox__claim_req_t;

/* Columns of a claim result row, in this order. */
enum {
        KINBOX__CL_ID, /* bigint */
        KINBOX__CL_VERSION, /* version after the claim's bump */
        KINBOX__CL_KIND, /* 'event' / 'action' */
        KINBOX__CL_DESTINATION,
        KINBOX__CL_IDEM_KEY,
        KINBOX__CL_AGGREGATE, /* NULL: no aggregate */
        KINBOX__CL_PAYLOAD, /* binary, NULL allowed */
        KINBOX__CL_HEADERS, /* JSON text, NULL allowed */
        KINBOX__CL_ATTEMPTS,
        KINBOX__CL_MAX_ATTEMPTS,
        KINBOX__CL_RECLAIMED, /* 't'/'1': a lease of another relay expired */
        KINBOX__CL_AGE_MS, /* now - created_at at claim time */
        KINBOX__CL_CREATED_MS, /* created_at, ms since the epoch */
        KINBOX__CL_NCOLS
};

/* A connection that waits for the outbox channel's notifications. */
typedef struct kinbox__listener kinbox__listener_t;
struct kinbox__log;
struct kinbox_conf_s;

struct kinbox__outbox_ops {
        /* Claim and commit (opens and ends its own transaction). *out gets
         * the claimed rows (NULL or 0 rows: nothing due). */
        int (*claim)(kinbox__db_t *db, const kinbox__claim_req_t *req,
                     struct kinbox_rows_s **out);
        /* Set-based, autocommit: status sent / lease handed back (pending,
         * due now, no attempt charged) for the rows whose (id, version)
         * still match and that are still pending. */
        int (*mark_sent)(kinbox__db_t *db, size_t n, const int64_t *ids,
                         const int64_t *versions, uint64_t *done);
        int (*release)(kinbox__db_t *db, size_t n, const int64_t *ids,
                       const int64_t *versions, uint64_t *done);
        /* One failed attempt: attempts + 1, status 'dead' or 'pending'
         * with next_attempt_at = now + delay_ms, last_error = err.
         * mark_sent, release and fail run in the open transaction when
         * there is one (a lock-held claim's), else in autocommit. */
        int (*fail)(kinbox__db_t *db, int64_t id, int64_t version, bool dead,
                    const char *err, int64_t delay_ms, uint64_t *done);
        /* Inside a lock-held claim's transaction: write the lease claim()
         * writes in lease mode (next_attempt_at = now + lease_ms, version
         * + 1, lease_owner = owner) on the rows whose (id, version) match
         * and that are still pending; the caller commits. */
        int (*lease)(kinbox__db_t *db, const char *owner, int64_t lease_ms,
                     size_t n, const int64_t *ids, const int64_t *versions,
                     uint64_t *done);
        /* LISTEN channel the table's trigger notifies on commit (NULL:
         * none, the relay polls). */
        const char *notify_channel;
        /* Wake-ups on the channel, on a connection of their own (NULL
         * where there is no channel). listen_open connects to conf's
         * database and listens; NULL with err set on failure; the
         * server's notices go to log. listen_fd is the socket to poll.
         * listen_drain consumes what arrived without blocking: *woken
         * when a notification came; <0 with err set when the connection
         * broke (close it). */
        kinbox__listener_t *(*listen_open)(const struct kinbox_conf_s *conf,
                                           const struct kinbox__log *log,
                                           char *err, size_t errsz);
        int (*listen_fd)(kinbox__listener_t *l);
        int (*listen_drain)(kinbox__listener_t *l, bool *woken, char *err,
                            size_t errsz);
        void (*listen_close)(kinbox__listener_t *l);
        /* The claim's walk over pending rows (its first step), LIMIT 1000,
         * no parameters: for EXPLAIN in tests and benchmarks, which check
         * that it reads the pending-rows index only. */
        const char *heads_scan;
        /* Cheap index-only probe: *due = some pending row is due now. */
        int (*probe)(kinbox__db_t *db, bool *due);
        /* An UPDATE (sql in this backend's dialect, $n placeholders) and
         * the number of rows it changed. */
        int (*affected)(kinbox__db_t *db, const char *sql, int n,
                        const kinbox__param_t *p, uint64_t *count);
        /* Append, queued like exec() (a duplicate is a silent no-op):
         * $1 kind $2 destination $3 idem_key $4 aggregate_id $5 payload
         * (binary) $6 headers (JSON) $7 max_attempts. */
        const char *append;
        /* kinbox_outbox_emit(): $1 the envelope (bytea, outbox_env.h) as a
         * transactional logical message; NULL where the backend has none
         * (MariaDB). */
        const char *emit;
        /* The same append, run now in the open transaction; *idp = the new
         * id, or 0 for a duplicate. */
        int (*append_id)(kinbox__db_t *db, const kinbox__param_t *p, int tag,
                         int64_t *idp);
        /* Operator statements ($1 id / destination, '' = all). Each is an
         * UPDATE for affected(). */
        const char *requeue_id, *cancel_id, *requeue_dest, *cancel_dest;
        /* List: $1 after id, $2 status ('' any), $3 destination ('' any);
         * the caller appends " LIMIT n". Columns: id, status, destination, idem_key,
         * aggregate_id, attempts, max_attempts, last_error, created_at,
         * next_attempt_at (NULL unless pending), payload size, sent_at,
         * version. */
        const char *list;
        /* outbox resend: the rows of Kafka destinations (kind event, not
         * canceled) created at or after $1 (ms since the epoch, UTC) with
         * id > $2, in id order; the caller appends " LIMIT n". Columns:
         * id, destination, idem_key, aggregate_id, payload, headers,
         * created_at (floor, ms since the epoch). */
        const char *resend;
};

extern const struct kinbox__outbox_ops kinbox__pg_outbox_ops;
extern const struct kinbox__outbox_ops kinbox__mysql_outbox_ops;

/* The outbox table's columns an append writes, in the order of its 7
 * parameters, and the look-up of a duplicate's id ($1 destination, $2
 * idem_key). */
#define KINBOX__OUTBOX_COLS                                                   \
        "kind, destination, idem_key, aggregate_id, payload, headers, "       \
        "max_attempts"
/* The table-less append (PostgreSQL): the envelope's prefix is
 * KINBOX__ENV_PREFIX (outbox_env.h). */
#define KINBOX__PG_EMIT_SQL                                                   \
        "SELECT pg_logical_emit_message(true, 'kinbox.outbox.v1', "           \
        "$1::bytea)"
#define KINBOX__OUTBOX_FIND_ID_SQL                                            \
        "SELECT id FROM kinbox_outbox WHERE destination = $1 AND idem_key = " \
        "$2"

/* The append of kinbox_outbox_append_pg() / _mysql() (outbox.c, which
 * validates the message and wakes local relays) on the caller's own
 * connection: p the 7 parameters of the outbox append above. KINBOX_OK
 * with *idp the new row's id; KINBOX_ERR_DUPLICATE with *idp the existing
 * row's (0 when not found); or an error with errstr set. idp may be
 * NULL. */
kinbox_err_t kinbox__pg_outbox_append(struct pg_conn *conn,
                                      const kinbox__param_t p[7], int64_t *idp,
                                      char *errstr, size_t errstr_size);
/* kinbox_outbox_emit_pg(): the envelope (n bytes) as a transactional
 * logical message on the caller's connection (db/pg_repl.c). KINBOX_OK, or
 * an error as kinbox__pg_outbox_append() with errstr set. */
kinbox_err_t kinbox__pg_outbox_emit(struct pg_conn *conn, const void *env,
                                    size_t n, char *errstr,
                                    size_t errstr_size);
kinbox_err_t kinbox__mysql_outbox_append(struct st_mysql *conn,
                                         const kinbox__param_t p[7],
                                         int64_t *idp, char *errstr,
                                         size_t errstr_size);

#endif
