/*
 * pg_outbox.c -- the outbox's and relay's statements on PostgreSQL
 * (struct kinbox__outbox_ops), and the append of kinbox_outbox_append_pg()
 * on the caller's own PGconn.
 *
 * The claim is one statement (see claim_sql): candidate heads read from
 * the partial index kinbox_outbox_pending (index-only, pending rows only,
 * so neither sent rows nor statistics change its cost), locked with SKIP
 * LOCKED, then each head's run of following rows, all leased in the same
 * UPDATE. The lock-held claim (claim_lock_sql) reads the same candidates
 * and locks heads and runs instead of leasing them, leaving its
 * transaction open.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "../db.h"
#include "../internal.h"

/*
 * $1 limit, $2 lease ms, $3 owner, $4 run_max, $5 window (NULL: all).
 *
 * wf, cf: the first $5 pending rows in id order, due or not (index-only,
 *    pending rows only): a row's older pending rows of its aggregate are
 *    all in that window too, so the due first row of each aggregate in it
 *    (rn = 1) is a head without a probe per row. g: cf is taken unless
 *    rows of the window not due (leased, waiting for a retry) crowd out
 *    the heads (fewer than $1 found while some are not due), or no
 *    window was given; otherwise w and co:
 * w: the first $5 due pending rows in id order (index-only, pending rows
 *    only). A window keeps the walk short when one aggregate's rows fill
 *    the front of the backlog; the relay walks everything when a window
 *    gave nothing (see relay_claim.c).
 * co: candidate heads, no locks. Due pending rows in id order with no older
 *    pending row of their aggregate, destination not paused. NOT IN (a
 *    hashed subplan) for the paused table keeps the walk in id order.
 * c: cf or co, whichever g chose (the other is never run).
 * h: the candidates still pending and due once locked (SKIP LOCKED: a row
 *    another relay is claiming right now is left to it). "= ANY (ARRAY(
 *    ...))" here and in the UPDATE: primary-key lookups whatever the
 *    estimates (a join let the planner hash the whole table).
 * f: each head's run: the aggregate's next pending rows in id order, as
 *    long as they are due and go to the head's destination (the running
 *    bool_and stops the run at the first row that does not). Heads share
 *    what is left of the limit. Those rows are not locked here: the UPDATE
 *    locks them; no other relay can take them meanwhile, since their head
 *    is locked by this statement and still pending for everyone else.
 */
#define HEADS_SCAN                                                            \
        " SELECT o.id FROM kinbox_outbox o"                                   \
        " WHERE o.status = 'pending' AND o.next_attempt_at <= now()"          \
        " AND (o.aggregate_id IS NULL OR NOT EXISTS ("                        \
        "  SELECT 1 FROM kinbox_outbox p WHERE p.aggregate_id = "             \
        "o.aggregate_id"                                                      \
        "  AND p.status = 'pending' AND p.id < o.id))"                        \
        " AND o.destination NOT IN (SELECT z.destination"                     \
        "  FROM kinbox_outbox_paused z)"                                      \
        " ORDER BY o.id LIMIT "

/* wf .. c of the claim; LIM: the limit's placeholder, CAND: the most
 * candidate heads, WIN: the window's. */
