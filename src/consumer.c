/*
 * consumer.c -- the inbox consumer: its API, settings and lifecycle (new,
 * run, shutdown, destroy). The stages: consumer_poll.c (poll, dispatch,
 * backpressure, fetch nudge), consumer_rebalance.c (assign with
 * watermarks and holds, consumer_startpos.c; revoke with drain and
 * commit; leaving the group), consumer_worker.c (workers), batch.c.
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
#include "kafka.h"
#include "metrics.h"
#include "rkdestroy.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
rk_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        kinbox_consumer_t *c = rd_kafka_opaque(rk);
        if (c)
                kinbox__log(&c->lg, level, "rdkafka", "%s: %s", fac, buf);
}

static kinbox_err_t
parse_topics(kinbox_consumer_t *c, const char *topics, char *errstr, size_t sz)
{
        c->grp.topics = rd_kafka_topic_partition_list_new(4);
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
                            c->grp.topics, t, RD_KAFKA_PARTITION_UA);
                }
                p += n + (p[n] ? 1 : 0);
        }
        if (!c->grp.topics->cnt) {
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
        c->poll.queue_max = (size_t)s->queue_max_messages;
        c->retry_max = s->retry_max;
        c->backoff_base = s->retry_backoff_base_ms;
        c->backoff_max = s->retry_backoff_max_ms;
        c->reconnect_max = s->reconnect_backoff_max_ms;
        if (c->poll.queue_max < c->batch_max)
                c->poll.queue_max = c->batch_max;
}

/* The consumer's librdkafka handle (c->rk). kinbox's defaults first; the
 * user's kafka.* may override them, except the two that the
 * exactly-once effect depends on.
 * Prefetch: once the consumer queue holds queued.min.messages, librdkafka
 * 2.0 stops fetching until something wakes its broker threads
 * (consumer_poll.c's fetch nudge does, once a quarter has drained).
 * 50,000 messages keep the consumer's memory bounded with any backlog
 * (the figures: docs/benchmarks.md).
 * Metadata every 30 s (librdkafka: 5 min): a subscribed topic created
 * after the start, or partitions added to one, are consumed within 30 s,
 * not 5 min (docs/kafka.md). */
static bool
kafka_open(kinbox_consumer_t *c, const kinbox_conf_t *conf,
           const kinbox__settings_t *s, char *errstr, size_t sz)
{
        const char *const defaults[] = {"auto.offset.reset",
                                        "earliest",
                                        "topic.metadata.refresh.interval.ms",
                                        "30000",
                                        "queued.max.messages.kbytes",
                                        "16384",
                                        "queued.min.messages",
                                        "50000",
                                        "group.id",
                                        s->group_id,
                                        NULL};
        static const char *const forced[] = {"enable.auto.offset.store",
                                             "false", "enable.partition.eof",
                                             "false", NULL};
        const kinbox__rkconf_spec_t spec = {defaults, NULL, forced};
        rd_kafka_conf_t *rkc = kinbox__rkconf_new(conf, &spec, errstr, sz);
        if (!rkc)
                return false;
        rd_kafka_conf_set_opaque(rkc, c);
        rd_kafka_conf_set_log_cb(rkc, rk_log);
        rd_kafka_conf_set_rebalance_cb(rkc, kinbox__rebalance_cb);
        char e[256];
        c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, rkc, e, sizeof(e));
        if (!c->rk) {
                kinbox__errstr(errstr, sz, "Kafka configuration: %s", e);
                rd_kafka_conf_destroy(rkc);
                return false;
        }
        return true;
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
        pthread_mutex_init(&c->poll.nudge_lock, NULL);
        pthread_cond_init(&c->poll.nudge_cond, NULL);
        kinbox__conf_logger(conf, &c->lg);
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        c->name = kinbox__strdup(s->name);
        c->msgid_spec = kinbox__strdup(s->message_id);
        take_settings(c, s);
        kinbox__hold_conf(c, conf);
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
        if (!kafka_open(c, conf, s, errstr, sz))
                goto fail;
        rd_kafka_poll_set_consumer(c->rk);
        kinbox__poll_prefetch(c);
        if (kinbox__tracing_acquire(conf, &c->tracing, errstr, sz))
                goto fail;
        c->conf = conf;
        return c;
oom:
        kinbox__errstr(errstr, sz, "out of memory");
fail:
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

void
kinbox_consumer_destroy(kinbox_consumer_t *c)
{
        if (!c)
                return;
        kinbox__parts_free(c);
        if (c->poll.cq)
                rd_kafka_queue_destroy(c->poll.cq);
        c->poll.cq = NULL;
        if (c->rk &&
            !kinbox__rk_destroy_bounded(
                c->rk,
                c->grp.left_unclosed ? RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE
                                     : 0,
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
        if (c->grp.topics)
                rd_kafka_topic_partition_list_destroy(c->grp.topics);
        kinbox__db_destroy(c->grp.ctl);
        kinbox__tracing_release(c->tracing);
        pthread_mutex_destroy(&c->drain_lock);
        pthread_cond_destroy(&c->drained);
        pthread_mutex_destroy(&c->poll.nudge_lock);
        pthread_cond_destroy(&c->poll.nudge_cond);
        free(c->name);
        free(c->msgid_spec);
        free(c->hold_src);
        kinbox_conf_destroy(c->conf);
        free(c);
}

/* Finish the batches in flight, commit offsets, leave the group. */
static void
shutdown_all(kinbox_consumer_t *c)
{
        kinbox__nudger_stop(c);
        if (c->workers)
                kinbox__workers_stop(c);
        if (c->rk)
                kinbox__group_leave(c);
        kinbox__parts_free(c);
        kinbox__workers_free(c);
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
        kinbox_err_t ret = kinbox__workers_start(c);
        if (!ret) {
                rd_kafka_resp_err_t e =
                    rd_kafka_subscribe(c->rk, c->grp.topics);
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
                ret = kinbox__poll_loop(c);
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
