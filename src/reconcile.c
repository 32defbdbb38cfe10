/*
 * reconcile.c -- business reconciliation checks: run each check's query
 * for the configured backend, report its rows and export the count as
 * kinbox_reconcile_discrepancies{check}. With `lock`, only the instance
 * holding the named database lock runs (the pruner's pattern, prune.c).
 */
#include "db.h"
#include "internal.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECONCILE_LOCK "kinbox_reconcile"

static void
count_run(const char *result)
{
        char lab[64];
        kinbox__m_add(
            "kinbox_reconcile_runs_total",
            kinbox__m_labels(lab, sizeof(lab), "result", result, (char *)NULL),
            1);
}

/* The named lock of one reconciling replica: 0 with *locked, or the
 * database error. */
static int
take_lock(kinbox__db_t *db, bool *locked)
{
        const char *name = RECONCILE_LOCK;
        struct kinbox_rows_s *rows = NULL;
        int rc =
            kinbox__db_queryv(db, db->ops->sql->try_lock, 1, &name, &rows);
        const char *v = !rc && rows && rows->nrows ? rows->values[0] : NULL;
        *locked = v && (!strcmp(v, "t") || !strcmp(v, "1"));
        kinbox_rows_destroy(rows);
        return rc;
}

/* Each check with SQL for this backend: its gauge set, cb called. 0, or
 * the database error with *failed naming the check. */
static int
run_checks(kinbox__db_t *db, const kinbox_conf_t *conf,
           const kinbox_check_t *const *checks, size_t nchecks,
           kinbox_reconcile_cb cb, void *opaque,
           kinbox_reconcile_result_t *res, const char **failed)
{
        char grace[32];
        snprintf(grace, sizeof(grace), "%" PRId64,
                 kinbox__settings_of(conf)->reconcile_grace / 1000);
        const char *params[1] = {grace};
        for (size_t i = 0; i < nchecks; i++) {
                const kinbox_check_t *c = checks[i];
                const char *sql =
                    kinbox__db_pick(db, c->sql_postgresql, c->sql_mysql);
                if (!c->name || !sql)
                        continue;
                struct kinbox_rows_s *rows = NULL;
                /* Only the statement's own parameter count may be sent. */
                int np = strstr(sql, "$1") ? 1 : 0;
                int rc = kinbox__db_queryv(db, sql, np, params, &rows);
                if (rc) {
                        kinbox_rows_destroy(rows);
                        *failed = c->name;
                        return rc;
                }
                size_t n = rows ? rows->nrows : 0;
                res->checks++;
                res->discrepancies += n;
                char lab[256];
                kinbox__m_set("kinbox_reconcile_discrepancies",
                              kinbox__m_labels(lab, sizeof(lab), "check",
                                               c->name, (char *)NULL),
                              (double)n);
                if (cb)
                        cb(c, rows, opaque);
                kinbox_rows_destroy(rows);
        }
        return 0;
}

kinbox_err_t
kinbox_reconcile(const kinbox_conf_t *conf,
                 const kinbox_check_t *const *checks, size_t nchecks, int lock,
                 kinbox_reconcile_cb cb, void *opaque,
                 kinbox_reconcile_result_t *out, char *errstr, size_t sz)
{
        kinbox_reconcile_result_t res = {0, 0, 0};
        if (out)
                *out = res;
        kinbox__db_t *db = kinbox__db_new_conf(conf, errstr, sz);
        if (!db)
                return KINBOX_ERR_CONFIG;
        const char *failed_check = NULL;
        bool locked = !lock;
        int rc = kinbox__db_connect(db);
        if (!rc && lock)
                rc = take_lock(db, &locked);
        if (!rc && locked)
                rc = run_checks(db, conf, checks, nchecks, cb, opaque, &res,
                                &failed_check);
        if (rc) {
                if (failed_check)
                        kinbox__errstr(errstr, sz, "reconcile: check %s: %s",
                                       failed_check, db->err.msg);
                else
                        kinbox__errstr(errstr, sz, "reconcile: %s",
                                       db->err.msg);
        }
        res.skipped = !rc && !locked;
        count_run(rc ? "failed" : res.skipped ? "skipped" : "done");
        if (!rc && lock && locked) {
                const char *name = RECONCILE_LOCK;
                kinbox__db_queryv(db, db->ops->sql->unlock, 1, &name, NULL);
        }
        /* Closing the connection releases a session lock too. */
        kinbox__db_destroy(db);
        if (out)
                *out = res;
        if (!rc)
                return KINBOX_OK;
        return rc == KINBOX_ERR_DB_CONN ? KINBOX_ERR_DB_CONN : KINBOX_ERR_DB;
}
