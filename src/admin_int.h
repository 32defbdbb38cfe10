/*
 * admin_int.h -- the operator's database handle (internal).
 */
#ifndef KINBOX_ADMIN_INT_H
#define KINBOX_ADMIN_INT_H

#include "db.h"
#include "kinbox/admin.h"

#include <stdbool.h>

struct kinbox_admin_s {
        kinbox__db_t *db;
        /* relay.source = wal | binlog in the conf: event rows are
         * published from the log and never marked, so they are not
         * counted as pending (summary, stuck rows, gauges). */
        bool from_log;
        char errstr[1024];
};

/* Put the database error of rc into adm->errstr, end a transaction, drop
 * a lost connection (the next call reconnects); returns the code. */
kinbox_err_t kinbox__admin_fail(kinbox_admin_t *adm, int rc);
/* Refresh the process's sampled gauges from the database (outbox pending,
 * oldest pending age and dead per destination; dead letters, the oldest's
 * age, parked messages and held keys per consumer): what `kinbox run`
 * serves on /metrics at each scrape (docs/metrics.md). KINBOX_OK,
 * KINBOX_ERR_DB_CONN (the next call reconnects), KINBOX_ERR_DB; the reason
 * in kinbox_admin_errstr(). */
kinbox_err_t kinbox__admin_collect_metrics(kinbox_admin_t *adm);

/* Run one statement (autocommit) with $1..$n text parameters (NULL = SQL
 * NULL), its text from the backend's table; *rowsp receives the rows
 * (kinbox_rows_destroy(); may be NULL). KINBOX_ERR_DB_CONN when
 * unreachable (the next call reconnects), KINBOX_ERR_DB; the reason in
 * adm->errstr. */
/* Row i, column c of an operator statement's rows as a number
 * (kinbox__i64_or()): dflt for NULL or no number. */
int64_t kinbox__rows_i64(const kinbox_rows_t *rows, size_t i, int c,
                         int64_t dflt);

kinbox_err_t kinbox__admin_query(kinbox_admin_t *adm, const char *sql,
                                 int nparams, const char *const *params,
                                 kinbox_rows_t **rowsp);

#endif
