/*
 * relay.c -- the outbox relay: claim due rows, publish them with the
 * idempotent producer (or run their local action), mark them with a
 * version check; failures back off with full jitter and go dead after
 * max attempts. PostgreSQL LISTEN/NOTIFY wake-up, polling as fallback.
 *
 * One cycle:
 *   1. claim (committed before any side effect): due pending rows that are
 *      the oldest pending row of their aggregate, FOR UPDATE SKIP LOCKED;
 *      next_attempt_at := now + lease, version := version + 1. Rows stay
 *      'pending', so a relay that dies just lets its lease expire.
 *   2. produce every event (key = aggregate id, header message_id =
 *      "<destination>:<idem_key>", user headers kept); run the actions one
 *      at a time on a worker thread with a timeout, while the producer works.
 *   3. wait for every delivery report (message.timeout.ms < lease).
 *   4. mark sent / record failures / hand back, each with
 *      WHERE id = ? AND version = ?: zero rows means another relay owns the
 *      row now — counted, never overwritten.
 * A cycle that finished rows starts the next one at once (so an aggregate's
 * next row follows right away); an empty claim waits for a NOTIFY or
 * relay.poll.ms.
 *
 * Per-aggregate order holds because a row is only claimable while no older
 * row of its aggregate is pending, and that older row stays pending until
 * it was acknowledged by the broker (or went dead / was canceled). Rows of
 * one aggregate are ordered by id, i.e. by append order; writers of one
 * aggregate serialize on the aggregate's own row lock in practice.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "confval.h"
#include "db.h"
#include "hdrcodec.h"
#include "internal.h"
#include "metrics.h"

/* From outbox.c. */
kinbox__db_t *kinbox__outbox_db_open(const kinbox_conf_t *conf, char *errstr,
                                     size_t errstr_size);
int kinbox__outbox_affected(kinbox__db_t *db, const char *sql, int n,
                            const kinbox__param_t *p, uint64_t *countp);

#define ERR_MAX 500       /* last_error bytes kept */
#define MARGIN_MS 1000    /* lease time kept for marking */
#define MSGID_HEADER "message_id"

/* ---------------------------------------------------------------- types */

/* Stored headers (hdrcodec.h). */
typedef kinbox__hdr_t hdr_t;
typedef kinbox__hdrs_t hdrs_t;

struct kinbox_action_s {
        int64_t id;
        char *name;
        char *idem_key;
        char *aggregate_id;
        char *payload;
        size_t payload_size;
        int attempt;
        hdrs_t headers;
        char error[ERR_MAX + 1];
};

typedef struct action_reg {
        char *name;
        kinbox_action_fn fn;
        void *opaque;
} action_reg_t;

typedef enum outcome {
        OUT_NONE = 0, /* no verdict: leave the lease to expire */
        OUT_SENT,
        OUT_RETRY,
        OUT_DEAD,
        OUT_RELEASE
} outcome_t;

typedef struct item {
        int64_t id, version;
        bool action;
        const char *destination, *idem_key, *aggregate_id, *headers_json;
        const char *payload; /* NULL: null payload */
        size_t payload_size;
        int attempts, max_attempts;
        bool produced, dr_done;
        rd_kafka_resp_err_t dr_err;
        outcome_t out;
        char err[ERR_MAX + 1];
} item_t;

struct kinbox_relay_s {
        kinbox_conf_t *conf;
        kinbox__log_t log;
        char *owner;
        bool pg;
        int64_t batch, lease_ms, poll_ms, base_ms, cap_ms, action_ms;
        int64_t msg_timeout_ms;
        int max_attempts;
        bool notify;

        kinbox__db_t *db;
        rd_kafka_conf_t *rkconf; /* template; dup'ed per producer */
        rd_kafka_t *rk;
        atomic_bool rk_fatal;
        PGconn *listen;
        int64_t listen_retry_at;
        int pipefd[2];

        atomic_bool stop;
        atomic_bool running;

        action_reg_t *actions;
        size_t nactions;

        pthread_mutex_t lock; /* stats, live_jobs */
        pthread_cond_t jobs_cv;
        int live_jobs;
        kinbox_relay_stats_t stats;
        char errstr[1024];
};

/* ---------------------------------------------------------------- utils */

#define STAT_ADD(r, field, n)                                                  \
        do {                                                                   \
                pthread_mutex_lock(&(r)->lock);                                \
                (r)->stats.field += (n);                                       \
                pthread_mutex_unlock(&(r)->lock);                              \
        } while (0)

static void
rlog(kinbox_relay_t *r, int level, const char *fmt, ...) KINBOX_PRINTF(3, 4);

static void
rlog(kinbox_relay_t *r, int level, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        kinbox__vlog(&r->log, level, "relay", fmt, ap);
        va_end(ap);
}

/* Copy at most ERR_MAX bytes, cut on a UTF-8 boundary, one line. */
static void
set_err(char *dst, const char *src)
{
        size_t n = strlen(src);
        if (n > ERR_MAX) {
                n = ERR_MAX;
                while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
                        n--;
        }
        memcpy(dst, src, n);
        dst[n] = '\0';
        for (size_t i = 0; i < n; i++)
                if (dst[i] == '\n' || dst[i] == '\r')
                        dst[i] = ' ';
}

static int64_t
to_i64(const char *s)
{
        if (!s)
                return 0;
        char *end = NULL;
        long long v = strtoll(s, &end, 10);
        return end == s ? 0 : (int64_t)v;
}

static void
hdrs_free(hdrs_t *h)
{
        kinbox__hdrs_free(h);
}

/* ---------------------------------------------------------- header JSON */

/* Parse the headers column (hdrcodec.h). Returns 0, -1 on malformed input
 * / OOM. */
static int
headers_parse(const char *json, hdrs_t *out)
{
        return kinbox__hdrcodec_decode(json, json ? strlen(json) : 0, out,
                                       NULL, 0);
}

/* ---------------------------------------------------------------- Kafka */

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        KINBOX__UNUSED(rk);
        KINBOX__UNUSED(opaque);
        item_t *it = m->_private;
        if (!it)
                return;
        it->dr_done = true;
        it->dr_err = m->err;
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
        kinbox_relay_t *r = opaque;
        char buf[256];
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
                rd_kafka_fatal_error(rk, buf, sizeof(buf));
                atomic_store(&r->rk_fatal, true);
                rlog(r, KINBOX_LOG_ERR, "fatal producer error: %s", buf);
                return;
        }
        rlog(r, KINBOX_LOG_WARNING, "producer: %s: %s",
             rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

static void
rk_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        kinbox_relay_t *r = rd_kafka_opaque(rk);
        if (r)
                kinbox__log(&r->log, level, "rdkafka", "%s: %s", fac, buf);
}

