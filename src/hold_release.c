/*
 * hold_release.c -- the release of held keys (dead_letter.hold_key): the
 * parked messages of a key whose blocker left 'dead' (replayed,
 * discarded), one transaction each, in offset order, on the partition's
 * worker between batches. See hold.h.
 */
#include "hold_int.h"
#include "fate.h"
#include "hdrcodec.h"
#include "metrics.h"
#include "tx.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* release: the parked messages of a key whose blocker left 'dead', one
 * transaction each, in offset order, on the partition's worker */

enum rel { REL_ONE, REL_DONE, REL_BLOCKED, REL_RETRY };

/* One key being released: where, and the state of its head row. */
typedef struct relkey {
        kinbox_consumer_t *c;
        kinbox__worker_t *w;
        kinbox__part_t *p;
        const void *key;
        size_t klen;
        char part[16];
        int tries; /* failed attempts of the head row so far */
        int64_t blocker_off; /* REL_BLOCKED: the new blocker */
        int64_t first_off; /* the blocker when the release began */
} relkey_t;

static const char SQL_LOCK[] =
    "SELECT d.status FROM kinbox_hold h JOIN kinbox_dead_letter d ON d.id "
    "= h.blocker_id WHERE h.consumer = $1 AND h.topic = $2 AND "
    "h.kafka_partition = $3 AND h.hold_key = $4 FOR UPDATE";
static const char SQL_HEAD[] =
    "SELECT id, kafka_offset, message_id, msg_key, headers, payload FROM "
    "kinbox_parked WHERE consumer = $1 AND topic = $2 AND kafka_partition "
    "= $3 AND hold_key = $4 ORDER BY kafka_offset, id LIMIT 1";
static const char SQL_UNHOLD[] =
    "DELETE FROM kinbox_hold WHERE consumer = $1 AND topic = $2 AND "
    "kafka_partition = $3 AND hold_key = $4";
static const char SQL_REBLOCK[] =
    "UPDATE kinbox_hold SET blocker_id = (SELECT max(id) FROM "
    "kinbox_dead_letter WHERE consumer = $1 AND topic = $2 AND "
    "kafka_partition = $3 AND kafka_offset = $5) WHERE consumer = $1 AND "
    "topic = $2 AND kafka_partition = $3 AND hold_key = $4";
static const char SQL_INBOX[] =
    "SELECT topic, kafka_partition, kafka_offset FROM kinbox_inbox WHERE "
    "consumer = $1 AND message_id = $2 FOR UPDATE";
static const char SQL_RELEASABLE[] =
    "SELECT h.topic, h.kafka_partition, h.hold_key, d.kafka_offset FROM "
    "kinbox_hold h JOIN "
    "kinbox_dead_letter d ON d.id = h.blocker_id WHERE h.consumer = $1 AND "
    "d.status <> 'dead' ORDER BY h.held_at";

/* Column i of the head row r. */
#define HV(r, i) ((r)->values[i])
#define HL(r, i) ((r)->lens[i])

/* The parked message's inbox row: kept, or re-inserted (pruned). *dup =
 * another delivery applied its id (nothing to apply). */
static int
rel_inbox(relkey_t *k, struct kinbox_rows_s *r, bool *dup)
{
        kinbox__db_t *db = k->w->db;
        struct kinbox_rows_s *ib = NULL;
        /* A pruned row comes back in the range of now (db/inbox.c). */
        char part[24];
        snprintf(part, sizeof(part), "%lld",
                 (long long)kinbox__inbox_part_now(db));
        kinbox__param_t p[6] = {{k->c->name, 0, 0},  {HV(r, 2), 0, 0},
                                {k->p->topic, 0, 0}, {k->part, 0, 0},
                                {HV(r, 1), 0, 0},    {part, 0, 0}};
        *dup = false;
        int rc = db->ops->query(db, SQL_INBOX, 2, p, -1, &ib);
        for (size_t i = 0; !rc && ib && i < ib->nrows; i++) {
                char **iv = &ib->values[i * (size_t)ib->ncols];
                *dup = *dup || strcmp(iv[0], k->p->topic) ||
                       strcmp(iv[1], k->part) || strcmp(iv[2], HV(r, 1));
        }
        if (!rc && !(ib && ib->nrows))
                rc = db->ops->exec(db, db->ops->sql->inbox_insert_one, 6, p,
                                   -1);
        kinbox_rows_destroy(ib);
        return rc;
}

