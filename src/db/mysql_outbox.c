/*
 * mysql_outbox.c -- the outbox's and relay's statements on MariaDB/MySQL
 * (struct kinbox__outbox_ops), and the append of
 * kinbox_outbox_append_mysql() on the caller's own MYSQL handle.
 *
 * The claim takes a few statements (MariaDB has no LATERAL, and a locking
 * read's subquery must not see rows skipped by SKIP LOCKED):
 *   1. candidate heads, a plain read walking kinbox_outbox_pending
 *      (status, id, ...) over the 'pending' prefix only, index-only
 *      (FRONT_SCAN, else WINDOW_SCAN, else HEADS_SCAN);
 *   2. in a transaction: lock the candidates still pending and due
 *      (FOR UPDATE SKIP LOCKED), at most limit;
 *   3. the heads' runs: each aggregate's next pending rows in id order,
 *      kept while due and going to the head's destination;
 *   4. lease heads and runs in one UPDATE (which locks the run rows: no
 *      other relay can claim them, their head being locked and pending);
 *   5. read the claimed rows back and commit.
 * A lock-held claim (req->lock) replaces step 4 by locking the run rows
 * (by primary key, FOR UPDATE SKIP LOCKED; each run cut at the first row
 * not locked), reads the rows back and leaves the transaction open. The
 * session runs READ COMMITTED (db/mysql.c): a locking read is a current
 * read of the newest committed row and takes no gap locks, so appends of
 * new rows never wait for a claim; each plain read sees what committed
 * before it (step 3 runs after the heads are locked).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysql.h>

#include "../db.h"
#include "../internal.h"

/* The probe for an older pending row of the same aggregate (p) is pinned
 * to kinbox_outbox_aggregate (aggregate_id, status, id): a range of that
 * aggregate's rows. Left to itself MariaDB's optimizer, once its estimate
 * of the pending rows is low, reads the probe from kinbox_outbox_pending
 * ('pending' prefix, every aggregate) instead: under a steady 10,000
 * appends/s that was one scan of the whole backlog per candidate, 126 M
 * page reads and a 44 s claim (docs/benchmarks.md). */
#define HEADS_SCAN                                                            \
        "SELECT o.id FROM kinbox_outbox o"                                    \
        " FORCE INDEX (kinbox_outbox_pending)"                                \
        " WHERE o.status = 'pending'"                                         \
        " AND o.next_attempt_at <= CURRENT_TIMESTAMP(6)"                      \
        " AND (o.aggregate_id IS NULL OR NOT EXISTS ("                        \
        "  SELECT 1 FROM kinbox_outbox p"                                     \
        "  FORCE INDEX (kinbox_outbox_aggregate)"                             \
        "  WHERE p.aggregate_id = o.aggregate_id"                             \
        "  AND p.status = 'pending' AND p.id < o.id))"                        \
        " AND NOT EXISTS (SELECT 1 FROM kinbox_outbox_paused z"               \
        "  WHERE z.destination = o.destination)"                              \
        " ORDER BY o.id LIMIT "

/* HEADS_SCAN over the first window due pending rows only. */
#define WINDOW_SCAN                                                           \
        "SELECT o.id FROM (SELECT v.*, ROW_NUMBER() OVER (PARTITION BY"       \
        " v.aggregate_id ORDER BY v.id) AS rn FROM (SELECT w.id,"             \
        " w.aggregate_id, w.destination"                                      \
        " FROM kinbox_outbox w FORCE INDEX (kinbox_outbox_pending)"           \
        " WHERE w.status = 'pending'"                                         \
        " AND w.next_attempt_at <= CURRENT_TIMESTAMP(6)"                      \
        " ORDER BY w.id LIMIT %" PRId64 ") v) o"                              \
        " WHERE (o.aggregate_id IS NULL OR (o.rn = 1 AND NOT EXISTS ("        \
        "  SELECT 1 FROM kinbox_outbox p"                                     \
        "  FORCE INDEX (kinbox_outbox_aggregate)"                             \
        "  WHERE p.aggregate_id = o.aggregate_id"                             \
        "  AND p.status = 'pending' AND p.id < o.id)))"                       \
        " AND NOT EXISTS (SELECT 1 FROM kinbox_outbox_paused z"               \
        "  WHERE z.destination = o.destination)"                              \
        " ORDER BY o.id LIMIT %" PRId64

/* The first window pending rows, due or not: a row's older pending rows
 * of its aggregate are all in the window too, so the first row of each
 * aggregate in it (rn = 1) has none, without a probe per row (a quarter
 * of the claim with 1,000 heads). blocked: rows of the window not due
 * (leased, waiting for a retry): when they crowd out the heads, the
 * claim looks past them with WINDOW_SCAN. */
