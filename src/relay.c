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
 * relay.claim = lock (lock-held claims, pipeline 1): step 1 writes nothing
 * and keeps its transaction open, the rows held by its row locks (FOR
 * UPDATE SKIP LOCKED, each aggregate's run cut at the first row it could
 * not lock); step 4 runs in that transaction and commits: one write per
 * row. A batch whose reports are not all in within relay.lock.ms of its
 * BEGIN, or that holds actions, degrades: the leases of step 1 are written
 * in its transaction, which commits, and it goes on as above. A database
 * failure while the locks are held ends the transaction: nothing is
 * marked, the rows are pending again at once and published again.
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

#include <librdkafka/rdkafka.h>

#include "confval.h"
#include "db.h"
#include "hdrcodec.h"
#include "internal.h"
#include "migrate.h"
#include "metrics.h"
#include "outbox_int.h"
#include "wake.h"

#define ERR_MAX 500 /* last_error bytes kept */
#define MARGIN_MS 1000 /* lease time kept for marking */
#define MSGID_HEADER "message_id"
#define PIPE_MAX 4 /* batches in flight at most */
#define BATCH_MIN 16 /* smallest claim */
#define POLL_MIN_MS 1 /* polling: interval while rows keep coming */
#define HOT_MS 200 /* polling: close interval after a local append */
#define RELAY_LINGER_MS "1" /* producer linger.ms unless configured */
/* Topics whose size limit the relay remembers, and for how long. */
#define LIMITS_MAX 16
#define LIMIT_TTL_MS 60000
/* Java-compatible keyed partitioning (producer_conf()). */
#define RELAY_PARTITIONER "murmur2_random"

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
        bool held; /* released behind an earlier row of its run */
        bool reclaimed; /* another relay's lease had expired */
        int64_t age_ms; /* since created_at, at claim time */
        int64_t created_ms; /* created_at on this host's clock (wall ms) */
        rd_kafka_resp_err_t dr_err;
        outcome_t out;
        char err[ERR_MAX + 1];
} item_t;

/* A claimed batch in flight: items point into rows. n == 0: free slot. */
typedef struct batch {
        struct kinbox_rows_s *rows;
        item_t *v;
        size_t n;
        int64_t t0; /* claimed at (monotonic ms) */
        int64_t tx0; /* the claim's transaction began (monotonic ms) */
        int64_t us_claim; /* the claim took */
        /* Lock-held (relay.claim = lock): the rows are held by row locks
         * of the claim's transaction, still open on r->db; no lease was
         * written. Cleared when the batch degrades to leases. */
        bool locked;
        bool degraded; /* was lock-held, leases written since */
        /* The transaction holding the rows ended without marking them
         * (the database failed): wait for the reports, mark nothing. */
        bool nomark;
} batch_t;

struct kinbox_relay_s {
        kinbox_conf_t *conf;
        kinbox__log_t log;
        char *owner;
        int64_t batch, lease_ms, poll_ms, base_ms, cap_ms, action_ms;
        int64_t run_max; /* rows of one aggregate per claim */
        /* relay.cloudevents.*: ce_source NULL = CloudEvents off. */
        const char *ce_source, *ce_type, *ce_content_type;
        /* relay.claim = lock: claims hold row locks until the marks
         * (pipeline 1 only); lock_ms bounds how long, from the claim's
         * BEGIN, a batch waits for its reports before it degrades. */
        bool lock_mode;
        int64_t lock_ms;
        int64_t cur_batch; /* claim size now, follows the backlog */
        int depth; /* batches in flight at most */
        batch_t pipe[PIPE_MAX];
        int inflight;
        int64_t idle_ms; /* polling: the current interval */
        int64_t hot_until; /* polling: close intervals until then */
        atomic_bool sleeping;
        int64_t msg_timeout_ms;
        int max_attempts;
        bool notify;

        kinbox__db_t *db;
        rd_kafka_conf_t *rkconf; /* template; dup'ed per producer */
        rd_kafka_t *rk;
        atomic_bool rk_fatal;
        kinbox__listener_t *listen;
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
        /* Topics' max.message.bytes as the broker answered (size_verdicts). */
        struct topic_limit {
                char *topic;
                int64_t bytes; /* -1: the broker did not say */
                int64_t at; /* asked at (monotonic ms) */
        } limits[LIMITS_MAX];
        int nlimits;
        rd_kafka_t *admin_rk; /* asks them; made on first need */
        /* Topics whose durability settings were checked (topic_durability):
         * a background thread asks once per topic and warns. */
        pthread_mutex_t checks_mu;
        pthread_cond_t checks_cv;
        char *checked[LIMITS_MAX * 4];
        int nchecked;
        char *to_check[LIMITS_MAX];
        int nto_check;
        pthread_t checker;
        bool checker_started, checker_stop;
        bool compressed; /* kafka.compression.type is set, not none */
};

static void producer_warm(kinbox_relay_t *r);

/* ---------------------------------------------------------------- utils */

#define STAT_ADD(r, field, n)                                                 \
        do {                                                                  \
                pthread_mutex_lock(&(r)->lock);                               \
                (r)->stats.field += (n);                                      \
                pthread_mutex_unlock(&(r)->lock);                             \
        } while (0)