#define CLAIM_FRONT(LIM, CAND, WIN)                                           \
        "WITH wf AS MATERIALIZED ("                                           \
        " SELECT v.*, row_number() OVER (PARTITION BY v.aggregate_id"         \
        "  ORDER BY v.id) AS rn FROM ("                                       \
        "  SELECT o.id, o.aggregate_id, o.destination,"                       \
        "   o.next_attempt_at <= now() AS due FROM kinbox_outbox o"           \
        "  WHERE o.status = 'pending'"                                        \
        "  ORDER BY o.id LIMIT " WIN "::integer) v),"                         \
        " cf AS MATERIALIZED ("                                               \
        " SELECT o.id FROM wf o WHERE o.due"                                  \
        " AND (o.aggregate_id IS NULL OR o.rn = 1)"                           \
        " AND o.destination NOT IN (SELECT z.destination"                     \
        "  FROM kinbox_outbox_paused z)"                                      \
        " ORDER BY o.id LIMIT " CAND "::integer),"                            \
        " g AS MATERIALIZED (SELECT " WIN "::integer IS NOT NULL AND ("       \
        "  (SELECT count(*) FROM cf) >= " LIM "::integer"                     \
        "  OR ((SELECT count(*) FROM cf) > 0"                                 \
        "   AND NOT EXISTS (SELECT 1 FROM wf WHERE NOT wf.due))) AS front),"  \
        " w AS MATERIALIZED ("                                                \
        " SELECT v.*, row_number() OVER (PARTITION BY v.aggregate_id"         \
        "  ORDER BY v.id) AS rn FROM ("                                       \
        "  SELECT o.id, o.aggregate_id, o.destination FROM kinbox_outbox o"   \
        "  WHERE o.status = 'pending' AND o.next_attempt_at <= now()"         \
        "  ORDER BY o.id LIMIT " WIN "::integer) v),"                         \
        " co AS MATERIALIZED ("                                               \
        " SELECT o.id FROM w o"                                               \
        " WHERE (o.aggregate_id IS NULL OR (o.rn = 1 AND NOT EXISTS ("        \
        "  SELECT 1 FROM kinbox_outbox p WHERE p.aggregate_id ="              \
        " o.aggregate_id"                                                     \
        "  AND p.status = 'pending' AND p.id < o.id)))"                       \
        " AND o.destination NOT IN (SELECT z.destination"                     \
        "  FROM kinbox_outbox_paused z)"                                      \
        " ORDER BY o.id LIMIT " CAND "::integer),"                            \
        " c AS (SELECT cf.id FROM cf WHERE (SELECT front FROM g)"             \
        "  UNION ALL SELECT co.id FROM co WHERE NOT (SELECT front FROM g)),"

#define LEASE_FRONT CLAIM_FRONT("$1", "$1", "$5")
#define LOCK_FRONT CLAIM_FRONT("$1", "$4", "$3")

static const char claim_sql[] = LEASE_FRONT
    " h AS MATERIALIZED ("
    " SELECT t.id, t.aggregate_id, t.destination,"
    "  t.lease_owner IS NOT NULL AS reclaimed"
    " FROM kinbox_outbox t WHERE t.id = ANY (ARRAY(SELECT c.id FROM c))"
    " AND t.status = 'pending' AND t.next_attempt_at <= now()"
    " ORDER BY t.id FOR UPDATE OF t SKIP LOCKED),"
    " n AS (SELECT count(*) AS k FROM h),"
    " f AS ("
    " SELECT x.id, x.reclaimed FROM ("
    "  SELECT q.id, q.reclaimed, bool_and(q.ok) OVER"
    "   (PARTITION BY h.id ORDER BY q.id) AS run"
    "  FROM h CROSS JOIN LATERAL ("
    "   SELECT r.id, r.lease_owner IS NOT NULL AS reclaimed,"
    "    (r.destination = h.destination AND r.next_attempt_at <= now())"
    "     AS ok"
    "   FROM kinbox_outbox r WHERE r.aggregate_id = h.aggregate_id"
    "   AND r.status = 'pending' AND r.id > h.id ORDER BY r.id"
    "   LIMIT (SELECT least(($1::integer - n.k) / greatest(n.k, 1),"
    "    $4::integer - 1) FROM n)) q"
    "  WHERE h.aggregate_id IS NOT NULL) x WHERE x.run),"
    " u AS (SELECT h.id, h.reclaimed FROM h"
    "  UNION ALL SELECT f.id, f.reclaimed FROM f)"
    " UPDATE kinbox_outbox t SET"
    " next_attempt_at = now() + $2::bigint * interval '1 millisecond',"
    " version = t.version + 1, lease_owner = $3"
    " WHERE t.id = ANY (ARRAY(SELECT u.id FROM u)) AND t.status = 'pending'"
    " RETURNING t.id, t.version, t.kind, t.destination, t.idem_key,"
    " t.aggregate_id, t.payload, t.headers, t.attempts, t.max_attempts,"
    " t.id = ANY (ARRAY(SELECT u.id FROM u WHERE u.reclaimed)),"
    " (extract(epoch FROM now() - t.created_at) * 1000)::bigint,"
    " floor(extract(epoch FROM t.created_at) * 1000)::bigint";

