/*
 * consumer_int.h -- what the consumer's files share (internal).
 *
 * A message travels: consumer.c (poll loop, rebalances, hands each message
 * to the worker owning its partition; worker threads collect batches,
 * batch.h) -> batch*.c (one batch in one transaction: inbox insert,
 * handlers, failure isolation and classification, dead letters,
 * watermarks, COMMIT, offset store). Handlers read the message through
 * msg.c and write through the transaction API in txapi.c.
 */
#ifndef KINBOX_CONSUMER_INT_H
#define KINBOX_CONSUMER_INT_H

#include "batch.h"
#include "db.h"
#include "internal.h"
#include "msgid.h"
#include "tx.h"
#include "tracing.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef struct kinbox__part kinbox__part_t;
typedef struct kinbox__worker kinbox__worker_t;

/* Whether a message's held key (dead_letter.hold_key, hold.c) was looked
 * up; zero (a calloc'ed message) is not yet. */
typedef enum kinbox__hkey_state {
        KINBOX__HKEY_UNKNOWN, /* not looked up yet */
        KINBOX__HKEY_NONE, /* the message has no held-key value */
        KINBOX__HKEY_SET, /* in hkey/hkey_len */
        /* its source is a header the message carries more than once */
        KINBOX__HKEY_AMBIGUOUS
} kinbox__hkey_state_t;

/* The message as handlers see it. */
struct kinbox_msg_s {
        rd_kafka_message_t *rkm;
        kinbox__part_t *part;
        char *id; /* NULL when the id could not be extracted */
        char *reason; /* why it failed last (malloc), or why it has no id */
        int attempt; /* deliveries to the handler so far, +1 when running */
        int failures; /* its own failed attempts (results, statements) */
        size_t bidx; /* its index in its batch (b->msgs, b->run) */
        kinbox_msg_t *next;
        kinbox__msgview_t v; /* what the accessors read */
        int64_t ts; /* Kafka timestamp (ms), -1 if none */
        /* A replayed dead letter (replay.c) has no rkm: its headers are
         * a list of its own, its other parts borrowed from the caller. */
        rd_kafka_headers_t *own_headers;
        /* dead_letter.hold_key (hold.c): the message's held-key value,
         * looked up once when needed; hkey_own is malloc'ed (json:). */
        kinbox__hkey_state_t hkey_state;
        const void *hkey;
        size_t hkey_len;
        char *hkey_own;
        int64_t hold_off; /* KINBOX__MSG_PARK: offset of the blocker */
        /* Trace context (tracing on, set at receive): the consume span's
         * own context, a child of the message's traceparent (the parent's
         * span id kept) or a new root; recv_ns starts the span. */
        kinbox_trace_t trace;
        uint8_t trace_parent[8];
        bool trace_set, trace_has_parent;
        int64_t recv_ns;
};

/* What a failure means for the one message it is charged to. */
typedef enum kinbox__fate {
        /* May succeed later (a foreign-key violation, an unknown error, a
         * handler's RETRY): back off, then again; dead after retry.max. */
        KINBOX__FATE_RETRY,
        /* Can never succeed (REJECT, an unmarked unique violation, a
         * CHECK / NOT NULL violation, a data exception): dead-lettered. */
        KINBOX__FATE_DEAD,
        /* The event was already applied (KINBOX_RESULT_DUPLICATE, or a
         * kinbox_tx_exec_unique() statement's unique violation). */
        KINBOX__FATE_BIZDUP,
        /* No retry can fix it and the message is not to blame (an
         * undefined table, a missing privilege: dberr.deploy): its
         * partition is held (held.c), the attempt not charged. */
        KINBOX__FATE_HOLD
} kinbox__fate_t;

struct kinbox__holdset;