static void rlog(kinbox_relay_t *r, int level, const char *fmt, ...)
    KINBOX_PRINTF(3, 4);

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
        /* The relay sets enable.gapless.guarantee on purpose (per-aggregate
         * order, see producer_new): librdkafka's "experimental" warning
         * about it at every start says nothing to the operator. */
        if (level == KINBOX_LOG_WARNING && !strcmp(fac, "CONFWARN") &&
            strstr(buf, "enable.gapless.guarantee is experimental"))
                level = KINBOX_LOG_DEBUG;
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
        if (rd_kafka_conf_set(ks->c, k, v, e, sizeof(e)) != RD_KAFKA_CONF_OK) {
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

static bool
hdrs_has(const hdrs_t *h, const char *name)
{
        for (size_t i = 0; i < h->n; i++)
                if (!strcmp(h->v[i].name, name))
                        return true;
        return false;
}

/* CloudEvents binary mode (Kafka protocol binding, relay.cloudevents.
 * source set): the required attributes and the time, each unless the row's
 * stored headers carry it. ce_id is the message id. */
static void
add_cloudevents(const kinbox_relay_t *r, const item_t *it, const hdrs_t *h,
                const char *id, size_t idn, rd_kafka_headers_t *kh)
{
        if (!hdrs_has(h, "ce_specversion"))
                rd_kafka_header_add(kh, "ce_specversion", -1, "1.0", 3);
        if (!hdrs_has(h, "ce_id"))
                rd_kafka_header_add(kh, "ce_id", -1, id, (ssize_t)idn);
        if (!hdrs_has(h, "ce_source"))
                rd_kafka_header_add(kh, "ce_source", -1, r->ce_source, -1);
        if (!hdrs_has(h, "ce_type"))
                rd_kafka_header_add(kh, "ce_type", -1,
                                    r->ce_type ? r->ce_type : it->destination,
                                    -1);
        if (!hdrs_has(h, "ce_time")) {
                char t[40];
                time_t sec = (time_t)(it->created_ms / 1000);
                struct tm tm;
                gmtime_r(&sec, &tm);
                size_t n = strftime(t, sizeof(t), "%Y-%m-%dT%H:%M:%S", &tm);
                snprintf(t + n, sizeof(t) - n, ".%03dZ",
                         (int)(it->created_ms % 1000));
                rd_kafka_header_add(kh, "ce_time", -1, t, -1);
        }
        if (r->ce_content_type && !hdrs_has(h, "content-type"))
                rd_kafka_header_add(kh, "content-type", -1, r->ce_content_type,
                                    -1);
}

/* Build the producer headers: the stored headers in order, then
 * message_id unless the row set one, then (CloudEvents) the ce_ attributes
 * the row did not set. */
static rd_kafka_headers_t *
build_headers(const kinbox_relay_t *r, const item_t *it, char *err,
              size_t errsz)
{
        hdrs_t h;
        if (headers_parse(it->headers_json, &h)) {
                snprintf(err, errsz,
                         "outbox row %" PRId64 ": malformed headers column",
                         it->id);
                return NULL;
        }
        rd_kafka_headers_t *kh = rd_kafka_headers_new(h.n + 7);
        const char *id = NULL;
        size_t idn = 0;
        for (size_t i = 0; i < h.n; i++) {
                rd_kafka_header_add(kh, h.v[i].name, -1, h.v[i].value,
                                    h.v[i].value ? (ssize_t)h.v[i].size : 0);
                if (!id && !strcmp(h.v[i].name, MSGID_HEADER) && h.v[i].value) {
                        id = h.v[i].value;
                        idn = h.v[i].size;
                }
        }
        char own[2 * KINBOX_OUTBOX_NAME_MAX + 2];
        if (!hdrs_has(&h, MSGID_HEADER)) {
                int n = snprintf(own, sizeof(own), "%s:%s", it->destination,
                                 it->idem_key);
                rd_kafka_header_add(kh, MSGID_HEADER, -1, own, n);
                id = own;
                idn = (size_t)n;
        }
        if (r->ce_source) {
                if (!id) { /* a null message_id header: the row's own id */
                        int n = snprintf(own, sizeof(own), "%s:%s",
                                         it->destination, it->idem_key);
                        id = own;
                        idn = (size_t)n;
                }
                add_cloudevents(r, it, &h, id, idn, kh);
        }
        hdrs_free(&h);
        return kh;
}

static void topic_durability(kinbox_relay_t *r, const char *topic);

static void
produce(kinbox_relay_t *r, item_t *it)
{
        char err[256];
        topic_durability(r, it->destination);
        rd_kafka_headers_t *kh = build_headers(r, it, err, sizeof(err));
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
                if (e == RD_KAFKA_RESP_ERR__FATAL) {
                        /* The producer, not the row: back untouched; the
                         * relay makes a new producer before claiming. */
                        it->out = OUT_RELEASE;
                        return;
                }
                snprintf(err, sizeof(err), "produce: %s: %s",
                         rd_kafka_err2name(e), rd_kafka_err2str(e));
                set_err(it->err, err);
                /* Larger than kafka.message.max.bytes: no attempt can
                 * ever publish this row as written. */
                it->out = e == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE
                              ? OUT_DEAD
                              : OUT_RETRY;
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
                snprintf(e, sizeof(e), "action timed out after %" PRId64 " ms",
                         r->action_ms);
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

/* ---------------------------------------------------------------- claim */

static int
cmp_item(const void *a, const void *b)
{
        const item_t *x = a, *y = b;
        return x->id < y->id ? -1 : x->id > y->id;
}

/* Turn claim rows (KINBOX__CL_* columns) into items pointing into rows,
 * in id order (so a run's rows are produced in order). */
static item_t *
items_from_rows(struct kinbox_rows_s *rows, size_t *np)
{
        size_t n = rows ? rows->nrows : 0;
        *np = n;
        if (!n)
                return NULL;
        if (rows->ncols < KINBOX__CL_NCOLS)
                return NULL;
        item_t *v = kinbox__calloc(n, sizeof(*v));
        if (!v)
                return NULL;
        int64_t wall = kinbox__wall_ms();
        for (size_t i = 0; i < n; i++) {
                char **c = rows->values + i * (size_t)rows->ncols;
                size_t *l = rows->lens + i * (size_t)rows->ncols;
                v[i].id = to_i64(c[KINBOX__CL_ID]);
                v[i].version = to_i64(c[KINBOX__CL_VERSION]);
                v[i].action = c[KINBOX__CL_KIND] &&
                              !strcmp(c[KINBOX__CL_KIND], "action");
                v[i].destination = c[KINBOX__CL_DESTINATION];
                v[i].idem_key = c[KINBOX__CL_IDEM_KEY];
                v[i].aggregate_id = c[KINBOX__CL_AGGREGATE];
                v[i].payload = c[KINBOX__CL_PAYLOAD];
                v[i].payload_size =
                    c[KINBOX__CL_PAYLOAD] ? l[KINBOX__CL_PAYLOAD] : 0;
                v[i].headers_json = c[KINBOX__CL_HEADERS];
                v[i].attempts = (int)to_i64(c[KINBOX__CL_ATTEMPTS]);
                v[i].max_attempts = (int)to_i64(c[KINBOX__CL_MAX_ATTEMPTS]);
                v[i].age_ms = to_i64(c[KINBOX__CL_AGE_MS]);
                v[i].created_ms = wall - v[i].age_ms;
                const char *re = c[KINBOX__CL_RECLAIMED];
                v[i].reclaimed = re && (!strcmp(re, "t") || !strcmp(re, "1"));
        }
        qsort(v, n, sizeof(*v), cmp_item);
        return v;
}

/* Items of the same aggregate as v[i] that come after it in the batch
 * (the rest of its run) go back untouched: released, no attempt charged,
 * still behind v[i], which stays pending (retry) or is dead/sent. */
static void
hold_rest_of_run(batch_t *b, size_t i)
{
        const char *agg = b->v[i].aggregate_id;
        if (!agg)
                return;
        for (size_t k = i + 1; k < b->n; k++) {
                item_t *it = &b->v[k];
                if (it->aggregate_id && !strcmp(it->aggregate_id, agg) &&
                    !it->produced && it->out == OUT_NONE) {
                        it->out = OUT_RELEASE;
                        it->held = true;
                }
        }
}

/* Produce every event, then run the actions (a run never mixes the two:
 * same destination). A row that cannot be produced holds the rest of its
 * aggregate's run back, so nothing overtakes it. */
static void
batch_start(kinbox_relay_t *r, batch_t *b)
{
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->action || it->out != OUT_NONE)
                        continue;
                produce(r, it);
                if (!it->produced)
                        hold_rest_of_run(b, i);
        }
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (!it->action || it->out != OUT_NONE)
                        continue;
                /* Never start an action that could outlive the lease. */
                if (kinbox__now_ms() + r->action_ms + MARGIN_MS >
                        b->t0 + r->lease_ms ||
                    atomic_load(&r->stop)) {
                        it->out = OUT_RELEASE;
                        continue;
                }
                run_action(r, it);
                if (it->out != OUT_SENT)
                        hold_rest_of_run(b, i);
                rd_kafka_poll(r->rk, 0);
        }
}

