/*
 * outbox_admin.c -- the operator calls on outbox rows (requeue, cancel,
 * list) on the operator handle (admin_int.h). No dialect SQL here: every
 * statement comes from db->ops->outbox (db/pg_outbox.c,
 * db/mysql_outbox.c); requeueing wakes listening relays from there
 * (PostgreSQL NOTIFY).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_int.h"
#include "db.h"
#include "internal.h"

#define OB(db) ((db)->ops->outbox)

/* The handle connects lazily; after a lost connection the next call
 * connects again (kinbox__admin_fail() dropped it). */
static kinbox_err_t
connect_once(kinbox_admin_t *adm)
{
        adm->errstr[0] = '\0';
        if (adm->db->native)
                return KINBOX_OK;
        int rc = kinbox__db_connect(adm->db);
        return rc ? kinbox__admin_fail(adm, rc) : KINBOX_OK;
}

static kinbox_err_t
update(kinbox_admin_t *adm, const char *sql, int n, const kinbox__param_t *p,
       uint64_t *countp)
{
        kinbox_err_t rc = connect_once(adm);
        if (rc)
                return rc;
        uint64_t count = 0;
        int r = OB(adm->db)->affected(adm->db, sql, n, p, &count);
        if (r)
                return kinbox__admin_fail(adm, r);
        if (countp)
                *countp = count;
        return KINBOX_OK;
}

/* One row by id: KINBOX_ERR_NOT_FOUND ("no <which> outbox row with id N")
 * when the statement changed none. */
static kinbox_err_t
update_id(kinbox_admin_t *adm, const char *sql, int64_t id, const char *which)
{
        if (!adm || id <= 0)
                return KINBOX_ERR_INVALID;
        char idbuf[24];
        snprintf(idbuf, sizeof(idbuf), "%" PRId64, id);
        kinbox__param_t p[1] = {{idbuf, 0, 0}};
        uint64_t n = 0;
        kinbox_err_t rc = update(adm, sql, 1, p, &n);
        if (!rc && n == 0) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no %s outbox row with id %" PRId64, which, id);
                return KINBOX_ERR_NOT_FOUND;
        }
        return rc;
}

kinbox_err_t
kinbox_outbox_requeue(kinbox_admin_t *adm, int64_t id)
{
        return update_id(adm, adm ? OB(adm->db)->requeue_id : NULL, id,
                         "dead or canceled");
}

kinbox_err_t
kinbox_outbox_cancel(kinbox_admin_t *adm, int64_t id)
{
        return update_id(adm, adm ? OB(adm->db)->cancel_id : NULL, id,
                         "pending");
}

kinbox_err_t
kinbox_outbox_requeue_destination(kinbox_admin_t *adm, const char *destination,
                                  uint64_t *countp)
{
        if (!adm)
                return KINBOX_ERR_INVALID;
        kinbox__param_t p[1] = {{destination ? destination : "", 0, 0}};
        return update(adm, OB(adm->db)->requeue_dest, 1, p, countp);
}

kinbox_err_t
kinbox_outbox_cancel_destination(kinbox_admin_t *adm, const char *destination,
                                 uint64_t *countp)
{
        if (!adm || !destination || !*destination)
                return KINBOX_ERR_INVALID;
        kinbox__param_t p[1] = {{destination, 0, 0}};
        return update(adm, OB(adm->db)->cancel_dest, 1, p, countp);
}

static const char *const status_names[] = {"", "pending", "sent", "dead",
                                           "canceled"};

static kinbox_outbox_status_t
status_of(const char *s)
{
        for (int i = 1; i < 5; i++)
                if (s && !strcmp(s, status_names[i]))
                        return (kinbox_outbox_status_t)i;
        return KINBOX_OUTBOX_ANY;
}

static kinbox_outbox_row_t
row_at(const struct kinbox_rows_s *rows, size_t i)
{
        char **v = rows->values + i * (size_t)rows->ncols;
        return (kinbox_outbox_row_t){
            .id = kinbox__i64_or(v[0], 0),
            .status = status_of(v[1]),
            .destination = v[2],
            .idem_key = v[3],
            .aggregate_id = v[4],
            .attempts = (int)kinbox__i64_or(v[5], 0),
            .max_attempts = (int)kinbox__i64_or(v[6], 0),
            .last_error = v[7],
            .created_at = v[8],
            .next_attempt_at = v[9],
            .payload_size = (size_t)kinbox__i64_or(v[10], 0),
            .sent_at = v[11],
            .version = kinbox__i64_or(v[12], 0),
        };
}

kinbox_err_t
kinbox_outbox_list(kinbox_admin_t *adm, kinbox_outbox_status_t status,
                   const char *destination, int64_t after_id, size_t limit,
                   kinbox_outbox_row_fn fn, void *opaque)
{
        if (!adm || !fn || (int)status < 0 || (int)status > 4)
                return KINBOX_ERR_INVALID;
        kinbox_err_t rc = connect_once(adm);
        if (rc)
                return rc;
        if (limit == 0 || limit > 100000)
                limit = 100000;
        char idbuf[24];
        snprintf(idbuf, sizeof(idbuf), "%" PRId64, after_id);
        kinbox__param_t p[3] = {{idbuf, 0, 0},
                                {status_names[status], 0, 0},
                                {destination ? destination : "", 0, 0}};
        char sql[1024];
        snprintf(sql, sizeof(sql), "%s LIMIT %zu", OB(adm->db)->list, limit);
        struct kinbox_rows_s *rows = NULL;
        int r = adm->db->ops->query(adm->db, sql, 3, p, -1, &rows);
        if (r) {
                kinbox_rows_destroy(rows);
                return kinbox__admin_fail(adm, r);
        }
        for (size_t i = 0; rows && i < rows->nrows; i++) {
                kinbox_outbox_row_t row = row_at(rows, i);
                if (fn(&row, opaque))
                        break;
        }
        kinbox_rows_destroy(rows);
        return KINBOX_OK;
}
