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
        int failures; /* RETRY results (and failed statements) so far */
        int state;    /* per batch run, see enum mstate */
        kinbox_msg_t *next;
        kinbox__msgview_t v;  /* what the accessors read */
        int64_t ts;           /* Kafka timestamp (ms), -1 if none */
        /* A replayed dead letter (replay.c) has no rkm: its headers are
         * a list of its own, its other parts borrowed from the caller. */
        rd_kafka_headers_t *own_headers;
};

enum mstate { M_RUN, M_DUP, M_DEAD, M_CUT };

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
        size_t limit;          /* batch size cap; halved to pin a failure */
        kinbox_msg_t **msgs;   /* current batch */
        size_t nmsgs, capmsgs;
        kinbox__inbox_row_t *rows;
        bool *is_new;
        kinbox_result_t *results;
};

struct kinbox_tx_s {
        kinbox_consumer_t *c;
        worker_t *w;
        kinbox__db_t *db;
        int tag;            /* index of the running message, -2 batch */
        bool failed;        /* a statement of the current handler failed */
        char reason[512];   /* kinbox_tx_set_error() */
        const char *consumer; /* when c is NULL (replay) */
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
        atomic_uint_fast64_t st_processed, st_dup, st_dead, st_retried,
            st_batches, st_rolled_back;
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

void
kinbox__tx_destroy(kinbox_tx_t *tx)
{
        free(tx);
}

void
kinbox__tx_reset(kinbox_tx_t *tx)
{
        tx->tag = 0;
        tx->failed = false;
        tx->reason[0] = '\0';
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
        static const char *const res[] = {"processed", "duplicate", "dead",
                                          "retried"};
        uint64_t v[4] = {atomic_load(&c->st_processed),
                         atomic_load(&c->st_dup), atomic_load(&c->st_dead),
                         atomic_load(&c->st_retried)};
        char l[300];
        for (int i = 0; i < 4; i++)
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

kinbox_err_t
kinbox_tx_exec(kinbox_tx_t *tx, const char *sql, int nparams,
               const char *const *params)
{
        kinbox__param_t stack[32] = {{0}};
        bool heap;
        kinbox__param_t *ps =
            sql ? tx_params(nparams, params, stack, 32, &heap) : NULL;
        if (!ps) {
                snprintf(tx->reason, sizeof(tx->reason),
                         "kinbox_tx_exec: bad arguments (%d parameters)",
                         nparams);
                tx->failed = true;
                return KINBOX_ERR_INVALID;
        }
        int rc = tx->db->ops->exec(tx->db, sql, nparams, ps, tx->tag);
        if (heap)
                free(ps);
        if (rc)
                tx->failed = true;
        return (kinbox_err_t)rc;
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
        int rc = tx->db->ops->query(tx->db, sql, nparams, ps, tx->tag, rowsp);
        if (heap)
                free(ps);
        if (rc)
                tx->failed = true;
        return (kinbox_err_t)rc;
}

struct pg_conn *
kinbox_tx_pgconn(kinbox_tx_t *tx)
{
        if (tx->db->backend != KINBOX_BACKEND_POSTGRESQL)
                return NULL;
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

static void
headers_json(const kinbox_msg_t *m, kinbox__buf_t *b)
{
        size_t n = kinbox_msg_header_count(m);
        kinbox__buf_add(b, "[", 1);
        for (size_t i = 0; i < n; i++) {
                kinbox_header_t h;
                if (kinbox_msg_header_at(m, i, &h))
                        break;
                kinbox__buf_adds(b, i ? ",{\"name\":" : "{\"name\":");
                kinbox__buf_json_str(b, h.name, strlen(h.name));
                kinbox__buf_adds(b, ",\"value\":");
                if (h.value)
                        kinbox__buf_json_str(b, h.value, h.size);
                else
                        kinbox__buf_adds(b, "null");
                kinbox__buf_add(b, "}", 1);
        }
        kinbox__buf_add(b, "]", 1);
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
        headers_json(m, &h);
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

/* Message i failed: decide its fate and cut the rest of its partition. */
static void
fail_msg(kinbox_consumer_t *c, worker_t *w, size_t i, kinbox_result_t r,
         const char *reason)
{
        kinbox_msg_t *m = w->msgs[i];
        msg_set_reason(m, reason);
        if (r == KINBOX_RESULT_REJECT) {
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

/* Halve the batch from the end (a suffix per partition). */
static void
cut_suffix(worker_t *w, size_t keep)
{
        for (size_t j = keep; j < w->nmsgs; j++)
                w->msgs[j]->state = M_CUT;
}

enum run_rc { RUN_DONE, RUN_AGAIN, RUN_DB_DOWN, RUN_BACKOFF };

/* One attempt at the batch in one transaction. */
static enum run_rc
run_once(kinbox_consumer_t *c, worker_t *w, kinbox_tx_t *tx)
{
        kinbox__db_t *db = w->db;
        size_t n = 0;
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_CUT || !m->id)
                        continue;
                w->rows[n] = (kinbox__inbox_row_t){
                    m->id, m->part->topic, m->rkm->partition, m->rkm->offset};
                n++;
        }
        bool any = false;
        for (size_t i = 0; i < w->nmsgs; i++)
                if (w->msgs[i]->state != M_CUT)
                        any = true;
        if (!any)
                return RUN_DONE;
        int64_t t_begin = kinbox__now_ms();
        char mlab[300];
        kinbox__m_labels(mlab, sizeof(mlab), "consumer", c->name,
                         (char *)NULL);
        int64_t t_begin_us = kinbox__now_us();
        int rc = db->ops->begin(db);
        if (!rc && n)
                rc = db->ops->inbox_insert(db, c->name, n, w->rows, w->is_new);
        int64_t t_inbox = kinbox__now_us();
        if (rc)
                goto db_error;
        /* Map inbox answers back and run handlers. */
        size_t k = 0, nrun = 0;
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_CUT || !m->id)
                        continue;
                if (!w->is_new[k++])
                        m->state = M_DUP;
                else if (m->state == M_DUP)
                        m->state = M_RUN; /* its twin was cut this time */
        }
        for (size_t i = 0; i < w->nmsgs; i++) {
                kinbox_msg_t *m = w->msgs[i];
                if (m->state == M_DEAD) {
                        if ((rc = queue_dead_letter(c, w, m)))
                                goto db_error;
                        continue;
                }
                if (m->state != M_RUN)
                        continue;
                nrun++;
                if (!c->handler)
                        continue;
                tx->tag = (int)i;
                tx->failed = false;
                tx->reason[0] = '\0';
                m->attempt++;
                int64_t t_h = kinbox__now_ms();
                kinbox_result_t r = c->handler(tx, m, c->opaque);
                kinbox__m_observe("kinbox_handler_seconds", mlab,
                                  (double)(kinbox__now_ms() - t_h) / 1000.0);
                if (r == KINBOX_RESULT_OK && tx->failed) {
                        /* The handler ignored a failed statement. */
                        if (db->err.code == KINBOX_ERR_DB_CONN ||
                            db->err.code == KINBOX_ERR_TRANSIENT)
                                goto db_error;
                        r = KINBOX_RESULT_RETRY;
                        snprintf(tx->reason, sizeof(tx->reason), "%s",
                                 db->err.msg);
                }
                if (r != KINBOX_RESULT_OK) {
                        if (tx->failed && (db->err.code == KINBOX_ERR_DB_CONN ||
                                           db->err.code ==
                                               KINBOX_ERR_TRANSIENT))
                                goto db_error;
                        if (!tx->reason[0] && tx->failed)
                                snprintf(tx->reason, sizeof(tx->reason), "%s",
                                         db->err.msg);
                        db->ops->rollback(db);
                        atomic_fetch_add(&c->st_rolled_back, 1);
                        fail_msg(c, w, i,
                                 r == KINBOX_RESULT_REJECT
                                     ? KINBOX_RESULT_REJECT
                                     : KINBOX_RESULT_RETRY,
                                 tx->reason);
                        return RUN_AGAIN;
                }
        }
        if (c->batch_handler && nrun) {
                kinbox_msg_t **run = kinbox__calloc(nrun, sizeof(*run));
                size_t *idx = kinbox__calloc(nrun, sizeof(*idx));
                if (!run || !idx) {
                        free(run);
                        free(idx);
                        db->ops->rollback(db);
                        return RUN_BACKOFF;
                }
                size_t j = 0;
                for (size_t i = 0; i < w->nmsgs; i++)
                        if (w->msgs[i]->state == M_RUN) {
                                run[j] = w->msgs[i];
                                idx[j] = i;
                                w->results[j] = KINBOX_RESULT_OK;
                                run[j]->attempt++;
                                j++;
                        }
                tx->tag = -2;
                tx->failed = false;
                tx->reason[0] = '\0';
                int64_t t_h = kinbox__now_ms();
                kinbox_result_t r = c->batch_handler(
                    tx, (const kinbox_msg_t *const *)run, nrun, w->results,
                    c->opaque);
                kinbox__m_observe("kinbox_handler_seconds", mlab,
                                  (double)(kinbox__now_ms() - t_h) / 1000.0);
                bool single = false;
                for (j = 0; j < nrun && r == KINBOX_RESULT_OK; j++)
                        if (w->results[j] != KINBOX_RESULT_OK) {
                                if (!single) {
                                        db->ops->rollback(db);
                                        atomic_fetch_add(&c->st_rolled_back,
                                                         1);
                                }
                                single = true;
                                if (w->msgs[idx[j]]->state == M_RUN)
                                        fail_msg(c, w, idx[j], w->results[j],
                                                 run[j]->reason);
                        }
                free(run);
                free(idx);
                if (single)
                        return RUN_AGAIN;
                if (r != KINBOX_RESULT_OK || tx->failed) {
                        if (tx->failed &&
                            (db->err.code == KINBOX_ERR_DB_CONN ||
                             db->err.code == KINBOX_ERR_TRANSIENT))
                                goto db_error;
                        db->ops->rollback(db);
                        atomic_fetch_add(&c->st_rolled_back, 1);
                        atomic_fetch_add(&c->st_retried, 1);
                        if (tx->failed && nrun > 1) {
                                cut_suffix(w, w->nmsgs / 2 ? w->nmsgs / 2 : 1);
                                return RUN_AGAIN;
                        }
                        if (tx->failed && nrun == 1) {
                                for (size_t i = 0; i < w->nmsgs; i++)
                                        if (w->msgs[i]->state == M_RUN) {
                                                fail_msg(c, w, i,
                                                         KINBOX_RESULT_RETRY,
                                                         db->err.msg);
                                        }
                                return RUN_AGAIN;
                        }
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "batch handler asked to retry the batch: "
                                    "%s",
                                    tx->reason);
                        return RUN_BACKOFF;
                }
        }
        int64_t t_handlers = kinbox__now_us();
        if ((rc = queue_watermarks(c, w)))
                goto db_error;
        if (kinbox__fault("before_commit")) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "fault",
                            "before_commit: SIGKILL");
                raise(SIGKILL);
        }
        rc = db->ops->commit(db);
        if (rc)
                goto db_error;
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
        size_t done = 0, dups = 0, dead = 0;
        for (size_t i = 0; i < w->nmsgs; i++) {
                switch (w->msgs[i]->state) {
                case M_RUN:
                        done++;
                        break;
                case M_DUP:
                        dups++;
                        break;
                case M_DEAD:
                        dead++;
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "%s [%" PRId32 "] offset %" PRId64
                                    " dead-lettered: %s",
                                    w->msgs[i]->part->topic,
                                    w->msgs[i]->rkm->partition,
                                    w->msgs[i]->rkm->offset,
                                    w->msgs[i]->reason);
                        break;
                }
        }
        atomic_fetch_add(&c->st_processed, done);
        atomic_fetch_add(&c->st_dup, dups);
        atomic_fetch_add(&c->st_dead, dead);
        atomic_fetch_add(&c->st_batches, 1);
        kinbox__m_observe("kinbox_consumer_batch_size", mlab,
                          (double)(done + dups + dead));
        kinbox__m_observe("kinbox_consumer_transaction_seconds", mlab,
                          (double)(kinbox__now_ms() - t_begin) / 1000.0);
        return RUN_DONE;

