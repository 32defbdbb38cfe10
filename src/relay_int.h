/*
 * relay_int.h -- what the relay's files share (internal): its state
 * (struct kinbox_relay_s), a claimed batch and its rows, small helpers,
 * and the calls between them. relay.c has the API and the cycle (claim,
 * publish, mark: step()); relay_kafka.c the producer and the topics'
 * settings; relay_action.c local actions; relay_claim.c claims;
 * relay_mark.c verdicts and marks; relay_wake.c waiting for work (LISTEN,
 * polling, the in-process wake-up through wake.c); relay_log.c the log
 * relay (relay.source = wal | binlog) beside them. The design: relay.c.
 */
#ifndef KINBOX_RELAY_INT_H
#define KINBOX_RELAY_INT_H

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "db.h"
#include "hdrcodec.h"
#include "internal.h"
#include "metrics.h"
#include "tracing.h"

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
/* Producer topic.metadata.refresh.interval.ms unless configured: how long
 * the relay may keep a topic's old partition count after partitions were
 * added (librdkafka's default, 5 minutes, put new rows of a key on its old
 * partition that long). */
#define RELAY_METADATA_REFRESH_MS "10000"

#define STAT_ADD(r, field, n)                                                 \
        do {                                                                  \
                pthread_mutex_lock(&(r)->lock);                               \
                (r)->stats.field += (n);                                      \
                pthread_mutex_unlock(&(r)->lock);                             \
        } while (0)

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
        int64_t created_at_ms; /* created_at on the database's clock: the
                                * record's timestamp, the same at every
                                * re-publish (db/inbox.c) */
        rd_kafka_resp_err_t dr_err;
        outcome_t out;
        char err[ERR_MAX + 1];
        /* Tracing on and the row has a valid traceparent: its context and
         * when its publish or action began (relay_trace.c). */
        bool traced;
        kinbox_trace_t trace;
        int64_t trace_start_ns;
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
        bool tracing; /* holds a reference on the span exporter */
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
        bool rk_left; /* a Kafka client outlived its destroy bound: r stays */
        bool compressed; /* kafka.compression.type is set, not none */
        struct lrelay *logr; /* relay.source = wal | binlog (relay_log.c) */
        /* Failed attempts are said one line per FAIL_LOG_MS, the rest
         * summed (a broker outage fails every row; relay thread only). */
        struct {
                int64_t at; /* monotonic ms of the last line, 0 never */
                uint64_t failed, dead; /* since then, not said */
                char last[ERR_MAX + 200]; /* the last of those */
        } faillog;
};

/* relay_mark.c: say the failed attempts summed since the last line, if
 * any (the relay's thread; at stop). */
void kinbox__relay_faillog_flush(kinbox_relay_t *r);

static inline void rlog(kinbox_relay_t *r, int level, const char *fmt, ...)
    KINBOX_PRINTF(3, 4);

static inline void
rlog(kinbox_relay_t *r, int level, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        kinbox__vlog(&r->log, level, "relay", fmt, ap);
        va_end(ap);
}

/* Copy at most ERR_MAX bytes, cut on a UTF-8 boundary, one line. */
static inline void
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

static inline int64_t
to_i64(const char *s)
{
        if (!s)
                return 0;
        char *end = NULL;
        long long v = strtoll(s, &end, 10);
        return end == s ? 0 : (int64_t)v;
}

static inline void
hdrs_free(hdrs_t *h)
{
        kinbox__hdrs_free(h);
}

/* Parse the headers column (hdrcodec.h). Returns 0, -1 on malformed input
 * / OOM. */
static inline int
headers_parse(const char *json, hdrs_t *out)
{
        return kinbox__hdrcodec_decode(json, json ? strlen(json) : 0, out,
                                       NULL, 0);
}

