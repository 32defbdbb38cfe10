/*
 * consumer.c -- the inbox consumer.
 *
 * Threads: the thread in kinbox_consumer_run() polls Kafka, serves
 * rebalances and hands each message to the worker that owns its partition
 * (hash of topic/partition). A worker builds a batch from its partitions'
 * queues, runs it in one transaction on its own connection, and only after
 * COMMIT succeeded stores the offsets. A partition's messages stay at the
 * head of its queue until their transaction committed, so message N+1 is
 * never handed to a handler before N committed.
 *
 * A batch runs in batch.c (kinbox__batch_process): BEGIN; one inbox insert
 * tells which ids are new; handlers run for the new ones; dead letters and
 * offset watermarks are queued; COMMIT; offsets stored. A failure is
 * charged to the one message that caused it and undone with a savepoint
 * (or, on a clean stream, one rollback); its neighbours commit once.
 */
#include "consumer_int.h"
#include "held.h"
#include "db.h"
#include "hold.h"
#include "internal.h"
#include "migrate.h"
#include "metrics.h"
#include "msgid.h"
#include "partition.h"
#include "tx.h"
#include "hdrcodec.h"
#include "rkdestroy.h"

#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Metrics: partitions assigned now (after a rebalance callback). */
static void
metrics_assignment(kinbox_consumer_t *c, rd_kafka_t *rk)
{
        rd_kafka_topic_partition_list_t *l = NULL;
        char lb[300];
        if (rd_kafka_assignment(rk, &l) || !l)
                return;
        kinbox__m_set("kinbox_consumer_assigned_partitions",
                      kinbox__m_labels(lb, sizeof(lb), "consumer", c->name,
                                       (char *)NULL),
                      l->cnt);
        rd_kafka_topic_partition_list_destroy(l);
}

/* ------------------------------------------------------------------ */
/* creation */

static void
db_log(void *ctx, int level, const char *fmt, ...)
{
        kinbox_consumer_t *c = ctx;
        va_list ap;
        va_start(ap, fmt);
        kinbox__vlog(&c->lg, level, "db", fmt, ap);
        va_end(ap);
}

static void
rk_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        kinbox_consumer_t *c = rd_kafka_opaque(rk);
        if (c)
                kinbox__log(&c->lg, level, "rdkafka", "%s: %s", fac, buf);
}

struct kafka_set_ctx {
        rd_kafka_conf_t *rkc;
        char *errstr;
        size_t errsz;
        bool failed;
};

static void
kafka_set(const char *k, const char *v, void *arg)
{
        struct kafka_set_ctx *x = arg;
        char e[256];
        if (x->failed)
                return;
        if (rd_kafka_conf_set(x->rkc, k, v, e, sizeof(e)) !=
            RD_KAFKA_CONF_OK) {
                kinbox__errstr(x->errstr, x->errsz, "kafka.%s: %s", k, e);
                x->failed = true;
        }
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque);

static kinbox_err_t
parse_topics(kinbox_consumer_t *c, const char *topics, char *errstr, size_t sz)
{
        c->topics = rd_kafka_topic_partition_list_new(4);
        const char *p = topics;
        while (p && *p) {
                size_t n = strcspn(p, ",");
                char t[256];
                size_t s = 0, e = n;
                while (s < e && (p[s] == ' ' || p[s] == '\t'))
                        s++;
                while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
                        e--;
                if (e > s) {
                        if (e - s >= sizeof(t)) {
                                kinbox__errstr(errstr, sz,
                                               "topics: name too long");
                                return KINBOX_ERR_CONFIG;
                        }
                        memcpy(t, p + s, e - s);
                        t[e - s] = '\0';
                        rd_kafka_topic_partition_list_add(
                            c->topics, t, RD_KAFKA_PARTITION_UA);
                }
                p += n + (p[n] ? 1 : 0);
        }
        if (!c->topics->cnt) {
                kinbox__errstr(errstr, sz, "topics: no topic configured");
                return KINBOX_ERR_CONFIG;
        }
        return KINBOX_OK;
}

/* The settings the consumer's threads read, copied once. */
static void
take_settings(kinbox_consumer_t *c, const kinbox__settings_t *s)
{
        c->nworkers = (int)s->workers;
        c->batch_max = (size_t)s->batch_max;
        c->batch_wait = s->batch_wait_ms;
        c->queue_max = (size_t)s->queue_max_messages;
        c->retry_max = s->retry_max;
        c->backoff_base = s->retry_backoff_base_ms;
        c->backoff_max = s->retry_backoff_max_ms;
        c->reconnect_max = s->reconnect_backoff_max_ms;
        if (c->queue_max < c->batch_max)
                c->queue_max = c->batch_max;
}

