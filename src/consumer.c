/*
 * consumer.c -- the inbox consumer.
 *
 * Threads: the thread in kinbox_consumer_run() polls Kafka, serves
 * rebalances and hands each message to the worker that owns its partition
 * (hash of topic/partition). A worker builds a batch from its partitions'
 * queues, runs it in one transaction on its own connection, and only after
 * COMMIT succeeded stores the offsets. A partition's messages stay at the
 * head of its queue until their transaction committed, so message N+1 is
 * never handed to a handler before N committed.
 *
 * Inside a batch (process_batch): BEGIN; one inbox insert tells which ids
 * are new; handlers run for the new ones; dead letters and offset
 * watermarks are queued; COMMIT. If one message fails (RETRY, REJECT, or a
 * statement of its handler fails) the transaction is rolled back and run
 * again without it: a REJECTed message becomes a dead letter, a RETRYing
 * message and everything after it in its partition stay queued and the
 * partition backs off. The other messages of the batch commit once.
 */
#include "db.h"
#include "internal.h"
#include "metrics.h"
#include "msgid.h"
#include "tx.h"
#include "hdrcodec.h"

#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct part part_t;
typedef struct worker worker_t;

/* The message as handlers see it. */
struct kinbox_msg_s {
        rd_kafka_message_t *rkm;
        part_t *part;
        char *id;     /* NULL when the id could not be extracted */
        char *reason; /* why it failed last (malloc), or why it has no id */
        int attempt;  /* deliveries to the handler so far, +1 when running */
        int failures; /* its own failed attempts (results, statements) */
        int state;    /* per batch run, see enum mstate */
        bool inserted; /* this transaction inserted its inbox row */
        bool dup_ok;   /* the handler said KINBOX_RESULT_DUPLICATE */
        kinbox_msg_t *next;
        kinbox__msgview_t v;  /* what the accessors read */
        int64_t ts;           /* Kafka timestamp (ms), -1 if none */
        /* A replayed dead letter (replay.c) has no rkm: its headers are
         * a list of its own, its other parts borrowed from the caller. */
        rd_kafka_headers_t *own_headers;
};

/* M_RUN: run the handler; M_DUP: the inbox has its id (redelivery);
 * M_DEAD: dead-letter it; M_CUT: not in this transaction (retried later);
 * M_BIZDUP: a business duplicate: inbox row only, the handler's effect
 * undone. */
enum mstate { M_RUN, M_DUP, M_DEAD, M_CUT, M_BIZDUP };

struct part {
        char *topic;
        int32_t partition;
        worker_t *w;
        /* guarded by w->lock */
        kinbox_msg_t *head, *tail;
        size_t count;
        int64_t retry_at; /* monotonic ms; 0 = not backing off */
        bool revoked;
        /* main thread only */
        bool paused;
        part_t *next; /* in the consumer's table */
};

struct worker {
        kinbox_consumer_t *c;
        int idx;
        pthread_t thr;
        bool started;
        pthread_mutex_t lock;
        pthread_cond_t cond;   /* work arrived / stop / revoke */
        pthread_cond_t idle;   /* a batch finished */
        size_t queued;         /* messages in all its partitions */
        bool in_batch;
        uint64_t batch_seq;
        bool stop;
        kinbox__db_t *db;
        size_t limit;          /* batch size cap */
        int iso_left;          /* batches left in isolation mode */
        bool iso_hit;          /* this batch had a failure */
        bool single[32];       /* batch handler: per-message calls, by group */
        size_t single_gsz;     /* the group size single[] was set for */
        kinbox_msg_t **msgs;   /* current batch */
        size_t nmsgs, capmsgs;
        kinbox__inbox_row_t *rows;
        bool *is_new;
        kinbox_result_t *results;
};

/* A kinbox_tx_exec_unique() statement's key, by tag. */
typedef struct ukey {
        int tag;
        char *key; /* NULL: any unique key */
} ukey_t;

struct kinbox_tx_s {
        kinbox_consumer_t *c;
        worker_t *w;
        kinbox__db_t *db;
        int tag;            /* statement tag of the running call (db.h) */
        bool failed;        /* a statement failed during the current call */
        bool touched;       /* the current call queued or ran statements */
        char reason[512];   /* kinbox_tx_set_error() */
        const char *consumer; /* when c is NULL (replay) */
        ukey_t *ukeys;      /* this transaction's exec_unique() keys */
        size_t nukeys, capukeys;
};

struct kinbox_consumer_s {
        kinbox_conf_t *conf;
        kinbox__log_t lg;
        char *name;
        char *msgid_spec;
        rd_kafka_t *rk;
        rd_kafka_topic_partition_list_t *topics;
        kinbox_handler_fn handler;
        kinbox_batch_handler_fn batch_handler;
        void *opaque;
        int nworkers;
        worker_t *workers;
        part_t *parts;
        kinbox__db_t *ctl; /* main thread's connection (watermarks) */
        size_t batch_max, queue_max;
        int64_t batch_wait, retry_max, backoff_base, backoff_max,
            reconnect_max;
        atomic_bool stopping;
        atomic_bool running;
        atomic_bool pause_dirty;
        /* Backpressure: while a worker's queue is full the polling thread
         * holds off (librdkafka's own bounded queue then stops fetching);
         * only a long stall pauses partitions, because a pause drops what
         * librdkafka prefetched and a resume fetches it again. */
        pthread_mutex_t drain_lock;
        pthread_cond_t drained;
        int64_t full_since; /* polling thread only */
        bool stalled;       /* polling thread only */
        /* Fetch nudge (polling thread only, see nudge_fetchers()). */
        rd_kafka_queue_t *cq;       /* librdkafka's consumer queue */
        size_t prefetch_msgs;       /* queued.min.messages */
        double prefetch_bytes;      /* queued.max.messages.kbytes * 1024 */
        double avg_bytes;           /* moving average of message size */
        bool prefetch_full;         /* the queue reached a threshold */
        int64_t last_nudge_check;
        pthread_t nudger;           /* sends the wake-up requests */
        bool nudger_started;
        pthread_mutex_t nudge_lock;
        pthread_cond_t nudge_cond;
        bool nudge_req, nudge_stop; /* under nudge_lock */
        atomic_uint_fast64_t st_processed, st_dup, st_bizdup, st_dead,
            st_retried, st_batches, st_rolled_back;
        char errstr[512];
};

/* ------------------------------------------------------------------ */
/* message accessors: one view for Kafka and replayed messages alike */

const char *
kinbox_msg_topic(const kinbox_msg_t *m)
{
        return m->v.topic;
}

int32_t
kinbox_msg_partition(const kinbox_msg_t *m)
{
        return m->v.partition;
}

int64_t
kinbox_msg_offset(const kinbox_msg_t *m)
{
        return m->v.offset;
}

int64_t
kinbox_msg_timestamp(const kinbox_msg_t *m)
{
        return m->ts;
}

const void *
kinbox_msg_key(const kinbox_msg_t *m, size_t *sizep)
{
        if (sizep)
                *sizep = m->v.key_len;
        return m->v.key;
}

const void *
kinbox_msg_payload(const kinbox_msg_t *m, size_t *sizep)
{
        if (sizep)
                *sizep = m->v.len;
        return m->v.payload;
}

const char *
kinbox_msg_id(const kinbox_msg_t *m)
{
        return m->id ? m->id : "";
}

int
kinbox_msg_attempt(const kinbox_msg_t *m)
{
        return m->attempt;
}

/* librdkafka's header getters take a non-const list. */
static rd_kafka_headers_t *
msg_headers(const kinbox_msg_t *m)
{
        return (rd_kafka_headers_t *)m->v.headers;
}

size_t
kinbox_msg_header_count(const kinbox_msg_t *m)
{
        return m->v.headers ? rd_kafka_header_cnt(msg_headers(m)) : 0;
}

kinbox_err_t
kinbox_msg_header_at(const kinbox_msg_t *m, size_t idx, kinbox_header_t *hdr)
{
        if (!m->v.headers ||
            rd_kafka_header_get_all(msg_headers(m), idx, &hdr->name,
                                    &hdr->value, &hdr->size))
                return KINBOX_ERR_NOT_FOUND;
        return KINBOX_OK;
}

kinbox_err_t
kinbox_msg_header(const kinbox_msg_t *m, const char *name,
                  const void **valuep, size_t *sizep)
{
        if (!m->v.headers ||
            rd_kafka_header_get_last(msg_headers(m), name, valuep, sizep))
                return KINBOX_ERR_NOT_FOUND;
        return KINBOX_OK;
}

static void
msg_free(kinbox_msg_t *m)
{
        if (!m)
                return;
        if (m->rkm)
                rd_kafka_message_destroy(m->rkm);
        if (m->own_headers)
                rd_kafka_headers_destroy(m->own_headers);
        free(m->id);
        free(m->reason);
        free(m);
}

static void
msg_set_reason(kinbox_msg_t *m, const char *r)
{
        char *n = kinbox__strdup(r && *r ? r : "no reason given");
        if (n) {
                free(m->reason);
                m->reason = n;
        }
}

/* ------------------------------------------------------------------ */
/* the transaction handed to handlers */

kinbox__db_t *
kinbox__tx_db(kinbox_tx_t *tx)
{
        return tx->db;
}

int
kinbox__tx_tag(const kinbox_tx_t *tx)
{
        return tx->tag;
}

kinbox_backend_t
kinbox_tx_backend(const kinbox_tx_t *tx)
{
        return tx->db->backend;
}

const char *
kinbox_tx_consumer(const kinbox_tx_t *tx)
{
        return tx->c ? tx->c->name : tx->consumer;
}

/* ------------------------------------------------------------------ */
/* stored messages and transactions outside a consumer (replay.c) */

kinbox_msg_t *
kinbox__msg_from_parts(const kinbox__msg_parts_t *parts)
{
        kinbox_msg_t *m = kinbox__calloc(1, sizeof(*m));
        if (!m)
                return NULL;
        m->v = (kinbox__msgview_t){parts->topic,   parts->partition,
                                   parts->offset,  parts->key,
                                   parts->key_len, parts->payload,
                                   parts->len,     NULL};
        m->ts = parts->timestamp;
        if (parts->nheaders) {
                m->own_headers = rd_kafka_headers_new(parts->nheaders);
                for (size_t i = 0; m->own_headers && i < parts->nheaders; i++)
                        rd_kafka_header_add(
                            m->own_headers, parts->headers[i].name, -1,
                            parts->headers[i].value,
                            parts->headers[i].value
                                ? (ssize_t)parts->headers[i].size
                                : 0);
                m->v.headers = m->own_headers;
        }
        m->id = kinbox__strdup(parts->id);
        m->attempt = 1;
        if (!m->id || (parts->nheaders && !m->own_headers)) {
                msg_free(m);
                return NULL;
        }
        return m;
}