struct kset {
        rd_kafka_conf_t *c;
        char *errstr;
        size_t errstr_size;
        bool failed;
};

static void
kafka_set_one(const char *k, const char *v, void *arg)
{
        struct kset *ks = arg;
        char e[256];
        if (ks->failed)
                return;
        if (rd_kafka_conf_set(ks->c, k, v, e, sizeof(e)) !=
            RD_KAFKA_CONF_OK) {
                kinbox__errstr(ks->errstr, ks->errstr_size, "kafka.%s: %s", k,
                               e);
                ks->failed = true;
        }
}

static rd_kafka_t *
producer_new(kinbox_relay_t *r)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_dup(r->rkconf);
        rd_kafka_conf_set_opaque(c, r);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        if (!rk) {
                rd_kafka_conf_destroy(c);
                snprintf(r->errstr, sizeof(r->errstr),
                         "cannot create producer: %s", e);
                return NULL;
        }
        atomic_store(&r->rk_fatal, false);
        return rk;
}

/* Build the producer headers: user headers, plus message_id unless the user
 * set one. */
static rd_kafka_headers_t *
build_headers(const item_t *it, char *err, size_t errsz)
{
        hdrs_t h;
        if (headers_parse(it->headers_json, &h)) {
                snprintf(err, errsz, "outbox row %" PRId64
                         ": malformed headers column", it->id);
                return NULL;
        }
        rd_kafka_headers_t *kh = rd_kafka_headers_new(h.n + 1);
        bool has_id = false;
        for (size_t i = 0; i < h.n; i++) {
                rd_kafka_header_add(kh, h.v[i].name, -1, h.v[i].value,
                                    h.v[i].value ? (ssize_t)h.v[i].size : 0);
                if (!strcmp(h.v[i].name, MSGID_HEADER))
                        has_id = true;
        }
        hdrs_free(&h);
        if (!has_id) {
                char id[2 * KINBOX_OUTBOX_NAME_MAX + 2];
                int n = snprintf(id, sizeof(id), "%s:%s", it->destination,
                                 it->idem_key);
                rd_kafka_header_add(kh, MSGID_HEADER, -1, id, n);
        }
        return kh;
}

static void
produce(kinbox_relay_t *r, item_t *it)
{
        char err[256];
        rd_kafka_headers_t *kh = build_headers(it, err, sizeof(err));
        if (!kh) {
                set_err(it->err, err);
                it->out = OUT_DEAD; /* cannot ever be published as written */
                return;
        }
        for (int tries = 0;; tries++) {
                rd_kafka_resp_err_t e = rd_kafka_producev(
                    r->rk, RD_KAFKA_V_TOPIC(it->destination),
                    RD_KAFKA_V_KEY(it->aggregate_id,
                                   it->aggregate_id ? strlen(it->aggregate_id)
                                                    : 0),
                    RD_KAFKA_V_VALUE((void *)it->payload, it->payload_size),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_HEADERS(kh), RD_KAFKA_V_OPAQUE(it),
                    RD_KAFKA_V_END);
                if (!e) {
                        it->produced = true;
                        return;
                }
                if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL && tries < 50) {
                        rd_kafka_poll(r->rk, 100);
                        continue;
                }
                rd_kafka_headers_destroy(kh);
                snprintf(err, sizeof(err), "produce: %s: %s",
                         rd_kafka_err2name(e), rd_kafka_err2str(e));
                set_err(it->err, err);
                it->out = OUT_RETRY;
                return;
        }
}

/* ---------------------------------------------------------------- actions */

typedef struct job {
        pthread_mutex_t mu;
        pthread_cond_t cv;
        int refs;
        bool done;
        kinbox_result_t res;
        kinbox_action_fn fn;
        void *opaque;
        kinbox_relay_t *relay;
        kinbox_action_t act;
} job_t;

static void
job_unref(job_t *j)
{
        pthread_mutex_lock(&j->mu);
        bool last = --j->refs == 0;
        pthread_mutex_unlock(&j->mu);
        if (!last)
                return;
        free(j->act.name);
        free(j->act.idem_key);
        free(j->act.aggregate_id);
        free(j->act.payload);
        hdrs_free(&j->act.headers);
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
}

static void *
job_main(void *arg)
{
        job_t *j = arg;
        kinbox_relay_t *r = j->relay;
        kinbox_result_t res = j->fn(&j->act, j->opaque);
        pthread_mutex_lock(&j->mu);
        j->res = res;
        j->done = true;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
        pthread_mutex_lock(&r->lock);
        if (--r->live_jobs == 0)
                pthread_cond_broadcast(&r->jobs_cv);
        pthread_mutex_unlock(&r->lock);
        return NULL;
}

static const action_reg_t *
find_action(const kinbox_relay_t *r, const char *name)
{
        for (size_t i = 0; i < r->nactions; i++)
                if (!strcmp(r->actions[i].name, name))
                        return &r->actions[i];
        return NULL;
}

static void
run_action(kinbox_relay_t *r, item_t *it)
{
        const char *name =
            it->destination + strlen(KINBOX_OUTBOX_ACTION_PREFIX);
        const action_reg_t *reg = find_action(r, name);
        if (!reg) {
                char e[320];
                snprintf(e, sizeof(e), "no action \"%.255s\" registered",
                         name);
                set_err(it->err, e);
                it->out = OUT_RETRY;
                return;
        }
        job_t *j = kinbox__calloc(1, sizeof(*j));
        if (!j)
                goto oom;
        pthread_mutex_init(&j->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&j->cv, &ca);
        pthread_condattr_destroy(&ca);
        j->refs = 2;
        j->fn = reg->fn;
        j->opaque = reg->opaque;
        j->relay = r;
        j->act.id = it->id;
        j->act.attempt = it->attempts + 1;
        j->act.name = kinbox__strdup(name);
        j->act.idem_key = kinbox__strdup(it->idem_key);
        j->act.aggregate_id =
            it->aggregate_id ? kinbox__strdup(it->aggregate_id) : NULL;
        if (it->payload) {
                j->act.payload = malloc(it->payload_size + 1);
                if (j->act.payload) {
                        memcpy(j->act.payload, it->payload, it->payload_size);
                        j->act.payload[it->payload_size] = '\0';
                }
                j->act.payload_size = it->payload_size;
        }
        if (!j->act.name || !j->act.idem_key ||
            (it->aggregate_id && !j->act.aggregate_id) ||
            (it->payload && !j->act.payload)) {
                j->refs = 1;
                job_unref(j);
                goto oom;
        }
        if (headers_parse(it->headers_json, &j->act.headers)) {
                j->refs = 1;
                job_unref(j);
                set_err(it->err, "malformed headers column");
                it->out = OUT_DEAD;
                return;
        }

        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        pthread_mutex_lock(&r->lock);
        r->live_jobs++;
        pthread_mutex_unlock(&r->lock);
        if (pthread_create(&th, &attr, job_main, j)) {
                pthread_attr_destroy(&attr);
                pthread_mutex_lock(&r->lock);
                r->live_jobs--;
                pthread_mutex_unlock(&r->lock);
                j->refs = 1;
                job_unref(j);
                set_err(it->err, "cannot start action thread");
                it->out = OUT_RETRY;
                return;
        }
        pthread_attr_destroy(&attr);

        struct timespec dl;
        kinbox__deadline_on(CLOCK_MONOTONIC, r->action_ms, &dl);
        pthread_mutex_lock(&j->mu);
        while (!j->done) {
                if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT)
                        break;
        }
        bool done = j->done;
        kinbox_result_t res = j->res;
        char aerr[ERR_MAX + 1];
        memcpy(aerr, j->act.error, sizeof(aerr));
        pthread_mutex_unlock(&j->mu);
        job_unref(j);

        if (!done) {
                char e[128];
                snprintf(e, sizeof(e),
                         "action timed out after %" PRId64 " ms", r->action_ms);
                set_err(it->err, e);
                it->out = OUT_RETRY;
                rlog(r, KINBOX_LOG_WARNING,
                     "outbox row %" PRId64 ": action %s timed out", it->id,
                     name);
                return;
        }
        switch (res) {
        case KINBOX_RESULT_OK:
                it->out = OUT_SENT;
                break;
        case KINBOX_RESULT_REJECT:
                set_err(it->err, aerr[0] ? aerr : "rejected by the action");
                it->out = OUT_DEAD;
                break;
        default:
                set_err(it->err, aerr[0] ? aerr : "action asked to retry");
                it->out = OUT_RETRY;
                break;
        }
        return;
