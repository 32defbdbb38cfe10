/*
 * admin.c -- the operator's database handle: statements run for operators
 * (kinbox__admin_query()), reachability, the outbox's pause switch and
 * summaries, and the gauges sampled from the
 * database at scrape time. Dialect SQL comes from
 * the backend's table (db.h).
 */
#include "admin_int.h"
#include "internal.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kinbox_admin_t *
kinbox_admin_new(const kinbox_conf_t *conf, char *errstr, size_t sz)
{
        const char *url =
            conf ? kinbox__settings_of(conf)->database_url : NULL;
        if (!url || !*url) {
                kinbox__errstr(errstr, sz, "database.url is required");
                return NULL;
        }
        kinbox_admin_t *adm = kinbox__calloc(1, sizeof(*adm));
        if (!adm) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        adm->db = kinbox__db_new_conf(conf, errstr, sz);
        if (!adm->db) {
                free(adm);
                return NULL;
        }
        adm->from_log =
            kinbox__settings_of(conf)->relay_source != KINBOX__SOURCE_POLL;
        return adm;
}

void
kinbox_admin_destroy(kinbox_admin_t *adm)
{
        if (!adm)
                return;
        kinbox__db_destroy(adm->db);
        free(adm);
}

const char *
kinbox_admin_errstr(const kinbox_admin_t *adm)
{
        return adm ? adm->errstr : "";
}

kinbox_backend_t
kinbox_admin_backend(const kinbox_admin_t *adm)
{
        return adm->db->backend;
}

kinbox_err_t
kinbox__admin_fail(kinbox_admin_t *adm, int rc)
{
        snprintf(adm->errstr, sizeof(adm->errstr), "%s",
                 adm->db->err.msg[0] ? adm->db->err.msg
                                     : kinbox_strerror((kinbox_err_t)rc));
        kinbox__db_abandon(adm->db);
        if (rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_COMMIT_UNKNOWN) {
                adm->db->ops->disconnect(adm->db);
                return KINBOX_ERR_DB_CONN;
        }
        return (kinbox_err_t)rc;
}

kinbox_err_t
kinbox__admin_query(kinbox_admin_t *adm, const char *sql, int nparams,
                    const char *const *params, kinbox_rows_t **rowsp)
{
        adm->errstr[0] = '\0';
        if (rowsp)
                *rowsp = NULL;
        int rc = kinbox__db_queryv(adm->db, sql, nparams, params, rowsp);
        return rc ? kinbox__admin_fail(adm, rc) : KINBOX_OK;
}

int64_t
kinbox__rows_i64(const kinbox_rows_t *rows, size_t i, int c, int64_t dflt)
{
        return kinbox__i64_or(kinbox_rows_value(rows, i, c, NULL), dflt);
}

/* dead_letter.hold_key: parked messages, held keys, oldest parked age. */
static kinbox_err_t
hold_gauges(kinbox_admin_t *adm)
{
        static const char *const names[3] = {
            "kinbox_parked_messages", "kinbox_held_keys",
            "kinbox_parked_oldest_age_seconds"};
        kinbox_rows_t *rows = NULL;
        kinbox_err_t rc = kinbox__admin_query(
            adm, adm->db->ops->sql->hold_gauges, 0, NULL, &rows);
        if (rc)
                return rc;
        for (int k = 0; k < 3; k++)
                kinbox__m_drop(names[k], "");
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                char l[300];
                const char *cn = kinbox_rows_value(rows, i, 0, NULL);
                kinbox__m_labels(l, sizeof(l), "consumer", cn ? cn : "",
                                 (char *)NULL);
                for (int k = 0; k < 3; k++) {
                        const char *v =
                            kinbox_rows_value(rows, i, k + 1, NULL);
                        kinbox__m_set(names[k], l, v ? strtod(v, NULL) : 0);
                }
        }
        kinbox_rows_destroy(rows);
        return KINBOX_OK;
}

