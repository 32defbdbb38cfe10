/*
 * consumer_poll.c -- the polling thread: poll librdkafka, hand each
 * message to the worker owning its partition (dispatch), hold off while a
 * worker's queue is full (backpressure: pausing partitions only after a
 * long stall), and wake librdkafka's fetchers once its full queue drained
 * (the fetch nudge).
 */

#include "consumer_int.h"
#include "internal.h"
#include "msgid.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        kinbox__workers_lock(c);
        for (kinbox__part_t *p = c->parts; p; p = p->next) {
                kinbox__worker_t *w = p->w;
                bool want =
                    p->refused || kinbox__part_backing_off(p, now) ||
                    (c->poll.stalled && w->queued >= c->poll.queue_max / 2);
                if (want && !p->paused)
                        rd_kafka_topic_partition_list_add(pause, p->topic,
                                                          p->partition);
                else if (!want && p->paused)
                        rd_kafka_topic_partition_list_add(resume, p->topic,
                                                          p->partition);
                p->paused = want;
        }
        kinbox__workers_unlock(c);
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
                full = w->queued >= c->poll.queue_max;
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

void
kinbox__poll_prefetch(kinbox_consumer_t *c)
{
        c->poll.cq = rd_kafka_queue_get_consumer(c->rk);
        const rd_kafka_conf_t *rc = rd_kafka_conf(c->rk);
        char v[64];
        size_t vl = sizeof(v);
        if (rd_kafka_conf_get(rc, "queued.min.messages", v, &vl) ==
            RD_KAFKA_CONF_OK)
                c->poll.prefetch_msgs = (size_t)strtoull(v, NULL, 10);
        vl = sizeof(v);
        if (rd_kafka_conf_get(rc, "queued.max.messages.kbytes", v, &vl) ==
            RD_KAFKA_CONF_OK)
                c->poll.prefetch_bytes = 1024.0 * strtod(v, NULL);
}

static void
nudge_fetchers(kinbox_consumer_t *c, int64_t now)
{
        if (!c->poll.cq || now - c->poll.last_nudge_check < NUDGE_CHECK_MS)
                return;
        c->poll.last_nudge_check = now;
        double n = (double)rd_kafka_queue_length(c->poll.cq);
        double fill =
            c->poll.prefetch_msgs ? n / (double)c->poll.prefetch_msgs : 0;
        if (c->poll.prefetch_bytes > 0 && c->poll.avg_bytes > 0) {
                double b = n * c->poll.avg_bytes / c->poll.prefetch_bytes;
                if (b > fill)
                        fill = b;
        }
        if (fill >= 0.9) {
                c->poll.prefetch_full = true;
                return;
        }
        if (!c->poll.prefetch_full || fill > 0.75)
                return;
        c->poll.prefetch_full = false;
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "prefetch queue drained to %.0f messages: nudging the "
                    "fetchers",
                    n);
        pthread_mutex_lock(&c->poll.nudge_lock);
        c->poll.nudge_req = true;
        pthread_cond_signal(&c->poll.nudge_cond);
        pthread_mutex_unlock(&c->poll.nudge_lock);
}

/* The request may wait behind a fetch the broker holds for
 * fetch.wait.max.ms, so it runs here, not in the polling thread. */
static void *
nudger_main(void *arg)
{
        kinbox_consumer_t *c = arg;
        pthread_mutex_lock(&c->poll.nudge_lock);
        for (;;) {
                while (!c->poll.nudge_req && !c->poll.nudge_stop)
                        pthread_cond_wait(&c->poll.nudge_cond,
                                          &c->poll.nudge_lock);
                if (c->poll.nudge_stop)
                        break;
                c->poll.nudge_req = false;
                pthread_mutex_unlock(&c->poll.nudge_lock);
                rd_kafka_topic_partition_list_t *a = NULL;
                if (!rd_kafka_assignment(c->rk, &a) && a) {
                        for (int i = 0; i < a->cnt; i++)
                                a->elems[i].offset = RD_KAFKA_OFFSET_END;
                        if (a->cnt)
                                (void)rd_kafka_offsets_for_times(c->rk, a,
                                                                 500);
                        rd_kafka_topic_partition_list_destroy(a);
                }
                pthread_mutex_lock(&c->poll.nudge_lock);
        }
        pthread_mutex_unlock(&c->poll.nudge_lock);
        return NULL;
}

void
kinbox__nudger_stop(kinbox_consumer_t *c)
{
        if (!c->poll.nudger_started)
                return;
        pthread_mutex_lock(&c->poll.nudge_lock);
        c->poll.nudge_stop = true;
        pthread_cond_signal(&c->poll.nudge_cond);
        pthread_mutex_unlock(&c->poll.nudge_lock);
        pthread_join(c->poll.nudger, NULL);
        c->poll.nudger_started = false;
}

/* Polling thread: true when it should hold off polling for now. */
static bool
hold_off(kinbox_consumer_t *c)
{
        if (!workers_full(c)) {
                if (c->poll.full_since &&
                    kinbox__now_ms() - c->poll.full_since > 50)
                        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                                    "held off polling for %lld ms",
                                    (long long)(kinbox__now_ms() -
                                                c->poll.full_since));
                c->poll.full_since = 0;
                if (c->poll.stalled) {
                        c->poll.stalled = false;
                        atomic_store(&c->pause_dirty, true);
                }
                return false;
        }
        int64_t now = kinbox__now_ms();
        if (!c->poll.full_since)
                c->poll.full_since = now;
        if (now - c->poll.full_since >= STALL_PAUSE_MS) {
                /* A long stall (database down, a partition backing off
                 * with a full queue): pause and keep polling so the group
                 * membership and rebalances go on. */
                if (!c->poll.stalled) {
                        c->poll.stalled = true;
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
                c->poll.avg_bytes = c->poll.avg_bytes > 0
                                        ? 0.99 * c->poll.avg_bytes + 0.01 * sz
                                        : sz;
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
kinbox_err_t
kinbox__poll_loop(kinbox_consumer_t *c)
{
        int64_t last_pause_check = 0;
        c->poll.nudge_stop = false;
        c->poll.nudge_req = false;
        if (pthread_create(&c->poll.nudger, NULL, nudger_main, c) == 0)
                c->poll.nudger_started = true;
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
