/*
 * outbox.c -- the outbox writer (append in a kinbox transaction or on the
 * caller's own PGconn / MYSQL) and the operator calls (requeue, cancel,
 * list). The relay lives in relay.c.
 *
 * Headers are stored as JSON text so operators can read them:
 *   [["name","utf-8 value"],["name",null],["name",{"b64":"..."}]]
 * A value that is valid UTF-8 is stored as a JSON string (exact: only
 * control characters, '"' and '\\' are escaped), anything else as base64.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <mysql.h>

#include "db.h"
#include "hdrcodec.h"
#include "internal.h"
#include "tx.h"

/* Shared with relay.c. */
kinbox__db_t *kinbox__outbox_db_open(const kinbox_conf_t *conf, char *errstr,
                                     size_t errstr_size);
int kinbox__outbox_headers_json(kinbox__buf_t *b, const kinbox_header_t *h,
                                size_t n);
int kinbox__outbox_affected(kinbox__db_t *db, const char *sql, int n,
                            const kinbox__param_t *p, uint64_t *countp);

/* ---------------------------------------------------------------- SQL */

#define OUTBOX_COLS                                                            \
        "kind, destination, idem_key, aggregate_id, payload, headers, "        \
        "max_attempts"

static const char pg_append_sql[] =
    "INSERT INTO kinbox_outbox (" OUTBOX_COLS ") "
    "VALUES ($1, $2, $3, $4, $5, $6, $7::integer) "
    "ON CONFLICT (destination, idem_key) DO NOTHING RETURNING id";

/* The duplicate branch sets LAST_INSERT_ID() to 0, so that a following
 * SELECT LAST_INSERT_ID() says "new id" or "duplicate" exactly. */
static const char my_append_sql[] =
    "INSERT INTO kinbox_outbox (" OUTBOX_COLS ") "
    "VALUES ($1, $2, $3, $4, $5, $6, $7) "
    "ON DUPLICATE KEY UPDATE id = id + LAST_INSERT_ID(0)";

static const char find_id_sql[] =
    "SELECT id FROM kinbox_outbox WHERE destination = $1 AND idem_key = $2";

/* ---------------------------------------------------------------- helpers */

int
kinbox__outbox_headers_json(kinbox__buf_t *b, const kinbox_header_t *h,
                            size_t n)
{
        /* Outbox headers need a name (the codec itself keeps empty ones,
         * which consumed messages may carry). */
        for (size_t i = 0; i < n; i++)
                if (!h[i].name || !*h[i].name)
                        return -1;
        char *s = kinbox__hdrcodec_encode(h, n, NULL, 0);
        if (!s)
                return n > KINBOX__HDRS_MAX ? -1 : -2;
        kinbox__buf_adds(b, s);
        free(s);
        return b->oom ? -2 : 0;
}

/* Validated, ready-to-bind form of a message. */
typedef struct prepared {
        const char *kind;
        char maxbuf[16];
        kinbox__buf_t headers;
        bool has_headers;
} prepared_t;