void
kinbox__msg_destroy(kinbox_msg_t *m)
{
        msg_free(m);
}

const char *
kinbox__msg_reason(const kinbox_msg_t *m)
{
        return m->reason;
}

kinbox_tx_t *
kinbox__tx_new(kinbox__db_t *db, const char *consumer)
{
        kinbox_tx_t *tx = kinbox__calloc(1, sizeof(*tx));
        if (!tx)
                return NULL;
        tx->db = db;
        tx->consumer = consumer;
        return tx;
}

static void
tx_clear_ukeys(kinbox_tx_t *tx)
{
        for (size_t i = 0; i < tx->nukeys; i++)
                free(tx->ukeys[i].key);
        tx->nukeys = 0;
}

void
kinbox__tx_destroy(kinbox_tx_t *tx)
{
        if (!tx)
                return;
        tx_clear_ukeys(tx);
        free(tx->ukeys);
        free(tx);
}

void
kinbox__tx_reset(kinbox_tx_t *tx)
{
        tx->tag = 0;
        tx->failed = tx->touched = false;
        tx->reason[0] = '\0';
        tx_clear_ukeys(tx);
}

bool
kinbox__tx_failed(const kinbox_tx_t *tx)
{
        return tx->failed;
}

const char *
kinbox__tx_reason(const kinbox_tx_t *tx)
{
        return tx->reason;
}

/* Metrics: the consumer's counters as absolute values (they are
 * cumulative since kinbox_consumer_new()). */
static void
metrics_stats(kinbox_consumer_t *c)
{
        static const char *const res[] = {"processed", "duplicate",
                                          "business_duplicate", "dead",
                                          "retried"};
        uint64_t v[5] = {atomic_load(&c->st_processed),
                         atomic_load(&c->st_dup), atomic_load(&c->st_bizdup),
                         atomic_load(&c->st_dead),
                         atomic_load(&c->st_retried)};
        char l[300];
        for (int i = 0; i < 5; i++)
                kinbox__m_set("kinbox_consumer_messages_total",
                              kinbox__m_labels(l, sizeof(l), "consumer",
                                               c->name, "result", res[i],
                                               (char *)NULL),
                              (double)v[i]);
        kinbox__m_labels(l, sizeof(l), "consumer", c->name, (char *)NULL);
        kinbox__m_set("kinbox_consumer_batches_total", l,
                      (double)atomic_load(&c->st_batches));
        kinbox__m_set("kinbox_consumer_rollbacks_total", l,
                      (double)atomic_load(&c->st_rolled_back));
}

/* Metrics: partitions assigned now (after a rebalance callback). */
static void
metrics_assignment(kinbox_consumer_t *c, rd_kafka_t *rk)
{
        rd_kafka_topic_partition_list_t *l = NULL;
        char lb[300];
        if (rd_kafka_assignment(rk, &l) || !l)
                return;
        kinbox__m_set("kinbox_consumer_assigned_partitions",
                      kinbox__m_labels(lb, sizeof(lb), "consumer", c->name,
                                       (char *)NULL),
                      l->cnt);
        rd_kafka_topic_partition_list_destroy(l);
}

/* Text parameters as backend parameters; *heap is set when allocated. */
static kinbox__param_t *
tx_params(int n, const char *const *params, kinbox__param_t *stack, int cap,
          bool *heap)
{
        *heap = false;
        if (n < 0 || (n > 0 && !params))
                return NULL;
        kinbox__param_t *ps = stack;
        if (n > cap) {
                ps = kinbox__calloc((size_t)n, sizeof(*ps));
                if (!ps)
                        return NULL;
                *heap = true;
        }
        for (int i = 0; i < n; i++)
                ps[i] = (kinbox__param_t){params[i], 0, 0};
        return ps;
}

/* What the handler sees of a failure: a statement queued by another call
 * (an earlier message) voided the transaction; its own is its own. */
static kinbox_err_t
tx_outcome(kinbox_tx_t *tx, int rc)
{
        if (!rc)
                return KINBOX_OK;
        tx->failed = true;
        int t = tx->db->err.tag;
        if (t >= 0 && tx->tag >= 0 &&
            (t & ~KINBOX__TAG_UNIQUE) != (tx->tag & ~KINBOX__TAG_UNIQUE))
                return KINBOX_ERR_ABORTED;
        if (t == KINBOX__TAG_MERGED || (t < 0 && t != -1))
                return KINBOX_ERR_ABORTED;
        return (kinbox_err_t)rc;
}

static kinbox_err_t
tx_exec(kinbox_tx_t *tx, int tag, const char *what, const char *sql,
        int nparams, const char *const *params)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap;
        kinbox__param_t *ps =
            sql ? tx_params(nparams, params, stack, 32, &heap) : NULL;
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "%s: bad arguments (%d parameters)", what, nparams);
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        tx->touched = true;
        int rc = tx->db->ops->exec(tx->db, sql, nparams, ps, tag);
        if (heap)
                free(ps);
        return tx_outcome(tx, rc);
}

kinbox_err_t
kinbox_tx_exec(kinbox_tx_t *tx, const char *sql, int nparams,
               const char *const *params)
{
        return tx_exec(tx, tx->tag, "kinbox_tx_exec", sql, nparams, params);
}

kinbox_err_t
kinbox_tx_exec_unique(kinbox_tx_t *tx, const char *key, const char *sql,
                      int nparams, const char *const *params)
{
        if (tx->tag < 0) /* replay and kinbox's own: no batch to isolate */
                return tx_exec(tx, tx->tag, "kinbox_tx_exec_unique", sql,
                               nparams, params);
        int tag = tx->tag | KINBOX__TAG_UNIQUE;
        if (tx->nukeys == tx->capukeys) {
                size_t cap = tx->capukeys ? tx->capukeys * 2 : 16;
                ukey_t *u = realloc(tx->ukeys, cap * sizeof(*u));
                if (!u) {
                        tx->failed = true;
                        snprintf(tx->reason, sizeof(tx->reason),
                                 "kinbox_tx_exec_unique: out of memory");
                        return KINBOX_ERR_NOMEM;
                }
                tx->ukeys = u;
                tx->capukeys = cap;
        }
        char *k = NULL;
        if (key && !(k = kinbox__strdup(key))) {
                tx->failed = true;
                return KINBOX_ERR_NOMEM;
        }
        tx->ukeys[tx->nukeys++] = (ukey_t){tag, k};
        return tx_exec(tx, tag, "kinbox_tx_exec_unique", sql, nparams,
                       params);
}

kinbox_err_t
kinbox_tx_query(kinbox_tx_t *tx, const char *sql, int nparams,
                const char *const *params, kinbox_rows_t **rowsp)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap;
        if (rowsp)
                *rowsp = NULL;
        kinbox__param_t *ps =
            sql ? tx_params(nparams, params, stack, 32, &heap) : NULL;
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "kinbox_tx_query: bad arguments (%d parameters)",
                         nparams);
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        tx->touched = true;
        int rc = tx->db->ops->query(tx->db, sql, nparams, ps, tx->tag, rowsp);
        if (heap)
                free(ps);
        return tx_outcome(tx, rc);
}

struct pg_conn *
kinbox_tx_pgconn(kinbox_tx_t *tx)
{
        if (tx->db->backend != KINBOX_BACKEND_POSTGRESQL)
                return NULL;
        tx->touched = true;
        void *n = tx->db->ops->native(tx->db);
        if (!n)
                tx->failed = true;
        return n;
}

struct st_mysql *
kinbox_tx_mysql(kinbox_tx_t *tx)
{
        if (tx->db->backend != KINBOX_BACKEND_MYSQL)
                return NULL;
        tx->touched = true;
        void *n = tx->db->ops->native(tx->db);
        if (!n)
                tx->failed = true;
        return n;
}

void
kinbox_tx_set_error(kinbox_tx_t *tx, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tx->reason, sizeof(tx->reason), fmt, ap);
        va_end(ap);
}

void
kinbox_tx_set_msg_error(kinbox_tx_t *tx, const kinbox_msg_t *msg,
                        const char *fmt, ...)
{
        KINBOX__UNUSED(tx);
        char b[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b, sizeof(b), fmt, ap);
        va_end(ap);
        msg_set_reason((kinbox_msg_t *)msg, b);
}

const char *
kinbox_tx_errstr(const kinbox_tx_t *tx)
{
        return tx->db->err.code ? tx->db->err.msg : "";
}

/* ------------------------------------------------------------------ */
/* creation */

static void
db_log(void *ctx, int level, const char *fmt, ...)
{
        kinbox_consumer_t *c = ctx;
        va_list ap;
        va_start(ap, fmt);
        kinbox__vlog(&c->lg, level, "db", fmt, ap);
        va_end(ap);
}

static void
rk_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        kinbox_consumer_t *c = rd_kafka_opaque(rk);
        if (c)
                kinbox__log(&c->lg, level, "rdkafka", "%s: %s", fac, buf);
}

struct kafka_set_ctx {
        rd_kafka_conf_t *rkc;
        char *errstr;
        size_t errsz;
        bool failed;
};

static void
kafka_set(const char *k, const char *v, void *arg)
{
        struct kafka_set_ctx *x = arg;
        char e[256];
        if (x->failed)
                return;
        if (rd_kafka_conf_set(x->rkc, k, v, e, sizeof(e)) !=
            RD_KAFKA_CONF_OK) {
                kinbox__errstr(x->errstr, x->errsz, "kafka.%s: %s", k, e);
                x->failed = true;
        }
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque);

static kinbox_err_t
parse_topics(kinbox_consumer_t *c, const char *topics, char *errstr,
             size_t sz)
{
        c->topics = rd_kafka_topic_partition_list_new(4);
        const char *p = topics;
        while (p && *p) {
                size_t n = strcspn(p, ",");
                char t[256];
                size_t s = 0, e = n;
                while (s < e && (p[s] == ' ' || p[s] == '\t'))
                        s++;
                while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
                        e--;
                if (e > s) {
                        if (e - s >= sizeof(t)) {
                                kinbox__errstr(errstr, sz,
                                               "topics: name too long");
                                return KINBOX_ERR_CONFIG;
                        }
                        memcpy(t, p + s, e - s);
                        t[e - s] = '\0';
                        rd_kafka_topic_partition_list_add(
                            c->topics, t, RD_KAFKA_PARTITION_UA);
                }
                p += n + (p[n] ? 1 : 0);
        }
        if (!c->topics->cnt) {
                kinbox__errstr(errstr, sz, "topics: no topic configured");
                return KINBOX_ERR_CONFIG;
        }
        return KINBOX_OK;
}

