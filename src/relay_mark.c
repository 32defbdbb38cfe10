/*
 * relay_mark.c -- a batch's verdicts (delivery reports, actions, sizes)
 * and its marks: sent, released, failed (backoff with full jitter, dead
 * after max attempts), each with a version check; a lock-held batch that
 * degrades to leases; the delivery deadline.
 */
#include <signal.h>

#include "relay_int.h"

bool
kinbox__relay_reported(const batch_t *b)
{
        for (size_t i = 0; i < b->n; i++)
                if (b->v[i].produced && !b->v[i].dr_done)
                        return false;
        return true;
}

/*
 * The broker refused a produce request as too large. It refuses the
 * whole request, so every row of that request (of that partition) reports
 * MSG_SIZE_TOO_LARGE, and with the gapless guarantee the producer fails.
 * Charging them all would dead-letter innocent rows; releasing them all
 * would publish the same request forever. A row is a suspect when its key
 * and value alone are larger than the topic's max.message.bytes: without
 * compression no attempt can ever publish it (dead now, the reason named);
 * with compression it is charged an attempt (compressed, it might fit).
 * The other rows of the topic go back uncharged, and are published
 * without the suspect. When no row is a suspect, the request as a whole
 * was too large (kafka.batch.size above the topic's limit): every row is
 * charged, the error says what to set.
 */
static void
size_verdicts(kinbox_relay_t *r, batch_t *b)
{
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->out != OUT_RETRY ||
                    (it->dr_err != RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE &&
                     it->dr_err != RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE))
                        continue;
                const char *topic = it->destination;
                const rd_kafka_resp_err_t code = it->dr_err;
                int64_t limit = kinbox__relay_topic_max_bytes(r, topic);
                bool any = false;
                for (size_t k = i; k < b->n; k++) {
                        item_t *x = &b->v[k];
                        size_t sz =
                            x->payload_size +
                            (x->aggregate_id ? strlen(x->aggregate_id) : 0);
                        if (x->out != OUT_RETRY || x->dr_err != code ||
                            strcmp(x->destination, topic))
                                continue;
                        if (limit > 0 && (int64_t)sz > limit) {
                                any = true;
                                snprintf(x->err, sizeof(x->err),
                                         "delivery: MSG_SIZE_TOO_LARGE: the "
                                         "record (%zu bytes of key and value) "
                                         "is larger than topic %s's "
                                         "max.message.bytes (%" PRId64 ")%s",
                                         sz, topic, limit,
                                         r->compressed
                                             ? ""
                                             : ": it cannot be published as "
                                               "written");
                                if (!r->compressed)
                                        x->out = OUT_DEAD;
                                x->dr_err = RD_KAFKA_RESP_ERR_NO_ERROR;
                        }
                }
                for (size_t k = i; k < b->n; k++) {
                        item_t *x = &b->v[k];
                        if (x->out != OUT_RETRY || x->dr_err != code ||
                            strcmp(x->destination, topic))
                                continue;
                        x->dr_err = RD_KAFKA_RESP_ERR_NO_ERROR;
                        if (any) {
                                x->out = OUT_RELEASE; /* not its fault */
                        } else if (limit > 0) {
                                snprintf(x->err, sizeof(x->err),
                                         "delivery: MSG_SIZE_TOO_LARGE: a "
                                         "produce request to %s was larger "
                                         "than its max.message.bytes (%" PRId64
                                         "): set kafka.batch.size below it",
                                         topic, limit);
                        }
                }
        }
}

/* Delivery reports into outcomes. Within an aggregate's run, the first
 * failure is charged an attempt; the rows after it go back untouched
 * (released), behind it. With the idempotent producer's gapless guarantee
 * a later row of the same partition is not written after an earlier one
 * failed; should one have been acknowledged anyway, it is on the topic and
 * is marked sent. */