kinbox_err_t
kinbox__admin_collect_metrics(kinbox_admin_t *adm)
{
        kinbox_rows_t *rows = NULL;
        const char *v[1] = {adm->from_log ? "1" : "0"};
        kinbox_err_t rc = kinbox__admin_query(
            adm, adm->db->ops->sql->outbox_gauges, 1, v, &rows);
        if (rc)
                return rc;
        /* Destinations that drained must read 0, not their last value. */
        kinbox__m_drop("kinbox_outbox_pending", "");
        kinbox__m_drop("kinbox_outbox_oldest_pending_seconds", "");
        kinbox__m_drop("kinbox_outbox_dead", "");
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                char l[600];
                const char *d = kinbox_rows_value(rows, i, 0, NULL);
                kinbox__m_labels(l, sizeof(l), "destination", d ? d : "",
                                 (char *)NULL);
                const char *v1 = kinbox_rows_value(rows, i, 1, NULL);
                const char *v2 = kinbox_rows_value(rows, i, 2, NULL);
                const char *v3 = kinbox_rows_value(rows, i, 3, NULL);
                kinbox__m_set("kinbox_outbox_pending", l,
                              v1 ? strtod(v1, NULL) : 0);
                kinbox__m_set("kinbox_outbox_oldest_pending_seconds", l,
                              v2 ? strtod(v2, NULL) : 0);
                kinbox__m_set("kinbox_outbox_dead", l,
                              v3 ? strtod(v3, NULL) : 0);
        }
        kinbox_rows_destroy(rows);
        rows = NULL;
        rc = kinbox__admin_query(adm, adm->db->ops->sql->dead_letter_gauges, 0,
                                 NULL, &rows);
        if (rc)
                return rc;
        kinbox__m_drop("kinbox_dead_letters", "");
        kinbox__m_drop("kinbox_dead_letter_oldest_seconds", "");
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                char l[300];
                const char *cn = kinbox_rows_value(rows, i, 0, NULL);
                const char *n = kinbox_rows_value(rows, i, 1, NULL);
                const char *age = kinbox_rows_value(rows, i, 2, NULL);
                kinbox__m_labels(l, sizeof(l), "consumer", cn ? cn : "",
                                 (char *)NULL);
                kinbox__m_set("kinbox_dead_letters", l,
                              n ? strtod(n, NULL) : 0);
                kinbox__m_set("kinbox_dead_letter_oldest_seconds", l,
                              age ? strtod(age, NULL) : 0);
        }
        kinbox_rows_destroy(rows);
        return hold_gauges(adm);
}

kinbox_err_t
kinbox_admin_outbox_pause(kinbox_admin_t *adm, const char *destination,
                          int pause, int *was_paused)
{
        const struct kinbox__sql *d = adm->db->ops->sql;
        const char *v[1] = {destination};
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox__admin_query(adm, d->outbox_paused, 1, v, &r);
        if (rc)
                return rc;
        int paused = kinbox_rows_count(r) > 0;
        kinbox_rows_destroy(r);
        if (was_paused)
                *was_paused = paused;
        if (pause && !paused)
                rc = kinbox__admin_query(adm, d->outbox_pause, 1, v, NULL);
        else if (!pause && paused)
                rc = kinbox__admin_query(adm, d->outbox_resume, 1, v, NULL);
        if (!rc && !pause && d->outbox_wake)
                (void)kinbox__admin_query(adm, d->outbox_wake, 0, NULL, NULL);
        return rc;
}

kinbox_err_t
kinbox_admin_outbox_summary(kinbox_admin_t *adm, kinbox_rows_t **rowsp)
{
        const char *v[1] = {adm->from_log ? "1" : "0"};
        return kinbox__admin_query(adm, adm->db->ops->sql->outbox_summary, 1,
                                   v, rowsp);
}

kinbox_err_t
kinbox_admin_outbox_stuck(kinbox_admin_t *adm, int64_t older_ms,
                          kinbox_rows_t **rowsp)
{
        char ms[24];
        snprintf(ms, sizeof(ms), "%" PRId64, older_ms);
        const char *v[2] = {ms, adm->from_log ? "1" : "0"};
        return kinbox__admin_query(adm, adm->db->ops->sql->outbox_stuck, 2, v,
                                   rowsp);
}

kinbox_err_t
kinbox_admin_ping(kinbox_admin_t *adm)
{
        return kinbox__admin_query(adm, adm->db->ops->sql->ping, 0, NULL,
                                   NULL);
}