kinbox_consumer_t *
kinbox_consumer_new(kinbox_conf_t *conf, char *errstr, size_t sz)
{
        if (!conf) {
                kinbox__errstr(errstr, sz, "kinbox_consumer_new: no conf");
                return NULL;
        }
        kinbox_consumer_t *c = kinbox__calloc(1, sizeof(*c));
        if (!c) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        pthread_mutex_init(&c->drain_lock, NULL);
        pthread_cond_init(&c->drained, NULL);
        pthread_mutex_init(&c->nudge_lock, NULL);
        pthread_cond_init(&c->nudge_cond, NULL);
        kinbox__conf_logger(conf, &c->lg);
        c->name = kinbox__strdup(kinbox_conf_get(conf, "name"));
        c->msgid_spec = kinbox__strdup(kinbox_conf_get(conf, "message_id"));
        c->nworkers = (int)kinbox__conf_int(conf, "workers");
        c->batch_max = (size_t)kinbox__conf_int(conf, "batch.max");
        c->batch_wait = kinbox__conf_int(conf, "batch.wait.ms");
        c->queue_max = (size_t)kinbox__conf_int(conf, "queue.max.messages");
        c->retry_max = kinbox__conf_int(conf, "retry.max");
        c->backoff_base = kinbox__conf_int(conf, "retry.backoff.base.ms");
        c->backoff_max = kinbox__conf_int(conf, "retry.backoff.max.ms");
        c->reconnect_max = kinbox__conf_int(conf, "reconnect.backoff.max.ms");
        if (c->queue_max < c->batch_max)
                c->queue_max = c->batch_max;
        rd_kafka_conf_t *rkc = NULL;
        if (!c->name || !c->msgid_spec)
                goto oom;
        const char *url = kinbox_conf_get(conf, "database.url");
        kinbox__dburl_t u;
        if (kinbox__dburl_parse(url, &u, errstr, sz))
                goto fail;
        kinbox__dburl_free(&u);
        if (parse_topics(c, kinbox_conf_get(conf, "topics"), errstr, sz))
                goto fail;
        if (!kinbox_conf_get(conf, "kafka.bootstrap.servers")) {
                kinbox__errstr(errstr, sz,
                               "kafka.bootstrap.servers is not set");
                goto fail;
        }
        rkc = rd_kafka_conf_new();
        char e[256];
        /* kinbox's defaults first; the user's kafka.* may override them,
         * except the two that the exactly-once effect depends on.
         * Prefetch: once the consumer queue holds queued.min.messages,
         * librdkafka 2.0 stops fetching until something wakes its broker
         * threads (nudge_fetchers() does, once a quarter has drained).
         * 50,000 messages (~600 B each in memory) keep RSS under 64 MiB
         * with any backlog (see docs/benchmarks.md). */
        if (rd_kafka_conf_set(rkc, "auto.offset.reset", "earliest", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "queued.max.messages.kbytes", "16384", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "queued.min.messages", "50000", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "group.id",
                              kinbox_conf_get(conf, "group.id"), e, sizeof(e)))
                goto kafka_fail;
        struct kafka_set_ctx ks = {rkc, errstr, sz, false};
        kinbox__conf_kafka_each(conf, kafka_set, &ks);
        if (ks.failed)
                goto fail;
        if (rd_kafka_conf_set(rkc, "enable.auto.offset.store", "false", e,
                              sizeof(e)) ||
            rd_kafka_conf_set(rkc, "enable.partition.eof", "false", e,
                              sizeof(e)))
                goto kafka_fail;
        rd_kafka_conf_set_opaque(rkc, c);
        rd_kafka_conf_set_log_cb(rkc, rk_log);
        rd_kafka_conf_set_rebalance_cb(rkc, rebalance_cb);
        c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, rkc, e, sizeof(e));
        if (!c->rk)
                goto kafka_fail;
        rkc = NULL; /* owned by rk now */
        rd_kafka_poll_set_consumer(c->rk);
        c->cq = rd_kafka_queue_get_consumer(c->rk);
        {
                const rd_kafka_conf_t *rc = rd_kafka_conf(c->rk);
                char v[64];
                size_t vl = sizeof(v);
                if (rd_kafka_conf_get(rc, "queued.min.messages", v, &vl) ==
                    RD_KAFKA_CONF_OK)
                        c->prefetch_msgs = (size_t)strtoull(v, NULL, 10);
                vl = sizeof(v);
                if (rd_kafka_conf_get(rc, "queued.max.messages.kbytes", v,
                                      &vl) == RD_KAFKA_CONF_OK)
                        c->prefetch_bytes = 1024.0 * strtod(v, NULL);
        }
        c->conf = conf;
        return c;
kafka_fail:
        kinbox__errstr(errstr, sz, "Kafka configuration: %s", e);
        goto fail;
oom:
        kinbox__errstr(errstr, sz, "out of memory");
fail:
        if (rkc)
                rd_kafka_conf_destroy(rkc);
        c->conf = NULL; /* the caller keeps it on failure */
        kinbox_consumer_destroy(c);
        return NULL;
}

kinbox_err_t
kinbox_consumer_set_handler(kinbox_consumer_t *c, kinbox_handler_fn fn,
                            void *opaque)
{
        if (atomic_load(&c->running))
                return KINBOX_ERR_STATE;
        c->handler = fn;
        c->batch_handler = NULL;
        c->opaque = opaque;
        return KINBOX_OK;
}

kinbox_err_t
kinbox_consumer_set_batch_handler(kinbox_consumer_t *c,
                                  kinbox_batch_handler_fn fn, void *opaque)
{
        if (atomic_load(&c->running))
                return KINBOX_ERR_STATE;
        c->batch_handler = fn;
        c->handler = NULL;
        c->opaque = opaque;
        return KINBOX_OK;
}

void
kinbox_consumer_stop(kinbox_consumer_t *c)
{
        if (c)
                atomic_store(&c->stopping, true);
}

void
kinbox_consumer_stats(const kinbox_consumer_t *c, kinbox_consumer_stats_t *o)
{
        o->processed = atomic_load(&c->st_processed);
        o->duplicates = atomic_load(&c->st_dup);
        o->business_duplicates = atomic_load(&c->st_bizdup);
        o->dead = atomic_load(&c->st_dead);
        o->retried = atomic_load(&c->st_retried);
        o->batches = atomic_load(&c->st_batches);
        o->rolled_back = atomic_load(&c->st_rolled_back);
}

const char *
kinbox_consumer_name(const kinbox_consumer_t *c)
{
        return c->name;
}

const char *
kinbox_consumer_errstr(const kinbox_consumer_t *c)
{
        return c->errstr;
}

static void
part_free(part_t *p)
{
        kinbox_msg_t *m = p->head;
        while (m) {
                kinbox_msg_t *n = m->next;
                msg_free(m);
                m = n;
        }
        free(p->topic);
        free(p);
}

void
kinbox_consumer_destroy(kinbox_consumer_t *c)
{
        if (!c)
                return;
        while (c->parts) {
                part_t *n = c->parts->next;
                part_free(c->parts);
                c->parts = n;
        }
        if (c->cq)
                rd_kafka_queue_destroy(c->cq);
        if (c->rk)
                rd_kafka_destroy(c->rk);
        if (c->topics)
                rd_kafka_topic_partition_list_destroy(c->topics);
        kinbox__db_destroy(c->ctl);
        pthread_mutex_destroy(&c->drain_lock);
        pthread_cond_destroy(&c->drained);
        pthread_mutex_destroy(&c->nudge_lock);
        pthread_cond_destroy(&c->nudge_cond);
        free(c->name);
        free(c->msgid_spec);
        kinbox_conf_destroy(c->conf);
        free(c);
}

/* ------------------------------------------------------------------ */
/* database connections */

static kinbox__db_t *
db_open(kinbox_consumer_t *c, char *errstr, size_t sz)
{
        char *pw = NULL;
        if (kinbox__conf_password(c->conf, &pw, errstr, sz))
                return NULL;
        kinbox__db_t *db = kinbox__db_new(
            kinbox_conf_get(c->conf, "database.url"), pw, errstr, sz);
        free(pw);
        if (db) {
                db->log = db_log;
                db->log_ctx = c;
                db->coalesce = kinbox__conf_int(c->conf, "mysql.coalesce");
        }
        return db;
}

/* ------------------------------------------------------------------ */
/* the batch */

static bool
part_backing_off(const part_t *p, int64_t now)
{
        return p->retry_at && p->retry_at > now;
}

/* Offsets for the committed prefix of each partition in the batch. */
static void
store_offsets(kinbox_consumer_t *c, worker_t *w)
{
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(4);
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_CUT)
                        continue;
                rd_kafka_topic_partition_t *tp =
                    rd_kafka_topic_partition_list_find(l, m->part->topic,
                                                       m->part->partition);
                if (!tp)
                        tp = rd_kafka_topic_partition_list_add(
                            l, m->part->topic, m->part->partition);
                if (m->rkm->offset + 1 > tp->offset)
                        tp->offset = m->rkm->offset + 1;
        }
        for (int i = 0; i < l->cnt; i++) {
                /* Lag from the cached high watermark (no broker call). */
                int64_t lo = 0, hi = 0;
                char lb[400], pn[16];
                snprintf(pn, sizeof(pn), "%" PRId32, l->elems[i].partition);
                if (!rd_kafka_get_watermark_offsets(
                        c->rk, l->elems[i].topic, l->elems[i].partition, &lo,
                        &hi) &&
                    hi >= 0)
                        kinbox__m_set(
                            "kinbox_consumer_lag",
                            kinbox__m_labels(lb, sizeof(lb), "consumer",
                                             c->name, "topic",
                                             l->elems[i].topic, "partition",
                                             pn, (char *)NULL),
                            (double)(hi > l->elems[i].offset
                                         ? hi - l->elems[i].offset
                                         : 0));
        }
        if (l->cnt) {
                rd_kafka_resp_err_t e = rd_kafka_offsets_store(c->rk, l);
                if (e)
                        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                                    "offset store: %s (partition no longer "
                                    "assigned; the DB watermark covers it)",
                                    rd_kafka_err2str(e));
        }
        rd_kafka_topic_partition_list_destroy(l);
}

