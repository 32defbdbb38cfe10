/*
 * consumer_worker.c -- the consumer's workers: the control connection and
 * one connection and thread per worker; a worker takes the head run of
 * each runnable partition it owns (up to batch.max, waiting up to
 * batch.wait.ms for it to fill) and runs it through batch.c.
 */

#include "consumer_int.h"
#include "db.h"
#include "hold.h"
#include "internal.h"
#include "migrate.h"
#include "partition.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
db_log(void *ctx, int level, const char *fmt, ...)
{
        kinbox_consumer_t *c = ctx;
        va_list ap;
        va_start(ap, fmt);
        kinbox__vlog(&c->lg, level, "db", fmt, ap);
        va_end(ap);
}

static kinbox__db_t *
db_open(kinbox_consumer_t *c, char *errstr, size_t sz)
{
        kinbox__db_t *db = kinbox__db_new_conf(c->conf, errstr, sz);
        if (db) {
                db->log = db_log;
                db->log_ctx = c;
                db->coalesce = kinbox__settings_of(c->conf)->mysql_coalesce;
        }
        return db;
}

static bool
grow_batch(kinbox__worker_t *w, size_t need)
{
        return !kinbox__batch_reserve(&w->b, need);
}

/* Under w->lock: collect up to limit messages from runnable partitions. */
static size_t
collect(kinbox_consumer_t *c, kinbox__worker_t *w, int64_t now,
        int64_t *next_wake)
{
        size_t n = 0;
        *next_wake = 0;
        /* Each partition contributes its head run; round robin by taking a
         * share per partition keeps one busy partition from starving. */
        for (kinbox__part_t *p = c->parts; p; p = p->next) {
                if (p->w != w || p->revoked || !p->head || p->hold_unknown)
                        continue;
                if (kinbox__part_backing_off(p, now)) {
                        if (!*next_wake || p->retry_at < *next_wake)
                                *next_wake = p->retry_at;
                        continue;
                }
                for (kinbox_msg_t *m = p->head; m && n < w->b.limit;
                     m = m->next)
                        w->b.msgs[n++] = m;
                if (n >= w->b.limit)
                        break;
        }
        return n;
}

static size_t
runnable(kinbox_consumer_t *c, kinbox__worker_t *w, int64_t now)
{
        size_t n = 0;
        for (kinbox__part_t *p = c->parts; p; p = p->next)
                if (p->w == w && !p->revoked && p->head && !p->hold_unknown &&
                    !kinbox__part_backing_off(p, now))
                        n += p->count;
        return n;
}

static void *
worker_main(void *arg)
{
        kinbox__worker_t *w = arg;
        kinbox_consumer_t *c = w->c;
        pthread_mutex_lock(&w->lock);
        while (!w->stop) {
                kinbox__hold_tick(c, w);
                if (w->stop)
                        break;
                int64_t now = kinbox__now_ms();
                size_t avail = runnable(c, w, now);
                if (!avail) {
                        int64_t wake = 0;
                        collect(c, w, now, &wake);
                        kinbox__timed_wait(
                            w, wake ? (wake - now > 0 ? wake - now : 1) : 200);
                        continue;
                }
                /* Let the batch fill for up to batch.wait.ms. */
                if (avail < w->b.limit && c->batch_wait > 0) {
                        int64_t until = now + c->batch_wait;
                        while (!w->stop &&
                               runnable(c, w, kinbox__now_ms()) < w->b.limit) {
                                int64_t left = until - kinbox__now_ms();
                                if (left <= 0)
                                        break;
                                kinbox__timed_wait(w, left);
                        }
                        if (w->stop)
                                break;
                }
                int64_t wake;
                w->b.nmsgs = collect(c, w, kinbox__now_ms(), &wake);
                if (!w->b.nmsgs)
                        continue;
                w->in_batch = true;
                pthread_mutex_unlock(&w->lock);
                kinbox__batch_process(&w->b);
                pthread_mutex_lock(&w->lock);
                w->in_batch = false;
                w->b.nmsgs = 0;
                w->batch_seq++;
                pthread_cond_broadcast(&w->idle);
        }
        pthread_mutex_unlock(&w->lock);
        return NULL;
}

void
kinbox__workers_stop(kinbox_consumer_t *c)
{
        for (int k = 0; k < c->nworkers; k++) {
                kinbox__worker_t *w = &c->workers[k];
                pthread_mutex_lock(&w->lock);
                w->stop = true;
                pthread_cond_broadcast(&w->cond);
                pthread_mutex_unlock(&w->lock);
        }
        for (int k = 0; k < c->nworkers; k++) {
                kinbox__worker_t *w = &c->workers[k];
                if (w->started)
                        pthread_join(w->thr, NULL);
                w->started = false;
        }
}

void
kinbox__workers_free(kinbox_consumer_t *c)
{
        if (!c->workers)
                return;
        for (int k = 0; k < c->nworkers; k++) {
                kinbox__worker_t *w = &c->workers[k];
                kinbox__db_destroy(w->db);
                kinbox__batch_free(&w->b);
                pthread_mutex_destroy(&w->lock);
                pthread_cond_destroy(&w->cond);
                pthread_cond_destroy(&w->idle);
        }
        free(c->workers);
        c->workers = NULL;
}

/* The control connection and the workers (connections, threads). */
kinbox_err_t
kinbox__workers_start(kinbox_consumer_t *c)
{
        c->grp.ctl = db_open(c, c->errstr, sizeof(c->errstr));
        if (!c->grp.ctl)
                return KINBOX_ERR_CONFIG;
        if (kinbox__db_connect(c->grp.ctl)) {
                snprintf(c->errstr, sizeof(c->errstr), "%s",
                         c->grp.ctl->err.msg);
                return KINBOX_ERR_DB_CONN;
        }
        int src = kinbox__schema_check_db(c->grp.ctl, NULL, c->errstr,
                                          sizeof(c->errstr));
        if (!src)
                src = kinbox__partition_check(c->grp.ctl,
                                              kinbox__settings_of(c->conf),
                                              c->errstr, sizeof(c->errstr));
        if (src)
                return (kinbox_err_t)src;
        c->workers =
            kinbox__calloc((size_t)c->nworkers, sizeof(kinbox__worker_t));
        if (!c->workers)
                return KINBOX_ERR_NOMEM;
        for (int k = 0; k < c->nworkers; k++) {
                kinbox__worker_t *w = &c->workers[k];
                w->c = c;
                w->idx = k;
                pthread_mutex_init(&w->lock, NULL);
                pthread_cond_init(&w->cond, NULL);
                pthread_cond_init(&w->idle, NULL);
                w->db = db_open(c, c->errstr, sizeof(c->errstr));
                w->b = (kinbox__batch_t){.c = c,
                                         .w = w,
                                         .db = w->db,
                                         .limit = c->batch_max,
                                         .attr.call_tag = -1};
                if (!w->db || !grow_batch(w, c->batch_max))
                        return KINBOX_ERR_NOMEM;
                if (kinbox__db_connect(w->db))
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "worker %d: %s (will retry)", k,
                                    w->db->err.msg);
        }
        for (int k = 0; k < c->nworkers; k++) {
                if (pthread_create(&c->workers[k].thr, NULL, worker_main,
                                   &c->workers[k]))
                        return KINBOX_ERR_NOMEM;
                c->workers[k].started = true;
        }
        return KINBOX_OK;
}

void
kinbox__workers_lock(kinbox_consumer_t *c)
{
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_lock(&c->workers[k].lock);
}

void
kinbox__workers_unlock(kinbox_consumer_t *c)
{
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_unlock(&c->workers[k].lock);
}