#define FRONT_SCAN                                                            \
        "SELECT o.id, o.blocked FROM (SELECT v.*, ROW_NUMBER() OVER"          \
        " (PARTITION BY v.aggregate_id ORDER BY v.id) AS rn,"                 \
        " SUM(NOT v.due) OVER () AS blocked FROM (SELECT w.id,"               \
        " w.aggregate_id, w.destination,"                                     \
        " w.next_attempt_at <= CURRENT_TIMESTAMP(6) AS due"                   \
        " FROM kinbox_outbox w FORCE INDEX (kinbox_outbox_pending)"           \
        " WHERE w.status = 'pending' ORDER BY w.id LIMIT %" PRId64 ") v) o"   \
        " WHERE o.due AND (o.aggregate_id IS NULL OR o.rn = 1)"               \
        " AND NOT EXISTS (SELECT 1 FROM kinbox_outbox_paused z"               \
        "  WHERE z.destination = o.destination)"                              \
        " ORDER BY o.id LIMIT %" PRId64

static int64_t
i64(const char *s)
{
        return s ? (int64_t)strtoll(s, NULL, 10) : 0;
}

static void
id_list(kinbox__buf_t *b, const int64_t *v, size_t n)
{
        for (size_t i = 0; i < n; i++)
                kinbox__buf_printf(b, "%s%" PRId64, i ? "," : "", v[i]);
}

typedef struct claimset {
        int64_t *ids;
        size_t n, cap;
        int64_t *reclaimed;
        size_t nre;
} claimset_t;

static int
cs_add(claimset_t *cs, int64_t id, bool reclaimed)
{
        if (cs->n == cs->cap) {
                size_t cap = cs->cap ? cs->cap * 2 : 64;
                int64_t *a = realloc(cs->ids, cap * sizeof(*a));
                if (!a)
                        return KINBOX_ERR_NOMEM;
                cs->ids = a;
                int64_t *b = realloc(cs->reclaimed, cap * sizeof(*b));
                if (!b)
                        return KINBOX_ERR_NOMEM;
                cs->reclaimed = b;
                cs->cap = cap;
        }
        cs->ids[cs->n++] = id;
        if (reclaimed)
                cs->reclaimed[cs->nre++] = id;
        return 0;
}

static bool
truthy(const char *s)
{
        return s && (!strcmp(s, "1") || !strcmp(s, "t"));
}

/* The heads among local action rows only (actions_only: relay.source =
 * binlog publishes the events from the binlog, and they stay pending for
 * ever): event rows are neither candidates nor hold an action back. */
#define ACT_SCAN                                                              \
        "SELECT o.id FROM kinbox_outbox o"                                    \
        " FORCE INDEX (kinbox_outbox_pending)"                                \
        " WHERE o.status = 'pending' AND o.kind = 'action'"                   \
        " AND o.next_attempt_at <= CURRENT_TIMESTAMP(6)"                      \
        " AND (o.aggregate_id IS NULL OR NOT EXISTS ("                        \
        "  SELECT 1 FROM kinbox_outbox p"                                     \
        "  FORCE INDEX (kinbox_outbox_aggregate)"                             \
        "  WHERE p.aggregate_id = o.aggregate_id"                             \
        "  AND p.status = 'pending' AND p.kind = 'action' AND p.id < o.id))"  \
        " AND NOT EXISTS (SELECT 1 FROM kinbox_outbox_paused z"               \
        "  WHERE z.destination = o.destination)"                              \
        " ORDER BY o.id LIMIT "

/* Step 1: candidate heads (id first). */
static int
candidates(kinbox__db_t *db, int64_t limit, int64_t window, int64_t most,
           bool act, struct kinbox_rows_s **cand)
{
        char sql[1536];
        /* More candidates than wanted: relays racing for the same heads
         * each get a share instead of nothing. */
        if (most <= 0)
                most = limit * 4;
        if (act) {
                snprintf(sql, sizeof(sql), ACT_SCAN "%" PRId64, most);
                return db->ops->query(db, sql, 0, NULL, -1, cand);
        }
        if (window <= 0) {
                snprintf(sql, sizeof(sql), HEADS_SCAN "%" PRId64, most);
                return db->ops->query(db, sql, 0, NULL, -1, cand);
        }
        snprintf(sql, sizeof(sql), FRONT_SCAN, window, most);
        int rc = db->ops->query(db, sql, 0, NULL, -1, cand);
        struct kinbox_rows_s *c = *cand;
        if (rc || (c && c->nrows &&
                   ((int64_t)c->nrows >= limit || i64(c->values[1]) == 0)))
                return rc;
        kinbox_rows_destroy(c);
        *cand = NULL;
        snprintf(sql, sizeof(sql), WINDOW_SCAN, window, most);
        return db->ops->query(db, sql, 0, NULL, -1, cand);
}