/* Claim a batch into b. Returns <0 on error, else the rows claimed. */
static int
batch_claim(kinbox_relay_t *r, batch_t *b)
{
        memset(b, 0, sizeof(*b));
        /* Heads among the first rows of the backlog first; everything
         * when that found nothing (an aggregate whose head waits for a
         * retry can fill the front of the backlog with its rows). */
        kinbox__claim_req_t req = {r->cur_batch,
                                   r->lease_ms,
                                   r->owner,
                                   r->run_max,
                                   2 * r->cur_batch,
                                   r->lock_mode,
                                   r->lock_ms + 2 * MARGIN_MS,
                                   0};
        if (r->lock_mode) {
                /* Rows another lock-held relay holds look due to this
                 * claim's walk and are skipped at the lock: look past as
                 * many as one relay holds at most (relay.batch.size), so
                 * a second relay gets rows of its own instead of a claim
                 * that comes back short (and shrinks its next one).
                 * Always, not only after a short claim: that variant
                 * saved a PostgreSQL relay alone ~2 ms per 1,000-row
                 * claim but left two relays at 1.0x one (two relays
                 * 23.1 k / 20.2 k rows/s against 31.9 k / 31.6 k, A/B in
                 * one run; docs/benchmarks.md, issue 11 fifth pass). */
                req.window += r->batch;
                req.cand = 4 * r->cur_batch + r->batch;
        }
        b->tx0 = kinbox__now_ms();
        int64_t us = kinbox__now_us();
        int rc = r->db->ops->outbox->claim(r->db, &req, &b->rows);
        if (!rc && (!b->rows || !b->rows->nrows)) {
                kinbox_rows_destroy(b->rows);
                b->rows = NULL;
                req.window = 0;
                rc = r->db->ops->outbox->claim(r->db, &req, &b->rows);
        }
        b->us_claim = kinbox__now_us() - us;
        if (rc) {
                kinbox_rows_destroy(b->rows);
                b->rows = NULL;
                return rc > 0 ? -rc : rc;
        }
        b->v = items_from_rows(b->rows, &b->n);
        b->locked = r->lock_mode && b->n;
        if (b->n && !b->v) {
                /* Lease mode: the claim committed, the leases just expire.
                 * Lock-held: the rows go back untouched. */
                kinbox__db_abandon(r->db);
                kinbox_rows_destroy(b->rows);
                b->rows = NULL;
                b->n = 0;
                b->locked = false;
                return KINBOX_ERR_NOMEM;
        }
        b->t0 = kinbox__now_ms();
        if (b->n) {
                STAT_ADD(r, claimed, b->n);
                STAT_ADD(r, batches, 1);
        } else {
                /* An empty slot is reused without finishing: nothing of
                 * the empty claim may stay behind in it. */
                free(b->v);
                kinbox_rows_destroy(b->rows);
                memset(b, 0, sizeof(*b));
        }
        return (int)b->n;
}

static bool
batch_has_action(const batch_t *b)
{
        for (size_t i = 0; i < b->n; i++)
                if (b->v[i].action)
                        return true;
        return false;
}

/* ---------------------------------------------------------------- marking */

static bool
batch_reported(const batch_t *b)
{
        for (size_t i = 0; i < b->n; i++)
                if (b->v[i].produced && !b->v[i].dr_done)
                        return false;
        return true;
}

/* The topic's max.message.bytes (the broker's effective value, its
 * default included), from a DescribeConfigs on the producer, remembered
 * for a minute; -1 when the broker does not answer within 5 s. */
static rd_kafka_t *admin_handle(kinbox_relay_t *r);
static int topic_configs(rd_kafka_t *rk, const char *topic, const char *n1,
                         int64_t *v1, const char *n2, int64_t *v2);

static int64_t
topic_max_bytes(kinbox_relay_t *r, const char *topic)
{
        int64_t now = kinbox__now_ms();
        struct topic_limit *slot = NULL;
        for (int i = 0; i < r->nlimits; i++)
                if (!strcmp(r->limits[i].topic, topic)) {
                        if (now - r->limits[i].at < LIMIT_TTL_MS)
                                return r->limits[i].bytes;
                        slot = &r->limits[i];
                }
        if (!slot) {
                if (r->nlimits == LIMITS_MAX) {
                        free(r->limits[0].topic);
                        memmove(&r->limits[0], &r->limits[1],
                                sizeof(r->limits[0]) * (LIMITS_MAX - 1));
                        r->nlimits--;
                }
                slot = &r->limits[r->nlimits];
                slot->topic = kinbox__strdup(topic);
                if (!slot->topic)
                        return -1;
                r->nlimits++;
        }
        slot->at = now;
        slot->bytes = -1;
        rd_kafka_t *rk = admin_handle(r);
        if (!rk)
                return -1;
        int64_t v = -1;
        topic_configs(rk, topic, "max.message.bytes", &v, NULL, NULL);
        slot->bytes = v;
        return slot->bytes;
}

/* The relay's admin client, made on first need (pthread_once-like under
 * checks_mu: the checker thread and the relay thread share it). */
static rd_kafka_t *
admin_handle(kinbox_relay_t *r)
{
        pthread_mutex_lock(&r->checks_mu);
        if (!r->admin_rk) {
                /* Not the producer: after a refused request it is failed
                 * (the gapless guarantee). The user's settings (security,
                 * bootstrap) without the producer's callbacks' work. */
                rd_kafka_conf_t *c = rd_kafka_conf_dup(r->rkconf);
                rd_kafka_conf_set(c, "enable.idempotence", "false", NULL, 0);
                rd_kafka_conf_set(c, "enable.gapless.guarantee", "false",
                                  NULL, 0);
                rd_kafka_conf_set_dr_msg_cb(c, NULL);
                /* Its log lines into the relay's logger (rk_log_cb()). */
                rd_kafka_conf_set_opaque(c, r);
                r->admin_rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, NULL, 0);
                if (!r->admin_rk)
                        rd_kafka_conf_destroy(c);
        }
        rd_kafka_t *rk = r->admin_rk;
        pthread_mutex_unlock(&r->checks_mu);
        return rk;
}

/* Integer values of up to three topic configs (NULL names are skipped;
 * -1 where the broker did not say; booleans as 0/1). Returns 0 when the
 * broker answered. */
static int
topic_configs(rd_kafka_t *rk, const char *topic, const char *n1,
              int64_t *v1, const char *n2, int64_t *v2)
{
        rd_kafka_ConfigResource_t *res =
            rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AdminOptions_t *o =
            rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
        rd_kafka_AdminOptions_set_request_timeout(o, 5000, NULL, 0);
        rd_kafka_DescribeConfigs(rk, &res, 1, o, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 6000);
        const rd_kafka_DescribeConfigs_result_t *dr =
            ev ? rd_kafka_event_DescribeConfigs_result(ev) : NULL;
        size_t nres = 0, ncf = 0;
        const rd_kafka_ConfigResource_t **rs =
            dr && !rd_kafka_event_error(ev)
                ? rd_kafka_DescribeConfigs_result_resources(dr, &nres)
                : NULL;
        const rd_kafka_ConfigEntry_t **cf =
            nres == 1 && !rd_kafka_ConfigResource_error(rs[0])
                ? rd_kafka_ConfigResource_configs(rs[0], &ncf)
                : NULL;
        for (size_t i = 0; i < ncf; i++) {
                const char *v = rd_kafka_ConfigEntry_value(cf[i]);
                const char *n = rd_kafka_ConfigEntry_name(cf[i]);
                int64_t x = !v                  ? -1
                            : !strcmp(v, "true")  ? 1
                            : !strcmp(v, "false") ? 0
                                                  : strtoll(v, NULL, 10);
                if (n1 && !strcmp(n, n1))
                        *v1 = x;
                if (n2 && !strcmp(n, n2))
                        *v2 = x;
        }
        int rc = cf ? 0 : -1;
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(o);
        rd_kafka_queue_destroy(q);
        rd_kafka_ConfigResource_destroy(res);
        return rc;
}

/* A topic's replication factor (its first partition's replicas), -1 when
 * unknown. */
