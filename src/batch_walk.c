/*
 * batch_walk.c -- the walk over a batch's groups inside its transaction
 * (docs/failures.md, failure isolation): savepoint groups, narrowing a
 * failing group down to its message (cuts, bisection, suspects), the
 * recovery after a failure (back to the group's savepoint, or the whole
 * batch again), exec_values() rows the backend dropped.
 */
#include "batch_int.h"
#include "fate.h"
#include "held.h"
#include "hold.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#define ISO_MAX_GROUPS KINBOX__WALK_MAX_GROUPS
/* Savepoints a walk may hold, one per group: each one that wrote holds a
 * PostgreSQL subtransaction id until COMMIT, and past 64 per transaction
 * every snapshot in the server gets slower. A rollback to a group's
 * savepoint keeps that one and frees those of the groups after it (their
 * ids too), which the walk then defines again: groups, not savepoints
 * defined, are what is counted. Past the budget a failing group is
 * handed to the batch handler one message at a time instead. */
#define ISO_SAVEPOINTS 56

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

/* A group's savepoint is named by its first message: a bisection leaves
 * the names of the groups before the cut alone. */
static void
savepoint_name(char *b, size_t sz, const walk_t *wk, size_t g)
{
        snprintf(b, sz, "kinbox_g%zu", wk->lo[g]);
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
                kinbox__run_t *ru = &b->run[i];
                bool first = true;
                for (size_t j = 0; j < i && first; j++)
                        first = b->msgs[j]->part != m->part;
                if (first && ru->state != KINBOX__MSG_CUT)
                        kinbox__held_hold(c, m, &b->db->err);
        }
}

/* Charge failure f of group g: the message's fate, or how the group is
 * narrowed down to it. True when a suspect was cut out of the group. */