/* Move src's rows to the end of dst (same columns); src is left empty. */
static int
rows_append(struct kinbox_rows_s **dst, struct kinbox_rows_s *src)
{
        if (!src || !src->nrows) {
                kinbox_rows_destroy(src);
                return 0;
        }
        struct kinbox_rows_s *d = *dst;
        if (!d || !d->nrows) {
                kinbox_rows_destroy(d);
                *dst = src;
                return 0;
        }
        size_t nc = (size_t)d->ncols, n = d->nrows + src->nrows;
        char **v = realloc(d->values, n * nc * sizeof(*v));
        if (v)
                d->values = v;
        size_t *l = v ? realloc(d->lens, n * nc * sizeof(*l)) : NULL;
        if (!l) {
                kinbox_rows_destroy(src);
                return KINBOX_ERR_NOMEM;
        }
        d->lens = l;
        memcpy(d->values + d->nrows * nc, src->values,
               src->nrows * nc * sizeof(*v));
        memcpy(d->lens + d->nrows * nc, src->lens,
               src->nrows * nc * sizeof(*l));
        d->nrows = n;
        src->nrows = 0; /* its values are dst's now */
        kinbox_rows_destroy(src);
        return 0;
}

/*
 * Steps 1 and 2: locked heads (id, aggregate_id, destination), the first
 * limit candidates still pending and due once locked, in id order.
 *
 * Locked in chunks of at most the heads still wanted, in candidate order:
 * one "id IN (all candidates) ORDER BY id LIMIT limit FOR UPDATE SKIP
 * LOCKED" locks every candidate, not limit of them. MariaDB turns an IN
 * list of in_predicate_conversion_threshold (1000) values or more into a
 * join with a table value constructor, which reads, and locks, every
 * matching row before the sort and the LIMIT: a claim of 1,000 heads held
 * ~3,000 rows until its commit, and a second relay's claim found its
 * candidates locked and came back short. A chunk is never larger than
 * what is still wanted, so every row it locks is returned and claimed;
 * a relay alone takes its heads in one statement. (The range plan that
 * the conversion replaces stops at the LIMIT, but building it for
 * thousands of values cost 3x the conversion's time here.)
 */
static int
lock_heads(kinbox__db_t *db, int64_t limit, int64_t window, int64_t most,
           bool act, int64_t idle_ms, struct kinbox_rows_s **heads)
{
        struct kinbox_rows_s *cand = NULL;
        int rc = candidates(db, limit, window, most, act, &cand);
        if (rc || !cand || !cand->nrows) {
                kinbox_rows_destroy(cand);
                return rc;
        }
        rc = db->ops->begin(db);
        if (!rc && idle_ms > 0) {
                /* Lock-held claims: a relay that stops answering while
                 * holding its row locks has its session ended by the
                 * server (whole seconds, rounded up). */
                char idle[96];
                snprintf(idle, sizeof(idle),
                         "SET SESSION idle_transaction_timeout = %" PRId64,
                         (idle_ms + 999) / 1000);
                rc = db->ops->exec(db, idle, 0, NULL, -1);
        }
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        size_t got = 0;
        for (size_t i = 0; !rc && i < cand->nrows && got < (size_t)limit;) {
                size_t k = (size_t)limit - got;
                if (k > cand->nrows - i)
                        k = cand->nrows - i;
                kinbox__buf_reset(&b);
                kinbox__buf_adds(&b, "SELECT id, aggregate_id, destination,"
                                     " lease_owner IS NOT NULL FROM"
                                     " kinbox_outbox WHERE id IN (");
                for (size_t j = 0; j < k; j++)
                        kinbox__buf_printf(
                            &b, "%s%s", j ? "," : "",
                            cand->values[(i + j) * (size_t)cand->ncols]);
                kinbox__buf_adds(&b, ") AND status = 'pending' AND"
                                     " next_attempt_at <="
                                     " CURRENT_TIMESTAMP(6) ORDER BY id"
                                     " FOR UPDATE SKIP LOCKED");
                i += k;
                struct kinbox_rows_s *part = NULL;
                rc = b.oom ? KINBOX_ERR_NOMEM
                           : db->ops->query(db, b.p, 0, NULL, -1, &part);
                got += part && !rc ? part->nrows : 0;
                if (rc)
                        kinbox_rows_destroy(part);
                else
                        rc = rows_append(heads, part);
        }
        kinbox__buf_free(&b);
        kinbox_rows_destroy(cand);
        return rc;
}

static int
cmp_i64(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
}