/* The claim result's columns (KINBOX__CL_*) of a locked row t. */
#define LOCK_COLS                                                             \
        " t.id, t.version, t.kind, t.destination, t.idem_key,"                \
        " t.aggregate_id, t.payload, t.headers, t.attempts, t.max_attempts,"  \
        " t.lease_owner IS NOT NULL AS reclaimed,"                            \
        " (extract(epoch FROM now() - t.created_at) * 1000)::bigint AS age,"  \
        " floor(extract(epoch FROM t.created_at) * 1000)::bigint AS created"
#define OUT_COLS                                                              \
        " id, version, kind, destination, idem_key, aggregate_id, payload,"   \
        " headers, attempts, max_attempts, reclaimed, age, created"

/*
 * The lock-held claim (relay.claim = lock): $1 limit, $2 run_max, $3
 * window (NULL: all), $4 most candidate heads. The candidates of
 * claim_sql, but up to $4 of them: another lock-held relay's rows are
 * not written, so they look pending and due to this claim's walk, and
 * with only $1 candidates a second relay would find the first one's heads
 * and nothing else. Nothing is written.
 * h: the first $1 heads still pending and due once locked (SKIP LOCKED;
 *    a head another relay holds is skipped, and with it its aggregate: no
 *    later row of it is a candidate, candidates being first pending rows).
 * f: each head's run as claim_sql reads it (the statement's snapshot),
 *    with its head (hid).
 * l: the run rows still pending and due once locked (SKIP LOCKED, the
 *    newest row versions, as FOR UPDATE returns them).
 * k: per head, the run rows up to the first one l does not hold (skipped
 *    or changed since the snapshot): rows past it are not claimed (they
 *    stay locked until this transaction ends, nothing is written to
 *    them), so what is claimed of an aggregate is always its head and
 *    the rows right after it.
 */
static const char claim_lock_sql[] = LOCK_FRONT
    " h AS MATERIALIZED ("
    " SELECT" LOCK_COLS
    " FROM kinbox_outbox t WHERE t.id = ANY (ARRAY(SELECT c.id FROM c))"
    " AND t.status = 'pending' AND t.next_attempt_at <= now()"
    " ORDER BY t.id LIMIT $1::integer FOR UPDATE OF t SKIP LOCKED),"
    " n AS (SELECT count(*) AS k FROM h),"
    " f AS MATERIALIZED ("
    " SELECT x.id, x.hid FROM ("
    "  SELECT q.id, h.id AS hid, bool_and(q.ok) OVER"
    "   (PARTITION BY h.id ORDER BY q.id) AS run"
    "  FROM h CROSS JOIN LATERAL ("
    "   SELECT r.id,"
    "    (r.destination = h.destination AND r.next_attempt_at <= now())"
    "     AS ok"
    "   FROM kinbox_outbox r WHERE r.aggregate_id = h.aggregate_id"
    "   AND r.status = 'pending' AND r.id > h.id ORDER BY r.id"
    "   LIMIT (SELECT least(($1::integer - n.k) / greatest(n.k, 1),"
    "    $2::integer - 1) FROM n)) q"
    "  WHERE h.aggregate_id IS NOT NULL) x WHERE x.run),"
    " l AS MATERIALIZED ("
    " SELECT" LOCK_COLS
    " FROM kinbox_outbox t WHERE t.id = ANY (ARRAY(SELECT f.id FROM f))"
    " AND t.status = 'pending' AND t.next_attempt_at <= now()"
    " FOR UPDATE OF t SKIP LOCKED),"
    " k AS (SELECT z.id FROM ("
    "  SELECT f.id, bool_and(l.id IS NOT NULL) OVER"
    "   (PARTITION BY f.hid ORDER BY f.id) AS ok"
    "  FROM f LEFT JOIN l ON l.id = f.id) z WHERE z.ok)"
    " SELECT" OUT_COLS " FROM h"
    " UNION ALL SELECT" OUT_COLS " FROM l"
    "  WHERE l.id = ANY (ARRAY(SELECT k.id FROM k))";