/* The prefetch bounds librdkafka runs with (kinbox's defaults or the
 * user's kafka.*): the fetch nudge wakes its fetchers against them. */
static void
read_prefetch(kinbox_consumer_t *c)
{
        const rd_kafka_conf_t *rc = rd_kafka_conf(c->rk);
        char v[64];
        size_t vl = sizeof(v);
        if (rd_kafka_conf_get(rc, "queued.min.messages", v, &vl) ==
            RD_KAFKA_CONF_OK)
                c->prefetch_msgs = (size_t)strtoull(v, NULL, 10);
        vl = sizeof(v);
        if (rd_kafka_conf_get(rc, "queued.max.messages.kbytes", v, &vl) ==
            RD_KAFKA_CONF_OK)
                c->prefetch_bytes = 1024.0 * strtod(v, NULL);
}

kinbox_consumer_t *
kinbox_consumer_new(kinbox_conf_t *conf, char *errstr, size_t sz)
{
        if (!conf) {
                kinbox__errstr(errstr, sz, "kinbox_consumer_new: no conf");
                return NULL;
        }
        kinbox_consumer_t *c = kinbox__calloc(1, sizeof(*c));
        if (!c) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        pthread_mutex_init(&c->drain_lock, NULL);
        pthread_cond_init(&c->drained, NULL);
        pthread_mutex_init(&c->nudge_lock, NULL);
        pthread_cond_init(&c->nudge_cond, NULL);
        kinbox__conf_logger(conf, &c->lg);
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        c->name = kinbox__strdup(s->name);
        c->msgid_spec = kinbox__strdup(s->message_id);
        take_settings(c, s);
        kinbox__hold_conf(c, conf);
        rd_kafka_conf_t *rkc = NULL;
        if (!c->name || !c->msgid_spec)
                goto oom;
        kinbox__dburl_t u;
        if (kinbox__dburl_parse(s->database_url, &u, errstr, sz))
                goto fail;
        kinbox__dburl_free(&u);
        if (parse_topics(c, s->topics, errstr, sz))
                goto fail;
        if (!kinbox_conf_get(conf, "kafka.bootstrap.servers")) {
                kinbox__errstr(errstr, sz,
                               "kafka.bootstrap.servers is not set");
                goto fail;
        }
        rkc = rd_kafka_conf_new();
        char e[256];
        /* kinbox's defaults first; the user's kafka.* may override them,
         * except the two that the exactly-once effect depends on.
         * Prefetch: once the consumer queue holds queued.min.messages,
         * librdkafka 2.0 stops fetching until something wakes its broker
         * threads (nudge_fetchers() does, once a quarter has drained).
         * 50,000 messages keep the consumer's memory bounded with any
         * backlog (the figures: docs/benchmarks.md).
         * Metadata every 30 s (librdkafka: 5 min): a subscribed topic
         * created after the start, or partitions added to one, are
         * consumed within 30 s, not 5 min (docs/kafka.md). */
        if (rd_kafka_conf_set(rkc, "auto.offset.reset", "earliest", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "topic.metadata.refresh.interval.ms",
                              "30000", e, sizeof(e)) ||
            rd_kafka_conf_set(rkc, "queued.max.messages.kbytes", "16384", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "queued.min.messages", "50000", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "group.id", s->group_id, e, sizeof(e)))
                goto kafka_fail;
        struct kafka_set_ctx ks = {rkc, errstr, sz, false};
        kinbox__conf_kafka_each(conf, kafka_set, &ks);
        if (ks.failed)
                goto fail;
        if (rd_kafka_conf_set(rkc, "enable.auto.offset.store", "false", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "enable.partition.eof", "false", e,
                              sizeof(e)))
                goto kafka_fail;
        rd_kafka_conf_set_opaque(rkc, c);
        rd_kafka_conf_set_log_cb(rkc, rk_log);
        rd_kafka_conf_set_rebalance_cb(rkc, rebalance_cb);
        c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, rkc, e, sizeof(e));
        if (!c->rk)
                goto kafka_fail;
        rkc = NULL; /* owned by rk now */
        rd_kafka_poll_set_consumer(c->rk);
        c->cq = rd_kafka_queue_get_consumer(c->rk);
        read_prefetch(c);
        if (kinbox__tracing_acquire(conf, &c->tracing, errstr, sz))
                goto fail;
        c->conf = conf;
        return c;
kafka_fail:
        kinbox__errstr(errstr, sz, "Kafka configuration: %s", e);
        goto fail;
oom:
        kinbox__errstr(errstr, sz, "out of memory");
