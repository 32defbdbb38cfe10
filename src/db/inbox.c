/*
 * db/inbox.c -- the rows one inbox insert writes, for both backends: the
 * range of message time each message belongs to (part_at), the boundary
 * marker rows of a partitioned inbox, and which messages came back new.
 *
 * Why message time and not the time of processing: a redelivery of a
 * record, a producer's retry of its batch and the relay's re-publish of an
 * outbox row (it stamps the row's created_at) all carry the first copy's
 * time, so every copy computes the same key (consumer, message_id,
 * part_at) and the primary key catches it, whatever day it is processed.
 * A copy whose time differs (a foreign producer's own retry) is caught
 * when both times fall in one range, or when they differ by at most
 * inbox.partition.skew: a message that close to the end of its range also
 * writes a shadow row keyed by the next range. Of two copies tA < tB in
 * different ranges with tB - tA <= skew < width, the boundary b between
 * them has b - tA <= skew, so A's shadow and B's own row share a key,
 * whichever comes first. Only unique-key collisions decide: concurrent
 * copies need no lock and no read-then-write.
 *
 * A record without a time (timestamp -1) is keyed by the epoch's range:
 * never a range partition, always the catch-all, pruned row by row by
 * processed_at like the plain layout. The consumer's clock never places
 * a row.
 */
#include "../db.h"
#include "../internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void
kinbox__range_label(char *out, int64_t start_s, int64_t width_s)
{
        time_t t = (time_t)start_s;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(out, 16, width_s % 86400 ? "%Y%m%d%H" : "%Y%m%d", &tm);
}

int64_t
kinbox__range_parse(const char *name)
{
        const char *p = strrchr(name, 'p');
        if (!p)
                return -1;
        p += p[1] == '_' ? 2 : 1;
        size_t n = strlen(p);
        if ((n != 8 && n != 10) || strspn(p, "0123456789") != n)
                return -1;
        struct tm tm = {0};
        char b[5] = {0};
        memcpy(b, p, 4);
        tm.tm_year = atoi(b) - 1900;
        b[2] = 0;
        memcpy(b, p + 4, 2);
        tm.tm_mon = atoi(b) - 1;
        memcpy(b, p + 6, 2);
        tm.tm_mday = atoi(b);
        if (n == 10) {
                memcpy(b, p + 8, 2);
                tm.tm_hour = atoi(b);
        }
        return (int64_t)timegm(&tm);
}

int64_t
kinbox__inbox_part_of(int64_t ms, int64_t width_s)
{
        int64_t s = ms >= 0 ? ms / 1000 : -((999 - ms) / 1000);
        int64_t r = s % width_s;
        if (r < 0)
                r += width_s;
        return s - r;
}

void
kinbox__utc_text(char *out, int64_t s, int ms)
{
        time_t t = (time_t)s;
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t n = strftime(out, 32, "%Y-%m-%d %H:%M:%S", &tm);
        if (ms >= 0 && n + 5 <= 32)
                snprintf(out + n, 32 - n, ".%03d", ms % 1000);
}

/* The range width of db's inbox: the layout read, else a day. */
void
kinbox__utc_quoted(char *out, size_t sz, const char *zone, int64_t s)
{
        char t[32];
        kinbox__utc_text(t, s, -1);
        snprintf(out, sz, "'%s%s'", t, zone);
}

static int64_t
width_of(const kinbox__db_t *db)
{
        return db->inbox_width_s > 0 ? db->inbox_width_s : 86400;
}

int64_t
kinbox__inbox_part_now(const kinbox__db_t *db)
{
        return kinbox__inbox_part_of(kinbox__wall_ms(), width_of(db));
}