/* The claims of a relay whose events come from the log (actions_only):
 * every "X.status = 'pending'" also asks X.kind = 'action', so event rows
 * (pending for ever in that mode) are neither claimed nor hold an action
 * back in its aggregate. Made once from the statements above. */
static char *claim_act_sql, *claim_lock_act_sql;
static pthread_once_t act_once = PTHREAD_ONCE_INIT;

static char *
actions_only(const char *sql)
{
        static const char pat[] = ".status = 'pending'";
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        const char *p = sql, *hit;
        while ((hit = strstr(p, pat))) {
                const char *a = hit;
                while (a > sql &&
                       ((a[-1] >= 'a' && a[-1] <= 'z') || a[-1] == '_'))
                        a--;
                kinbox__buf_add(&b, p, (size_t)(hit - p) + strlen(pat));
                kinbox__buf_adds(&b, " AND ");
                kinbox__buf_add(&b, a, (size_t)(hit - a));
                kinbox__buf_adds(&b, ".kind = 'action'");
                p = hit + strlen(pat);
        }
        kinbox__buf_adds(&b, p);
        if (b.oom) {
                kinbox__buf_free(&b);
                return NULL;
        }
        return b.p;
}

static void
act_init(void)
{
        claim_act_sql = actions_only(claim_sql);
        claim_lock_act_sql = actions_only(claim_lock_sql);
}

static int
pg_claim(kinbox__db_t *db, const kinbox__claim_req_t *req,
         struct kinbox_rows_s **out)
{
        const char *lease_sql = claim_sql, *lock_sql = claim_lock_sql;
        if (req->actions_only) {
                pthread_once(&act_once, act_init);
                if (!claim_act_sql || !claim_lock_act_sql)
                        return KINBOX_ERR_NOMEM;
                lease_sql = claim_act_sql;
                lock_sql = claim_lock_act_sql;
        }
        char lim[24], lease[24], run[24], win[24], cand[24], idle[96];
        snprintf(lim, sizeof(lim), "%" PRId64, req->limit);
        snprintf(cand, sizeof(cand), "%" PRId64,
                 req->cand > 0 ? req->cand : req->limit * 4);
        snprintf(lease, sizeof(lease), "%" PRId64, req->lease_ms);
        snprintf(run, sizeof(run), "%" PRId64, req->run_max);
        snprintf(win, sizeof(win), "%" PRId64, req->window);
        kinbox__param_t p[5] = {{lim, 0, 0},
                                {lease, 0, 0},
                                {req->owner, 0, 0},
                                {run, 0, 0},
                                {req->window > 0 ? win : NULL, 0, 0}};
        kinbox__param_t pl[4] = {{lim, 0, 0},
                                 {run, 0, 0},
                                 {req->window > 0 ? win : NULL, 0, 0},
                                 {cand, 0, 0}};
        /* No sequential scans: the per-aggregate check of each walked row
         * must probe an index; with a hot aggregate the planner otherwise
         * scans the heap from its start (over every sent row) per row. */
        int rc = db->ops->begin(db);
        if (!rc)
                rc = db->ops->exec(db, "SET LOCAL enable_seqscan = off", 0,
                                   NULL, -1);
        if (!rc && req->lock && req->idle_ms > 0) {
                /* A relay that stops answering (stopped, cut off) while
                 * holding its row locks: the server ends its session, the
                 * rows go back to pending. */
                snprintf(idle, sizeof(idle),
                         "SET LOCAL idle_in_transaction_session_timeout = "
                         "%" PRId64,
                         req->idle_ms);
                rc = db->ops->exec(db, idle, 0, NULL, -1);
        }
        if (!rc)
                rc = req->lock ? db->ops->query(db, lock_sql, 4, pl, -1, out)
                               : db->ops->query(db, lease_sql, 5, p, -1, out);
        /* Lock-held: the transaction stays open while it holds rows,
         * idle in the server's eyes (its timeout armed, visible as such
         * in pg_stat_activity), not inside an unfinished pipeline. */
        if (!rc && (!req->lock || !*out || !(*out)->nrows))
                rc = db->ops->commit(db);
        else if (!rc && db->ops->settle)
                rc = db->ops->settle(db);
        if (rc)
                kinbox__db_abandon(db);
        if (rc) {
                kinbox_rows_destroy(*out);
                *out = NULL;
        }
        return rc;
}