static int
topic_replication(rd_kafka_t *rk, const char *topic)
{
        rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
        const struct rd_kafka_metadata *md = NULL;
        int rf = -1;
        if (t && rd_kafka_metadata(rk, 0, t, &md, 5000) == 0 &&
            md->topic_cnt == 1 && !md->topics[0].err &&
            md->topics[0].partition_cnt > 0)
                rf = md->topics[0].partitions[0].replica_cnt;
        if (md)
                rd_kafka_metadata_destroy(md);
        if (t)
                rd_kafka_topic_destroy(t);
        return rf;
}

/* Once per topic: are its settings the ones the relay's guarantee needs?
 * An acknowledged row (acks=all) survives a broker's loss only with a
 * replication factor of 3 (or more) and min.insync.replicas of 2 (or
 * more), and only when no out-of-sync replica may become leader. kinbox
 * publishes anyway (the user's cluster, the user's choice) and says so. */
static void
durability_check(kinbox_relay_t *r, const char *topic)
{
        rd_kafka_t *rk = admin_handle(r);
        if (!rk)
                return;
        int64_t isr = -1, unclean = -1;
        if (topic_configs(rk, topic, "min.insync.replicas", &isr,
                          "unclean.leader.election.enable", &unclean))
                return; /* no answer (or not a real broker): nothing said */
        int rf = topic_replication(rk, topic);
        if ((rf >= 0 && rf < 3) || (isr >= 0 && isr < 2))
                rlog(r, KINBOX_LOG_WARNING,
                     "topic %s: replication factor %d, min.insync.replicas "
                     "%" PRId64 ": a published row can be lost with one "
                     "broker; the relay's guarantee needs replication factor "
                     ">= 3 and min.insync.replicas >= 2 (docs/kafka.md)",
                     topic, rf, isr);
        if (unclean == 1)
                rlog(r, KINBOX_LOG_WARNING,
                     "topic %s: unclean.leader.election.enable = true: an "
                     "out-of-sync replica may become leader and drop "
                     "published rows; set it to false (docs/kafka.md)",
                     topic);
}

static void *
checker_main(void *arg)
{
        kinbox_relay_t *r = arg;
        pthread_mutex_lock(&r->checks_mu);
        for (;;) {
                while (!r->checker_stop && !r->nto_check)
                        pthread_cond_wait(&r->checks_cv, &r->checks_mu);
                if (r->checker_stop)
                        break;
                char *topic = r->to_check[--r->nto_check];
                pthread_mutex_unlock(&r->checks_mu);
                durability_check(r, topic);
                free(topic);
                pthread_mutex_lock(&r->checks_mu);
        }
        pthread_mutex_unlock(&r->checks_mu);
        return NULL;
}

/* The first row for a topic asks the checker thread to look at it; never
 * waits. */
static void
topic_durability(kinbox_relay_t *r, const char *topic)
{
        pthread_mutex_lock(&r->checks_mu);
        for (int i = 0; i < r->nchecked; i++)
                if (!strcmp(r->checked[i], topic)) {
                        pthread_mutex_unlock(&r->checks_mu);
                        return;
                }
        if (r->nchecked == (int)KINBOX__ARRAY_SIZE(r->checked) ||
            r->nto_check == (int)KINBOX__ARRAY_SIZE(r->to_check)) {
                pthread_mutex_unlock(&r->checks_mu);
                return; /* many topics: the first ones were checked */
        }
        char *a = kinbox__strdup(topic), *b = kinbox__strdup(topic);
        if (!a || !b) {
                free(a);
                free(b);
                pthread_mutex_unlock(&r->checks_mu);
                return;
        }
        r->checked[r->nchecked++] = a;
        r->to_check[r->nto_check++] = b;
        if (!r->checker_started &&
            pthread_create(&r->checker, NULL, checker_main, r) == 0)
                r->checker_started = true;
        pthread_cond_signal(&r->checks_cv);
        pthread_mutex_unlock(&r->checks_mu);
}

/*
 * The broker refused a produce request as too large. It refuses the
 * whole request, so every row of that request (of that partition) reports
 * MSG_SIZE_TOO_LARGE, and with the gapless guarantee the producer fails.
 * Charging them all would dead-letter innocent rows; releasing them all
 * would publish the same request forever. A row is a suspect when its key
 * and value alone are larger than the topic's max.message.bytes: without
 * compression no attempt can ever publish it (dead now, the reason named);
 * with compression it is charged an attempt (compressed, it might fit).
 * The other rows of the topic go back uncharged, and are published
 * without the suspect. When no row is a suspect, the request as a whole
 * was too large (kafka.batch.size above the topic's limit): every row is
 * charged, the error says what to set.
 */
static void
size_verdicts(kinbox_relay_t *r, batch_t *b)
{
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->out != OUT_RETRY ||
                    (it->dr_err != RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE &&
                     it->dr_err != RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE))
                        continue;
                const char *topic = it->destination;
                const rd_kafka_resp_err_t code = it->dr_err;
                int64_t limit = topic_max_bytes(r, topic);
                bool any = false;
                for (size_t k = i; k < b->n; k++) {
                        item_t *x = &b->v[k];
                        size_t sz = x->payload_size +
                                    (x->aggregate_id ? strlen(x->aggregate_id)
                                                     : 0);
                        if (x->out != OUT_RETRY || x->dr_err != code ||
                            strcmp(x->destination, topic))
                                continue;
                        if (limit > 0 && (int64_t)sz > limit) {
                                any = true;
                                snprintf(x->err, sizeof(x->err),
                                         "delivery: MSG_SIZE_TOO_LARGE: the "
                                         "record (%zu bytes of key and value) "
                                         "is larger than topic %s's "
                                         "max.message.bytes (%" PRId64 ")%s",
                                         sz, topic, limit,
                                         r->compressed
                                             ? ""
                                             : ": it cannot be published as "
                                               "written");
                                if (!r->compressed)
                                        x->out = OUT_DEAD;
                                x->dr_err = RD_KAFKA_RESP_ERR_NO_ERROR;
                        }
                }
                for (size_t k = i; k < b->n; k++) {
                        item_t *x = &b->v[k];
                        if (x->out != OUT_RETRY || x->dr_err != code ||
                            strcmp(x->destination, topic))
                                continue;
                        x->dr_err = RD_KAFKA_RESP_ERR_NO_ERROR;
                        if (any) {
                                x->out = OUT_RELEASE; /* not its fault */
                        } else if (limit > 0) {
                                snprintf(x->err, sizeof(x->err),
                                         "delivery: MSG_SIZE_TOO_LARGE: a "
                                         "produce request to %s was larger "
                                         "than its max.message.bytes (%" PRId64
                                         "): set kafka.batch.size below it",
                                         topic, limit);
                        }
                }
        }
}

/* Delivery reports into outcomes. Within an aggregate's run, the first
 * failure is charged an attempt; the rows after it go back untouched
 * (released), behind it. With the idempotent producer's gapless guarantee
 * a later row of the same partition is not written after an earlier one
 * failed; should one have been acknowledged anyway, it is on the topic and
 * is marked sent. */