static int
queue_dead_letter(kinbox_consumer_t *c, worker_t *w, kinbox_msg_t *m)
{
        char part[16], off[24], att[16];
        snprintf(part, sizeof(part), "%" PRId32, m->rkm->partition);
        snprintf(off, sizeof(off), "%" PRId64, m->rkm->offset);
        /* Failed attempts: 0 when the handler never ran (no id). */
        snprintf(att, sizeof(att), "%d", m->failures);
        kinbox__buf_t h;
        kinbox__buf_init(&h);
        kinbox__headers_json(m, &h);
        if (h.oom) {
                kinbox__buf_free(&h);
                return KINBOX_ERR_NOMEM;
        }
        kinbox__param_t p[10] = {
            {c->name, 0, 0},
            {m->id, 0, 0},
            {m->part->topic, 0, 0},
            {part, 0, 0},
            {off, 0, 0},
            {m->rkm->key, m->rkm->key_len, 1},
            {h.p, 0, 0},
            {m->rkm->payload, m->rkm->len, 1},
            {m->reason ? m->reason : "no reason given", 0, 0},
            {att, 0, 0},
        };
        int rc = w->db->ops->exec(w->db, w->db->ops->sql->dead_letter_insert,
                                  10, p, -1);
        kinbox__buf_free(&h);
        return rc;
}

static int
queue_watermarks(kinbox_consumer_t *c, worker_t *w)
{
        /* Walk backwards: the first message seen of a partition is its last
         * committed one. A batch spans few partitions; a short list does. */
        part_t *seen[64];
        size_t nseen = 0;
        for (size_t i = w->nmsgs; i-- > 0;) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_CUT)
                        continue;
                bool dup = false;
                for (size_t k = 0; k < nseen && !dup; k++)
                        dup = seen[k] == m->part;
                if (dup)
                        continue;
                if (nseen < KINBOX__ARRAY_SIZE(seen)) {
                        seen[nseen++] = m->part;
                } else {
                        /* Very many partitions: fall back to a scan. */
                        bool later = false;
                        for (size_t j = i + 1; j < w->nmsgs && !later; j++)
                                later = w->msgs[j]->part == m->part &&
                                        w->msgs[j]->state != M_CUT;
                        if (later)
                                continue;
                }
                char part[16], off[24];
                snprintf(part, sizeof(part), "%" PRId32, m->rkm->partition);
                snprintf(off, sizeof(off), "%" PRId64, m->rkm->offset + 1);
                kinbox__param_t p[4] = {{c->name, 0, 0},
                                        {m->part->topic, 0, 0},
                                        {part, 0, 0},
                                        {off, 0, 0}};
                int rc = w->db->ops->exec(
                    w->db, w->db->ops->sql->offsets_upsert, 4, p, -1);
                if (rc)
                        return rc;
        }
        return KINBOX_OK;
}

/*
 * What a failure means for the one message it is charged to:
 *  F_RETRY  may succeed later (a foreign-key violation, an unknown error,
 *           a handler's RETRY): back off, then again; dead after retry.max;
 *  F_DEAD   can never succeed (REJECT, an unmarked unique violation, a
 *           CHECK / NOT NULL violation, a data exception): dead-lettered;
 *  F_BIZDUP the event was already applied (KINBOX_RESULT_DUPLICATE, or a
 *           kinbox_tx_exec_unique() statement's unique violation).
 */
enum fate { F_RETRY, F_DEAD, F_BIZDUP };

/* A unique violation on the statement of tag t means "already applied"
 * when t is a kinbox_tx_exec_unique() statement whose key matches. */
static bool
ukey_matches(const kinbox_tx_t *tx, int t, const char *constraint)
{
        if (t < 0 || !(t & KINBOX__TAG_UNIQUE))
                return false;
        for (size_t i = tx->nukeys; i-- > 0;)
                if (tx->ukeys[i].tag == t &&
                    (!tx->ukeys[i].key || !*constraint ||
                     !strcmp(tx->ukeys[i].key, constraint)))
                        return true;
        return false;
}

/* The fate of a statement failure (db->err) for the message it names. */
static enum fate
statement_fate(const kinbox_tx_t *tx, const kinbox__dberr_t *e)
{
        if (e->code == KINBOX_ERR_DUPLICATE)
                return ukey_matches(tx, e->tag, e->constraint) ? F_BIZDUP
                                                               : F_DEAD;
        return e->permanent ? F_DEAD : F_RETRY;
}

/* Message i failed (its own statement or result): decide its fate and cut
 * the rest of its partition when it is to be retried. */
static void
fail_msg(kinbox_consumer_t *c, worker_t *w, size_t i, enum fate f,
         const char *reason)
{
        kinbox_msg_t *m = w->msgs[i];
        msg_set_reason(m, reason);
        if (f == F_BIZDUP) {
                m->state = M_BIZDUP;
                return;
        }
        if (f == F_DEAD) {
                m->failures++;
                m->state = M_DEAD;
                return;
        }
        atomic_fetch_add(&c->st_retried, 1);
        if (++m->failures >= c->retry_max) {
                char b[600];
                snprintf(b, sizeof(b), "gave up after %d attempts: %s",
                         m->failures, m->reason ? m->reason : "");
                msg_set_reason(m, b);
                m->state = M_DEAD;
                return;
        }
        for (size_t j = i; j < w->nmsgs; j++)
                if (w->msgs[j]->part == m->part)
                        w->msgs[j]->state = M_CUT;
        int64_t delay = kinbox__backoff_ms(m->failures - 1, c->backoff_base,
                                           c->backoff_max);
        pthread_mutex_lock(&w->lock);
        m->part->retry_at = kinbox__now_ms() + delay;
        pthread_mutex_unlock(&w->lock);
        atomic_store(&c->pause_dirty, true);
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s [%" PRId32 "] offset %" PRId64
                    ": attempt %d failed, retry in %" PRId64 " ms: %s",
                    m->part->topic, m->rkm->partition, m->rkm->offset,
                    m->failures, delay, m->reason);
}

enum run_rc { RUN_DONE, RUN_AGAIN, RUN_DB_DOWN, RUN_BACKOFF };

/*
 * A batch runs in one transaction. On a clean stream it is one group.
 * Once a message of a batch failed, the worker runs its next batches in
 * *isolation mode*: the batch is cut into at most ISO_GROUPS groups, each
 * behind a savepoint, so a failure rolls back to its group's savepoint and
 * runs that group's handlers again without the failed message, instead of
 * the whole batch in a new transaction. ISO_GROUPS stays well below
 * PostgreSQL's 64 cached subtransactions per backend. Isolation mode
 * lasts ISO_BATCHES batches after the last failure.
 */
#define ISO_GROUPS 32
#define ISO_MIN_GROUP 4
#define ISO_BATCHES 16

/* One walk over the batch's groups, inside the open transaction. */
typedef struct walk {
        size_t gsz, ngroups;
        bool iso;
        size_t g;          /* the group running now */
        bool sp_done;      /* group g's savepoint is already defined */
        bool *single;      /* batch handler: call per message (groups) */
        bool no_merge;     /* MySQL: group g runs without merged INSERTs */
} walk_t;

/* Where a failure is charged. */
typedef enum { FL_MSG, FL_GROUP, FL_MERGED, FL_BATCH } fkind_t;

typedef struct failure {
        fkind_t kind;
        size_t idx;   /* FL_MSG: message; FL_GROUP/FL_MERGED: group */
        enum fate fate;
        bool by_result; /* the handler's own result, no statement failed */
} failure_t;

/* Charge db->err to a message, a group or the whole batch. */
static failure_t
failure_of(const worker_t *w, const walk_t *wk, const kinbox__dberr_t *e,
           const kinbox_tx_t *tx)
{
        failure_t f = {FL_BATCH, 0, F_RETRY, false};
        int t = e->tag;
        if (e->code != KINBOX_ERR_DB && e->code != KINBOX_ERR_DUPLICATE)
                return f; /* lost connection, deadlock, out of memory */
        if (t < 0)
                return f; /* kinbox's own statement, or an unknown merge */
        size_t low = (size_t)KINBOX__TAG_LOW(t);
        if (t & KINBOX__TAG_MERGED_BIT) {
                if (low < w->nmsgs)
                        f = (failure_t){FL_MERGED, low / wk->gsz, F_RETRY,
                                        false};
        } else if (t & KINBOX__TAG_GROUP) {
                if (low < wk->ngroups)
                        f = (failure_t){FL_GROUP, low, statement_fate(tx, e),
                                        false};
        } else if (low < w->nmsgs && w->msgs[low]->state == M_RUN) {
                f = (failure_t){FL_MSG, low, statement_fate(tx, e), false};
        }
        return f;
}

static int
queue_dead_letter(kinbox_consumer_t *c, worker_t *w, kinbox_msg_t *m);

static void
savepoint_name(char *b, size_t sz, size_t g)
{
        snprintf(b, sz, "kinbox_g%zu", g);
}

/* Run per-message handler i. Returns false when the walk must stop: *f
 * then says why (a statement failed, or the handler's own verdict needs
 * its statements undone). */
static bool
run_handler(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx,
            const walk_t *wk, size_t i, const char *mlab, failure_t *f)
{
        kinbox__db_t *db = w->db;
        kinbox_msg_t *m = w->msgs[i];
        tx->tag = (int)i;
        tx->failed = tx->touched = false;
        tx->reason[0] = '\0';
        /* An error seen during the call is one the call's own database
         * calls ran into (maybe another message's deferred statement). */
        db->err = (kinbox__dberr_t){.tag = -1};
        m->attempt = m->failures + 1;
        m->dup_ok = false;
        int64_t t_h = kinbox__now_ms();
        kinbox_result_t r = c->handler(tx, m, c->opaque);
        kinbox__m_observe("kinbox_handler_seconds", mlab,
                          (double)(kinbox__now_ms() - t_h) / 1000.0);
        if (tx->failed && db->err.code) {
                /* A statement failed: whose? Its result decides nothing. */
                *f = failure_of(w, wk, &db->err, tx);
                return false;
        }
        if (r == KINBOX_RESULT_OK)
                return true;
        if (r == KINBOX_RESULT_DUPLICATE) {
                m->dup_ok = true;
                return true;
        }
        const char *why = tx->reason[0] ? tx->reason : "no reason given";
        enum fate fate = r == KINBOX_RESULT_REJECT ? F_DEAD : F_RETRY;
        if (!tx->touched) {
                /* Nothing to undo: decide now and go on. */
                fail_msg(c, w, i, fate, why);
                if (m->state == M_DEAD && queue_dead_letter(c, w, m)) {
                        *f = failure_of(w, wk, &db->err, tx);
                        return false;
                }
                return true;
        }
        msg_set_reason(m, why);
        *f = (failure_t){FL_MSG, i, fate, true};
        return false;
}

