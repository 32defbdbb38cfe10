/*
 * report.c -- `kinbox status` and `kinbox verify`, each in one call:
 * kinbox_admin_report() (the database's counts, each consumer's lag and
 * start refusals, the log relay's slot) and kinbox_admin_verify() (each
 * consumer's rows against its watermarks, its start positions and Kafka's
 * committed offsets; the outbox's stuck rows). They put together the
 * operator calls of status.c, verify.c, lag.c and startpos_admin.c.
 */
#include "admin_int.h"
#include "internal.h"
#include "relay_log.h"
#include "settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where `kinbox run` would start, read on the consumer's own database;
 * NULL with err set when not read. */
static kinbox_offsets_t *
start_positions(const kinbox_conf_t *conf, int flags, char *err, size_t sz)
{
        kinbox_admin_t *own = kinbox_admin_new(conf, err, sz);
        if (!own)
                return NULL;
        kinbox_offsets_t *o = NULL;
        if (kinbox_offsets_list(own, conf, NULL, -1, flags, &o))
                snprintf(err, sz, "%s", kinbox_admin_errstr(own));
        kinbox_admin_destroy(own);
        return o;
}

/* The group's lag; NULL with err set when the broker did not answer. */
static kinbox_lag_t *
lag_of(kinbox_admin_t *adm, const kinbox_conf_t *conf, char *err, size_t sz)
{
        kinbox_lag_t *l = NULL;
        if (kinbox_admin_lag(adm, conf, &l))
                snprintf(err, sz, "%s", kinbox_admin_errstr(adm));
        return l;
}

static kinbox_err_t
nomem(kinbox_admin_t *adm)
{
        snprintf(adm->errstr, sizeof(adm->errstr), "out of memory");
        return KINBOX_ERR_NOMEM;
}

/* One consumer's Kafka side of the report. */
static kinbox_err_t
consumer_report(kinbox_admin_t *adm, const kinbox_conf_t *conf, int flags,
                kinbox_consumer_report_t *c)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        c->group = kinbox__strdup(s->group_id ? s->group_id : s->name);
        c->refused = -1;
        if (!c->group)
                return nomem(adm);
        if (!(flags & KINBOX_REPORT_KAFKA))
                return KINBOX_OK;
        c->lag = lag_of(adm, conf, c->lag_error, sizeof(c->lag_error));
        c->start =
            start_positions(conf, 0, c->start_error, sizeof(c->start_error));
        if (c->start)
                c->refused = 0;
        for (size_t i = 0; c->start && i < c->start->npartitions; i++)
                c->refused +=
                    kinbox_startpos_refused(c->start->partitions[i].verdict);
        return KINBOX_OK;
}

/* relay.source = wal | binlog in relay: its slot and what the server
 * keeps for it. */
static void
log_relay(const kinbox_conf_t *relay, kinbox_report_t *r)
{
        if (!relay ||
            kinbox__settings_of(relay)->relay_source == KINBOX__SOURCE_POLL)
                return;
        r->log_relay = 1;
        r->log_retained_bytes = -1;
        kinbox__loglag_t lag;
        if (kinbox__relay_log_lag(relay, r->log_slot, sizeof(r->log_slot),
                                  &lag, r->log_error, sizeof(r->log_error))) {
                if (!r->log_error[0])
                        snprintf(r->log_error, sizeof(r->log_error),
                                 "not read");
                return;
        }
        r->log_retained_bytes = lag.retained_bytes;
        snprintf(r->log_state, sizeof(r->log_state), "%s", lag.state);
}

kinbox_err_t
kinbox_admin_report(kinbox_admin_t *adm, const kinbox_conf_t *const *consumers,
                    size_t nconsumers, const kinbox_conf_t *relay, int flags,
                    kinbox_report_t **reportp)
{
        if (!reportp)
                return KINBOX_ERR_INVALID;
        *reportp = NULL;
        if (!adm || (nconsumers && !consumers))
                return KINBOX_ERR_INVALID;
        kinbox_report_t *r = kinbox__calloc(1, sizeof(*r));
        const char **names = kinbox__calloc(nconsumers + 1, sizeof(*names));
        if (r)
                r->consumers =
                    kinbox__calloc(nconsumers + 1, sizeof(*r->consumers));
        if (!r || !names || !r->consumers) {
                free(names);
                kinbox_report_destroy(r);
                return nomem(adm);
        }
        for (size_t i = 0; i < nconsumers; i++)
                names[i] = kinbox__settings_of(consumers[i])->name;
        kinbox_err_t rc =
            kinbox_admin_status(adm, names, nconsumers, &r->status);
        free(names);
        for (size_t i = 0; !rc && i < nconsumers; i++) {
                r->consumers[i].name = r->status->consumers[i].name;
                rc = consumer_report(adm, consumers[i], flags,
                                     &r->consumers[i]);
        }
        if (rc) {
                kinbox_report_destroy(r);
                return rc;
        }
        log_relay(relay, r);
        *reportp = r;
        return KINBOX_OK;
}