struct kinbox__part {
        char *topic;
        int32_t partition;
        kinbox__worker_t *w;
        /* guarded by w->lock */
        kinbox_msg_t *head, *tail;
        size_t count;
        int64_t retry_at; /* monotonic ms; 0 = not backing off */
        bool revoked;
        /* main thread only */
        bool paused;
        kinbox__part_t *next; /* in the consumer's table */
        /* Keys held on this partition (hold.c): written by the rebalance
         * callback before the partition is linked, then by its worker. */
        struct kinbox__holdset *holds;
        /* Its holds could not be read at assignment: its messages wait
         * until its worker read them (hold.c; under w->lock). */
        bool hold_unknown;
        /* Start position (consumer_startpos.c; main thread only). refused:
         * paused for good, its messages dropped, no offset stored. verify:
         * the first message must be the record at verify_off (W-1) with
         * this identity; it is dropped, then W stored when store_w. */
        bool refused;
        bool verify, store_w;
        int64_t verify_off, verify_ts;
        uint64_t verify_hash;
        int64_t sp_w, sp_c, sp_l, sp_h; /* as found at assignment */
        /* Held by an error no retry can fix (held.c; its worker): since
         * when, attempts, the last error line. */
        bool held;
        int held_n;
        int64_t held_since_ms, held_log_ms;
};

struct kinbox__worker {
        kinbox_consumer_t *c;
        int idx;
        pthread_t thr;
        bool started;
        pthread_mutex_t lock;
        pthread_cond_t cond; /* work arrived / stop / revoke */
        pthread_cond_t idle; /* a batch finished */
        size_t queued; /* messages in all its partitions */
        bool in_batch;
        uint64_t batch_seq;
        bool stop;
        kinbox__db_t *db;
        kinbox__batch_t b; /* its batch (batch.h), collected under lock */
        int64_t hold_poll_at; /* hold.c: next release poll (monotonic) */
};

/* A kinbox_tx_exec_unique() statement's key, by tag. */
typedef struct kinbox__ukey {
        int tag;
        char *key; /* NULL: any unique key */
} kinbox__ukey_t;

struct kinbox_tx_s {
        kinbox_consumer_t *c;
        kinbox__batch_t *b; /* the batch of the messages (NULL: replay) */
        kinbox__db_t *db;
        int tag; /* statement tag of the running call (db.h) */
        bool failed; /* a statement failed during the current call */
        bool touched; /* the current call queued or ran statements */
        /* Round trips the handler's calls waited for (kinbox_tx_query(),
         * native access): counts only ever go up. */
        uint64_t waits;
        char reason[512]; /* kinbox_tx_set_error() */
        const char *consumer; /* when c is NULL (replay) */
        kinbox__ukey_t *ukeys; /* this transaction's exec_unique() keys */
        size_t nukeys, capukeys;
};

struct kinbox_consumer_s {
        kinbox_conf_t *conf;
        bool tracing; /* holds a reference on the span exporter */
        bool left_unclosed; /* leaving the group timed out at shutdown */
        kinbox__log_t lg;
        char *name;
        char *msgid_spec;
        rd_kafka_t *rk;
        rd_kafka_topic_partition_list_t *topics;
        kinbox_handler_fn handler;
        kinbox_batch_handler_fn batch_handler;
        void *opaque;
        int nworkers;
        kinbox__worker_t *workers;
        kinbox__part_t *parts;
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
        bool stalled; /* polling thread only */
        /* Fetch nudge (polling thread only, see nudge_fetchers()). */
        rd_kafka_queue_t *cq; /* librdkafka's consumer queue */
        size_t prefetch_msgs; /* queued.min.messages */
        double prefetch_bytes; /* queued.max.messages.kbytes * 1024 */
        double avg_bytes; /* moving average of message size */
        bool prefetch_full; /* the queue reached a threshold */
        int64_t last_nudge_check;
        pthread_t nudger; /* sends the wake-up requests */
        bool nudger_started;
        pthread_mutex_t nudge_lock;
        pthread_cond_t nudge_cond;
        bool nudge_req, nudge_stop; /* under nudge_lock */
        /* dead_letter.hold_key (hold.c) */
        bool hold_on;
        char *hold_src;
        int64_t release_poll;
        atomic_uint_fast64_t st_parked, st_released;
        atomic_int st_held; /* partitions held (held.c) */
        /* Hidden batch splits (batch.c): counted, the count at the last
         * notice, and when it was logged (monotonic ms). */
        atomic_uint_fast64_t st_splits, st_splits_logged;
        atomic_int_fast64_t split_log_ms;
        atomic_uint_fast64_t st_processed, st_dup, st_bizdup, st_dead,
            st_retried, st_batches, st_rolled_back;
        char errstr[512];
};

