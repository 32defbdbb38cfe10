/*
 * outbox_common.h -- what the outbox suites share (outbox_relay_test.c,
 * outbox_claim_test.c, outbox_ops_test.c): connections of the caller's own
 * (PGconn / MYSQL), relay configurations and threads, reading a topic
 * back, an in-process mock cluster. Defined in outbox_common.c.
 */
#ifndef KT_OUTBOX_COMMON_H
#define KT_OUTBOX_COMMON_H

#include "harness.h"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct tconn {
        bool my;
        PGconn *pg;
        MYSQL *m;
        char *url;
} tconn_t;

typedef struct trelay {
        kinbox_relay_t *r;
        pthread_t th;
        kinbox_err_t rc;
} trelay_t;

typedef struct tmsg {
        char *key, *value;
        size_t value_size;
        int32_t partition;
        int64_t offset;
        int64_t ts; /* the record's timestamp (ms) */
        char *msgid;
        rd_kafka_headers_t *hdrs;
} tmsg_t;

typedef struct tmsgs {
        tmsg_t *v;
        size_t n, cap;
} tmsgs_t;

typedef struct mock {
        rd_kafka_t *rk;
        rd_kafka_mock_cluster_t *mc;
        const char *bootstrap;
} mock_t;

void tc_open(tconn_t *c, const char *backend, const char *url);

void tc_close(tconn_t *c);

void tc_sql(tconn_t *c, const char *sql);

kinbox_err_t tc_append(tconn_t *c, const kinbox_outbox_msg_t *m, int64_t *idp);

/* Appends (asserted KINBOX_OK) the row key of aggregate agg to dest, its
 * payload seq as text, with max_attempts (0: relay.max_attempts). */
void append_seq(tconn_t *c, const char *dest, const char *key, const char *agg,
                int seq, int max_attempts);

/* The rows of sql on url (a connection of its own); the caller destroys
 * them. */
kinbox_rows_t *qrows(const char *url, const char *sql);

/* Text of the first column of the first row. */
char *qtext(const char *url, const char *sql);

bool wait_q(const char *url, long long want, int timeout_s, const char *fmt,
            ...) __attribute__((format(printf, 4, 5)));

void cset(kinbox_conf_t *c, const char *k, const char *v);

/* Relay configuration with short test timings. */
kinbox_conf_t *relay_conf(const char *url, const char *bootstrap);

/* A lock-held relay (pipeline 1) in batches of 40, with lock_ms, the
 * producer's delivery deadline and the lease in milliseconds. */
kinbox_conf_t *lock_relay_conf(const char *url, const char *bootstrap,
                               const char *lock_ms, const char *timeout_ms,
                               const char *lease_ms);

kinbox_relay_t *relay_new(kinbox_conf_t *c);

void relay_start(trelay_t *t, kinbox_relay_t *r);

void relay_stop(trelay_t *t);

/* A relay on conf (taken) until n rows of url's outbox are sent or
 * timeout_s passed: stopped and destroyed, its stats in *st (may be
 * NULL). True when the n rows were sent. */
bool relay_until_sent(kinbox_conf_t *conf, const char *url, long long n,
                      int timeout_s, kinbox_relay_stats_t *st);

/* Read every partition of topic from the start until want messages came
 * (then on, to see extras: until every message in the log was read, the
 * log's size asked after each linger_ms without a message) or timeout_s
 * passed. Callers have stopped every producer of the topic, so a
 * log read to its end holds every extra there is. */
void consume(const char *bootstrap, const char *topic, size_t want,
             int timeout_s, int linger_ms, tmsgs_t *out);

void msgs_free(tmsgs_t *m);

const tmsg_t *find_msgid(const tmsgs_t *m, const char *id);

size_t count_msgid(const tmsgs_t *m, const char *id);

/* How one key's payloads "0", "1", ... (appended in that order) may
 * follow each other on the topic, read back in offset order. */
typedef enum seq_rule {
        SEQ_ONCE, /* each once, in order: seq == last + 1 */
        SEQ_RISING, /* in order, gaps allowed: seq > last */
        SEQ_AGAIN, /* the last one may come again: seq == last or last + 1 */
        SEQ_COPIES, /* copies of older ones may follow (at-least-once): each
                     * seq first appears right after the one before */
} seq_rule_t;

typedef struct seqs {
        int last; /* the highest seq seen, -1: none */
        size_t n; /* messages of the key */
        size_t copies; /* of them, seqs seen before */
} seqs_t;

/* The messages of key in m keep rule (asserted). */
seqs_t key_seqs(const tmsgs_t *m, const char *key, seq_rule_t rule);

/* Keys PREFIX0 .. PREFIX(aggs - 1) each keep rule and reached seq
 * rows - 1 (asserted); returns how many messages they hold, *copies (may
 * be NULL) how many of those were copies. */
size_t aggs_seqs(const tmsgs_t *m, const char *prefix, int aggs, int rows,
                 seq_rule_t rule, size_t *copies);

void mock_start(mock_t *m, int brokers);

void mock_brokers(mock_t *m, int brokers, bool up);

void mock_stop(mock_t *m);

#endif