static void
batch_outcomes(kinbox_relay_t *r, batch_t *b)
{
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (!it->produced)
                        continue;
                if (!it->dr_done) {
                        it->out = OUT_NONE; /* lease expires, retried */
                        continue;
                }
                if (!it->dr_err) {
                        it->out = OUT_SENT;
                        continue;
                }
                char e[256];
                snprintf(e, sizeof(e), "delivery: %s: %s",
                         rd_kafka_err2name(it->dr_err),
                         rd_kafka_err2str(it->dr_err));
                set_err(it->err, e);
                it->out = OUT_RETRY;
        }
        size_verdicts(r, b);
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->out != OUT_RETRY || !it->aggregate_id || it->held)
                        continue;
                for (size_t k = i + 1; k < b->n; k++) {
                        item_t *x = &b->v[k];
                        if (x->aggregate_id &&
                            !strcmp(x->aggregate_id, it->aggregate_id) &&
                            (x->out == OUT_RETRY || x->out == OUT_NONE)) {
                                x->out = OUT_RELEASE;
                                x->held = true;
                        }
                }
        }
}

/* One set-based statement for every item with outcome out. */
static int
mark_group(kinbox_relay_t *r, batch_t *b, outcome_t out, uint64_t *asked,
           uint64_t *done)
{
        int64_t *ids = malloc(b->n * sizeof(*ids) * 2);
        if (!ids)
                return KINBOX_ERR_NOMEM;
        int64_t *vers = ids + b->n;
        size_t k = 0;
        for (size_t i = 0; i < b->n; i++) {
                if (b->v[i].out != out)
                        continue;
                ids[k] = b->v[i].id;
                vers[k++] = b->v[i].version;
        }
        int rc = 0;
        *asked = k;
        *done = 0;
        if (k) {
                const struct kinbox__outbox_ops *o = r->db->ops->outbox;
                rc = out == OUT_SENT ? o->mark_sent(r->db, k, ids, vers, done)
                                     : o->release(r->db, k, ids, vers, done);
        }
        free(ids);
        return rc;
}

/* A failed attempt: retry later with backoff, or dead. */
static int
mark_failed(kinbox_relay_t *r, item_t *it, uint64_t *done)
{
        int attempts = it->attempts + 1;
        int max = it->max_attempts > 0 ? it->max_attempts : r->max_attempts;
        if (it->out == OUT_RETRY && attempts >= max)
                it->out = OUT_DEAD;
        bool dead = it->out == OUT_DEAD;
        int64_t d =
            dead ? 0 : kinbox__backoff_ms(attempts - 1, r->base_ms, r->cap_ms);
        int rc = r->db->ops->outbox->fail(r->db, it->id, it->version, dead,
                                          it->err, d, done);
        if (!rc && *done)
                rlog(r, dead ? KINBOX_LOG_WARNING : KINBOX_LOG_INFO,
                     "outbox row %" PRId64 " (%s) attempt %d %s: %s", it->id,
                     it->destination, attempts, dead ? "dead" : "failed",
                     it->err);
        return rc;
}

typedef struct tally {
        uint64_t published, actions_ok, retried, dead, released, conflicts;
        int finished;
} tally_t;

static int
batch_mark(kinbox_relay_t *r, batch_t *b, tally_t *t)
{
        uint64_t asked = 0, done = 0;
        int rc = mark_group(r, b, OUT_SENT, &asked, &done);
        if (rc)
                return rc;
        t->conflicts += asked - done;
        for (size_t i = 0; i < b->n; i++) {
                if (b->v[i].out != OUT_SENT)
                        continue;
                if (b->v[i].action)
                        t->actions_ok++;
                else
                        t->published++;
        }
        /* Sent rows whose version check failed belong to another relay
         * now; it counts them. */
        uint64_t lost = asked - done;
        t->published -= lost < t->published ? lost : t->published;
        t->finished += (int)done;
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->out != OUT_RETRY && it->out != OUT_DEAD)
                        continue;
                if ((rc = mark_failed(r, it, &done)))
                        return rc;
                if (!done)
                        t->conflicts++;
                else if (it->out == OUT_DEAD)
                        t->dead++, t->finished++;
                else
                        t->retried++;
        }
        if (b->locked) {
                /* Lock-held: rows handed back are just not written; the
                 * commit ends their locks, they are pending and due. */
                for (size_t i = 0; i < b->n; i++)
                        t->released += b->v[i].out == OUT_RELEASE ||
                                       b->v[i].out == OUT_NONE;
                return 0;
        }
        rc = mark_group(r, b, OUT_RELEASE, &asked, &done);
        if (rc)
                return rc;
        t->released += done;
        t->conflicts += asked - done;
        return 0;
}

/*
 * A lock-held batch becomes a leased one: in its transaction, write the
 * leases the lease-mode claim writes (version + 1) on every row of the
 * batch and commit; the batch then goes on exactly as a lease-mode batch
 * (version-checked marks in autocommit once its reports are in). Rows
 * whose reports are in are leased too: their outcome may still depend on
 * an earlier row of their run. On a database error the transaction is
 * rolled back (rows pending and due, no attempt charged: published again
 * later, at-least-once) and the batch waits for its reports unmarked.
 */
static int
batch_degrade(kinbox_relay_t *r, batch_t *b, const char *why)
{
        int64_t *ids = malloc(b->n * sizeof(*ids) * 2);
        int rc = ids ? 0 : KINBOX_ERR_NOMEM;
        uint64_t done = 0;
        if (!rc) {
                int64_t *vers = ids + b->n;
                for (size_t i = 0; i < b->n; i++) {
                        ids[i] = b->v[i].id;
                        vers[i] = b->v[i].version;
                }
                rc = r->db->ops->outbox->lease(r->db, r->owner, r->lease_ms,
                                               b->n, ids, vers, &done);
        }
        free(ids);
        /* Every row is ours (locked): a lease that misses one means
         * something changed the row under the lock; take nothing. */
        if (!rc && done != b->n) {
                kinbox__db_seterr(r->db, KINBOX_ERR_STATE, "", 0, -1,
                                  "lease of a lock-held batch wrote %" PRIu64
                                  " of %zu rows",
                                  done, b->n);
                rc = KINBOX_ERR_STATE;
        }
        rc = kinbox__db_end(r->db, rc);
        b->locked = false;
        if (rc) {
                b->nomark = true;
                return rc > 0 ? -rc : rc;
        }
        b->degraded = true;
        for (size_t i = 0; i < b->n; i++)
                b->v[i].version++;
        rlog(r, KINBOX_LOG_DEBUG,
             "batch of %zu rows degraded to leases after %lld ms (%s)", b->n,
             (long long)(kinbox__now_ms() - b->tx0), why);
        return 0;
}

static void
batch_metrics(kinbox_relay_t *r, const batch_t *b, const tally_t *t,
              bool marked)
{
        char l[300];
        const char *name = kinbox_conf_get(r->conf, "name");
        kinbox__m_labels(l, sizeof(l), "relay", name ? name : "",
                         (char *)NULL);
        kinbox__m_add("kinbox_relay_published_total", l,
                      (double)(t->published + t->actions_ok));
        kinbox__m_add("kinbox_relay_failed_total", l, (double)t->retried);
        kinbox__m_add("kinbox_relay_dead_total", l, (double)t->dead);
        kinbox__m_add("kinbox_relay_cas_conflicts_total", l,
                      (double)t->conflicts);
        uint64_t reclaims = 0;
        int64_t now = kinbox__now_ms();
        for (size_t i = 0; i < b->n; i++) {
                reclaims += b->v[i].reclaimed;
                if (marked && b->v[i].out == OUT_SENT)
                        kinbox__m_observe(
                            "kinbox_relay_commit_to_publish_seconds", l,
                            (double)(b->v[i].age_ms + (now - b->t0)) / 1000.0);
        }
        kinbox__m_add("kinbox_relay_lease_reclaims_total", l,
                      (double)reclaims);
}

