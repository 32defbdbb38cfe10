/*
 * txapi.c -- the transaction handed to handlers (kinbox_tx_*): statements tagged with the
 * message that queued them, so every failure is charged to its own message
 */
#include "consumer_int.h"
#include <stdarg.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* the transaction handed to handlers */

kinbox__db_t *
kinbox__tx_db(kinbox_tx_t *tx)
{
        return tx->db;
}

int
kinbox__tx_tag(const kinbox_tx_t *tx)
{
        return tx->tag;
}

const kinbox_msg_t *
kinbox__tx_msg(const kinbox_tx_t *tx)
{
        if (!tx->b || tx->tag < 0 || (tx->tag & KINBOX__TAG_GROUP))
                return NULL;
        size_t i = (size_t)KINBOX__TAG_LOW(tx->tag);
        return i < tx->b->nmsgs ? tx->b->msgs[i] : NULL;
}

kinbox_backend_t
kinbox_tx_backend(const kinbox_tx_t *tx)
{
        return tx->db->backend;
}

const char *
kinbox_tx_consumer(const kinbox_tx_t *tx)
{
        return tx->c ? tx->c->name : tx->consumer;
}

kinbox_tx_t *
kinbox__tx_new(kinbox__db_t *db, const char *consumer)
{
        kinbox_tx_t *tx = kinbox__calloc(1, sizeof(*tx));
        if (!tx)
                return NULL;
        tx->db = db;
        tx->consumer = consumer;
        return tx;
}

void
kinbox__tx_clear_ukeys(kinbox_tx_t *tx)
{
        for (size_t i = 0; i < tx->nukeys; i++)
                free(tx->ukeys[i].key);
        tx->nukeys = 0;
}

void
kinbox__tx_destroy(kinbox_tx_t *tx)
{
        if (!tx)
                return;
        kinbox__tx_clear_ukeys(tx);
        free(tx->ukeys);
        free(tx);
}

void
kinbox__tx_reset(kinbox_tx_t *tx)
{
        tx->tag = 0;
        tx->failed = tx->touched = false;
        tx->reason[0] = '\0';
        kinbox__tx_clear_ukeys(tx);
}

bool
kinbox__tx_failed(const kinbox_tx_t *tx)
{
        return tx->failed;
}

const char *
kinbox__tx_reason(const kinbox_tx_t *tx)
{
        return tx->reason;
}

/* Text parameters as backend parameters; *heap is set when allocated. */
static kinbox__param_t *
tx_params(int n, const char *const *params, kinbox__param_t *stack, int cap,
          bool *heap)
{
        *heap = false;
        if (n < 0 || (n > 0 && !params))
                return NULL;
        kinbox__param_t *ps = stack;
        if (n > cap) {
                ps = kinbox__calloc((size_t)n, sizeof(*ps));
                if (!ps)
                        return NULL;
                *heap = true;
        }
        for (int i = 0; i < n; i++)
                ps[i] = (kinbox__param_t){params[i], 0, 0};
        return ps;
}

/* What the handler sees of a failure: a statement queued by another call
 * (an earlier message) voided the transaction; its own is its own. */
static kinbox_err_t
tx_outcome(kinbox_tx_t *tx, int rc)
{
        if (!rc)
                return KINBOX_OK;
        tx->failed = true;
        /* The statement's own tag: a row of a set-based statement that the
         * server pinned on one message is still this call's statement. */
        int t = tx->db->err.stmt_tag;
        if (t >= 0 && tx->tag >= 0 &&
            (t & ~(KINBOX__TAG_UNIQUE | KINBOX__TAG_CLAIM)) !=
                (tx->tag & ~(KINBOX__TAG_UNIQUE | KINBOX__TAG_CLAIM)))
                return KINBOX_ERR_ABORTED;
        if (t == KINBOX__TAG_MERGED || (t < 0 && t != -1))
                return KINBOX_ERR_ABORTED;
        return (kinbox_err_t)rc;
}

kinbox_err_t
kinbox__tx_issued(kinbox_tx_t *tx, int rc)
{
        tx->touched = true;
        return tx_outcome(tx, rc);
}

/* The tag of each row of a batch handler's set-based statement: its
 * owner's index in the batch, the call's own tag where the owner is not a
 * message of this call. NULL when none is needed (one message's call, no
 * rows) or out of memory. */
static int *
row_tags(kinbox_tx_t *tx, int tag, const kinbox_msg_t *const *owners,
         size_t nrows)
{
        if (!owners || !nrows || tag < 0 || !(tag & KINBOX__TAG_GROUP) ||
            !tx->b)
                return NULL;
        int *t = kinbox__calloc(nrows, sizeof(*t));
        if (!t)
                return NULL;
        for (size_t r = 0; r < nrows; r++) {
                const kinbox_msg_t *m = owners[r];
                t[r] = tag;
                if (m && m->bidx < tx->b->nmsgs && tx->b->msgs[m->bidx] == m &&
                    tx->b->run[m->bidx].state == KINBOX__MSG_RUN)
                        t[r] = (int)m->bidx | (tag & KINBOX__TAG_UNIQUE);
        }
        return t;
}