/* The head row as a message (borrowing r and *hd). */
static kinbox_msg_t *
rel_msg(relkey_t *k, struct kinbox_rows_s *r, kinbox__hdrs_t *hd,
        kinbox_header_t **hv)
{
        char why[128];
        *hv = NULL;
        if (kinbox__hdrcodec_decode(HV(r, 4), HV(r, 4) ? HL(r, 4) : 0, hd, why,
                                    sizeof(why)))
                return NULL;
        if (hd->n && !(*hv = calloc(hd->n, sizeof(**hv))))
                return NULL;
        for (size_t i = 0; i < hd->n; i++)
                (*hv)[i] = (kinbox_header_t){hd->v[i].name, hd->v[i].value,
                                             hd->v[i].size};
        kinbox__msg_parts_t parts = {
            .id = HV(r, 2),
            .topic = k->p->topic,
            .partition = k->p->partition,
            .offset = strtoll(HV(r, 1), NULL, 10),
            .timestamp = -1,
            .key = HV(r, 3),
            .key_len = HV(r, 3) ? HL(r, 3) : 0,
            .payload = HV(r, 5),
            .len = HV(r, 5) ? HL(r, 5) : 0,
            .headers = *hv,
            .nheaders = hd->n,
        };
        kinbox_msg_t *m = kinbox__msg_from_parts(&parts);
        if (m)
                m->attempt = k->tries + 1;
        return m;
}

/* What running the handler on a parked message came to. */
enum rel_run {
        RUN_APPLIED,
        RUN_FAILED, /* the handler's failure, with a fate */
        /* Not the handler's failure (connection, deadlock, kinbox's own
         * statement): try again later. */
        RUN_NOT_ITS_OWN
};

/* Run the handler on m; the fate of a failure in *fate, its reason in
 * why. */
static enum rel_run
rel_handle(relkey_t *k, kinbox_msg_t *m, kinbox__fate_t *fate, char *why,
           size_t wsz)
{
        kinbox_consumer_t *c = k->c;
        kinbox__db_t *db = k->w->db;
        kinbox_tx_t tx = {.c = c, .b = &k->w->b, .db = db, .tag = 0};
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        kinbox_result_t r;
        if (c->handler) {
                r = c->handler(&tx, m, c->opaque);
        } else {
                const kinbox_msg_t *one[1] = {m};
                kinbox_result_t r1 = KINBOX_RESULT_OK;
                r = c->batch_handler(&tx, one, 1, &r1, c->opaque);
                if (r == KINBOX_RESULT_OK)
                        r = r1;
        }
        enum rel_run ret = RUN_APPLIED;
        if (!(tx.failed && db->err.code) &&
            (r == KINBOX_RESULT_OK || r == KINBOX_RESULT_DUPLICATE) &&
            !db->ops->flush(db))
                goto out;
        if (db->err.code) {
                ret = kinbox__fate_classify(&tx, &db->err, fate)
                          ? RUN_FAILED
                          : RUN_NOT_ITS_OWN;
                snprintf(why, wsz, "%s", db->err.msg);
        } else {
                ret = RUN_FAILED;
                *fate = r == KINBOX_RESULT_REJECT ? KINBOX__FATE_DEAD
                                                  : KINBOX__FATE_RETRY;
                const char *rs = tx.reason[0] ? tx.reason
                                 : kinbox__msg_reason(m)
                                     ? kinbox__msg_reason(m)
                                     : "no reason given";
                snprintf(why, wsz, "%s", rs);
        }
out:
        kinbox__tx_clear_ukeys(&tx);
        free(tx.ukeys);
        return ret;
}

