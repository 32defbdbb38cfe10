/*
 * dead.c -- the operator's side of dead letters: list, show, discard,
 * the messages parked behind one (dead_letter.hold_key) and waiting for
 * their release. Replay is replay.c's. Statements come from the backend's
 * table (db.h, src/db/opsql.h).
 */
#include "admin_int.h"
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

/* A statement whose text is a printf format of (long limit). */
static kinbox_err_t
query_limit(kinbox_admin_t *adm, const char *fmt, long limit, int n,
            const char *const *v, kinbox_rows_t **rowsp)
{
        char sql[2048];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(sql, sizeof(sql), fmt, limit);
#pragma GCC diagnostic pop
        return kinbox__admin_query(adm, sql, n, v, rowsp);
}

/* A result that owns the rows its strings point into. */
typedef struct dead_own {
        union {
                kinbox_dead_list_t list;
                kinbox_parked_list_t parked;
                kinbox_dead_letter_t letter;
        } pub;
        kinbox_rows_t *rows;
        void *items;
} dead_own_t;

static const char *
bytes(kinbox_rows_t *r, size_t i, int c, size_t *len)
{
        *len = 0;
        return kinbox_rows_value(r, i, c, len);
}

static const char *
text(kinbox_rows_t *r, size_t i, int c)
{
        return kinbox_rows_value(r, i, c, NULL);
}

/* The list columns of dead_list (opsql.h); show's when show. */
static void
fill_letter(kinbox_dead_letter_t *d, kinbox_rows_t *r, size_t i, bool show)
{
        /* show: id, consumer, message id, topic, partition, offset, key,
         * headers, payload, error, attempts, first failed at, dead at,
         * status; list: id, consumer, topic, partition, offset, message
         * id, status, attempts, dead at, error, parked behind it. */
        static const int lc[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
        static const int sc[] = {0, 1, 3, 4, 5, 2, 13, 10, 12, 9};
        const int *c = show ? sc : lc;
        d->id = kinbox__rows_i64(r, i, c[0], 0);
        d->consumer = text(r, i, c[1]);
        d->topic = text(r, i, c[2]);
        d->partition = (int32_t)kinbox__rows_i64(r, i, c[3], 0);
        d->offset = kinbox__rows_i64(r, i, c[4], 0);
        d->message_id = bytes(r, i, c[5], &d->message_id_len);
        d->status = text(r, i, c[6]);
        d->attempts = (int)kinbox__rows_i64(r, i, c[7], 0);
        d->dead_at = text(r, i, c[8]);
        d->error = text(r, i, c[9]);
        d->holds_back = show ? -1 : kinbox__rows_i64(r, i, 10, 0);
        if (!show)
                return;
        d->first_failed_at = text(r, i, 11);
        d->key = bytes(r, i, 6, &d->key_len);
        d->headers = bytes(r, i, 7, &d->headers_len);
        d->payload = bytes(r, i, 8, &d->payload_len);
}

static void
fill_parked(kinbox_parked_t *p, kinbox_rows_t *r, size_t i)
{
        p->id = kinbox__rows_i64(r, i, 0, 0);
        p->consumer = text(r, i, 1);
        p->topic = text(r, i, 2);
        p->partition = (int32_t)kinbox__rows_i64(r, i, 3, 0);
        p->offset = kinbox__rows_i64(r, i, 4, 0);
        p->message_id = bytes(r, i, 5, &p->message_id_len);
        p->key = bytes(r, i, 6, &p->key_len);
        p->blocker_id = kinbox__rows_i64(r, i, 7, 0);
        p->parked_at = text(r, i, 8);
}

/* Rows of a list statement into a new result of n items of size sz. */
static kinbox_err_t
own_rows(kinbox_admin_t *adm, kinbox_rows_t *r, size_t sz, dead_own_t **op)
{
        dead_own_t *o = kinbox__calloc(1, sizeof(*o));
        size_t n = kinbox_rows_count(r);
        if (o)
                o->items = kinbox__calloc(n ? n : 1, sz);
        if (!o || !o->items) {
                free(o);
                kinbox_rows_destroy(r);
                snprintf(adm->errstr, sizeof(adm->errstr), "out of memory");
                return KINBOX_ERR_NOMEM;
        }
        o->rows = r;
        *op = o;
        return KINBOX_OK;
}

/* A list statement (query_limit()) run, its rows owned by a new result
 * of as many items of size sz. */
static kinbox_err_t
own_list(kinbox_admin_t *adm, const char *fmt, long limit, int n,
         const char *const *v, size_t sz, dead_own_t **op)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = query_limit(adm, fmt, limit, n, v, &r);
        return rc ? rc : own_rows(adm, r, sz, op);
}

