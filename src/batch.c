/*
 * batch.c -- one batch in one transaction (see the comment above ISO_GROUPS and
 * docs/failures.md): inbox insert, handlers, failure isolation and
 * classification, dead letters, watermarks, COMMIT, then the offset store
 */
#include "consumer_int.h"
#include "fate.h"
#include "hdrcodec.h"
#include "held.h"
#include "hold.h"
#include "startpos.h"
#include "metrics.h"
#include "settings.h"

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
                if (m->state == KINBOX__MSG_CUT)
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
queue_dead_letter(kinbox__batch_t *b, kinbox_msg_t *m)
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
                if (m->state == KINBOX__MSG_CUT)
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
                                        b->msgs[j]->state != KINBOX__MSG_CUT;
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

/* Message i failed (its own statement or result): decide its fate and cut
 * the rest of its partition when it is to be retried. */
static void
fail_msg(kinbox__batch_t *b, size_t i, kinbox__fate_t f, const char *reason)
{
        kinbox_consumer_t *c = b->c;
        kinbox_msg_t *m = b->msgs[i];
        kinbox__msg_set_reason(m, reason);
        if (f == KINBOX__FATE_BIZDUP) {
                m->state = KINBOX__MSG_BIZDUP;
                return;
        }
        if (f == KINBOX__FATE_DEAD) {
                m->failures++;
                m->state = KINBOX__MSG_DEAD;
                b->hold_dead = true;
                return;
        }
        if (f == KINBOX__FATE_HOLD) {
                /* Not the message's fault: uncharged, its partition
                 * waits (held.c). */
                for (size_t j = i; j < b->nmsgs; j++)
                        if (b->msgs[j]->part == m->part)
                                b->msgs[j]->state = KINBOX__MSG_CUT;
                kinbox__held_hold(c, m, &b->db->err);
                return;
        }
        atomic_fetch_add(&c->st_retried, 1);
        if (++m->failures >= c->retry_max) {
                char gb[600];
                snprintf(gb, sizeof(gb), "gave up after %d attempts: %s",
                         m->failures, m->reason ? m->reason : "");
                kinbox__msg_set_reason(m, gb);
                m->state = KINBOX__MSG_DEAD;
                b->hold_dead = true;
                return;
        }
        for (size_t j = i; j < b->nmsgs; j++)
                if (b->msgs[j]->part == m->part)
                        b->msgs[j]->state = KINBOX__MSG_CUT;
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

enum run_rc { RUN_DONE, RUN_AGAIN, RUN_DB_DOWN, RUN_BACKOFF };

/*
 * A batch runs in one transaction. On a clean stream it is one group.
 * Once a message of a batch failed, the worker runs its next batches in
 * *isolation mode*: the batch is cut into at most ISO_GROUPS groups, each
 * behind a savepoint, so a failure rolls back to its group's savepoint and
 * runs that group's handlers again without the failed message, instead of
 * the whole batch in a new transaction. ISO_GROUPS stays well below
 * PostgreSQL's 64 cached subtransactions per backend. Isolation mode
 * lasts ISO_BATCHES batches after the last failure.
 */
#define ISO_GROUPS 32
/* A batch handler's group call is a set-based statement (often with a
 * round trip for its RETURNING): fewer, larger groups. A failing group is
 * bisected: cut in two groups, each behind its own savepoint, until the
 * failing part is one message (about 2 log2(group) calls instead of one
 * per message). */
#define ISO_GROUPS_BATCH 16
/* While every failure of a batch handler was pinned on its message (the
 * server named the row of a kinbox_tx_exec_rows() statement) or on a
 * suspect (PostgreSQL described the failing row of a
 * kinbox_tx_query_owned() statement: the suspect runs alone, the rest of
 * its group around it), no group needs narrowing: a failure re-runs its
 * group once without the culprit, so groups only bound what that re-run
 * repeats; each group costs its own handler call, and 4 cost the least CPU
 * of the counts tried (docs/benchmarks-history.md). */
#define ISO_GROUPS_EXACT 4
#define ISO_MIN_GROUP 4
/* Isolation mode, per-message handlers: statements the walk may queue
 * ahead of the server's answers (about two groups): pipelining keeps the
 * client and the server busy together, and a failure is found before
 * more than this many statements behind it are built and skipped. */
#define ISO_AHEAD 40
/* A batch handler's group calls that queue statements only (claims with
 * kinbox_tx_exec_claims()): about two groups ahead. A failure then costs
 * at most that many groups built and skipped (each is a whole set-based
 * call), while the server still always has the next group at hand. */
#define ISO_AHEAD_BATCH 4
#define ISO_BATCHES 16
/* Groups of a walk after bisections and cuts, at most (the arrays). */
#define ISO_MAX_GROUPS 64
/* Savepoints a walk may hold, one per group: each one that wrote holds a
 * PostgreSQL subtransaction id until COMMIT, and past 64 per transaction
 * every snapshot in the server gets slower. A rollback to a group's
 * savepoint keeps that one and frees those of the groups after it (their
 * ids too), which the walk then defines again: groups, not savepoints
 * defined, are what is counted. Past the budget a failing group is
 * handed to the batch handler one message at a time instead. */
#define ISO_SAVEPOINTS 56

/* One walk over the batch's groups, inside the open transaction. Group g
 * is the messages [lo[g], lo[g + 1]). */
typedef struct walk {
        size_t ngroups;
        size_t lo[ISO_MAX_GROUPS + 1];
        bool single[ISO_MAX_GROUPS]; /* batch handler: call per message */
        /* The second half of a failed group: when the first half ran
         * clean, the failure lies here, so it is cut before it runs. */
        bool suspect[ISO_MAX_GROUPS];
        bool iso;
        size_t g; /* the group running now */
        bool sp_done; /* group g's savepoint is already defined */
        bool no_merge; /* MySQL: group g runs without merged INSERTs */
} walk_t;

/* The group holding message i. */
static size_t
group_of(const walk_t *wk, size_t i)
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

/* Cut group g before message at, for a batch handler whose group call
 * failed on that message's row: the rows before it went through, so the
 * part after it gets its own savepoint and a second failure there re-runs
 * only that part. False when the cut is empty or the budget is spent. */
static bool
split_at(walk_t *wk, size_t g, size_t at)
{
        size_t a = wk->lo[g], b = wk->lo[g + 1];
        if (at <= a || at >= b || wk->ngroups >= ISO_SAVEPOINTS)
                return false;
        memmove(wk->lo + g + 2, wk->lo + g + 1,
                (wk->ngroups - g) * sizeof(*wk->lo));
        memmove(wk->single + g + 2, wk->single + g + 1,
                (wk->ngroups - g - 1) * sizeof(*wk->single));
        memmove(wk->suspect + g + 2, wk->suspect + g + 1,
                (wk->ngroups - g - 1) * sizeof(*wk->suspect));
        wk->lo[g + 1] = at;
        wk->single[g + 1] = false;
        wk->suspect[g + 1] = false;
        wk->ngroups++;
        return true;
}

/* Cut group g in two halves; false when it cannot be cut (one message, or
 * the group or savepoint budget is spent). */
static bool
bisect(walk_t *wk, size_t g)
{
        size_t a = wk->lo[g], b = wk->lo[g + 1];
        if (b - a < 2 || !split_at(wk, g, a + (b - a) / 2))
                return false;
        wk->single[g] = false;
        wk->suspect[g] = false;
        wk->suspect[g + 1] = true;
        return true;
}

/* Cut message s out of group g into a one-message group of its own, for
 * a group call that failed on a row the server's detail seems to name
 * (a suspect): the rows before it went through, the part after it and
 * the suspect each get a savepoint. The suspect's own call then decides
 * whether it is to blame; a wrong hint leaves a smaller failing group.
 * False when the budget is spent (the group is narrowed as before). */
static bool
cut_suspect(walk_t *wk, size_t g, size_t s)
{
        size_t a = wk->lo[g], b = wk->lo[g + 1];
        int cuts = (s > a) + (s + 1 < b);
        if (s < a || s >= b || !cuts ||
            wk->ngroups + (size_t)cuts > ISO_SAVEPOINTS)
                return false;
        wk->single[g] = false;
        wk->suspect[g] = false;
        if (s > a && split_at(wk, g, s))
                g++;
        if (s + 1 < b)
                split_at(wk, g, s + 1);
        return true;
}

/* Where a failure is charged. */
typedef enum { FL_MSG, FL_GROUP, FL_MERGED, FL_BATCH } fkind_t;

typedef struct failure {
        fkind_t kind;
        size_t idx; /* FL_MSG: message; FL_GROUP/FL_MERGED: group */
        kinbox__fate_t fate;
        bool by_result; /* the handler's own result, no statement failed */
        /* FL_GROUP: 1 + the message the server's detail seems to name
         * (db->err.suspect), 0 none: where to cut, never whom to charge */
        size_t suspect;
} failure_t;

/* Charge db->err to a message, a group or the whole batch. */
static failure_t
failure_of(const kinbox__batch_t *b, const walk_t *wk,
           const kinbox__dberr_t *e, const kinbox_tx_t *tx)
{
        failure_t f = {FL_BATCH, 0, KINBOX__FATE_RETRY, false, 0};
        int t = e->tag;
        if (!kinbox__fate_own_failure(e))
                return f;
        size_t low = (size_t)KINBOX__TAG_LOW(t);
        if (t & KINBOX__TAG_MERGED_BIT) {
                if (low < b->nmsgs)
                        f = (failure_t){FL_MERGED, group_of(wk, low),
                                        KINBOX__FATE_RETRY, false, 0};
        } else if (t & KINBOX__TAG_GROUP) {
                /* The low bits: the group's first message. */
                if (low < b->nmsgs)
                        f = (failure_t){FL_GROUP, group_of(wk, low),
                                        kinbox__fate_of_statement(tx, e),
                                        false, 0};
                /* A suspect only in the failing call's own group. */
                size_t s = (size_t)KINBOX__TAG_LOW(e->suspect - 1);
                if (f.kind == FL_GROUP && e->suspect > 0 &&
                    !((e->suspect - 1) & KINBOX__TAG_GROUP) && s < b->nmsgs &&
                    b->msgs[s]->state == KINBOX__MSG_RUN &&
                    group_of(wk, s) == f.idx)
                        f.suspect = s + 1;
        } else if (low < b->nmsgs && b->msgs[low]->state == KINBOX__MSG_RUN) {
                f = (failure_t){FL_MSG, low, kinbox__fate_of_statement(tx, e),
                                false, 0};
        }
        return f;
}

static int queue_dead_letter(kinbox__batch_t *b, kinbox_msg_t *m);

/* A group's savepoint is named by its first message: a bisection leaves
 * the names of the groups before the cut alone. */
static void
savepoint_name(char *b, size_t sz, const walk_t *wk, size_t g)
{
        snprintf(b, sz, "kinbox_g%zu", wk->lo[g]);
}

/* Run per-message handler i. Returns false when the walk must stop: *f
 * then says why (a statement failed, or the handler's own verdict needs
 * its statements undone). */
static bool
run_handler(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk, size_t i,
            failure_t *f)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        kinbox_msg_t *m = b->msgs[i];
        tx->tag = (int)i;
        tx->failed = tx->touched = false;
        tx->reason[0] = '\0';
        /* An error seen during the call is one the call's own database
         * calls ran into (maybe another message's deferred statement). */
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        m->attempt = m->failures + 1;
        m->dup_ok = false;
        int64_t t_h = kinbox__now_us();
        kinbox_result_t r = c->handler(tx, m, c->opaque);
        b->handler_us += kinbox__now_us() - t_h;
        if (tx->failed && db->err.code) {
                /* A statement failed: whose? Its result decides nothing. */
                *f = failure_of(b, wk, &db->err, tx);
                return false;
        }
        if (r == KINBOX_RESULT_OK)
                return true;
        if (r == KINBOX_RESULT_DUPLICATE) {
                m->dup_ok = true;
                return true;
        }
        const char *why = tx->reason[0] ? tx->reason : "no reason given";
        kinbox__fate_t fate =
            r == KINBOX_RESULT_REJECT ? KINBOX__FATE_DEAD : KINBOX__FATE_RETRY;
        if (!tx->touched) {
                /* Nothing to undo: decide now and go on. */
                fail_msg(b, i, fate, why);
                if (m->state == KINBOX__MSG_DEAD && queue_dead_letter(b, m)) {
                        *f = failure_of(b, wk, &db->err, tx);
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
batch_results(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk,
              kinbox_msg_t **run, const size_t *idx, size_t n, failure_t *f)
{
        kinbox_consumer_t *c = b->c;
        bool undo = false;
        for (size_t j = 0; j < n; j++) {
                kinbox_result_t r = b->results[j];
                if (r == KINBOX_RESULT_OK)
                        continue;
                if (r == KINBOX_RESULT_DUPLICATE) {
                        run[j]->dup_ok = true;
                        continue;
                }
                fail_msg(b, idx[j],
                         r == KINBOX_RESULT_REJECT ? KINBOX__FATE_DEAD
                                                   : KINBOX__FATE_RETRY,
                         run[j]->reason ? run[j]->reason : tx->reason);
                if (!tx->touched &&
                    b->msgs[idx[j]]->state == KINBOX__MSG_DEAD &&
                    queue_dead_letter(b, b->msgs[idx[j]])) {
                        *f = failure_of(b, wk, &b->db->err, tx);
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
run_batch_group(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk,
                size_t lo, size_t hi, failure_t *f)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        kinbox_msg_t *run[hi - lo + 1];
        size_t idx[hi - lo + 1], n = 0;
        for (size_t i = lo; i < hi; i++)
                if (b->msgs[i]->state == KINBOX__MSG_RUN) {
                        run[n] = b->msgs[i];
                        idx[n++] = i;
                }
        bool single = wk->single[wk->g];
        for (size_t j0 = 0; j0 < n; j0 += single ? 1 : n) {
                size_t cnt = single ? 1 : n;
                for (size_t j = j0; j < j0 + cnt; j++) {
                        b->results[j - j0] = KINBOX_RESULT_OK;
                        run[j]->attempt = run[j]->failures + 1;
                        run[j]->dup_ok = false;
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
                        *f = failure_of(b, wk, &db->err, tx);
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
                if (!batch_results(b, tx, wk, run + j0, idx + j0, cnt, f))
                        return false;
        }
        return true;
}

/* Group wk->g: dead letters of its decided messages, then its handlers.
 * Returns false with *f when the walk must stop. */
static bool
run_group(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk, failure_t *f)
{
        kinbox_consumer_t *c = b->c;
        size_t lo = wk->lo[wk->g], hi = wk->lo[wk->g + 1];
        for (size_t i = lo; i < hi; i++) {
                kinbox_msg_t *m = b->msgs[i];
                char why[160];
                if (m->state == KINBOX__MSG_RUN &&
                    kinbox__hold_ambiguous(c, m, why, sizeof(why)))
                        fail_msg(b, i, KINBOX__FATE_DEAD, why);
                if (m->state == KINBOX__MSG_DEAD) {
                        if (queue_dead_letter(b, m)) {
                                *f = failure_of(b, wk, &b->db->err, tx);
                                return false;
                        }
                        continue;
                }
                if (m->state == KINBOX__MSG_RUN && kinbox__hold_park(b, i))
                        m->state = KINBOX__MSG_PARK;
                if (m->state == KINBOX__MSG_PARK) {
                        if (kinbox__hold_queue_park(b, m)) {
                                *f = failure_of(b, wk, &b->db->err, tx);
                                return false;
                        }
                        continue;
                }
                if (m->state == KINBOX__MSG_RUN && c->handler &&
                    !run_handler(b, tx, wk, i, f))
                        return false;
        }
        if (c->batch_handler && !c->handler)
                return run_batch_group(b, tx, wk, lo, hi, f);
        return true;
}

/* The database is out of disk, memory or connection slots: nothing is
 * lost (the batch is retried with backoff), but only the operator can
 * fix it, so it is a warning and a counter, not an info line. */
static void
resource_error(kinbox__batch_t *b, kinbox__db_t *db)
{
        kinbox_consumer_t *c = b->c;
        char l[300];
        kinbox__m_add(
            "kinbox_db_resource_errors_total",
            kinbox__m_labels(l, sizeof(l), "consumer", c->name, (char *)NULL),
            1);
        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                    "worker %d: batch rolled back: the database is out of a "
                    "resource (disk, memory or connection slots): %s; "
                    "retrying with backoff, offsets not advanced: free "
                    "space or raise the limit on the database server",
                    b->w->idx, db->err.msg);
}

/* One notice per consumer per this many ms about hidden batch splits. */
#define SPLIT_LOG_MS 60000

/* A batch handler's set-based statement failed and its group is to be
 * narrowed down to the message (or a merged MySQL INSERT re-run row by
 * row): the handler sees more calls and the batch more rollbacks. Count
 * it with its cause; say so at most once a minute. */
static void
split_noted(kinbox_consumer_t *c, const kinbox__dberr_t *e)
{
        char cause[16], l[300];
        kinbox__db_err_cause(e, cause, sizeof(cause));
        kinbox__m_add("kinbox_consumer_batch_splits_total",
                      kinbox__m_labels(l, sizeof(l), "consumer", c->name,
                                       "cause", cause, (char *)NULL),
                      1);
        uint64_t n = atomic_fetch_add(&c->st_splits, 1) + 1;
        int64_t now = kinbox__now_ms();
        int64_t last = atomic_load(&c->split_log_ms);
        if ((last && now - last < SPLIT_LOG_MS) ||
            !atomic_compare_exchange_strong(&c->split_log_ms, &last, now))
                return;
        uint64_t before = atomic_exchange(&c->st_splits_logged, n);
        kinbox__log(&c->lg, KINBOX_LOG_NOTICE, "consumer",
                    "consumer %s: a set-based statement failed and its "
                    "batch is split to find the message (%" PRIu64
                    " split%s since the last such line): %s%s%s%s; a "
                    "statement that fails for one message costs rollbacks "
                    "and handler calls (docs/failures.md, failure "
                    "isolation)",
                    c->name, n - before, n - before == 1 ? "" : "s", e->msg,
                    e->stmt[0] ? " (statement: " : "", e->stmt,
                    e->stmt[0] ? ")" : "");
}

/* Hold every partition of the batch (its first message names it). */
static void
hold_batch(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                bool first = true;
                for (size_t j = 0; j < i && first; j++)
                        first = b->msgs[j]->part != m->part;
                if (first && m->state != KINBOX__MSG_CUT)
                        kinbox__held_hold(c, m, &b->db->err);
        }
}

/* Charge failure f of group g: the message's fate, or how the group is
 * narrowed down to it. True when a suspect was cut out of the group. */
static bool
charge(kinbox__batch_t *b, walk_t *wk, failure_t *f, size_t g)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        bool cut = false;
        if ((f->kind == FL_GROUP && !f->by_result) || f->kind == FL_MERGED)
                split_noted(c, &db->err);
        if (f->kind == FL_MSG) {
                fail_msg(b, f->idx, f->fate,
                         f->by_result ? b->msgs[f->idx]->reason : db->err.msg);
                /* The culprit is out: the group's next batch handler call
                 * is set-based again. A set-based call's row named it:
                 * what follows it becomes a group of its own. */
                if (c->batch_handler && !c->handler && !wk->single[g] &&
                    wk->iso)
                        split_at(wk, g, f->idx + 1);
                wk->single[g] = false;
        } else if (f->kind == FL_GROUP && !f->by_result && wk->iso &&
                   f->suspect && cut_suspect(wk, g, f->suspect - 1)) {
                /* The suspect runs alone between the rest of the group:
                 * its own statement's failure is what charges it. */
                cut = true;
        } else if (f->kind == FL_GROUP && !f->by_result) {
                /* Narrow it down to the message: one message at a time
                 * when the handler's one-message call needs no round trip
                 * (its statements are pipelined: a group's worth of them
                 * costs less than the 2 log2(group) set-based calls, each
                 * waiting, of a bisection), else by bisection. */
                if (!wk->iso || b->one_call == KINBOX__ONE_CALL_NO_WAIT ||
                    !bisect(wk, g))
                        wk->single[g] = true;
        } else if (f->kind == FL_MERGED)
                wk->no_merge = true; /* the rows one by one pin it */
        return cut;
}

/*
 * Charge failure f and make the transaction usable again: in isolation
 * mode roll back to the failing group's savepoint and go on from there;
 * otherwise roll everything back and run the batch again, isolated.
 * Returns RUN_AGAIN when the walk resumes at wk->g, or how run_once ends.
 */
static enum run_rc
recover(kinbox__batch_t *b, walk_t *wk, failure_t *f)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        if (f->kind == FL_BATCH) {
                db->ops->rollback(db);
                atomic_fetch_add(&c->st_rolled_back, 1);
                if (f->by_result)
                        return RUN_BACKOFF;
                if (db->err.code == KINBOX_ERR_DB_CONN ||
                    db->err.code == KINBOX_ERR_COMMIT_UNKNOWN) {
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "worker %d: %s; offsets not advanced, "
                                    "reconnecting",
                                    b->w->idx, db->err.msg);
                        return RUN_DB_DOWN;
                }
                atomic_fetch_add(&c->st_retried, 1);
                if (kinbox__db_resource_error(&db->err)) {
                        resource_error(b, db);
                        return RUN_BACKOFF;
                }
                if (db->err.deploy) {
                        /* kinbox's own statement (its tables missing, no
                         * privilege on them): every partition of the
                         * batch is held while the batch backs off. */
                        hold_batch(b);
                        return RUN_BACKOFF;
                }
                /* Charged to no message: name where the batch starts. */
                const kinbox_msg_t *m0 = b->nmsgs ? b->msgs[0] : NULL;
                kinbox__log(
                    &c->lg,
                    db->err.code == KINBOX_ERR_TRANSIENT ? KINBOX_LOG_INFO
                                                         : KINBOX_LOG_ERR,
                    "consumer",
                    "consumer %s: worker %d: batch of %zu from %s "
                    "[%" PRId32 "] offset %" PRId64 " rolled back: %s%s%s%s",
                    c->name, b->w->idx, b->nmsgs, m0 ? m0->part->topic : "?",
                    m0 ? m0->part->partition : -1,
                    m0 ? kinbox_msg_offset(m0) : -1, db->err.msg,
                    db->err.stmt[0] ? " (statement: " : "", db->err.stmt,
                    db->err.stmt[0] ? ")" : "");
                return RUN_BACKOFF;
        }
        size_t g = f->kind == FL_MSG ? group_of(wk, f->idx) : f->idx;
        if (g + 1 < wk->ngroups)
                wk->suspect[g + 1] = false; /* the failure was before it */
        bool cut = charge(b, wk, f, g);
        /* A group call whose suspect was cut out counts as exact: its
         * group runs again with no narrowing but the suspect's call. So
         * does a suspect outside isolation mode (the batch runs again
         * isolated, where it is cut): otherwise the next batches would
         * start with ISO_GROUPS_BATCH groups and stay there. */
        bool exact = f->kind == FL_MSG || f->by_result || cut ||
                     (!wk->iso && f->suspect);
        bool was_iso = wk->iso;
        b->iso_exact = (was_iso ? b->iso_exact : true) && exact;
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "worker %d: group %zu of %zu failed (%s%s%s), %s",
                    b->w->idx, g, wk->ngroups,
                    f->kind == FL_MSG     ? "one message"
                    : f->kind == FL_GROUP ? "a group call"
                                          : "a merged statement",
                    f->by_result ? ", by its results" : "",
                    f->suspect ? ", a row's owner suspected" : "",
                    was_iso ? "rolling back to its savepoint"
                            : "rolling back the batch");
        atomic_fetch_add(&c->st_rolled_back, 1);
        b->iso_left = ISO_BATCHES;
        b->iso_hit = true;
        if (!was_iso) {
                db->ops->rollback(db);
                return RUN_AGAIN;
        }
        char sp[32];
        savepoint_name(sp, sizeof(sp), wk, g);
        if (db->ops->rollback_to(db, sp)) {
                failure_t fb = {FL_BATCH, 0, KINBOX__FATE_RETRY, false, 0};
                return recover(b, wk, &fb);
        }
        /* Claims of the messages rolled back are void. */
        size_t keep = 0;
        for (size_t k = 0; k < b->attr.nnone; k++)
                if ((size_t)KINBOX__TAG_LOW(b->attr.none_tags[k]) < wk->lo[g])
                        b->attr.none_tags[keep++] = b->attr.none_tags[k];
        b->attr.nnone = keep;
        wk->g = g;
        wk->sp_done = true;
        return RUN_AGAIN;
}

