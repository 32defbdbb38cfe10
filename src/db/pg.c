/*
 * pg.c -- the PostgreSQL backend (libpq).
 *
 * The connection lives in pipeline mode. Statements queued by exec() are
 * sent at once and their results are read only when somebody needs them:
 * query() (a row is wanted), flush(), commit(). Each queued command is
 * remembered in a FIFO with the tag of the message that queued it, so the
 * first failure found while reading results is pinned on its message.
 * Statements are prepared once per connection (a small cache keyed by SQL
 * text) because parse/plan is most of the server's cost per statement.
 */
#include "../db.h"
#include "../internal.h"
#include "opsql.h"
#include "pg_int.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
notice_cb(void *arg, const char *message)
{
        kinbox__db_t *db = arg;
        if (db->log)
                db->log(db->log_ctx, KINBOX_LOG_NOTICE, "postgresql: %s",
                        message);
}

static void
reset_state(pg_t *pg)
{
        for (size_t i = 0; i < pg->qlen; i++)
                kinbox__claims_free(pg->q[pg->qhead + i].claims);
        pg->qhead = pg->qlen = 0;
        pg->pipeline = false;
        if (pg->want) {
                PQclear(pg->want);
                pg->want = NULL;
        }
        for (size_t i = 0; i < pg->nstmts; i++)
                free(pg->stmts[i].sql);
        pg->nstmts = 0;
}

static void
pg_disconnect(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        if (!pg)
                return;
        if (pg->conn)
                PQfinish(pg->conn);
        pg->conn = NULL;
        db->native = NULL;
        db->in_tx = false;
        reset_state(pg);
}

static void
pg_release(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        if (!pg)
                return;
        free(pg->q);
        free(pg->stmts);
        free(pg);
        db->impl = NULL;
}

static int
pg_connect(kinbox__db_t *db)
{
        if (!db->impl && !(db->impl = kinbox__calloc(1, sizeof(pg_t))))
                return KINBOX_ERR_NOMEM;
        pg_disconnect(db);
        pg_t *pg = PG(db);
        const char *keys[8], *vals[8];
        int n = 0;
        keys[n] = "dbname";
        vals[n++] = db->url;
        if (db->password) {
                keys[n] = "password";
                vals[n++] = db->password;
        }
        /* Notice a dead server within seconds rather than minutes. */
        keys[n] = "connect_timeout";
        vals[n++] = "10";
        keys[n] = "keepalives_idle";
        vals[n++] = "10";
        keys[n] = "keepalives_interval";
        vals[n++] = "3";
        keys[n] = "keepalives_count";
        vals[n++] = "3";
        keys[n] = "application_name";
        vals[n++] = "kinbox";
        keys[n] = NULL;
        vals[n] = NULL;
        pg->conn = PQconnectdbParams(keys, vals, 1);
        if (!pg->conn || PQstatus(pg->conn) != CONNECTION_OK) {
                char m[400];
                snprintf(m, sizeof(m), "%s",
                         pg->conn ? PQerrorMessage(pg->conn)
                                  : "out of memory");
                if (pg->conn)
                        PQfinish(pg->conn);
                pg->conn = NULL;
                kinbox__db_seterr(db, KINBOX_ERR_DB_CONN, "08001", 0, -1,
                                  "cannot connect to PostgreSQL: %s", m);
                return KINBOX_ERR_DB_CONN;
        }
        PQsetNoticeProcessor(pg->conn, notice_cb, db);
        db->native = pg->conn;
        return KINBOX_OK;
}

static int
qpush(kinbox__db_t *db, enum pkind kind, int tag, int stmt)
{
        pg_t *pg = PG(db);
        if (pg->qhead + pg->qlen == pg->qcap) {
                if (pg->qhead) {
                        memmove(pg->q, pg->q + pg->qhead,
                                pg->qlen * sizeof(pend_t));
                        pg->qhead = 0;
                } else {
                        size_t cap = pg->qcap ? pg->qcap * 2 : 64;
                        pend_t *q = realloc(pg->q, cap * sizeof(pend_t));
                        if (!q)
                                return KINBOX_ERR_NOMEM;
                        pg->q = q;
                        pg->qcap = cap;
                }
        }
        pg->q[pg->qhead + pg->qlen++] = (pend_t){kind, tag, stmt, NULL, false};
        return KINBOX_OK;
}

