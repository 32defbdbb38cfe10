/*
 * batch.c -- one batch in one transaction (docs/failures.md): BEGIN and
 * the inbox insert, the walk over its groups (batch_walk.c, running the
 * handlers in batch_run.c), the epilogue (inbox rows of cut messages,
 * watermarks), COMMIT, the offset store, popping the committed messages;
 * reconnects and backoff between attempts.
 */
#include "batch_int.h"
#include "held.h"
#include "hold.h"
#include "metrics.h"
#include "settings.h"
#include "startpos.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Metrics: the consumer's counters as absolute values (they are
 * cumulative since kinbox_consumer_new()). */
static void
metrics_stats(kinbox_consumer_t *c)
{
        static const char *const res[] = {
            "processed", "duplicate", "business_duplicate", "dead", "retried",
            "parked",    "released"};
        uint64_t v[7] = {
            atomic_load(&c->st_processed), atomic_load(&c->st_dup),
            atomic_load(&c->st_bizdup),    atomic_load(&c->st_dead),
            atomic_load(&c->st_retried),   atomic_load(&c->st_parked),
            atomic_load(&c->st_released)};
        char l[300];
        for (int i = 0; i < (c->hold_on ? 7 : 5); i++)
                kinbox__m_set("kinbox_consumer_messages_total",
                              kinbox__m_labels(l, sizeof(l), "consumer",
                                               c->name, "result", res[i],
                                               (char *)NULL),
                              (double)v[i]);
        kinbox__m_labels(l, sizeof(l), "consumer", c->name, (char *)NULL);
        kinbox__m_set("kinbox_consumer_batches_total", l,
                      (double)atomic_load(&c->st_batches));
        kinbox__m_set("kinbox_consumer_rollbacks_total", l,
                      (double)atomic_load(&c->st_rolled_back));
}

/* Offsets for the committed prefix of each partition in the batch. */
static void
store_offsets(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(4);
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                if (ru->state == KINBOX__MSG_CUT)
                        continue;
                rd_kafka_topic_partition_t *tp =
                    rd_kafka_topic_partition_list_find(l, m->part->topic,
                                                       m->part->partition);
                if (!tp)
                        tp = rd_kafka_topic_partition_list_add(
                            l, m->part->topic, m->part->partition);
                if (m->rkm->offset + 1 > tp->offset)
                        tp->offset = m->rkm->offset + 1;
        }
        for (int i = 0; i < l->cnt; i++) {
                /* Lag from the cached high watermark (no broker call). */
                int64_t lo = 0, hi = 0;
                char lb[400], pn[16];
                snprintf(pn, sizeof(pn), "%" PRId32, l->elems[i].partition);
                if (!rd_kafka_get_watermark_offsets(c->rk, l->elems[i].topic,
                                                    l->elems[i].partition, &lo,
                                                    &hi) &&
                    hi >= 0)
                        kinbox__m_set("kinbox_consumer_lag",
                                      kinbox__m_labels(
                                          lb, sizeof(lb), "consumer", c->name,
                                          "topic", l->elems[i].topic,
                                          "partition", pn, (char *)NULL),
                                      (double)(hi > l->elems[i].offset
                                                   ? hi - l->elems[i].offset
                                                   : 0));
        }
        if (l->cnt) {
                rd_kafka_resp_err_t e = rd_kafka_offsets_store(c->rk, l);
                if (e)
                        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                                    "offset store: %s (partition no longer "
                                    "assigned; the DB watermark covers it)",
                                    rd_kafka_err2str(e));
        }
        rd_kafka_topic_partition_list_destroy(l);
}