/* "{1,2,3}" */
static int
int_array(kinbox__buf_t *b, size_t n, const int64_t *v)
{
        kinbox__buf_adds(b, "{");
        for (size_t i = 0; i < n; i++)
                kinbox__buf_printf(b, "%s%" PRId64, i ? "," : "", v[i]);
        kinbox__buf_adds(b, "}");
        return b->oom ? KINBOX_ERR_NOMEM : 0;
}

static int
pg_affected(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
            uint64_t *count)
{
        struct kinbox_rows_s *rows = NULL;
        int rc = db->ops->query(db, sql, n, p, -1, &rows);
        if (!rc && count) {
                int64_t v = rows && rows->nrows && rows->values[0]
                                ? strtoll(rows->values[0], NULL, 10)
                                : 0;
                *count = v > 0 ? (uint64_t)v : 0;
        }
        kinbox_rows_destroy(rows);
        return rc;
}

static int
pg_set_based(kinbox__db_t *db, const char *sql, size_t n, const int64_t *ids,
             const int64_t *versions, uint64_t *done)
{
        kinbox__buf_t a, b;
        kinbox__buf_init(&a);
        kinbox__buf_init(&b);
        int rc = int_array(&a, n, ids);
        if (!rc)
                rc = int_array(&b, n, versions);
        if (!rc) {
                kinbox__param_t p[2] = {{a.p, 0, 0}, {b.p, 0, 0}};
                rc = pg_affected(db, sql, 2, p, done);
        }
        kinbox__buf_free(&a);
        kinbox__buf_free(&b);
        return rc;
}

static const char sent_sql[] =
    "WITH u AS (UPDATE kinbox_outbox o SET status = 'sent', sent_at = now(),"
    " lease_owner = NULL, version = o.version + 1"
    " FROM unnest($1::bigint[], $2::bigint[]) AS x(id, v)"
    " WHERE o.id = x.id AND o.version = x.v AND o.status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static const char release_sql[] =
    "WITH u AS (UPDATE kinbox_outbox o SET next_attempt_at = now(),"
    " lease_owner = NULL, version = o.version + 1"
    " FROM unnest($1::bigint[], $2::bigint[]) AS x(id, v)"
    " WHERE o.id = x.id AND o.version = x.v AND o.status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static int
pg_mark_sent(kinbox__db_t *db, size_t n, const int64_t *ids,
             const int64_t *versions, uint64_t *done)
{
        return pg_set_based(db, sent_sql, n, ids, versions, done);
}