static int
ensure_pipeline(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        if (!pg || !pg->conn)
                return kinbox__pg_fail_conn(db, -1, "send");
        if (!pg->pipeline) {
                if (!PQenterPipelineMode(pg->conn))
                        return kinbox__pg_fail_conn(db, -1, "pipeline setup");
                pg->pipeline = true;
        }
        return KINBOX_OK;
}

/* An exec_claims() statement's result: the keys it returned (column 0)
 * resolve its owners; no column at all is the handler's mistake. */
static void
take_claims(kinbox__db_t *db, PGresult *res, const kinbox__claims_t *c,
            int tag, int *rc)
{
        int nr = PQntuples(res);
        if (PQnfields(res) < 1) {
                if (*rc == KINBOX_OK)
                        *rc = kinbox__claims_no_rows(db, tag);
                return;
        }
        const char *stack[256];
        const char **got =
            nr <= 256 ? stack : malloc((size_t)nr * sizeof(*got));
        if (!got)
                return; /* counted as processed, not as duplicates */
        for (int i = 0; i < nr; i++)
                got[i] = PQgetisnull(res, i, 0) ? NULL : PQgetvalue(res, i, 0);
        kinbox__claims_resolve(db, c, got, (size_t)nr);
        if (got != stack)
                free(got);
}

/* The results of the oldest queued command: 0 taken, -1 the connection
 * broke. The first failure is recorded in db->err and in *rc; later
 * commands report PIPELINE_ABORTED and are skipped. */
static int
take_one(kinbox__db_t *db, int *rc, bool *commit_sent)
{
        pg_t *pg = PG(db);
        pend_t p = pg->q[pg->qhead];
        if (p.kind == K_COMMIT)
                *commit_sent = true;
        PGresult *res = PQgetResult(pg->conn);
        if (!res)
                return -1;
        ExecStatusType st = PQresultStatus(res);
        if (p.kind == K_SYNC) {
                PQclear(res);
                if (st != PGRES_PIPELINE_SYNC)
                        return -1;
                pg->qhead++;
                pg->qlen--;
                return 0;
        }
        bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
        /* The entry's claims go with it, whatever the outcome. */
        pg->q[pg->qhead].claims = NULL;
        if (p.gone) {
                kinbox__claims_free(p.claims);
                p.claims = NULL;
                p.tag = -1;
                p.kind = p.kind == K_PREPARE ? K_PREPARE : K_INTERNAL;
                if (!ok)
                        st = PGRES_PIPELINE_ABORTED; /* not a failure */
        }
        if (!ok && st != PGRES_PIPELINE_ABORTED && *rc == KINBOX_OK) {
                *rc = kinbox__pg_fail_res(db, res, p.tag);
                if (p.stmt >= 0 && (size_t)p.stmt < pg->nstmts)
                        kinbox__db_err_stmt(db, pg->stmts[p.stmt].sql,
                                            strlen(pg->stmts[p.stmt].sql));
                /* A query with owners: at most one is queued (a query is
                 * read at once), so the failing K_QUERY is that one. */
                const char *row = kinbox__pg_failing_row(res);
                if (p.kind == K_QUERY && db->attr && db->attr->hint_n && row)
                        db->err.suspect = kinbox__db_row_suspect(db, row);
                else if (p.claims && row)
                        db->err.suspect =
                            kinbox__claims_suspect(p.claims, row);
        }
        if (ok && p.claims)
                take_claims(db, res, p.claims, p.tag, rc);
        kinbox__claims_free(p.claims);
        if (!ok && p.kind == K_PREPARE)
                pg->stmts[p.stmt].prepared = false;
        if (ok && p.kind == K_EXEC && p.tag >= 0 &&
            (p.tag & KINBOX__TAG_CLAIM) && !strcmp(PQcmdTuples(res), "0"))
                kinbox__db_note_none(db, p.tag);
        if (ok && p.kind == K_QUERY && *rc == KINBOX_OK) {
                if (pg->want)
                        PQclear(pg->want);
                pg->want = res;
        } else {
                PQclear(res);
        }
        /* Each non-sync command ends with a NULL result. */
        res = PQgetResult(pg->conn);
        if (res) {
                PQclear(res);
                return -1;
        }
        pg->qhead++;
        pg->qlen--;
        return 0;
}

