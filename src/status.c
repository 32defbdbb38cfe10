/*
 * status.c -- kinbox_admin_status(): what `kinbox status` shows of the
 * database, read in one call on the operator handle (admin_int.h): each
 * consumer's counts, the outbox per destination, the inbox's size. The
 * statements are the backend's (db->ops->sql).
 */
#include "admin_int.h"
#include "internal.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t
cell(kinbox_rows_t *r, size_t i, int c)
{
        return kinbox__rows_i64(r, i, c, 0);
}

static kinbox_err_t
consumer_status(kinbox_admin_t *adm, const char *consumer,
                kinbox_consumer_status_t *out)
{
        const char *v[1] = {consumer};
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox__admin_query(
            adm, adm->db->ops->sql->consumer_status, 1, v, &r);
        if (rc)
                return rc;
        out->inbox_rows = cell(r, 0, 0);
        out->dead = cell(r, 0, 1);
        out->replayed = cell(r, 0, 2);
        out->discarded = cell(r, 0, 3);
        out->parked = cell(r, 0, 4);
        out->held_keys = cell(r, 0, 5);
        const char *old = kinbox_rows_value(r, 0, 6, NULL);
        snprintf(out->oldest_parked_at, sizeof(out->oldest_parked_at), "%s",
                 old ? old : "-");
        kinbox_rows_destroy(r);
        r = NULL;
        /* The running processes' counters (none running: -1). */
        rc = kinbox__admin_query(adm, adm->db->ops->sql->counters_read, 1, v,
                                 &r);
        if (rc)
                return rc;
        bool running = cell(r, 0, 0) > 0;
        out->duplicates = running ? cell(r, 0, 1) : -1;
        out->business_duplicates = running ? cell(r, 0, 2) : -1;
        kinbox_rows_destroy(r);
        return KINBOX_OK;
}

static kinbox_err_t
destinations(kinbox_admin_t *adm, kinbox_status_t *s)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_admin_outbox_summary(adm, &r);
        if (rc)
                return rc;
        size_t n = kinbox_rows_count(r);
        s->destinations = kinbox__calloc(n ? n : 1, sizeof(*s->destinations));
        for (size_t i = 0; s->destinations && i < n; i++) {
                const char *d = kinbox_rows_value(r, i, 0, NULL);
                kinbox_destination_status_t *ds = &s->destinations[i];
                ds->destination = kinbox__strdup(d ? d : "");
                if (!ds->destination)
                        break;
                s->ndestinations++;
                ds->pending = cell(r, i, 1);
                ds->oldest_pending_age_s = cell(r, i, 2);
                ds->dead = cell(r, i, 3);
                ds->sent_last_hour = cell(r, i, 4);
                const char *p = kinbox_rows_value(r, i, 5, NULL);
                ds->paused = p && (!strcmp(p, "t") || !strcmp(p, "1"));
        }
        kinbox_rows_destroy(r);
        return s->ndestinations == n ? KINBOX_OK : KINBOX_ERR_NOMEM;
}

static kinbox_err_t
inbox_rows(kinbox_admin_t *adm, int64_t *rows)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox__admin_query(
            adm, adm->db->ops->sql->inbox_rows, 0, NULL, &r);
        if (!rc)
                *rows = cell(r, 0, 0);
        kinbox_rows_destroy(r);
        return rc;
}

/* The ranges of a partitioned inbox (nothing for the plain table). */
static kinbox_err_t
partitions(kinbox_admin_t *adm, kinbox_status_t *s)
{
        kinbox__db_t *db = adm->db;
        int rc = kinbox__inbox_layout_load(db, 86400000, true);
        if (rc || !db->inbox_partitioned)
                return rc ? kinbox__admin_fail(adm, rc) : KINBOX_OK;
        kinbox__range_t *r = NULL;
        size_t n = 0;
        rc =
            db->ops->part->list(db, "kinbox_inbox", &r, &n, &s->catchall_rows);
        int64_t host = kinbox__wall_ms(), dbnow = 0;
        if (!rc && !(rc = db->ops->part->clock(db, &dbnow)))
                s->db_clock_skew_ms =
                    host + (kinbox__wall_ms() - host) / 2 - dbnow;
        if (!rc) {
                s->partition_width_s = db->inbox_width_s;
                s->npartitions = n;
                s->partitions_from = n ? r[0].start_s : 0;
                s->partitions_until =
                    n ? r[n - 1].start_s + db->inbox_width_s : 0;
        }
        free(r);
        return rc ? kinbox__admin_fail(adm, rc) : KINBOX_OK;
}