static void
batch_outcomes(kinbox_relay_t *r, batch_t *b)
{
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (!it->produced)
                        continue;
                if (!it->dr_done) {
                        it->out = OUT_NONE; /* lease expires, retried */
                        continue;
                }
                if (!it->dr_err) {
                        it->out = OUT_SENT;
                        continue;
                }
                char e[512];
                set_err(it->err, kinbox__relay_kafka_err(
                                     "delivery", it->dr_err, it->destination,
                                     e, sizeof(e)));
                it->out = OUT_RETRY;
        }
        size_verdicts(r, b);
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->out != OUT_RETRY || !it->aggregate_id || it->held)
                        continue;
                for (size_t k = i + 1; k < b->n; k++) {
                        item_t *x = &b->v[k];
                        if (x->aggregate_id &&
                            !strcmp(x->aggregate_id, it->aggregate_id) &&
                            (x->out == OUT_RETRY || x->out == OUT_NONE)) {
                                x->out = OUT_RELEASE;
                                x->held = true;
                        }
                }
        }
}

/* One set-based statement for every item with outcome out. */
static int
mark_group(kinbox_relay_t *r, batch_t *b, outcome_t out, uint64_t *asked,
           uint64_t *done)
{
        int64_t *ids = malloc(b->n * sizeof(*ids) * 2);
        if (!ids)
                return KINBOX_ERR_NOMEM;
        int64_t *vers = ids + b->n;
        size_t k = 0;
        for (size_t i = 0; i < b->n; i++) {
                if (b->v[i].out != out)
                        continue;
                ids[k] = b->v[i].id;
                vers[k++] = b->v[i].version;
        }
        int rc = 0;
        *asked = k;
        *done = 0;
        if (k) {
                const struct kinbox__outbox_ops *o = r->db->ops->outbox;
                rc = out == OUT_SENT ? o->mark_sent(r->db, k, ids, vers, done)
                                     : o->release(r->db, k, ids, vers, done);
        }
        free(ids);
        return rc;
}

/* One line per this many ms about failed attempts; the others in it are
 * summed into the next line. */
#define FAIL_LOG_MS 10000

void
kinbox__relay_faillog_flush(kinbox_relay_t *r)
{
        if (!r->faillog.failed && !r->faillog.dead)
                return;
        rlog(r, r->faillog.dead ? KINBOX_LOG_WARNING : KINBOX_LOG_INFO,
             "outbox: %" PRIu64 " more failed attempt(s) (retried with "
             "backoff) and %" PRIu64 " more dead row(s) in the last %lld s; "
             "the last: %s",
             r->faillog.failed, r->faillog.dead,
             (long long)((kinbox__now_ms() - r->faillog.at + 999) / 1000),
             r->faillog.last);
        r->faillog.failed = r->faillog.dead = 0;
        r->faillog.at = kinbox__now_ms();
}

/* A failed attempt: its own line when none was written for FAIL_LOG_MS,
 * else summed into the next one. */
static void
fail_log(kinbox_relay_t *r, const item_t *it, int attempts, bool dead)
{
        int64_t now = kinbox__now_ms();
        if (r->faillog.at && now - r->faillog.at < FAIL_LOG_MS) {
                snprintf(r->faillog.last, sizeof(r->faillog.last),
                         "outbox row %" PRId64 " (%s) attempt %d %s: %s",
                         it->id, it->destination, attempts,
                         dead ? "dead" : "failed", it->err);
                if (dead)
                        r->faillog.dead++;
                else
                        r->faillog.failed++;
                return;
        }
        kinbox__relay_faillog_flush(r);
        rlog(r, dead ? KINBOX_LOG_WARNING : KINBOX_LOG_INFO,
             "outbox row %" PRId64 " (%s) attempt %d %s: %s (more failures "
             "within %d s are summed up in one line)",
             it->id, it->destination, attempts, dead ? "dead" : "failed",
             it->err, FAIL_LOG_MS / 1000);
        r->faillog.at = now;
}

/* A failed attempt: retry later with backoff, or dead. */
static int
mark_failed(kinbox_relay_t *r, item_t *it, uint64_t *done)
{
        int attempts = it->attempts + 1;
        int max = it->max_attempts > 0 ? it->max_attempts : r->max_attempts;
        if (it->out == OUT_RETRY && attempts >= max)
                it->out = OUT_DEAD;
        bool dead = it->out == OUT_DEAD;
        int64_t d =
            dead ? 0 : kinbox__backoff_ms(attempts - 1, r->base_ms, r->cap_ms);
        int rc = r->db->ops->outbox->fail(r->db, it->id, it->version, dead,
                                          it->err, d, done);
        if (!rc && *done)
                fail_log(r, it, attempts, dead);
        return rc;
}