static int
queue_watermarks(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        /* Walk backwards: the first message seen of a partition is its last
         * committed one. A batch spans few partitions; a short list does. */
        kinbox__part_t *seen[64];
        size_t nseen = 0;
        for (size_t i = b->nmsgs; i-- > 0;) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                if (ru->state == KINBOX__MSG_CUT)
                        continue;
                bool dup = false;
                for (size_t k = 0; k < nseen && !dup; k++)
                        dup = seen[k] == m->part;
                if (dup)
                        continue;
                if (nseen < KINBOX__ARRAY_SIZE(seen)) {
                        seen[nseen++] = m->part;
                } else {
                        /* Very many partitions: fall back to a scan. */
                        bool later = false;
                        for (size_t j = i + 1; j < b->nmsgs && !later; j++)
                                later = b->msgs[j]->part == m->part &&
                                        b->run[j].state != KINBOX__MSG_CUT;
                        if (later)
                                continue;
                }
                /* With the identity of the record at W-1 (this one): on
                 * the next assignment the consumer reads it again to see
                 * that the log is the one these effects came from. */
                char part[16], off[24], ts[24], hash[24];
                snprintf(part, sizeof(part), "%" PRId32, m->rkm->partition);
                snprintf(off, sizeof(off), "%" PRId64, m->rkm->offset + 1);
                snprintf(ts, sizeof(ts), "%" PRId64, m->ts);
                snprintf(hash, sizeof(hash), "%" PRId64,
                         (int64_t)kinbox__record_hash(
                             m->rkm->key, m->rkm->key_len, m->rkm->payload,
                             m->rkm->len));
                kinbox__param_t p[6] = {
                    {c->name, 0, 0}, {m->part->topic, 0, 0},
                    {part, 0, 0},    {off, 0, 0},
                    {ts, 0, 0},      {hash, 0, 0}};
                int rc = b->db->ops->exec(
                    b->db, b->db->ops->sql->offsets_upsert, 6, p, -1);
                if (rc)
                        return rc;
        }
        return KINBOX_OK;
}

/* Statements after the walk: the inbox rows of messages cut from this
 * transaction go (they run again later), then the watermarks. */
static int
queue_epilogue(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                if (ru->state != KINBOX__MSG_CUT || !ru->inserted)
                        continue;
                /* Only this delivery's rows: another delivery of the id
                 * may have a row in another range (db/inbox.c). */
                char part[16], off[24];
                snprintf(part, sizeof(part), "%d", (int)m->rkm->partition);
                snprintf(off, sizeof(off), "%lld", (long long)m->rkm->offset);
                kinbox__param_t p[5] = {{c->name, 0, 0},
                                        {m->id, 0, 0},
                                        {m->part->topic, 0, 0},
                                        {part, 0, 0},
                                        {off, 0, 0}};
                int rc = b->db->ops->exec(
                    b->db,
                    "DELETE FROM kinbox_inbox WHERE consumer = $1 AND "
                    "message_id = $2 AND topic = $3 AND kafka_partition = "
                    "$4 AND kafka_offset = $5",
                    5, p, -1);
                if (rc)
                        return rc;
        }
        return queue_watermarks(b);
}

/* Counters and logs for a committed batch. */
static void
batch_committed(kinbox__batch_t *b, const char *mlab, int64_t t_begin)
{
        kinbox_consumer_t *c = b->c;
        size_t done = 0, dups = 0, biz = 0, dead = 0, parked = 0;
        char tn[48];
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                switch (ru->state) {
                case KINBOX__MSG_RUN:
                        if (ru->dup_ok)
                                biz++;
                        else
                                done++;
                        break;
                case KINBOX__MSG_DUP:
                        dups++;
                        break;
                case KINBOX__MSG_BIZDUP:
                        biz++;
                        break;
                case KINBOX__MSG_PARK:
                        parked++;
                        break;
                case KINBOX__MSG_DEAD:
                        dead++;
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "%s [%" PRId32 "] offset %" PRId64
                                    "%s dead-lettered: %s",
                                    m->part->topic, m->rkm->partition,
                                    m->rkm->offset,
                                    kinbox__msg_trace_note(m, tn), m->reason);
                        break;
                default:
                        break;
                }
        }
        atomic_fetch_add(&c->st_processed, done);
        atomic_fetch_add(&c->st_dup, dups);
        atomic_fetch_add(&c->st_bizdup, biz);
        atomic_fetch_add(&c->st_dead, dead);
        atomic_fetch_add(&c->st_parked, parked);
        atomic_fetch_add(&c->st_batches, 1);
        kinbox__m_observe("kinbox_consumer_batch_size", mlab,
                          (double)(done + dups + biz + dead + parked));
        kinbox__m_observe("kinbox_consumer_transaction_seconds", mlab,
                          (double)(kinbox__now_ms() - t_begin) / 1000.0);
        /* Once per transaction: the metrics lock is process-wide. */
        kinbox__m_observe("kinbox_handler_seconds", mlab,
                          (double)b->handler_us / 1e6);
        if (c->tracing)
                kinbox__consume_spans(b);
}

