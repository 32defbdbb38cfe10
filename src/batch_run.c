/*
 * batch_run.c -- a batch's handlers, group by group (batch_walk.c walks
 * the groups): the dead letters of decided messages, parked messages,
 * per-message and batch handler calls and their verdicts, and where a
 * failure is charged (a message, a group, the whole batch) and what it
 * means for its message (fate.c).
 */
#include "batch_int.h"
#include "fate.h"
#include "hdrcodec.h"
#include "held.h"
#include "hold.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
kinbox__batch_dead_letter(kinbox__batch_t *b, kinbox_msg_t *m)
{
        kinbox_consumer_t *c = b->c;
        char part[16], off[24], att[16];
        snprintf(part, sizeof(part), "%" PRId32, m->rkm->partition);
        snprintf(off, sizeof(off), "%" PRId64, m->rkm->offset);
        /* Failed attempts: 0 when the handler never ran (no id). */
        snprintf(att, sizeof(att), "%d", m->failures);
        kinbox__buf_t h;
        kinbox__buf_init(&h);
        kinbox__headers_json(m, &h);
        if (h.oom) {
                kinbox__buf_free(&h);
                return KINBOX_ERR_NOMEM;
        }
        kinbox__param_t p[10] = {
            {c->name, 0, 0},
            {m->id, 0, 0},
            {m->part->topic, 0, 0},
            {part, 0, 0},
            {off, 0, 0},
            {m->rkm->key, m->rkm->key_len, 1},
            {h.p, 0, 0},
            {m->rkm->payload, m->rkm->len, 1},
            {m->reason ? m->reason : "no reason given", 0, 0},
            {att, 0, 0},
        };
        int rc = b->db->ops->exec(b->db, b->db->ops->sql->dead_letter_insert,
                                  10, p, -1);
        kinbox__buf_free(&h);
        if (!rc && c->hold_on)
                rc = kinbox__hold_block(b, m);
        return rc;
}

/* Message i failed (its own statement or result): decide its fate and cut
 * the rest of its partition when it is to be retried. */
void
kinbox__batch_fail(kinbox__batch_t *b, size_t i, kinbox__fate_t f,
                   const char *reason)
{
        kinbox_consumer_t *c = b->c;
        kinbox_msg_t *m = b->msgs[i];
        kinbox__run_t *ru = &b->run[i];
        kinbox__msg_set_reason(m, reason);
        if (f == KINBOX__FATE_BIZDUP) {
                ru->state = KINBOX__MSG_BIZDUP;
                return;
        }
        if (f == KINBOX__FATE_DEAD) {
                m->failures++;
                ru->state = KINBOX__MSG_DEAD;
                b->hold_dead = true;
                return;
        }
        if (f == KINBOX__FATE_HOLD) {
                /* Not the message's fault: uncharged, its partition
                 * waits (held.c). */
                for (size_t j = i; j < b->nmsgs; j++)
                        if (b->msgs[j]->part == m->part)
                                b->run[j].state = KINBOX__MSG_CUT;
                kinbox__held_hold(c, m, &b->db->err);
                return;
        }
        atomic_fetch_add(&c->st_retried, 1);
        if (++m->failures >= c->retry_max) {
                char gb[600];
                snprintf(gb, sizeof(gb), "gave up after %d attempts: %s",
                         m->failures, m->reason ? m->reason : "");
                kinbox__msg_set_reason(m, gb);
                ru->state = KINBOX__MSG_DEAD;
                b->hold_dead = true;
                return;
        }
        for (size_t j = i; j < b->nmsgs; j++)
                if (b->msgs[j]->part == m->part)
                        b->run[j].state = KINBOX__MSG_CUT;
        int64_t delay = kinbox__backoff_ms(m->failures - 1, c->backoff_base,
                                           c->backoff_max);
        pthread_mutex_lock(&b->w->lock);
        m->part->retry_at = kinbox__now_ms() + delay;
        pthread_mutex_unlock(&b->w->lock);
        atomic_store(&c->pause_dirty, true);
        char tn[48];
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s [%" PRId32 "] offset %" PRId64
                    "%s: attempt %d failed, retry in %" PRId64 " ms: %s",
                    m->part->topic, m->rkm->partition, m->rkm->offset,
                    kinbox__msg_trace_note(m, tn), m->failures, delay,
                    m->reason);
}

/* The group holding message i. */
size_t
kinbox__batch_group_of(const walk_t *wk, size_t i)
{
        size_t a = 0, b = wk->ngroups;
        while (b - a > 1) {
                size_t m = a + (b - a) / 2;
                if (wk->lo[m] <= i)
                        a = m;
                else
                        b = m;
        }
        return a;
}