typedef struct tally {
        uint64_t published, actions_ok, retried, dead, released, conflicts;
        int finished;
} tally_t;

static int
batch_mark(kinbox_relay_t *r, batch_t *b, tally_t *t)
{
        uint64_t asked = 0, done = 0;
        int rc = mark_group(r, b, OUT_SENT, &asked, &done);
        if (rc)
                return rc;
        t->conflicts += asked - done;
        for (size_t i = 0; i < b->n; i++) {
                if (b->v[i].out != OUT_SENT)
                        continue;
                if (b->v[i].action)
                        t->actions_ok++;
                else
                        t->published++;
        }
        /* Sent rows whose version check failed belong to another relay
         * now; it counts them. */
        uint64_t lost = asked - done;
        t->published -= lost < t->published ? lost : t->published;
        t->finished += (int)done;
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->out != OUT_RETRY && it->out != OUT_DEAD)
                        continue;
                if ((rc = mark_failed(r, it, &done)))
                        return rc;
                if (!done)
                        t->conflicts++;
                else if (it->out == OUT_DEAD)
                        t->dead++, t->finished++;
                else
                        t->retried++;
        }
        if (b->locked) {
                /* Lock-held: rows handed back are just not written; the
                 * commit ends their locks, they are pending and due. */
                for (size_t i = 0; i < b->n; i++)
                        t->released += b->v[i].out == OUT_RELEASE ||
                                       b->v[i].out == OUT_NONE;
                return 0;
        }
        rc = mark_group(r, b, OUT_RELEASE, &asked, &done);
        if (rc)
                return rc;
        t->released += done;
        t->conflicts += asked - done;
        return 0;
}

/*
 * A lock-held batch becomes a leased one: in its transaction, write the
 * leases the lease-mode claim writes (version + 1) on every row of the
 * batch and commit; the batch then goes on exactly as a lease-mode batch
 * (version-checked marks in autocommit once its reports are in). Rows
 * whose reports are in are leased too: their outcome may still depend on
 * an earlier row of their run. On a database error the transaction is
 * rolled back (rows pending and due, no attempt charged: published again
 * later, at-least-once) and the batch waits for its reports unmarked.
 */
int
kinbox__relay_degrade(kinbox_relay_t *r, batch_t *b, const char *why)
{
        int64_t *ids = malloc(b->n * sizeof(*ids) * 2);
        int rc = ids ? 0 : KINBOX_ERR_NOMEM;
        uint64_t done = 0;
        if (!rc) {
                int64_t *vers = ids + b->n;
                for (size_t i = 0; i < b->n; i++) {
                        ids[i] = b->v[i].id;
                        vers[i] = b->v[i].version;
                }
                rc = r->db->ops->outbox->lease(r->db, r->owner, r->lease_ms,
                                               b->n, ids, vers, &done);
        }
        free(ids);
        /* Every row is ours (locked): a lease that misses one means
         * something changed the row under the lock; take nothing. */
        if (!rc && done != b->n) {
                kinbox__db_seterr(r->db, KINBOX_ERR_STATE, "", 0, -1,
                                  "lease of a lock-held batch wrote %" PRIu64
                                  " of %zu rows",
                                  done, b->n);
                rc = KINBOX_ERR_STATE;
        }
        rc = kinbox__db_end(r->db, rc);
        b->locked = false;
        if (rc) {
                b->nomark = true;
                return rc > 0 ? -rc : rc;
        }
        b->degraded = true;
        for (size_t i = 0; i < b->n; i++)
                b->v[i].version++;
        rlog(r, KINBOX_LOG_DEBUG,
             "batch of %zu rows degraded to leases after %lld ms (%s)", b->n,
             (long long)(kinbox__now_ms() - b->tx0), why);
        return 0;
}