/* Lock-held claims: lock the n run rows ids[] (grouped by aggregate, in id
 * order, grp[i] the group of row i) FOR UPDATE SKIP LOCKED, still pending
 * and due (a locking read is a current read: the newest committed row),
 * and add to cs each group's rows up to the first one not locked: what is
 * claimed of an aggregate is its head and the rows right after it, never
 * a row past one this claim does not hold (rows locked past such a gap
 * stay locked until the transaction ends; nothing is written to them). */
static int
lock_runs(kinbox__db_t *db, const int64_t *ids, const size_t *grp,
          const bool *re, size_t n, claimset_t *cs)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_adds(&b, "SELECT id FROM kinbox_outbox WHERE id IN (");
        id_list(&b, ids, n);
        kinbox__buf_adds(&b, ") AND status = 'pending' AND next_attempt_at"
                             " <= CURRENT_TIMESTAMP(6) FOR UPDATE SKIP"
                             " LOCKED");
        struct kinbox_rows_s *r = NULL;
        int rc = b.oom ? KINBOX_ERR_NOMEM
                       : db->ops->query(db, b.p, 0, NULL, -1, &r);
        kinbox__buf_free(&b);
        size_t nl = r ? r->nrows : 0;
        int64_t *got = NULL;
        if (!rc && nl && !(got = malloc(nl * sizeof(*got))))
                rc = KINBOX_ERR_NOMEM;
        for (size_t i = 0; !rc && i < nl; i++)
                got[i] = i64(r->values[i * (size_t)r->ncols]);
        kinbox_rows_destroy(r);
        if (!rc && nl)
                qsort(got, nl, sizeof(*got), cmp_i64);
        bool cut = false;
        for (size_t i = 0; !rc && i < n; i++) {
                if (i == 0 || grp[i] != grp[i - 1])
                        cut = false;
                if (!cut &&
                    !(nl && bsearch(&ids[i], got, nl, sizeof(*got), cmp_i64)))
                        cut = true;
                if (!cut)
                        rc = cs_add(cs, ids[i], re[i]);
        }
        free(got);
        return rc;
}

/* Step 3: add each head's run to cs. per: run rows per head at most.
 * One branch per head, each an ordered range of kinbox_outbox_aggregate
 * (aggregate_id, status, id) that stops after per + 1 rows: a window
 * function over the aggregates' pending rows would read every one of
 * them (10,000 rows of a hot aggregate for a run of 1,000). lock: the
 * rows are locked too (lock_runs), and an aggregate whose first pending
 * row is not its locked head gets no run. */
static int
add_runs(kinbox__db_t *db, const struct kinbox_rows_s *h, int64_t per,
         bool lock, claimset_t *cs)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        size_t k = 0;
        for (size_t i = 0; i < h->nrows; i++) {
                char **c = h->values + i * (size_t)h->ncols;
                size_t *l = h->lens + i * (size_t)h->ncols;
                if (!c[1])
                        continue;
                kinbox__buf_adds(&b, k++ ? " UNION ALL (" : "(");
                kinbox__buf_printf(&b,
                                   "SELECT id, aggregate_id, destination,"
                                   " next_attempt_at <= CURRENT_TIMESTAMP(6),"
                                   " lease_owner IS NOT NULL, %s AS hid"
                                   " FROM kinbox_outbox"
                                   " WHERE status = 'pending' AND aggregate_id"
                                   " = X'",
                                   c[0]);
                for (size_t j = 0; j < l[1]; j++)
                        kinbox__buf_printf(&b, "%02x", (unsigned char)c[1][j]);
                kinbox__buf_printf(&b, "' ORDER BY id LIMIT %" PRId64 ")",
                                   per + 1);
        }
        kinbox__buf_adds(&b, " ORDER BY aggregate_id, id");
        struct kinbox_rows_s *r = NULL;
        int rc = 0;
        if (k)
                rc = b.oom ? KINBOX_ERR_NOMEM
                           : db->ops->query(db, b.p, 0, NULL, -1, &r);
        kinbox__buf_free(&b);
        size_t nr = r ? r->nrows : 0, nl = 0;
        int64_t *lid = NULL;
        size_t *lgrp = NULL;
        bool *lre = NULL;
        if (!rc && lock && nr) {
                lid = malloc(nr * sizeof(*lid));
                lgrp = malloc(nr * sizeof(*lgrp));
                lre = malloc(nr * sizeof(*lre));
                if (!lid || !lgrp || !lre)
                        rc = KINBOX_ERR_NOMEM;
        }
        /* Rows come grouped by aggregate in id order; the first one of an
         * aggregate is its head (locked by us), the run follows it. */
        for (size_t i = 0; !rc && i < nr;) {
                char **c = r->values + i * (size_t)r->ncols;
                size_t j = i + 1;
                /* Lock-held: the head was locked by a current read, this
                 * is a fresh snapshot after it; a first row that is not
                 * the head would mean an older pending row: no run. */
                bool run = !lock || !strcmp(c[0], c[5]);
                for (; j < nr; j++) {
                        char **d = r->values + j * (size_t)r->ncols;
                        if (strcmp(d[1], c[1]))
                                break;
                        if (run && (!truthy(d[3]) || strcmp(d[2], c[2])))
                                run = false;
                        if (!run)
                                continue;
                        if (lock) {
                                lid[nl] = i64(d[0]);
                                lgrp[nl] = i;
                                lre[nl++] = truthy(d[4]);
                        } else if ((rc =
                                        cs_add(cs, i64(d[0]), truthy(d[4])))) {
                                break;
                        }
                }
                i = j;
        }
        kinbox_rows_destroy(r);
        if (!rc && nl)
                rc = lock_runs(db, lid, lgrp, lre, nl, cs);
        free(lid);
        free(lgrp);
        free(lre);
        return rc;
}