kinbox__inbox_put_t *
kinbox__inbox_puts(const kinbox__db_t *db,
                   const struct kinbox__inbox_row *rows,
                   const kinbox__idref_t *ix, size_t n, size_t *np)
{
        kinbox__inbox_put_t *p = malloc((2 * n + 1) * sizeof(*p));
        if (!p)
                return NULL;
        int64_t w = width_of(db);
        int64_t skew_ms = db->inbox_partitioned ? db->inbox_skew_s * 1000 : 0;
        int64_t now = kinbox__wall_ms();
        size_t k = 0;
        for (size_t j = 0; j < n; j++) {
                size_t i = ix[j].idx;
                /* No time (-1): the epoch's range, in the catch-all,
                 * where every copy of the record looks again whatever
                 * day it comes; msg_at records when it was processed. */
                if (rows[i].msg_ms < 0) {
                        p[k++] =
                            (kinbox__inbox_put_t){i, 0, now, false, false};
                        continue;
                }
                int64_t ms = rows[i].msg_ms;
                int64_t part = kinbox__inbox_part_of(ms, w);
                p[k++] = (kinbox__inbox_put_t){i, part, ms, false, false};
                /* Within skew of the end of its range: a later copy of
                 * it may fall in the next range, where this row waits. */
                if (skew_ms && (part + w) * 1000 - ms <= skew_ms)
                        p[k++] = (kinbox__inbox_put_t){i, part + w, ms, true,
                                                       false};
        }
        *np = k;
        return p;
}

static bool
is_true(const char *v)
{
        return v && (!strcmp(v, "t") || !strcmp(v, "1") || !strcmp(v, "true"));
}

void
kinbox__inbox_put_back(kinbox__inbox_put_t *puts, size_t np,
                       const struct kinbox__inbox_row *rows,
                       const char *const *v)
{
        if (!v[0] || !v[1] || !v[2] || !v[3])
                return;
        long long part = strtoll(v[2], NULL, 10);
        long long off = strtoll(v[3], NULL, 10);
        bool shadow = is_true(v[4]);
        /* Puts are in id order (kinbox__inbox_sorted()): the first put of
         * the id, then its run. */
        size_t lo = 0, hi = np;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (strcmp(rows[puts[mid].row].id, v[0]) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        for (size_t k = lo; k < np && !strcmp(rows[puts[k].row].id, v[0]);
             k++) {
                const struct kinbox__inbox_row *r = &rows[puts[k].row];
                if (puts[k].back || puts[k].shadow != shadow ||
                    r->partition != part || r->offset != off ||
                    strcmp(r->topic, v[1]))
                        continue;
                puts[k].back = true;
                return;
        }
}

/* The end of the run of puts of one message that starts at k. */
static size_t
run_end(const kinbox__inbox_put_t *puts, size_t np, size_t k)
{
        size_t e = k + 1;
        while (e < np && puts[e].row == puts[k].row)
                e++;
        return e;
}

void
kinbox__inbox_puts_fold(const kinbox__inbox_put_t *puts, size_t np,
                        const kinbox__idref_t *ix, size_t n, bool *is_new)
{
        for (size_t i = 0; i < n; i++)
                is_new[i] = false;
        /* Puts follow ix: a message's puts are consecutive. */
        size_t k = 0;
        for (size_t j = 0; j < n && k < np; j++) {
                size_t e = run_end(puts, np, k);
                bool all = true;
                for (; k < e; k++)
                        all = all && puts[k].back;
                is_new[ix[j].idx] =
                    all && (j == 0 || strcmp(ix[j - 1].id, ix[j].id));
        }
}

int
kinbox__inbox_undo(kinbox__db_t *db, const char *consumer,
                   const struct kinbox__inbox_row *rows,
                   const kinbox__inbox_put_t *puts, size_t np)
{
        for (size_t k = 0, e; k < np; k = e) {
                e = run_end(puts, np, k);
                size_t back = 0;
                for (size_t x = k; x < e; x++)
                        back += puts[x].back;
                if (!back || back == e - k)
                        continue;
                const struct kinbox__inbox_row *r = &rows[puts[k].row];
                char part[24], kp[16], ko[24];
                snprintf(kp, sizeof(kp), "%d", (int)r->partition);
                snprintf(ko, sizeof(ko), "%lld", (long long)r->offset);
                for (size_t x = k; x < e; x++) {
                        if (!puts[x].back)
                                continue;
                        snprintf(part, sizeof(part), "%lld",
                                 (long long)puts[x].part_s);
                        kinbox__param_t p[6] = {
                            {consumer, 0, 0}, {r->id, 0, 0}, {part, 0, 0},
                            {r->topic, 0, 0}, {kp, 0, 0},    {ko, 0, 0}};
                        int rc = db->ops->exec(db, db->ops->sql->inbox_undo, 6,
                                               p, -1);
                        if (rc)
                                return rc;
                }
        }
        return KINBOX_OK;
}

int
kinbox__copy_key(const struct kinbox_rows_s *r, size_t row, char **c, char **m,
                 size_t *mlen)
{
        const char *v0 = r->values[row * (size_t)r->ncols];
        const char *v1 = r->values[row * (size_t)r->ncols + 1];
        size_t l1 = r->lens[row * (size_t)r->ncols + 1];
        char *nc = v0 ? kinbox__strdup(v0) : NULL;
        char *nm = v1 ? malloc(l1 + 1) : NULL;
        if (!nc || !nm) {
                free(nc);
                free(nm);
                return KINBOX_ERR_NOMEM;
        }
        memcpy(nm, v1, l1 + 1);
        free(*c);
        free(*m);
        *c = nc;
        *m = nm;
        *mlen = l1;
        return KINBOX_OK;
}

/* The number in the first column of sql's first row in *v (no row or
 * NULL: *v unchanged); the query's error. */
static int
first_int(kinbox__db_t *db, const char *sql, int np, const kinbox__param_t *p,
          int64_t *v)
{
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db, sql, np, p, &r);
        if (!rc && r->nrows && r->values[0])
                *v = strtoll(r->values[0], NULL, 10);
        kinbox_rows_destroy(r);
        return rc;
}