static void
own_destroy(void *pub)
{
        dead_own_t *o = pub; /* pub is the first member */
        if (!o)
                return;
        kinbox_rows_destroy(o->rows);
        free(o->items);
        free(o);
}

kinbox_err_t
kinbox_dead_list(kinbox_admin_t *adm, const char *consumer, const char *status,
                 long limit, kinbox_dead_list_t **listp)
{
        if (!listp)
                return KINBOX_ERR_INVALID;
        *listp = NULL;
        /* NULL = no filter (COALESCE gives the parameter its column's type
         * on PostgreSQL, no cast per backend). */
        const char *v[2] = {consumer, status};
        dead_own_t *o = NULL;
        kinbox_err_t rc = own_list(adm, adm->db->ops->sql->dead_list, limit, 2,
                                   v, sizeof(kinbox_dead_letter_t), &o);
        if (rc)
                return rc;
        o->pub.list.letters = o->items;
        o->pub.list.count = kinbox_rows_count(o->rows);
        for (size_t i = 0; i < o->pub.list.count; i++)
                fill_letter(&o->pub.list.letters[i], o->rows, i, false);
        *listp = &o->pub.list;
        return KINBOX_OK;
}

void
kinbox_dead_list_destroy(kinbox_dead_list_t *l)
{
        own_destroy(l);
}

kinbox_err_t
kinbox_dead_parked(kinbox_admin_t *adm, const char *consumer, long limit,
                   kinbox_parked_list_t **listp)
{
        if (!listp)
                return KINBOX_ERR_INVALID;
        *listp = NULL;
        const char *v[1] = {consumer};
        dead_own_t *o = NULL;
        kinbox_err_t rc = own_list(adm, adm->db->ops->sql->dead_parked, limit,
                                   1, v, sizeof(kinbox_parked_t), &o);
        if (rc)
                return rc;
        o->pub.parked.parked = o->items;
        o->pub.parked.count = kinbox_rows_count(o->rows);
        for (size_t i = 0; i < o->pub.parked.count; i++)
                fill_parked(&o->pub.parked.parked[i], o->rows, i);
        *listp = &o->pub.parked;
        return KINBOX_OK;
}

void
kinbox_parked_list_destroy(kinbox_parked_list_t *l)
{
        own_destroy(l);
}

/* A statement of one dead letter id. */
static kinbox_err_t
query_id(kinbox_admin_t *adm, const char *sql, int64_t id,
         kinbox_rows_t **rowsp)
{
        char ids[24];
        snprintf(ids, sizeof(ids), "%" PRId64, id);
        const char *v[1] = {ids};
        return kinbox__admin_query(adm, sql, 1, v, rowsp);
}

static kinbox_err_t
not_found(kinbox_admin_t *adm, int64_t id)
{
        snprintf(adm->errstr, sizeof(adm->errstr),
                 "no dead letter with id %" PRId64, id);
        return KINBOX_ERR_NOT_FOUND;
}

kinbox_err_t
kinbox_dead_show(kinbox_admin_t *adm, int64_t id, kinbox_dead_letter_t **dlp)
{
        if (!dlp)
                return KINBOX_ERR_INVALID;
        *dlp = NULL;
        kinbox_rows_t *r = NULL;
        dead_own_t *o = NULL;
        kinbox_err_t rc = query_id(adm, adm->db->ops->sql->dead_show, id, &r);
        if (!rc && !kinbox_rows_count(r)) {
                kinbox_rows_destroy(r);
                return not_found(adm, id);
        }
        if (!rc)
                rc = own_rows(adm, r, 1, &o);
        if (rc)
                return rc;
        fill_letter(&o->pub.letter, r, 0, true);
        *dlp = &o->pub.letter;
        return KINBOX_OK;
}

void
kinbox_dead_letter_destroy(kinbox_dead_letter_t *dl)
{
        own_destroy(dl);
}