/* Charge db->err to a message, a group or the whole batch. */
failure_t
kinbox__batch_failure_of(const kinbox__batch_t *b, const kinbox__dberr_t *e)
{
        const walk_t *wk = &b->wk;
        const kinbox_tx_t *tx = b->tx;
        failure_t f = {FL_BATCH, 0, KINBOX__FATE_RETRY, false, 0};
        int t = e->tag;
        if (!kinbox__fate_own_failure(e))
                return f;
        size_t low = (size_t)KINBOX__TAG_LOW(t);
        if (t & KINBOX__TAG_MERGED_BIT) {
                if (low < b->nmsgs)
                        f = (failure_t){FL_MERGED,
                                        kinbox__batch_group_of(wk, low),
                                        KINBOX__FATE_RETRY, false, 0};
        } else if (t & KINBOX__TAG_GROUP) {
                /* The low bits: the group's first message. */
                if (low < b->nmsgs)
                        f = (failure_t){
                            FL_GROUP, kinbox__batch_group_of(wk, low),
                            kinbox__fate_of_statement(tx, e), false, 0};
                /* A suspect only in the failing call's own group. */
                size_t s = (size_t)KINBOX__TAG_LOW(e->suspect - 1);
                if (f.kind == FL_GROUP && e->suspect > 0 &&
                    !((e->suspect - 1) & KINBOX__TAG_GROUP) && s < b->nmsgs &&
                    b->run[s].state == KINBOX__MSG_RUN &&
                    kinbox__batch_group_of(wk, s) == f.idx)
                        f.suspect = s + 1;
        } else if (low < b->nmsgs && b->run[low].state == KINBOX__MSG_RUN) {
                f = (failure_t){FL_MSG, low, kinbox__fate_of_statement(tx, e),
                                false, 0};
        }
        return f;
}

/* Run per-message handler i. Returns false when the walk must stop: *f
 * then says why (a statement failed, or the handler's own verdict needs
 * its statements undone). */
static bool
run_handler(kinbox__batch_t *b, size_t i, failure_t *f)
{
        kinbox_tx_t *tx = b->tx;
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        kinbox_msg_t *m = b->msgs[i];
        kinbox__run_t *ru = &b->run[i];
        tx->tag = (int)i;
        tx->failed = tx->touched = false;
        tx->reason[0] = '\0';
        /* An error seen during the call is one the call's own database
         * calls ran into (maybe another message's deferred statement). */
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        m->attempt = m->failures + 1;
        ru->dup_ok = false;
        int64_t t_h = kinbox__now_us();
        kinbox_result_t r = c->handler(tx, m, c->opaque);
        b->handler_us += kinbox__now_us() - t_h;
        if (tx->failed && db->err.code) {
                /* A statement failed: whose? Its result decides nothing. */
                *f = kinbox__batch_failure_of(b, &db->err);
                return false;
        }
        if (r == KINBOX_RESULT_OK)
                return true;
        if (r == KINBOX_RESULT_DUPLICATE) {
                ru->dup_ok = true;
                return true;
        }
        const char *why = tx->reason[0] ? tx->reason : "no reason given";
        kinbox__fate_t fate =
            r == KINBOX_RESULT_REJECT ? KINBOX__FATE_DEAD : KINBOX__FATE_RETRY;
        if (!tx->touched) {
                /* Nothing to undo: decide now and go on. */
                kinbox__batch_fail(b, i, fate, why);
                if (ru->state == KINBOX__MSG_DEAD &&
                    kinbox__batch_dead_letter(b, m)) {
                        *f = kinbox__batch_failure_of(b, &db->err);
                        return false;
                }
                return true;
        }
        kinbox__msg_set_reason(m, why);
        *f = (failure_t){FL_MSG, i, fate, true, 0};
        return false;
}

/* A batch handler's verdicts for run[0..n) (indexes idx[]). Returns false
 * with *f when statements must be undone. */
static bool
batch_results(kinbox__batch_t *b, kinbox_msg_t **run, const size_t *idx,
              size_t n, failure_t *f)
{
        walk_t *wk = &b->wk;
        kinbox_tx_t *tx = b->tx;
        kinbox_consumer_t *c = b->c;
        bool undo = false;
        for (size_t j = 0; j < n; j++) {
                kinbox_result_t r = b->results[j];
                if (r == KINBOX_RESULT_OK)
                        continue;
                if (r == KINBOX_RESULT_DUPLICATE) {
                        b->run[idx[j]].dup_ok = true;
                        continue;
                }
                kinbox__batch_fail(
                    b, idx[j],
                    r == KINBOX_RESULT_REJECT ? KINBOX__FATE_DEAD
                                              : KINBOX__FATE_RETRY,
                    run[j]->reason ? run[j]->reason : tx->reason);
                if (!tx->touched && b->run[idx[j]].state == KINBOX__MSG_DEAD &&
                    kinbox__batch_dead_letter(b, b->msgs[idx[j]])) {
                        *f = kinbox__batch_failure_of(b, &b->db->err);
                        return false;
                }
                undo = undo || tx->touched;
        }
        /* A rejected message's follower (same key) ran in this call: the
         * call goes, the follower is parked when the group runs again. */
        if (!undo && b->hold_dead && c->hold_on &&
            kinbox__hold_followers(b, idx, n))
                undo = true;
        if (undo) /* fates decided: only the statements are to go */
                *f = (failure_t){FL_GROUP, wk->g, KINBOX__FATE_RETRY, true, 0};
        return !undo;
}

