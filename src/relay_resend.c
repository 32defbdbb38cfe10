/*
 * relay_resend.c -- kinbox_outbox_resend(): publish the outbox's Kafka rows
 * created since a time again, from the table, the way the relay publishes
 * them (relay_kafka.c: same key, headers, timestamp; id order, so each
 * aggregate's rows in order). The way back when a log relay lost its place
 * (a purged binlog, a lost slot): consumers' inboxes absorb the copies.
 *
 * relay.source = binlog: the readers' lock is held for the whole run (no
 * relay of the name may read meanwhile), the binlog's position is noted
 * before the first row is read, and stored as the relay's position once
 * every row is acknowledged: what committed after it is read from the
 * binlog, what committed before it was in the table's rows (a row in both
 * is published twice, never lost).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/mysql_binlog.h"
#include "relay_int.h"

#define RESEND_PAGE 500

/* Fill items from a page of the resend query. */
static void
page_items(struct kinbox_rows_s *rows, item_t *v)
{
        for (size_t i = 0; i < rows->nrows; i++) {
                char **c = rows->values + i * (size_t)rows->ncols;
                size_t *l = rows->lens + i * (size_t)rows->ncols;
                item_t *it = &v[i];
                memset(it, 0, sizeof(*it));
                it->id = to_i64(c[0]);
                it->destination = c[1];
                it->idem_key = c[2];
                it->aggregate_id = c[3];
                it->payload = c[4];
                it->payload_size = c[4] ? l[4] : 0;
                it->headers_json = c[5];
                it->created_at_ms = to_i64(c[6]);
                it->created_ms = it->created_at_ms;
        }
}

/* Produce a page and wait for every report: 0, or <0 with errstr. */
static int
page_publish(kinbox_relay_t *r, item_t *v, size_t n, char *errstr, size_t sz)
{
        for (size_t i = 0; i < n; i++) {
                kinbox__relay_produce(r, &v[i]);
                if (!v[i].produced) {
                        kinbox__errstr(errstr, sz,
                                       "outbox row %" PRId64 ": %s", v[i].id,
                                       v[i].err);
                        rd_kafka_flush(r->rk, (int)r->msg_timeout_ms);
                        return KINBOX_ERR_KAFKA;
                }
        }
        rd_kafka_flush(r->rk, (int)r->msg_timeout_ms + 5000);
        for (size_t i = 0; i < n; i++)
                if (!v[i].dr_done || v[i].dr_err) {
                        kinbox__errstr(
                            errstr, sz, "outbox row %" PRId64 " to %s: %s",
                            v[i].id, v[i].destination,
                            v[i].dr_done ? rd_kafka_err2str(v[i].dr_err)
                                         : "no delivery report");
                        return KINBOX_ERR_KAFKA;
                }
        return 0;
}

static int
resend_rows(kinbox_relay_t *r, int64_t since_ms, int64_t *published,
            char *errstr, size_t sz)
{
        kinbox__buf_t q;
        kinbox__buf_init(&q);
        kinbox__buf_printf(&q, "%s LIMIT %d", r->db->ops->outbox->resend,
                           RESEND_PAGE);
        item_t *v = kinbox__calloc(RESEND_PAGE, sizeof(*v));
        char since[32], after[32] = "0";
        snprintf(since, sizeof(since), "%" PRId64, since_ms);
        int rc = v && !q.oom ? 0 : KINBOX_ERR_NOMEM;
        while (!rc) {
                const char *vals[2] = {since, after};
                struct kinbox_rows_s *rows = NULL;
                rc = kinbox__db_queryv(r->db, q.p, 2, vals, &rows);
                if (rc) {
                        kinbox__errstr(errstr, sz, "reading the outbox: %s",
                                       r->db->err.msg);
                } else if (rows->nrows) {
                        page_items(rows, v);
                        rc = page_publish(r, v, rows->nrows, errstr, sz);
                        if (!rc)
                                *published += (int64_t)rows->nrows;
                        snprintf(after, sizeof(after), "%" PRId64,
                                 v[rows->nrows - 1].id);
                }
                bool last = !rows || rows->nrows < RESEND_PAGE;
                kinbox_rows_destroy(rows);
                if (last)
                        break;
        }
        free(v);
        kinbox__buf_free(&q);
        return rc;
}

kinbox_err_t
kinbox_outbox_resend(kinbox_conf_t *conf, int64_t since_ms, int64_t *published,
                     char *errstr, size_t errstr_size)
{
        int64_t dummy = 0;
        if (!published)
                published = &dummy;
        *published = 0;
        if (!conf)
                return KINBOX_ERR_INVALID;
        kinbox_conf_t *own = kinbox_conf_dup(conf);
        if (!own)
                return KINBOX_ERR_NOMEM;
        kinbox_relay_t *r = kinbox_relay_new(own, errstr, errstr_size);
        if (!r) {
                kinbox_conf_destroy(own);
                return KINBOX_ERR_CONFIG;
        }
        const kinbox__settings_t *st = kinbox__settings_of(conf);
        const char *name = kinbox__binlog_name(conf);
        bool binlog = st->relay_source == KINBOX__SOURCE_BINLOG;
        char *pos = NULL;
        int rc = kinbox__db_connect(r->db);
        if (rc)
                kinbox__errstr(errstr, errstr_size, "%s", r->db->err.msg);
        if (!rc && binlog)
                rc = kinbox__binlog_hold(r->db, name, &pos, errstr,
                                         errstr_size);
        if (!rc && !(r->rk = kinbox__relay_producer_new(r))) {
                kinbox__errstr(errstr, errstr_size, "%s", r->errstr);
                rc = KINBOX_ERR_KAFKA;
        }
        if (!rc)
                rc = resend_rows(r, since_ms, published, errstr, errstr_size);
        if (!rc && binlog)
                rc = kinbox__binlog_set(r->db, name, pos, errstr, errstr_size);
        free(pos);
        kinbox_relay_destroy(r);
        return rc;
}