static kinbox_err_t
prepare(const kinbox_outbox_msg_t *m, prepared_t *pr, char *errstr,
        size_t errstr_size)
{
        memset(pr, 0, sizeof(*pr));
        kinbox__buf_init(&pr->headers);
        if (!m || !m->destination || !*m->destination || !m->idem_key ||
            !*m->idem_key) {
                kinbox__errstr(errstr, errstr_size,
                               "outbox append: destination and idem_key are "
                               "required");
                return KINBOX_ERR_INVALID;
        }
        if (strlen(m->destination) > KINBOX_OUTBOX_NAME_MAX ||
            strlen(m->idem_key) > KINBOX_OUTBOX_NAME_MAX ||
            (m->aggregate_id &&
             strlen(m->aggregate_id) > KINBOX_OUTBOX_NAME_MAX)) {
                kinbox__errstr(errstr, errstr_size,
                               "outbox append: destination, idem_key and "
                               "aggregate_id are limited to %d bytes",
                               KINBOX_OUTBOX_NAME_MAX);
                return KINBOX_ERR_INVALID;
        }
        if (m->max_attempts < 0 || (m->payload_size && !m->payload) ||
            (m->header_count && !m->headers)) {
                kinbox__errstr(errstr, errstr_size,
                               "outbox append: invalid max_attempts, payload "
                               "or headers");
                return KINBOX_ERR_INVALID;
        }
        pr->kind = "event";
        size_t plen = strlen(KINBOX_OUTBOX_ACTION_PREFIX);
        if (!strncmp(m->destination, KINBOX_OUTBOX_ACTION_PREFIX, plen)) {
                if (!m->destination[plen]) {
                        kinbox__errstr(errstr, errstr_size,
                                       "outbox append: action name missing "
                                       "in \"%s\"",
                                       m->destination);
                        return KINBOX_ERR_INVALID;
                }
                pr->kind = "action";
        }
        snprintf(pr->maxbuf, sizeof(pr->maxbuf), "%d", m->max_attempts);
        if (m->header_count) {
                int rc = kinbox__outbox_headers_json(&pr->headers, m->headers,
                                                     m->header_count);
                if (rc == -1) {
                        kinbox__buf_free(&pr->headers);
                        kinbox__errstr(errstr, errstr_size,
                                       "outbox append: header without name");
                        return KINBOX_ERR_INVALID;
                }
                if (rc) {
                        kinbox__buf_free(&pr->headers);
                        kinbox__errstr(errstr, errstr_size, "out of memory");
                        return KINBOX_ERR_NOMEM;
                }
                pr->has_headers = true;
        }
        return KINBOX_OK;
}

static void
prepared_free(prepared_t *pr)
{
        kinbox__buf_free(&pr->headers);
}

static void
fill_params(const kinbox_outbox_msg_t *m, const prepared_t *pr,
            kinbox__param_t p[7])
{
        memset(p, 0, sizeof(kinbox__param_t) * 7);
        p[0].v = pr->kind;
        p[1].v = m->destination;
        p[2].v = m->idem_key;
        p[3].v = m->aggregate_id;
        /* A zero-length payload still needs a non-NULL pointer. */
        p[4].v = m->payload ? (const char *)m->payload : NULL;
        p[4].len = m->payload_size;
        p[4].binary = 1;
        p[5].v = pr->has_headers ? pr->headers.p : NULL;
        p[5].len = pr->has_headers ? pr->headers.len : 0;
        p[6].v = pr->maxbuf;
}

static int64_t
parse_i64(const char *s)
{
        if (!s)
                return 0;
        char *end = NULL;
        long long v = strtoll(s, &end, 10);
        if (end == s)
                return 0;
        return (int64_t)v;
}

/* ---------------------------------------------------------------- append */

static kinbox_err_t
find_existing(kinbox__db_t *db, const kinbox_outbox_msg_t *m, int tag,
              int64_t *idp)
{
        kinbox__param_t p[2] = {{m->destination, 0, 0}, {m->idem_key, 0, 0}};
        struct kinbox_rows_s *rows = NULL;
        int rc = db->ops->query(db, find_id_sql, 2, p, tag, &rows);
        if (rc)
                return (kinbox_err_t)rc;
        *idp = rows && rows->nrows ? parse_i64(rows->values[0]) : 0;
        kinbox_rows_destroy(rows);
        return KINBOX_ERR_DUPLICATE;
}