/* Mark a fully reported batch and free it. Returns <0 on a database
 * error, else the rows finished (sent or dead). */
static int
batch_finish(kinbox_relay_t *r, batch_t *b)
{
        batch_outcomes(r, b);
        /* Crash window for the tests: published, not yet marked sent. */
        if (kinbox__fault("relay_after_publish")) {
                rlog(r, KINBOX_LOG_WARNING,
                     "fault relay_after_publish: SIGKILL before the marks");
                raise(SIGKILL);
        }
        tally_t t = {0};
        int64_t t_mark = kinbox__now_us();
        int rc = 0;
        if (!b->nomark)
                rc = batch_mark(r, b, &t);
        if (b->locked) {
                /* The marks of a lock-held batch are written by its
                 * commit; a failed statement or commit (connection lost:
                 * the server ended the transaction) marked nothing: the
                 * rows are pending, no attempt charged, published again. */
                rc = kinbox__db_end(r->db, rc);
                if (rc)
                        memset(&t, 0, sizeof(t));
        }
        rlog(r, KINBOX_LOG_DEBUG,
             "batch of %zu rows (%s): claim %lld us, delivery reports in "
             "%lld ms, marks %lld us (%" PRIu64 " sent, %" PRIu64
             " handed back)",
             b->n,
             b->nomark     ? "unmarked"
             : b->locked   ? "lock-held"
             : b->degraded ? "degraded to leases"
                           : "leased",
             (long long)b->us_claim, (long long)(t_mark / 1000 - b->t0),
             (long long)(kinbox__now_us() - t_mark),
             t.published + t.actions_ok, t.released);
        if (t.conflicts)
                rlog(r, KINBOX_LOG_NOTICE,
                     "%" PRIu64 " outbox rows were taken over by another "
                     "relay (lease expired)",
                     t.conflicts);
        pthread_mutex_lock(&r->lock);
        r->stats.published += t.published;
        r->stats.actions_ok += t.actions_ok;
        r->stats.retried += t.retried;
        r->stats.dead += t.dead;
        r->stats.released += t.released;
        r->stats.conflicts += t.conflicts;
        pthread_mutex_unlock(&r->lock);
        batch_metrics(r, b, &t, rc == 0 && !b->nomark);
        free(b->v);
        kinbox_rows_destroy(b->rows);
        memset(b, 0, sizeof(*b));
        if (rc)
                return rc > 0 ? -rc : rc;
        return t.finished;
}

/* Past the batch's delivery deadline (kafka.message.timeout.ms, enforced
 * here, see kinbox_relay_new), purge everything queued and in flight at
 * once, so no later row of a partition is sent after an earlier one gave
 * up: purged messages are reported at once and retried like any failure. Reports are written into the
 * items, so none may be left outstanding when a batch is freed. */
static void
batch_expire(kinbox_relay_t *r, batch_t *b)
{
        for (int k = 0; !batch_reported(b); k++) {
                if (k % 50 == 0) {
                        if (k)
                                rlog(r, KINBOX_LOG_WARNING,
                                     "waiting for delivery reports");
                        rd_kafka_purge(r->rk,
                                       RD_KAFKA_PURGE_F_QUEUE |
                                           RD_KAFKA_PURGE_F_INFLIGHT |
                                           RD_KAFKA_PURGE_F_NON_BLOCKING);
                }
                rd_kafka_flush(r->rk, 100);
        }
}

/* Finish every batch whose reports are all in (or whose deadline passed).
 * Returns <0 on a database error, else the rows finished. */
static int
reap(kinbox_relay_t *r)
{
        int finished = 0;
        for (int i = 0; i < PIPE_MAX; i++) {
                batch_t *b = &r->pipe[i];
                if (!b->n)
                        continue;
                if (b->locked && !batch_reported(b) &&
                    kinbox__now_ms() >= b->tx0 + r->lock_ms) {
                        /* The broker is slow: no transaction stays open
                         * past relay.lock.ms. */
                        int rc = batch_degrade(r, b, "delivery reports late");
                        if (rc < 0)
                                return rc;
                }
                if (!batch_reported(b)) {
                        if (kinbox__now_ms() <
                            b->t0 + r->msg_timeout_ms + MARGIN_MS)
                                continue;
                        batch_expire(r, b);
                }
                int rc = batch_finish(r, b);
                r->inflight--;
                if (rc < 0)
                        return rc;
                finished += rc;
        }
        return finished;
}

/* Batch size follows the backlog: it starts at relay.batch.size, is
 * halved after a claim that filled less than half of it and doubled after
 * a full one, within [BATCH_MIN, batch]. A small claim keeps the window
 * of the next one (and the MariaDB candidate read) short. */
static void
resize(kinbox_relay_t *r, int64_t claimed)
{
        if (claimed >= r->cur_batch)
                r->cur_batch *= 2;
        else if (claimed < r->cur_batch / 2)
                r->cur_batch /= 2;
        if (r->cur_batch > r->batch)
                r->cur_batch = r->batch;
        if (r->cur_batch < BATCH_MIN)
                r->cur_batch = r->batch < BATCH_MIN ? r->batch : BATCH_MIN;
}

static bool
producer_fatal(kinbox_relay_t *r)
{
        return atomic_load(&r->rk_fatal) ||
               rd_kafka_fatal_error(r->rk, NULL, 0) !=
                   RD_KAFKA_RESP_ERR_NO_ERROR;
}

/*
 * Whether another batch may be produced now. Not on a producer that
 * failed fatally (its rows would fail at once). Not while a batch in flight
 * has waited half its delivery deadline: that batch's deadline purges
 * everything in the producer, in flight included, and a request in flight
 * may already be written; a younger batch produced just before that purge
 * would see its rows fail although they are on the topic, and publish them
 * again after themselves (an aggregate's run "0..7, 0..7"). So a purge only
 * ever meets messages that have had kafka.message.timeout.ms / 2 to be
 * acknowledged, as with one batch in flight.
 */
static bool
may_produce(kinbox_relay_t *r)
{
        if (producer_fatal(r))
                return false;
        int64_t now = kinbox__now_ms();
        for (int i = 0; i < PIPE_MAX; i++) {
                const batch_t *b = &r->pipe[i];
                if (b->n && now - b->t0 >= r->msg_timeout_ms / 2 &&
                    !batch_reported(b))
                        return false;
        }
        return true;
}

/*
 * One step of the pipeline: claim another batch while fewer than
 * relay.pipeline batches are in flight and rows may be waiting, serve
 * delivery reports, mark finished batches. Returns <0 on error, else 1
 * when more work may be waiting (go again at once), 0 when idle.
 */