/* Lock-held claims, step 4: read the claimed rows (locked by us, so the
 * read sees their current versions). */
static int
read_locked(kinbox__db_t *db, const claimset_t *cs, struct kinbox_rows_s **out)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_adds(&b, "SELECT id, version, kind, destination, idem_key,"
                             " aggregate_id, payload, headers, attempts,"
                             " max_attempts, lease_owner IS NOT NULL,"
                             " TIMESTAMPDIFF(MICROSECOND, created_at,"
                             " CURRENT_TIMESTAMP(6)) DIV 1000,"
                             " FLOOR(UNIX_TIMESTAMP(created_at) * 1000)"
                             " FROM kinbox_outbox WHERE id IN (");
        id_list(&b, cs->ids, cs->n);
        kinbox__buf_adds(&b, ") ORDER BY id");
        int rc = b.oom ? KINBOX_ERR_NOMEM
                       : db->ops->query(db, b.p, 0, NULL, -1, out);
        kinbox__buf_free(&b);
        return rc;
}

/* Steps 4 and 5. */
static int
lease_and_read(kinbox__db_t *db, const kinbox__claim_req_t *req,
               const claimset_t *cs, struct kinbox_rows_s **out)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_printf(&b,
                           "UPDATE kinbox_outbox SET version = version + 1,"
                           " next_attempt_at = CURRENT_TIMESTAMP(6) +"
                           " INTERVAL %" PRId64 " MICROSECOND,"
                           " lease_owner = $1 WHERE status = 'pending'"
                           " AND id IN (",
                           req->lease_ms * 1000);
        id_list(&b, cs->ids, cs->n);
        kinbox__buf_adds(&b, ")");
        kinbox__param_t p[1] = {{req->owner, 0, 0}};
        int rc = b.oom ? KINBOX_ERR_NOMEM : db->ops->exec(db, b.p, 1, p, -1);
        if (rc)
                goto out;
        kinbox__buf_reset(&b);
        kinbox__buf_adds(&b, "SELECT id, version, kind, destination, idem_key,"
                             " aggregate_id, payload, headers, attempts,"
                             " max_attempts, ");
        if (cs->nre) {
                kinbox__buf_adds(&b, "id IN (");
                id_list(&b, cs->reclaimed, cs->nre);
                kinbox__buf_adds(&b, ")");
        } else {
                kinbox__buf_adds(&b, "0");
        }
        kinbox__buf_adds(&b, ", TIMESTAMPDIFF(MICROSECOND, created_at,"
                             " CURRENT_TIMESTAMP(6)) DIV 1000,"
                             " FLOOR(UNIX_TIMESTAMP(created_at) * 1000)"
                             " FROM kinbox_outbox WHERE lease_owner = $1"
                             " AND status = 'pending' AND id IN (");
        id_list(&b, cs->ids, cs->n);
        kinbox__buf_adds(&b, ") ORDER BY id");
        rc = b.oom ? KINBOX_ERR_NOMEM : db->ops->query(db, b.p, 1, p, -1, out);
out:
        kinbox__buf_free(&b);
        return rc;
}