KINBOX_API kinbox_err_t
kinbox_outbox_append(kinbox_tx_t *tx, const kinbox_outbox_msg_t *m,
                     int64_t *idp)
{
        if (!tx)
                return KINBOX_ERR_INVALID;
        kinbox__db_t *db = kinbox__tx_db(tx);
        int tag = kinbox__tx_tag(tx);
        prepared_t pr;
        char err[256];
        kinbox_err_t rc = prepare(m, &pr, err, sizeof(err));
        if (rc) {
                kinbox__db_seterr(db, rc, "", 0, tag, "%s", err);
                return rc;
        }
        kinbox__param_t p[7];
        fill_params(m, &pr, p);
        bool pg = db->backend == KINBOX_BACKEND_POSTGRESQL;
        struct kinbox_rows_s *rows = NULL;

        if (!idp) {
                /* Pipelined: ON CONFLICT / ON DUPLICATE KEY make a duplicate
                 * a no-op, so nothing needs to be read back. */
                rc = (kinbox_err_t)db->ops->exec(
                    db, pg ? pg_append_sql : my_append_sql, 7, p, tag);
                prepared_free(&pr);
                return rc;
        }
        if (pg) {
                rc = (kinbox_err_t)db->ops->query(db, pg_append_sql, 7, p, tag,
                                                  &rows);
        } else {
                rc = (kinbox_err_t)db->ops->exec(db, my_append_sql, 7, p, tag);
                if (!rc)
                        rc = (kinbox_err_t)db->ops->query(
                            db, "SELECT LAST_INSERT_ID()", 0, NULL, tag,
                            &rows);
        }
        prepared_free(&pr);
        if (rc) {
                kinbox_rows_destroy(rows);
                return rc;
        }
        int64_t id = rows && rows->nrows ? parse_i64(rows->values[0]) : 0;
        kinbox_rows_destroy(rows);
        if (id > 0) {
                *idp = id;
                return KINBOX_OK;
        }
        return find_existing(db, m, tag, idp);
}

KINBOX_API kinbox_err_t
kinbox_outbox_append_pg(struct pg_conn *conn, const kinbox_outbox_msg_t *m,
                        int64_t *idp, char *errstr, size_t errstr_size)
{
        if (!conn) {
                kinbox__errstr(errstr, errstr_size, "no connection");
                return KINBOX_ERR_INVALID;
        }
        prepared_t pr;
        kinbox_err_t rc = prepare(m, &pr, errstr, errstr_size);
        if (rc)
                return rc;
        kinbox__param_t p[7];
        fill_params(m, &pr, p);
        const char *vals[7];
        int lens[7], fmts[7];
        for (int i = 0; i < 7; i++) {
                vals[i] = p[i].v;
                lens[i] = p[i].binary ? (int)p[i].len : 0;
                fmts[i] = p[i].binary;
        }
        PGresult *res = PQexecParams(conn, pg_append_sql, 7, NULL, vals, lens,
                                     fmts, 0);
        prepared_free(&pr);
        ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
        if (st != PGRES_TUPLES_OK) {
                const char *sqlstate =
                    res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
                bool conn_lost = PQstatus(conn) != CONNECTION_OK ||
                                 (sqlstate && !strncmp(sqlstate, "08", 2));
                kinbox__errstr(errstr, errstr_size,
                               "outbox append: SQLSTATE %s: %s",
                               sqlstate ? sqlstate : "?????",
                               res ? PQresultErrorMessage(res)
                                   : PQerrorMessage(conn));
                PQclear(res);
                return conn_lost ? KINBOX_ERR_DB_CONN : KINBOX_ERR_DB;
        }
        int64_t id = PQntuples(res) ? parse_i64(PQgetvalue(res, 0, 0)) : 0;
        PQclear(res);
        if (id > 0) {
                if (idp)
                        *idp = id;
                return KINBOX_OK;
        }
        if (idp) {
                const char *fv[2] = {m->destination, m->idem_key};
                res = PQexecParams(conn, find_id_sql, 2, NULL, fv, NULL, NULL,
                                   0);
                if (res && PQresultStatus(res) == PGRES_TUPLES_OK &&
                    PQntuples(res))
                        *idp = parse_i64(PQgetvalue(res, 0, 0));
                else
                        *idp = 0;
                PQclear(res);
        }
        return KINBOX_ERR_DUPLICATE;
}

/* Append 'text' as a quoted, escaped MySQL literal (or NULL). */
static int
my_literal(kinbox__buf_t *b, MYSQL *conn, const char *s, size_t n, bool bin)
{
        if (!s) {
                kinbox__buf_adds(b, "NULL");
                return b->oom ? -1 : 0;
        }
        if (bin) {
                /* Hex literal: independent of sql_mode and charset. */
                static const char hex[] = "0123456789abcdef";
                kinbox__buf_adds(b, "X'");
                for (size_t i = 0; i < n; i++) {
                        unsigned char c = (unsigned char)s[i];
                        char h[2] = {hex[c >> 4], hex[c & 15]};
                        kinbox__buf_add(b, h, 2);
                }
                kinbox__buf_add(b, "'", 1);
                return b->oom ? -1 : 0;
        }
        char *tmp = malloc(2 * n + 1);
        if (!tmp)
                return -1;
        unsigned long k = mysql_real_escape_string(conn, tmp, s,
                                                   (unsigned long)n);
        kinbox__buf_add(b, "'", 1);
        kinbox__buf_add(b, tmp, k);
        kinbox__buf_add(b, "'", 1);
        free(tmp);
        return b->oom ? -1 : 0;
}