/* Statements after the walk: the inbox rows of messages cut from this
 * transaction go (they run again later), then the watermarks. */
static int
queue_epilogue(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                if (m->state != KINBOX__MSG_CUT || !m->inserted)
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
                switch (m->state) {
                case KINBOX__MSG_RUN:
                        if (m->dup_ok)
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
                m->inserted = false;
                if (m->state == KINBOX__MSG_CUT || !m->id)
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
                if (m->state == KINBOX__MSG_CUT || !m->id)
                        continue;
                m->inserted = b->is_new[k++];
                if (!m->inserted && (m->state == KINBOX__MSG_RUN ||
                                     m->state == KINBOX__MSG_PARK))
                        m->state = KINBOX__MSG_DUP;
                else if (m->inserted && m->state == KINBOX__MSG_DUP)
                        /* its twin was cut this time */
                        m->state = KINBOX__MSG_RUN;
        }
        return KINBOX_OK;
}

/* Messages whose exec_values() rows the backend dropped (b->attr.drops): a
 * permanent failure or a unique violation of their own row, found after
 * their call returned; the statements went on without their rows, so
 * only their fate and dead letter are left to do. */
static bool
drops_decide(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk,
             failure_t *f, bool queue)
{
        kinbox__db_t *db = b->db;
        size_t n = b->attr.ndrops;
        b->attr.ndrops = 0;
        for (size_t k = 0; k < n; k++) {
                const kinbox__dberr_t *e = &b->attr.drops[k];
                size_t i = (size_t)KINBOX__TAG_LOW(e->tag);
                if (i >= b->nmsgs || b->msgs[i]->state != KINBOX__MSG_RUN)
                        continue;
                fail_msg(b, i, kinbox__fate_of_statement(tx, e), e->msg);
                if (queue && b->msgs[i]->state == KINBOX__MSG_DEAD &&
                    queue_dead_letter(b, b->msgs[i])) {
                        *f = failure_of(b, wk, &db->err, tx);
                        return false;
                }
        }
        return true;
}