static int
pg_release(kinbox__db_t *db, size_t n, const int64_t *ids,
           const int64_t *versions, uint64_t *done)
{
        return pg_set_based(db, release_sql, n, ids, versions, done);
}

static const char lease_sql[] =
    "WITH u AS (UPDATE kinbox_outbox o SET"
    " next_attempt_at = now() + $3::bigint * interval '1 millisecond',"
    " version = o.version + 1, lease_owner = $4"
    " FROM unnest($1::bigint[], $2::bigint[]) AS x(id, v)"
    " WHERE o.id = x.id AND o.version = x.v AND o.status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static int
pg_lease(kinbox__db_t *db, const char *owner, int64_t lease_ms, size_t n,
         const int64_t *ids, const int64_t *versions, uint64_t *done)
{
        kinbox__buf_t a, b;
        kinbox__buf_init(&a);
        kinbox__buf_init(&b);
        char lease[24];
        snprintf(lease, sizeof(lease), "%" PRId64, lease_ms);
        int rc = int_array(&a, n, ids);
        if (!rc)
                rc = int_array(&b, n, versions);
        if (!rc) {
                kinbox__param_t p[4] = {
                    {a.p, 0, 0}, {b.p, 0, 0}, {lease, 0, 0}, {owner, 0, 0}};
                rc = pg_affected(db, lease_sql, 4, p, done);
        }
        kinbox__buf_free(&a);
        kinbox__buf_free(&b);
        return rc;
}

static const char fail_sql[] =
    "WITH u AS (UPDATE kinbox_outbox SET attempts = attempts + 1,"
    " status = $3, last_error = $4,"
    " next_attempt_at = now() + $5::bigint * interval '1 millisecond',"
    " version = version + 1, lease_owner = NULL"
    " WHERE id = $1::bigint AND version = $2::bigint AND status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static int
pg_fail(kinbox__db_t *db, int64_t id, int64_t version, bool dead,
        const char *err, int64_t delay_ms, uint64_t *done)
{
        char a[24], b[24], d[24];
        snprintf(a, sizeof(a), "%" PRId64, id);
        snprintf(b, sizeof(b), "%" PRId64, version);
        snprintf(d, sizeof(d), "%" PRId64, delay_ms);
        kinbox__param_t p[5] = {{a, 0, 0},
                                {b, 0, 0},
                                {dead ? "dead" : "pending", 0, 0},
                                {err, 0, 0},
                                {d, 0, 0}};
        return pg_affected(db, fail_sql, 5, p, done);
}

static int
pg_probe(kinbox__db_t *db, bool *due)
{
        return kinbox__db_exists(
            db,
            "SELECT 1 FROM kinbox_outbox WHERE status = 'pending'"
            " AND next_attempt_at <= now() LIMIT 1",
            due);
}

static const char append_sql[] =
    "INSERT INTO kinbox_outbox (" KINBOX__OUTBOX_COLS ") "
    "VALUES ($1, $2, $3, $4, $5, $6, $7::integer) "
    /* No conflict target: a partitioned outbox (outbox.layout) has no
     * unique index on the key; its trigger skips a known key the same way
     * (db/outbox_partition.h). */
    "ON CONFLICT DO NOTHING RETURNING id";

static int
pg_append_id(kinbox__db_t *db, const kinbox__param_t *p, int tag, int64_t *idp)
{
        struct kinbox_rows_s *rows = NULL;
        int rc = db->ops->query(db, append_sql, 7, p, tag, &rows);
        *idp = !rc && rows && rows->nrows && rows->values[0]
                   ? strtoll(rows->values[0], NULL, 10)
                   : 0;
        kinbox_rows_destroy(rows);
        return rc;
}

/* ------------------------------------------------ LISTEN connection */

struct kinbox__listener {
        PGconn *conn;
        const kinbox__log_t *log;
};

/* Notices on the LISTEN connection ("terminating connection due to
 * immediate shutdown", ...) go through the logger, never raw to stderr. */