static bool
charge(kinbox__batch_t *b, failure_t *f, size_t g)
{
        walk_t *wk = &b->wk;
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        bool cut = false;
        if ((f->kind == FL_GROUP && !f->by_result) || f->kind == FL_MERGED)
                split_noted(c, &db->err);
        if (f->kind == FL_MSG) {
                kinbox__batch_fail(b, f->idx, f->fate,
                                   f->by_result ? b->msgs[f->idx]->reason
                                                : db->err.msg);
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

/* A failure charged to the whole batch: everything is rolled back; the
 * attempt ends (RUN_BACKOFF, or RUN_DB_DOWN when the connection went). */
static enum run_rc
recover_batch(kinbox__batch_t *b, const failure_t *f)
{
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
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
        kinbox__log(&c->lg,
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

/*
 * Charge failure f and make the transaction usable again: in isolation
 * mode roll back to the failing group's savepoint and go on from there;
 * otherwise roll everything back and run the batch again, isolated.
 * Returns RUN_AGAIN when the walk resumes at wk->g, or how run_once ends.
 */
enum run_rc
kinbox__batch_recover(kinbox__batch_t *b, failure_t *f)
{
        walk_t *wk = &b->wk;
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        if (f->kind == FL_BATCH)
                return recover_batch(b, f);
        size_t g =
            f->kind == FL_MSG ? kinbox__batch_group_of(wk, f->idx) : f->idx;
        if (g + 1 < wk->ngroups)
                wk->suspect[g + 1] = false; /* the failure was before it */
        bool cut = charge(b, f, g);
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
                return kinbox__batch_recover(b, &fb);
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

/* Messages whose exec_values() rows the backend dropped (b->attr.drops): a
 * permanent failure or a unique violation of their own row, found after
 * their call returned; the statements went on without their rows, so
 * only their fate and dead letter are left to do. */
static bool
drops_decide(kinbox__batch_t *b, failure_t *f, bool queue)
{
        kinbox_tx_t *tx = b->tx;
        kinbox__db_t *db = b->db;
        size_t n = b->attr.ndrops;
        b->attr.ndrops = 0;
        for (size_t k = 0; k < n; k++) {
                const kinbox__dberr_t *e = &b->attr.drops[k];
                size_t i = (size_t)KINBOX__TAG_LOW(e->tag);
                if (i >= b->nmsgs || b->run[i].state != KINBOX__MSG_RUN)
                        continue;
                kinbox__batch_fail(b, i, kinbox__fate_of_statement(tx, e),
                                   e->msg);
                if (queue && b->run[i].state == KINBOX__MSG_DEAD &&
                    kinbox__batch_dead_letter(b, b->msgs[i])) {
                        *f = kinbox__batch_failure_of(b, &db->err);
                        return false;
                }
        }
        return true;
}

static bool
take_drops(kinbox__batch_t *b, failure_t *f)
{
        return drops_decide(b, f, true);
}

/* Send what is queued when exec_values() rows with owners are among it
 * (b->attr.rows_queued), then take the dropped messages: their dead letters
 * are queued here (before the next savepoint, or before the epilogue) and
 * not inside a later group. */
static bool
flush_values(kinbox__batch_t *b, failure_t *f)
{
        if (!b->attr.rows_queued)
                return take_drops(b, f);
        if (b->db->ops->flush(b->db)) {
                *f = kinbox__batch_failure_of(b, &b->db->err);
                return false; /* its drops: see kinbox__batch_walk() */
        }
        return take_drops(b, f);
}

/* True when a partition of the batch was revoked or we are stopping hard. */
bool
kinbox__batch_abandoned(kinbox__batch_t *b)
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

/* Walk every group from wk->g on; RUN_AGAIN means "committed nothing yet,
 * the walk may go on" only inside; returns RUN_DONE when all ran. */
enum run_rc
kinbox__batch_walk(kinbox__batch_t *b)
{
        walk_t *wk = &b->wk;
        kinbox_consumer_t *c = b->c;
        kinbox__db_t *db = b->db;
        bool coalesce = db->coalesce;
        failure_t f;
        enum run_rc rc = RUN_DONE;
        while (wk->g < wk->ngroups) {
                if (wk->iso && !wk->sp_done) {
                        if (!flush_values(b, &f))
                                goto failed;
                        /* A failure of an earlier group is taken before
                         * this group's statements are built behind it for
                         * nothing: the walk stays at most ISO_AHEAD
                         * statements ahead of the server's answers. */
                        size_t ahead = c->batch_handler && !c->handler
                                           ? ISO_AHEAD_BATCH
                                           : ISO_AHEAD;
                        if (kinbox__db_peek(db, ahead)) {
                                f = kinbox__batch_failure_of(b, &db->err);
                                goto failed;
                        }
                        char sp[32];
                        savepoint_name(sp, sizeof(sp), wk, wk->g);
                        if (db->ops->savepoint(db, sp)) {
                                f = kinbox__batch_failure_of(b, &db->err);
                                goto failed;
                        }
                }
                wk->sp_done = false;
                db->coalesce = coalesce && !wk->no_merge;
                bool ok = kinbox__batch_run_group(b, &f);
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
                                f = kinbox__batch_failure_of(b, &db->err);
                                goto failed;
                        }
                        if (wk->g == wk->ngroups && !flush_values(b, &f))
                                goto failed;
                        continue;
                }
        failed:
                /* Rows dropped in the round trip that failed: their
                 * messages' fates stand, and their dead letters come when
                 * their group runs again after the rollback (queued now,
                 * before the next savepoint, they would be queued twice
                 * when a cut puts the message in a later group). */
                drops_decide(b, &(failure_t){0}, false);
                rc = kinbox__batch_recover(b, &f);
                if (rc != RUN_AGAIN || !wk->iso)
                        return rc;
                /* Narrowing a failure down may take many round trips: a
                 * revoke or a stop ends it (kinbox__batch_process()
                 * abandons the batch; nothing of it is committed). */
                if (kinbox__batch_abandoned(b)) {
                        db->ops->rollback(db);
                        return RUN_AGAIN;
                }
        }
        return RUN_DONE;
}

/* The groups of a batch: one, or in isolation mode up to ng groups of at
 * least ISO_MIN_GROUP messages. */
void
kinbox__batch_walk_init(kinbox__batch_t *b)
{
        const kinbox_consumer_t *c = b->c;
        walk_t *wk = &b->wk;
        size_t n = b->nmsgs, gsz = n ? n : 1, ng = ISO_GROUPS;
        bool iso = b->iso_left > 0;
        if (c->batch_handler && !c->handler)
                ng = b->iso_exact ? ISO_GROUPS_EXACT : ISO_GROUPS_BATCH;
        *wk = (walk_t){0};
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