db_error:
        db->ops->rollback(db);
        atomic_fetch_add(&c->st_rolled_back, 1);
        /* Handler-attributed statement failure: that message failed. A
         * unique-key violation can never succeed: dead-letter it at once;
         * anything else may (a row another message creates): retry. */
        if ((rc == KINBOX_ERR_DB || rc == KINBOX_ERR_DUPLICATE) &&
            db->err.tag >= 0 && (size_t)db->err.tag < w->nmsgs &&
            w->msgs[db->err.tag]->state == M_RUN) {
                fail_msg(c, w, (size_t)db->err.tag,
                         rc == KINBOX_ERR_DUPLICATE ? KINBOX_RESULT_REJECT
                                                    : KINBOX_RESULT_RETRY,
                         db->err.msg);
                return RUN_AGAIN;
        }
        if ((rc == KINBOX_ERR_DB || rc == KINBOX_ERR_DUPLICATE) &&
            db->err.tag == KINBOX__TAG_MERGED) {
                /* A merged INSERT (MySQL) failed: the backend sends the
                 * next transaction's rows one by one, which pins it. */
                kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                            "worker %d: merged insert failed (%s); running "
                            "the batch again unmerged",
                            w->idx, db->err.msg);
                return RUN_AGAIN;
        }
        if ((rc == KINBOX_ERR_DB || rc == KINBOX_ERR_DUPLICATE) &&
            db->err.tag == -2) {
                /* A batch handler's statement: split until pinned. */
                size_t live = 0;
                for (size_t i = 0; i < w->nmsgs; i++)
                        if (w->msgs[i]->state == M_RUN)
                                live++;
                if (live > 1) {
                        size_t keep = 0, seen = 0;
                        for (; keep < w->nmsgs && seen < live / 2; keep++)
                                if (w->msgs[keep]->state == M_RUN)
                                        seen++;
                        cut_suffix(w, keep);
                        return RUN_AGAIN;
                }
                for (size_t i = 0; i < w->nmsgs; i++)
                        if (w->msgs[i]->state == M_RUN) {
                                fail_msg(c, w, i,
                                         rc == KINBOX_ERR_DUPLICATE
                                             ? KINBOX_RESULT_REJECT
                                             : KINBOX_RESULT_RETRY,
                                         db->err.msg);
                                break;
                        }
                return RUN_AGAIN;
        }
        if (rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_COMMIT_UNKNOWN) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "worker %d: %s; offsets not advanced, "
                            "reconnecting",
                            w->idx, db->err.msg);
                return RUN_DB_DOWN;
        }
        atomic_fetch_add(&c->st_retried, 1);
        kinbox__log(&c->lg,
                    rc == KINBOX_ERR_TRANSIENT ? KINBOX_LOG_INFO
                                               : KINBOX_LOG_ERR,
                    "consumer", "worker %d: batch rolled back: %s", w->idx,
                    db->err.msg);
        return RUN_BACKOFF;
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
                if (r == RUN_DONE)
                        break;
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
        return;
abandon:
        kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                    "worker %d: batch abandoned (partition revoked or "
                    "stopping); it will be redelivered",
                    w->idx);
        for (size_t i = 0; i < w->nmsgs; i++)
                w->msgs[i]->state = M_CUT;
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