fail:
        if (rkc)
                rd_kafka_conf_destroy(rkc);
        c->conf = NULL; /* the caller keeps it on failure */
        kinbox_consumer_destroy(c);
        return NULL;
}

kinbox_err_t
kinbox_consumer_set_handler(kinbox_consumer_t *c, kinbox_handler_fn fn,
                            void *opaque)
{
        if (atomic_load(&c->running))
                return KINBOX_ERR_STATE;
        c->handler = fn;
        c->batch_handler = NULL;
        c->opaque = opaque;
        return KINBOX_OK;
}

kinbox_err_t
kinbox_consumer_set_batch_handler(kinbox_consumer_t *c,
                                  kinbox_batch_handler_fn fn, void *opaque)
{
        if (atomic_load(&c->running))
                return KINBOX_ERR_STATE;
        c->batch_handler = fn;
        c->handler = NULL;
        c->opaque = opaque;
        return KINBOX_OK;
}

void
kinbox_consumer_stop(kinbox_consumer_t *c)
{
        if (c)
                atomic_store(&c->stopping, true);
}

void
kinbox_consumer_stats(const kinbox_consumer_t *c, kinbox_consumer_stats_t *o)
{
        o->processed = atomic_load(&c->st_processed);
        o->duplicates = atomic_load(&c->st_dup);
        o->business_duplicates = atomic_load(&c->st_bizdup);
        o->dead = atomic_load(&c->st_dead);
        o->retried = atomic_load(&c->st_retried);
        o->batches = atomic_load(&c->st_batches);
        o->rolled_back = atomic_load(&c->st_rolled_back);
}

const char *
kinbox_consumer_name(const kinbox_consumer_t *c)
{
        return c->name;
}

const char *
kinbox_consumer_errstr(const kinbox_consumer_t *c)
{
        return c->errstr;
}

static void
part_free(kinbox__part_t *p)
{
        kinbox_msg_t *m = p->head;
        while (m) {
                kinbox_msg_t *n = m->next;
                kinbox__msg_free(m);
                m = n;
        }
        kinbox__hold_free(p);
        if (p->w)
                kinbox__held_forget(p->w->c, p);
        free(p->topic);
        free(p);
}

void
kinbox_consumer_destroy(kinbox_consumer_t *c)
{
        if (!c)
                return;
        while (c->parts) {
                kinbox__part_t *n = c->parts->next;
                part_free(c->parts);
                c->parts = n;
        }
        if (c->cq)
                rd_kafka_queue_destroy(c->cq);
        c->cq = NULL;
        if (c->rk &&
            !kinbox__rk_destroy_bounded(
                c->rk,
                c->left_unclosed ? RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE : 0,
                "consumer_destroy_stall")) {
                /* librdkafka's threads may still call back with c (its
                 * log callback's opaque): c stays theirs. */
                kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer",
                            "%s: Kafka client did not shut down within %d "
                            "s (a librdkafka termination hang); leaving it "
                            "and this consumer's memory behind: offsets "
                            "are committed, nothing is lost",
                            c->name, KINBOX__RK_DESTROY_MS / 1000);
                kinbox__rk_abandon(c);
                return;
        }
        if (c->topics)
                rd_kafka_topic_partition_list_destroy(c->topics);
        kinbox__db_destroy(c->ctl);
        kinbox__tracing_release(c->tracing);
        pthread_mutex_destroy(&c->drain_lock);
        pthread_cond_destroy(&c->drained);
        pthread_mutex_destroy(&c->nudge_lock);
        pthread_cond_destroy(&c->nudge_cond);
        free(c->name);
        free(c->msgid_spec);
        free(c->hold_src);
        kinbox_conf_destroy(c->conf);
        free(c);
}

/* ------------------------------------------------------------------ */
/* database connections */

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

/* ------------------------------------------------------------------ */
/* main thread: partitions, rebalances, dispatch */

