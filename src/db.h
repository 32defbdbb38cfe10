/*
 * db.h -- the database backend layer (internal).
 *
 * Each backend (db/pg.c, db/mysql.c) fills one struct kinbox__db_ops. The
 * rest of kinbox speaks only this interface plus a handful of dialect
 * strings, so a backend slots in without touching the consumer or relay.
 * Every user includes this header; it brings in the rest of the contract:
 * db/tags.h (statement tags: whom a failure is charged to), db/sql.h (the
 * dialect statement table), db/part_ops.h (the partitioned inbox) and
 * db/outbox_ops.h (the outbox's and relay's statements per backend).
 *
 * Conventions:
 *  - SQL uses $1..$n placeholders on every backend (MySQL rewrites them).
 *  - exec() may defer a statement (PG pipeline / MySQL multi-statement);
 *    every deferred statement carries a tag (the index of the message whose
 *    handler queued it, or -1 for kinbox's own statements). The first
 *    failure found at flush()/commit()/query() is reported with its tag in
 *    db->err.tag.
 *  - Return codes: KINBOX_OK; KINBOX_ERR_DB (non-transient statement error,
 *    see db->err.tag); KINBOX_ERR_DUPLICATE (unique violation 23505/1062);
 *    KINBOX_ERR_TRANSIENT (deadlock, serialization, lock wait timeout: retry
 *    the transaction); KINBOX_ERR_DB_CONN (connection lost: reconnect);
 *    KINBOX_ERR_COMMIT_UNKNOWN (lost during COMMIT).
 *  - After any error inside a transaction the transaction is dead: call
 *    rollback() (which never fails the caller) before anything else.
 */
#ifndef KINBOX_DB_H
#define KINBOX_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kinbox/handler.h"

#include "db/sql.h"
#include "db/tags.h"

typedef struct kinbox__db kinbox__db_t;

/** A statement parameter. v == NULL is SQL NULL. */
typedef struct kinbox__param {
        const char *v;
        size_t len; /* bytes; for text, 0 means strlen(v) */
        int binary; /* raw bytes for a bytea/blob column */
} kinbox__param_t;

/** An exec_values() statement. */
typedef struct kinbox__values {
        const char *head, *tuple, *tail;
        int nper; /* parameters per row */
        const kinbox__param_t *p; /* nrows * nper, row after row */
        size_t nrows;
        const int *row_tags; /* nrows */
} kinbox__values_t;

/** One inbox row to insert. */
typedef struct kinbox__inbox_row {
        const char *id;
        const char *topic;
        int32_t partition;
        int64_t offset;
        int64_t msg_ms; /* the message's time (Kafka timestamp), ms since
                         * the epoch; -1: unknown (keyed by the epoch's
                         * range, db/inbox.c) */
} kinbox__inbox_row_t;

/** Error detail of the last failed call. */
typedef struct kinbox__dberr {
        int code; /* kinbox_err_t */
        char sqlstate[6]; /* PostgreSQL SQLSTATE, "" on MySQL */
        int vendor; /* MySQL errno, 0 on PostgreSQL */
        int tag; /* whom the failure is charged to: the failing
                  * statement's tag, or for an exec_rows() statement the
                  * tag of the row the server named; -1 if none */
        int stmt_tag; /* the failing statement's own tag, as queued */
        /* 1 + the tag of the row the server's detail seems to describe
         * (PostgreSQL: "Failing row contains (...)" of a CHECK / NOT NULL
         * violation, matched against the keys of a query with owners,
         * db->attr->hint_*), 0 when none. A hint for narrowing, never blame:
         * the row's owner is only charged when its own one-message call
         * fails. */
        int suspect;
        /* Retrying cannot help: a CHECK / NOT NULL / exclusion violation or
         * a data exception (SQLSTATE class 22 and MySQL equivalents). A
         * unique violation is code KINBOX_ERR_DUPLICATE instead. */
        bool permanent;
        /* No retry can fix it, and no message is to blame: the statement
         * cannot run as the database is deployed (an undefined table,
         * column or function, a syntax error, a missing privilege;
         * PostgreSQL class 42, MySQL 1146, 1054, 1064, 1142, ...). */
        bool deploy;
        /* The failing statement's head (its text up to the first quoted
         * literal, at most ~100 bytes), "" when unknown: for log lines. */
        char stmt[128];
        /* The violated constraint / unique index, "" when unknown. */
        char constraint[128];
        char msg[512]; /* one line: "SQLSTATE 23505: ..." */
} kinbox__dberr_t;

