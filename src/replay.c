/*
 * replay.c -- dead-letter replay.
 *
 * Replay runs the consumer's handler on the stored copy of a dead letter in
 * one transaction with its inbox row, so the effect is applied once: the
 * dead letter row is locked (FOR UPDATE) and must still be `dead`, the
 * message id's inbox row is taken over (or refused when another delivery
 * applied that id), the handler runs, the dead letter becomes `replayed`.
 */
#include "admin_int.h"
#include "db.h"
#include "hdrcodec.h"
#include "internal.h"
#include "metrics.h"
#include "tx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* headers: the stored form (hdrcodec.h), as kinbox_header_t for the
 * handler. */

typedef struct hlist {
        kinbox__hdrs_t h;
        kinbox_header_t *v;
        size_t n;
} hlist_t;

static void
hlist_free(hlist_t *h)
{
        kinbox__hdrs_free(&h->h);
        free(h->v);
        h->v = NULL;
        h->n = 0;
}

static int
headers_parse(const char *s, hlist_t *h, char *why, size_t why_size)
{
        memset(h, 0, sizeof(*h));
        if (kinbox__hdrcodec_decode(s, s ? strlen(s) : 0, &h->h, why,
                                    why_size))
                return -1;
        if (!h->h.n)
                return 0;
        if (!(h->v = calloc(h->h.n, sizeof(*h->v))))
                return -1;
        for (size_t i = 0; i < h->h.n; i++)
                h->v[i] = (kinbox_header_t){h->h.v[i].name, h->h.v[i].value,
                                            h->h.v[i].size};
        h->n = h->h.n;
        return 0;
}

/* ------------------------------------------------------------------ */
/* replay */

/* The dead letter's row may be replayed: dead, with a message id. */
static kinbox_err_t
replay_allowed(kinbox_admin_t *adm, int64_t id, struct kinbox_rows_s *dl)
{
        if (!dl || !dl->nrows) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no dead letter with id %" PRId64, id);
                return KINBOX_ERR_NOT_FOUND;
        }
        char **v = dl->values;
        if (strcmp(v[8], "dead")) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 " is %s, not dead: nothing "
                         "to replay",
                         id, v[8]);
                return KINBOX_ERR_STATE;
        }
        if (!v[1]) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 " has no message id (it "
                         "could not be extracted), so replay could not "
                         "deduplicate it: discard it instead",
                         id);
                return KINBOX_ERR_STATE;
        }
        return KINBOX_OK;
}

/*
 * The id's inbox row becomes the replay's: the dead letter's own row is
 * kept (or inserted again when it was pruned); another delivery's row means that one applied the id
 * (replaying would apply it twice): KINBOX_ERR_DUPLICATE. *rcp gets a
 * database error.
 */