static int
my_claim(kinbox__db_t *db, const kinbox__claim_req_t *req,
         struct kinbox_rows_s **out)
{
        *out = NULL;
        struct kinbox_rows_s *h = NULL;
        claimset_t cs = {0};
        int rc =
            lock_heads(db, req->limit, req->window, req->cand,
                       req->actions_only, req->lock ? req->idle_ms : 0, &h);
        if (rc || !h || !h->nrows)
                goto out;
        for (size_t i = 0; !rc && i < h->nrows; i++) {
                char **c = h->values + i * (size_t)h->ncols;
                rc = cs_add(&cs, i64(c[0]), truthy(c[3]));
        }
        int64_t per = (req->limit - (int64_t)h->nrows) / (int64_t)h->nrows;
        if (per > req->run_max - 1)
                per = req->run_max - 1;
        if (req->actions_only) /* a run would hold events of the aggregate */
                per = 0;
        if (!rc && per > 0)
                rc = add_runs(db, h, per, req->lock, &cs);
        if (!rc && req->lock) {
                /* Lock-held: nothing written, the transaction stays open
                 * (the caller marks and commits). */
                rc = read_locked(db, &cs, out);
                goto out;
        }
        if (!rc)
                rc = lease_and_read(db, req, &cs, out);
        if (!rc)
                rc = db->ops->commit(db);
out:
        if (rc)
                kinbox__db_abandon(db);
        /* Nothing locked (or lease mode): end the transaction. */
        if (!rc && db->in_tx && (!req->lock || !*out || !(*out)->nrows))
                rc = db->ops->commit(db);
        if (rc) {
                kinbox_rows_destroy(*out);
                *out = NULL;
        }
        kinbox_rows_destroy(h);
        free(cs.ids);
        free(cs.reclaimed);
        return rc;
}

static int
my_affected(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
            uint64_t *count)
{
        struct kinbox_rows_s *rows = NULL;
        int rc = db->ops->exec(db, sql, n, p, -1);
        if (!rc)
                rc = db->ops->query(db, "SELECT ROW_COUNT()", 0, NULL, -1,
                                    &rows);
        if (!rc && count) {
                int64_t v = rows && rows->nrows ? i64(rows->values[0]) : 0;
                *count = v > 0 ? (uint64_t)v : 0;
        }
        kinbox_rows_destroy(rows);
        return rc;
}

/* UPDATE the pending rows ids[] still at versions[]: SET set (its
 * placeholders take p[0..np)) WHERE (id, version) IN ((..),..); the id
 * list first lets the optimizer use the primary key. */
static int
my_set_based(kinbox__db_t *db, const char *set, int np,
             const kinbox__param_t *p, size_t n, const int64_t *ids,
             const int64_t *versions, uint64_t *done)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_printf(&b, "UPDATE kinbox_outbox SET %s WHERE id IN (",
                           set);
        id_list(&b, ids, n);
        kinbox__buf_adds(&b,
                         ") AND status = 'pending' AND (id, version) IN (");
        for (size_t i = 0; i < n; i++)
                kinbox__buf_printf(&b, "%s(%" PRId64 ",%" PRId64 ")",
                                   i ? "," : "", ids[i], versions[i]);
        kinbox__buf_adds(&b, ")");
        int rc = b.oom ? KINBOX_ERR_NOMEM : my_affected(db, b.p, np, p, done);
        kinbox__buf_free(&b);
        return rc;
}

static int
my_mark_sent(kinbox__db_t *db, size_t n, const int64_t *ids,
             const int64_t *versions, uint64_t *done)
{
        return my_set_based(db,
                            "status = 'sent', sent_at = CURRENT_TIMESTAMP(6),"
                            " lease_owner = NULL, version = version + 1",
                            0, NULL, n, ids, versions, done);
}

static int
my_release(kinbox__db_t *db, size_t n, const int64_t *ids,
           const int64_t *versions, uint64_t *done)
{
        return my_set_based(db,
                            "next_attempt_at = CURRENT_TIMESTAMP(6),"
                            " lease_owner = NULL, version = version + 1",
                            0, NULL, n, ids, versions, done);
}

static int
my_lease(kinbox__db_t *db, const char *owner, int64_t lease_ms, size_t n,
         const int64_t *ids, const int64_t *versions, uint64_t *done)
{
        char set[160];
        snprintf(set, sizeof(set),
                 "version = version + 1, next_attempt_at ="
                 " CURRENT_TIMESTAMP(6) + INTERVAL %" PRId64 " MICROSECOND,"
                 " lease_owner = $1",
                 lease_ms * 1000);
        kinbox__param_t p[1] = {{owner, 0, 0}};
        return my_set_based(db, set, 1, p, n, ids, versions, done);
}

static int
my_fail(kinbox__db_t *db, int64_t id, int64_t version, bool dead,
        const char *err, int64_t delay_ms, uint64_t *done)
{
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "UPDATE kinbox_outbox SET attempts = attempts + 1,"
                 " status = $1, last_error = $2,"
                 " next_attempt_at = CURRENT_TIMESTAMP(6) + INTERVAL %" PRId64
                 " MICROSECOND, version = version + 1, lease_owner = NULL"
                 " WHERE id = %" PRId64 " AND version = %" PRId64
                 " AND status = 'pending'",
                 delay_ms * 1000, id, version);
        kinbox__param_t p[2] = {{dead ? "dead" : "pending", 0, 0},
                                {err, 0, 0}};
        return my_affected(db, sql, 2, p, done);
}