/* The head row failed for good: it is dead-lettered and blocks the key. */
static int
rel_dead(relkey_t *k, struct kinbox_rows_s *r, const char *why)
{
        kinbox__db_t *db = k->w->db;
        char att[16], reason[700];
        snprintf(att, sizeof(att), "%d", k->tries + 1);
        snprintf(reason, sizeof(reason), "%s (parked behind a held key)", why);
        kinbox__param_t d[10] = {{k->c->name, 0, 0},  {HV(r, 2), 0, 0},
                                 {k->p->topic, 0, 0}, {k->part, 0, 0},
                                 {HV(r, 1), 0, 0},    {HV(r, 3), HL(r, 3), 1},
                                 {HV(r, 4), 0, 0},    {HV(r, 5), HL(r, 5), 1},
                                 {reason, 0, 0},      {att, 0, 0}};
        kinbox__param_t u[5] = {{k->c->name, 0, 0},
                                {k->p->topic, 0, 0},
                                {k->part, 0, 0},
                                {k->key, k->klen, 1},
                                {HV(r, 1), 0, 0}};
        int rc =
            db->ops->exec(db, db->ops->sql->dead_letter_insert, 10, d, -1);
        if (!rc)
                rc = db->ops->exec(db, SQL_REBLOCK, 5, u, -1);
        k->blocker_off = strtoll(HV(r, 1), NULL, 10);
        return rc;
}

static int
rel_commit(relkey_t *k)
{
        if (kinbox__fault("release_commit")) {
                kinbox__log(&k->c->lg, KINBOX_LOG_WARNING, "fault",
                            "release_commit: SIGKILL");
                raise(SIGKILL);
        }
        return k->w->db->ops->commit(k->w->db);
}

/* Lock the hold, take its head row. *r NULL: no row left (hold deleted,
 * committed); *st: REL_BLOCKED / REL_DONE when the hold is not
 * releasable (rolled back). Returns a database error. */
static int
rel_head(relkey_t *k, struct kinbox_rows_s **r, enum rel *st)
{
        kinbox__db_t *db = k->w->db;
        struct kinbox_rows_s *lk = NULL;
        kinbox__param_t p[4] = {{k->c->name, 0, 0},
                                {k->p->topic, 0, 0},
                                {k->part, 0, 0},
                                {k->key, k->klen, 1}};
        *r = NULL;
        *st = REL_ONE;
        int rc = kinbox__db_begin(db, NULL); /* nothing to attribute */
        if (!rc)
                rc = db->ops->query(db, SQL_LOCK, 4, p, -1, &lk);
        if (!rc && (!lk || !lk->nrows || !strcmp(lk->values[0], "dead"))) {
                /* Released by another owner, or blocked again. */
                *st = lk && lk->nrows ? REL_BLOCKED : REL_DONE;
                db->ops->rollback(db);
                kinbox_rows_destroy(lk);
                return KINBOX_OK;
        }
        kinbox_rows_destroy(lk);
        if (!rc)
                rc = db->ops->query(db, SQL_HEAD, 4, p, -1, r);
        if (!rc && (!*r || !(*r)->nrows)) {
                kinbox_rows_destroy(*r);
                *r = NULL;
                *st = REL_DONE;
                rc = db->ops->exec(db, SQL_UNHOLD, 4, p, -1);
                if (!rc)
                        rc = rel_commit(k);
        }
        return rc;
}

/* Run the handler on m, the head row r, behind a savepoint of the
 * release's transaction: 0 when the transaction is to commit (applied, a
 * business duplicate, or dead-lettered: *st REL_BLOCKED), else why not. */
static int
rel_apply(relkey_t *k, struct kinbox_rows_s *r, kinbox_msg_t *m, enum rel *st)
{
        kinbox__db_t *db = k->w->db;
        kinbox__fate_t fate = KINBOX__FATE_RETRY;
        char why[600];
        int rc = db->ops->savepoint(db, "kinbox_rel");
        if (rc)
                return rc;
        enum rel_run h = rel_handle(k, m, &fate, why, sizeof(why));
        if (h == RUN_NOT_ITS_OWN)
                return KINBOX_ERR_TRANSIENT;
        if (h == RUN_FAILED && fate == KINBOX__FATE_HOLD) {
                /* The deployment is broken, not the message: the release
                 * waits, uncharged (held.h). */
                kinbox__log(&k->c->lg, KINBOX_LOG_ERR, "hold",
                            "%s [%" PRId32 "] offset %s: release held: %s",
                            k->p->topic, k->p->partition, HV(r, 1), why);
                return KINBOX_ERR_TRANSIENT;
        }
        if (h == RUN_FAILED && fate == KINBOX__FATE_RETRY &&
            k->tries + 1 < k->c->retry_max) {
                k->tries++;
                char tn[48];
                kinbox__log(&k->c->lg, KINBOX_LOG_INFO, "hold",
                            "%s [%" PRId32 "] offset %s%s: release attempt "
                            "%d failed: %s",
                            k->p->topic, k->p->partition, HV(r, 1),
                            kinbox__msg_trace_note(m, tn), k->tries, why);
                return KINBOX_ERR_TRANSIENT;
        }
        if (h == RUN_FAILED && (rc = db->ops->rollback_to(db, "kinbox_rel")))
                return rc;
        if (h == RUN_FAILED && fate != KINBOX__FATE_BIZDUP) {
                if ((rc = rel_dead(k, r, why)))
                        return rc;
                *st = REL_BLOCKED;
        }
        return KINBOX_OK;
}