/* BEGIN and the inbox insert: which messages of the batch are new. */
static int
begin_batch(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        size_t n = 0;
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                ru->inserted = false;
                if (ru->state == KINBOX__MSG_CUT || !m->id)
                        continue;
                b->rows[n++] = (kinbox__inbox_row_t){m->id, m->part->topic,
                                                     m->rkm->partition,
                                                     m->rkm->offset, m->ts};
        }
        b->attr.nnone = 0;
        b->attr.ndrops = 0;
        /* exec_values() rows may be dropped (not with held keys: a
         * follower of the dropped message's key may be in the call). */
        b->attr.drop_rows = c->batch_handler && !c->handler && !c->hold_on;
        b->handler_us = 0;
        /* A conversion by kinbox migrate is seen within 10 s. */
        int rc = kinbox__inbox_layout_load(
            db, kinbox__settings_of(c->conf)->inbox_partition_width, false);
        if (!rc)
                rc = kinbox__db_begin(db, &b->attr);
        if (!rc && n)
                rc = db->ops->inbox_insert(db, c->name, n, b->rows, b->is_new);
        /* Rows a conversion kept without their record's time. */
        if (!rc && n)
                rc = kinbox__inbox_legacy(db, c->name, b->rows, n, b->is_new);
        if (rc)
                return rc;
        size_t k = 0;
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                if (ru->state == KINBOX__MSG_CUT || !m->id)
                        continue;
                ru->inserted = b->is_new[k++];
                if (!ru->inserted && (ru->state == KINBOX__MSG_RUN ||
                                      ru->state == KINBOX__MSG_PARK))
                        ru->state = KINBOX__MSG_DUP;
                else if (ru->inserted && ru->state == KINBOX__MSG_DUP)
                        /* its twin was cut this time */
                        ru->state = KINBOX__MSG_RUN;
        }
        return KINBOX_OK;
}

/* After COMMIT: what the backend noted of the batch's claims, the keys its
 * dead letters hold now, its held partitions that went through. */
static void
batch_settled(kinbox__batch_t *b)
{
        /* kinbox_tx_exec_claim() statements that found the key taken. */
        for (size_t k = 0; k < b->attr.nnone; k++) {
                size_t i = (size_t)KINBOX__TAG_LOW(b->attr.none_tags[k]);
                if (i < b->nmsgs && b->run[i].state == KINBOX__MSG_RUN)
                        b->run[i].dup_ok = true;
        }
        b->attr.nnone = 0;
        if (b->hold_dead)
                kinbox__hold_committed(b);
        /* A held partition whose messages all committed is free. */
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox__part_t *p = b->msgs[i]->part;
                bool cut = false;
                for (size_t j = i; p->held && j < b->nmsgs && !cut; j++)
                        cut = b->msgs[j]->part == p &&
                              b->run[j].state == KINBOX__MSG_CUT;
                if (p->held && !cut)
                        kinbox__held_release(b->c, p);
        }
}