/* ---- msg.c */
/* A zeroed message holding a copy of payload (len bytes, NULL: none)
 * followed by a NUL, m->v.payload/len set; NULL when out of memory. Free
 * with kinbox__msg_free(). */
kinbox_msg_t *kinbox__msg_alloc(const void *payload, size_t len);
void kinbox__msg_free(kinbox_msg_t *m);
/* Replace the message's reason (a copy; NULL or "" -> "no reason given"). */
void kinbox__msg_set_reason(kinbox_msg_t *m, const char *r);
/* The message's traceparent header parsed into *t: 0, or
 * KINBOX_ERR_NOT_FOUND when it has none, several (W3C Trace Context: an
 * invalid carrier, every one ignored) or an invalid one. */
int kinbox__msg_traceparent(const kinbox_msg_t *m, kinbox_trace_t *t);
/* consume_trace.c: a received message's trace context (tracing on), and
 * the consume spans of a committed batch. */
void kinbox__msg_trace_start(kinbox_msg_t *m);
void kinbox__consume_spans(const kinbox__batch_t *b);
/* " (trace <32 hex>)" for a log line about m when it has a trace context
 * (tracing on: its own; else a valid traceparent header), else "". */
const char *kinbox__msg_trace_note(const kinbox_msg_t *m, char buf[48]);

/* ---- txapi.c */
/* Forget the transaction's kinbox_tx_exec_unique() keys. */
void kinbox__tx_clear_ukeys(kinbox_tx_t *tx);

/* The partition (topic, partition) of c's assignment, or NULL (the
 * polling thread's list). */
static inline kinbox__part_t *
kinbox__part_find(kinbox_consumer_t *c, const char *topic, int32_t partition)
{
        for (kinbox__part_t *p = c->parts; p; p = p->next)
                if (p->partition == partition && !strcmp(p->topic, topic))
                        return p;
        return NULL;
}

/* ---- consumer_startpos.c: start positions (docs/failures.md) */
/* Rebalance callback, partitions of pl already in c->parts: classify each
 * one's start (kinbox_startpos_classify()) and set its offset in pl; the
 * ones to store at once go to ahead, the refused ones to refuse (to pause
 * right after the assignment). */
void kinbox__startpos_assign(kinbox_consumer_t *c,
                             rd_kafka_topic_partition_list_t *pl,
                             rd_kafka_topic_partition_list_t *ahead,
                             rd_kafka_topic_partition_list_t *refuse);
/* Polling thread, before a message of p is handed on: true when it was
 * taken here (p refused, or the W-1 record of the identity check; rkm is
 * then destroyed). */
bool kinbox__startpos_take(kinbox_consumer_t *c, kinbox__part_t *p,
                           rd_kafka_message_t *rkm);
/* Polling thread: kinbox_consumer_partitions_refused from c->parts. */
void kinbox__startpos_gauge(kinbox_consumer_t *c);

/* ---- shared by consumer.c and batch.c */
static inline bool
kinbox__part_backing_off(const kinbox__part_t *p, int64_t now)
{
        return p->retry_at && p->retry_at > now;
}

/* Under w->lock: wait up to ms for w->cond. */
static inline void
kinbox__timed_wait(kinbox__worker_t *w, int64_t ms)
{
        struct timespec ts;
        kinbox__deadline(ms, &ts);
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
}

/* Wait up to ms, waking early on stop/revoke. */
static inline void
kinbox__worker_nap(kinbox__worker_t *w, int64_t ms)
{
        pthread_mutex_lock(&w->lock);
        if (!w->stop)
                kinbox__timed_wait(w, ms);
        pthread_mutex_unlock(&w->lock);
}

#endif