static kinbox_err_t
my_error(MYSQL *conn, const char *what, char *errstr, size_t errstr_size)
{
        unsigned int e = mysql_errno(conn);
        kinbox__errstr(errstr, errstr_size, "outbox append: %s: MySQL %u: %s",
                       what, e, mysql_error(conn));
        if (e == 2006 || e == 2013 || e == 2002 || e == 2003)
                return KINBOX_ERR_DB_CONN;
        return KINBOX_ERR_DB;
}

static kinbox_err_t
my_scalar(MYSQL *conn, const char *sql, size_t len, int64_t *out,
          char *errstr, size_t errstr_size)
{
        if (mysql_real_query(conn, sql, (unsigned long)len))
                return my_error(conn, "query", errstr, errstr_size);
        MYSQL_RES *res = mysql_store_result(conn);
        if (!res)
                return my_error(conn, "result", errstr, errstr_size);
        MYSQL_ROW row = mysql_fetch_row(res);
        *out = row && row[0] ? parse_i64(row[0]) : 0;
        mysql_free_result(res);
        return KINBOX_OK;
}

KINBOX_API kinbox_err_t
kinbox_outbox_append_mysql(struct st_mysql *conn,
                           const kinbox_outbox_msg_t *m, int64_t *idp,
                           char *errstr, size_t errstr_size)
{
        if (!conn) {
                kinbox__errstr(errstr, errstr_size, "no connection");
                return KINBOX_ERR_INVALID;
        }
        prepared_t pr;
        kinbox_err_t rc = prepare(m, &pr, errstr, errstr_size);
        if (rc)
                return rc;
        kinbox__buf_t q;
        kinbox__buf_init(&q);
        kinbox__buf_adds(&q, "INSERT INTO kinbox_outbox (" OUTBOX_COLS
                             ") VALUES (");
        int bad = 0;
        bad |= my_literal(&q, conn, pr.kind, strlen(pr.kind), false);
        kinbox__buf_add(&q, ",", 1);
        bad |= my_literal(&q, conn, m->destination, strlen(m->destination),
                          false);
        kinbox__buf_add(&q, ",", 1);
        bad |= my_literal(&q, conn, m->idem_key, strlen(m->idem_key), false);
        kinbox__buf_add(&q, ",", 1);
        bad |= my_literal(&q, conn, m->aggregate_id,
                          m->aggregate_id ? strlen(m->aggregate_id) : 0, false);
        kinbox__buf_add(&q, ",", 1);
        bad |= my_literal(&q, conn,
                          m->payload ? (const char *)m->payload : NULL,
                          m->payload_size, true);
        kinbox__buf_add(&q, ",", 1);
        bad |= my_literal(&q, conn, pr.has_headers ? pr.headers.p : NULL,
                          pr.headers.len, false);
        kinbox__buf_printf(&q,
                           ",%d) "
                           "ON DUPLICATE KEY UPDATE id = id + "
                           "LAST_INSERT_ID(0)",
                           m->max_attempts);
        prepared_free(&pr);
        if (bad || q.oom) {
                kinbox__buf_free(&q);
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return KINBOX_ERR_NOMEM;
        }
        if (mysql_real_query(conn, q.p, (unsigned long)q.len)) {
                kinbox__buf_free(&q);
                return my_error(conn, "insert", errstr, errstr_size);
        }
        kinbox__buf_free(&q);
        int64_t id = 0;
        static const char lid[] = "SELECT LAST_INSERT_ID()";
        rc = my_scalar(conn, lid, sizeof(lid) - 1, &id, errstr, errstr_size);
        if (rc)
                return rc;
        if (id > 0) {
                if (idp)
                        *idp = id;
                return KINBOX_OK;
        }
        if (idp) {
                kinbox__buf_t s;
                kinbox__buf_init(&s);
                kinbox__buf_adds(&s, "SELECT id FROM kinbox_outbox WHERE "
                                     "destination = ");
                bad = my_literal(&s, conn, m->destination,
                                 strlen(m->destination), false);
                kinbox__buf_adds(&s, " AND idem_key = ");
                bad |= my_literal(&s, conn, m->idem_key, strlen(m->idem_key),
                                  false);
                *idp = 0;
                if (!bad && !s.oom)
                        rc = my_scalar(conn, s.p, s.len, idp, errstr,
                                       errstr_size);
                kinbox__buf_free(&s);
                if (rc)
                        return rc;
        }
        return KINBOX_ERR_DUPLICATE;
}