static bool
take_drops(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk, failure_t *f)
{
        return drops_decide(b, tx, wk, f, true);
}

/* Send what is queued when exec_values() rows with owners are among it
 * (b->attr.rows_queued), then take the dropped messages: their dead letters
 * are queued here (before the next savepoint, or before the epilogue) and
 * not inside a later group. */
static bool
flush_values(kinbox__batch_t *b, kinbox_tx_t *tx, const walk_t *wk,
             failure_t *f)
{
        if (!b->attr.rows_queued)
                return take_drops(b, tx, wk, f);
        if (b->db->ops->flush(b->db)) {
                *f = failure_of(b, wk, &b->db->err, tx);
                return false; /* its drops: see walk_groups() */
        }
        return take_drops(b, tx, wk, f);
}

static bool batch_abandoned(kinbox__batch_t *b);

/* Walk every group from wk->g on; RUN_AGAIN means "committed nothing yet,
 * the walk may go on" only inside; returns RUN_DONE when all ran. */
static enum run_rc
walk_groups(kinbox__batch_t *b, kinbox_tx_t *tx, walk_t *wk)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        bool coalesce = db->coalesce;
        failure_t f;
        enum run_rc rc = RUN_DONE;
        while (wk->g < wk->ngroups) {
                if (wk->iso && !wk->sp_done) {
                        if (!flush_values(b, tx, wk, &f))
                                goto failed;
                        /* A failure of an earlier group is taken before
                         * this group's statements are built behind it for
                         * nothing: the walk stays at most ISO_AHEAD
                         * statements ahead of the server's answers. */
                        size_t ahead = c->batch_handler && !c->handler
                                           ? ISO_AHEAD_BATCH
                                           : ISO_AHEAD;
                        if (kinbox__db_peek(db, ahead)) {
                                f = failure_of(b, wk, &db->err, tx);
                                goto failed;
                        }
                        char sp[32];
                        savepoint_name(sp, sizeof(sp), wk, wk->g);
                        if (db->ops->savepoint(db, sp)) {
                                f = failure_of(b, wk, &db->err, tx);
                                goto failed;
                        }
                }
                wk->sp_done = false;
                db->coalesce = coalesce && !wk->no_merge;
                bool ok = run_group(b, tx, wk, &f);
                db->coalesce = coalesce;
                wk->no_merge = false;
                if (ok) {
                        wk->g++;
                        if (wk->g < wk->ngroups && wk->suspect[wk->g])
                                bisect(wk, wk->g);
                        if (wk->g == wk->ngroups && wk->iso &&
                            db->ops->flush(db)) {
                                /* Surface errors while a savepoint can
                                 * still undo them. */
                                f = failure_of(b, wk, &db->err, tx);
                                goto failed;
                        }
                        if (wk->g == wk->ngroups &&
                            !flush_values(b, tx, wk, &f))
                                goto failed;
                        continue;
                }
        failed:
                /* Rows dropped in the round trip that failed: their
                 * messages' fates stand, and their dead letters come when
                 * their group runs again after the rollback (queued now,
                 * before the next savepoint, they would be queued twice
                 * when a cut puts the message in a later group). */
                drops_decide(b, tx, wk, &(failure_t){0}, false);
                rc = recover(b, wk, &f);
                if (rc != RUN_AGAIN || !wk->iso)
                        return rc;
                /* Narrowing a failure down may take many round trips: a
                 * revoke or a stop ends it (kinbox__batch_process()
                 * abandons the batch; nothing of it is committed). */
                if (batch_abandoned(b)) {
                        db->ops->rollback(db);
                        return RUN_AGAIN;
                }
        }
        return RUN_DONE;
}