/* Apply the head row of the key (see relkey_t) in one transaction. */
static enum rel
release_one(relkey_t *k)
{
        kinbox__db_t *db = k->w->db;
        struct kinbox_rows_s *r = NULL;
        kinbox__hdrs_t hd = {0};
        kinbox_header_t *hv = NULL;
        kinbox_msg_t *m = NULL;
        enum rel st;
        uint64_t gone = 0;
        bool dup = false;
        int rc = rel_head(k, &r, &st);
        if (rc || !r)
                goto out;
        kinbox__param_t pid[1] = {{HV(r, 0), 0, 0}};
        rc = db->ops->outbox->affected(db, db->ops->sql->parked_delete, 1, pid,
                                       &gone);
        if (!rc && gone != 1)
                rc = KINBOX_ERR_TRANSIENT; /* taken by another owner */
        if (!rc)
                rc = rel_inbox(k, r, &dup);
        if (!rc && !dup) {
                if (!(m = rel_msg(k, r, &hd, &hv))) {
                        rc = KINBOX_ERR_NOMEM;
                        goto out;
                }
                rc = rel_apply(k, r, m, &st);
        }
        if (!rc)
                rc = rel_commit(k);
        if (!rc && st == REL_ONE) {
                atomic_fetch_add(&k->c->st_released, 1);
                k->tries = 0;
        }
out:
        if (rc)
                kinbox__db_abandon(db);
        if (rc && rc != KINBOX_ERR_TRANSIENT)
                kinbox__log(&k->c->lg, KINBOX_LOG_WARNING, "hold",
                            "%s [%" PRId32 "]: release: %s", k->p->topic,
                            k->p->partition,
                            db->err.code ? db->err.msg : "out of memory");
        kinbox__msg_destroy(m);
        free(hv);
        kinbox__hdrs_free(&hd);
        kinbox_rows_destroy(r);
        return rc ? REL_RETRY : st;
}

/* Under w->lock: the worker's live partition topic/partition, or NULL. */
static kinbox__part_t *
rel_part(kinbox_consumer_t *c, kinbox__worker_t *w, const char *topic,
         int32_t pn)
{
        for (kinbox__part_t *p = c->parts; p; p = p->next)
                if (p->w == w && !p->revoked && p->partition == pn &&
                    !strcmp(p->topic, topic))
                        return p;
        return NULL;
}

/* Release the key's parked messages until none is left, it is blocked
 * again, a failure backs off, or budget rows went. */
static void
release_key(relkey_t *k, size_t *budget)
{
        kinbox_consumer_t *c = k->c;
        hent_t *e =
            kinbox__hs_add(&k->p->holds, k->key, k->klen, k->first_off);
        if (!e || (e->retry_at && e->retry_at > kinbox__now_ms()))
                return;
        k->tries = e->tries;
        while (*budget > 0) {
                pthread_mutex_lock(&k->w->lock);
                bool gone = k->p->revoked || k->w->stop;
                pthread_mutex_unlock(&k->w->lock);
                if (gone ||
                    (!k->w->db->native && kinbox__db_connect(k->w->db)))
                        return;
                enum rel st = release_one(k);
                /* The set may have moved: find the entry again. */
                e = kinbox__hs_find(k->p->holds, k->key, k->klen);
                if (!e)
                        return;
                e->tries = k->tries;
                if (st == REL_ONE) {
                        (*budget)--;
                        continue;
                }
                if (st == REL_RETRY) {
                        e->retry_at =
                            kinbox__now_ms() +
                            kinbox__backoff_ms(e->tries, c->backoff_base,
                                               c->backoff_max);
                } else if (st == REL_BLOCKED) {
                        e->retry_at = 0;
                        e->tries = 0;
                        if (k->blocker_off >= 0)
                                e->blocker_off = k->blocker_off;
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "hold",
                                    "%s [%" PRId32 "]: key held again "
                                    "(blocker at offset %" PRId64 ")",
                                    k->p->topic, k->p->partition,
                                    e->blocker_off);
                } else {
                        kinbox__hs_del(k->p->holds, e);
                        kinbox__log(&c->lg, KINBOX_LOG_INFO, "hold",
                                    "%s [%" PRId32 "]: key released, its "
                                    "parked messages applied",
                                    k->p->topic, k->p->partition);
                }
                return;
        }
}