static kinbox_err_t
replay_inbox(kinbox_admin_t *adm, int64_t id, char **v, size_t *len, int *rcp)
{
        kinbox__db_t *db = adm->db;
        struct kinbox_rows_s *ib = NULL;
        kinbox_err_t ret = KINBOX_OK;
        kinbox__param_t p2[2] = {{v[0], 0, 0}, {v[1], len[1], 0}};
        int rc = db->ops->query(db,
                                "SELECT topic, kafka_partition, kafka_offset "
                                "FROM kinbox_inbox WHERE consumer = $1 AND "
                                "message_id = $2 FOR UPDATE",
                                2, p2, -1, &ib);
        for (size_t r = 0; !rc && !ret && ib && r < ib->nrows; r++) {
                char **iv = &ib->values[r * (size_t)ib->ncols];
                if (strcmp(iv[0], v[2]) || strcmp(iv[1], v[3]) ||
                    strcmp(iv[2], v[4])) {
                        snprintf(adm->errstr, sizeof(adm->errstr),
                                 "message id of dead letter %" PRId64
                                 " was applied by another delivery (%s [%s] "
                                 "offset %s): not replayed",
                                 id, iv[0], iv[1], iv[2]);
                        ret = KINBOX_ERR_DUPLICATE;
                }
        }
        bool kept = !rc && ib && ib->nrows;
        kinbox_rows_destroy(ib);
        /* A kept row (and its boundary marker) stays where the message's
         * time put it; its retention starts again. A pruned one comes
         * back in the range of now. */
        char part[24];
        snprintf(part, sizeof(part), "%lld",
                 (long long)kinbox__inbox_part_now(db));
        kinbox__param_t p6[6] = {{v[0], 0, 0}, {v[1], len[1], 0},
                                 {v[2], 0, 0}, {v[3], 0, 0},
                                 {v[4], 0, 0}, {part, 0, 0}};
        if (!rc && !ret && kept)
                rc = db->ops->exec(db,
                                   "UPDATE kinbox_inbox SET processed_at = "
                                   "CURRENT_TIMESTAMP WHERE consumer = $1 "
                                   "AND message_id = $2",
                                   2, p2, -1);
        else if (!rc && !ret)
                rc = db->ops->exec(db, db->ops->sql->inbox_insert_one, 6, p6,
                                   -1);
        *rcp = rc;
        return ret;
}

/* Run the handler on the stored copy; its verdict (DUPLICATE: "already
 * applied", nothing left to do, counts as OK). *rcp gets a database error
 * that is not the handler's (lost connection, deadlock). */
static kinbox_result_t
replay_handler(kinbox_tx_t *tx, kinbox_msg_t *msg, kinbox_handler_fn fn,
               kinbox_batch_handler_fn bfn, void *opaque, int *rcp,
               bool *stmt_failed)
{
        kinbox__db_t *db = kinbox__tx_db(tx);
        kinbox__tx_reset(tx);
        kinbox_result_t r;
        *rcp = KINBOX_OK;
        if (bfn) {
                const kinbox_msg_t *one[1] = {msg};
                kinbox_result_t res1 = KINBOX_RESULT_OK;
                r = bfn(tx, one, 1, &res1, opaque);
                if (r == KINBOX_RESULT_OK)
                        r = res1;
        } else {
                r = fn(tx, msg, opaque);
        }
        if (r == KINBOX_RESULT_DUPLICATE)
                r = KINBOX_RESULT_OK;
        *stmt_failed = false;
        if (r == KINBOX_RESULT_OK && kinbox__tx_failed(tx)) {
                r = KINBOX_RESULT_RETRY;
                *stmt_failed = true;
        }
        /* The handler's queued statements: their errors are its own. */
        int rc;
        if (r == KINBOX_RESULT_OK && (rc = db->ops->flush(db))) {
                if (rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_TRANSIENT)
                        *rcp = rc;
                r = KINBOX_RESULT_RETRY;
                *stmt_failed = true;
        }
        return r;
}

/* Why the handler did not apply the replayed message. */
static void
replay_refused(kinbox_admin_t *adm, int64_t id, kinbox_tx_t *tx,
               const kinbox_msg_t *msg, kinbox_result_t r, bool stmt_failed)
{
        kinbox__db_t *db = adm->db;
        const char *why = kinbox__tx_reason(tx)[0]  ? kinbox__tx_reason(tx)
                          : kinbox__msg_reason(msg) ? kinbox__msg_reason(msg)
                          : db->err.code            ? db->err.msg
                                                    : "no reason given";
        if (db->err.code && !kinbox__tx_reason(tx)[0])
                why = db->err.msg;
        /* A statement that failed under a handler returning OK is the
         * cause, not a RETRY the handler never returned. */
        snprintf(adm->errstr, sizeof(adm->errstr),
                 "%s: %s; rolled back, dead letter %" PRId64 " unchanged",
                 stmt_failed                 ? "a statement of the handler "
                                               "failed"
                 : r == KINBOX_RESULT_REJECT ? "handler returned REJECT"
                                             : "handler returned RETRY",
                 why, id);
}