/* The connection broke while results were read. */
static int
drain_lost(kinbox__db_t *db, int rc, bool commit_sent)
{
        pg_t *pg = PG(db);
        if (rc == KINBOX_OK || rc == KINBOX_ERR_DB_CONN) {
                if (commit_sent ||
                    (pg->qlen && pg->q[pg->qhead].kind == K_COMMIT))
                        kinbox__db_seterr(db, KINBOX_ERR_COMMIT_UNKNOWN,
                                          "08006", 0, -1,
                                          "PostgreSQL connection lost during "
                                          "COMMIT: outcome unknown");
                else
                        kinbox__pg_fail_conn(
                            db, pg->qlen ? pg->q[pg->qhead].tag : -1,
                            "a batch");
                rc = db->err.code;
        }
        pg_disconnect(db);
        return rc;
}

/*
 * Read results for every queued command. The first failure is recorded in
 * db->err and returned; later commands report PIPELINE_ABORTED and are
 * skipped. A K_QUERY result is kept in pg->want.
 */
static int
drain(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        int rc = KINBOX_OK;
        bool commit_sent = false;
        if (PQflush(pg->conn) < 0)
                return drain_lost(db, rc, commit_sent);
        while (pg->qlen)
                if (take_one(db, &rc, &commit_sent))
                        return drain_lost(db, rc, commit_sent);
        pg->qhead = 0;
        if (rc == KINBOX_ERR_DB_CONN) {
                pg_disconnect(db);
                return rc;
        }
        return rc;
}

/*
 * Take the results that have already arrived, then wait until at most
 * ahead commands are still unanswered: a statement that failed is known
 * before many more are built and queued behind it (the server would skip
 * them, and they would all be built again after the rollback). The server
 * is asked to send what it has (a Flush message, no Sync: the pipeline
 * segment goes on).
 */
static int
pg_peek(kinbox__db_t *db, size_t ahead)
{
        pg_t *pg = PG(db);
        if (!pg || !pg->conn || !pg->pipeline || !pg->qlen)
                return KINBOX_OK;
        int rc = KINBOX_OK;
        bool commit_sent = false;
        if (!PQsendFlushRequest(pg->conn) || PQflush(pg->conn) < 0 ||
            !PQconsumeInput(pg->conn))
                return drain_lost(db, rc, commit_sent);
        while (pg->qlen && (pg->qlen > ahead || !PQisBusy(pg->conn)))
                if (take_one(db, &rc, &commit_sent))
                        return drain_lost(db, rc, commit_sent);
        if (!pg->qlen)
                pg->qhead = 0;
        return rc;
}

static int
send_plain(kinbox__db_t *db, const char *sql, enum pkind kind)
{
        int rc = ensure_pipeline(db);
        if (rc)
                return rc;
        if (!PQsendQueryParams(PG(db)->conn, sql, 0, NULL, NULL, NULL, NULL,
                               0))
                return kinbox__pg_fail_conn(db, -1, sql);
        return qpush(db, kind, -1, -1);
}

static int
pg_begin(kinbox__db_t *db)
{
        int rc =
            send_plain(db, "BEGIN ISOLATION LEVEL READ COMMITTED", K_INTERNAL);
        if (!rc)
                db->in_tx = true;
        return rc;
}

static int
stmt_find(const pg_t *pg, const char *sql)
{
        for (size_t i = 0; i < pg->nstmts; i++)
                if (!strcmp(pg->stmts[i].sql, sql))
                        return (int)i;
        return -1;
}

/* The cache index of sql, its Parse queued first when needed: a Parse
 * that fails (an undefined table, a syntax error) is charged to tag, the
 * statement that needed it. */