oom:
        set_err(it->err, "out of memory");
        it->out = OUT_RETRY;
}

KINBOX_API int64_t
kinbox_action_id(const kinbox_action_t *a)
{
        return a->id;
}

KINBOX_API const char *
kinbox_action_name(const kinbox_action_t *a)
{
        return a->name;
}

KINBOX_API const char *
kinbox_action_idem_key(const kinbox_action_t *a)
{
        return a->idem_key;
}

KINBOX_API const char *
kinbox_action_aggregate_id(const kinbox_action_t *a)
{
        return a->aggregate_id;
}

KINBOX_API const void *
kinbox_action_payload(const kinbox_action_t *a, size_t *sizep)
{
        if (sizep)
                *sizep = a->payload_size;
        return a->payload;
}

KINBOX_API int
kinbox_action_attempt(const kinbox_action_t *a)
{
        return a->attempt;
}

KINBOX_API size_t
kinbox_action_header_count(const kinbox_action_t *a)
{
        return a->headers.n;
}

KINBOX_API kinbox_err_t
kinbox_action_header_at(const kinbox_action_t *a, size_t idx,
                        kinbox_header_t *hdr)
{
        if (idx >= a->headers.n)
                return KINBOX_ERR_NOT_FOUND;
        hdr->name = a->headers.v[idx].name;
        hdr->value = a->headers.v[idx].value;
        hdr->size = a->headers.v[idx].size;
        return KINBOX_OK;
}

KINBOX_API void
kinbox_action_set_error(kinbox_action_t *a, const char *fmt, ...)
{
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        set_err(a->error, buf);
}

/* ---------------------------------------------------------------- SQL */

static const char pg_claim_sql[] =
    "WITH c AS ("
    " SELECT o.id, o.lease_owner IS NOT NULL AS reclaimed"
    " FROM kinbox_outbox o"
    " WHERE o.status = 'pending' AND o.next_attempt_at <= now()"
    " AND (o.aggregate_id IS NULL OR NOT EXISTS ("
    "  SELECT 1 FROM kinbox_outbox p WHERE p.aggregate_id = o.aggregate_id"
    "  AND p.status = 'pending' AND p.id < o.id))"
    /* NOT IN (a hashed subplan), not NOT EXISTS: an anti-join makes the
     * planner sort every pending row instead of walking the id index to
     * the first $1 (100 ms instead of 2 ms with 50k rows pending). The
     * paused table's destination is its primary key: never NULL. */
    " AND o.destination NOT IN (SELECT z.destination"
    "  FROM kinbox_outbox_paused z)"
    " ORDER BY o.id LIMIT $1::integer"
    " FOR UPDATE OF o SKIP LOCKED)"
    " UPDATE kinbox_outbox t SET"
    " next_attempt_at = now() + $2::bigint * interval '1 millisecond',"
    " version = t.version + 1, lease_owner = $3"
    " FROM c WHERE t.id = c.id"
    " RETURNING t.id, t.version, t.kind, t.destination, t.idem_key,"
    " t.aggregate_id, t.payload, t.headers, t.attempts, t.max_attempts,"
    " c.reclaimed, (extract(epoch FROM now() - t.created_at) * 1000)::bigint";

/* MySQL step 1, a plain (non-locking) read: heads of their aggregates. The
 * locking read of step 2 has no subquery, so SKIP LOCKED cannot make the
 * "older pending row" check skip a row another relay holds. */
static const char my_candidates_fmt[] =
    "SELECT o.id FROM kinbox_outbox o"
    " WHERE o.status = 'pending' AND o.next_attempt_at <= CURRENT_TIMESTAMP(6)"
    " AND (o.aggregate_id IS NULL OR NOT EXISTS ("
    "  SELECT 1 FROM kinbox_outbox p WHERE p.aggregate_id = o.aggregate_id"
    "  AND p.status = 'pending' AND p.id < o.id))"
    " AND NOT EXISTS (SELECT 1 FROM kinbox_outbox_paused z"
    "  WHERE z.destination = o.destination)"
    " ORDER BY o.id LIMIT %" PRId64;

#define CLAIM_COLS                                                             \
        "id, version, kind, destination, idem_key, aggregate_id, payload, "    \
        "headers, attempts, max_attempts"

static const char pg_sent_sql[] =
    "WITH u AS (UPDATE kinbox_outbox o SET status = 'sent', sent_at = now(),"
    " lease_owner = NULL, version = o.version + 1"
    " FROM unnest($1::bigint[], $2::bigint[]) AS x(id, v)"
    " WHERE o.id = x.id AND o.version = x.v AND o.status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static const char pg_fail_sql[] =
    "WITH u AS (UPDATE kinbox_outbox SET attempts = attempts + 1,"
    " status = $3, last_error = $4,"
    " next_attempt_at = now() + $5::bigint * interval '1 millisecond',"
    " version = version + 1, lease_owner = NULL"
    " WHERE id = $1::bigint AND version = $2::bigint AND status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static const char my_fail_fmt[] =
    "UPDATE kinbox_outbox SET attempts = attempts + 1,"
    " status = $1, last_error = $2,"
    " next_attempt_at = CURRENT_TIMESTAMP(6) + INTERVAL %" PRId64 " MICROSECOND,"
    " version = version + 1, lease_owner = NULL"
    " WHERE id = %" PRId64 " AND version = %" PRId64 " AND status = 'pending'";