/* The exact row count of range partition name of table, -1 unknown. */
static int64_t
range_count(kinbox__db_t *db, const char *table, const char *name)
{
        char q[300];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(q, sizeof(q), db->ops->sql->range_count, table, name);
#pragma GCC diagnostic pop
        int64_t v = -1;
        return first_int(db, q, 0, NULL, &v) ? -1 : v;
}

int
kinbox__db_clock_ms(kinbox__db_t *db, const char *sql, int64_t *now_ms)
{
        *now_ms = 0;
        return first_int(db, sql, 0, NULL, now_ms);
}

int
kinbox__db_true(kinbox__db_t *db, const char *sql, int np,
                const kinbox__param_t *p, bool *yes)
{
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db, sql, np, p, &r);
        *yes = !rc && r->nrows && is_true(r->values[0]);
        kinbox_rows_destroy(r);
        return rc;
}

int
kinbox__db_count(kinbox__db_t *db, const char *sql, int np,
                 const kinbox__param_t *p, uint64_t *n)
{
        int64_t v = 0;
        int rc = first_int(db, sql, np, p, &v);
        *n = !rc && v > 0 ? (uint64_t)v : 0;
        return rc;
}

int
kinbox__db_must(kinbox__db_t *db, const char *sql, int np,
                const kinbox__param_t *p, const char *fmt, ...)
{
        bool yes = false;
        int rc = kinbox__db_true(db, sql, np, p, &yes);
        if (rc || yes)
                return rc;
        char msg[sizeof(db->err.msg)];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1, "%s", msg);
        return KINBOX_ERR_STATE;
}

int
kinbox__ranges_read(kinbox__db_t *db, const char *sql, const char *table,
                    const char *count_fmt, kinbox__range_t **out, size_t *n,
                    int64_t *catchall_rows)
{
        *out = NULL;
        *n = 0;
        const char *v[1] = {table};
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_queryv(db, sql, 1, v, &r);
        if (rc)
                return rc;
        kinbox__range_t *a = calloc(r->nrows + 1, sizeof(*a));
        for (size_t i = 0; a && i < r->nrows; i++) {
                char **c = &r->values[i * (size_t)r->ncols];
                int64_t st = c[0] ? kinbox__range_parse(c[0]) : -1;
                if (st < 0)
                        continue;
                kinbox__range_t *x = &a[(*n)++];
                x->start_s = st;
                snprintf(x->name, sizeof(x->name), "%s", c[0]);
                x->rows = c[1] ? strtoll(c[1], NULL, 10) : -1;
                x->bytes = c[2] ? strtoll(c[2], NULL, 10) : -1;
        }
        kinbox_rows_destroy(r);
        if (!a)
                return KINBOX_ERR_NOMEM;
        *out = a;
        /* No estimate before the first ANALYZE (PostgreSQL's reltuples
         * -1 or 0, MySQL's TABLE_ROWS 0): count such ranges exactly, so a
         * dry run never reports "about 0 rows" for a full range. */
        for (size_t i = 0; i < *n; i++)
                if (a[i].rows <= 0)
                        a[i].rows = range_count(db, table, a[i].name);
        if (!catchall_rows)
                return KINBOX_OK;
        char q[200];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(q, sizeof(q), count_fmt, table);
#pragma GCC diagnostic pop
        rc = kinbox__db_query(db, q, 0, NULL, &r);
        *catchall_rows = !rc && r->nrows && r->values[0]
                             ? strtoll(r->values[0], NULL, 10)
                             : -1;
        kinbox_rows_destroy(r);
        return rc;
}

