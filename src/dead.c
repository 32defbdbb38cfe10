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

kinbox_err_t
kinbox_dead_list(kinbox_admin_t *adm, const char *consumer, const char *status,
                 long limit, kinbox_rows_t **rowsp)
{
        /* NULL = no filter (COALESCE gives the parameter its column's type
         * on PostgreSQL, no cast per backend). */
        const char *v[2] = {consumer, status};
        return query_limit(adm, adm->db->ops->sql->dead_list, limit, 2, v,
                           rowsp);
}

kinbox_err_t
kinbox_dead_parked(kinbox_admin_t *adm, const char *consumer, long limit,
                   kinbox_rows_t **rowsp)
{
        const char *v[1] = {consumer};
        return query_limit(adm, adm->db->ops->sql->dead_parked, limit, 1, v,
                           rowsp);
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
kinbox_dead_show(kinbox_admin_t *adm, int64_t id, kinbox_rows_t **rowsp)
{
        kinbox_err_t rc =
            query_id(adm, adm->db->ops->sql->dead_show, id, rowsp);
        if (!rc && !kinbox_rows_count(*rowsp)) {
                kinbox_rows_destroy(*rowsp);
                *rowsp = NULL;
                return not_found(adm, id);
        }
        return rc;
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
        const char *v = kinbox_rows_value(r, 0, c, NULL);
        return v ? strtoll(v, NULL, 10) : 0;
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