/** Rows: the implementation of the public kinbox_rows_t. */
struct kinbox_rows_s {
        size_t nrows;
        int ncols;
        char **values; /* nrows*ncols, NULL = SQL NULL, NUL-terminated */
        size_t *lens; /* nrows*ncols */
        char **names; /* ncols column names */
};

struct kinbox__db_ops;
struct kinbox__claims;

/** One connection. Not thread-safe: one thread at a time. */
struct kinbox__db {
        const struct kinbox__db_ops *ops;
        kinbox_backend_t backend;
        char *url; /* as configured, without password */
        char *password; /* from password_file, may be NULL */
        void *native; /* PGconn * / MYSQL * (NULL when down) */
        void *impl; /* backend private state */
        bool in_tx;
        /* MySQL: merge single-row INSERTs of a transaction (db/mysql.c). */
        bool coalesce;
        /* The attribution record of the transaction running now
         * (db/tags.h), set by kinbox__db_begin(); NULL: none kept. */
        kinbox__attr_t *attr;
        /* The inbox layout (db/inbox.c): the width of one range of
         * message time in seconds (part_at), the boundary skew, and
         * whether kinbox_inbox is partitioned (shadow rows written). Set
         * from kinbox_partitioning, or the configuration for a plain
         * inbox; kinbox__inbox_layout_load(). */
        int64_t inbox_width_s, inbox_skew_s;
        bool inbox_partitioned;
        /* A converted inbox whose rows without msg_at may still be
         * redelivered (kinbox_partitioning.legacy_until ahead of the
         * database's clock): kinbox__inbox_legacy(). */
        bool inbox_legacy;
        int64_t inbox_layout_read_ms; /* monotonic, 0: never */
        kinbox__dberr_t err;
        void (*log)(void *ctx, int level, const char *fmt, ...);
        void *log_ctx;
};