static unsigned
hash_tp(const char *topic, int32_t partition)
{
        unsigned h = 2166136261u;
        for (const char *s = topic; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h + (unsigned)partition;
}

static void
parts_add(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl)
{
        for (int i = 0; i < pl->cnt; i++) {
                rd_kafka_topic_partition_t *tp = &pl->elems[i];
                if (kinbox__part_find(c, tp->topic, tp->partition))
                        continue;
                kinbox__part_t *p = kinbox__calloc(1, sizeof(*p));
                if (!p || !(p->topic = kinbox__strdup(tp->topic))) {
                        free(p);
                        continue;
                }
                p->partition = tp->partition;
                p->w = &c->workers[hash_tp(tp->topic, tp->partition) %
                                   (unsigned)c->nworkers];
                p->hold_unknown = !kinbox__hold_load(c, c->ctl, p);
                /* Workers walk c->parts under their own lock. */
                for (int k = 0; k < c->nworkers; k++)
                        pthread_mutex_lock(&c->workers[k].lock);
                p->next = c->parts;
                c->parts = p;
                for (int k = 0; k < c->nworkers; k++)
                        pthread_mutex_unlock(&c->workers[k].lock);
        }
}

/* Finish batches touching pl, drop their queued messages, forget them. */
static void
parts_revoke(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl)
{
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_lock(&c->workers[k].lock);
        for (int i = 0; pl && i < pl->cnt; i++) {
                kinbox__part_t *p = kinbox__part_find(c, pl->elems[i].topic,
                                                      pl->elems[i].partition);
                if (p)
                        p->revoked = true;
        }
        if (!pl)
                for (kinbox__part_t *p = c->parts; p; p = p->next)
                        p->revoked = true;
        for (int k = 0; k < c->nworkers; k++) {
                kinbox__worker_t *w = &c->workers[k];
                pthread_cond_broadcast(&w->cond);
        }
        /* Wait for in-flight batches (which now skip revoked partitions). */
        for (int k = 0; k < c->nworkers; k++) {
                kinbox__worker_t *w = &c->workers[k];
                uint64_t seq = w->batch_seq;
                while (w->in_batch && w->batch_seq == seq && w->started)
                        pthread_cond_wait(&w->idle, &w->lock);
        }
        kinbox__part_t **pp = &c->parts;
        while (*pp) {
                kinbox__part_t *p = *pp;
                if (p->revoked) {
                        *pp = p->next;
                        p->w->queued -= p->count;
                        part_free(p);
                } else {
                        pp = &p->next;
                }
        }
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_unlock(&c->workers[k].lock);
}

/* How long an offset commit on a revoke or at shutdown may wait for the
 * coordinator's answer. A synchronous rd_kafka_commit() waits up to
 * socket.timeout.ms (60 s) for a coordinator that is moving or loaded,
 * longer than the 30 s shutdown watchdog of `kinbox run`; an unanswered
 * commit loses nothing (the next owner starts at the DB watermark). */
#define COMMIT_WAIT_MS 10000

/* rd_kafka_commit() of the stored offsets, bounded by COMMIT_WAIT_MS:
 * the result comes back on a queue of its own. RD_KAFKA_RESP_ERR__TIMED_OUT
 * when the coordinator did not answer in time. */
static rd_kafka_resp_err_t
commit_bounded(rd_kafka_t *rk)
{
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        if (!q)
                return rd_kafka_commit(rk, NULL, 0);
        rd_kafka_resp_err_t r = rd_kafka_commit_queue(rk, NULL, q, NULL, NULL);
        if (r) {
                rd_kafka_queue_destroy(q);
                return r;
        }
        r = RD_KAFKA_RESP_ERR__TIMED_OUT;
        int64_t end = kinbox__now_ms() + COMMIT_WAIT_MS;
        for (int64_t now = kinbox__now_ms(); now < end;
             now = kinbox__now_ms()) {
                rd_kafka_event_t *ev = rd_kafka_queue_poll(
                    q, (int)(end - now < 100 ? end - now : 100));
                if (!ev)
                        continue;
                bool done =
                    rd_kafka_event_type(ev) == RD_KAFKA_EVENT_OFFSET_COMMIT;
                if (done)
                        r = rd_kafka_event_error(ev);
                rd_kafka_event_destroy(ev);
                if (done)
                        break;
        }
        rd_kafka_queue_destroy(q);
        return r;
}

static void
rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
             rd_kafka_topic_partition_list_t *pl, void *opaque)
{
        kinbox_consumer_t *c = opaque;
        bool coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                            "%s: assigned %d partition(s)", c->name, pl->cnt);
                rd_kafka_topic_partition_list_t *ahead =
                    rd_kafka_topic_partition_list_new(4);
                rd_kafka_topic_partition_list_t *refuse =
                    rd_kafka_topic_partition_list_new(4);
                parts_add(c, pl);
                kinbox__startpos_assign(c, pl, ahead, refuse);
                if (coop) {
                        rd_kafka_error_t *e =
                            rd_kafka_incremental_assign(rk, pl);
                        if (e) {
                                kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer",
                                            "assign: %s",
                                            rd_kafka_error_string(e));
                                rd_kafka_error_destroy(e);
                        }
                } else {
                        rd_kafka_assign(rk, pl);
                }
                if (ahead->cnt) {
                        rd_kafka_resp_err_t se =
                            rd_kafka_offsets_store(rk, ahead);
                        if (se)
                                kinbox__log(&c->lg, KINBOX_LOG_DEBUG,
                                            "consumer",
                                            "storing start offsets: %s",
                                            rd_kafka_err2str(se));
                }
                rd_kafka_topic_partition_list_destroy(ahead);
                /* Refused partitions stay assigned, paused for good. */
                if (refuse->cnt)
                        rd_kafka_pause_partitions(rk, refuse);
                for (int i = 0; i < refuse->cnt; i++) {
                        kinbox__part_t *p =
                            kinbox__part_find(c, refuse->elems[i].topic,
                                              refuse->elems[i].partition);
                        if (p)
                                p->paused = true;
                }
                rd_kafka_topic_partition_list_destroy(refuse);
                kinbox__startpos_gauge(c);
                metrics_assignment(c, rk);
                return;
        }
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s: revoking %d partition(s)%s", c->name, pl->cnt,
                    err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS ? ""
                                                                : " (error)");
        if (c->workers)
                parts_revoke(c, coop ? pl : NULL);
        /* Commit what committed in the DB before letting go. */
        if (!rd_kafka_assignment_lost(rk)) {
                rd_kafka_resp_err_t ce = commit_bounded(rk);
                if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET)
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "offset commit on revoke: %s (the DB "
                                    "watermark covers it)",
                                    rd_kafka_err2str(ce));
        }
        if (coop) {
                rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, pl);
                if (e)
                        rd_kafka_error_destroy(e);
        } else {
                rd_kafka_assign(rk, NULL);
        }
        kinbox__startpos_gauge(c);
        metrics_assignment(c, rk);
}

