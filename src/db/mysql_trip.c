/*
 * mysql_trip.c -- round trips and the deferred statement queue.
 *
 * Inside a transaction, exec() does not talk to the server: the rendered
 * statement is appended to a per-transaction queue with its tag and
 * flags. flush(), query(), commit() and inbox_insert() send the queue --
 * and their own statement -- as ONE multi-statement round trip. The server
 * executes the statements in order and stops at the first error, so the
 * index of the failing result tells which statement (and so which tag)
 * failed.
 */
#include "mysql_int.h"

#include <stdlib.h>
#include <string.h>

static struct kinbox_rows_s *
res_rows(MYSQL_RES *res)
{
        size_t nrows = (size_t)mysql_num_rows(res);
        int ncols = (int)mysql_num_fields(res);
        struct kinbox_rows_s *r = kinbox__rows_new(nrows, ncols);
        if (!r)
                return NULL;
        MYSQL_FIELD *f = mysql_fetch_fields(res);
        for (int c = 0; c < ncols; c++)
                if (kinbox__rows_set_name(r, c, f[c].name))
                        goto oom;
        for (size_t i = 0; i < nrows; i++) {
                MYSQL_ROW row = mysql_fetch_row(res);
                unsigned long *lens = mysql_fetch_lengths(res);
                if (!row || !lens)
                        goto oom;
                for (int c = 0; c < ncols; c++)
                        if (kinbox__rows_set(r, i, c, row[c],
                                             row[c] ? lens[c] : 0))
                                goto oom;
        }
        return r;
oom:
        kinbox_rows_destroy(r);
        return NULL;
}

/*
 * Send ntags statements (sql, len) in one packet and read every result.
 * On an error the failing statement is the one whose result was being
 * read; the server does not run the statements after it. With out, the
 * last result set at or after the last statement is returned (a CALL may
 * add results; the last one with rows wins). On a connection error the
 * handle is closed and db->impl freed before returning, so sql and tags
 * (which may live there) are not touched after a failure.
 */
int
kinbox__my_roundtrip(kinbox__db_t *db, const char *sql, size_t len,
                     const int *tags, size_t ntags, struct kinbox_rows_s **out,
                     bool in_commit)
{
        MYSQL *m = db->native;
        size_t idx = 0;
#define TAG_AT(i) (ntags ? tags[(i) < ntags ? (i) : ntags - 1] : -1)
        if (out)
                *out = NULL;
        if (db->impl)
                st_get(db)->fail_stmt = 0;
        if (mysql_real_query(m, sql, (unsigned long)len))
                return kinbox__my_fail(db, TAG_AT(0), in_commit, NULL);
        for (;;) {
                MYSQL_RES *res = mysql_store_result(m);
                if (res) {
                        if (out && idx + 1 >= ntags) {
                                struct kinbox_rows_s *r = res_rows(res);
                                kinbox_rows_destroy(*out);
                                *out = r;
                                if (!r) {
                                        mysql_free_result(res);
                                        /* Drain so the handle stays in
                                         * sync, then report. */
                                        while (mysql_next_result(m) == 0) {
                                                MYSQL_RES *x =
                                                    mysql_store_result(m);
                                                if (x)
                                                        mysql_free_result(x);
                                        }
                                        return kinbox__my_oom(db);
                                }
                        }
                        mysql_free_result(res);
                } else if (mysql_field_count(m) != 0) {
                        kinbox_rows_destroy(out ? *out : NULL);
                        if (out)
                                *out = NULL;
                        if (db->impl)
                                st_get(db)->fail_stmt = idx;
                        return kinbox__my_fail(db, TAG_AT(idx), in_commit,
                                               NULL);
                } else if (TAG_AT(idx) >= 0 &&
                           (TAG_AT(idx) & KINBOX__TAG_CLAIM) &&
                           mysql_affected_rows(m) == 0) {
                        kinbox__db_note_none(db, TAG_AT(idx));
                }
                int st = mysql_next_result(m);
                if (st < 0)
                        break;
                idx++;
                if (st > 0) {
                        if (out) {
                                kinbox_rows_destroy(*out);
                                *out = NULL;
                        }
                        if (db->impl)
                                st_get(db)->fail_stmt = idx;
                        return kinbox__my_fail(db, TAG_AT(idx), in_commit,
                                               NULL);
                }
        }
#undef TAG_AT
        if (out && !*out) {
                /* A statement without a result set: zero rows. */
                *out = kinbox__rows_new(0, 0);
                if (!*out)
                        return kinbox__my_oom(db);
        }
        return KINBOX_OK;
}

/* Make room for need statements in the per-statement arrays. */
static int
q_reserve(struct mystate *s, size_t need)
{
        if (need <= s->captags)
                return 0;
        size_t cap = s->captags ? s->captags * 2 : 64;
        while (cap < need)
                cap *= 2;
        int *t = realloc(s->tags, cap * sizeof(*t));
        if (t)
                s->tags = t;
        size_t *o = realloc(s->offs, cap * sizeof(*o));
        if (o)
                s->offs = o;
        unsigned char *f = realloc(s->flags, cap);
        if (f)
                s->flags = f;
        if (!t || !o || !f)
                return -1;
        s->captags = cap;
        return 0;
}

/* count statements whose text starts at off, all with tag and the flags
 * s->next_flags (which go back to ST_EFF). */
static int
q_push_tags(struct mystate *s, int tag, int count, size_t off)
{
        unsigned char fl = s->next_flags;
        s->next_flags = ST_EFF;
        if (q_reserve(s, s->ntags + (size_t)count))
                return -1;
        for (int k = 0; k < count; k++) {
                s->offs[s->ntags] = off;
                s->flags[s->ntags] = fl;
                s->tags[s->ntags++] = tag;
        }
        return 0;
}

/* Append rendered text (count statements, all with tag) to the queue. */
int
kinbox__my_q_append_raw(kinbox__db_t *db, const char *text, size_t len,
                        int tag, int count)
{
        struct mystate *s = st_get(db);
        if (s->ntags)
                kinbox__buf_add(&s->q, ";\n", 2);
        size_t off = s->q.len;
        kinbox__buf_add(&s->q, text, len);
        if (s->q.oom || q_push_tags(s, tag, count, off))
                return kinbox__my_oom(db);
        return KINBOX_OK;
}