static int
step(kinbox_relay_t *r, bool *more)
{
        bool go = *more && r->inflight < r->depth && !atomic_load(&r->stop) &&
                  may_produce(r);
        if (go) {
                batch_t *slot = NULL;
                for (int i = 0; i < PIPE_MAX && !slot; i++)
                        if (!r->pipe[i].n)
                                slot = &r->pipe[i];
                int64_t limit = r->cur_batch;
                int claimed = batch_claim(r, slot);
                if (claimed < 0)
                        return claimed;
                resize(r, claimed);
                if (claimed > 0 && slot->locked && batch_has_action(slot)) {
                        /* An action may run up to relay.action.timeout.ms:
                         * leases before anything runs, not row locks. */
                        int rc = batch_degrade(r, slot, "local actions");
                        if (rc < 0) {
                                /* Nothing was produced: drop the batch. */
                                free(slot->v);
                                kinbox_rows_destroy(slot->rows);
                                memset(slot, 0, sizeof(*slot));
                                return rc;
                        }
                }
                if (claimed > 0) {
                        r->inflight++;
                        batch_start(r, slot);
                }
                /* A full claim: more rows are waiting. A partial one took
                 * every claimable row; the next ones become claimable when
                 * these are marked. */
                *more = claimed >= limit;
                go = *more && r->inflight < r->depth;
        }
        if (r->inflight) {
                /* Claiming again at once when the last claim was full;
                 * otherwise wait a little for delivery reports. */
                rd_kafka_poll(r->rk, go ? 0 : 1);
                int fin = reap(r);
                if (fin < 0)
                        return fin;
                if (fin > 0)
                        *more = true; /* next rows of those aggregates */
        }
        if (!r->inflight && producer_fatal(r)) {
                /* The idempotent producer cannot continue: new one. */
                rd_kafka_flush(r->rk, 1000);
                rd_kafka_destroy(r->rk);
                r->rk = producer_new(r);
                if (!r->rk)
                        return KINBOX_ERR_KAFKA;
                producer_warm(r);
        }
        return *more || r->inflight ? 1 : 0;
}

/* Drop whatever is in flight (stop, error): wait for the reports, mark. */
static void
drain(kinbox_relay_t *r)
{
        int64_t until = kinbox__now_ms() + r->msg_timeout_ms + MARGIN_MS;
        while (r->inflight && kinbox__now_ms() < until) {
                rd_kafka_poll(r->rk, 10);
                if (reap(r) < 0)
                        break;
        }
        for (int i = 0; i < PIPE_MAX; i++) {
                batch_t *b = &r->pipe[i];
                if (!b->n)
                        continue;
                batch_expire(r, b);
                if (batch_finish(r, b) < 0) {
                        /* Marks failed: leases expire, rows are retried. */
                }
                r->inflight--;
        }
}

/* ---------------------------------------------------------------- wakeup */

static void
listen_close(kinbox_relay_t *r)
{
        if (r->listen) {
                r->db->ops->outbox->listen_close(r->listen);
                r->listen = NULL;
        }
}

static void
listen_open(kinbox_relay_t *r)
{
        const struct kinbox__outbox_ops *o = r->db->ops->outbox;
        if (!r->notify || !o->listen_open || r->listen ||
            kinbox__now_ms() < r->listen_retry_at)
                return;
        r->listen_retry_at = kinbox__now_ms() + 5000;
        char e[512];
        r->listen = o->listen_open(r->conf, &r->log, e, sizeof(e));
        if (!r->listen)
                rlog(r, KINBOX_LOG_WARNING,
                     "LISTEN connection failed (polling meanwhile): %s", e);
}

/* Drain pending notifications; false if the connection broke. */
static bool
listen_drain(kinbox_relay_t *r, bool *woken)
{
        char e[512];
        if (r->db->ops->outbox->listen_drain(r->listen, woken, e, sizeof(e))) {
                rlog(r, KINBOX_LOG_WARNING, "LISTEN connection lost: %s", e);
                listen_close(r);
                return false;
        }
        return true;
}

/* Sleep up to ms, or until stop / a NOTIFY / a local append. Returns true
 * when woken by a NOTIFY or a local append. */
static bool
wait_wakeup(kinbox_relay_t *r, int64_t ms)
{
        listen_open(r);
        int64_t until = kinbox__now_ms() + ms;
        bool woken = false;
        atomic_store(&r->sleeping, true);
        while (!atomic_load(&r->stop) && !woken) {
                int64_t left = until - kinbox__now_ms();
                if (left <= 0)
                        break;
                struct pollfd pf[2];
                nfds_t nf = 0;
                pf[nf].fd = r->pipefd[0];
                pf[nf++].events = POLLIN;
                if (r->listen) {
                        /* Notifications that arrived during the cycle. */
                        if (!listen_drain(r, &woken))
                                continue;
                        if (woken)
                                break;
                        pf[nf].fd = r->db->ops->outbox->listen_fd(r->listen);
                        pf[nf++].events = POLLIN;
                }
                int k = poll(pf, nf, (int)left);
                if (k <= 0)
                        continue;
                if (pf[0].revents) {
                        char buf[64];
                        while (read(r->pipefd[0], buf, sizeof(buf)) > 0)
                                ;
                        woken = true; /* a local append (or stop) */
                        r->hot_until = kinbox__now_ms() + HOT_MS;
                }
                if (nf > 1 && pf[1].revents)
                        listen_drain(r, &woken);
        }
        atomic_store(&r->sleeping, false);
        return woken;
}

/*
 * Idle: nothing in flight, the last claim found nothing. With LISTEN/NOTIFY
 * wait for a notification (relay.poll.ms at most). Polling: the interval
 * starts at POLL_MIN_MS while rows keep coming (and for HOT_MS after a
 * local append) and doubles up to relay.poll.ms while claims come back
 * empty; an index-only probe saves the claim when no row is due.
 */
static void
idle(kinbox_relay_t *r, bool *more, bool last_claim_empty)
{
        if (r->listen) {
                wait_wakeup(r, r->poll_ms);
                *more = true;
                return;
        }
        if (kinbox__now_ms() < r->hot_until)
                r->idle_ms = POLL_MIN_MS;
        else if (last_claim_empty)
                r->idle_ms =
                    r->idle_ms * 2 > r->poll_ms ? r->poll_ms : r->idle_ms * 2;
        wait_wakeup(r, r->idle_ms);
        bool due = true;
        if (r->db->ops->outbox->probe(r->db, &due))
                due = true; /* the claim reports the error */
        *more = due;
}

/* The producer is ready before the first claim: brokers connected,
 * metadata known, the idempotent producer id requested. */