static int
stmt_lookup(kinbox__db_t *db, const char *sql, int n, int tag)
{
        pg_t *pg = PG(db);
        for (size_t i = 0; i < pg->nstmts; i++)
                if (!strcmp(pg->stmts[i].sql, sql)) {
                        if (!pg->stmts[i].prepared)
                                goto prepare_i;
                        return (int)i;
                prepare_i:
                        snprintf(pg->stmts[i].name, sizeof(pg->stmts[i].name),
                                 "kb%lu", pg->next_name++);
                        if (!PQsendPrepare(pg->conn, pg->stmts[i].name, sql, n,
                                           NULL))
                                return -1;
                        pg->stmts[i].prepared = true;
                        if (qpush(db, K_PREPARE, tag, (int)i))
                                return -1;
                        return (int)i;
                }
        if (pg->nstmts == pg->capstmts) {
                size_t cap = pg->capstmts ? pg->capstmts * 2 : 16;
                stmt_t *s = realloc(pg->stmts, cap * sizeof(stmt_t));
                if (!s)
                        return -1;
                pg->stmts = s;
                pg->capstmts = cap;
        }
        stmt_t *s = &pg->stmts[pg->nstmts];
        if (!(s->sql = kinbox__strdup(sql)))
                return -1;
        s->prepared = false;
        pg->nstmts++;
        return stmt_lookup(db, sql, n, tag);
}

static int
send_stmt(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
          int tag, enum pkind kind)
{
        int rc = ensure_pipeline(db);
        if (rc)
                return rc;
        pg_t *pg = PG(db);
        if (n < 0 || n > 65535) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, tag,
                                  "bad parameter count %d", n);
                return KINBOX_ERR_INVALID;
        }
        /* Past the cache size (handlers that build SQL text per batch),
         * statements go unprepared rather than pile up on the server. */
        int si = -2;
        if (pg->nstmts < STMT_CACHE_MAX || stmt_find(pg, sql) >= 0)
                si = stmt_lookup(db, sql, n, tag);
        if (si == -1)
                return kinbox__pg_fail_conn(db, tag, "prepare");
        const char *vs[64];
        int ls[64], fs[64];
        const char **vals = vs;
        int *lens = ls, *fmts = fs;
        if (n > 64) {
                vals = calloc((size_t)n, sizeof(*vals));
                lens = calloc((size_t)n, sizeof(*lens));
                fmts = calloc((size_t)n, sizeof(*fmts));
                if (!vals || !lens || !fmts) {
                        rc = KINBOX_ERR_NOMEM;
                        goto out;
                }
        }
        for (int i = 0; i < n; i++) {
                vals[i] = p[i].v;
                lens[i] = p[i].binary ? (int)p[i].len : 0;
                fmts[i] = p[i].binary ? 1 : 0;
        }
        int sent = si >= 0 ? PQsendQueryPrepared(pg->conn, pg->stmts[si].name,
                                                 n, vals, lens, fmts, 0)
                           : PQsendQueryParams(pg->conn, sql, n, NULL, vals,
                                               lens, fmts, 0);
        if (!sent) {
                rc = kinbox__pg_fail_conn(db, tag, "send");
                goto out;
        }
        rc = qpush(db, kind, tag, si >= 0 ? si : -1);
out:
        if (vals != vs) {
                free(vals);
                free(lens);
                free(fmts);
        }
        return rc;
}

static int
pg_flush(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        if (!pg || !pg->conn)
                return kinbox__pg_fail_conn(db, -1, "flush");
        if (!pg->qlen)
                return KINBOX_OK;
        if (!PQsendFlushRequest(pg->conn))
                return kinbox__pg_fail_conn(db, -1, "flush");
        return drain(db);
}

static int
pg_exec(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
        int tag)
{
        int rc = send_stmt(db, sql, n, p, tag, K_EXEC);
        if (rc)
                return rc;
        if (PG(db)->qlen >= FLUSH_EVERY)
                return pg_flush(db);
        return KINBOX_OK;
}

static int
pg_exec_claims(kinbox__db_t *db, const char *sql, int n,
               const kinbox__param_t *p, int tag, kinbox__claims_t *c)
{
        int rc = send_stmt(db, sql, n, p, tag, K_EXEC);
        if (rc) {
                kinbox__claims_free(c);
                return rc;
        }
        pg_t *pg = PG(db);
        pg->q[pg->qhead + pg->qlen - 1].claims = c;
        if (pg->qlen >= FLUSH_EVERY)
                return pg_flush(db);
        return KINBOX_OK;
}