/* The batch handler on group g's runnable messages: one call, or one per
 * message once a set-based statement of the group failed. */
static bool
run_batch_group(kinbox__batch_t *b, size_t lo, size_t hi, failure_t *f)
{
        kinbox_tx_t *tx = b->tx;
        walk_t *wk = &b->wk;
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        kinbox_msg_t *run[hi - lo + 1];
        size_t idx[hi - lo + 1], n = 0;
        for (size_t i = lo; i < hi; i++)
                if (b->run[i].state == KINBOX__MSG_RUN) {
                        run[n] = b->msgs[i];
                        idx[n++] = i;
                }
        bool single = wk->single[wk->g];
        for (size_t j0 = 0; j0 < n; j0 += single ? 1 : n) {
                size_t cnt = single ? 1 : n;
                for (size_t j = j0; j < j0 + cnt; j++) {
                        b->results[j - j0] = KINBOX_RESULT_OK;
                        run[j]->attempt = run[j]->failures + 1;
                        b->run[idx[j]].dup_ok = false;
                }
                /* A one-message call's statements are that message's. */
                tx->tag = cnt == 1 ? (int)idx[j0]
                                   : (int)(KINBOX__TAG_GROUP | wk->lo[wk->g]);
                tx->failed = tx->touched = false;
                tx->reason[0] = '\0';
                db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
                int64_t t_h = kinbox__now_us();
                uint64_t waits = tx->waits;
                b->attr.call_tag = tx->tag;
                kinbox_result_t r =
                    c->batch_handler(tx, (const kinbox_msg_t *const *)run + j0,
                                     cnt, b->results, c->opaque);
                b->attr.call_tag = -1;
                b->handler_us += kinbox__now_us() - t_h;
                if (cnt == 1)
                        b->one_call = tx->waits == waits
                                          ? KINBOX__ONE_CALL_NO_WAIT
                                          : KINBOX__ONE_CALL_WAITED;
                if (tx->failed && db->err.code) {
                        *f = kinbox__batch_failure_of(b, &db->err);
                        return false;
                }
                if (r != KINBOX_RESULT_OK) {
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "batch handler asked to retry the "
                                    "batch: %s",
                                    tx->reason);
                        *f = (failure_t){FL_BATCH, 0, KINBOX__FATE_RETRY, true,
                                         0};
                        return false;
                }
                if (!batch_results(b, run + j0, idx + j0, cnt, f))
                        return false;
        }
        return true;
}

/* Group wk->g: dead letters of its decided messages, then its handlers.
 * Returns false with *f when the walk must stop. */
bool
kinbox__batch_run_group(kinbox__batch_t *b, failure_t *f)
{
        walk_t *wk = &b->wk;
        kinbox_consumer_t *c = b->c;
        size_t lo = wk->lo[wk->g], hi = wk->lo[wk->g + 1];
        for (size_t i = lo; i < hi; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                char why[160];
                if (ru->state == KINBOX__MSG_RUN &&
                    kinbox__hold_ambiguous(c, m, why, sizeof(why))) {
                        /* Like an ambiguous id: dead before its handler
                         * ran (0 attempts), holding no key. */
                        kinbox__msg_set_reason(m, why);
                        ru->state = KINBOX__MSG_DEAD;
                        b->hold_dead = true;
                }
                if (ru->state == KINBOX__MSG_DEAD) {
                        if (kinbox__batch_dead_letter(b, m)) {
                                *f = kinbox__batch_failure_of(b, &b->db->err);
                                return false;
                        }
                        continue;
                }
                if (ru->state == KINBOX__MSG_RUN && kinbox__hold_park(b, i))
                        ru->state = KINBOX__MSG_PARK;
                if (ru->state == KINBOX__MSG_PARK) {
                        if (kinbox__hold_queue_park(b, m)) {
                                *f = kinbox__batch_failure_of(b, &b->db->err);
                                return false;
                        }
                        continue;
                }
                if (ru->state == KINBOX__MSG_RUN && c->handler &&
                    !run_handler(b, i, f))
                        return false;
        }
        if (c->batch_handler && !c->handler)
                return run_batch_group(b, lo, hi, f);
        return true;
}
