/*
 * db/logsrc_ops.h -- a database log reader for the log relay (internal):
 * struct kinbox__logsrc_ops, one per backend that has one (db/pg_repl.c:
 * relay.source = wal; db/mysql_binlog.c: binlog), reached through
 * kinbox__db_logsrc() (db/backend.c), used by relay_log.c (the
 * backend-neutral loop: produce, delivery reports, confirm the
 * acknowledged prefix). db.h includes it at its end; include db.h.
 *
 * Contract of a source (every call on the relay's thread, one thread per
 * source; a source is never shared; ops->name is the relay.source value
 * that picks it: "wal", "binlog"):
 *
 *  - open(): connect, check the server's prerequisites and make what the
 *    reader needs (the slot; a server id). A prerequisite the operator
 *    must change (wal_level, REPLICATION, no free slot or walsender,
 *    log_bin, binlog_format) returns KINBOX_ERR_CONFIG with s->err naming
 *    the setting (kinbox run exits 2); KINBOX_ERR_DB_CONN when the server
 *    is unreachable (the loop retries); KINBOX_ERR_DB otherwise.
 *  - start(): stream from the last CONFIRMED position (the server's, the
 *    slot's confirmed_flush_lsn, or the one the source stored): every
 *    transaction after it is delivered again, whole. The loop calls
 *    start() after open() and again (after close() + open()) to go back
 *    to the confirmed position when Kafka failed something in flight.
 *  - next(): the next event within timeout_ms: 1 with *ev filled, 0 when
 *    nothing came (the source answered the server's keepalives itself
 *    meanwhile, reporting the last confirmed position), <0 an error (the
 *    loop closes, waits, opens and starts again). Events come as whole
 *    committed transactions in commit order: BEGIN, ROW / MESSAGE ...,
 *    COMMIT; KEEPALIVE between transactions. Pointers in *ev stay valid
 *    until the next call of next() or close(): the loop copies what it
 *    keeps.
 *      ROW: an INSERT of a pending row into kinbox_outbox, decoded into
 *        kinbox__logrow_t (other tables, other statements and rows
 *        inserted as dead are not delivered; action rows are, flagged).
 *      MESSAGE: a transactional logical message whose prefix starts with
 *        "kinbox." (PostgreSQL pg_logical_emit_message); raw bytes.
 *      COMMIT: pos = the position to confirm once every record of the
 *        transaction is acknowledged (PostgreSQL: the commit's end LSN;
 *        MariaDB: the transaction's GTID).
 *      KEEPALIVE: pos = the server's current position: the loop may
 *        confirm it when nothing is in flight (an idle outbox on a busy
 *        database pins no WAL).
 *  - confirm(): make pos the durable restart point (the next start()
 *    begins after it). Positions given are those of COMMIT / KEEPALIVE
 *    events, never decreasing. May be buffered and sent with the next
 *    feedback; must be sent before close() returns when possible. The
 *    position already confirmed again: the loop is not reading (too much
 *    in flight); the source keeps the server from timing the reader out.
 *    Returns 0 or <0 (connection lost: as next()).
 *  - dead(): record a record that can never be published as written
 *    (row_id > 0: that outbox row goes dead with reason, one UPDATE of
 *    that row only; row_id == 0: a bad logical message, kept with its raw
 *    bytes where an operator sees it: a dead kinbox_outbox row). The
 *    source's own connection, not the stream. 0 or <0.
 *  - lag(): optional (NULL): the operator's figures (bytes retained for
 *    the reader, its state); 0 when filled.
 *  - close(): end the stream and free what open() made (not the struct).
 */
#ifndef KINBOX_DB_LOGSRC_OPS_H
#define KINBOX_DB_LOGSRC_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kinbox__log;
struct kinbox_conf_s;

/* A position in the log. PostgreSQL: lsn (text "X/Y" for messages);
 * MariaDB: text is a GTID ("domain-server-seq"), lsn a monotonic counter
 * the source may use as it likes (0 when unused). Copied by value. */
typedef struct kinbox__logpos {
        uint64_t lsn;
        char text[128];
} kinbox__logpos_t;

typedef enum {
        KINBOX__LOGEV_BEGIN,
        KINBOX__LOGEV_ROW,
        KINBOX__LOGEV_MESSAGE,
        KINBOX__LOGEV_COMMIT,
        KINBOX__LOGEV_KEEPALIVE
} kinbox__logev_kind_t;

/* An INSERT into kinbox_outbox: the columns the polling relay publishes
 * (same key, headers, timestamp). */
typedef struct kinbox__logrow {
        int64_t id;
        bool action; /* kind = 'action': left to the polling relay */
        const char *destination, *idem_key;
        const char *aggregate_id; /* NULL: no key */
        const char *headers_json; /* NULL: none (hdrcodec.h form) */
        const char *payload; /* NULL: null payload */
        size_t payload_size;
        int64_t created_at_ms; /* floor(created_at, ms since the epoch) */
} kinbox__logrow_t;

typedef struct kinbox__logev {
        kinbox__logev_kind_t kind;
        kinbox__logpos_t pos; /* see the contract above */
        int64_t commit_ms; /* BEGIN / COMMIT: commit time (ms), 0 unknown */
        kinbox__logrow_t row; /* ROW */
        const char *prefix; /* MESSAGE */
        const unsigned char *data; /* MESSAGE: content */
        size_t size;
} kinbox__logev_t;

/* The operator's figures of a source (lag()). */
typedef struct kinbox__loglag {
        int64_t retained_bytes; /* log kept for the reader, -1 unknown */
        char state[32]; /* PostgreSQL wal_status, "" unknown */
} kinbox__loglag_t;

typedef struct kinbox__logsrc kinbox__logsrc_t;

typedef struct kinbox__logsrc_ops {
        const char *name; /* "wal", "binlog" */
        int (*open)(kinbox__logsrc_t *s);
        int (*start)(kinbox__logsrc_t *s);
        int (*next)(kinbox__logsrc_t *s, kinbox__logev_t *ev, int timeout_ms);
        int (*confirm)(kinbox__logsrc_t *s, const kinbox__logpos_t *pos);
        int (*dead)(kinbox__logsrc_t *s, int64_t row_id, const char *reason,
                    const kinbox__logpos_t *pos, const void *bytes,
                    size_t size);
        int (*lag)(kinbox__logsrc_t *s, kinbox__loglag_t *out);
        void (*close)(kinbox__logsrc_t *s);
} kinbox__logsrc_ops_t;

struct kinbox__logsrc {
        const kinbox__logsrc_ops_t *ops;
        const struct kinbox_conf_s *conf; /* the relay's settings */
        const struct kinbox__log *log;
        const char *url; /* database.url (the relay's db->url) */
        const char *password; /* database.password_file's, or NULL */
        const char *slot; /* slot name (PostgreSQL) / reader name */
        void *impl; /* the source's own state (open() .. close()) */
        char err[512]; /* the last failure, one line */
};

/* PostgreSQL's (db/pg_repl.c). */
extern const kinbox__logsrc_ops_t kinbox__pg_repl_ops;
/* MariaDB's (db/mysql_binlog_src.c). */
extern const kinbox__logsrc_ops_t kinbox__binlog_src_ops;

/* The log relay's slot (PostgreSQL) and reader name of conf: relay.slot,
 * or kinbox_<name> (a-z, 0-9 and _ kept, the rest _); malloc'ed, NULL
 * when out of memory. Also the slot whose progress a partitioned
 * outbox's prune waits for (partition_outbox.c). db/pg_repl.c. */
char *kinbox__wal_slot_name(const struct kinbox_conf_s *conf);

#endif