static const char pg_release_sql[] =
    "WITH u AS (UPDATE kinbox_outbox SET next_attempt_at = now(),"
    " version = version + 1, lease_owner = NULL"
    " WHERE id = $1::bigint AND version = $2::bigint AND status = 'pending'"
    " RETURNING 1) SELECT count(*) FROM u";

static const char my_release_fmt[] =
    "UPDATE kinbox_outbox SET next_attempt_at = CURRENT_TIMESTAMP(6),"
    " version = version + 1, lease_owner = NULL"
    " WHERE id = %" PRId64 " AND version = %" PRId64 " AND status = 'pending'";

/* ---------------------------------------------------------------- claim */

static int
cmp_item(const void *a, const void *b)
{
        const item_t *x = a, *y = b;
        return x->id < y->id ? -1 : x->id > y->id;
}

/* Turn claim rows (CLAIM_COLS, version already bumped when bumped=true)
 * into items pointing into rows. */
static item_t *
items_from_rows(struct kinbox_rows_s *rows, bool bumped, size_t *np)
{
        size_t n = rows ? rows->nrows : 0;
        *np = n;
        if (!n)
                return NULL;
        item_t *v = kinbox__calloc(n, sizeof(*v));
        if (!v)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                char **c = rows->values + i * (size_t)rows->ncols;
                size_t *l = rows->lens + i * (size_t)rows->ncols;
                v[i].id = to_i64(c[0]);
                v[i].version = to_i64(c[1]) + (bumped ? 0 : 1);
                v[i].action = c[2] && !strcmp(c[2], "action");
                v[i].destination = c[3];
                v[i].idem_key = c[4];
                v[i].aggregate_id = c[5];
                v[i].payload = c[6];
                v[i].payload_size = c[6] ? l[6] : 0;
                v[i].headers_json = c[7];
                v[i].attempts = (int)to_i64(c[8]);
                v[i].max_attempts = (int)to_i64(c[9]);
        }
        qsort(v, n, sizeof(*v), cmp_item);
        return v;
}

static void
list_ids(kinbox__buf_t *b, struct kinbox_rows_s *rows)
{
        for (size_t i = 0; i < rows->nrows; i++)
                kinbox__buf_printf(b, "%s%" PRId64, i ? "," : "",
                                   to_i64(rows->values[i * (size_t)rows->ncols]));
}

static int
claim(kinbox_relay_t *r, int64_t limit, struct kinbox_rows_s **rowsp)
{
        kinbox__db_t *db = r->db;
        char lim[24], lease[24];
        snprintf(lim, sizeof(lim), "%" PRId64, limit);
        snprintf(lease, sizeof(lease), "%" PRId64, r->lease_ms);
        if (r->pg) {
                kinbox__param_t p[3] = {
                    {lim, 0, 0}, {lease, 0, 0}, {r->owner, 0, 0}};
                return db->ops->query(db, pg_claim_sql, 3, p, -1, rowsp);
        }

        char sql[1024];
        struct kinbox_rows_s *cand = NULL, *locked = NULL;
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        /* Read more candidates than wanted: relays racing for the same
         * heads each get a share instead of nothing. */
        snprintf(sql, sizeof(sql), my_candidates_fmt, limit * 4);
        int rc = db->ops->query(db, sql, 0, NULL, -1, &cand);
        if (rc || !cand || !cand->nrows)
                goto out;
        rc = db->ops->begin(db);
        if (rc)
                goto out;
        /* + metrics columns: lease reclaimed, age in ms. */
        kinbox__buf_adds(&b, "SELECT " CLAIM_COLS ", lease_owner IS NOT NULL,"
                             " TIMESTAMPDIFF(MICROSECOND, created_at,"
                             " CURRENT_TIMESTAMP(6)) DIV 1000"
                             " FROM kinbox_outbox "
                             "WHERE id IN (");
        list_ids(&b, cand);
        kinbox__buf_printf(&b,
                           ") AND status = 'pending' AND next_attempt_at <= "
                           "CURRENT_TIMESTAMP(6) ORDER BY id LIMIT %" PRId64
                           " FOR UPDATE SKIP LOCKED",
                           limit);
        if (b.oom) {
                rc = KINBOX_ERR_NOMEM;
                goto out;
        }
        rc = db->ops->query(db, b.p, 0, NULL, -1, &locked);
        if (rc)
                goto out;
        if (locked && locked->nrows) {
                kinbox__buf_reset(&b);
                kinbox__buf_printf(&b,
                                   "UPDATE kinbox_outbox SET version = "
                                   "version + 1, next_attempt_at = "
                                   "CURRENT_TIMESTAMP(6) + INTERVAL %" PRId64
                                   " MICROSECOND, lease_owner = $1 "
                                   "WHERE id IN (",
                                   r->lease_ms * 1000);
                list_ids(&b, locked);
                kinbox__buf_adds(&b, ")");
                kinbox__param_t p[1] = {{r->owner, 0, 0}};
                rc = b.oom ? KINBOX_ERR_NOMEM
                           : db->ops->exec(db, b.p, 1, p, -1);
                if (rc)
                        goto out;
        }
        rc = db->ops->commit(db);
out:
        if (rc && db->in_tx)
                db->ops->rollback(db);
        kinbox__buf_free(&b);
        kinbox_rows_destroy(cand);
        if (rc) {
                kinbox_rows_destroy(locked);
                locked = NULL;
        }
        *rowsp = locked;
        return rc;
}

/* ---------------------------------------------------------------- marking */