/* ---- relay_kafka.c: the producer, publishing, the topics' settings */
/* The producer template: the kafka.* settings, then the relay's own. */
bool kinbox__relay_producer_conf(kinbox_relay_t *r, const kinbox_conf_t *conf,
                                 char *errstr, size_t errstr_size);
/* A producer from the template (NULL with r->errstr set). */
rd_kafka_t *kinbox__relay_producer_new(kinbox_relay_t *r);
/* Brokers connected and the producer id asked for before the first claim. */
void kinbox__relay_producer_warm(kinbox_relay_t *r);
/* relay_trace.c: a row's context when its publish or action begins, and
 * the spans of a finished batch (tracing on). */
void kinbox__relay_trace_begin(kinbox_relay_t *r, item_t *it, const void *tp,
                               size_t tp_len);
void kinbox__relay_trace_spans(kinbox_relay_t *r, const batch_t *b);

/* Publish one claimed event row (its delivery report sets it->dr_done). */
void kinbox__relay_produce(kinbox_relay_t *r, item_t *it);
/* The same on producer rk (the log relay's own, relay_log.c): the key,
 * headers (message_id, trace context, CloudEvents) and timestamp of the
 * polling relay. */
void kinbox__relay_produce_on(kinbox_relay_t *r, rd_kafka_t *rk, item_t *it);
/* A produce or delivery error of a row for topic as people read it:
 * "what: NAME: text", explained for the codes that need it (a missing
 * topic, a purged or timed-out message), in buf. */
const char *kinbox__relay_kafka_err(const char *what, rd_kafka_resp_err_t e,
                                    const char *topic, char *buf, size_t sz);
/* A topic's max.message.bytes as the broker says (-1: unknown), asked
 * again after LIMIT_TTL_MS. */
int64_t kinbox__relay_topic_max_bytes(kinbox_relay_t *r, const char *topic);

/* ---- relay_action.c: local actions */
/* Run one claimed action row on a worker thread, with the timeout. */
void kinbox__relay_run_action(kinbox_relay_t *r, item_t *it);

/* ---- relay_claim.c: claiming rows, starting a batch */
/* Claim a batch into the free slot b: <0 an error, else the rows claimed. */
int kinbox__relay_claim(kinbox_relay_t *r, batch_t *b);
/* Publish or run every row of a claimed batch. */
void kinbox__relay_start(kinbox_relay_t *r, batch_t *b);
/* Whether the batch holds an action row. */
bool kinbox__relay_has_action(const batch_t *b);

/* ---- relay_mark.c: verdicts and marks */
/* Whether every produced row of the batch has its delivery report. */
bool kinbox__relay_reported(const batch_t *b);
/* A lock-held batch writes its leases and commits (why: logged). */
int kinbox__relay_degrade(kinbox_relay_t *r, batch_t *b, const char *why);
/* Mark a fully reported batch and free its slot: <0 a database error,
 * else the rows finished (sent or dead). */
int kinbox__relay_finish(kinbox_relay_t *r, batch_t *b);
/* A batch past its delivery deadline: purge, wait for the reports. */
void kinbox__relay_expire(kinbox_relay_t *r, batch_t *b);

/* ---- relay_wake.c: waiting for work */
/* Ask the relay to stop (kinbox_relay_stop()'s work: async-signal-safe;
 * the relay's own threads call it on a fatal error). */
void kinbox__relay_halt(kinbox_relay_t *r);
/* Open the LISTEN connection where the backend has one (retried at most
 * every 5 s). */
void kinbox__relay_listen_open(kinbox_relay_t *r);
/* Close the LISTEN connection, if open. */
void kinbox__relay_listen_close(kinbox_relay_t *r);
/* Sleep up to ms, or until stop / a NOTIFY / a local append (true: woken). */
bool kinbox__relay_wait(kinbox_relay_t *r, int64_t ms);
/* Nothing in flight, the last claim found nothing: wait for work. */
void kinbox__relay_idle(kinbox_relay_t *r, bool *more, bool last_claim_empty);

#endif