/* A batch handler's verdicts for run[0..n) (indexes idx[]). Returns false
 * with *f when statements must be undone. */
static bool
batch_results(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx,
              const walk_t *wk, kinbox_msg_t **run, const size_t *idx,
              size_t n, failure_t *f)
{
        bool undo = false;
        for (size_t j = 0; j < n; j++) {
                kinbox_result_t r = w->results[j];
                if (r == KINBOX_RESULT_OK)
                        continue;
                if (r == KINBOX_RESULT_DUPLICATE) {
                        run[j]->dup_ok = true;
                        continue;
                }
                fail_msg(c, w, idx[j],
                         r == KINBOX_RESULT_REJECT ? F_DEAD : F_RETRY,
                         run[j]->reason ? run[j]->reason : tx->reason);
                if (!tx->touched && w->msgs[idx[j]]->state == M_DEAD &&
                    queue_dead_letter(c, w, w->msgs[idx[j]])) {
                        *f = failure_of(w, wk, &w->db->err, tx);
                        return false;
                }
                undo = undo || tx->touched;
        }
        if (undo) /* fates decided: only the statements are to go */
                *f = (failure_t){FL_GROUP, wk->g, F_RETRY, true};
        return !undo;
}

/* The batch handler on group g's runnable messages: one call, or one per
 * message once a set-based statement of the group failed. */
static bool
run_batch_group(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx,
                const walk_t *wk, size_t lo, size_t hi, const char *mlab,
                failure_t *f)
{
        kinbox__db_t *db = w->db;
        kinbox_msg_t *run[hi - lo + 1];
        size_t idx[hi - lo + 1], n = 0;
        for (size_t i = lo; i < hi; i++)
                if (w->msgs[i]->state == M_RUN) {
                        run[n] = w->msgs[i];
                        idx[n++] = i;
                }
        bool single = wk->single[wk->g];
        for (size_t j0 = 0; j0 < n; j0 += single ? 1 : n) {
                size_t cnt = single ? 1 : n;
                for (size_t j = j0; j < j0 + cnt; j++) {
                        w->results[j - j0] = KINBOX_RESULT_OK;
                        run[j]->attempt = run[j]->failures + 1;
                        run[j]->dup_ok = false;
                }
                tx->tag = single ? (int)idx[j0]
                                 : (int)(KINBOX__TAG_GROUP | wk->g);
                tx->failed = tx->touched = false;
                tx->reason[0] = '\0';
                db->err = (kinbox__dberr_t){.tag = -1};
                int64_t t_h = kinbox__now_ms();
                kinbox_result_t r = c->batch_handler(
                    tx, (const kinbox_msg_t *const *)run + j0, cnt,
                    w->results, c->opaque);
                kinbox__m_observe("kinbox_handler_seconds", mlab,
                                  (double)(kinbox__now_ms() - t_h) / 1000.0);
                if (tx->failed && db->err.code) {
                        *f = failure_of(w, wk, &db->err, tx);
                        return false;
                }
                if (r != KINBOX_RESULT_OK) {
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "batch handler asked to retry the "
                                    "batch: %s",
                                    tx->reason);
                        *f = (failure_t){FL_BATCH, 0, F_RETRY, true};
                        return false;
                }
                if (!batch_results(c, w, tx, wk, run + j0, idx + j0, cnt, f))
                        return false;
        }
        return true;
}

/* Group wk->g: dead letters of its decided messages, then its handlers.
 * Returns false with *f when the walk must stop. */
static bool
run_group(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx,
          const walk_t *wk, const char *mlab, failure_t *f)
{
        size_t lo = wk->g * wk->gsz;
        size_t hi = lo + wk->gsz < w->nmsgs ? lo + wk->gsz : w->nmsgs;
        for (size_t i = lo; i < hi; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_DEAD) {
                        if (queue_dead_letter(c, w, m)) {
                                *f = failure_of(w, wk, &w->db->err, tx);
                                return false;
                        }
                        continue;
                }
                if (m->state == M_RUN && c->handler &&
                    !run_handler(c, w, tx, wk, i, mlab, f))
                        return false;
        }
        if (c->batch_handler && !c->handler)
                return run_batch_group(c, w, tx, wk, lo, hi, mlab, f);
        return true;
}

/*
 * Charge failure f and make the transaction usable again: in isolation
 * mode roll back to the failing group's savepoint and go on from there;
 * otherwise roll everything back and run the batch again, isolated.
 * Returns RUN_AGAIN when the walk resumes at wk->g, or how run_once ends.
 */
static enum run_rc
recover(kinbox_consumer_t *c, worker_t *w, walk_t *wk, failure_t *f)
{
        kinbox__db_t *db = w->db;
        if (f->kind == FL_BATCH) {
                db->ops->rollback(db);
                atomic_fetch_add(&c->st_rolled_back, 1);
                if (f->by_result)
                        return RUN_BACKOFF;
                if (db->err.code == KINBOX_ERR_DB_CONN ||
                    db->err.code == KINBOX_ERR_COMMIT_UNKNOWN) {
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "worker %d: %s; offsets not advanced, "
                                    "reconnecting",
                                    w->idx, db->err.msg);
                        return RUN_DB_DOWN;
                }
                atomic_fetch_add(&c->st_retried, 1);
                kinbox__log(&c->lg,
                            db->err.code == KINBOX_ERR_TRANSIENT
                                ? KINBOX_LOG_INFO
                                : KINBOX_LOG_ERR,
                            "consumer", "worker %d: batch rolled back: %s",
                            w->idx, db->err.msg);
                return RUN_BACKOFF;
        }
        size_t g = f->kind == FL_MSG ? f->idx / wk->gsz : f->idx;
        if (f->kind == FL_MSG)
                fail_msg(c, w, f->idx, f->fate,
                         f->by_result ? w->msgs[f->idx]->reason
                                      : db->err.msg);
        else if (f->kind == FL_GROUP && !f->by_result)
                wk->single[g] = true; /* narrow it down to the message */
        else if (f->kind == FL_MERGED)
                wk->no_merge = true; /* the rows one by one pin it */
        atomic_fetch_add(&c->st_rolled_back, 1);
        bool was_iso = wk->iso;
        w->iso_left = ISO_BATCHES;
        w->iso_hit = true;
        if (!was_iso) {
                db->ops->rollback(db);
                return RUN_AGAIN;
        }
        char sp[32];
        savepoint_name(sp, sizeof(sp), g);
        if (db->ops->rollback_to(db, sp)) {
                failure_t b = {FL_BATCH, 0, F_RETRY, false};
                return recover(c, w, wk, &b);
        }
        wk->g = g;
        wk->sp_done = true;
        return RUN_AGAIN;
}

/* Statements after the walk: the inbox rows of messages cut from this
 * transaction go (they run again later), then the watermarks. */
static int
queue_epilogue(kinbox_consumer_t *c, worker_t *w)
{
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state != M_CUT || !m->inserted)
                        continue;
                kinbox__param_t p[2] = {{c->name, 0, 0}, {m->id, 0, 0}};
                int rc = w->db->ops->exec(
                    w->db,
                    "DELETE FROM kinbox_inbox WHERE consumer = $1 AND "
                    "message_id = $2",
                    2, p, -1);
                if (rc)
                        return rc;
        }
        return queue_watermarks(c, w);
}

/* Counters and logs for a committed batch. */
static void
batch_committed(kinbox_consumer_t *c, worker_t *w, const char *mlab,
                int64_t t_begin)
{
        size_t done = 0, dups = 0, biz = 0, dead = 0;
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                switch (m->state) {
                case M_RUN:
                        if (m->dup_ok)
                                biz++;
                        else
                                done++;
                        break;
                case M_DUP:
                        dups++;
                        break;
                case M_BIZDUP:
                        biz++;
                        break;
                case M_DEAD:
                        dead++;
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "%s [%" PRId32 "] offset %" PRId64
                                    " dead-lettered: %s",
                                    m->part->topic, m->rkm->partition,
                                    m->rkm->offset, m->reason);
                        break;
                default:
                        break;
                }
        }
        atomic_fetch_add(&c->st_processed, done);
        atomic_fetch_add(&c->st_dup, dups);
        atomic_fetch_add(&c->st_bizdup, biz);
        atomic_fetch_add(&c->st_dead, dead);
        atomic_fetch_add(&c->st_batches, 1);
        kinbox__m_observe("kinbox_consumer_batch_size", mlab,
                          (double)(done + dups + biz + dead));
        kinbox__m_observe("kinbox_consumer_transaction_seconds", mlab,
                          (double)(kinbox__now_ms() - t_begin) / 1000.0);
}

/* BEGIN and the inbox insert: which messages of the batch are new. */
static int
begin_batch(kinbox_consumer_t *c, worker_t *w)
{
        kinbox__db_t *db = w->db;
        size_t n = 0;
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                m->inserted = false;
                if (m->state == M_CUT || !m->id)
                        continue;
                w->rows[n++] = (kinbox__inbox_row_t){
                    m->id, m->part->topic, m->rkm->partition, m->rkm->offset};
        }
        int rc = db->ops->begin(db);
        if (!rc && n)
                rc = db->ops->inbox_insert(db, c->name, n, w->rows, w->is_new);
        if (rc)
                return rc;
        size_t k = 0;
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_CUT || !m->id)
                        continue;
                m->inserted = w->is_new[k++];
                if (!m->inserted && m->state == M_RUN)
                        m->state = M_DUP;
                else if (m->inserted && m->state == M_DUP)
                        m->state = M_RUN; /* its twin was cut this time */
        }
        return KINBOX_OK;
}

/* Walk every group from wk->g on; RUN_AGAIN means "committed nothing yet,
 * the walk may go on" only inside; returns RUN_DONE when all ran. */
static enum run_rc
walk_groups(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx, walk_t *wk,
            const char *mlab)
{
        kinbox__db_t *db = w->db;
        bool coalesce = db->coalesce;
        failure_t f;
        enum run_rc rc = RUN_DONE;
        while (wk->g < wk->ngroups) {
                if (wk->iso && !wk->sp_done) {
                        char sp[32];
                        savepoint_name(sp, sizeof(sp), wk->g);
                        if (db->ops->savepoint(db, sp)) {
                                f = failure_of(w, wk, &db->err, tx);
                                goto failed;
                        }
                }
                wk->sp_done = false;
                db->coalesce = coalesce && !wk->no_merge;
                bool ok = run_group(c, w, tx, wk, mlab, &f);
                db->coalesce = coalesce;
                wk->no_merge = false;
                if (ok) {
                        wk->g++;
                        if (wk->g == wk->ngroups && wk->iso &&
                            db->ops->flush(db)) {
                                /* Surface errors while a savepoint can
                                 * still undo them. */
                                f = failure_of(w, wk, &db->err, tx);
                                goto failed;
                        }
                        continue;
                }
        failed:
                rc = recover(c, w, wk, &f);
                if (rc != RUN_AGAIN || !wk->iso)
                        return rc;
        }
        return RUN_DONE;
}