static int
mark_sent(kinbox_relay_t *r, item_t *v, size_t n, uint64_t *conflicts)
{
        kinbox__buf_t a, b;
        kinbox__buf_init(&a);
        kinbox__buf_init(&b);
        size_t k = 0;
        int rc = 0;
        for (size_t i = 0; i < n; i++) {
                if (v[i].out != OUT_SENT)
                        continue;
                if (r->pg) {
                        kinbox__buf_printf(&a, "%s%" PRId64, k ? "," : "{",
                                           v[i].id);
                        kinbox__buf_printf(&b, "%s%" PRId64, k ? "," : "{",
                                           v[i].version);
                } else {
                        kinbox__buf_printf(&a, "%s%" PRId64, k ? "," : "",
                                           v[i].id);
                        kinbox__buf_printf(&b, "%s(%" PRId64 ",%" PRId64 ")",
                                           k ? "," : "", v[i].id,
                                           v[i].version);
                }
                k++;
        }
        if (!k)
                goto out;
        uint64_t done = 0;
        if (r->pg) {
                kinbox__buf_adds(&a, "}");
                kinbox__buf_adds(&b, "}");
                if (a.oom || b.oom) {
                        rc = KINBOX_ERR_NOMEM;
                        goto out;
                }
                kinbox__param_t p[2] = {{a.p, 0, 0}, {b.p, 0, 0}};
                rc = kinbox__outbox_affected(r->db, pg_sent_sql, 2, p, &done);
        } else {
                kinbox__buf_t s;
                kinbox__buf_init(&s);
                kinbox__buf_printf(&s,
                                   "UPDATE kinbox_outbox SET status = 'sent', "
                                   "sent_at = CURRENT_TIMESTAMP(6), lease_owner = "
                                   "NULL, version = version + 1 WHERE id IN "
                                   "(%s) AND status = 'pending' AND "
                                   "(id, version) IN (%s)",
                                   a.p, b.p);
                rc = s.oom || a.oom || b.oom
                         ? KINBOX_ERR_NOMEM
                         : kinbox__outbox_affected(r->db, s.p, 0, NULL, &done);
                kinbox__buf_free(&s);
        }
        if (!rc && done < k)
                *conflicts += k - done;
out:
        kinbox__buf_free(&a);
        kinbox__buf_free(&b);
        return rc;
}

static int
mark_one(kinbox_relay_t *r, item_t *it, uint64_t *conflicts)
{
        char id[24], ver[24], delay[24];
        char sql[1024];
        uint64_t done = 0;
        int rc;
        snprintf(id, sizeof(id), "%" PRId64, it->id);
        snprintf(ver, sizeof(ver), "%" PRId64, it->version);
        if (it->out == OUT_RELEASE) {
                if (r->pg) {
                        kinbox__param_t p[2] = {{id, 0, 0}, {ver, 0, 0}};
                        rc = kinbox__outbox_affected(r->db, pg_release_sql, 2,
                                                     p, &done);
                } else {
                        snprintf(sql, sizeof(sql), my_release_fmt, it->id,
                                 it->version);
                        rc = kinbox__outbox_affected(r->db, sql, 0, NULL,
                                                     &done);
                }
        } else {
                int attempts = it->attempts + 1;
                int max = it->max_attempts > 0 ? it->max_attempts
                                               : r->max_attempts;
                if (it->out == OUT_RETRY && attempts >= max)
                        it->out = OUT_DEAD;
                int64_t d = it->out == OUT_DEAD
                                ? 0
                                : kinbox__backoff_ms(attempts - 1, r->base_ms,
                                                     r->cap_ms);
                snprintf(delay, sizeof(delay), "%" PRId64, d);
                const char *st = it->out == OUT_DEAD ? "dead" : "pending";
                if (r->pg) {
                        kinbox__param_t p[5] = {{id, 0, 0},
                                                {ver, 0, 0},
                                                {st, 0, 0},
                                                {it->err, 0, 0},
                                                {delay, 0, 0}};
                        rc = kinbox__outbox_affected(r->db, pg_fail_sql, 5, p,
                                                     &done);
                } else {
                        snprintf(sql, sizeof(sql), my_fail_fmt, d * 1000,
                                 it->id, it->version);
                        kinbox__param_t p[2] = {{st, 0, 0}, {it->err, 0, 0}};
                        rc = kinbox__outbox_affected(r->db, sql, 2, p, &done);
                }
                if (!rc && done)
                        rlog(r,
                             it->out == OUT_DEAD ? KINBOX_LOG_WARNING
                                                 : KINBOX_LOG_INFO,
                             "outbox row %" PRId64 " (%s) attempt %d %s: %s",
                             it->id, it->destination, attempts,
                             it->out == OUT_DEAD ? "dead" : "failed", it->err);
        }
        if (!rc && !done)
                (*conflicts)++;
        return rc ? rc : (done ? 1 : 0);
}

/* ---------------------------------------------------------------- cycle */

static bool
all_reported(item_t *v, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (v[i].produced && !v[i].dr_done)
                        return false;
        return true;
}

/* Metrics of one round; claim rows carry two extra columns (lease
 * reclaimed, age in ms at claim time). */
static void
relay_metrics(kinbox_relay_t *r, struct kinbox_rows_s *rows, item_t *v,
              size_t n, int64_t t0, bool marked, uint64_t published,
              uint64_t actions_ok, uint64_t retried, uint64_t dead,
              uint64_t conflicts)
{
        char l[300];
        const char *name = kinbox_conf_get(r->conf, "name");
        kinbox__m_labels(l, sizeof(l), "relay", name ? name : "",
                         (char *)NULL);
        kinbox__m_add("kinbox_relay_published_total", l,
                      (double)(published + actions_ok));
        kinbox__m_add("kinbox_relay_failed_total", l, (double)retried);
        kinbox__m_add("kinbox_relay_dead_total", l, (double)dead);
        kinbox__m_add("kinbox_relay_cas_conflicts_total", l,
                      (double)conflicts);
        if (!rows || rows->ncols < 12)
                return;
        uint64_t reclaims = 0;
        int64_t now = kinbox__now_ms();
        for (size_t i = 0; i < rows->nrows; i++) {
                char **c = rows->values + i * (size_t)rows->ncols;
                if (c[10] && (!strcmp(c[10], "t") || !strcmp(c[10], "1")))
                        reclaims++;
                if (!marked || !c[11])
                        continue;
                int64_t id = to_i64(c[0]);
                for (size_t k = 0; k < n; k++)
                        if (v[k].id == id && v[k].out == OUT_SENT)
                                kinbox__m_observe(
                                    "kinbox_relay_commit_to_publish_seconds",
                                    l,
                                    (double)(to_i64(c[11]) + (now - t0)) /
                                        1000.0);
        }
        kinbox__m_add("kinbox_relay_lease_reclaims_total", l,
                      (double)reclaims);
}

/*
 * One claim → work → mark round. Returns <0 (a kinbox_err_t) on a database
 * error, else the number of rows finished (sent or dead); *claimedp gets
 * the number claimed.
 */