/* One attempt at the batch in one transaction. */
static enum run_rc
run_once(kinbox__batch_t *b)
{
        kinbox_tx_t *tx = b->tx;
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        bool any = false;
        for (size_t i = 0; i < b->nmsgs; i++)
                if (b->run[i].state != KINBOX__MSG_CUT)
                        any = true;
        if (!any)
                return RUN_DONE;
        char mlab[300];
        kinbox__m_labels(mlab, sizeof(mlab), "consumer", c->name,
                         (char *)NULL);
        int64_t t_begin = kinbox__now_ms();
        int64_t t_begin_us = kinbox__now_us();
        kinbox__batch_walk_init(b);
        walk_t *wk = &b->wk;
        kinbox__tx_clear_ukeys(tx);
        failure_t f;
        if (begin_batch(b)) {
                f = kinbox__batch_failure_of(b, &db->err);
                wk->iso = false; /* no savepoint yet: run it again */
                return kinbox__batch_recover(b, &f);
        }
        int64_t t_inbox = kinbox__now_us();
        enum run_rc rc = kinbox__batch_walk(b);
        if (rc != RUN_DONE)
                return rc;
        int64_t t_handlers = kinbox__now_us();
        if (queue_epilogue(b)) {
                f = kinbox__batch_failure_of(b, &db->err);
                /* The walk is over: a RUN_AGAIN out of here must leave no
                 * transaction open (run_once() begins a new one). */
                wk->iso = false;
                return kinbox__batch_recover(b, &f);
        }
        if (kinbox__fault("before_commit")) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "fault",
                            "before_commit: SIGKILL");
                raise(SIGKILL);
        }
        if (db->ops->commit(db)) {
                f = kinbox__batch_failure_of(b, &db->err);
                wk->iso = false; /* the transaction is gone: run it again */
                return kinbox__batch_recover(b, &f);
        }
        int64_t t_commit = kinbox__now_us();
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "worker %d: batch of %zu: inbox %lld us, handlers %lld "
                    "us, commit %lld us",
                    b->w->idx, b->nmsgs, (long long)(t_inbox - t_begin_us),
                    (long long)(t_handlers - t_inbox),
                    (long long)(t_commit - t_handlers));
        if (kinbox__fault("after_commit")) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "fault",
                            "after_commit: SIGKILL before the offset store");
                raise(SIGKILL);
        }
        batch_settled(b);
        store_offsets(b);
        batch_committed(b, mlab, t_begin);
        return RUN_DONE;
}

/* Committed: pop the committed prefix of each partition. */
static void
pop_committed(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        pthread_mutex_lock(&c->drain_lock);
        pthread_cond_broadcast(&c->drained);
        pthread_mutex_unlock(&c->drain_lock);
        pthread_mutex_lock(&b->w->lock);
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                if (ru->state == KINBOX__MSG_CUT)
                        continue;
                kinbox__part_t *p = m->part;
                /* m is p->head: batches take each partition's head run. */
                p->head = m->next;
                if (!p->head)
                        p->tail = NULL;
                p->count--;
                b->w->queued--;
                if (p->retry_at &&
                    !kinbox__part_backing_off(p, kinbox__now_ms()))
                        p->retry_at = 0;
                kinbox__msg_free(m);
        }
        pthread_mutex_unlock(&b->w->lock);
}

/* The batch's messages start their run: to the handler, or to the dead
 * letters when they have no id. */
static void
batch_start(kinbox__batch_t *b)
{
        b->hold_dead = false;
        for (size_t i = 0; i < b->nmsgs; i++) {
                b->msgs[i]->bidx = i;
                b->run[i] = (kinbox__run_t){.state = b->msgs[i]->id
                                                         ? KINBOX__MSG_RUN
                                                         : KINBOX__MSG_DEAD};
                b->hold_dead = b->hold_dead || !b->msgs[i]->id;
        }
        b->iso_hit = false;
}

/* Redeliveries are found again by the next attempt's inbox insert. */
static void
dups_again(kinbox__batch_t *b)
{
        for (size_t i = 0; i < b->nmsgs; i++)
                if (b->run[i].state == KINBOX__MSG_DUP)
                        b->run[i].state = KINBOX__MSG_RUN;
}

/* A worker without a connection: connect, or nap (a backoff in *down
 * attempts) and say false. */