void
kinbox_report_destroy(kinbox_report_t *r)
{
        if (!r)
                return;
        for (size_t i = 0; r->status && i < r->status->nconsumers; i++) {
                free((char *)r->consumers[i].group);
                kinbox_lag_destroy(r->consumers[i].lag);
                kinbox_offsets_destroy(r->consumers[i].start);
        }
        kinbox_status_destroy(r->status);
        free(r->consumers);
        free(r);
}

/* ------------------------------------------------------------------ */

/* The result owns the stuck rows its strings point into. */
typedef struct verify_own {
        kinbox_verify_report_t pub;
        kinbox_rows_t *stuck_rows;
} verify_own_t;

/* The outbox's rows pending longer than older_ms, and its destinations. */
static kinbox_err_t
outbox_part(kinbox_admin_t *adm, int64_t older_ms, verify_own_t *o)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc =
            kinbox_admin_outbox_stuck(adm, older_ms, &o->stuck_rows);
        if (rc)
                return rc;
        size_t n = kinbox_rows_count(o->stuck_rows);
        o->pub.stuck = kinbox__calloc(n + 1, sizeof(*o->pub.stuck));
        if (!o->pub.stuck)
                return nomem(adm);
        for (size_t i = 0; i < n; i++) {
                kinbox_verify_stuck_t *s = &o->pub.stuck[i];
                const char *d = kinbox_rows_value(o->stuck_rows, i, 0, NULL);
                s->destination = d ? d : "";
                s->rows = kinbox__rows_i64(o->stuck_rows, i, 1, 0);
                s->oldest_id = kinbox__rows_i64(o->stuck_rows, i, 2, 0);
                s->oldest_age_s = kinbox__rows_i64(o->stuck_rows, i, 3, 0);
        }
        o->pub.nstuck = n;
        rc = kinbox_admin_outbox_summary(adm, &r);
        if (!rc)
                o->pub.ndestinations = kinbox_rows_count(r);
        kinbox_rows_destroy(r);
        return rc;
}

/* One consumer's part of the verification. */
static kinbox_err_t
verify_one(kinbox_admin_t *adm, const kinbox_conf_t *conf,
           kinbox_verify_consumer_t *c)
{
        c->name = kinbox__strdup(kinbox__settings_of(conf)->name);
        if (!c->name)
                return nomem(adm);
        kinbox_err_t rc = kinbox_verify(adm, c->name, &c->rows);
        if (rc)
                return rc;
        c->start = start_positions(conf, KINBOX_OFFSETS_READ_LOG,
                                   c->start_error, sizeof(c->start_error));
        c->lag = lag_of(adm, conf, c->lag_error, sizeof(c->lag_error));
        return KINBOX_OK;
}

kinbox_err_t
kinbox_admin_verify(kinbox_admin_t *adm, const kinbox_conf_t *const *consumers,
                    size_t nconsumers, int64_t older_ms,
                    kinbox_verify_report_t **reportp)
{
        if (!reportp)
                return KINBOX_ERR_INVALID;
        *reportp = NULL;
        if (!adm || (nconsumers && !consumers))
                return KINBOX_ERR_INVALID;
        verify_own_t *o = kinbox__calloc(1, sizeof(*o));
        if (o)
                o->pub.consumers =
                    kinbox__calloc(nconsumers + 1, sizeof(*o->pub.consumers));
        if (!o || !o->pub.consumers) {
                free(o);
                return nomem(adm);
        }
        kinbox_err_t rc = KINBOX_OK;
        for (size_t i = 0; !rc && i < nconsumers; i++) {
                o->pub.nconsumers++;
                rc = verify_one(adm, consumers[i], &o->pub.consumers[i]);
        }
        if (!rc)
                rc = outbox_part(adm, older_ms, o);
        if (rc) {
                kinbox_verify_report_destroy(&o->pub);
                return rc;
        }
        *reportp = &o->pub;
        return KINBOX_OK;
}

void
kinbox_verify_report_destroy(kinbox_verify_report_t *r)
{
        if (!r)
                return;
        verify_own_t *o = (verify_own_t *)r;
        for (size_t i = 0; i < r->nconsumers; i++) {
                kinbox_verify_consumer_t *c = &r->consumers[i];
                free((char *)c->name);
                kinbox_verify_result_destroy(c->rows);
                kinbox_offsets_destroy(c->start);
                kinbox_lag_destroy(c->lag);
        }
        free(r->consumers);
        free(r->stuck);
        kinbox_rows_destroy(o->stuck_rows);
        free(o);
}