static int
cycle(kinbox_relay_t *r, size_t *claimedp)
{
        *claimedp = 0;
        int64_t limit = r->batch;
        struct kinbox_rows_s *rows = NULL;
        int64_t us_claim = kinbox__now_us();
        int rc = claim(r, limit, &rows);
        us_claim = kinbox__now_us() - us_claim;
        if (rc) {
                kinbox_rows_destroy(rows);
                return rc;
        }
        size_t n = 0;
        item_t *v = items_from_rows(rows, r->pg, &n);
        if (n && !v) {
                /* The claim committed: the leases just expire. */
                kinbox_rows_destroy(rows);
                return KINBOX_ERR_NOMEM;
        }
        *claimedp = n;
        if (!n) {
                kinbox_rows_destroy(rows);
                return 0;
        }
        int64_t t0 = kinbox__now_ms();
        STAT_ADD(r, claimed, n);
        STAT_ADD(r, batches, 1);

        for (size_t i = 0; i < n; i++)
                if (!v[i].action)
                        produce(r, &v[i]);
        for (size_t i = 0; i < n; i++) {
                if (!v[i].action)
                        continue;
                /* Never start an action that could outlive the lease. */
                if (kinbox__now_ms() + r->action_ms + MARGIN_MS >
                        t0 + r->lease_ms ||
                    atomic_load(&r->stop)) {
                        v[i].out = OUT_RELEASE;
                        continue;
                }
                run_action(r, &v[i]);
                rd_kafka_poll(r->rk, 0);
        }
        int64_t us_wait = kinbox__now_us();
        int64_t dl = t0 + r->msg_timeout_ms + MARGIN_MS;
        while (!all_reported(v, n) && kinbox__now_ms() < dl)
                rd_kafka_flush(r->rk, 100);
        /* Reports are written into v: none may arrive after v is freed.
         * Past the deadline (librdkafka checks message timeouts only about
         * once a second), purge what is left: purged messages are reported
         * at once and are retried like any failure. */
        for (int k = 0; !all_reported(v, n); k++) {
                if (k == 0 || k % 50 == 0) {
                        if (k)
                                rlog(r, KINBOX_LOG_WARNING,
                                     "waiting for delivery reports");
                        rd_kafka_purge(r->rk, RD_KAFKA_PURGE_F_QUEUE |
                                                  RD_KAFKA_PURGE_F_INFLIGHT |
                                                  RD_KAFKA_PURGE_F_NON_BLOCKING);
                }
                rd_kafka_flush(r->rk, 100);
        }
        for (size_t i = 0; i < n; i++) {
                if (!v[i].produced)
                        continue;
                if (!v[i].dr_done) {
                        v[i].out = OUT_NONE; /* lease expires, retried */
                        continue;
                }
                if (!v[i].dr_err) {
                        v[i].out = OUT_SENT;
                } else {
                        char e[256];
                        snprintf(e, sizeof(e), "delivery: %s: %s",
                                 rd_kafka_err2name(v[i].dr_err),
                                 rd_kafka_err2str(v[i].dr_err));
                        set_err(v[i].err, e);
                        v[i].out = OUT_RETRY;
                }
        }

        us_wait = kinbox__now_us() - us_wait;
        int64_t us_mark = kinbox__now_us();
        /* Crash window for the tests: published, not yet marked sent. */
        if (kinbox__fault("relay_after_publish")) {
                rlog(r, KINBOX_LOG_WARNING,
                     "fault relay_after_publish: SIGKILL before the marks");
                raise(SIGKILL);
        }

        uint64_t conflicts = 0, sconf = 0, published = 0, actions_ok = 0,
                 retried = 0, dead = 0, released = 0;
        int finished = 0;
        rc = mark_sent(r, v, n, &sconf);
        conflicts = sconf;
        if (!rc) {
                for (size_t i = 0; i < n; i++) {
                        if (v[i].out == OUT_SENT) {
                                finished++;
                                if (v[i].action)
                                        actions_ok++;
                                else
                                        published++;
                        }
                }
        }
        for (size_t i = 0; !rc && i < n; i++) {
                if (v[i].out == OUT_RETRY || v[i].out == OUT_DEAD ||
                    v[i].out == OUT_RELEASE) {
                        int m = mark_one(r, &v[i], &conflicts);
                        if (m < 0) {
                                rc = m;
                                break;
                        }
                        if (m == 0)
                                continue;
                        if (v[i].out == OUT_DEAD) {
                                dead++;
                                finished++;
                        } else if (v[i].out == OUT_RETRY) {
                                retried++;
                        } else {
                                released++;
                        }
                }
        }
        us_mark = kinbox__now_us() - us_mark;
        rlog(r, KINBOX_LOG_DEBUG,
             "cycle of %zu rows: claim %lld us, delivery %lld us, marks "
             "%lld us",
             n, (long long)us_claim, (long long)us_wait, (long long)us_mark);
        /* Counted after the marks, so conflicts are not double counted. */
        if (conflicts) {
                rlog(r, KINBOX_LOG_NOTICE,
                     "%" PRIu64 " outbox rows were taken over by another "
                     "relay (lease expired)",
                     conflicts);
                /* Sent rows whose version check failed belong to another
                 * relay now; it will count them. */
                published -= sconf < published ? sconf : published;
        }
        pthread_mutex_lock(&r->lock);
        r->stats.published += published;
        r->stats.actions_ok += actions_ok;
        r->stats.retried += retried;
        r->stats.dead += dead;
        r->stats.released += released;
        r->stats.conflicts += conflicts;
        pthread_mutex_unlock(&r->lock);
        relay_metrics(r, rows, v, n, t0, rc == 0, published, actions_ok,
                      retried, dead, conflicts);

        if (atomic_load(&r->rk_fatal)) {
                /* The idempotent producer cannot continue: new one. */
                rd_kafka_flush(r->rk, 1000);
                rd_kafka_destroy(r->rk);
                r->rk = producer_new(r);
                if (!r->rk)
                        rc = KINBOX_ERR_KAFKA;
        }
        free(v);
        kinbox_rows_destroy(rows);
        if (rc)
                return rc > 0 ? -rc : rc;
        return finished;
}

/* ---------------------------------------------------------------- wakeup */

static void
listen_close(kinbox_relay_t *r)
{
        if (r->listen) {
                PQfinish(r->listen);
                r->listen = NULL;
        }
}

static void
listen_open(kinbox_relay_t *r)
{
        if (!r->notify || !r->pg || r->listen ||
            kinbox__now_ms() < r->listen_retry_at)
                return;
        r->listen_retry_at = kinbox__now_ms() + 5000;
        char e[256];
        char *pw = NULL;
        if (kinbox__conf_password(r->conf, &pw, e, sizeof(e))) {
                rlog(r, KINBOX_LOG_WARNING, "LISTEN connection: %s", e);
                return;
        }
        const char *kw[3] = {"dbname", pw ? "password" : NULL, NULL};
        const char *vals[3] = {kinbox_conf_get(r->conf, "database.url"), pw,
                               NULL};
        PGconn *c = PQconnectdbParams(kw, vals, 1);
        free(pw);
        if (!c || PQstatus(c) != CONNECTION_OK) {
                rlog(r, KINBOX_LOG_WARNING,
                     "LISTEN connection failed (polling meanwhile): %s",
                     c ? PQerrorMessage(c) : "out of memory");
                PQfinish(c);
                return;
        }
        PGresult *res = PQexec(c, "LISTEN kinbox_outbox");
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                rlog(r, KINBOX_LOG_WARNING, "LISTEN failed: %s",
                     PQresultErrorMessage(res));
                PQclear(res);
                PQfinish(c);
                return;
        }
        PQclear(res);
        PQsetnonblocking(c, 1);
        r->listen = c;
}