/* Index-only on kinbox_outbox_pending: the 'pending' prefix's first rows. */
static int
my_probe(kinbox__db_t *db, bool *due)
{
        return kinbox__db_exists(
            db,
            "SELECT 1 FROM kinbox_outbox FORCE INDEX (kinbox_outbox_pending)"
            " WHERE status = 'pending' AND next_attempt_at <="
            " CURRENT_TIMESTAMP(6) LIMIT 1",
            due);
}

/* The duplicate branch sets LAST_INSERT_ID() to 0, so that a following
 * SELECT LAST_INSERT_ID() says "new id" or "duplicate" exactly. */
static const char append_sql[] =
    "INSERT INTO kinbox_outbox (" KINBOX__OUTBOX_COLS ") "
    "VALUES ($1, $2, $3, $4, $5, $6, $7) "
    "ON DUPLICATE KEY UPDATE id = id + LAST_INSERT_ID(0)";

static int
my_append_id(kinbox__db_t *db, const kinbox__param_t *p, int tag, int64_t *idp)
{
        struct kinbox_rows_s *rows = NULL;
        int rc = db->ops->exec(db, append_sql, 7, p, tag);
        if (!rc)
                rc = db->ops->query(db, "SELECT LAST_INSERT_ID()", 0, NULL,
                                    tag, &rows);
        *idp = !rc && rows && rows->nrows ? i64(rows->values[0]) : 0;
        kinbox_rows_destroy(rows);
        return rc;
}

#define REQUEUE_SET                                                           \
        "UPDATE kinbox_outbox SET status = 'pending', attempts = 0, "         \
        "last_error = NULL, next_attempt_at = CURRENT_TIMESTAMP(6), "         \
        "version = version + 1, lease_owner = NULL "

const struct kinbox__outbox_ops kinbox__mysql_outbox_ops = {
    .claim = my_claim,
    .mark_sent = my_mark_sent,
    .release = my_release,
    .fail = my_fail,
    .lease = my_lease,
    .probe = my_probe,
    .notify_channel = NULL,
    .heads_scan = HEADS_SCAN "1000",
    .affected = my_affected,
    .append = append_sql,
    .append_id = my_append_id,
    .requeue_id =
        REQUEUE_SET "WHERE id = $1 AND status IN ('dead', 'canceled')",
    .cancel_id = "UPDATE kinbox_outbox SET status = 'canceled', "
                 "version = version + 1, lease_owner = NULL "
                 "WHERE id = $1 AND status = 'pending'",
    .requeue_dest =
        REQUEUE_SET "WHERE status = 'dead' AND ($1 = '' OR destination = $1)",
    .cancel_dest = "UPDATE kinbox_outbox SET status = 'canceled', "
                   "version = version + 1, lease_owner = NULL "
                   "WHERE status = 'pending' AND destination = $1",
    .list = "SELECT id, status, destination, idem_key, aggregate_id, "
            "attempts, max_attempts, last_error, created_at, "
            "CASE WHEN status = 'pending' THEN next_attempt_at END, "
            "COALESCE(LENGTH(payload), 0), sent_at, version "
            "FROM kinbox_outbox WHERE id > $1 "
            "AND ($2 = '' OR status = $2) "
            "AND ($3 = '' OR destination = $3) ORDER BY id",
    .resend = "SELECT id, destination, idem_key, aggregate_id, payload, "
              "headers, FLOOR(UNIX_TIMESTAMP(created_at) * 1000) "
              "FROM kinbox_outbox WHERE kind = 'event' "
              "AND status <> 'canceled' "
              "AND created_at >= FROM_UNIXTIME($1 / 1000) AND id > $2 "
              "ORDER BY id",
};

/* ------------------------------------------------ on the caller's MYSQL */

/* Append s as a quoted, escaped literal (or NULL); binary as hex. */
static int
my_literal(kinbox__buf_t *b, MYSQL *conn, const char *s, size_t n, bool bin)
{
        if (!s) {
                kinbox__buf_adds(b, "NULL");
                return b->oom ? -1 : 0;
        }
        if (bin) {
                /* Hex literal: independent of sql_mode and charset. */
                kinbox__buf_adds(b, "X'");
                for (size_t i = 0; i < n; i++)
                        kinbox__buf_printf(b, "%02x", (unsigned char)s[i]);
                kinbox__buf_add(b, "'", 1);
                return b->oom ? -1 : 0;
        }
        char *tmp = malloc(2 * n + 1);
        if (!tmp)
                return -1;
        unsigned long k =
            mysql_real_escape_string(conn, tmp, s, (unsigned long)n);
        kinbox__buf_add(b, "'", 1);
        kinbox__buf_add(b, tmp, k);
        kinbox__buf_add(b, "'", 1);
        free(tmp);
        return b->oom ? -1 : 0;
}