static kinbox_err_t
tx_exec(kinbox_tx_t *tx, int tag, const char *what, const char *sql,
        int nparams, const char *const *params)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap;
        kinbox__param_t *ps =
            sql ? tx_params(nparams, params, stack, 32, &heap) : NULL;
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "%s: bad arguments (%d parameters)", what, nparams);
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        tx->touched = true;
        int rc = tx->db->ops->exec(tx->db, sql, nparams, ps, tag);
        if (heap)
                free(ps);
        return tx_outcome(tx, rc);
}

static kinbox_err_t
tx_values(kinbox_tx_t *tx, int tag, const char *what, const char *head,
          const char *tuple, const char *tail, int nper,
          const char *const *params, const kinbox_msg_t *const *owners,
          size_t nrows)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap = false;
        kinbox__param_t *ps = NULL;
        if (head && tuple && nper >= 0 && (!nper || params) && nrows &&
            nrows <= (size_t)INT_MAX / (size_t)(nper ? nper : 1))
                ps = tx_params((int)nrows * nper, params, stack, 32, &heap);
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "%s: bad arguments (%zu rows of %d parameters)", what,
                         nrows, nper);
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        /* Owners only where a row can be charged to one message. */
        int *rt = row_tags(tx, tag, owners, nrows);
        kinbox__values_t v = {head,  tuple, tail ? tail : "", nper, ps,
                              nrows, rt};
        tx->touched = true;
        int rc = tx->db->ops->exec_values(tx->db, &v, tag);
        free(rt);
        if (heap)
                free(ps);
        return tx_outcome(tx, rc);
}

kinbox_err_t
kinbox_tx_exec(kinbox_tx_t *tx, const char *sql, int nparams,
               const char *const *params)
{
        return tx_exec(tx, tx->tag, "kinbox_tx_exec", sql, nparams, params);
}

kinbox_err_t
kinbox_tx_exec_claim(kinbox_tx_t *tx, const char *sql, int nparams,
                     const char *const *params)
{
        int tag = tx->tag;
        if (tag >= 0 && !(tag & KINBOX__TAG_GROUP))
                tag |= KINBOX__TAG_CLAIM; /* a batch handler's: no one */
        return tx_exec(tx, tag, "kinbox_tx_exec_claim", sql, nparams, params);
}

/* Note key as the "already applied" unique key of the statement about to
 * be queued; its tag in *tagp. */
static kinbox_err_t
tx_ukey(kinbox_tx_t *tx, const char *key, int *tagp)
{
        int tag = tx->tag | KINBOX__TAG_UNIQUE;
        if (tx->nukeys == tx->capukeys) {
                size_t cap = tx->capukeys ? tx->capukeys * 2 : 16;
                kinbox__ukey_t *u = realloc(tx->ukeys, cap * sizeof(*u));
                if (!u) {
                        tx->failed = true;
                        snprintf(tx->reason, sizeof(tx->reason),
                                 "kinbox_tx_exec_unique: out of memory");
                        return KINBOX_ERR_NOMEM;
                }
                tx->ukeys = u;
                tx->capukeys = cap;
        }
        char *k = NULL;
        if (key && !(k = kinbox__strdup(key))) {
                tx->failed = true;
                return KINBOX_ERR_NOMEM;
        }
        tx->ukeys[tx->nukeys++] = (kinbox__ukey_t){tag, k};
        *tagp = tag;
        return KINBOX_OK;
}

kinbox_err_t
kinbox_tx_exec_unique(kinbox_tx_t *tx, const char *key, const char *sql,
                      int nparams, const char *const *params)
{
        int tag = tx->tag;
        /* Replay and kinbox's own statements: no batch to isolate. */
        if (tag >= 0) {
                kinbox_err_t rc = tx_ukey(tx, key, &tag);
                if (rc)
                        return rc;
        }
        return tx_exec(tx, tag, "kinbox_tx_exec_unique", sql, nparams, params);
}

kinbox_err_t
kinbox_tx_exec_values(kinbox_tx_t *tx, const char *head, const char *tuple,
                      const char *tail, int nparams, const char *const *params,
                      const kinbox_msg_t *const *owners, size_t nrows)
{
        return tx_values(tx, tx->tag, "kinbox_tx_exec_values", head, tuple,
                         tail, nparams, params, owners, nrows);
}

kinbox_err_t
kinbox_tx_exec_values_unique(kinbox_tx_t *tx, const char *key,
                             const char *head, const char *tuple,
                             const char *tail, int nparams,
                             const char *const *params,
                             const kinbox_msg_t *const *owners, size_t nrows)
{
        int tag = tx->tag;
        if (tag >= 0) {
                kinbox_err_t rc = tx_ukey(tx, key, &tag);
                if (rc)
                        return rc;
        }
        return tx_values(tx, tag, "kinbox_tx_exec_values_unique", head, tuple,
                         tail, nparams, params, owners, nrows);
}