static void
listen_notice(void *arg, const char *message)
{
        kinbox__listener_t *l = arg;
        size_t n = strlen(message);
        while (n && (message[n - 1] == '\n' || message[n - 1] == '\r'))
                n--;
        kinbox__log(l->log, KINBOX_LOG_NOTICE, "relay",
                    "postgresql (LISTEN connection): %.*s", (int)n, message);
}

static void
pg_listen_close(kinbox__listener_t *l)
{
        if (!l)
                return;
        PQfinish(l->conn);
        free(l);
}

static kinbox__listener_t *
pg_listen_open(const struct kinbox_conf_s *conf, const kinbox__log_t *log,
               char *err, size_t errsz)
{
        char *pw = NULL;
        if (kinbox__conf_password(conf, &pw, err, errsz))
                return NULL;
        kinbox__listener_t *l = kinbox__calloc(1, sizeof(*l));
        if (!l) {
                free(pw);
                kinbox__errstr(err, errsz, "out of memory");
                return NULL;
        }
        l->log = log;
        const char *kw[3] = {"dbname", pw ? "password" : NULL, NULL};
        const char *vals[3] = {kinbox_conf_get(conf, "database.url"), pw,
                               NULL};
        l->conn = PQconnectdbParams(kw, vals, 1);
        free(pw);
        if (l->conn)
                PQsetNoticeProcessor(l->conn, listen_notice, l);
        if (!l->conn || PQstatus(l->conn) != CONNECTION_OK) {
                kinbox__errstr(err, errsz, "%s",
                               l->conn ? PQerrorMessage(l->conn)
                                       : "out of memory");
                pg_listen_close(l);
                return NULL;
        }
        PGresult *res = PQexec(l->conn, "LISTEN kinbox_outbox");
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                kinbox__errstr(err, errsz, "LISTEN: %s",
                               PQresultErrorMessage(res));
                PQclear(res);
                pg_listen_close(l);
                return NULL;
        }
        PQclear(res);
        PQsetnonblocking(l->conn, 1);
        return l;
}

static int
pg_listen_fd(kinbox__listener_t *l)
{
        return PQsocket(l->conn);
}

static int
pg_listen_drain(kinbox__listener_t *l, bool *woken, char *err, size_t errsz)
{
        if (!PQconsumeInput(l->conn)) {
                kinbox__errstr(err, errsz, "%s", PQerrorMessage(l->conn));
                return -1;
        }
        PGnotify *nf;
        while ((nf = PQnotifies(l->conn)) != NULL) {
                *woken = true;
                PQfreemem(nf);
        }
        return 0;
}

#define REQUEUE_SET                                                           \
        "UPDATE kinbox_outbox SET status = 'pending', attempts = 0, "         \
        "last_error = NULL, next_attempt_at = now(), version = version + 1, " \
        "lease_owner = NULL "
#define COUNT_NOTIFY                                                          \
        " RETURNING 1) SELECT count(*), pg_notify('kinbox_outbox', '') FROM " \
        "u"