/* Drain pending notifications; false if the connection broke. */
static bool
listen_drain(kinbox_relay_t *r, bool *woken)
{
        if (!PQconsumeInput(r->listen)) {
                rlog(r, KINBOX_LOG_WARNING, "LISTEN connection lost: %s",
                     PQerrorMessage(r->listen));
                listen_close(r);
                return false;
        }
        PGnotify *nf;
        while ((nf = PQnotifies(r->listen)) != NULL) {
                *woken = true;
                PQfreemem(nf);
        }
        return true;
}

/* Sleep up to ms, or until stop / a NOTIFY. */
static void
wait_wakeup(kinbox_relay_t *r, int64_t ms)
{
        listen_open(r);
        int64_t until = kinbox__now_ms() + ms;
        while (!atomic_load(&r->stop)) {
                int64_t left = until - kinbox__now_ms();
                if (left <= 0)
                        return;
                struct pollfd pf[2];
                nfds_t nf = 0;
                pf[nf].fd = r->pipefd[0];
                pf[nf++].events = POLLIN;
                if (r->listen) {
                        bool woken = false;
                        /* Notifications that arrived during the cycle. */
                        if (!listen_drain(r, &woken))
                                continue;
                        if (woken)
                                return;
                        pf[nf].fd = PQsocket(r->listen);
                        pf[nf++].events = POLLIN;
                }
                int k = poll(pf, nf, (int)left);
                if (k <= 0)
                        continue;
                if (pf[0].revents) {
                        char buf[64];
                        while (read(r->pipefd[0], buf, sizeof(buf)) > 0)
                                ;
                }
                if (nf > 1 && pf[1].revents) {
                        bool woken = false;
                        if (listen_drain(r, &woken) && woken)
                                return;
                }
        }
}

/* ---------------------------------------------------------------- API */

static bool
conf_bool(const kinbox_conf_t *conf, const char *key, bool dflt)
{
        /* kinbox_conf_set validated the value with the same parser. */
        bool b = dflt;
        const char *v = kinbox_conf_get(conf, key);
        if (v && *v)
                kinbox__confval_bool(key, v, &b, NULL, 0);
        return b;
}

KINBOX_API kinbox_relay_t *
kinbox_relay_new(kinbox_conf_t *conf, char *errstr, size_t errstr_size)
{
        if (!conf) {
                kinbox__errstr(errstr, errstr_size, "no configuration");
                return NULL;
        }
        kinbox_relay_t *r = kinbox__calloc(1, sizeof(*r));
        if (!r) {
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return NULL;
        }
        r->pipefd[0] = r->pipefd[1] = -1;
        pthread_mutex_init(&r->lock, NULL);
        pthread_cond_init(&r->jobs_cv, NULL);
        r->batch = kinbox__conf_int(conf, "relay.batch.size");
        r->lease_ms = kinbox__conf_int(conf, "relay.lease.ms");
        r->poll_ms = kinbox__conf_int(conf, "relay.poll.ms");
        r->base_ms = kinbox__conf_int(conf, "relay.backoff.base.ms");
        r->cap_ms = kinbox__conf_int(conf, "relay.backoff.max.ms");
        r->max_attempts = (int)kinbox__conf_int(conf, "relay.max_attempts");
        r->action_ms = kinbox__conf_int(conf, "relay.action.timeout.ms");
        r->notify = conf_bool(conf, "relay.notify", true);
        if (r->batch <= 0)
                r->batch = 100;
        if (r->poll_ms <= 0)
                r->poll_ms = 500;
        if (r->max_attempts <= 0)
                r->max_attempts = 10;
        if (r->base_ms <= 0)
                r->base_ms = 200;
        if (r->cap_ms < r->base_ms)
                r->cap_ms = r->base_ms;

        const char *mt = kinbox_conf_get(conf, "kafka.message.timeout.ms");
        r->msg_timeout_ms = mt ? to_i64(mt) : r->lease_ms / 2;
        if (r->lease_ms < 2 * MARGIN_MS ||
            r->action_ms + MARGIN_MS >= r->lease_ms ||
            r->msg_timeout_ms <= 0 ||
            r->msg_timeout_ms + MARGIN_MS >= r->lease_ms) {
                kinbox__errstr(errstr, errstr_size,
                               "relay.lease.ms (%" PRId64 ") must exceed "
                               "relay.action.timeout.ms (%" PRId64 ") and "
                               "kafka.message.timeout.ms (%" PRId64
                               ") by at least %d ms",
                               r->lease_ms, r->action_ms, r->msg_timeout_ms,
                               MARGIN_MS);
                goto fail;
        }
        if (!kinbox_conf_get(conf, "kafka.bootstrap.servers")) {
                kinbox__errstr(errstr, errstr_size,
                               "kafka.bootstrap.servers is required");
                goto fail;
        }

        /* Producer configuration, validated now. */
        r->rkconf = rd_kafka_conf_new();
        struct kset ks = {r->rkconf, errstr, errstr_size, false};
        kinbox__conf_kafka_each(conf, kafka_set_one, &ks);
        if (ks.failed)
                goto fail;
        char tmo[24];
        snprintf(tmo, sizeof(tmo), "%" PRId64, r->msg_timeout_ms);
        const char *forced[][2] = {{"enable.idempotence", "true"},
                                   {"message.timeout.ms", tmo}};
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(forced); i++) {
                kafka_set_one(forced[i][0], forced[i][1], &ks);
                if (ks.failed)
                        goto fail;
        }
        rd_kafka_conf_set_dr_msg_cb(r->rkconf, dr_cb);
        rd_kafka_conf_set_error_cb(r->rkconf, error_cb);
        rd_kafka_conf_set_log_cb(r->rkconf, rk_log_cb);

        kinbox__conf_logger(conf, &r->log);
        r->db = kinbox__outbox_db_open(conf, errstr, errstr_size);
        if (!r->db)
                goto fail;
        r->pg = r->db->backend == KINBOX_BACKEND_POSTGRESQL;

        char host[128] = "localhost";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        const char *name = kinbox_conf_get(conf, "name");
        kinbox__buf_t o;
        kinbox__buf_init(&o);
        kinbox__buf_printf(&o, "%.100s@%.100s:%ld",
                           name && *name ? name : "kinbox", host,
                           (long)getpid());
        r->owner = o.oom ? NULL : o.p;
        if (!r->owner) {
                kinbox__buf_free(&o);
                kinbox__errstr(errstr, errstr_size, "out of memory");
                goto fail;
        }
        if (pipe(r->pipefd)) {
                kinbox__errstr(errstr, errstr_size, "pipe: %s",
                               strerror(errno));
                goto fail;
        }
        for (int i = 0; i < 2; i++) {
                fcntl(r->pipefd[i], F_SETFL,
                      fcntl(r->pipefd[i], F_GETFL) | O_NONBLOCK);
                fcntl(r->pipefd[i], F_SETFD, FD_CLOEXEC);
        }
        r->conf = conf;
        return r;