static int
to_rows(PGresult *res, struct kinbox_rows_s **out)
{
        int nr = PQntuples(res), nc = PQnfields(res);
        struct kinbox_rows_s *r = kinbox__rows_new((size_t)nr, nc);
        if (!r)
                return KINBOX_ERR_NOMEM;
        for (int c = 0; c < nc; c++)
                if (kinbox__rows_set_name(r, c, PQfname(res, c)))
                        goto oom;
        for (int i = 0; i < nr; i++)
                for (int c = 0; c < nc; c++) {
                        if (PQgetisnull(res, i, c))
                                continue;
                        const char *v = PQgetvalue(res, i, c);
                        size_t len = (size_t)PQgetlength(res, i, c);
                        if (PQftype(res, c) == 17 /* bytea */) {
                                size_t bl;
                                unsigned char *b = PQunescapeBytea(
                                    (const unsigned char *)v, &bl);
                                if (!b)
                                        goto oom;
                                int e = kinbox__rows_set(r, (size_t)i, c,
                                                         (const char *)b, bl);
                                PQfreemem(b);
                                if (e)
                                        goto oom;
                        } else if (kinbox__rows_set(r, (size_t)i, c, v, len)) {
                                goto oom;
                        }
                }
        *out = r;
        return KINBOX_OK;
oom:
        kinbox_rows_destroy(r);
        return KINBOX_ERR_NOMEM;
}

static int
pg_query(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
         int tag, struct kinbox_rows_s **out)
{
        pg_t *pg = PG(db);
        if (out)
                *out = NULL;
        int rc = send_stmt(db, sql, n, p, tag, K_QUERY);
        if (rc)
                return rc;
        /* Outside a transaction every query is its own implicit one. */
        if (!db->in_tx) {
                if (!PQpipelineSync(pg->conn))
                        return kinbox__pg_fail_conn(db, tag, "sync");
                rc = qpush(db, K_SYNC, -1, -1);
                if (!rc)
                        rc = drain(db);
        } else {
                rc = pg_flush(db);
        }
        if (!rc && out && pg->want)
                rc = to_rows(pg->want, out);
        if (pg->want) {
                PQclear(pg->want);
                pg->want = NULL;
        }
        return rc;
}

static int
pg_commit(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        /* A claim's result may fail it (no column: the handler's mistake,
         * found by the client, which the server would commit). */
        int rc = KINBOX_OK;
        for (size_t i = 0; i < pg->qlen && !rc; i++)
                if (pg->q[pg->qhead + i].claims)
                        rc = pg_flush(db);
        if (rc) {
                if (pg->conn)
                        db->ops->rollback(db);
                return rc;
        }
        rc = send_plain(db, "COMMIT", K_COMMIT);
        if (rc)
                return rc == KINBOX_ERR_DB_CONN && db->in_tx
                           ? KINBOX_ERR_DB_CONN
                           : rc;
        if (!PQpipelineSync(pg->conn))
                return kinbox__pg_fail_conn(db, -1, "COMMIT");
        if ((rc = qpush(db, K_SYNC, -1, -1)))
                return rc;
        rc = drain(db);
        if (rc == KINBOX_OK) {
                db->in_tx = false;
                return KINBOX_OK;
        }
        /* An earlier failure left the transaction aborted: clear it. */
        if (pg->conn)
                db->ops->rollback(db);
        return rc;
}

static void
pg_rollback(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        bool open = db->in_tx;
        db->in_tx = false;
        if (!pg || !pg->conn)
                return;
        /* Nothing queued and no transaction: a second rollback (after a
         * failed COMMIT already cleaned up) must not send another one. */
        if (!open && !pg->qlen)
                return;
        kinbox__dberr_t keep = db->err;
        /* End whatever segment is open, then roll back in a fresh one. */
        if (pg->pipeline) {
                if (!PQpipelineSync(pg->conn) || qpush(db, K_SYNC, -1, -1) ||
                    (drain(db) == KINBOX_ERR_DB_CONN))
                        goto out;
        }
        if (send_plain(db, "ROLLBACK", K_INTERNAL) == KINBOX_OK &&
            PQpipelineSync(pg->conn) && !qpush(db, K_SYNC, -1, -1))
                (void)drain(db);
out:
        db->err = keep;
}