static void
dispatch(kinbox_consumer_t *c, rd_kafka_message_t *rkm)
{
        const char *topic = rd_kafka_topic_name(rkm->rkt);
        kinbox__part_t *p = kinbox__part_find(c, topic, rkm->partition);
        if (!p) {
                /* Not ours (any more): it will be redelivered to the owner. */
                rd_kafka_message_destroy(rkm);
                return;
        }
        if (kinbox__startpos_take(c, p, rkm))
                return;
        kinbox_msg_t *m = kinbox__msg_alloc(rkm->payload, rkm->len);
        if (!m) {
                rd_kafka_message_destroy(rkm);
                return;
        }
        m->rkm = rkm;
        m->part = p;
        const void *payload = m->v.payload;
        kinbox__msgview_of(rkm, &m->v);
        m->v.payload = payload; /* the copy with its NUL */
        rd_kafka_timestamp_type_t tstype;
        m->ts = rd_kafka_message_timestamp(rkm, &tstype);
        char why[300];
        m->id = kinbox__msgid_extract(c->msgid_spec, &m->v, why, sizeof(why));
        if (!m->id)
                kinbox__msg_set_reason(m, why);
        if (c->tracing)
                kinbox__msg_trace_start(m);
        kinbox__worker_t *w = p->w;
        pthread_mutex_lock(&w->lock);
        if (p->tail)
                p->tail->next = m;
        else
                p->head = m;
        p->tail = m;
        p->count++;
        w->queued++;
        pthread_cond_signal(&w->cond);
        pthread_mutex_unlock(&w->lock);
}

/* Pause partitions of full workers or backing off; resume the others. */
static void
update_pauses(kinbox_consumer_t *c)
{
        rd_kafka_topic_partition_list_t *pause =
            rd_kafka_topic_partition_list_new(4);
        rd_kafka_topic_partition_list_t *resume =
            rd_kafka_topic_partition_list_new(4);
        int64_t now = kinbox__now_ms();
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_lock(&c->workers[k].lock);
        for (kinbox__part_t *p = c->parts; p; p = p->next) {
                kinbox__worker_t *w = p->w;
                bool want = p->refused || kinbox__part_backing_off(p, now) ||
                            (c->stalled && w->queued >= c->queue_max / 2);
                if (want && !p->paused)
                        rd_kafka_topic_partition_list_add(pause, p->topic,
                                                          p->partition);
                else if (!want && p->paused)
                        rd_kafka_topic_partition_list_add(resume, p->topic,
                                                          p->partition);
                p->paused = want;
        }
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_unlock(&c->workers[k].lock);
        if (pause->cnt)
                rd_kafka_pause_partitions(c->rk, pause);
        if (resume->cnt)
                rd_kafka_resume_partitions(c->rk, resume);
        rd_kafka_topic_partition_list_destroy(pause);
        rd_kafka_topic_partition_list_destroy(resume);
}