static kinbox_err_t
my_error(MYSQL *conn, const char *what, char *errstr, size_t errstr_size)
{
        unsigned int e = mysql_errno(conn);
        kinbox__errstr(errstr, errstr_size, "outbox append: %s: MySQL %u: %s",
                       what, e, mysql_error(conn));
        if (e == 2006 || e == 2013 || e == 2002 || e == 2003)
                return KINBOX_ERR_DB_CONN;
        if (e == 1213 || e == 1205) /* deadlock, lock wait timeout */
                return KINBOX_ERR_TRANSIENT;
        return KINBOX_ERR_DB;
}

static kinbox_err_t
my_scalar(MYSQL *conn, const char *sql, size_t len, int64_t *out, char *errstr,
          size_t errstr_size)
{
        if (mysql_real_query(conn, sql, (unsigned long)len))
                return my_error(conn, "query", errstr, errstr_size);
        MYSQL_RES *res = mysql_store_result(conn);
        if (!res)
                return my_error(conn, "result", errstr, errstr_size);
        MYSQL_ROW row = mysql_fetch_row(res);
        *out = row && row[0] ? i64(row[0]) : 0;
        mysql_free_result(res);
        return KINBOX_OK;
}

/* p: the 7 parameters of the outbox append (db.h). */
static int
insert_sql(kinbox__buf_t *q, MYSQL *conn, const kinbox__param_t p[7])
{
        kinbox__buf_adds(q, "INSERT INTO kinbox_outbox (" KINBOX__OUTBOX_COLS
                            ") VALUES (");
        int bad = 0;
        for (int i = 0; i < 6; i++) {
                /* Text parameters are NUL-terminated (len 0), the payload
                 * and the headers have their length. */
                size_t n = p[i].v && (i < 4) ? strlen(p[i].v) : p[i].len;
                bad |= my_literal(q, conn, p[i].v, n, i == 4);
                kinbox__buf_add(q, ",", 1);
        }
        kinbox__buf_printf(q,
                           "%s) ON DUPLICATE KEY UPDATE id = id + "
                           "LAST_INSERT_ID(0)",
                           p[6].v);
        return bad || q->oom ? -1 : 0;
}

static kinbox_err_t
find_id(MYSQL *conn, const char *destination, const char *idem_key,
        int64_t *idp, char *errstr, size_t errstr_size)
{
        kinbox__buf_t s;
        kinbox__buf_init(&s);
        kinbox__buf_adds(&s, "SELECT id FROM kinbox_outbox WHERE "
                             "destination = ");
        int bad =
            my_literal(&s, conn, destination, strlen(destination), false);
        kinbox__buf_adds(&s, " AND idem_key = ");
        bad |= my_literal(&s, conn, idem_key, strlen(idem_key), false);
        *idp = 0;
        kinbox_err_t rc = KINBOX_OK;
        if (!bad && !s.oom)
                rc = my_scalar(conn, s.p, s.len, idp, errstr, errstr_size);
        kinbox__buf_free(&s);
        return rc;
}

kinbox_err_t
kinbox__mysql_outbox_append(struct st_mysql *conn, const kinbox__param_t p[7],
                            int64_t *idp, char *errstr, size_t errstr_size)
{
        kinbox_err_t rc;
        kinbox__buf_t q;
        kinbox__buf_init(&q);
        int bad = insert_sql(&q, conn, p);
        if (bad) {
                kinbox__buf_free(&q);
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return KINBOX_ERR_NOMEM;
        }
        if (mysql_real_query(conn, q.p, (unsigned long)q.len)) {
                kinbox__buf_free(&q);
                return my_error(conn, "insert", errstr, errstr_size);
        }
        kinbox__buf_free(&q);
        int64_t id = 0;
        static const char lid[] = "SELECT LAST_INSERT_ID()";
        rc = my_scalar(conn, lid, sizeof(lid) - 1, &id, errstr, errstr_size);
        if (rc)
                return rc;
        if (id > 0) {
                if (idp)
                        *idp = id;
                return KINBOX_OK;
        }
        if (idp &&
            (rc = find_id(conn, p[1].v, p[2].v, idp, errstr, errstr_size)))
                return rc;
        return KINBOX_ERR_DUPLICATE;
}