const struct kinbox__outbox_ops kinbox__pg_outbox_ops = {
    .claim = pg_claim,
    .mark_sent = pg_mark_sent,
    .release = pg_release,
    .fail = pg_fail,
    .lease = pg_lease,
    .probe = pg_probe,
    .notify_channel = "kinbox_outbox",
    .listen_open = pg_listen_open,
    .listen_fd = pg_listen_fd,
    .listen_drain = pg_listen_drain,
    .listen_close = pg_listen_close,
    .heads_scan = HEADS_SCAN "1000",
    .affected = pg_affected,
    .append = append_sql,
    .emit = KINBOX__PG_EMIT_SQL,
    .append_id = pg_append_id,
    .requeue_id =
        "WITH u AS (" REQUEUE_SET "WHERE id = $1::bigint AND status IN "
        "('dead', 'canceled')" COUNT_NOTIFY,
    .cancel_id = "WITH u AS (UPDATE kinbox_outbox SET status = 'canceled', "
                 "version = version + 1, lease_owner = NULL "
                 "WHERE id = $1::bigint AND status = 'pending' RETURNING 1) "
                 "SELECT count(*) FROM u",
    .requeue_dest =
        "WITH u AS (" REQUEUE_SET
        "WHERE status = 'dead' AND ($1 = '' OR destination = $1)" COUNT_NOTIFY,
    .cancel_dest = "WITH u AS (UPDATE kinbox_outbox SET status = 'canceled', "
                   "version = version + 1, lease_owner = NULL "
                   "WHERE status = 'pending' AND destination = $1 "
                   "RETURNING 1) SELECT count(*) FROM u",
    .list = "SELECT id, status, destination, idem_key, aggregate_id, "
            "attempts, max_attempts, last_error, created_at, "
            "CASE WHEN status = 'pending' THEN next_attempt_at END, "
            "COALESCE(octet_length(payload), 0), sent_at, version "
            "FROM kinbox_outbox WHERE id > $1::bigint "
            "AND ($2 = '' OR status = $2) "
            "AND ($3 = '' OR destination = $3) ORDER BY id",
    .resend = "SELECT id, destination, idem_key, aggregate_id, payload, "
              "headers, floor(extract(epoch FROM created_at) * 1000)::bigint "
              "FROM kinbox_outbox WHERE kind = 'event' "
              "AND status <> 'canceled' "
              "AND created_at >= to_timestamp($1::bigint / 1000.0) "
              "AND id > $2::bigint ORDER BY id",
};

/* ------------------------------------------------ on the caller's PGconn */

static kinbox_err_t
pg_code(PGconn *conn, const char *state)
{
        if (PQstatus(conn) != CONNECTION_OK ||
            (state && !strncmp(state, "08", 2)))
                return KINBOX_ERR_DB_CONN;
        if (state && (!strcmp(state, "40001") || !strcmp(state, "40P01") ||
                      !strcmp(state, "55P03")))
                return KINBOX_ERR_TRANSIENT;
        return KINBOX_ERR_DB;
}

kinbox_err_t
kinbox__pg_outbox_append(struct pg_conn *conn, const kinbox__param_t p[7],
                         int64_t *idp, char *errstr, size_t errstr_size)
{
        const char *vals[7];
        int lens[7], fmts[7];
        for (int i = 0; i < 7; i++) {
                vals[i] = p[i].v;
                lens[i] = p[i].binary ? (int)p[i].len : 0;
                fmts[i] = p[i].binary;
        }
        PGresult *res =
            PQexecParams(conn, append_sql, 7, NULL, vals, lens, fmts, 0);
        kinbox_err_t rc;
        if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
                const char *st =
                    res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
                kinbox__errstr(
                    errstr, errstr_size, "outbox append: SQLSTATE %s: %s",
                    st ? st : "?????",
                    res ? PQresultErrorMessage(res) : PQerrorMessage(conn));
                rc = pg_code(conn, st);
                PQclear(res);
                return rc;
        }
        int64_t id =
            PQntuples(res) ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : 0;
        PQclear(res);
        if (id > 0) {
                if (idp)
                        *idp = id;
                return KINBOX_OK;
        }
        if (idp) {
                const char *fv[2] = {p[1].v, p[2].v};
                res = PQexecParams(conn, KINBOX__OUTBOX_FIND_ID_SQL, 2, NULL,
                                   fv, NULL, NULL, 0);
                *idp = res && PQresultStatus(res) == PGRES_TUPLES_OK &&
                               PQntuples(res)
                           ? strtoll(PQgetvalue(res, 0, 0), NULL, 10)
                           : 0;
                PQclear(res);
        }
        return KINBOX_ERR_DUPLICATE;
}