/* A full worker queue for this long pauses partitions (see drain_lock). */
#define STALL_PAUSE_MS 3000

static bool
workers_full(kinbox_consumer_t *c)
{
        bool full = false;
        for (int k = 0; k < c->nworkers && !full; k++) {
                kinbox__worker_t *w = &c->workers[k];
                pthread_mutex_lock(&w->lock);
                full = w->queued >= c->queue_max;
                pthread_mutex_unlock(&w->lock);
        }
        return full;
}

/*
 * Fetch nudge (polling thread). Once librdkafka's consumer queue reaches
 * queued.min.messages (or queued.max.messages.kbytes) its broker threads
 * stop fetching and, in librdkafka 2.0, look again only when something
 * else wakes them: up to a second later. Draining a full queue takes less
 * than that, so the workers starve for the rest of it. When the queue has
 * been full and has drained to three quarters, ask every partition
 * leader for its end offset (a ListOffsets request each): a request to a
 * broker wakes its thread, which then sees room and fetches at once.
 * Pausing and resuming would also wake them, but a resume throws away
 * what was prefetched. Kept on every librdkafka release: where the broker
 * threads wake by themselves, it costs one ListOffsets request per
 * partition leader each time a full queue has drained to three quarters.
 */
#define NUDGE_CHECK_MS 20

static void
nudge_fetchers(kinbox_consumer_t *c, int64_t now)
{
        if (!c->cq || now - c->last_nudge_check < NUDGE_CHECK_MS)
                return;
        c->last_nudge_check = now;
        double n = (double)rd_kafka_queue_length(c->cq);
        double fill = c->prefetch_msgs ? n / (double)c->prefetch_msgs : 0;
        if (c->prefetch_bytes > 0 && c->avg_bytes > 0) {
                double b = n * c->avg_bytes / c->prefetch_bytes;
                if (b > fill)
                        fill = b;
        }
        if (fill >= 0.9) {
                c->prefetch_full = true;
                return;
        }
        if (!c->prefetch_full || fill > 0.75)
                return;
        c->prefetch_full = false;
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "prefetch queue drained to %.0f messages: nudging the "
                    "fetchers",
                    n);
        pthread_mutex_lock(&c->nudge_lock);
        c->nudge_req = true;
        pthread_cond_signal(&c->nudge_cond);
        pthread_mutex_unlock(&c->nudge_lock);
}

/* The request may wait behind a fetch the broker holds for
 * fetch.wait.max.ms, so it runs here, not in the polling thread. */
static void *
nudger_main(void *arg)
{
        kinbox_consumer_t *c = arg;
        pthread_mutex_lock(&c->nudge_lock);
        for (;;) {
                while (!c->nudge_req && !c->nudge_stop)
                        pthread_cond_wait(&c->nudge_cond, &c->nudge_lock);
                if (c->nudge_stop)
                        break;
                c->nudge_req = false;
                pthread_mutex_unlock(&c->nudge_lock);
                rd_kafka_topic_partition_list_t *a = NULL;
                if (!rd_kafka_assignment(c->rk, &a) && a) {
                        for (int i = 0; i < a->cnt; i++)
                                a->elems[i].offset = RD_KAFKA_OFFSET_END;
                        if (a->cnt)
                                (void)rd_kafka_offsets_for_times(c->rk, a,
                                                                 500);
                        rd_kafka_topic_partition_list_destroy(a);
                }
                pthread_mutex_lock(&c->nudge_lock);
        }
        pthread_mutex_unlock(&c->nudge_lock);
        return NULL;
}

static void
nudger_stop(kinbox_consumer_t *c)
{
        if (!c->nudger_started)
                return;
        pthread_mutex_lock(&c->nudge_lock);
        c->nudge_stop = true;
        pthread_cond_signal(&c->nudge_cond);
        pthread_mutex_unlock(&c->nudge_lock);
        pthread_join(c->nudger, NULL);
        c->nudger_started = false;
}

/* Polling thread: true when it should hold off polling for now. */
static bool
hold_off(kinbox_consumer_t *c)
{
        if (!workers_full(c)) {
                if (c->full_since && kinbox__now_ms() - c->full_since > 50)
                        kinbox__log(
                            &c->lg, KINBOX_LOG_DEBUG, "consumer",
                            "held off polling for %lld ms",
                            (long long)(kinbox__now_ms() - c->full_since));
                c->full_since = 0;
                if (c->stalled) {
                        c->stalled = false;
                        atomic_store(&c->pause_dirty, true);
                }
                return false;
        }
        int64_t now = kinbox__now_ms();
        if (!c->full_since)
                c->full_since = now;
        if (now - c->full_since >= STALL_PAUSE_MS) {
                /* A long stall (database down, a partition backing off
                 * with a full queue): pause and keep polling so the group
                 * membership and rebalances go on. */
                if (!c->stalled) {
                        c->stalled = true;
                        atomic_store(&c->pause_dirty, true);
                }
                return false;
        }
        struct timespec ts;
        kinbox__deadline(20, &ts);
        pthread_mutex_lock(&c->drain_lock);
        pthread_cond_timedwait(&c->drained, &c->drain_lock, &ts);
        pthread_mutex_unlock(&c->drain_lock);
        return true;
}