/* One attempt at the batch in one transaction. */
static enum run_rc
run_once(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx)
{
        kinbox__db_t *db = w->db;
        bool any = false;
        for (size_t i = 0; i < w->nmsgs; i++)
                if (w->msgs[i]->state != M_CUT)
                        any = true;
        if (!any)
                return RUN_DONE;
        char mlab[300];
        kinbox__m_labels(mlab, sizeof(mlab), "consumer", c->name,
                         (char *)NULL);
        int64_t t_begin = kinbox__now_ms();
        int64_t t_begin_us = kinbox__now_us();
        walk_t wk = {0};
        wk.iso = w->iso_left > 0;
        wk.gsz = w->nmsgs;
        if (wk.iso) {
                wk.gsz = (w->nmsgs + ISO_GROUPS - 1) / ISO_GROUPS;
                if (wk.gsz < ISO_MIN_GROUP)
                        wk.gsz = ISO_MIN_GROUP;
        }
        wk.ngroups = (w->nmsgs + wk.gsz - 1) / wk.gsz;
        if (wk.gsz != w->single_gsz) {
                memset(w->single, 0, ISO_GROUPS * sizeof(*w->single));
                w->single_gsz = wk.gsz;
        }
        wk.single = w->single;
        tx_clear_ukeys(tx);
        failure_t f;
        if (begin_batch(c, w)) {
                f = failure_of(w, &wk, &db->err, tx);
                return recover(c, w, &wk, &f);
        }
        int64_t t_inbox = kinbox__now_us();
        enum run_rc rc = walk_groups(c, w, tx, &wk, mlab);
        if (rc != RUN_DONE)
                return rc;
        int64_t t_handlers = kinbox__now_us();
        if (queue_epilogue(c, w)) {
                f = failure_of(w, &wk, &db->err, tx);
                return recover(c, w, &wk, &f);
        }
        if (kinbox__fault("before_commit")) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "fault",
                            "before_commit: SIGKILL");
                raise(SIGKILL);
        }
        if (db->ops->commit(db)) {
                f = failure_of(w, &wk, &db->err, tx);
                wk.iso = false; /* the transaction is gone: run it again */
                return recover(c, w, &wk, &f);
        }
        int64_t t_commit = kinbox__now_us();
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "worker %d: batch of %zu: inbox %lld us, handlers %lld "
                    "us, commit %lld us",
                    w->idx, w->nmsgs, (long long)(t_inbox - t_begin_us),
                    (long long)(t_handlers - t_inbox),
                    (long long)(t_commit - t_handlers));
        if (kinbox__fault("after_commit")) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "fault",
                            "after_commit: SIGKILL before the offset store");
                raise(SIGKILL);
        }
        store_offsets(c, w);
        batch_committed(c, w, mlab, t_begin);
        return RUN_DONE;
}

/* True when a partition of the batch was revoked or we are stopping hard. */
static bool
batch_abandoned(kinbox_consumer_t *c, worker_t *w)
{
        bool gone = false;
        pthread_mutex_lock(&w->lock);
        for (size_t i = 0; i < w->nmsgs && !gone; i++)
                if (w->msgs[i]->part->revoked)
                        gone = true;
        if (w->stop)
                gone = true;
        pthread_mutex_unlock(&w->lock);
        KINBOX__UNUSED(c);
        return gone;
}

/* Under w->lock: wait up to ms for w->cond. */
static void
timed_wait(worker_t *w, int64_t ms)
{
        struct timespec ts;
        kinbox__deadline(ms, &ts);
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
}

/* Wait up to ms, waking early on stop/revoke. */
static void
worker_nap(worker_t *w, int64_t ms)
{
        pthread_mutex_lock(&w->lock);
        if (!w->stop)
                timed_wait(w, ms);
        pthread_mutex_unlock(&w->lock);
}

static void
process_batch(kinbox_consumer_t *c, worker_t *w)
{
        kinbox_tx_t tx = {.c = c, .w = w, .db = w->db, .tag = -1};
        int down = 0, backoff = 0;
        for (size_t i = 0; i < w->nmsgs; i++)
                w->msgs[i]->state = w->msgs[i]->id ? M_RUN : M_DEAD;
        w->iso_hit = false;
        w->single_gsz = 0;
        for (;;) {
                if (!w->db->native) {
                        if (batch_abandoned(c, w))
                                goto abandon;
                        if (kinbox__db_connect(w->db)) {
                                if (down++ == 0 || down % 20 == 0)
                                        kinbox__log(&c->lg, KINBOX_LOG_WARNING,
                                                    "consumer",
                                                    "worker %d: %s", w->idx,
                                                    w->db->err.msg);
                                worker_nap(w, kinbox__backoff_ms(
                                                  down, 50, c->reconnect_max));
                                continue;
                        }
                        if (down)
                                kinbox__log(&c->lg, KINBOX_LOG_NOTICE,
                                            "consumer",
                                            "worker %d: database reconnected",
                                            w->idx);
                        down = 0;
                }
                enum run_rc r = run_once(c, w, &tx);
                metrics_stats(c);
                if (r == RUN_DONE) {
                        if (!w->iso_hit && w->iso_left > 0)
                                w->iso_left--;
                        break;
                }
                if (r == RUN_DB_DOWN) {
                        /* Everything not cut runs again: the inbox decides
                         * whether a commit of unknown outcome happened. */
                        for (size_t i = 0; i < w->nmsgs; i++)
                                if (w->msgs[i]->state == M_DUP)
                                        w->msgs[i]->state = M_RUN;
                        continue;
                }
                if (r == RUN_BACKOFF) {
                        if (batch_abandoned(c, w))
                                goto abandon;
                        worker_nap(w, kinbox__backoff_ms(
                                          ++backoff, c->backoff_base,
                                          c->backoff_max));
                        for (size_t i = 0; i < w->nmsgs; i++)
                                if (w->msgs[i]->state == M_DUP)
                                        w->msgs[i]->state = M_RUN;
                        continue;
                }
                /* RUN_AGAIN: states changed; duplicates are re-detected. */
                for (size_t i = 0; i < w->nmsgs; i++)
                        if (w->msgs[i]->state == M_DUP)
                                w->msgs[i]->state = M_RUN;
        }
        /* Committed: pop the committed prefix of each partition. */
        pthread_mutex_lock(&c->drain_lock);
        pthread_cond_broadcast(&c->drained);
        pthread_mutex_unlock(&c->drain_lock);
        pthread_mutex_lock(&w->lock);
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_CUT)
                        continue;
                part_t *p = m->part;
                /* m is p->head: batches take each partition's head run. */
                p->head = m->next;
                if (!p->head)
                        p->tail = NULL;
                p->count--;
                w->queued--;
                if (p->retry_at && !part_backing_off(p, kinbox__now_ms()))
                        p->retry_at = 0;
                msg_free(m);
        }
        pthread_mutex_unlock(&w->lock);
        atomic_store(&c->pause_dirty, true);
        tx_clear_ukeys(&tx);
        free(tx.ukeys);
        return;
abandon:
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "worker %d: batch abandoned (partition revoked or "
                    "stopping); it will be redelivered",
                    w->idx);
        for (size_t i = 0; i < w->nmsgs; i++)
                w->msgs[i]->state = M_CUT;
        tx_clear_ukeys(&tx);
        free(tx.ukeys);
}

static bool
grow_batch(worker_t *w, size_t need)
{
        if (need <= w->capmsgs)
                return true;
        size_t cap = need;
        kinbox_msg_t **m = realloc(w->msgs, cap * sizeof(*m));
        if (!m)
                return false;
        w->msgs = m;
        kinbox__inbox_row_t *r = realloc(w->rows, cap * sizeof(*r));
        if (!r)
                return false;
        w->rows = r;
        bool *b = realloc(w->is_new, cap * sizeof(*b));
        if (!b)
                return false;
        w->is_new = b;
        kinbox_result_t *res = realloc(w->results, cap * sizeof(*res));
        if (!res)
                return false;
        w->results = res;
        w->capmsgs = cap;
        return true;
}

/* Under w->lock: collect up to limit messages from runnable partitions. */
static size_t
collect(kinbox_consumer_t *c, worker_t *w, int64_t now, int64_t *next_wake)
{
        size_t n = 0;
        *next_wake = 0;
        /* Each partition contributes its head run; round robin by taking a
         * share per partition keeps one busy partition from starving. */
        for (part_t *p = c->parts; p; p = p->next) {
                if (p->w != w || p->revoked || !p->head)
                        continue;
                if (part_backing_off(p, now)) {
                        if (!*next_wake || p->retry_at < *next_wake)
                                *next_wake = p->retry_at;
                        continue;
                }
                for (kinbox_msg_t *m = p->head; m && n < w->limit;
                     m = m->next)
                        w->msgs[n++] = m;
                if (n >= w->limit)
                        break;
        }
        return n;
}

static size_t
runnable(kinbox_consumer_t *c, worker_t *w, int64_t now)
{
        size_t n = 0;
        for (part_t *p = c->parts; p; p = p->next)
                if (p->w == w && !p->revoked && p->head &&
                    !part_backing_off(p, now))
                        n += p->count;
        return n;
}


static void *
worker_main(void *arg)
{
        worker_t *w = arg;
        kinbox_consumer_t *c = w->c;
        pthread_mutex_lock(&w->lock);
        while (!w->stop) {
                int64_t now = kinbox__now_ms();
                size_t avail = runnable(c, w, now);
                if (!avail) {
                        int64_t wake = 0;
                        collect(c, w, now, &wake);
                        timed_wait(w, wake ? (wake - now > 0 ? wake - now : 1)
                                           : 200);
                        continue;
                }
                /* Let the batch fill for up to batch.wait.ms. */
                if (avail < w->limit && c->batch_wait > 0) {
                        int64_t until = now + c->batch_wait;
                        while (!w->stop && runnable(c, w, kinbox__now_ms()) <
                                               w->limit) {
                                int64_t left = until - kinbox__now_ms();
                                if (left <= 0)
                                        break;
                                timed_wait(w, left);
                        }
                        if (w->stop)
                                break;
                }
                int64_t wake;
                w->nmsgs = collect(c, w, kinbox__now_ms(), &wake);
                if (!w->nmsgs)
                        continue;
                w->in_batch = true;
                pthread_mutex_unlock(&w->lock);
                process_batch(c, w);
                pthread_mutex_lock(&w->lock);
                w->in_batch = false;
                w->nmsgs = 0;
                w->batch_seq++;
                pthread_cond_broadcast(&w->idle);
        }
        pthread_mutex_unlock(&w->lock);
        return NULL;
}