/* The dead letter's stored copy as a message (borrowing v and hl). */
static kinbox_msg_t *
replay_msg(char **v, size_t *len, const hlist_t *hl)
{
        kinbox__msg_parts_t parts = {
            .id = v[1],
            .topic = v[2],
            .partition = (int32_t)strtol(v[3], NULL, 10),
            .offset = strtoll(v[4], NULL, 10),
            .timestamp = -1,
            .key = v[5],
            .key_len = v[5] ? len[5] : 0,
            .payload = v[7],
            .len = v[7] ? len[7] : 0,
            .headers = hl->v,
            .nheaders = hl->n,
        };
        return kinbox__msg_from_parts(&parts);
}

kinbox_err_t
kinbox_dead_replay(kinbox_admin_t *adm, int64_t id, kinbox_handler_fn fn,
                   kinbox_batch_handler_fn bfn, void *opaque,
                   kinbox_result_t *resultp)
{
        kinbox__db_t *db = adm->db;
        struct kinbox_rows_s *dl = NULL;
        kinbox_tx_t *tx = NULL;
        kinbox_msg_t *msg = NULL;
        hlist_t hl = {0};
        kinbox_err_t ret = KINBOX_OK;
        char ids[24];
        int rc;
        adm->errstr[0] = '\0';
        if (resultp)
                *resultp = KINBOX_RESULT_RETRY;
        if (!fn && !bfn) {
                snprintf(adm->errstr, sizeof(adm->errstr), "no handler");
                return KINBOX_ERR_INVALID;
        }
        snprintf(ids, sizeof(ids), "%" PRId64, id);
        if (!db->native && (rc = kinbox__db_connect(db)))
                return kinbox__admin_fail(adm, rc);
        if ((rc = db->ops->begin(db)))
                return kinbox__admin_fail(adm, rc);
        kinbox__param_t p1[1] = {{ids, 0, 0}};
        rc =
            db->ops->query(db, db->ops->sql->dead_letter_lock, 1, p1, -1, &dl);
        if (rc)
                goto dberr;
        if ((ret = replay_allowed(adm, id, dl)))
                goto out;
        char **v = dl->values;
        size_t *len = dl->lens;
        char hwhy[200] = "out of memory";
        if (headers_parse(v[6], &hl, hwhy, sizeof(hwhy))) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 ": stored headers do not "
                         "parse: %s",
                         id, hwhy);
                ret = KINBOX_ERR_INVALID;
                goto out;
        }
        if ((ret = replay_inbox(adm, id, v, len, &rc)))
                goto out;
        if (rc)
                goto dberr;
        msg = replay_msg(v, len, &hl);
        tx = kinbox__tx_new(db, v[0]);
        if (!msg || !tx) {
                ret = KINBOX_ERR_NOMEM;
                goto out;
        }
        bool stmt_failed = false;
        kinbox_result_t r =
            replay_handler(tx, msg, fn, bfn, opaque, &rc, &stmt_failed);
        if (rc)
                goto dberr;
        if (resultp)
                *resultp = r;
        if (r != KINBOX_RESULT_OK) {
                replay_refused(adm, id, tx, msg, r, stmt_failed);
                ret = KINBOX_ERR_INVALID;
                goto out;
        }
        rc = db->ops->exec(db, db->ops->sql->dead_letter_replayed, 1, p1, -1);
        if (!rc)
                rc = db->ops->commit(db);
        if (rc)
                goto dberr;
        goto done;
dberr:
        ret = kinbox__admin_fail(adm, rc);
        goto done;
out:
        kinbox__db_abandon(db);
done:
        kinbox__msg_destroy(msg);
        kinbox__tx_destroy(tx);
        hlist_free(&hl);
        kinbox_rows_destroy(dl);
        return ret;
}