static void
workers_stop(kinbox_consumer_t *c)
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

static void
workers_free(kinbox_consumer_t *c)
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
static kinbox_err_t
workers_start(kinbox_consumer_t *c)
{
        c->ctl = db_open(c, c->errstr, sizeof(c->errstr));
        if (!c->ctl)
                return KINBOX_ERR_CONFIG;
        if (kinbox__db_connect(c->ctl)) {
                snprintf(c->errstr, sizeof(c->errstr), "%s", c->ctl->err.msg);
                return KINBOX_ERR_DB_CONN;
        }
        int src = kinbox__schema_check_db(c->ctl, NULL, c->errstr,
                                          sizeof(c->errstr));
        if (!src)
                src = kinbox__partition_check(c->ctl,
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

/* One poll: hand a message to its worker; a fatal Kafka error ends the
 * run (KINBOX_ERR_KAFKA). */
static kinbox_err_t
poll_once(kinbox_consumer_t *c)
{
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(c->rk, 100);
        if (!rkm)
                return KINBOX_OK;
        if (!rkm->err) {
                double sz = (double)(rkm->len + rkm->key_len);
                c->avg_bytes =
                    c->avg_bytes > 0 ? 0.99 * c->avg_bytes + 0.01 * sz : sz;
                dispatch(c, rkm);
                return KINBOX_OK;
        }
        kinbox_err_t ret = KINBOX_OK;
        if (rkm->err == RD_KAFKA_RESP_ERR__FATAL) {
                char fe[256];
                rd_kafka_fatal_error(c->rk, fe, sizeof(fe));
                snprintf(c->errstr, sizeof(c->errstr), "fatal Kafka error: %s",
                         fe);
                ret = KINBOX_ERR_KAFKA;
        } else if ((rkm->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
                    rkm->err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC) &&
                   rkm->rkt) {
                /* Brokers that users run do not create topics for clients
                 * (auto.create.topics.enable = false), and kinbox never
                 * creates one: say which topic, and keep waiting for it. */
                kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer",
                            "%s: topic %s does not exist on the broker "
                            "(kinbox does not create topics): create it; "
                            "consuming starts once it exists",
                            c->name, rd_kafka_topic_name(rkm->rkt));
        } else {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "%s: Kafka: %s", c->name,
                            rd_kafka_message_errstr(rkm));
        }
        rd_kafka_message_destroy(rkm);
        return ret;
}

/* The polling thread's loop, until kinbox_consumer_stop(). */
static kinbox_err_t
poll_loop(kinbox_consumer_t *c)
{
        int64_t last_pause_check = 0;
        c->nudge_stop = false;
        c->nudge_req = false;
        if (pthread_create(&c->nudger, NULL, nudger_main, c) == 0)
                c->nudger_started = true;
        while (!atomic_load(&c->stopping)) {
                if (hold_off(c)) {
                        if (atomic_exchange(&c->pause_dirty, false))
                                update_pauses(c);
                        continue;
                }
                kinbox_err_t ret = poll_once(c);
                if (ret)
                        return ret;
                int64_t now = kinbox__now_ms();
                nudge_fetchers(c, now);
                if (atomic_exchange(&c->pause_dirty, false) ||
                    now - last_pause_check > 100) {
                        update_pauses(c);
                        last_pause_check = now;
                }
        }
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s: stopping: finishing batches in flight", c->name);
        return KINBOX_OK;
}

/* How long leaving the group may take at shutdown. librdkafka's close
 * waits for the revoke and the LeaveGroup answer, roughly up to
 * session.timeout.ms, longer when the group is rebalancing under broker
 * trouble; nothing of kinbox's depends on it (the offsets are committed, the
 * DB watermark covers them), so it is bounded well inside the 30 s shutdown
 * watchdog: the broker then drops the member after its session timeout. */
#define LEAVE_GROUP_MS 10000