static kinbox_err_t
consumers_status(kinbox_admin_t *adm, const char *const *names, size_t n,
                 kinbox_status_t *s)
{
        s->consumers = kinbox__calloc(n ? n : 1, sizeof(*s->consumers));
        if (!s->consumers)
                return KINBOX_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) {
                kinbox_consumer_status_t *c = &s->consumers[i];
                c->name = kinbox__strdup(names[i] ? names[i] : "");
                if (!c->name)
                        return KINBOX_ERR_NOMEM;
                s->nconsumers++;
                kinbox_err_t rc = consumer_status(adm, c->name, c);
                if (rc)
                        return rc;
        }
        return KINBOX_OK;
}

kinbox_err_t
kinbox_admin_status(kinbox_admin_t *adm, const char *const *consumers,
                    size_t nconsumers, kinbox_status_t **statusp)
{
        if (!statusp)
                return KINBOX_ERR_INVALID;
        *statusp = NULL;
        if (!adm || (nconsumers && !consumers))
                return KINBOX_ERR_INVALID;
        adm->errstr[0] = '\0';
        kinbox_status_t *s = kinbox__calloc(1, sizeof(*s));
        if (!s)
                return KINBOX_ERR_NOMEM;
        kinbox_err_t rc = consumers_status(adm, consumers, nconsumers, s);
        if (!rc)
                rc = destinations(adm, s);
        if (!rc)
                rc = inbox_rows(adm, &s->inbox_rows);
        if (!rc)
                rc = partitions(adm, s);
        if (rc) {
                if (rc == KINBOX_ERR_NOMEM && !adm->errstr[0])
                        snprintf(adm->errstr, sizeof(adm->errstr),
                                 "out of memory");
                kinbox_status_destroy(s);
                return rc;
        }
        *statusp = s;
        return KINBOX_OK;
}

kinbox_err_t
kinbox_admin_consumers(kinbox_admin_t *adm, kinbox_rows_t **rowsp)
{
        if (!rowsp)
                return KINBOX_ERR_INVALID;
        *rowsp = NULL;
        if (!adm)
                return KINBOX_ERR_INVALID;
        adm->errstr[0] = '\0';
        return kinbox__admin_query(adm, adm->db->ops->sql->consumers, 0, NULL,
                                   rowsp);
}

kinbox_err_t
kinbox_admin_counters_record(kinbox_admin_t *adm, const char *consumer,
                             const char *instance,
                             const kinbox_consumer_stats_t *st, int remove)
{
        if (!adm || !consumer || !instance || (!remove && !st))
                return KINBOX_ERR_INVALID;
        adm->errstr[0] = '\0';
        const struct kinbox__sql *d = adm->db->ops->sql;
        if (remove) {
                const char *v[2] = {consumer, instance};
                return kinbox__admin_query(adm, d->counters_remove, 2, v,
                                           NULL);
        }
        char dup[24], biz[24];
        snprintf(dup, sizeof(dup), "%" PRIu64, st->duplicates);
        snprintf(biz, sizeof(biz), "%" PRIu64, st->business_duplicates);
        const char *v[4] = {consumer, instance, dup, biz};
        return kinbox__admin_query(adm, d->counters_put, 4, v, NULL);
}

void
kinbox_status_destroy(kinbox_status_t *s)
{
        if (!s)
                return;
        for (size_t i = 0; i < s->nconsumers; i++)
                free((char *)s->consumers[i].name);
        for (size_t i = 0; i < s->ndestinations; i++)
                free((char *)s->destinations[i].destination);
        free(s->consumers);
        free(s->destinations);
        free(s);
}