/* The groups of a batch of n: one, or in isolation mode up to ng groups
 * of at least ISO_MIN_GROUP messages. */
static void
walk_init(walk_t *wk, bool iso, size_t ng, size_t n)
{
        size_t gsz = n ? n : 1;
        wk->iso = iso;
        if (iso) {
                gsz = (n + ng - 1) / ng;
                if (gsz < ISO_MIN_GROUP)
                        gsz = ISO_MIN_GROUP;
        }
        wk->ngroups = (n + gsz - 1) / gsz;
        for (size_t g = 0; g < wk->ngroups; g++)
                wk->lo[g] = g * gsz;
        wk->lo[wk->ngroups] = n;
}

/* One attempt at the batch in one transaction. */
static enum run_rc
run_once(kinbox__batch_t *b, kinbox_tx_t *tx)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        bool any = false;
        for (size_t i = 0; i < b->nmsgs; i++)
                if (b->msgs[i]->state != KINBOX__MSG_CUT)
                        any = true;
        if (!any)
                return RUN_DONE;
        char mlab[300];
        kinbox__m_labels(mlab, sizeof(mlab), "consumer", c->name,
                         (char *)NULL);
        int64_t t_begin = kinbox__now_ms();
        int64_t t_begin_us = kinbox__now_us();
        walk_t wk = {0};
        size_t ng = ISO_GROUPS;
        if (c->batch_handler && !c->handler)
                ng = b->iso_exact ? ISO_GROUPS_EXACT : ISO_GROUPS_BATCH;
        walk_init(&wk, b->iso_left > 0, ng, b->nmsgs);
        kinbox__tx_clear_ukeys(tx);
        failure_t f;
        if (begin_batch(b)) {
                f = failure_of(b, &wk, &db->err, tx);
                wk.iso = false; /* no savepoint yet: run it again */
                return recover(b, &wk, &f);
        }
        int64_t t_inbox = kinbox__now_us();
        enum run_rc rc = walk_groups(b, tx, &wk);
        if (rc != RUN_DONE)
                return rc;
        int64_t t_handlers = kinbox__now_us();
        if (queue_epilogue(b)) {
                f = failure_of(b, &wk, &db->err, tx);
                /* The walk is over: a RUN_AGAIN out of here must leave no
                 * transaction open (run_once() begins a new one). */
                wk.iso = false;
                return recover(b, &wk, &f);
        }
        if (kinbox__fault("before_commit")) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "fault",
                            "before_commit: SIGKILL");
                raise(SIGKILL);
        }
        if (db->ops->commit(db)) {
                f = failure_of(b, &wk, &db->err, tx);
                wk.iso = false; /* the transaction is gone: run it again */
                return recover(b, &wk, &f);
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
        /* kinbox_tx_exec_claim() statements that found the key taken. */
        for (size_t k = 0; k < b->attr.nnone; k++) {
                size_t i = (size_t)KINBOX__TAG_LOW(b->attr.none_tags[k]);
                if (i < b->nmsgs && b->msgs[i]->state == KINBOX__MSG_RUN)
                        b->msgs[i]->dup_ok = true;
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
                              b->msgs[j]->state == KINBOX__MSG_CUT;
                if (p->held && !cut)
                        kinbox__held_release(c, p);
        }
        store_offsets(b);
        batch_committed(b, mlab, t_begin);
        return RUN_DONE;
}