/* One event of the close queue, destroyed here. The queue carries what the
 * consumer queue still held (prefetched messages, consumer errors) besides
 * the revoke: librdkafka 2.0's rd_kafka_queue_poll_callback() asserts on a
 * message (an op it cannot serve as a callback), so the close is served
 * with rd_kafka_queue_poll() and each event handled here. That is the
 * queue API's documented way on every release (2.8 included), so it is
 * not limited to 2.0. */
static void
close_event(kinbox_consumer_t *c, rd_kafka_event_t *ev)
{
        switch (rd_kafka_event_type(ev)) {
        case RD_KAFKA_EVENT_REBALANCE:
                rebalance_cb(c->rk, rd_kafka_event_error(ev),
                             rd_kafka_event_topic_partition_list(ev), c);
                break;
        case RD_KAFKA_EVENT_ERROR:
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "%s: leaving the group: Kafka: %s", c->name,
                            rd_kafka_event_error_string(ev));
                break;
        default:
                /* Prefetched messages (redelivered after the restart:
                 * their offsets were never stored), commit results. */
                break;
        }
        rd_kafka_event_destroy(ev);
}

/* rd_kafka_consumer_close(), bounded: the close runs in librdkafka's
 * background and its events (the revoke among them) are served here. */
static void
leave_group(kinbox_consumer_t *c)
{
        rd_kafka_queue_t *q = rd_kafka_queue_new(c->rk);
        rd_kafka_error_t *e =
            q ? rd_kafka_consumer_close_queue(c->rk, q) : NULL;
        if (!q || e) {
                if (e)
                        rd_kafka_error_destroy(e);
                if (q)
                        rd_kafka_queue_destroy(q);
                rd_kafka_consumer_close(c->rk);
                return;
        }
        int64_t end = kinbox__now_ms() + LEAVE_GROUP_MS;
        while (!rd_kafka_consumer_closed(c->rk)) {
                if (kinbox__now_ms() >= end) {
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "%s: leaving the group did not finish "
                                    "within %d s (the broker drops this "
                                    "member after session.timeout.ms)",
                                    c->name, LEAVE_GROUP_MS / 1000);
                        c->left_unclosed = true;
                        break;
                }
                rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 100);
                if (ev)
                        close_event(c, ev);
        }
        /* Events queued after the close finished: destroy them too (after
         * a timeout, rd_kafka_destroy() does). */
        rd_kafka_event_t *ev;
        while (!c->left_unclosed && (ev = rd_kafka_queue_poll(q, 0)))
                close_event(c, ev);
        rd_kafka_queue_destroy(q);
}

/* Finish the batches in flight, commit offsets, leave the group. */
static void
shutdown_all(kinbox_consumer_t *c)
{
        nudger_stop(c);
        if (c->workers)
                workers_stop(c);
        if (c->rk) {
                rd_kafka_resp_err_t ce = commit_bounded(c->rk);
                if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET &&
                    ce != RD_KAFKA_RESP_ERR__STATE)
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "final offset commit: %s",
                                    rd_kafka_err2str(ce));
                leave_group(c);
        }
        while (c->parts) {
                kinbox__part_t *n = c->parts->next;
                part_free(c->parts);
                c->parts = n;
        }
        workers_free(c);
}

kinbox_err_t
kinbox_consumer_run(kinbox_consumer_t *c)
{
        if (!c->handler && !c->batch_handler) {
                snprintf(c->errstr, sizeof(c->errstr),
                         "no handler registered");
                return KINBOX_ERR_STATE;
        }
        if (atomic_exchange(&c->running, true))
                return KINBOX_ERR_STATE;
        char alab[300];
        kinbox__m_set("kinbox_consumer_assigned_partitions",
                      kinbox__m_labels(alab, sizeof(alab), "consumer", c->name,
                                       (char *)NULL),
                      -1);
        kinbox__m_set("kinbox_consumer_partitions_refused", alab, 0);
        kinbox__held_gauge(c);
        kinbox_err_t ret = workers_start(c);
        if (!ret) {
                rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, c->topics);
                if (e) {
                        snprintf(c->errstr, sizeof(c->errstr), "subscribe: %s",
                                 rd_kafka_err2str(e));
                        ret = KINBOX_ERR_KAFKA;
                }
        }
        if (!ret) {
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                            "%s: running (group %s, %d worker(s), batch.max "
                            "%zu)",
                            c->name, kinbox__settings_of(c->conf)->group_id,
                            c->nworkers, c->batch_max);
                ret = poll_loop(c);
        }
        shutdown_all(c);
        if (ret)
                kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer", "%s: %s",
                            c->name, c->errstr);
        else
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer", "%s: stopped",
                            c->name);
        atomic_store(&c->running, false);
        return ret;
}