/* The release counter (batch.c exports the others after each batch). */
static void
metrics_hold(kinbox_consumer_t *c)
{
        char l[300];
        kinbox__m_set("kinbox_consumer_messages_total",
                      kinbox__m_labels(l, sizeof(l), "consumer", c->name,
                                       "result", "released", (char *)NULL),
                      (double)atomic_load(&c->st_released));
}

/* One poll: the releasable holds of this consumer on w's partitions. */
static void
release_poll(kinbox_consumer_t *c, kinbox__worker_t *w)
{
        kinbox__db_t *db = w->db;
        struct kinbox_rows_s *rows = NULL;
        kinbox__param_t p[1] = {{c->name, 0, 0}};
        if ((!db->native && kinbox__db_connect(db)) ||
            db->ops->query(db, SQL_RELEASABLE, 1, p, -1, &rows)) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "hold",
                            "worker %d: looking for releasable holds: %s",
                            w->idx, db->err.msg);
                return;
        }
        size_t budget = c->batch_max;
        for (size_t i = 0; rows && i < rows->nrows && budget; i++) {
                char **v = rows->values + i * 4;
                int32_t pn = (int32_t)strtol(v[1], NULL, 10);
                pthread_mutex_lock(&w->lock);
                kinbox__part_t *pp = rel_part(c, w, v[0], pn);
                pthread_mutex_unlock(&w->lock);
                if (!pp)
                        continue;
                relkey_t k = {.c = c,
                              .w = w,
                              .p = pp,
                              .key = v[2],
                              .klen = rows->lens[i * 4 + 2],
                              .blocker_off = -1};
                k.first_off = strtoll(v[3], NULL, 10);
                snprintf(k.part, sizeof(k.part), "%" PRId32, pn);
                release_key(&k, &budget);
        }
        kinbox_rows_destroy(rows);
}

/* Under w->lock (released while reading): the holds of w's partitions
 * that could not be read at assignment. */
static void
load_unknown(kinbox_consumer_t *c, kinbox__worker_t *w)
{
        for (kinbox__part_t *p = c->parts; p; p = p->next) {
                if (p->w != w || p->revoked || !p->hold_unknown)
                        continue;
                pthread_mutex_unlock(&w->lock);
                bool ok = (w->db->native || !kinbox__db_connect(w->db)) &&
                          kinbox__hold_load(c, w->db, p);
                pthread_mutex_lock(&w->lock);
                p->hold_unknown = !ok;
        }
}

void
kinbox__hold_tick(kinbox_consumer_t *c, kinbox__worker_t *w)
{
        if (!c->hold_on)
                return;
        int64_t now = kinbox__now_ms();
        if (now < w->hold_poll_at)
                return;
        size_t held = 0;
        bool unknown = false;
        for (kinbox__part_t *p = c->parts; p; p = p->next)
                if (p->w == w && !p->revoked) {
                        held += p->holds ? p->holds->n : 0;
                        unknown = unknown || p->hold_unknown;
                }
        if (!held && !unknown)
                return;
        w->hold_poll_at = now + c->release_poll;
        /* A revoke waits for us as for a batch. */
        w->in_batch = true;
        if (unknown)
                load_unknown(c, w);
        pthread_mutex_unlock(&w->lock);
        release_poll(c, w);
        metrics_hold(c);
        pthread_mutex_lock(&w->lock);
        w->in_batch = false;
        w->batch_seq++;
        pthread_cond_broadcast(&w->idle);
}