/* True when a partition of the batch was revoked or we are stopping hard. */
static bool
batch_abandoned(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        bool gone = false;
        pthread_mutex_lock(&b->w->lock);
        for (size_t i = 0; i < b->nmsgs && !gone; i++)
                if (b->msgs[i]->part->revoked)
                        gone = true;
        if (b->w->stop)
                gone = true;
        pthread_mutex_unlock(&b->w->lock);
        KINBOX__UNUSED(c);
        return gone;
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
                if (m->state == KINBOX__MSG_CUT)
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

void
kinbox__batch_process(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        kinbox_tx_t tx = {.c = c, .b = b, .db = b->db, .tag = -1};
        int down = 0, backoff = 0;
        b->hold_dead = false;
        for (size_t i = 0; i < b->nmsgs; i++) {
                b->msgs[i]->bidx = i;
                b->msgs[i]->state =
                    b->msgs[i]->id ? KINBOX__MSG_RUN : KINBOX__MSG_DEAD;
                b->hold_dead = b->hold_dead || !b->msgs[i]->id;
        }
        b->iso_hit = false;
        for (;;) {
                if (!b->db->native) {
                        if (batch_abandoned(b))
                                goto abandon;
                        if (kinbox__db_connect(b->db)) {
                                if (down++ == 0 || down % 20 == 0)
                                        kinbox__log(&c->lg, KINBOX_LOG_WARNING,
                                                    "consumer",
                                                    "worker %d: %s", b->w->idx,
                                                    b->db->err.msg);
                                kinbox__worker_nap(
                                    b->w, kinbox__backoff_ms(
                                              down, 50, c->reconnect_max));
                                continue;
                        }
                        if (down)
                                kinbox__log(&c->lg, KINBOX_LOG_NOTICE,
                                            "consumer",
                                            "worker %d: database reconnected",
                                            b->w->idx);
                        down = 0;
                }
                enum run_rc r = run_once(b, &tx);
                metrics_stats(c);
                if (r == RUN_DONE) {
                        if (!b->iso_hit && b->iso_left > 0)
                                b->iso_left--;
                        break;
                }
                if (r == RUN_DB_DOWN) {
                        /* Everything not cut runs again: the inbox decides
                         * whether a commit of unknown outcome happened. */
                        for (size_t i = 0; i < b->nmsgs; i++)
                                if (b->msgs[i]->state == KINBOX__MSG_DUP)
                                        b->msgs[i]->state = KINBOX__MSG_RUN;
                        continue;
                }
                if (r == RUN_BACKOFF) {
                        if (batch_abandoned(b))
                                goto abandon;
                        kinbox__worker_nap(b->w,
                                           kinbox__backoff_ms(++backoff,
                                                              c->backoff_base,
                                                              c->backoff_max));
                        for (size_t i = 0; i < b->nmsgs; i++)
                                if (b->msgs[i]->state == KINBOX__MSG_DUP)
                                        b->msgs[i]->state = KINBOX__MSG_RUN;
                        continue;
                }
                /* RUN_AGAIN: states changed; duplicates are re-detected.
                 * A stop or revoke is seen here too, not only when the
                 * connection is down (the transaction is rolled back). */
                if (batch_abandoned(b)) {
                        kinbox__db_abandon(b->db);
                        goto abandon;
                }
                for (size_t i = 0; i < b->nmsgs; i++)
                        if (b->msgs[i]->state == KINBOX__MSG_DUP)
                                b->msgs[i]->state = KINBOX__MSG_RUN;
        }
        pop_committed(b);
        atomic_store(&c->pause_dirty, true);
        kinbox__tx_clear_ukeys(&tx);
        free(tx.ukeys);
        return;
abandon:
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "worker %d: batch abandoned (partition revoked or "
                    "stopping); it will be redelivered",
                    b->w->idx);
        for (size_t i = 0; i < b->nmsgs; i++)
                b->msgs[i]->state = KINBOX__MSG_CUT;
        kinbox__tx_clear_ukeys(&tx);
        free(tx.ukeys);
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
        free(b->rows);
        free(b->is_new);
        free(b->results);
        kinbox__attr_free(&b->attr);
        b->msgs = NULL;
        b->rows = NULL;
        b->is_new = NULL;
        b->results = NULL;
        b->capmsgs = b->nmsgs = 0;
}