/* ------------------------------------------------------------------ */
/* main thread: partitions, rebalances, dispatch */

static part_t *
part_find(kinbox_consumer_t *c, const char *topic, int32_t partition)
{
        for (part_t *p = c->parts; p; p = p->next)
                if (p->partition == partition && !strcmp(p->topic, topic))
                        return p;
        return NULL;
}

static unsigned
hash_tp(const char *topic, int32_t partition)
{
        unsigned h = 2166136261u;
        for (const char *s = topic; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h + (unsigned)partition;
}

/*
 * Seek each newly assigned partition to max(DB watermark, committed).
 * Partitions where the DB was ahead are added to *ahead, so their start is
 * stored (and committed) at once: Kafka's view of the group's position,
 * and so its lag, must not wait for the next message.
 */
static void
apply_watermarks(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl,
                 rd_kafka_topic_partition_list_t *ahead)
{
        rd_kafka_resp_err_t e = rd_kafka_committed(c->rk, pl, 10000);
        if (e)
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "committed offsets unavailable: %s",
                            rd_kafka_err2str(e));
        kinbox_rows_t *rows = NULL;
        const char *vals[1] = {c->name};
        static const char sql[] = "SELECT topic, kafka_partition, "
                                  "next_offset FROM kinbox_offsets WHERE "
                                  "consumer = $1";
        int rc = kinbox__db_queryv(c->ctl, sql, 1, vals, &rows);
        if (rc == KINBOX_ERR_DB_CONN) /* a restarted server: once more */
                rc = kinbox__db_queryv(c->ctl, sql, 1, vals, &rows);
        if (rc) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "reading offset watermarks: %s (starting from "
                            "Kafka's committed offsets; the inbox still "
                            "deduplicates)",
                            c->ctl->err.msg);
                return;
        }
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                const char *t = kinbox_rows_value(rows, i, 0, NULL);
                int32_t part =
                    (int32_t)strtol(kinbox_rows_value(rows, i, 1, NULL), NULL,
                                    10);
                int64_t off =
                    strtoll(kinbox_rows_value(rows, i, 2, NULL), NULL, 10);
                rd_kafka_topic_partition_t *tp =
                    rd_kafka_topic_partition_list_find(pl, t, part);
                if (tp && off > tp->offset) {
                        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                                    "%s [%" PRId32 "]: DB watermark %" PRId64
                                    " ahead of committed %" PRId64
                                    ": starting there",
                                    t, part, off, tp->offset);
                        tp->offset = off;
                        rd_kafka_topic_partition_list_add(ahead, t, part)
                            ->offset = off;
                }
        }
        kinbox_rows_destroy(rows);
}

static void
parts_add(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl)
{
        for (int i = 0; i < pl->cnt; i++) {
                rd_kafka_topic_partition_t *tp = &pl->elems[i];
                if (part_find(c, tp->topic, tp->partition))
                        continue;
                part_t *p = kinbox__calloc(1, sizeof(*p));
                if (!p || !(p->topic = kinbox__strdup(tp->topic))) {
                        free(p);
                        continue;
                }
                p->partition = tp->partition;
                p->w = &c->workers[hash_tp(tp->topic, tp->partition) %
                                   (unsigned)c->nworkers];
                /* Workers walk c->parts under their own lock. */
                for (int k = 0; k < c->nworkers; k++)
                        pthread_mutex_lock(&c->workers[k].lock);
                p->next = c->parts;
                c->parts = p;
                for (int k = 0; k < c->nworkers; k++)
                        pthread_mutex_unlock(&c->workers[k].lock);
        }
}

/* Finish batches touching pl, drop their queued messages, forget them. */
static void
parts_revoke(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl)
{
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_lock(&c->workers[k].lock);
        for (int i = 0; pl && i < pl->cnt; i++) {
                part_t *p = part_find(c, pl->elems[i].topic,
                                      pl->elems[i].partition);
                if (p)
                        p->revoked = true;
        }
        if (!pl)
                for (part_t *p = c->parts; p; p = p->next)
                        p->revoked = true;
        for (int k = 0; k < c->nworkers; k++) {
                worker_t *w = &c->workers[k];
                pthread_cond_broadcast(&w->cond);
        }
        /* Wait for in-flight batches (which now skip revoked partitions). */
        for (int k = 0; k < c->nworkers; k++) {
                worker_t *w = &c->workers[k];
                uint64_t seq = w->batch_seq;
                while (w->in_batch && w->batch_seq == seq && w->started)
                        pthread_cond_wait(&w->idle, &w->lock);
        }
        part_t **pp = &c->parts;
        while (*pp) {
                part_t *p = *pp;
                if (p->revoked) {
                        *pp = p->next;
                        p->w->queued -= p->count;
                        part_free(p);
                } else {
                        pp = &p->next;
                }
        }
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_unlock(&c->workers[k].lock);
}

static void
rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
             rd_kafka_topic_partition_list_t *pl, void *opaque)
{
        kinbox_consumer_t *c = opaque;
        bool coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                            "%s: assigned %d partition(s)", c->name, pl->cnt);
                rd_kafka_topic_partition_list_t *ahead =
                    rd_kafka_topic_partition_list_new(4);
                apply_watermarks(c, pl, ahead);
                parts_add(c, pl);
                if (coop) {
                        rd_kafka_error_t *e =
                            rd_kafka_incremental_assign(rk, pl);
                        if (e) {
                                kinbox__log(&c->lg, KINBOX_LOG_ERR,
                                            "consumer", "assign: %s",
                                            rd_kafka_error_string(e));
                                rd_kafka_error_destroy(e);
                        }
                } else {
                        rd_kafka_assign(rk, pl);
                }
                if (ahead->cnt) {
                        rd_kafka_resp_err_t se =
                            rd_kafka_offsets_store(rk, ahead);
                        if (se)
                                kinbox__log(&c->lg, KINBOX_LOG_DEBUG,
                                            "consumer",
                                            "storing start offsets: %s",
                                            rd_kafka_err2str(se));
                }
                rd_kafka_topic_partition_list_destroy(ahead);
                metrics_assignment(c, rk);
                return;
        }
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s: revoking %d partition(s)%s", c->name, pl->cnt,
                    err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS ? ""
                                                                : " (error)");
        if (c->workers)
                parts_revoke(c, coop ? pl : NULL);
        /* Commit what committed in the DB before letting go. */
        if (!rd_kafka_assignment_lost(rk)) {
                rd_kafka_resp_err_t ce = rd_kafka_commit(rk, NULL, 0);
                if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET)
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "offset commit on revoke: %s (the DB "
                                    "watermark covers it)",
                                    rd_kafka_err2str(ce));
        }
        if (coop) {
                rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, pl);
                if (e)
                        rd_kafka_error_destroy(e);
        } else {
                rd_kafka_assign(rk, NULL);
        }
        metrics_assignment(c, rk);
}

static void
dispatch(kinbox_consumer_t *c, rd_kafka_message_t *rkm)
{
        const char *topic = rd_kafka_topic_name(rkm->rkt);
        part_t *p = part_find(c, topic, rkm->partition);
        if (!p) {
                /* Not ours (any more): it will be redelivered to the owner. */
                rd_kafka_message_destroy(rkm);
                return;
        }
        kinbox_msg_t *m = kinbox__calloc(1, sizeof(*m));
        if (!m) {
                rd_kafka_message_destroy(rkm);
                return;
        }
        m->rkm = rkm;
        m->part = p;
        kinbox__msgview_of(rkm, &m->v);
        rd_kafka_timestamp_type_t tstype;
        m->ts = rd_kafka_message_timestamp(rkm, &tstype);
        char why[300];
        m->id = kinbox__msgid_extract(c->msgid_spec, &m->v, why, sizeof(why));
        if (!m->id)
                msg_set_reason(m, why);
        worker_t *w = p->w;
        pthread_mutex_lock(&w->lock);
        if (p->tail)
                p->tail->next = m;
        else
                p->head = m;
        p->tail = m;
        p->count++;
        w->queued++;
        pthread_cond_signal(&w->cond);
        pthread_mutex_unlock(&w->lock);
}

/* Pause partitions of full workers or backing off; resume the others. */
static void
update_pauses(kinbox_consumer_t *c)
{
        rd_kafka_topic_partition_list_t *pause =
            rd_kafka_topic_partition_list_new(4);
        rd_kafka_topic_partition_list_t *resume =
            rd_kafka_topic_partition_list_new(4);
        int64_t now = kinbox__now_ms();
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_lock(&c->workers[k].lock);
        for (part_t *p = c->parts; p; p = p->next) {
                worker_t *w = p->w;
                bool want = part_backing_off(p, now) ||
                            (c->stalled && w->queued >= c->queue_max / 2);
                if (want && !p->paused)
                        rd_kafka_topic_partition_list_add(pause, p->topic,
                                                          p->partition);
                else if (!want && p->paused)
                        rd_kafka_topic_partition_list_add(resume, p->topic,
                                                          p->partition);
                p->paused = want;
        }
        for (int k = 0; k < c->nworkers; k++)
                pthread_mutex_unlock(&c->workers[k].lock);
        if (pause->cnt)
                rd_kafka_pause_partitions(c->rk, pause);
        if (resume->cnt)
                rd_kafka_resume_partitions(c->rk, resume);
        rd_kafka_topic_partition_list_destroy(pause);
        rd_kafka_topic_partition_list_destroy(resume);
}

/* A full worker queue for this long pauses partitions (see drain_lock). */
#define STALL_PAUSE_MS 3000

static bool
workers_full(kinbox_consumer_t *c)
{
        bool full = false;
        for (int k = 0; k < c->nworkers && !full; k++) {
                worker_t *w = &c->workers[k];
                pthread_mutex_lock(&w->lock);
                full = w->queued >= c->queue_max;
                pthread_mutex_unlock(&w->lock);
        }
        return full;
}