struct kinbox__db_ops {
        const char *name;
        kinbox_backend_t backend;
        /* (Re)connect; closes an old connection first. */
        int (*connect)(kinbox__db_t *db);
        void (*disconnect)(kinbox__db_t *db);
        /* Free backend state after disconnect (may be NULL). */
        void (*release)(kinbox__db_t *db);
        /* BEGIN, READ COMMITTED. May be deferred. */
        int (*begin)(kinbox__db_t *db);
        int (*exec)(kinbox__db_t *db, const char *sql, int n,
                    const kinbox__param_t *p, int tag);
        /* One multi-row INSERT: head, then tuple once per row (its $1..
         * $nper are that row's parameters), rows joined by ", ", then
         * tail. Row r belongs to row_tags[r]. When a row fails and the
         * server names it, db->err.tag is that row's tag (err.stmt_tag
         * stays tag); with db->attr->drop_rows the row's owner may be dropped
         * from the statement (and from the same call's later exec_values()
         * statements) and the transaction goes on: the failure is then
         * appended to db->attr->drops instead of returned. row_tags NULL: no
         * owners, a plain statement. Backends whose server cannot name a
         * row use kinbox__db_exec_values_text(). */
        int (*exec_values)(kinbox__db_t *db, const struct kinbox__values *v,
                           int tag);
        /* exec() of a statement returning the business keys it claimed
         * (kinbox_tx_exec_claims()), without waiting: when its result is
         * read, kinbox__claims_resolve() notes the owners that claimed
         * nothing; when it fails, its keys make the suspect. Takes c (also
         * on error). NULL where the backend reads it at once instead
         * (kinbox__db_exec_claims()). */
        int (*exec_claims)(kinbox__db_t *db, const char *sql, int n,
                           const kinbox__param_t *p, int tag,
                           struct kinbox__claims *c);
        /* Flushes deferred statements, then runs sql; *out may be NULL. */
        int (*query)(kinbox__db_t *db, const char *sql, int n,
                     const kinbox__param_t *p, int tag,
                     struct kinbox_rows_s **out);
        int (*flush)(kinbox__db_t *db);
        /* Take the results of queued statements that have arrived, then
         * wait until at most ahead statements are unanswered: a failure
         * among those taken is returned (db->err) as by flush, the rest
         * stay queued. May be NULL. */
        int (*peek)(kinbox__db_t *db, size_t ahead);
        int (*commit)(kinbox__db_t *db);
        void (*rollback)(kinbox__db_t *db);
        /* Inside a transaction: queue SAVEPOINT name (may be deferred). */
        int (*savepoint)(kinbox__db_t *db, const char *name);
        /* Inside a transaction, also one a failed statement aborted:
         * roll back to the savepoint (which stays defined), forgetting
         * every statement queued since and the last error. The
         * transaction is usable again on success. */
        int (*rollback_to)(kinbox__db_t *db, const char *name);
        /* Inside a transaction: send what is queued and end the protocol
         * exchange, so that the server sees the session idle in its
         * transaction (PostgreSQL's pipeline: a Sync, which commits
         * nothing inside a transaction block; its idle timeouts and
         * pg_stat_activity then apply). NULL where a statement's round
         * trip already ends it. */
        int (*settle)(kinbox__db_t *db);
        /* Flush and hand out the native handle for synchronous use. */
        void *(*native)(kinbox__db_t *db);
        /* Several ;-separated statements, no parameters, outside any
         * transaction (migrations). */
        int (*script)(kinbox__db_t *db, const char *sql);
        /*
         * Insert inbox rows for ids[0..n) (consumer, id, topic, partition,
         * offset, message time) inside the open transaction and tell which
         * were new: is_new[i] = true for the first occurrence of an id
         * whose rows (kinbox__inbox_puts(): its own, and in a partitioned
         * inbox a boundary marker) were all inserted. One round trip where
         * the backend allows.
         */
        int (*inbox_insert)(kinbox__db_t *db, const char *consumer, size_t n,
                            const struct kinbox__inbox_row *rows,
                            bool *is_new);
        /* Dialect SQL for the statements that differ. */
        const struct kinbox__sql *sql;
        /* The outbox's and relay's statements (db/pg_outbox.c,
         * db/mysql_outbox.c). */
        const struct kinbox__outbox_ops *outbox;
        /* The partitioned inbox's statements (db/pg_part.c,
         * db/mysql_part.c). */
        const struct kinbox__part_ops *part;
        /* The partitioned outbox's statements
         * (db/pg_outbox_partition.c, db/mysql_outbox_partition.c). */
        const struct kinbox__opart_ops *opart;
};

/* The server ran out of a resource: disk, memory, connection slots or
 * another limit (PostgreSQL SQLSTATE class 53; MariaDB/MySQL 1021 disk
 * full, 1037/1038/5 out of memory, 1040 too many connections, 1041 out
 * of resources, 1114 table full, 3 error writing a file). Retrying
 * helps once the operator frees it; it needs the operator's eyes. */
bool kinbox__db_resource_error(const kinbox__dberr_t *e);

/* Set db->err.stmt from a statement's text (len bytes): whitespace runs
 * as one space, cut before the first quoted literal (no values in log
 * lines) and at about 100 bytes. */
void kinbox__db_err_stmt(kinbox__db_t *db, const char *sql, size_t len);

/* "42P01" or the MySQL errno of e, for a metric's cause label. */
const char *kinbox__db_err_cause(const kinbox__dberr_t *e, char *buf,
                                 size_t sz);

/* The one of a module's two schema texts that is this backend's. */
const char *kinbox__db_pick(const kinbox__db_t *db, const char *postgresql,
                            const char *mysql);
/* The native connection for a handler asking for libpq's (pgconn) or the
 * MySQL client's (mysql), flushing what is queued; NULL when db is the
 * other backend or is down; *down tells the latter (db is that backend's,
 * but not connected). */