kinbox_err_t
kinbox_dead_discard(kinbox_admin_t *adm, int64_t id)
{
        const struct kinbox__sql *d = adm->db->ops->sql;
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = query_id(adm, d->dead_status, id, &r);
        if (rc)
                return rc;
        if (!kinbox_rows_count(r)) {
                kinbox_rows_destroy(r);
                return not_found(adm, id);
        }
        const char *st = kinbox_rows_value(r, 0, 0, NULL);
        if (!st || strcmp(st, "dead")) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 " is %s already", id,
                         st ? st : "(null)");
                kinbox_rows_destroy(r);
                return KINBOX_ERR_STATE;
        }
        kinbox_rows_destroy(r);
        return query_id(adm, d->dead_discard, id, NULL);
}

static int64_t
val_int(kinbox_rows_t *r, int c)
{
        return kinbox__rows_i64(r, 0, c, 0);
}

kinbox_err_t
kinbox_dead_followers(kinbox_admin_t *adm, int64_t id, int64_t *count,
                      kinbox_dead_follower_t *last)
{
        const struct kinbox__sql *d = adm->db->ops->sql;
        kinbox_rows_t *r = NULL;
        if (last)
                memset(last, 0, sizeof(*last));
        kinbox_err_t rc = query_id(adm, d->dead_held, id, &r);
        if (count)
                *count = rc ? -1 : val_int(r, 0);
        kinbox_rows_destroy(r);
        r = NULL;
        if (!last)
                return rc;
        kinbox_err_t rc2 = query_id(adm, d->dead_last_follower, id, &r);
        if (!rc2 && kinbox_rows_count(r)) {
                last->parked_id = val_int(r, 0);
                snprintf(last->consumer, sizeof(last->consumer), "%s",
                         kinbox_rows_value(r, 0, 1, NULL));
                snprintf(last->topic, sizeof(last->topic), "%s",
                         kinbox_rows_value(r, 0, 2, NULL));
                last->partition = (int32_t)val_int(r, 3);
                last->offset = val_int(r, 4);
        }
        kinbox_rows_destroy(r);
        return rc ? rc : rc2;
}

/* The last follower left the parked table: applied, or dead-lettered
 * itself (then it holds the key). */
static kinbox_err_t
wait_done(kinbox_admin_t *adm, const kinbox_dead_follower_t *f,
          int64_t *blocker)
{
        char part[16], off[24];
        snprintf(part, sizeof(part), "%" PRId32, f->partition);
        snprintf(off, sizeof(off), "%" PRId64, f->offset);
        const char *v[4] = {f->consumer, f->topic, part, off};
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc =
            kinbox__admin_query(adm, adm->db->ops->sql->dead_at, 4, v, &r);
        if (!rc && kinbox_rows_count(r)) {
                if (blocker)
                        *blocker = val_int(r, 0);
                rc = KINBOX_ERR_STATE;
        }
        kinbox_rows_destroy(r);
        return rc;
}

kinbox_err_t
kinbox_dead_wait(kinbox_admin_t *adm, int64_t id,
                 const kinbox_dead_follower_t *last, int timeout_ms,
                 int64_t *blocker)
{
        if (!last || !last->parked_id)
                return KINBOX_OK;
        char pid[24], ids[24];
        snprintf(pid, sizeof(pid), "%" PRId64, last->parked_id);
        snprintf(ids, sizeof(ids), "%" PRId64, id);
        const char *v[2] = {pid, ids};
        for (int waited = 0; waited < timeout_ms; waited += 200) {
                kinbox_rows_t *r = NULL;
                kinbox_err_t rc = kinbox__admin_query(
                    adm, adm->db->ops->sql->dead_follower_state, 2, v, &r);
                if (rc)
                        return rc;
                bool done = !kinbox_rows_count(r);
                const char *st =
                    done ? NULL : kinbox_rows_value(r, 0, 1, NULL);
                if (!done && st && !strcmp(st, "dead")) {
                        if (blocker)
                                *blocker = val_int(r, 0);
                        kinbox_rows_destroy(r);
                        return KINBOX_ERR_STATE;
                }
                kinbox_rows_destroy(r);
                if (done)
                        return wait_done(adm, last, blocker);
                usleep(200 * 1000);
        }
        return KINBOX_ERR_TIMEOUT;
}