static bool
batch_connect(kinbox__batch_t *b, int *down)
{
        kinbox_consumer_t *c = b->c;
        if (b->db->native)
                return true;
        if (kinbox__db_connect(b->db)) {
                if ((*down)++ == 0 || *down % 20 == 0)
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "worker %d: %s", b->w->idx,
                                    b->db->err.msg);
                kinbox__worker_nap(
                    b->w, kinbox__backoff_ms(*down, 50, c->reconnect_max));
                return false;
        }
        if (*down)
                kinbox__log(&c->lg, KINBOX_LOG_NOTICE, "consumer",
                            "worker %d: database reconnected", b->w->idx);
        *down = 0;
        return true;
}

/* Attempts until one commits (true) or the batch is abandoned. */
static bool
batch_attempts(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        int down = 0, backoff = 0;
        for (;;) {
                if (!b->db->native && kinbox__batch_abandoned(b))
                        return false;
                if (!batch_connect(b, &down))
                        continue;
                enum run_rc r = run_once(b);
                metrics_stats(c);
                if (r == RUN_DONE) {
                        if (!b->iso_hit && b->iso_left > 0)
                                b->iso_left--;
                        return true;
                }
                if (r == RUN_BACKOFF) {
                        if (kinbox__batch_abandoned(b))
                                return false;
                        kinbox__worker_nap(b->w,
                                           kinbox__backoff_ms(++backoff,
                                                              c->backoff_base,
                                                              c->backoff_max));
                }
                /* RUN_AGAIN: states changed. A stop or revoke is seen here
                 * too, not only when the connection is down (the
                 * transaction is rolled back). RUN_DB_DOWN: everything not
                 * cut runs again, the inbox decides whether a commit of
                 * unknown outcome happened. */
                if (r == RUN_AGAIN && kinbox__batch_abandoned(b)) {
                        kinbox__db_abandon(b->db);
                        return false;
                }
                dups_again(b);
        }
}

void
kinbox__batch_process(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        kinbox_tx_t tx = {.c = c, .b = b, .db = b->db, .tag = -1};
        b->tx = &tx;
        batch_start(b);
        if (batch_attempts(b)) {
                pop_committed(b);
                atomic_store(&c->pause_dirty, true);
        } else {
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                            "worker %d: batch abandoned (partition revoked "
                            "or stopping); it will be redelivered",
                            b->w->idx);
                for (size_t i = 0; i < b->nmsgs; i++)
                        b->run[i].state = KINBOX__MSG_CUT;
        }
        kinbox__tx_clear_ukeys(&tx);
        free(tx.ukeys);
        b->tx = NULL;
}

int
kinbox__batch_reserve(kinbox__batch_t *b, size_t need)
{
        if (need <= b->capmsgs)
                return KINBOX_OK;
        size_t cap = need;
        kinbox_msg_t **m = realloc(b->msgs, cap * sizeof(*m));
        if (!m)
                return KINBOX_ERR_NOMEM;
        b->msgs = m;
        kinbox__run_t *ru = realloc(b->run, cap * sizeof(*ru));
        if (!ru)
                return KINBOX_ERR_NOMEM;
        b->run = ru;
        kinbox__inbox_row_t *r = realloc(b->rows, cap * sizeof(*r));
        if (!r)
                return KINBOX_ERR_NOMEM;
        b->rows = r;
        bool *nw = realloc(b->is_new, cap * sizeof(*nw));
        if (!nw)
                return KINBOX_ERR_NOMEM;
        b->is_new = nw;
        kinbox_result_t *res = realloc(b->results, cap * sizeof(*res));
        if (!res)
                return KINBOX_ERR_NOMEM;
        b->results = res;
        b->capmsgs = cap;
        return KINBOX_OK;
}

void
kinbox__batch_free(kinbox__batch_t *b)
{
        free(b->msgs);
        free(b->run);
        free(b->rows);
        free(b->is_new);
        free(b->results);
        kinbox__attr_free(&b->attr);
        b->msgs = NULL;
        b->run = NULL;
        b->rows = NULL;
        b->is_new = NULL;
        b->results = NULL;
        b->capmsgs = b->nmsgs = 0;
}