static int
pg_settle(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        if (!pg || !pg->conn)
                return kinbox__pg_fail_conn(db, -1, "sync");
        if (!pg->pipeline)
                return KINBOX_OK;
        if (!PQpipelineSync(pg->conn))
                return kinbox__pg_fail_conn(db, -1, "sync");
        int rc = qpush(db, K_SYNC, -1, -1);
        return rc ? rc : drain(db);
}

static int
pg_savepoint(kinbox__db_t *db, const char *name)
{
        char sql[96];
        snprintf(sql, sizeof(sql), "SAVEPOINT %s", name);
        return send_plain(db, sql, K_INTERNAL);
}

/*
 * In pipeline mode a failed statement makes the server skip everything up
 * to the next Sync, and the transaction stays aborted after it: end the
 * segment with a Sync (inside a transaction block that commits nothing),
 * then queue ROLLBACK TO SAVEPOINT, which an aborted transaction accepts.
 * Nothing is waited for: what is queued before the Sync is rolled back
 * whatever it does, so its results are marked to mean nothing (no
 * failure, no claim) and are skipped whenever they are read.
 */
static int
pg_rollback_to(kinbox__db_t *db, const char *name)
{
        pg_t *pg = PG(db);
        if (!pg || !pg->conn)
                return kinbox__pg_fail_conn(db, -1, "rollback to savepoint");
        if (pg->pipeline) {
                for (size_t i = 0; i < pg->qlen; i++)
                        pg->q[pg->qhead + i].gone = true;
                if (!PQpipelineSync(pg->conn))
                        return kinbox__pg_fail_conn(db, -1, "sync");
                int rc = qpush(db, K_SYNC, -1, -1);
                if (rc)
                        return rc;
        }
        char sql[96];
        snprintf(sql, sizeof(sql), "ROLLBACK TO SAVEPOINT %s", name);
        int rc = send_plain(db, sql, K_INTERNAL);
        if (!rc)
                db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        return rc;
}

static int
leave_pipeline(kinbox__db_t *db)
{
        pg_t *pg = PG(db);
        if (!pg || !pg->conn)
                return kinbox__pg_fail_conn(db, -1, "native access");
        int rc = pg_flush(db);
        if (rc)
                return rc;
        if (pg->pipeline) {
                if (!PQexitPipelineMode(pg->conn))
                        return kinbox__pg_fail_conn(db, -1,
                                                    "leaving pipeline mode");
                pg->pipeline = false;
        }
        return KINBOX_OK;
}

static void *
pg_native(kinbox__db_t *db)
{
        if (leave_pipeline(db))
                return NULL;
        return PG(db)->conn;
}

static int
pg_script(kinbox__db_t *db, const char *sql)
{
        int rc = leave_pipeline(db);
        if (rc)
                return rc;
        pg_t *pg = PG(db);
        PGresult *res = PQexec(pg->conn, sql);
        if (!res)
                return kinbox__pg_fail_conn(db, -1, "script");
        ExecStatusType st = PQresultStatus(res);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
                rc = kinbox__pg_fail_res(db, res, -1);
        PQclear(res);
        if (rc == KINBOX_ERR_DB_CONN)
                pg_disconnect(db);
        return rc;
}

/* Append s as a quoted element of a PostgreSQL array literal. */
static void
arr_elem(kinbox__buf_t *b, const char *s, bool first)
{
        if (!first)
                kinbox__buf_add(b, ",", 1);
        kinbox__buf_add(b, "\"", 1);
        for (; *s; s++) {
                if (*s == '"' || *s == '\\')
                        kinbox__buf_add(b, "\\", 1);
                kinbox__buf_add(b, s, 1);
        }
        kinbox__buf_add(b, "\"", 1);
}

/* The inbox insert's arrays, one element per put. */
typedef struct inbox_arrays {
        kinbox__buf_t
            a[7]; /* id, topic, partition, offset, msg, part, shadow */
} inbox_arrays_t;