fail:
        r->conf = NULL; /* still the caller's */
        kinbox_relay_destroy(r);
        return NULL;
}

KINBOX_API kinbox_err_t
kinbox_relay_register_action(kinbox_relay_t *r, const char *name,
                             kinbox_action_fn fn, void *opaque)
{
        if (!r || !name || !*name || !fn ||
            strlen(name) + strlen(KINBOX_OUTBOX_ACTION_PREFIX) >
                KINBOX_OUTBOX_NAME_MAX)
                return KINBOX_ERR_INVALID;
        if (atomic_load(&r->running))
                return KINBOX_ERR_STATE;
        for (size_t i = 0; i < r->nactions; i++) {
                if (!strcmp(r->actions[i].name, name)) {
                        r->actions[i].fn = fn;
                        r->actions[i].opaque = opaque;
                        return KINBOX_OK;
                }
        }
        action_reg_t *nv =
            realloc(r->actions, (r->nactions + 1) * sizeof(*nv));
        if (!nv)
                return KINBOX_ERR_NOMEM;
        r->actions = nv;
        char *dup = kinbox__strdup(name);
        if (!dup)
                return KINBOX_ERR_NOMEM;
        r->actions[r->nactions++] = (action_reg_t){dup, fn, opaque};
        return KINBOX_OK;
}

KINBOX_API kinbox_err_t
kinbox_relay_run(kinbox_relay_t *r)
{
        if (!r)
                return KINBOX_ERR_INVALID;
        bool expected = false;
        if (!atomic_compare_exchange_strong(&r->running, &expected, true))
                return KINBOX_ERR_STATE;
        kinbox_err_t ret = KINBOX_OK;
        r->errstr[0] = '\0';
        int rc = kinbox__db_connect(r->db);
        if (rc) {
                snprintf(r->errstr, sizeof(r->errstr),
                         "database unreachable: %s", r->db->err.msg);
                ret = KINBOX_ERR_DB_CONN;
                goto out;
        }
        r->rk = producer_new(r);
        if (!r->rk) {
                ret = KINBOX_ERR_KAFKA;
                goto out;
        }
        listen_open(r);
        rlog(r, KINBOX_LOG_INFO,
             "relay %s started (%s, batch %" PRId64 ", lease %" PRId64
             " ms, %s)",
             r->owner, r->pg ? "postgresql" : "mysql", r->batch, r->lease_ms,
             r->listen ? "LISTEN/NOTIFY" : "polling");

        int failures = 0;
        bool connected = true;
        while (!atomic_load(&r->stop)) {
                if (!connected) {
                        rc = kinbox__db_connect(r->db);
                        if (rc) {
                                STAT_ADD(r, db_errors, 1);
                                wait_wakeup(r, kinbox__backoff_ms(
                                                   failures++, r->base_ms,
                                                   r->cap_ms));
                                continue;
                        }
                        connected = true;
                }
                size_t claimed = 0;
                rc = cycle(r, &claimed);
                if (rc < 0) {
                        STAT_ADD(r, db_errors, 1);
                        rlog(r, KINBOX_LOG_WARNING, "relay: %s: %s",
                             kinbox_err_name((kinbox_err_t)rc),
                             r->db->err.msg);
                        if (rc == KINBOX_ERR_KAFKA) {
                                ret = KINBOX_ERR_KAFKA;
                                break;
                        }
                        if (rc == KINBOX_ERR_DB_CONN ||
                            rc == KINBOX_ERR_COMMIT_UNKNOWN)
                                connected = false;
                        wait_wakeup(r, kinbox__backoff_ms(
                                           failures++, r->base_ms, r->cap_ms));
                        continue;
                }
                failures = 0;
                /* Progress (or a full batch): go again at once, the next
                 * row of each aggregate is claimable now. */
                if ((int64_t)claimed >= r->batch || rc > 0)
                        continue;
                wait_wakeup(r, r->poll_ms);
        }
out:
        listen_close(r);
        if (r->rk) {
                rd_kafka_flush(r->rk, 5000);
                rd_kafka_destroy(r->rk);
                r->rk = NULL;
        }
        if (r->db)
                r->db->ops->disconnect(r->db);
        rlog(r, KINBOX_LOG_INFO, "relay %s stopped", r->owner);
        atomic_store(&r->running, false);
        return ret;
}

KINBOX_API void
kinbox_relay_stop(kinbox_relay_t *r)
{
        if (!r)
                return;
        atomic_store(&r->stop, true);
        if (r->pipefd[1] >= 0) {
                ssize_t w = write(r->pipefd[1], "x", 1);
                (void)w;
        }
}

KINBOX_API void
kinbox_relay_stats(const kinbox_relay_t *r, kinbox_relay_stats_t *out)
{
        if (!r || !out)
                return;
        kinbox_relay_t *m = (kinbox_relay_t *)r;
        pthread_mutex_lock(&m->lock);
        *out = r->stats;
        pthread_mutex_unlock(&m->lock);
}

KINBOX_API const char *
kinbox_relay_errstr(const kinbox_relay_t *r)
{
        return r ? r->errstr : "";
}

KINBOX_API void
kinbox_relay_destroy(kinbox_relay_t *r)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        while (r->live_jobs > 0)
                pthread_cond_wait(&r->jobs_cv, &r->lock);
        pthread_mutex_unlock(&r->lock);
        listen_close(r);
        if (r->rk)
                rd_kafka_destroy(r->rk);
        if (r->rkconf)
                rd_kafka_conf_destroy(r->rkconf);
        if (r->db)
                kinbox__db_destroy(r->db);
        for (size_t i = 0; i < r->nactions; i++)
                free(r->actions[i].name);
        free(r->actions);
        free(r->owner);
        for (int i = 0; i < 2; i++)
                if (r->pipefd[i] >= 0)
                        close(r->pipefd[i]);
        pthread_mutex_destroy(&r->lock);
        pthread_cond_destroy(&r->jobs_cv);
        kinbox_conf_destroy(r->conf);
        free(r);
}
