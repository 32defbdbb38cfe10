/*
 * verify.c -- `kinbox verify`'s database side: a consumer's inbox rows
 * and dead letters against its watermarks (kinbox_offsets). Statements
 * come from the backend's table (db.h, src/db/opsql.h).
 */
#include "admin_int.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* The result owns the rows its strings point into. */
typedef struct verify_own {
        kinbox_verify_result_t pub;
        kinbox_rows_t *rows[2]; /* the strings point into these */
} verify_own_t;

static int64_t
cell(kinbox_rows_t *r, size_t i, int c, int64_t null)
{
        return kinbox__rows_i64(r, i, c, null);
}

static const char *
str(kinbox_rows_t *r, size_t i, int c)
{
        const char *v = kinbox_rows_value(r, i, c, NULL);
        return v ? v : "";
}

static void
fill(verify_own_t *o)
{
        kinbox_rows_t *a = o->rows[0], *p = o->rows[1];
        for (size_t i = 0; i < o->pub.nahead; i++) {
                kinbox_verify_ahead_t *x = &o->pub.ahead[i];
                x->source = str(a, i, 0);
                x->topic = str(a, i, 1);
                x->partition = (int32_t)cell(a, i, 2, 0);
                x->rows = cell(a, i, 3, 0);
                x->lowest = cell(a, i, 4, -1);
                x->highest = cell(a, i, 5, -1);
                x->watermark = cell(a, i, 6, -1);
        }
        for (size_t i = 0; i < o->pub.npartitions; i++) {
                kinbox_verify_partition_t *x = &o->pub.partitions[i];
                x->topic = str(p, i, 0);
                x->partition = (int32_t)cell(p, i, 1, 0);
                x->watermark = cell(p, i, 2, 0);
                x->rows = cell(p, i, 3, 0);
                x->lowest = cell(p, i, 4, -1);
        }
}

kinbox_err_t
kinbox_verify(kinbox_admin_t *adm, const char *consumer,
              kinbox_verify_result_t **resultp)
{
        const struct kinbox__sql *d = adm->db->ops->sql;
        const char *v[1] = {consumer};
        *resultp = NULL;
        verify_own_t *o = kinbox__calloc(1, sizeof(*o));
        if (!o)
                return KINBOX_ERR_NOMEM;
        kinbox_err_t rc =
            kinbox__admin_query(adm, d->verify_ahead, 1, v, &o->rows[0]);
        if (!rc)
                rc = kinbox__admin_query(adm, d->verify_cover, 1, v,
                                         &o->rows[1]);
        if (!rc) {
                o->pub.nahead = kinbox_rows_count(o->rows[0]);
                o->pub.npartitions = kinbox_rows_count(o->rows[1]);
                o->pub.ahead =
                    kinbox__calloc(o->pub.nahead + 1, sizeof(*o->pub.ahead));
                o->pub.partitions = kinbox__calloc(o->pub.npartitions + 1,
                                                   sizeof(*o->pub.partitions));
                if (!o->pub.ahead || !o->pub.partitions)
                        rc = KINBOX_ERR_NOMEM;
        }
        if (rc) {
                kinbox_verify_result_destroy(&o->pub);
                return rc;
        }
        fill(o);
        *resultp = &o->pub;
        return KINBOX_OK;
}

void
kinbox_verify_result_destroy(kinbox_verify_result_t *r)
{
        if (!r)
                return;
        verify_own_t *o = (verify_own_t *)r;
        kinbox_rows_destroy(o->rows[0]);
        kinbox_rows_destroy(o->rows[1]);
        free(o->pub.ahead);
        free(o->pub.partitions);
        free(o);
}