struct pg_conn *kinbox__db_pgconn(kinbox__db_t *db, bool *down);
struct st_mysql *kinbox__db_mysql(kinbox__db_t *db, bool *down);
/* A schema script of one backend. The scripts are migrate.c's (embedded
 * at build time, migrate.h); the backend layer is only given them. */
typedef struct kinbox__migration {
        int backend; /* kinbox_backend_t */
        int version;
        const char *name;
        const char *sql;
} kinbox__migration_t;
/* Of the scripts all (terminated by an entry with name == NULL), db's
 * backend's in order: the first after m (NULL: the first of all); NULL
 * after the last. */
const kinbox__migration_t *kinbox__db_migration(const kinbox__db_t *db,
                                                const kinbox__migration_t *all,
                                                const kinbox__migration_t *m);

/* Backends. */
extern const struct kinbox__db_ops kinbox__pg_ops;
extern const struct kinbox__db_ops kinbox__mysql_ops;

/*
 * Parse url (postgresql://..., postgres://..., mysql://...) and create an
 * unconnected handle. password may be NULL. Returns NULL with errstr set.
 * (db/backend.c: the one file that knows every backend.)
 */
kinbox__db_t *kinbox__db_new(const char *url, const char *password,
                             char *errstr, size_t errstr_size);
void kinbox__db_destroy(kinbox__db_t *db);
/* kinbox__db_new() for a configuration's `database.url` and
 * `database.password_file` (read now, not kept): the one way every module
 * opens its handle. */
struct kinbox_conf_s;
kinbox__db_t *kinbox__db_new_conf(const struct kinbox_conf_s *conf,
                                  char *errstr, size_t errstr_size);

/* An unconnected handle of the backend ops names (db/db.c): for a
 * backend's own side connections, which must not go back up through
 * kinbox__db_new(). NULL with errstr when url names another backend or
 * memory ran out. */
kinbox__db_t *kinbox__db_new_ops(const struct kinbox__db_ops *ops,
                                 const char *url, const char *password,
                                 char *errstr, size_t errstr_size);
/* The log relay's source of db's backend (db/logsrc_ops.h). */
const struct kinbox__logsrc_ops *kinbox__db_logsrc(const kinbox__db_t *db);

/* Convenience wrappers (dispatch through ops). */
int kinbox__db_connect(kinbox__db_t *db);
/* Run one statement synchronously outside of a batch (autocommit unless a
 * transaction is open). */
int kinbox__db_query(kinbox__db_t *db, const char *sql, int n,
                     const kinbox__param_t *p, struct kinbox_rows_s **out);
/* ops->peek where the backend has one; 0 (nothing taken) otherwise. */
int kinbox__db_peek(kinbox__db_t *db, size_t ahead);
/* Ends a transaction by rc: rc 0 commits (returns the commit's result),
 * anything else rolls back an open transaction and returns rc. */
int kinbox__db_end(kinbox__db_t *db, int rc);
/* Rolls back the open transaction, if there is one. */
void kinbox__db_abandon(kinbox__db_t *db);
/* Text-parameter helper: vals[i] NUL-terminated or NULL. */
int kinbox__db_queryv(kinbox__db_t *db, const char *sql, int n,
                      const char *const *vals, struct kinbox_rows_s **out);

/*
 * A batch's inbox rows in insertion order: by message id, ties by batch
 * index. Both backends insert in this order, so two workers or processes
 * whose batches share ids (a duplicate re-sent to another partition) take
 * the unique-index locks in the same order and wait for each other
 * instead of deadlocking. Returns a malloc'ed array of n, or NULL.
 */
typedef struct kinbox__idref {
        const char *id;
        size_t idx;
} kinbox__idref_t;
kinbox__idref_t *kinbox__inbox_sorted(const struct kinbox__inbox_row *rows,
                                      size_t n);
/* is_new[] of the first occurrence of id in sorted (from inbox_sorted). */
void kinbox__inbox_mark_new(const kinbox__idref_t *sorted, size_t n,
                            const char *id, bool *is_new);

