/*
 * outbox.c -- the outbox writer (append in a kinbox transaction, or on
 * the caller's own PGconn / MYSQL, whose statements live with their
 * backend's in db/pg_outbox.c and db/mysql_outbox.c). A new row wakes the
 * relays of this process through wake.c. The relay lives in relay*.c, the
 * operator calls (requeue, cancel, list) in outbox_admin.c. No dialect SQL
 * here: every statement comes from db->ops->outbox.
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

#include "db.h"
#include "hdrcodec.h"
#include "internal.h"
#include "outbox_int.h"
#include "tx.h"
#include "wake.h"

#define OB(db) ((db)->ops->outbox)

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

kinbox_err_t
kinbox__outbox_prepare(const kinbox_outbox_msg_t *m,
                       kinbox__outbox_prepared_t *pr, char *errstr,
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

void
kinbox__outbox_prepared_free(kinbox__outbox_prepared_t *pr)
{
        kinbox__buf_free(&pr->headers);
}

void
kinbox__outbox_params(const kinbox_outbox_msg_t *m,
                      const kinbox__outbox_prepared_t *pr,
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

/* ---------------------------------------------------------------- append */

static kinbox_err_t
find_existing(kinbox__db_t *db, const kinbox_outbox_msg_t *m, int tag,
              int64_t *idp)
{
        kinbox__param_t p[2] = {{m->destination, 0, 0}, {m->idem_key, 0, 0}};
        struct kinbox_rows_s *rows = NULL;
        int rc =
            db->ops->query(db, KINBOX__OUTBOX_FIND_ID_SQL, 2, p, tag, &rows);
        if (rc)
                return (kinbox_err_t)rc;
        *idp = rows && rows->nrows ? kinbox__i64_or(rows->values[0], 0) : 0;
        kinbox_rows_destroy(rows);
        return KINBOX_ERR_DUPLICATE;
}

kinbox_err_t
kinbox_outbox_append(kinbox_tx_t *tx, const kinbox_outbox_msg_t *m,
                     int64_t *idp)
{
        if (!tx)
                return KINBOX_ERR_INVALID;
        kinbox__db_t *db = kinbox__tx_db(tx);
        int tag = kinbox__tx_tag(tx);
        kinbox__outbox_prepared_t pr;
        char err[256];
        kinbox__outbox_trace_t ot;
        m = kinbox__outbox_trace_begin(&ot, m, kinbox__tx_msg(tx));
        kinbox_err_t rc = kinbox__outbox_prepare(m, &pr, err, sizeof(err));
        if (rc) {
                kinbox__outbox_trace_end(&ot, rc, 0);
                kinbox__db_seterr(db, rc, "", 0, tag, "%s", err);
                return rc;
        }
        kinbox__param_t p[7];
        kinbox__outbox_params(m, &pr, p);
        int64_t id = 0;
        if (!idp) {
                /* Pipelined: ON CONFLICT / ON DUPLICATE KEY make a duplicate
                 * a no-op, so nothing needs to be read back. */
                rc =
                    (kinbox_err_t)db->ops->exec(db, OB(db)->append, 7, p, tag);
        } else {
                rc = (kinbox_err_t)OB(db)->append_id(db, p, tag, &id);
        }
        kinbox__outbox_prepared_free(&pr);
        kinbox__outbox_trace_end(&ot, rc, id);
        /* The row is the call's effect: a REJECT or RETRY undoes it. */
        if (rc != KINBOX_ERR_DUPLICATE)
                rc = kinbox__tx_issued(tx, rc);
        if (rc)
                return rc;
        /* Not committed yet: local relays poll closely for a while. */
        kinbox__wake_poke();
        if (!idp)
                return KINBOX_OK;
        if (id > 0) {
                *idp = id;
                return KINBOX_OK;
        }
        return find_existing(db, m, tag, idp);
}

/* ------------------------------------- on the caller's own connection */

/* A backend's append of the bound parameters on the caller's connection
 * (db/pg_outbox.c, db/mysql_outbox.c). */
typedef kinbox_err_t (*native_append_fn)(void *conn, const kinbox__param_t *p,
                                         int64_t *idp, char *errstr,
                                         size_t errstr_size);

static kinbox_err_t
pg_append(void *conn, const kinbox__param_t *p, int64_t *idp, char *errstr,
          size_t errstr_size)
{
        return kinbox__pg_outbox_append(conn, p, idp, errstr, errstr_size);
}

static kinbox_err_t
my_append(void *conn, const kinbox__param_t *p, int64_t *idp, char *errstr,
          size_t errstr_size)
{
        return kinbox__mysql_outbox_append(conn, p, idp, errstr, errstr_size);
}

/* Validate m, bind it, let the backend append it, and wake local relays
 * when a row was written; the row's trace context and append span as in
 * a handler's append (without a handler's message). */
static kinbox_err_t
native_append(void *conn, native_append_fn append,
              const kinbox_outbox_msg_t *m, int64_t *idp, char *errstr,
              size_t errstr_size)
{
        if (!conn) {
                kinbox__errstr(errstr, errstr_size, "no connection");
                return KINBOX_ERR_INVALID;
        }
        kinbox__outbox_trace_t ot;
        m = kinbox__outbox_trace_begin(&ot, m, NULL);
        kinbox__outbox_prepared_t pr;
        kinbox_err_t rc = kinbox__outbox_prepare(m, &pr, errstr, errstr_size);
        if (!rc) {
                kinbox__param_t p[7];
                kinbox__outbox_params(m, &pr, p);
                rc = append(conn, p, idp, errstr, errstr_size);
                kinbox__outbox_prepared_free(&pr);
                if (rc == KINBOX_OK)
                        kinbox__wake_poke();
        }
        kinbox__outbox_trace_end(&ot, rc, idp && !rc ? *idp : 0);
        return rc;
}

kinbox_err_t
kinbox_outbox_append_pg(struct pg_conn *conn, const kinbox_outbox_msg_t *m,
                        int64_t *idp, char *errstr, size_t errstr_size)
{
        return native_append(conn, pg_append, m, idp, errstr, errstr_size);
}

kinbox_err_t
kinbox_outbox_append_mysql(struct st_mysql *conn, const kinbox_outbox_msg_t *m,
                           int64_t *idp, char *errstr, size_t errstr_size)
{
        return native_append(conn, my_append, m, idp, errstr, errstr_size);
}

/* ---------------------------------------------------------------- shared */

/* Run an UPDATE and tell how many rows it changed (prune.c). */
int
kinbox__outbox_affected(kinbox__db_t *db, const char *sql, int n,
                        const kinbox__param_t *p, uint64_t *countp)
{
        return OB(db)->affected(db, sql, n, p, countp);
}
