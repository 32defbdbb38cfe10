/*
 * consumer_rebalance.c -- the consumer's partitions as the group assigns
 * and revokes them: an assignment adds them to the table (their holds
 * read, hold.c) and sets where each starts (consumer_startpos.c); a
 * revoke lets the batches in flight finish, drops what was queued and
 * commits the offsets stored before letting go; at shutdown the last
 * commit and leaving the group, both bounded.
 */

#include "consumer_int.h"
#include "held.h"
#include "hold.h"
#include "internal.h"
#include "metrics.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Metrics: partitions assigned now (after a rebalance callback), counted
 * in the consumer's own partition table (the polling thread's, which runs
 * the callback). Never rd_kafka_assignment(): it waits for librdkafka's
 * main thread, and during the close (close_event()) that wait never ends
 * (kinbox run's shutdown then hit its 30 s watchdog: rebalance::storm). */
static void
metrics_assignment(kinbox_consumer_t *c)
{
        char lb[300];
        int n = 0;
        for (const kinbox__part_t *p = c->parts; p; p = p->next)
                n++;
        kinbox__m_set("kinbox_consumer_assigned_partitions",
                      kinbox__m_labels(lb, sizeof(lb), "consumer", c->name,
                                       (char *)NULL),
                      n);
}

static unsigned
hash_tp(const char *topic, int32_t partition)
{
        unsigned h = 2166136261u;
        for (const char *s = topic; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h + (unsigned)partition;
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
kinbox__parts_free(kinbox_consumer_t *c)
{
        while (c->parts) {
                kinbox__part_t *n = c->parts->next;
                part_free(c->parts);
                c->parts = n;
        }
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
                p->hold_unknown = !kinbox__hold_load(c, c->grp.ctl, p);
                /* Workers walk c->parts under their own lock. */
                kinbox__workers_lock(c);
                p->next = c->parts;
                c->parts = p;
                kinbox__workers_unlock(c);
        }
}

/* Finish batches touching pl, drop their queued messages, forget them. */
static void
parts_revoke(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl)
{
        kinbox__workers_lock(c);
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
        kinbox__workers_unlock(c);
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

/* An assignment: the partitions join the table (their holds read), each
 * one's start is set (consumer_startpos.c), refused ones stay assigned,
 * paused for good. */
static void
assign(kinbox_consumer_t *c, rd_kafka_t *rk,
       rd_kafka_topic_partition_list_t *pl, bool coop)
{
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s: assigned %d partition(s)", c->name, pl->cnt);
        rd_kafka_topic_partition_list_t *ahead =
            rd_kafka_topic_partition_list_new(4);
        rd_kafka_topic_partition_list_t *refuse =
            rd_kafka_topic_partition_list_new(4);
        parts_add(c, pl);
        kinbox__startpos_assign(c, pl, ahead, refuse);
        if (coop) {
                rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, pl);
                if (e) {
                        kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer",
                                    "assign: %s", rd_kafka_error_string(e));
                        rd_kafka_error_destroy(e);
                }
        } else {
                rd_kafka_assign(rk, pl);
        }
        if (ahead->cnt) {
                rd_kafka_resp_err_t se = rd_kafka_offsets_store(rk, ahead);
                if (se)
                        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                                    "storing start offsets: %s",
                                    rd_kafka_err2str(se));
        }
        rd_kafka_topic_partition_list_destroy(ahead);
        /* Refused partitions stay assigned, paused for good. */
        if (refuse->cnt)
                rd_kafka_pause_partitions(rk, refuse);
        for (int i = 0; i < refuse->cnt; i++) {
                kinbox__part_t *p = kinbox__part_find(
                    c, refuse->elems[i].topic, refuse->elems[i].partition);
                if (p)
                        p->paused = true;
        }
        rd_kafka_topic_partition_list_destroy(refuse);
}

/* A revoke: the batches in flight finish, what was queued is dropped,
 * the offsets stored are committed before letting go. */
static void
revoke(kinbox_consumer_t *c, rd_kafka_t *rk, rd_kafka_resp_err_t err,
       rd_kafka_topic_partition_list_t *pl, bool coop)
{
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
}

void
kinbox__rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                     rd_kafka_topic_partition_list_t *pl, void *opaque)
{
        kinbox_consumer_t *c = opaque;
        bool coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
                assign(c, rk, pl, coop);
        else
                revoke(c, rk, err, pl, coop);
        kinbox__startpos_gauge(c);
        metrics_assignment(c);
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
                kinbox__rebalance_cb(c->rk, rd_kafka_event_error(ev),
                                     rd_kafka_event_topic_partition_list(ev),
                                     c);
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
                        c->grp.left_unclosed = true;
                        break;
                }
                rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 100);
                if (ev)
                        close_event(c, ev);
        }
        /* Events queued after the close finished: destroy them too (after
         * a timeout, rd_kafka_destroy() does). */
        rd_kafka_event_t *ev;
        while (!c->grp.left_unclosed && (ev = rd_kafka_queue_poll(q, 0)))
                close_event(c, ev);
        rd_kafka_queue_destroy(q);
}

/* At shutdown, after the workers stopped: commit the stored offsets,
 * then leave the group. */
void
kinbox__group_leave(kinbox_consumer_t *c)
{
        rd_kafka_resp_err_t ce = commit_bounded(c->rk);
        if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET &&
            ce != RD_KAFKA_RESP_ERR__STATE)
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "final offset commit: %s", rd_kafka_err2str(ce));
        leave_group(c);
}