static void
producer_warm(kinbox_relay_t *r)
{
        const struct rd_kafka_metadata *md = NULL;
        int64_t t0 = kinbox__now_ms();
        if (rd_kafka_metadata(r->rk, 1, NULL, &md, 5000) ==
            RD_KAFKA_RESP_ERR_NO_ERROR)
                rd_kafka_metadata_destroy(md);
        else
                rlog(r, KINBOX_LOG_WARNING,
                     "no broker metadata yet (publishing will wait)");
        /* The idempotent producer id is requested as soon as a broker is
         * up (one round trip), while the relay opens its LISTEN connection
         * and runs its first claim: rows produced before it arrives wait
         * inside the producer, no longer than that. */
        rd_kafka_poll(r->rk, 0);
        rlog(r, KINBOX_LOG_DEBUG, "producer ready in %" PRId64 " ms",
             kinbox__now_ms() - t0);
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

/* The producer template: the kafka.* settings, then the relay's own. */
static bool
producer_conf(kinbox_relay_t *r, const kinbox_conf_t *conf, char *errstr,
              size_t errstr_size)
{
        struct kset ks = {r->rkconf, errstr, errstr_size, false};
        kinbox__conf_kafka_each(conf, kafka_set_one, &ks);
        if (ks.failed)
                return false;
        /* A claim is a batch already: librdkafka's default linger (5 ms)
         * only adds latency to every cycle. */
        if (!kinbox_conf_get(conf, "kafka.linger.ms") &&
            !kinbox_conf_get(conf, "kafka.queue.buffering.max.ms"))
                kafka_set_one("linger.ms", RELAY_LINGER_MS, &ks);
        /* Keys on the partitions the Java producer (and so Spring, Kafka
         * Streams, Connect) puts them: murmur2 of the key, random for a
         * row without one. librdkafka's own default (consistent_random,
         * CRC32) would put most keys elsewhere, and a key written by a
         * Java service and by the relay would lose its order. The user's
         * kafka.partitioner wins (e.g. consistent_random to keep the
         * mapping of topics an older kinbox wrote; docs/outbox.md). */
        const char *ct = kinbox_conf_get(conf, "kafka.compression.type");
        if (!ct)
                ct = kinbox_conf_get(conf, "kafka.compression.codec");
        r->compressed = ct && strcmp(ct, "none");
        if (!kinbox_conf_get(conf, "kafka.partitioner"))
                kafka_set_one("partitioner", RELAY_PARTITIONER, &ks);
        /* Runs of one aggregate are in flight together: a row must never
         * be written after an earlier row of its partition failed.
         *  - The gapless guarantee turns a failed batch that would leave a
         *    gap into a fatal error (all outstanding messages fail, the
         *    relay makes a new producer) instead of writing later rows.
         *  - It does not cover message timeouts, which librdkafka applies
         *    message by message (an earlier row can time out while a later
         *    one is still sent). So librdkafka never times messages out
         *    (message.timeout.ms = 0); the relay enforces
         *    kafka.message.timeout.ms itself, per batch, by purging
         *    everything queued and in flight at one instant. */
        const char *forced[][2] = {{"enable.idempotence", "true"},
                                   {"enable.gapless.guarantee", "true"},
                                   {"message.timeout.ms", "0"}};
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(forced); i++) {
                kafka_set_one(forced[i][0], forced[i][1], &ks);
                if (ks.failed)
                        return false;
        }
        rd_kafka_conf_set_dr_msg_cb(r->rkconf, dr_cb);
        rd_kafka_conf_set_error_cb(r->rkconf, error_cb);
        rd_kafka_conf_set_log_cb(r->rkconf, rk_log_cb);
        return true;
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
        pthread_mutex_init(&r->checks_mu, NULL);
        pthread_cond_init(&r->checks_cv, NULL);
        r->batch = kinbox__conf_int(conf, "relay.batch.size");
        r->depth = (int)kinbox__conf_int(conf, "relay.pipeline");
        r->run_max = kinbox__conf_int(conf, "relay.run.max");
        r->ce_source = kinbox_conf_get(conf, "relay.cloudevents.source");
        r->ce_type = kinbox_conf_get(conf, "relay.cloudevents.type");
        r->ce_content_type =
            kinbox_conf_get(conf, "relay.cloudevents.content_type");
        if (r->run_max < 1)
                r->run_max = 1;
        if (r->depth < 1 || r->depth > PIPE_MAX)
                r->depth = 1;
        r->lease_ms = kinbox__conf_int(conf, "relay.lease.ms");
        r->lock_ms = kinbox__conf_int(conf, "relay.lock.ms");
        const char *cm = kinbox_conf_get(conf, "relay.claim");
        /* Row locks only with one batch in flight: a second batch's claim
         * would need its own transaction on the one connection. */
        r->lock_mode = cm && !strcmp(cm, "lock") && r->depth == 1;
        r->poll_ms = kinbox__conf_int(conf, "relay.poll.ms");
        r->base_ms = kinbox__conf_int(conf, "relay.backoff.base.ms");
        r->cap_ms = kinbox__conf_int(conf, "relay.backoff.max.ms");
        r->max_attempts = (int)kinbox__conf_int(conf, "relay.max_attempts");
        r->action_ms = kinbox__conf_int(conf, "relay.action.timeout.ms");
        r->notify = conf_bool(conf, "relay.notify", true);
        if (r->batch <= 0)
                r->batch = 1000;
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
                kinbox__errstr(
                    errstr, errstr_size,
                    "relay.lease.ms (%" PRId64 ") must exceed "
                    "relay.action.timeout.ms (%" PRId64 ") and "
                    "kafka.message.timeout.ms (%" PRId64 ") by at least %d ms",
                    r->lease_ms, r->action_ms, r->msg_timeout_ms, MARGIN_MS);
                goto fail;
        }
        /* A lock-held batch degrades before half its delivery deadline,
         * so the deadline's purge only ever meets leased batches. */
        if (r->lock_ms <= 0)
                r->lock_ms = 250;
        if (r->lock_ms > r->msg_timeout_ms / 2)
                r->lock_ms =
                    r->msg_timeout_ms / 2 > 0 ? r->msg_timeout_ms / 2 : 1;
        if (!kinbox_conf_get(conf, "kafka.bootstrap.servers")) {
                kinbox__errstr(errstr, errstr_size,
                               "kafka.bootstrap.servers is required");
                goto fail;
        }

        /* Producer configuration, validated now. */
        r->rkconf = rd_kafka_conf_new();
        if (!producer_conf(r, conf, errstr, errstr_size))
                goto fail;

        kinbox__conf_logger(conf, &r->log);
        r->db = kinbox__db_new_conf(conf, errstr, errstr_size);
        if (!r->db)
                goto fail;

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
        if ((rc = kinbox__schema_check_db(r->db, NULL, r->errstr,
                                          sizeof(r->errstr)))) {
                ret = (kinbox_err_t)rc;
                goto out;
        }
        r->rk = producer_new(r);
        if (!r->rk) {
                ret = KINBOX_ERR_KAFKA;
                goto out;
        }
        producer_warm(r);
        listen_open(r);
        kinbox__wake_register(r->pipefd[1], &r->sleeping);
        r->cur_batch = r->batch;
        r->idle_ms = POLL_MIN_MS;
        rlog(r, KINBOX_LOG_INFO,
             "relay %s started (%s, batch %" PRId64 ", lease %" PRId64
             " ms, claims %s, %s)",
             r->owner, r->db->ops->name, r->batch, r->lease_ms,
             r->lock_mode ? "lock-held" : "leased",
             r->listen ? "LISTEN/NOTIFY" : "polling");

        int failures = 0;
        bool connected = true, more = true;
        while (!atomic_load(&r->stop)) {
                if (!connected) {
                        rc = kinbox__db_connect(r->db);
                        if (rc) {
                                STAT_ADD(r, db_errors, 1);
                                wait_wakeup(r, kinbox__backoff_ms(failures++,
                                                                  r->base_ms,
                                                                  r->cap_ms));
                                continue;
                        }
                        connected = true;
                }
                bool asked = more;
                rc = step(r, &more);
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
                        more = true;
                        continue;
                }
                failures = 0;
                if (rc > 0) {
                        if (more)
                                r->idle_ms = POLL_MIN_MS;
                        continue;
                }
                idle(r, &more, asked);
        }
        drain(r);
out:
        kinbox__wake_unregister(r->pipefd[1]);
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
        for (int i = 0; i < r->nlimits; i++)
                free(r->limits[i].topic);
        if (r->checker_started) {
                pthread_mutex_lock(&r->checks_mu);
                r->checker_stop = true;
                pthread_cond_signal(&r->checks_cv);
                pthread_mutex_unlock(&r->checks_mu);
                pthread_join(r->checker, NULL);
        }
        for (int i = 0; i < r->nchecked; i++)
                free(r->checked[i]);
        for (int i = 0; i < r->nto_check; i++)
                free(r->to_check[i]);
        pthread_mutex_destroy(&r->checks_mu);
        pthread_cond_destroy(&r->checks_cv);
        if (r->admin_rk)
                rd_kafka_destroy(r->admin_rk);
        free(r);
}