/*
 * The rows one inbox insert writes (db/inbox.c), in insertion order: per
 * message (in the order of ix) its own row, part_at = the start of the
 * width-long range its time falls in; in a partitioned inbox, when that
 * time is within skew of the end of its range, then a shadow row keyed by
 * the next range. Two copies of one id whose times differ by at most skew
 * so always collide on some (consumer, message_id, part_at). back: the
 * server returned the row (it was inserted).
 */
typedef struct kinbox__inbox_put {
        size_t row; /* index into rows[] */
        int64_t part_s; /* range start, seconds since the epoch (UTC) */
        int64_t msg_ms; /* the row's message time (never -1) */
        bool shadow;
        bool back;
} kinbox__inbox_put_t;
/* malloc'ed array of *np puts for rows[0..n) in order ix, or NULL. */
kinbox__inbox_put_t *kinbox__inbox_puts(const kinbox__db_t *db,
                                        const struct kinbox__inbox_row *rows,
                                        const kinbox__idref_t *ix, size_t n,
                                        size_t *np);
/* One row the insert returned: message_id, topic, kafka_partition,
 * kafka_offset, shadow (text): mark its put back. */
void kinbox__inbox_put_back(kinbox__inbox_put_t *puts, size_t np,
                            const struct kinbox__inbox_row *rows,
                            const char *const *v);
/* is_new[i]: the first occurrence of its id in ix and every put of it
 * came back. */
void kinbox__inbox_puts_fold(const kinbox__inbox_put_t *puts, size_t np,
                             const kinbox__idref_t *ix, size_t n,
                             bool *is_new);
/* A message whose own row went in while its marker met another copy's
 * row (or the reverse) is a duplicate: delete the rows it did insert, in
 * the open transaction, so that no row names a delivery never applied. */
int kinbox__inbox_undo(kinbox__db_t *db, const char *consumer,
                       const struct kinbox__inbox_row *rows,
                       const kinbox__inbox_put_t *puts, size_t np);
/* "YYYY-MM-DD HH:MM:SS" (UTC) of s seconds since the epoch; with ms >= 0
 * ".mmm" appended. out holds 32 bytes. */
void kinbox__utc_text(char *out, int64_t s, int ms);
/* The range start (seconds, UTC) of now in db's inbox layout (a day when
 * it was never read): where a re-inserted row goes whose own is gone. */
int64_t kinbox__inbox_part_now(const kinbox__db_t *db);
/* The range start (seconds, UTC) that ms falls in, for width_s. */
int64_t kinbox__inbox_part_of(int64_t ms, int64_t width_s);
/* After the inbox insert of rows (n, in its transaction), while
 * db->inbox_legacy: messages that came back new but whose id has a row
 * converted from a plain inbox without msg_at (keyed by the epoch's range,
 * msg_at NULL) are not new (is_new[i] false). One indexed lookup per
 * batch; nothing while the flag is off. */
int kinbox__inbox_legacy(kinbox__db_t *db, const char *consumer,
                         const struct kinbox__inbox_row *rows, size_t n,
                         bool *is_new);
/* Read the inbox layout into db (kinbox_partitioning; conf for a plain
 * inbox) when it was never read or was read over 10 s ago. Outside a
 * transaction. */
int kinbox__inbox_layout_load(kinbox__db_t *db, int64_t conf_width_ms,
                              bool force);

/* Rows helpers. */
struct kinbox_rows_s *kinbox__rows_new(size_t nrows, int ncols);
/* Copies len bytes (v NULL = SQL NULL). */
int kinbox__rows_set(struct kinbox_rows_s *r, size_t row, int col,
                     const char *v, size_t len);
int kinbox__rows_set_name(struct kinbox_rows_s *r, int col, const char *n);

/* ops->begin() with attr as the transaction's attribution record
 * (db/tags.h; NULL: none kept): the backend writes it until the next
 * kinbox__db_begin(). */
int kinbox__db_begin(kinbox__db_t *db, kinbox__attr_t *attr);
/* An attribution record's memory (the record itself is the caller's). */
void kinbox__attr_free(kinbox__attr_t *a);