static kinbox_err_t
tx_query(kinbox_tx_t *tx, const char *sql, int nparams,
         const char *const *params, const kinbox_msg_t *const *owners,
         const char *const *keys, size_t nrows, kinbox_rows_t **rowsp)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap;
        if (rowsp)
                *rowsp = NULL;
        kinbox__param_t *ps =
            sql ? tx_params(nparams, params, stack, 32, &heap) : NULL;
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "kinbox_tx_query: bad arguments (%d parameters)",
                         nparams);
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        tx->touched = true;
        tx->waits++;
        /* Owners only where a row can be charged to one message; the
         * keys only ever make a hint (db->err.suspect). */
        int *rt = keys ? row_tags(tx, tx->tag, owners, nrows) : NULL;
        int rc = kinbox__db_query_hinted(tx->db, sql, nparams, ps, tx->tag,
                                         rt ? keys : NULL, rt, nrows, rowsp);
        free(rt);
        if (heap)
                free(ps);
        return tx_outcome(tx, rc);
}

kinbox_err_t
kinbox_tx_query(kinbox_tx_t *tx, const char *sql, int nparams,
                const char *const *params, kinbox_rows_t **rowsp)
{
        return tx_query(tx, sql, nparams, params, NULL, NULL, 0, rowsp);
}

kinbox_err_t
kinbox_tx_query_owned(kinbox_tx_t *tx, const char *sql, int nparams,
                      const char *const *params,
                      const kinbox_msg_t *const *owners,
                      const char *const *keys, size_t nrows,
                      kinbox_rows_t **rowsp)
{
        return tx_query(tx, sql, nparams, params, owners, keys, nrows, rowsp);
}

kinbox_err_t
kinbox_tx_exec_claims(kinbox_tx_t *tx, const char *sql, int nparams,
                      const char *const *params,
                      const kinbox_msg_t *const *owners,
                      const char *const *keys, size_t nrows)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap = false;
        kinbox__param_t *ps = NULL;
        if (sql && keys && owners && nrows)
                ps = tx_params(nparams, params, stack, 32, &heap);
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "kinbox_tx_exec_claims: bad arguments (%d "
                         "parameters, %zu rows%s)",
                         nparams, nrows,
                         keys && owners ? "" : ", no keys or owners");
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        /* A batch handler's rows go to their owners; every row of a
         * one-message call is that message's. */
        int tag = tx->tag;
        int *rt = NULL;
        if (tag >= 0 && (tag & KINBOX__TAG_GROUP))
                rt = row_tags(tx, tag, owners, nrows);
        else if (tag >= 0 && (rt = kinbox__calloc(nrows, sizeof(*rt))))
                for (size_t r = 0; r < nrows; r++)
                        rt[r] = tag;
        if (tag >= 0 && !rt) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "kinbox_tx_exec_claims: out of memory");
                tx->failed = true;
                if (heap)
                        free(ps);
                return KINBOX_ERR_NOMEM;
        }
        tx->touched = true;
        bool waited = false;
        int rc = kinbox__db_exec_claims(tx->db, sql, nparams, ps, tag, keys,
                                        rt, nrows, &waited);
        if (waited)
                tx->waits++;
        free(rt);
        if (heap)
                free(ps);
        return tx_outcome(tx, rc);
}

/* The handler asked for the native connection (got: it is this
 * backend's): the transaction is then touched, and failed when the
 * connection is down. */
static void
tx_native(kinbox_tx_t *tx, bool got, bool down)
{
        tx->touched = tx->touched || got || down;
        tx->waits++; /* the pipeline was flushed for it */
        tx->failed = tx->failed || down;
}

struct pg_conn *
kinbox_tx_pgconn(kinbox_tx_t *tx)
{
        bool down = false;
        struct pg_conn *n = kinbox__db_pgconn(tx->db, &down);
        tx_native(tx, n != NULL, down);
        return n;
}

struct st_mysql *
kinbox_tx_mysql(kinbox_tx_t *tx)
{
        bool down = false;
        struct st_mysql *n = kinbox__db_mysql(tx->db, &down);
        tx_native(tx, n != NULL, down);
        return n;
}

void
kinbox_tx_set_error(kinbox_tx_t *tx, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tx->reason, sizeof(tx->reason), fmt, ap);
        va_end(ap);
}

void
kinbox_tx_set_msg_error(kinbox_tx_t *tx, const kinbox_msg_t *msg,
                        const char *fmt, ...)
{
        KINBOX__UNUSED(tx);
        char b[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b, sizeof(b), fmt, ap);
        va_end(ap);
        kinbox__msg_set_reason((kinbox_msg_t *)msg, b);
}

const char *
kinbox_tx_errstr(const kinbox_tx_t *tx)
{
        return tx->db->err.code ? tx->db->err.msg : "";
}