/* ---------------------------------------------------------------- shared */

kinbox__db_t *
kinbox__outbox_db_open(const kinbox_conf_t *conf, char *errstr,
                       size_t errstr_size)
{
        const char *url = kinbox_conf_get(conf, "database.url");
        if (!url || !*url) {
                kinbox__errstr(errstr, errstr_size,
                               "database.url is required");
                return NULL;
        }
        char *pw = NULL;
        if (kinbox__conf_password(conf, &pw, errstr, errstr_size))
                return NULL;
        kinbox__db_t *db = kinbox__db_new(url, pw, errstr, errstr_size);
        free(pw);
        return db;
}

/*
 * Run an UPDATE and tell how many rows it changed. PostgreSQL: sql must be
 * "WITH u AS (UPDATE ... RETURNING 1) SELECT count(*) FROM u"; MySQL: the
 * plain UPDATE, followed by SELECT ROW_COUNT() on the same connection.
 */
int
kinbox__outbox_affected(kinbox__db_t *db, const char *sql, int n,
                        const kinbox__param_t *p, uint64_t *countp)
{
        struct kinbox_rows_s *rows = NULL;
        int rc;
        if (db->backend == KINBOX_BACKEND_POSTGRESQL) {
                rc = db->ops->query(db, sql, n, p, -1, &rows);
        } else {
                rc = db->ops->exec(db, sql, n, p, -1);
                if (!rc)
                        rc = db->ops->query(db, "SELECT ROW_COUNT()", 0, NULL,
                                            -1, &rows);
        }
        if (!rc && countp) {
                int64_t v = rows && rows->nrows ? parse_i64(rows->values[0])
                                                : 0;
                *countp = v > 0 ? (uint64_t)v : 0;
        }
        kinbox_rows_destroy(rows);
        return rc;
}

/* ---------------------------------------------------------------- admin */

struct kinbox_outbox_admin_s {
        kinbox__db_t *db;
        bool connected;
        char errstr[512];
};

KINBOX_API kinbox_outbox_admin_t *
kinbox_outbox_admin_new(const kinbox_conf_t *conf, char *errstr,
                        size_t errstr_size)
{
        if (!conf) {
                kinbox__errstr(errstr, errstr_size, "no configuration");
                return NULL;
        }
        kinbox_outbox_admin_t *adm = kinbox__calloc(1, sizeof(*adm));
        if (!adm) {
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return NULL;
        }
        adm->db = kinbox__outbox_db_open(conf, errstr, errstr_size);
        if (!adm->db) {
                free(adm);
                return NULL;
        }
        return adm;
}

KINBOX_API void
kinbox_outbox_admin_destroy(kinbox_outbox_admin_t *adm)
{
        if (!adm)
                return;
        kinbox__db_destroy(adm->db);
        free(adm);
}

KINBOX_API const char *
kinbox_outbox_admin_errstr(const kinbox_outbox_admin_t *adm)
{
        return adm ? adm->errstr : "";
}

static kinbox_err_t
admin_fail(kinbox_outbox_admin_t *adm, int rc)
{
        snprintf(adm->errstr, sizeof(adm->errstr), "%s",
                 adm->db->err.msg[0] ? adm->db->err.msg
                                     : kinbox_strerror((kinbox_err_t)rc));
        if (adm->db->in_tx)
                adm->db->ops->rollback(adm->db);
        if (rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_COMMIT_UNKNOWN)
                adm->connected = false;
        return (kinbox_err_t)rc;
}