/*
 * Fetch nudge (polling thread). Once librdkafka's consumer queue reaches
 * queued.min.messages (or queued.max.messages.kbytes) its broker threads
 * stop fetching and, in librdkafka 2.0, look again only when something
 * else wakes them: up to a second later. Draining a full queue takes less
 * than that, so the workers starve for the rest of it. When the queue has
 * been full and has drained to three quarters, ask every partition
 * leader for its end offset (a ListOffsets request each): a request to a
 * broker wakes its thread, which then sees room and fetches at once.
 * Pausing and resuming would also wake them, but a resume throws away
 * what was prefetched.
 */
#define NUDGE_CHECK_MS 20

static void
nudge_fetchers(kinbox_consumer_t *c, int64_t now)
{
        if (!c->cq || now - c->last_nudge_check < NUDGE_CHECK_MS)
                return;
        c->last_nudge_check = now;
        double n = (double)rd_kafka_queue_length(c->cq);
        double fill = c->prefetch_msgs ? n / (double)c->prefetch_msgs : 0;
        if (c->prefetch_bytes > 0 && c->avg_bytes > 0) {
                double b = n * c->avg_bytes / c->prefetch_bytes;
                if (b > fill)
                        fill = b;
        }
        if (fill >= 0.9) {
                c->prefetch_full = true;
                return;
        }
        if (!c->prefetch_full || fill > 0.75)
                return;
        c->prefetch_full = false;
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "prefetch queue drained to %.0f messages: nudging the "
                    "fetchers", n);
        pthread_mutex_lock(&c->nudge_lock);
        c->nudge_req = true;
        pthread_cond_signal(&c->nudge_cond);
        pthread_mutex_unlock(&c->nudge_lock);
}

/* The request may wait behind a fetch the broker holds for
 * fetch.wait.max.ms, so it runs here, not in the polling thread. */
static void *
nudger_main(void *arg)
{
        kinbox_consumer_t *c = arg;
        pthread_mutex_lock(&c->nudge_lock);
        for (;;) {
                while (!c->nudge_req && !c->nudge_stop)
                        pthread_cond_wait(&c->nudge_cond, &c->nudge_lock);
                if (c->nudge_stop)
                        break;
                c->nudge_req = false;
                pthread_mutex_unlock(&c->nudge_lock);
                rd_kafka_topic_partition_list_t *a = NULL;
                if (!rd_kafka_assignment(c->rk, &a) && a) {
                        for (int i = 0; i < a->cnt; i++)
                                a->elems[i].offset = RD_KAFKA_OFFSET_END;
                        if (a->cnt)
                                (void)rd_kafka_offsets_for_times(c->rk, a,
                                                                 500);
                        rd_kafka_topic_partition_list_destroy(a);
                }
                pthread_mutex_lock(&c->nudge_lock);
        }
        pthread_mutex_unlock(&c->nudge_lock);
        return NULL;
}

static void
nudger_stop(kinbox_consumer_t *c)
{
        if (!c->nudger_started)
                return;
        pthread_mutex_lock(&c->nudge_lock);
        c->nudge_stop = true;
        pthread_cond_signal(&c->nudge_cond);
        pthread_mutex_unlock(&c->nudge_lock);
        pthread_join(c->nudger, NULL);
        c->nudger_started = false;
}

/* Polling thread: true when it should hold off polling for now. */
static bool
hold_off(kinbox_consumer_t *c)
{
        if (!workers_full(c)) {
                if (c->full_since && kinbox__now_ms() - c->full_since > 50)
                        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                                    "held off polling for %lld ms",
                                    (long long)(kinbox__now_ms() -
                                                c->full_since));
                c->full_since = 0;
                if (c->stalled) {
                        c->stalled = false;
                        atomic_store(&c->pause_dirty, true);
                }
                return false;
        }
        int64_t now = kinbox__now_ms();
        if (!c->full_since)
                c->full_since = now;
        if (now - c->full_since >= STALL_PAUSE_MS) {
                /* A long stall (database down, a partition backing off
                 * with a full queue): pause and keep polling so the group
                 * membership and rebalances go on. */
                if (!c->stalled) {
                        c->stalled = true;
                        atomic_store(&c->pause_dirty, true);
                }
                return false;
        }
        struct timespec ts;
        kinbox__deadline(20, &ts);
        pthread_mutex_lock(&c->drain_lock);
        pthread_cond_timedwait(&c->drained, &c->drain_lock, &ts);
        pthread_mutex_unlock(&c->drain_lock);
        return true;
}

static void
workers_stop(kinbox_consumer_t *c)
{
        for (int k = 0; k < c->nworkers; k++) {
                worker_t *w = &c->workers[k];
                pthread_mutex_lock(&w->lock);
                w->stop = true;
                pthread_cond_broadcast(&w->cond);
                pthread_mutex_unlock(&w->lock);
        }
        for (int k = 0; k < c->nworkers; k++) {
                worker_t *w = &c->workers[k];
                if (w->started)
                        pthread_join(w->thr, NULL);
                w->started = false;
        }
}

static void
workers_free(kinbox_consumer_t *c)
{
        if (!c->workers)
                return;
        for (int k = 0; k < c->nworkers; k++) {
                worker_t *w = &c->workers[k];
                kinbox__db_destroy(w->db);
                free(w->msgs);
                free(w->rows);
                free(w->is_new);
                free(w->results);
                pthread_mutex_destroy(&w->lock);
                pthread_cond_destroy(&w->cond);
                pthread_cond_destroy(&w->idle);
        }
        free(c->workers);
        c->workers = NULL;
}

kinbox_err_t
kinbox_consumer_run(kinbox_consumer_t *c)
{
        if (!c->handler && !c->batch_handler) {
                snprintf(c->errstr, sizeof(c->errstr),
                         "no handler registered");
                return KINBOX_ERR_STATE;
        }
        if (atomic_exchange(&c->running, true))
                return KINBOX_ERR_STATE;
        kinbox_err_t ret = KINBOX_OK;
        char alab[300];
        kinbox__m_set("kinbox_consumer_assigned_partitions",
                      kinbox__m_labels(alab, sizeof(alab), "consumer",
                                       c->name, (char *)NULL),
                      -1);
        c->ctl = db_open(c, c->errstr, sizeof(c->errstr));
        if (!c->ctl) {
                ret = KINBOX_ERR_CONFIG;
                goto out;
        }
        if (kinbox__db_connect(c->ctl)) {
                snprintf(c->errstr, sizeof(c->errstr), "%s", c->ctl->err.msg);
                ret = KINBOX_ERR_DB_CONN;
                goto out;
        }
        c->workers = kinbox__calloc((size_t)c->nworkers, sizeof(worker_t));
        if (!c->workers) {
                ret = KINBOX_ERR_NOMEM;
                goto out;
        }
        for (int k = 0; k < c->nworkers; k++) {
                worker_t *w = &c->workers[k];
                w->c = c;
                w->idx = k;
                w->limit = c->batch_max;
                pthread_mutex_init(&w->lock, NULL);
                pthread_cond_init(&w->cond, NULL);
                pthread_cond_init(&w->idle, NULL);
                w->db = db_open(c, c->errstr, sizeof(c->errstr));
                if (!w->db || !grow_batch(w, c->batch_max)) {
                        ret = KINBOX_ERR_NOMEM;
                        goto out;
                }
                if (kinbox__db_connect(w->db))
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "worker %d: %s (will retry)", k,
                                    w->db->err.msg);
        }
        for (int k = 0; k < c->nworkers; k++) {
                if (pthread_create(&c->workers[k].thr, NULL, worker_main,
                                   &c->workers[k])) {
                        ret = KINBOX_ERR_NOMEM;
                        goto out;
                }
                c->workers[k].started = true;
        }
        rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, c->topics);
        if (e) {
                snprintf(c->errstr, sizeof(c->errstr), "subscribe: %s",
                         rd_kafka_err2str(e));
                ret = KINBOX_ERR_KAFKA;
                goto out;
        }
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s: running (group %s, %d worker(s), batch.max %zu)",
                    c->name, kinbox_conf_get(c->conf, "group.id"),
                    c->nworkers, c->batch_max);
        int64_t last_pause_check = 0;
        c->nudge_stop = false;
        c->nudge_req = false;
        if (pthread_create(&c->nudger, NULL, nudger_main, c) == 0)
                c->nudger_started = true;
        while (!atomic_load(&c->stopping)) {
                if (hold_off(c)) {
                        if (atomic_exchange(&c->pause_dirty, false))
                                update_pauses(c);
                        continue;
                }
                rd_kafka_message_t *rkm = rd_kafka_consumer_poll(c->rk, 100);
                if (rkm) {
                        if (rkm->err) {
                                if (rkm->err == RD_KAFKA_RESP_ERR__FATAL) {
                                        char fe[256];
                                        rd_kafka_fatal_error(c->rk, fe,
                                                             sizeof(fe));
                                        snprintf(c->errstr, sizeof(c->errstr),
                                                 "fatal Kafka error: %s", fe);
                                        rd_kafka_message_destroy(rkm);
                                        ret = KINBOX_ERR_KAFKA;
                                        break;
                                }
                                kinbox__log(&c->lg, KINBOX_LOG_WARNING,
                                            "consumer", "Kafka: %s",
                                            rd_kafka_message_errstr(rkm));
                                rd_kafka_message_destroy(rkm);
                        } else {
                                double sz = (double)(rkm->len +
                                                     rkm->key_len);
                                c->avg_bytes = c->avg_bytes > 0
                                                   ? 0.99 * c->avg_bytes +
                                                         0.01 * sz
                                                   : sz;
                                dispatch(c, rkm);
                        }
                }
                int64_t now = kinbox__now_ms();
                nudge_fetchers(c, now);
                if (atomic_exchange(&c->pause_dirty, false) ||
                    now - last_pause_check > 100) {
                        update_pauses(c);
                        last_pause_check = now;
                }
        }
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "%s: stopping: finishing batches in flight", c->name);
out:
        nudger_stop(c);
        if (c->workers)
                workers_stop(c);
        if (c->rk) {
                rd_kafka_resp_err_t ce = rd_kafka_commit(c->rk, NULL, 0);
                if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET &&
                    ce != RD_KAFKA_RESP_ERR__STATE)
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "final offset commit: %s",
                                    rd_kafka_err2str(ce));
                rd_kafka_consumer_close(c->rk);
        }
        while (c->parts) {
                part_t *n = c->parts->next;
                part_free(c->parts);
                c->parts = n;
        }
        workers_free(c);
        if (ret)
                kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer", "%s: %s",
                            c->name, c->errstr);
        else
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                            "%s: stopped", c->name);
        atomic_store(&c->running, false);
        return ret;
}