static bool
inbox_arrays(inbox_arrays_t *x, const kinbox__inbox_put_t *puts, size_t np,
             const kinbox__inbox_row_t *rows)
{
        bool oom = false;
        for (int c = 0; c < 7; c++) {
                kinbox__buf_init(&x->a[c]);
                kinbox__buf_add(&x->a[c], "{", 1);
        }
        for (size_t k = 0; k < np; k++) {
                const kinbox__inbox_row_t *r = &rows[puts[k].row];
                const char *sep = k ? "," : "";
                arr_elem(&x->a[0], r->id, k == 0);
                arr_elem(&x->a[1], r->topic, k == 0);
                kinbox__buf_printf(&x->a[2], "%s%d", sep, (int)r->partition);
                kinbox__buf_printf(&x->a[3], "%s%lld", sep,
                                   (long long)r->offset);
                kinbox__buf_printf(&x->a[4], "%s%lld", sep,
                                   (long long)puts[k].msg_ms);
                kinbox__buf_printf(&x->a[5], "%s%lld", sep,
                                   (long long)puts[k].part_s);
                kinbox__buf_printf(&x->a[6], "%s%s", sep,
                                   puts[k].shadow ? "t" : "f");
        }
        for (int c = 0; c < 7; c++) {
                kinbox__buf_add(&x->a[c], "}", 1);
                oom = oom || x->a[c].oom;
        }
        return !oom;
}

/* Rows go in by message id (kinbox__inbox_sorted()); each returned row
 * names its put (db/inbox.c). */
static int
pg_inbox_insert(kinbox__db_t *db, const char *consumer, size_t n,
                const kinbox__inbox_row_t *rows, bool *is_new)
{
        static const char sql[] =
            "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
            "kafka_partition, kafka_offset, msg_at, part_at, shadow) "
            "SELECT $1, u.id, u.topic, u.part, u.off, "
            "to_timestamp(u.ms / 1000.0), to_timestamp(u.ps), u.sh FROM "
            "unnest($2::text[], $3::text[], $4::int[], $5::bigint[], "
            "$6::bigint[], $7::bigint[], $8::bool[]) "
            "AS u(id, topic, part, off, ms, ps, sh) "
            "ON CONFLICT DO NOTHING RETURNING message_id, topic, "
            "kafka_partition, kafka_offset, shadow";
        inbox_arrays_t x;
        size_t np = 0;
        int rc = KINBOX_ERR_NOMEM;
        struct kinbox_rows_s *r = NULL;
        for (size_t i = 0; i < n; i++)
                is_new[i] = false;
        kinbox__idref_t *ix = kinbox__inbox_sorted(rows, n);
        kinbox__inbox_put_t *puts =
            ix ? kinbox__inbox_puts(db, rows, ix, n, &np) : NULL;
        bool ok = puts && inbox_arrays(&x, puts, np, rows);
        if (!ok)
                goto out;
        kinbox__param_t p[8] = {{consumer, 0, 0}};
        for (int c = 0; c < 7; c++)
                p[c + 1] = (kinbox__param_t){x.a[c].p, 0, 0};
        rc = pg_query(db, sql, 8, p, -1, &r);
        if (rc)
                goto out;
        for (size_t j = 0; j < r->nrows; j++)
                kinbox__inbox_put_back(
                    puts, np, rows,
                    (const char *const *)&r->values[j * (size_t)r->ncols]);
        kinbox__inbox_puts_fold(puts, np, ix, n, is_new);
        rc = kinbox__inbox_undo(db, consumer, rows, puts, np);
out:
        if (puts)
                for (int c = 0; c < 7; c++)
                        kinbox__buf_free(&x.a[c]);
        free(puts);
        free(ix);
        kinbox_rows_destroy(r);
        return rc;
}

const struct kinbox__db_ops kinbox__pg_ops = {
    .name = "postgresql",
    .backend = KINBOX_BACKEND_POSTGRESQL,
    .connect = pg_connect,
    .disconnect = pg_disconnect,
    .release = pg_release,
    .begin = pg_begin,
    .exec = pg_exec,
    .exec_values = kinbox__db_exec_values_text,
    .exec_claims = pg_exec_claims,
    .query = pg_query,
    .flush = pg_flush,
    .peek = pg_peek,
    .commit = pg_commit,
    .rollback = pg_rollback,
    .savepoint = pg_savepoint,
    .rollback_to = pg_rollback_to,
    .settle = pg_settle,
    .native = pg_native,
    .script = pg_script,
    .inbox_insert = pg_inbox_insert,
    .sql = &kinbox__pg_sql,
    .outbox = &kinbox__pg_outbox_ops,
    .part = &kinbox__pg_part,
    .opart = &kinbox__pg_opart,
};