static kinbox_err_t
admin_connect(kinbox_outbox_admin_t *adm)
{
        adm->errstr[0] = '\0';
        if (adm->connected && adm->db->native)
                return KINBOX_OK;
        int rc = kinbox__db_connect(adm->db);
        if (rc)
                return admin_fail(adm, rc);
        adm->connected = true;
        return KINBOX_OK;
}

static kinbox_err_t
admin_update(kinbox_outbox_admin_t *adm, const char *pg_sql,
             const char *my_sql, int n, const kinbox__param_t *p,
             uint64_t *countp)
{
        kinbox_err_t rc = admin_connect(adm);
        if (rc)
                return rc;
        bool pg = adm->db->backend == KINBOX_BACKEND_POSTGRESQL;
        uint64_t count = 0;
        int r = kinbox__outbox_affected(adm->db, pg ? pg_sql : my_sql, n, p,
                                        &count);
        if (r)
                return admin_fail(adm, r);
        if (countp)
                *countp = count;
        return KINBOX_OK;
}

#define PG_REQUEUE_SET                                                         \
        "UPDATE kinbox_outbox SET status = 'pending', attempts = 0, "          \
        "next_attempt_at = now(), version = version + 1, lease_owner = NULL "
#define MY_REQUEUE_SET                                                         \
        "UPDATE kinbox_outbox SET status = 'pending', attempts = 0, "          \
        "next_attempt_at = CURRENT_TIMESTAMP(6), version = version + 1, "          \
        "lease_owner = NULL "
#define PG_COUNT_NOTIFY                                                        \
        " RETURNING 1) SELECT count(*), pg_notify('kinbox_outbox', '') FROM u"

KINBOX_API kinbox_err_t
kinbox_outbox_requeue(kinbox_outbox_admin_t *adm, int64_t id)
{
        if (!adm || id <= 0)
                return KINBOX_ERR_INVALID;
        char idbuf[24];
        snprintf(idbuf, sizeof(idbuf), "%" PRId64, id);
        kinbox__param_t p[1] = {{idbuf, 0, 0}};
        uint64_t n = 0;
        kinbox_err_t rc = admin_update(
            adm,
            "WITH u AS (" PG_REQUEUE_SET
            "WHERE id = $1::bigint AND status IN ('dead', 'canceled')" PG_COUNT_NOTIFY,
            MY_REQUEUE_SET "WHERE id = $1 AND status IN ('dead', 'canceled')",
            1, p, &n);
        if (!rc && n == 0) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no dead or canceled outbox row with id %" PRId64, id);
                return KINBOX_ERR_NOT_FOUND;
        }
        return rc;
}

KINBOX_API kinbox_err_t
kinbox_outbox_cancel(kinbox_outbox_admin_t *adm, int64_t id)
{
        if (!adm || id <= 0)
                return KINBOX_ERR_INVALID;
        char idbuf[24];
        snprintf(idbuf, sizeof(idbuf), "%" PRId64, id);
        kinbox__param_t p[1] = {{idbuf, 0, 0}};
        uint64_t n = 0;
        kinbox_err_t rc = admin_update(
            adm,
            "WITH u AS (UPDATE kinbox_outbox SET status = 'canceled', "
            "version = version + 1, lease_owner = NULL "
            "WHERE id = $1::bigint AND status = 'pending' RETURNING 1) "
            "SELECT count(*) FROM u",
            "UPDATE kinbox_outbox SET status = 'canceled', "
            "version = version + 1, lease_owner = NULL "
            "WHERE id = $1 AND status = 'pending'",
            1, p, &n);
        if (!rc && n == 0) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no pending outbox row with id %" PRId64, id);
                return KINBOX_ERR_NOT_FOUND;
        }
        return rc;
}