int
kinbox__inbox_layout_load(kinbox__db_t *db, int64_t conf_width_ms, bool force)
{
        int64_t now = kinbox__now_ms();
        if (!force && db->inbox_layout_read_ms &&
            now - db->inbox_layout_read_ms < 10000)
                return KINBOX_OK;
        struct kinbox_rows_s *r = NULL;
        int rc = db->ops->query(db,
                                "SELECT width_s, skew_s, legacy_until > "
                                "CURRENT_TIMESTAMP FROM kinbox_partitioning "
                                "WHERE table_name = 'kinbox_inbox'",
                                0, NULL, -1, &r);
        if (rc)
                return rc;
        if (r && r->nrows && r->values[0] && r->values[1]) {
                db->inbox_width_s = strtoll(r->values[0], NULL, 10);
                db->inbox_skew_s = strtoll(r->values[1], NULL, 10);
                db->inbox_partitioned = db->inbox_width_s > 0;
                db->inbox_legacy =
                    db->inbox_partitioned && is_true(r->values[2]);
        } else {
                db->inbox_width_s = conf_width_ms / 1000;
                db->inbox_skew_s = 0;
                db->inbox_partitioned = false;
                db->inbox_legacy = false;
        }
        if (db->inbox_width_s <= 0)
                db->inbox_width_s = 86400;
        kinbox_rows_destroy(r);
        db->inbox_layout_read_ms = now;
        return KINBOX_OK;
}

int
kinbox__inbox_legacy(kinbox__db_t *db, const char *consumer,
                     const struct kinbox__inbox_row *rows, size_t n,
                     bool *is_new)
{
        if (!db->inbox_legacy || !n)
                return KINBOX_OK;
        kinbox__param_t *p = malloc((n + 1) * sizeof(*p));
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        if (!p)
                return KINBOX_ERR_NOMEM;
        p[0] = (kinbox__param_t){consumer, 0, 0};
        int np = 1;
        kinbox__buf_adds(&b, kinbox__db_pick(db,
                                             "SELECT message_id FROM "
                                             "kinbox_inbox_default WHERE "
                                             "part_at = to_timestamp(0) AND ",
                                             "SELECT message_id FROM "
                                             "kinbox_inbox PARTITION (p_past) "
                                             "WHERE part_at = '1970-01-01 "
                                             "00:00:00' AND "));
        kinbox__buf_adds(&b, "msg_at IS NULL AND consumer = $1 AND "
                             "message_id IN (");
        for (size_t i = 0; i < n; i++) {
                if (!is_new[i])
                        continue;
                p[np] = (kinbox__param_t){rows[i].id, 0, 0};
                kinbox__buf_printf(&b, "%s$%d", np > 1 ? ", " : "", np + 1);
                np++;
        }
        kinbox__buf_adds(&b, ")");
        struct kinbox_rows_s *r = NULL;
        int rc = b.oom ? KINBOX_ERR_NOMEM : KINBOX_OK;
        if (!rc && np > 1)
                rc = db->ops->query(db, b.p, np, p, -1, &r);
        for (size_t j = 0; !rc && r && j < r->nrows; j++) {
                const char *id = r->values[j * (size_t)r->ncols];
                for (size_t i = 0; id && i < n; i++)
                        if (is_new[i] && !strcmp(rows[i].id, id))
                                is_new[i] = false;
        }
        kinbox_rows_destroy(r);
        kinbox__buf_free(&b);
        free(p);
        return rc;
}