static void
batch_metrics(kinbox_relay_t *r, const batch_t *b, const tally_t *t,
              bool marked)
{
        char l[300];
        const char *name = kinbox__settings_of(r->conf)->name;
        kinbox__m_labels(l, sizeof(l), "relay", name ? name : "",
                         (char *)NULL);
        kinbox__m_add("kinbox_relay_published_total", l,
                      (double)(t->published + t->actions_ok));
        kinbox__m_add("kinbox_relay_failed_total", l, (double)t->retried);
        kinbox__m_add("kinbox_relay_dead_total", l, (double)t->dead);
        kinbox__m_add("kinbox_relay_cas_conflicts_total", l,
                      (double)t->conflicts);
        uint64_t reclaims = 0;
        int64_t now = kinbox__now_ms();
        for (size_t i = 0; i < b->n; i++) {
                reclaims += b->v[i].reclaimed;
                if (marked && b->v[i].out == OUT_SENT)
                        kinbox__m_observe(
                            "kinbox_relay_commit_to_publish_seconds", l,
                            (double)(b->v[i].age_ms + (now - b->t0)) / 1000.0);
        }
        kinbox__m_add("kinbox_relay_lease_reclaims_total", l,
                      (double)reclaims);
}

/* Mark a fully reported batch and free it. Returns <0 on a database
 * error, else the rows finished (sent or dead). */
int
kinbox__relay_finish(kinbox_relay_t *r, batch_t *b)
{
        batch_outcomes(r, b);
        /* Crash window for the tests: published, not yet marked sent. */
        if (kinbox__fault("relay_after_publish")) {
                rlog(r, KINBOX_LOG_WARNING,
                     "fault relay_after_publish: SIGKILL before the marks");
                raise(SIGKILL);
        }
        tally_t t = {0};
        int64_t t_mark = kinbox__now_us();
        int rc = 0;
        if (!b->nomark)
                rc = batch_mark(r, b, &t);
        if (kinbox__now_ms() - r->faillog.at >= FAIL_LOG_MS)
                kinbox__relay_faillog_flush(r);
        if (b->locked) {
                /* The marks of a lock-held batch are written by its
                 * commit; a failed statement or commit (connection lost:
                 * the server ended the transaction) marked nothing: the
                 * rows are pending, no attempt charged, published again. */
                rc = kinbox__db_end(r->db, rc);
                if (rc)
                        memset(&t, 0, sizeof(t));
        }
        rlog(r, KINBOX_LOG_DEBUG,
             "batch of %zu rows (%s): claim %lld us, delivery reports in "
             "%lld ms, marks %lld us (%" PRIu64 " sent, %" PRIu64
             " handed back)",
             b->n,
             b->nomark     ? "unmarked"
             : b->locked   ? "lock-held"
             : b->degraded ? "degraded to leases"
                           : "leased",
             (long long)b->us_claim, (long long)(t_mark / 1000 - b->t0),
             (long long)(kinbox__now_us() - t_mark),
             t.published + t.actions_ok, t.released);
        if (t.conflicts)
                rlog(r, KINBOX_LOG_NOTICE,
                     "%" PRIu64 " outbox rows were taken over by another "
                     "relay (lease expired)",
                     t.conflicts);
        pthread_mutex_lock(&r->lock);
        r->stats.published += t.published;
        r->stats.actions_ok += t.actions_ok;
        r->stats.retried += t.retried;
        r->stats.dead += t.dead;
        r->stats.released += t.released;
        r->stats.conflicts += t.conflicts;
        pthread_mutex_unlock(&r->lock);
        batch_metrics(r, b, &t, rc == 0 && !b->nomark);
        if (r->tracing)
                kinbox__relay_trace_spans(r, b);
        free(b->v);
        kinbox_rows_destroy(b->rows);
        memset(b, 0, sizeof(*b));
        if (rc)
                return rc > 0 ? -rc : rc;
        return t.finished;
}

/* Past the batch's delivery deadline (kafka.message.timeout.ms, enforced
 * here, see kinbox_relay_new), purge everything queued and in flight at
 * once, so no later row of a partition is sent after an earlier one gave
 * up: purged messages are reported at once and retried like any failure.
 * Reports are written into the items, so none may be left outstanding
 * when a batch is freed. */
void
kinbox__relay_expire(kinbox_relay_t *r, batch_t *b)
{
        for (int k = 0; !kinbox__relay_reported(b); k++) {
                if (k % 50 == 0) {
                        if (k)
                                rlog(r, KINBOX_LOG_WARNING,
                                     "waiting for delivery reports");
                        rd_kafka_purge(r->rk,
                                       RD_KAFKA_PURGE_F_QUEUE |
                                           RD_KAFKA_PURGE_F_INFLIGHT |
                                           RD_KAFKA_PURGE_F_NON_BLOCKING);
                }
                rd_kafka_flush(r->rk, 100);
        }
}