KINBOX_API kinbox_err_t
kinbox_outbox_requeue_destination(kinbox_outbox_admin_t *adm,
                                  const char *destination, uint64_t *countp)
{
        if (!adm)
                return KINBOX_ERR_INVALID;
        kinbox__param_t p[1] = {{destination ? destination : "", 0, 0}};
        return admin_update(
            adm,
            "WITH u AS (" PG_REQUEUE_SET
            "WHERE status = 'dead' AND ($1 = '' OR destination = $1)" PG_COUNT_NOTIFY,
            MY_REQUEUE_SET
            "WHERE status = 'dead' AND ($1 = '' OR destination = $1)",
            1, p, countp);
}

KINBOX_API kinbox_err_t
kinbox_outbox_cancel_destination(kinbox_outbox_admin_t *adm,
                                 const char *destination, uint64_t *countp)
{
        if (!adm || !destination || !*destination)
                return KINBOX_ERR_INVALID;
        kinbox__param_t p[1] = {{destination, 0, 0}};
        return admin_update(
            adm,
            "WITH u AS (UPDATE kinbox_outbox SET status = 'canceled', "
            "version = version + 1, lease_owner = NULL "
            "WHERE status = 'pending' AND destination = $1 RETURNING 1) "
            "SELECT count(*) FROM u",
            "UPDATE kinbox_outbox SET status = 'canceled', "
            "version = version + 1, lease_owner = NULL "
            "WHERE status = 'pending' AND destination = $1",
            1, p, countp);
}

static const char *const status_names[] = {"", "pending", "sent", "dead",
                                           "canceled"};

static kinbox_outbox_status_t
status_of(const char *s)
{
        for (int i = 1; i < 5; i++)
                if (s && !strcmp(s, status_names[i]))
                        return (kinbox_outbox_status_t)i;
        return KINBOX_OUTBOX_ANY;
}

KINBOX_API kinbox_err_t
kinbox_outbox_list(kinbox_outbox_admin_t *adm, kinbox_outbox_status_t status,
                   const char *destination, int64_t after_id, size_t limit,
                   kinbox_outbox_row_fn fn, void *opaque)
{
        if (!adm || !fn || (int)status < 0 || (int)status > 4)
                return KINBOX_ERR_INVALID;
        kinbox_err_t rc = admin_connect(adm);
        if (rc)
                return rc;
        if (limit == 0 || limit > 100000)
                limit = 100000;
        char idbuf[24], limbuf[24];
        snprintf(idbuf, sizeof(idbuf), "%" PRId64, after_id);
        snprintf(limbuf, sizeof(limbuf), "%zu", limit);
        kinbox__param_t p[4] = {{idbuf, 0, 0},
                                {status_names[status], 0, 0},
                                {destination ? destination : "", 0, 0},
                                {limbuf, 0, 0}};
        bool pg = adm->db->backend == KINBOX_BACKEND_POSTGRESQL;
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "SELECT id, status, destination, idem_key, aggregate_id, "
                 "attempts, max_attempts, last_error, created_at, "
                 "next_attempt_at, COALESCE(%s(payload), 0) "
                 "FROM kinbox_outbox WHERE id > %s "
                 "AND ($2 = '' OR status = $2) "
                 "AND ($3 = '' OR destination = $3) ORDER BY id LIMIT %s",
                 pg ? "octet_length" : "LENGTH",
                 pg ? "$1::bigint" : "$1", pg ? "$4::bigint" : limbuf);
        struct kinbox_rows_s *rows = NULL;
        int r = adm->db->ops->query(adm->db, sql, pg ? 4 : 3, p, -1, &rows);
        if (r) {
                kinbox_rows_destroy(rows);
                return admin_fail(adm, r);
        }
        for (size_t i = 0; rows && i < rows->nrows; i++) {
                char **v = rows->values + i * (size_t)rows->ncols;
                kinbox_outbox_row_t row = {
                    .id = parse_i64(v[0]),
                    .status = status_of(v[1]),
                    .destination = v[2],
                    .idem_key = v[3],
                    .aggregate_id = v[4],
                    .attempts = (int)parse_i64(v[5]),
                    .max_attempts = (int)parse_i64(v[6]),
                    .last_error = v[7],
                    .created_at = v[8],
                    .next_attempt_at = v[9],
                    .payload_size = (size_t)parse_i64(v[10]),
                };
                if (fn(&row, opaque))
                        break;
        }
        kinbox_rows_destroy(rows);
        return KINBOX_OK;
}