/* Run sql (no parameters) now; *yes = it returned a row. */
int kinbox__db_exists(kinbox__db_t *db, const char *sql, bool *yes);

/* ops->query() with its rows' keys and owner tags as hints (db->attr->hint_*,
 * set for this statement only; keys NULL: a plain query). */
int kinbox__db_query_hinted(kinbox__db_t *db, const char *sql, int n,
                            const kinbox__param_t *p, int tag,
                            const char *const *keys, const int *tags,
                            size_t nrows, struct kinbox_rows_s **out);
/* 1 + the tag of the first hinted row (db->attr->hint_*) with an owner whose
 * key is a whole field of row, a row as servers describe it: "(v1, v2,
 * ...)"; 0 when none matches. */
int kinbox__db_row_suspect(const kinbox__db_t *db, const char *row);
/*
 * A set-based claim (kinbox_tx_exec_claims()): row r of the statement is
 * owned by tags[r] (a message's tag; a group tag or -1: no one) and carries
 * business key keys[r]. One heap block, keys copied.
 */
typedef struct kinbox__claims {
        size_t n;
        int *tags;
        char **keys;
} kinbox__claims_t;
kinbox__claims_t *kinbox__claims_new(const char *const *keys, const int *tags,
                                     size_t n);
void kinbox__claims_free(kinbox__claims_t *c);
/* The statement's result, the keys it returned (got[0..ngot)): each one
 * goes to the first row carrying it; every owner none of whose rows got a
 * key is noted in db->attr->none_tags (already applied). */
void kinbox__claims_resolve(kinbox__db_t *db, const kinbox__claims_t *c,
                            const char *const *got, size_t ngot);
/* The claim statement of tag returned no column: a permanent failure
 * (db->err) naming the mistake. */
int kinbox__claims_no_rows(kinbox__db_t *db, int tag);
/* kinbox__db_row_suspect() for the rows of a claim. */
int kinbox__claims_suspect(const kinbox__claims_t *c, const char *row);
/* Queue a claim statement: ops->exec_claims, or (backends reading rows
 * at once, *waited set) query the rows now and resolve them. tags NULL or
 * tag < 0: no owners, a plain exec(). */
int kinbox__db_exec_claims(kinbox__db_t *db, const char *sql, int n,
                           const kinbox__param_t *p, int tag,
                           const char *const *keys, const int *tags,
                           size_t nrows, bool *waited);
/* exec_values() as one exec(): the rows joined into one statement, each
 * row's $N moved up to its own parameters (no row can be named). */
int kinbox__db_exec_values_text(kinbox__db_t *db, const kinbox__values_t *v,
                                int tag);

/* Note a claim statement that affected no row (db->attr->none_tags;
 * nothing without a record). */
void kinbox__db_note_none(kinbox__db_t *db, int tag);

/* Fill db->err. */
void kinbox__db_seterr(kinbox__db_t *db, int code, const char *sqlstate,
                       int vendor, int tag, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Parse a database URL into parts (all malloc'ed, NULL when absent). */
typedef struct kinbox__dburl {
        kinbox_backend_t backend;
        char *user, *password, *host, *dbname;
        int port;
        char *params; /* raw query string after '?', may be NULL */
} kinbox__dburl_t;
int kinbox__dburl_parse(const char *url, kinbox__dburl_t *out, char *errstr,
                        size_t errstr_size);
/* The same without the backend's checks of its parameters (db/db.c): for
 * a backend re-reading a URL kinbox__dburl_parse() accepted. */
int kinbox__dburl_split(const char *url, kinbox__dburl_t *out, char *errstr,
                        size_t errstr_size);
void kinbox__dburl_free(kinbox__dburl_t *u);
/* A mysql:// URL's parameters (after '?'): 0, or -1 naming the first one
 * that is unknown or has a bad value (src/db/mysql.c). */
int kinbox__mysql_url_check(const char *params, char *errstr,
                            size_t errstr_size);

/* The outbox's and relay's statements: they use the types above. */
#include "db/logsrc_ops.h"
#include "db/outbox_ops.h"
#include "db/part_ops.h"
#include "db/outbox_partition.h"

#endif
