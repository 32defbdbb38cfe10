/*
 * outbox_test.c -- the transactional outbox and its relay, on both
 * backends, against the real servers (issue 4's tests 1, 2, 4, 5, 6).
 *
 * Each test makes its own database (kt_fresh_db) and its own topics.
 * Tests that take brokers down run their own in-process librdkafka mock
 * cluster, so they never disturb other tests sharing the dev broker.
 */
#include "harness.h"

#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "db.h"

/* ------------------------------------------------------------ helpers */

typedef struct tconn {
        bool my;
        PGconn *pg;
        MYSQL *m;
        char *url;
} tconn_t;

static void
tc_open(tconn_t *c, const char *backend, const char *url)
{
        memset(c, 0, sizeof(*c));
        c->url = strdup(url);
        c->my = !strcmp(backend, "mysql");
        if (!c->my) {
                c->pg = PQconnectdb(url);
                cr_assert(PQstatus(c->pg) == CONNECTION_OK, "connect %s: %s",
                          url, PQerrorMessage(c->pg));
                return;
        }
        kinbox__dburl_t u;
        char e[256];
        cr_assert(kinbox__dburl_parse(url, &u, e, sizeof(e)) == 0, "%s", e);
        c->m = mysql_init(NULL);
        cr_assert(c->m != NULL);
        cr_assert(mysql_real_connect(c->m, u.host, u.user, u.password,
                                     u.dbname, (unsigned)u.port, NULL,
                                     0) != NULL,
                  "connect %s: %s", url, mysql_error(c->m));
        kinbox__dburl_free(&u);
}

static void
tc_close(tconn_t *c)
{
        if (c->pg)
                PQfinish(c->pg);
        if (c->m)
                mysql_close(c->m);
        free(c->url);
        memset(c, 0, sizeof(*c));
}

static void
tc_sql(tconn_t *c, const char *sql)
{
        if (!c->my) {
                PGresult *r = PQexec(c->pg, sql);
                ExecStatusType st = PQresultStatus(r);
                cr_assert(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK,
                          "%s: %s", sql, PQresultErrorMessage(r));
                PQclear(r);
                return;
        }
        cr_assert(mysql_query(c->m, sql) == 0, "%s: %s", sql,
                  mysql_error(c->m));
        MYSQL_RES *res = mysql_store_result(c->m);
        if (res)
                mysql_free_result(res);
}

static kinbox_err_t
tc_append(tconn_t *c, const kinbox_outbox_msg_t *m, int64_t *idp)
{
        char e[512];
        kinbox_err_t rc =
            c->my ? kinbox_outbox_append_mysql(c->m, m, idp, e, sizeof(e))
                  : kinbox_outbox_append_pg(c->pg, m, idp, e, sizeof(e));
        cr_assert(rc == KINBOX_OK || rc == KINBOX_ERR_DUPLICATE ||
                      rc == KINBOX_ERR_INVALID,
                  "append: %s: %s", kinbox_err_name(rc), e);
        return rc;
}

/* Text of the first column of the first row. */
static char *
qtext(const char *url, const char *sql)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        kinbox_rows_t *r = NULL;
        cr_assert(kinbox__db_query(db, sql, 0, NULL, &r) == 0, "%s: %s", sql,
                  db->err.msg);
        const char *v =
            kinbox_rows_count(r) ? kinbox_rows_value(r, 0, 0, NULL) : NULL;
        char *out = strdup(v ? v : "");
        kinbox_rows_destroy(r);
        kinbox__db_destroy(db);
        return out;
}

static bool wait_q(const char *url, long long want, int timeout_s,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool
wait_q(const char *url, long long want, int timeout_s, const char *fmt, ...)
{
        char sql[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        return kt_wait_qint(url, sql, want, timeout_s) == want;
}

static void
cset(kinbox_conf_t *c, const char *k, const char *v)
{
        char e[512];
        kinbox_err_t rc = kinbox_conf_set(c, k, v, e, sizeof(e));
        cr_assert(rc == KINBOX_OK, "conf %s=%s: %s", k, v, e);
}

/* Relay configuration with short test timings. */
static kinbox_conf_t *
relay_conf(const char *url, const char *bootstrap)
{
        kinbox_conf_t *c = kinbox_conf_new();
        cr_assert(c != NULL);
        cset(c, "name", "outbox-test");
        cset(c, "database.url", url);
        cset(c, "kafka.bootstrap.servers", bootstrap);
        cset(c, "relay.lease.ms", "5000");
        cset(c, "relay.poll.ms", "100");
        cset(c, "relay.backoff.base.ms", "50");
        cset(c, "relay.backoff.max.ms", "300");
        cset(c, "relay.action.timeout.ms", "1000");
        cset(c, "kafka.message.timeout.ms", "2000");
        /* One produce request in flight per broker connection. The mock
         * cluster does not check an idempotent producer's sequence numbers
         * (librdkafka validates them only for transactional producers), so
         * when an injected error fails request R1 while a later request R2
         * of the same partition succeeds, librdkafka concludes that R1 was
         * written (its implicit acknowledgement, right against a real
         * broker, which rejects R2 with OUT_OF_ORDER_SEQUENCE_NUMBER) and
         * reports R1's messages delivered though the mock never stored
         * them: outbox_order then finds an aggregate's second row on the
         * topic and never its first. Measured with an idempotent producer
         * and one injected REQUEST_TIMED_OUT: 9 of 15 runs lost a message
         * with 5 in flight, none of 15 with 1. A mock-only setting: on
         * real Kafka (KT_BROKER=kafka) the relay runs librdkafka's
         * default of 5, as users do. */
        if (!kt_real_kafka() || strcmp(bootstrap, kt_env("KINBOX_BOOTSTRAP")))
                cset(c, "kafka.max.in.flight.requests.per.connection", "1");
        /* KT_RELAY_PIPELINE=N runs every relay of the suite with
         * relay.pipeline N; KT_RELAY_LOG=debug shows each batch. */
        const char *pl = getenv("KT_RELAY_PIPELINE");
        if (pl && *pl)
                cset(c, "relay.pipeline", pl);
        /* KT_RELAY_CLAIM=lease|lock runs every relay of the suite with
         * that relay.claim (the default otherwise). */
        const char *cl = getenv("KT_RELAY_CLAIM");
        if (cl && *cl)
                cset(c, "relay.claim", cl);
        const char *ll = getenv("KT_RELAY_LOG");
        if (ll && *ll)
                cset(c, "log.level", ll);
        return c;
}

/* A lock-held relay (pipeline 1) in batches of 40, with lock_ms, the
 * producer's delivery deadline and the lease in milliseconds. */
static kinbox_conf_t *
lock_relay_conf(const char *url, const char *bootstrap, const char *lock_ms,
                const char *timeout_ms, const char *lease_ms)
{
        kinbox_conf_t *c = relay_conf(url, bootstrap);
        cset(c, "relay.claim", "lock");
        cset(c, "relay.pipeline", "1");
        cset(c, "relay.lock.ms", lock_ms);
        cset(c, "relay.batch.size", "40");
        cset(c, "kafka.message.timeout.ms", timeout_ms);
        cset(c, "relay.lease.ms", lease_ms);
        return c;
}

static kinbox_relay_t *
relay_new(kinbox_conf_t *c)
{
        char e[512];
        kinbox_relay_t *r = kinbox_relay_new(c, e, sizeof(e));
        cr_assert(r != NULL, "relay_new: %s", e);
        return r;
}

typedef struct trelay {
        kinbox_relay_t *r;
        pthread_t th;
        kinbox_err_t rc;
} trelay_t;

static void *
relay_main(void *arg)
{
        trelay_t *t = arg;
        t->rc = kinbox_relay_run(t->r);
        return NULL;
}

static void
relay_start(trelay_t *t, kinbox_relay_t *r)
{
        t->r = r;
        t->rc = KINBOX_OK;
        cr_assert(pthread_create(&t->th, NULL, relay_main, t) == 0);
}

static void
relay_stop(trelay_t *t)
{
        kinbox_relay_stop(t->r);
        pthread_join(t->th, NULL);
        cr_assert(t->rc == KINBOX_OK, "relay_run: %s: %s",
                  kinbox_err_name(t->rc), kinbox_relay_errstr(t->r));
}

/* ---- Kafka read-back */

typedef struct tmsg {
        char *key, *value;
        size_t value_size;
        int32_t partition;
        int64_t offset;
        char *msgid;
        rd_kafka_headers_t *hdrs;
} tmsg_t;

typedef struct tmsgs {
        tmsg_t *v;
        size_t n, cap;
} tmsgs_t;

static char *
dupn(const void *p, size_t n)
{
        if (!p)
                return NULL;
        char *s = malloc(n + 1);
        memcpy(s, p, n);
        s[n] = '\0';
        return s;
}

/* Messages in the log of every partition of topic (high - low watermark),
 * or -1 when the broker did not say. */
static long long
log_size(rd_kafka_t *rk, const char *topic, int parts)
{
        long long n = 0;
        for (int p = 0; p < parts; p++) {
                int64_t lo, hi;
                if (rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi,
                                                     5000))
                        return -1;
                n += hi - lo;
        }
        return n;
}

/* Read every partition of topic from the start until want messages came
 * (then on, to see extras: until every message in the log was read, the
 * log's size asked after each linger_ms without a message) or timeout_s
 * passed. Callers have stopped every producer of the topic, so a
 * log read to its end holds every extra there is. */
static void
consume(const char *bootstrap, const char *topic, size_t want, int timeout_s,
        int linger_ms, tmsgs_t *out)
{
        char e[512];
        memset(out, 0, sizeof(*out));
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, e, sizeof(e));
        rd_kafka_conf_set(c, "group.id", "outbox-test-reader", e, sizeof(e));
        rd_kafka_conf_set(c, "enable.auto.commit", "false", e, sizeof(e));
        rd_kafka_conf_set(c, "enable.partition.eof", "false", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        rd_kafka_poll_set_consumer(rk);

        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
        const rd_kafka_metadata_t *md = NULL;
        int parts = 0;
        for (int i = 0; i < 50 && parts == 0; i++) {
                if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) ==
                    RD_KAFKA_RESP_ERR_NO_ERROR) {
                        if (md->topic_cnt == 1 && !md->topics[0].err)
                                parts = md->topics[0].partition_cnt;
                        rd_kafka_metadata_destroy(md);
                }
                if (!parts)
                        usleep(100000);
        }
        rd_kafka_topic_destroy(rkt);
        cr_assert(parts > 0, "no metadata for topic %s", topic);
        rd_kafka_topic_partition_list_t *tl =
            rd_kafka_topic_partition_list_new(parts);
        for (int p = 0; p < parts; p++)
                rd_kafka_topic_partition_list_add(tl, topic, p)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        cr_assert(rd_kafka_assign(rk, tl) == 0);
        rd_kafka_topic_partition_list_destroy(tl);

        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        long long enough_at = -1;
        for (;;) {
                struct timespec t;
                clock_gettime(CLOCK_MONOTONIC, &t);
                long long ms = (t.tv_sec - t0.tv_sec) * 1000LL +
                               (t.tv_nsec - t0.tv_nsec) / 1000000;
                if (ms > timeout_s * 1000LL)
                        break;
                if (out->n >= want && enough_at < 0)
                        enough_at = ms;
                if (enough_at >= 0 && ms - enough_at >= linger_ms) {
                        /* Stop lingering only at the log's end: with
                         * re-published copies want can be reached before
                         * a slow partition's first fetch (a full CI run
                         * read 400 messages and no row of one
                         * aggregate). A size the broker did not tell in
                         * time (a loaded machine) is asked again; the
                         * timeout bounds the wait. */
                        long long sz = log_size(rk, topic, parts);
                        if (sz >= 0 && sz <= (long long)out->n)
                                break;
                        enough_at = ms;
                }
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
                /* Asked only when nothing came for a while: one round
                 * trip per partition, too slow to ask per message. */
                if (!m && enough_at >= 0 &&
                    log_size(rk, topic, parts) == (long long)out->n)
                        break;
                if (!m)
                        continue;
                if (m->err) {
                        rd_kafka_message_destroy(m);
                        continue;
                }
                if (out->n == out->cap) {
                        out->cap = out->cap ? out->cap * 2 : 64;
                        out->v = realloc(out->v, out->cap * sizeof(tmsg_t));
                }
                tmsg_t *x = &out->v[out->n++];
                memset(x, 0, sizeof(*x));
                x->key = dupn(m->key, m->key_len);
                x->value = dupn(m->payload, m->len);
                x->value_size = m->len;
                x->partition = m->partition;
                x->offset = m->offset;
                rd_kafka_headers_t *h = NULL;
                if (rd_kafka_message_headers(m, &h) == 0 && h) {
                        x->hdrs = rd_kafka_headers_copy(h);
                        const void *v;
                        size_t n;
                        if (rd_kafka_header_get_last(h, "message_id", &v,
                                                     &n) == 0)
                                x->msgid = dupn(v, n);
                }
                rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
}

static void
msgs_free(tmsgs_t *m)
{
        for (size_t i = 0; i < m->n; i++) {
                free(m->v[i].key);
                free(m->v[i].value);
                free(m->v[i].msgid);
                if (m->v[i].hdrs)
                        rd_kafka_headers_destroy(m->v[i].hdrs);
        }
        free(m->v);
        memset(m, 0, sizeof(*m));
}

static const tmsg_t *
find_msgid(const tmsgs_t *m, const char *id)
{
        for (size_t i = 0; i < m->n; i++)
                if (m->v[i].msgid && !strcmp(m->v[i].msgid, id))
                        return &m->v[i];
        return NULL;
}

static size_t
count_msgid(const tmsgs_t *m, const char *id)
{
        size_t k = 0;
        for (size_t i = 0; i < m->n; i++)
                if (m->v[i].msgid && !strcmp(m->v[i].msgid, id))
                        k++;
        return k;
}

/* ---- an in-process mock cluster (faults only this test sees) */

typedef struct mock {
        rd_kafka_t *rk;
        rd_kafka_mock_cluster_t *mc;
        const char *bootstrap;
} mock_t;

static void
mock_start(mock_t *m, int brokers)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "log_level", "0", e, sizeof(e));
        m->rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(m->rk != NULL, "%s", e);
        m->mc = rd_kafka_mock_cluster_new(m->rk, brokers);
        cr_assert(m->mc != NULL);
        m->bootstrap = rd_kafka_mock_cluster_bootstraps(m->mc);
}

static void
mock_brokers(mock_t *m, int brokers, bool up)
{
        for (int id = 1; id <= brokers; id++) {
                if (up)
                        rd_kafka_mock_broker_set_up(m->mc, id);
                else
                        rd_kafka_mock_broker_set_down(m->mc, id);
        }
}

static void
mock_stop(mock_t *m)
{
        rd_kafka_mock_cluster_destroy(m->mc);
        rd_kafka_destroy(m->rk);
}

/* ------------------------------------------------------------ test 1 */

/*
 * Rolled-back transaction → nothing published; committed → published
 * exactly as appended (key, headers, payload) with the message_id header;
 * a duplicate append is reported and leaves the transaction usable.
 */
KT_BACKENDS_PARAMS(outbox_publish, backends)
ParameterizedTest(int *bidx, outbox_publish, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_pub");
        kt_topic(topic, 4);
        tconn_t c;
        tc_open(&c, backend, url);

        static const unsigned char bin[] = {0x00, 0xff, 0x80, 'x'};
        kinbox_header_t hdrs[] = {
            {"trace", "abc-123", 7},
            {"binary", bin, sizeof(bin)},
            {"nullhdr", NULL, 0},
            {"trace", "second", 6},
        };

        /* Rolled back: never published. */
        tc_sql(&c, "BEGIN");
        kinbox_outbox_msg_t rb = {.destination = topic,
                                  .idem_key = "rolled-back",
                                  .aggregate_id = "order-9",
                                  .payload = "nope",
                                  .payload_size = 4};
        int64_t id = 0;
        cr_assert(eq(int, tc_append(&c, &rb, &id), KINBOX_OK));
        cr_assert(id > 0);
        tc_sql(&c, "ROLLBACK");

        /* Invalid messages are refused before any SQL. */
        kinbox_outbox_msg_t bad = {.destination = topic};
        cr_assert(eq(int, tc_append(&c, &bad, NULL), KINBOX_ERR_INVALID));
        kinbox_outbox_msg_t bad2 = {.destination = "action:", .idem_key = "k"};
        cr_assert(eq(int, tc_append(&c, &bad2, NULL), KINBOX_ERR_INVALID));

        /* Committed. */
        tc_sql(&c, "BEGIN");
        kinbox_outbox_msg_t m1 = {.destination = topic,
                                  .idem_key = "order-1-paid",
                                  .aggregate_id = "order-1",
                                  .payload = "{\"amount\":10}",
                                  .payload_size = 13,
                                  .headers = hdrs,
                                  .header_count = 4};
        kinbox_outbox_msg_t m2 = {.destination = topic,
                                  .idem_key = "order-1-shipped",
                                  .aggregate_id = "order-1",
                                  .payload = "\x01\x00\x02",
                                  .payload_size = 3};
        kinbox_outbox_msg_t m3 = {.destination = topic,
                                  .idem_key = "no-aggregate-null-payload"};
        int64_t id1 = 0, id2 = 0, id3 = 0, iddup = 0;
        cr_assert(eq(int, tc_append(&c, &m1, &id1), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &m2, &id2), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &m1, &iddup), KINBOX_ERR_DUPLICATE));
        cr_assert(eq(i64, iddup, id1));
        cr_assert(eq(int, tc_append(&c, &m3, &id3), KINBOX_OK));
        cr_assert(id1 < id2 && id2 < id3);
        tc_sql(&c, "COMMIT");
        /* A duplicate after commit too, with no id wanted. */
        tc_sql(&c, "BEGIN");
        cr_assert(eq(int, tc_append(&c, &m2, NULL), KINBOX_ERR_DUPLICATE));
        tc_sql(&c, "COMMIT");
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT count(*) FROM kinbox_outbox"), 3));

        kinbox_relay_t *r = relay_new(relay_conf(url, bootstrap));
        trelay_t tr;
        relay_start(&tr, r);
        bool ok = wait_q(url, 3, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        relay_stop(&tr);
        cr_assert(ok, "rows not sent in time");
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        cr_assert(eq(u64, st.published, 3));
        cr_assert(eq(u64, st.conflicts, 0));
        kinbox_relay_destroy(r);

        tmsgs_t got;
        consume(bootstrap, topic, 3, 30, 1500, &got);
        cr_assert(eq(sz, got.n, 3), "got %zu messages", got.n);

        char want[512];
        snprintf(want, sizeof(want), "%s:order-1-paid", topic);
        const tmsg_t *g1 = find_msgid(&got, want);
        cr_assert(g1 != NULL, "message_id %s missing", want);
        cr_assert(eq(str, g1->key, "order-1"));
        cr_assert(eq(sz, g1->value_size, 13));
        cr_assert(eq(int, memcmp(g1->value, "{\"amount\":10}", 13), 0));
        /* User headers in order, then message_id. */
        cr_assert(eq(sz, rd_kafka_header_cnt(g1->hdrs), 5));
        const char *expect_names[] = {"trace", "binary", "nullhdr", "trace",
                                      "message_id"};
        for (size_t i = 0; i < 5; i++) {
                const char *name;
                const void *v;
                size_t n;
                cr_assert(
                    rd_kafka_header_get_all(g1->hdrs, i, &name, &v, &n) == 0);
                cr_assert(eq(str, (char *)name, (char *)expect_names[i]));
                if (i == 1) {
                        cr_assert(eq(sz, n, sizeof(bin)));
                        cr_assert(eq(int, memcmp(v, bin, n), 0));
                }
                if (i == 2)
                        cr_assert(v == NULL);
                if (i == 3)
                        cr_assert(eq(int, memcmp(v, "second", 6), 0));
        }

        snprintf(want, sizeof(want), "%s:order-1-shipped", topic);
        const tmsg_t *g2 = find_msgid(&got, want);
        cr_assert(g2 != NULL);
        cr_assert(eq(sz, g2->value_size, 3));
        cr_assert(eq(int, memcmp(g2->value, "\x01\x00\x02", 3), 0));
        /* Same key, same partition, appended later → later offset. */
        cr_assert(eq(i32, g1->partition, g2->partition));
        cr_assert(g1->offset < g2->offset);

        snprintf(want, sizeof(want), "%s:no-aggregate-null-payload", topic);
        const tmsg_t *g3 = find_msgid(&got, want);
        cr_assert(g3 != NULL);
        cr_assert(g3->key == NULL);
        cr_assert(g3->value == NULL);

        snprintf(want, sizeof(want), "%s:rolled-back", topic);
        cr_assert(find_msgid(&got, want) == NULL);
        msgs_free(&got);
        tc_close(&c);
}

/* ------------------------------------------------------------ test 2 */

#define T2_ROWS 20000
#define T2_AGGS 1000

static volatile sig_atomic_t child_stop;
static kinbox_relay_t *child_relay;

static void
child_term(int sig)
{
        (void)sig;
        child_stop = 1;
        if (child_relay)
                kinbox_relay_stop(child_relay);
}

/* A forked relay process: runs until SIGTERM, writes its stats to fd. */
static pid_t
fork_relay(const char *url, const char *bootstrap, int fd)
{
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid > 0)
                return pid;
        kinbox_conf_t *c = kinbox_conf_new();
        char e[512];
        int bad = 0;
        bad |= kinbox_conf_set(c, "database.url", url, e, sizeof(e));
        bad |= kinbox_conf_set(c, "kafka.bootstrap.servers", bootstrap, e,
                               sizeof(e));
        bad |= kinbox_conf_set(c, "relay.lease.ms", "20000", e, sizeof(e));
        bad |= kinbox_conf_set(c, "relay.batch.size", "200", e, sizeof(e));
        bad |= kinbox_conf_set(c, "kafka.message.timeout.ms", "15000", e,
                               sizeof(e));
        bad |= kinbox_conf_set(c, "log.level", "warning", e, sizeof(e));
        if (bad)
                _exit(3);
        child_relay = kinbox_relay_new(c, e, sizeof(e));
        if (!child_relay) {
                fprintf(stderr, "relay_new: %s\n", e);
                _exit(4);
        }
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = child_term;
        sigaction(SIGTERM, &sa, NULL);
        kinbox_err_t rc = kinbox_relay_run(child_relay);
        kinbox_relay_stats_t st;
        kinbox_relay_stats(child_relay, &st);
        ssize_t w = write(fd, &st, sizeof(st));
        (void)w;
        kinbox_relay_destroy(child_relay);
        _exit(rc == KINBOX_OK ? 0 : 5);
}

/*
 * Two relay processes over 20,000 rows: every row published and marked
 * sent, no row published twice, per-aggregate order kept.
 */
KT_BACKENDS_PARAMS(outbox_two_relays, backends)
ParameterizedTest(int *bidx, outbox_two_relays, backends, .timeout = 400)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_two");
        kt_topic(topic, 8);
        /* Both relays are up before the rows come, so that neither can
         * drain the whole backlog before the other has started. */
        int fds[2];
        cr_assert(pipe(fds) == 0);
        pid_t p1 = fork_relay(url, bootstrap, fds[1]);
        pid_t p2 = fork_relay(url, bootstrap, fds[1]);
        usleep(1500 * 1000);
        tconn_t c;
        tc_open(&c, backend, url);
        for (int b = 0; b < T2_ROWS / 1000; b++) {
                tc_sql(&c, "BEGIN");
                for (int i = b * 1000; i < (b + 1) * 1000; i++) {
                        char key[32], agg[32], pay[64];
                        /* Aggregate a gets seq 0..19 in id order. */
                        int a = i % T2_AGGS, seq = i / T2_AGGS;
                        snprintf(key, sizeof(key), "e-%d", i);
                        snprintf(agg, sizeof(agg), "agg-%d", a);
                        int n = snprintf(pay, sizeof(pay), "%d", seq);
                        kinbox_outbox_msg_t m = {.destination = topic,
                                                 .idem_key = key,
                                                 .aggregate_id = agg,
                                                 .payload = pay,
                                                 .payload_size = (size_t)n};
                        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                }
                tc_sql(&c, "COMMIT");
        }
        tc_close(&c);
        bool ok = wait_q(url, T2_ROWS, 300,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        kill(p1, SIGTERM);
        kill(p2, SIGTERM);
        int s1 = kt_wait(p1, 60), s2 = kt_wait(p2, 60);
        close(fds[1]);
        kinbox_relay_stats_t st[2];
        memset(st, 0, sizeof(st));
        ssize_t rd = read(fds[0], st, sizeof(st));
        close(fds[0]);
        cr_assert(ok, "not all rows sent: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                "status = 'sent'"));
        cr_assert(eq(int, s1, 0));
        cr_assert(eq(int, s2, 0));
        cr_assert(eq(sz, (size_t)rd, sizeof(st)));
        cr_assert(eq(u64, st[0].published + st[1].published, T2_ROWS));
        cr_assert(eq(u64, st[0].conflicts + st[1].conflicts, 0));
        cr_assert(st[0].published > 0 && st[1].published > 0,
                  "one relay did all the work (%" PRIu64 "/%" PRIu64 ")",
                  st[0].published, st[1].published);

        tmsgs_t got;
        consume(bootstrap, topic, T2_ROWS, 120, 2000, &got);
        /* Exactly once each, unless a relay's statement failed (a MariaDB
         * deadlock between the two relays' lock-held marks, say): then the
         * batch it held was marked nothing and is published again
         * (at-least-once), so copies may follow, but every row is there
         * and per key each seq first appears right after the one before. */
        uint64_t dberr = st[0].db_errors + st[1].db_errors;
        if (!dberr)
                cr_assert(eq(sz, got.n, T2_ROWS), "published %zu", got.n);
        else
                cr_log_info("%s: %" PRIu64 " relay database errors, %zu "
                            "messages for %d rows",
                            backend, dberr, got.n, T2_ROWS);
        char *seen = calloc(T2_ROWS, 1);
        int *last = malloc(sizeof(int) * T2_AGGS);
        for (int a = 0; a < T2_AGGS; a++)
                last[a] = -1;
        for (size_t i = 0; i < got.n; i++) {
                const tmsg_t *m = &got.v[i];
                cr_assert(m->msgid != NULL);
                const char *e = strrchr(m->msgid, ':');
                cr_assert(e != NULL && !strncmp(e + 1, "e-", 2));
                int idx = atoi(e + 3);
                cr_assert(idx >= 0 && idx < T2_ROWS);
                cr_assert(dberr || seen[idx] == 0, "%s twice", m->msgid);
                seen[idx] = 1;
                int a = atoi(m->key + 4), seq = atoi(m->value);
                /* got is in partition/offset order per partition, and
                 * one key lives in one partition. */
                cr_assert(dberr ? seq <= last[a] + 1 : seq == last[a] + 1,
                          "agg %d: seq %d after %d", a, seq, last[a]);
                if (seq > last[a])
                        last[a] = seq;
        }
        for (int i = 0; i < T2_ROWS; i++)
                cr_assert(seen[i], "e-%d never on the topic", i);
        free(seen);
        free(last);
        msgs_free(&got);
}

/* ------------------------------------------------------------ test 4 */

static kinbox_outbox_status_t list_status;
static int
count_row(const kinbox_outbox_row_t *row, void *opaque)
{
        int *n = opaque;
        if (row->status == list_status && row->last_error != NULL &&
            row->attempts > 0)
                (*n)++;
        return 0;
}

/*
 * Broker unreachable, then back: attempts and backoff recorded, everything
 * published after recovery; rows past max_attempts are dead; requeue
 * publishes them.
 */
KT_BACKENDS_PARAMS(outbox_broker_down, backends)
ParameterizedTest(int *bidx, outbox_broker_down, backends, .timeout = 180)
{
        const char *backend = kt_backend(*bidx);
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_down");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 4, 1) == 0);
        mock_brokers(&mk, 3, false);

        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        for (int i = 0; i < 13; i++) {
                char key[32], agg[32];
                snprintf(key, sizeof(key), "k-%d", i);
                snprintf(agg, sizeof(agg), "a-%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = key,
                                         .aggregate_id = agg,
                                         .payload = key,
                                         .payload_size = strlen(key),
                                         /* 10 survive, 3 go dead */
                                         .max_attempts = i < 10 ? 1000 : 2};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        kinbox_conf_t *conf = relay_conf(url, mk.bootstrap);
        cset(conf, "kafka.message.timeout.ms", "800");
        cset(conf, "relay.lease.ms", "3000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);

        bool dead = wait_q(url, 3, 60,
                           "SELECT count(*) FROM kinbox_outbox WHERE "
                           "status = 'dead' AND attempts = 2 AND "
                           "last_error IS NOT NULL");
        bool tried = wait_q(url, 10, 30,
                            "SELECT count(*) FROM kinbox_outbox WHERE "
                            "status = 'pending' AND attempts >= 2 AND "
                            "last_error IS NOT NULL");
        cr_assert(dead, "rows past max_attempts are not dead");
        cr_assert(tried, "failed attempts not recorded");
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT count(*) FROM kinbox_outbox "
                                   "WHERE status = 'sent'"),
                     0));
        /* The operator's view of it. */
        char e[512];
        kinbox_conf_t *ac = kinbox_conf_new();
        cset(ac, "database.url", url);
        kinbox_admin_t *adm = kinbox_admin_new(ac, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        kinbox_conf_destroy(ac);
        int ndead = 0;
        list_status = KINBOX_OUTBOX_DEAD;
        cr_assert(eq(int,
                     kinbox_outbox_list(adm, KINBOX_OUTBOX_DEAD, topic, 0, 100,
                                        count_row, &ndead),
                     KINBOX_OK));
        cr_assert(eq(int, ndead, 3));

        mock_brokers(&mk, 3, true);
        bool sent = wait_q(url, 10, 60,
                           "SELECT count(*) FROM kinbox_outbox WHERE "
                           "status = 'sent'");
        cr_assert(sent, "not published after the brokers came back");

        uint64_t n = 0;
        cr_assert(eq(int, kinbox_outbox_requeue_destination(adm, topic, &n),
                     KINBOX_OK),
                  "%s", kinbox_admin_errstr(adm));
        cr_assert(eq(u64, n, 3));
        sent = wait_q(url, 13, 30,
                      "SELECT count(*) FROM kinbox_outbox WHERE "
                      "status = 'sent'");
        relay_stop(&tr);
        cr_assert(sent, "requeued rows not published");
        /* Requeue of a row that is not dead: NOT_FOUND. */
        cr_assert(
            eq(int, kinbox_outbox_requeue(adm, 1), KINBOX_ERR_NOT_FOUND));
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        cr_assert(st.retried >= 20);
        cr_assert(eq(u64, st.dead, 3));
        kinbox_relay_destroy(r);
        kinbox_admin_destroy(adm);

        tmsgs_t got;
        consume(mk.bootstrap, topic, 13, 30, 500, &got);
        for (int i = 0; i < 13; i++) {
                char id[300];
                snprintf(id, sizeof(id), "%s:k-%d", topic, i);
                cr_assert(count_msgid(&got, id) >= 1, "%s missing", id);
        }
        msgs_free(&got);
        mock_stop(&mk);
}

/* ------------------------------------------------------------ test 6 */

typedef struct actctx {
        atomic_int pay, slow, nope, stuck;
        atomic_int bad_args;
} actctx_t;

static kinbox_result_t
act_pay(kinbox_action_t *a, void *opaque)
{
        actctx_t *x = opaque;
        size_t n = 0;
        const void *p = kinbox_action_payload(a, &n);
        if (strcmp(kinbox_action_idem_key(a), "pay-order-7") ||
            strcmp(kinbox_action_name(a), "pay") || n != 9 ||
            memcmp(p, "channel-7", 9) ||
            strcmp(kinbox_action_aggregate_id(a), "order-7") ||
            kinbox_action_header_count(a) != 1)
                atomic_fetch_add(&x->bad_args, 1);
        int k = atomic_fetch_add(&x->pay, 1) + 1;
        if (kinbox_action_attempt(a) != k)
                atomic_fetch_add(&x->bad_args, 1);
        if (k <= 2) {
                kinbox_action_set_error(a, "channel busy (try %d)", k);
                return KINBOX_RESULT_RETRY;
        }
        return KINBOX_RESULT_OK;
}

static kinbox_result_t
act_slow(kinbox_action_t *a, void *opaque)
{
        actctx_t *x = opaque;
        (void)a;
        if (atomic_fetch_add(&x->slow, 1) == 0)
                usleep(1500 * 1000); /* past relay.action.timeout.ms */
        return KINBOX_RESULT_OK;
}

static kinbox_result_t
act_nope(kinbox_action_t *a, void *opaque)
{
        actctx_t *x = opaque;
        atomic_fetch_add(&x->nope, 1);
        kinbox_action_set_error(a, "unknown channel order");
        return KINBOX_RESULT_REJECT;
}

/*
 * Local actions: fails twice, then OK; times out → retried; REJECT → dead
 * (and requeue runs it again); cancel stops a pending one.
 */
KT_BACKENDS_PARAMS(outbox_actions, backends)
ParameterizedTest(int *bidx, outbox_actions, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        tconn_t c;
        tc_open(&c, backend, url);
        kinbox_header_t h = {"channel", "alipay", 6};
        kinbox_outbox_msg_t pay = {.destination = "action:pay",
                                   .idem_key = "pay-order-7",
                                   .aggregate_id = "order-7",
                                   .payload = "channel-7",
                                   .payload_size = 9,
                                   .headers = &h,
                                   .header_count = 1};
        kinbox_outbox_msg_t slow = {.destination = "action:slow",
                                    .idem_key = "slow-1"};
        kinbox_outbox_msg_t nope = {.destination = "action:nope",
                                    .idem_key = "nope-1"};
        kinbox_outbox_msg_t later = {.destination = "action:unregistered",
                                     .idem_key = "later-1",
                                     .max_attempts = 1000};
        int64_t idpay, idslow, idnope, idlater;
        tc_sql(&c, "BEGIN");
        cr_assert(eq(int, tc_append(&c, &pay, &idpay), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &slow, &idslow), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &nope, &idnope), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &later, &idlater), KINBOX_OK));
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        actctx_t x;
        memset(&x, 0, sizeof(x));
        kinbox_conf_t *conf = relay_conf(url, bootstrap);
        cset(conf, "relay.action.timeout.ms", "500");
        cset(conf, "kafka.message.timeout.ms", "1000");
        cset(conf, "relay.lease.ms", "3000");
        kinbox_relay_t *r = relay_new(conf);
        cr_assert(eq(int, kinbox_relay_register_action(r, "pay", act_pay, &x),
                     KINBOX_OK));
        cr_assert(eq(int,
                     kinbox_relay_register_action(r, "slow", act_slow, &x),
                     KINBOX_OK));
        cr_assert(eq(int,
                     kinbox_relay_register_action(r, "nope", act_nope, &x),
                     KINBOX_OK));
        trelay_t tr;
        relay_start(&tr, r);

        bool done = wait_q(url, 3, 60,
                           "SELECT count(*) FROM kinbox_outbox WHERE "
                           "status <> 'pending' AND id IN (%" PRId64
                           ",%" PRId64 ",%" PRId64 ")",
                           idpay, idslow, idnope);
        cr_assert(done, "actions did not finish");

        char sql[256], *s;
        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idpay);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "sent"));
        free(s);
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT attempts FROM kinbox_outbox "
                              "WHERE id = %" PRId64,
                              idpay),
                     2));
        snprintf(sql, sizeof(sql),
                 "SELECT last_error FROM kinbox_outbox WHERE id = %" PRId64,
                 idpay);
        s = qtext(url, sql);
        cr_assert(strstr(s, "channel busy (try 2)") != NULL, "%s", s);
        free(s);
        cr_assert(eq(int, atomic_load(&x.pay), 3));
        cr_assert(eq(int, atomic_load(&x.bad_args), 0));

        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idslow);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "sent"));
        free(s);
        snprintf(sql, sizeof(sql),
                 "SELECT last_error FROM kinbox_outbox WHERE id = %" PRId64,
                 idslow);
        s = qtext(url, sql);
        cr_assert(strstr(s, "timed out") != NULL, "%s", s);
        free(s);
        cr_assert(eq(int, atomic_load(&x.slow), 2));

        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idnope);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "dead"));
        free(s);
        cr_assert(eq(int, atomic_load(&x.nope), 1));

        /* Requeue the dead one: it runs again (and is rejected again). */
        char e[512];
        kinbox_conf_t *ac = kinbox_conf_new();
        cset(ac, "database.url", url);
        kinbox_admin_t *adm = kinbox_admin_new(ac, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        kinbox_conf_destroy(ac);
        cr_assert(eq(int, kinbox_outbox_requeue(adm, idnope), KINBOX_OK), "%s",
                  kinbox_admin_errstr(adm));
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE id = "
                         "%" PRId64 " AND status = 'dead' AND attempts = 1",
                         idnope));
        cr_assert(eq(int, atomic_load(&x.nope), 2));

        /* The unregistered action keeps failing until canceled. */
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE id = "
                         "%" PRId64 " AND attempts >= 2",
                         idlater));
        cr_assert(eq(int, kinbox_outbox_cancel(adm, idlater), KINBOX_OK), "%s",
                  kinbox_admin_errstr(adm));
        cr_assert(
            eq(int, kinbox_outbox_cancel(adm, idlater), KINBOX_ERR_NOT_FOUND));
        usleep(700 * 1000);
        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idlater);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "canceled"));
        free(s);

        relay_stop(&tr);
        kinbox_admin_destroy(adm);
        kinbox_relay_destroy(r); /* waits for the abandoned slow call */
}

/* ------------------------------------------------------------ test 5 */

#define T5_AGGS 500
#define T5_EVENTS 20

typedef struct stuckctx {
        char *url;
        atomic_int calls;
        atomic_int others_done_when_ok;
} stuckctx_t;

/* Head of aggregate "agg-stuck": keeps failing until every other
 * aggregate is fully sent, which can only happen if they kept flowing. */
static kinbox_result_t
act_stuck(kinbox_action_t *a, void *opaque)
{
        stuckctx_t *x = opaque;
        atomic_fetch_add(&x->calls, 1);
        long long others =
            kt_qint(x->url, "SELECT count(*) FROM kinbox_outbox WHERE "
                            "status = 'sent' AND aggregate_id <> "
                            "'agg-stuck'");
        if (others < T5_AGGS * T5_EVENTS) {
                kinbox_action_set_error(a, "blocked on purpose (%lld sent)",
                                        others);
                return KINBOX_RESULT_RETRY;
        }
        atomic_store(&x->others_done_when_ok, 1);
        return KINBOX_RESULT_OK;
}

/*
 * 500 aggregates × 20 events with produce errors and a broker outage
 * injected, plus one aggregate whose head keeps failing: every aggregate's
 * events arrive in order, and the others flow while that one fails.
 */
KT_BACKENDS_PARAMS(outbox_order, backends)
ParameterizedTest(int *bidx, outbox_order, backends, .timeout = 300)
{
        const char *backend = kt_backend(*bidx);
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_order");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 16, 1) == 0);

        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        /* The stuck aggregate: an action first, then 3 events. */
        kinbox_outbox_msg_t head = {.destination = "action:stuck",
                                    .idem_key = "stuck-head",
                                    .aggregate_id = "agg-stuck",
                                    .max_attempts = 100000};
        cr_assert(eq(int, tc_append(&c, &head, NULL), KINBOX_OK));
        for (int seq = 0; seq < T5_EVENTS; seq++) {
                for (int a = 0; a < T5_AGGS; a++) {
                        char key[48], agg[32], pay[16];
                        snprintf(key, sizeof(key), "a%d-s%d", a, seq);
                        snprintf(agg, sizeof(agg), "agg-%d", a);
                        int n = snprintf(pay, sizeof(pay), "%d", seq);
                        kinbox_outbox_msg_t m = {.destination = topic,
                                                 .idem_key = key,
                                                 .aggregate_id = agg,
                                                 .payload = pay,
                                                 .payload_size = (size_t)n,
                                                 .max_attempts = 1000};
                        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                }
                if (seq < 3) {
                        char key[32], pay[16];
                        snprintf(key, sizeof(key), "stuck-s%d", seq);
                        int n = snprintf(pay, sizeof(pay), "%d", seq);
                        kinbox_outbox_msg_t m = {.destination = topic,
                                                 .idem_key = key,
                                                 .aggregate_id = "agg-stuck",
                                                 .payload = pay,
                                                 .payload_size = (size_t)n};
                        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                }
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        /* Retriable produce errors: handled inside the idempotent
         * producer, order kept. */
        rd_kafka_mock_push_request_errors(
            mk.mc, 0 /* Produce */, 6,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT);

        stuckctx_t sx;
        memset(&sx, 0, sizeof(sx));
        sx.url = url;
        kinbox_conf_t *conf = relay_conf(url, mk.bootstrap);
        cset(conf, "kafka.message.timeout.ms", "1000");
        cset(conf, "relay.lease.ms", "4000");
        cset(conf, "relay.action.timeout.ms", "2000");
        kinbox_relay_t *r = relay_new(conf);
        cr_assert(eq(int,
                     kinbox_relay_register_action(r, "stuck", act_stuck, &sx),
                     KINBOX_OK));
        trelay_t tr;
        relay_start(&tr, r);
        /* A broker outage in the middle: delivery failures reach the
         * relay (message timeouts) and are retried with backoff. */
        wait_q(url, 1, 30,
               "SELECT CASE WHEN count(*) >= 2000 THEN 1 ELSE 0 END FROM "
               "kinbox_outbox WHERE status = 'sent'");
        mock_brokers(&mk, 3, false);
        usleep(2500 * 1000);
        mock_brokers(&mk, 3, true);

        int total = T5_AGGS * T5_EVENTS + 4;
        bool ok = wait_q(url, total, 240,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        relay_stop(&tr);
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        kinbox_relay_destroy(r);
        cr_assert(ok, "not all sent: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                "status = 'sent'"));
        cr_assert(eq(int, atomic_load(&sx.others_done_when_ok), 1));
        cr_assert(atomic_load(&sx.calls) >= 2);
        cr_assert(st.retried >= 1, "no failure was injected");

        tmsgs_t got;
        consume(mk.bootstrap, topic, (size_t)total - 1, 60, 1000, &got);
        /* Per key: each seq first appears right after the one before it
         * (no gap, nothing overtakes an older row). A seq seen already is
         * a re-published copy: at-least-once after a delivery that timed
         * out in flight (the broker outage above) publishes the run again
         * from its first unconfirmed row, so copies of 6 and 7 may follow
         * 7. */
        int *last = malloc(sizeof(int) * (T5_AGGS + 1));
        for (int a = 0; a <= T5_AGGS; a++)
                last[a] = -1;
        for (size_t i = 0; i < got.n; i++) {
                const tmsg_t *m = &got.v[i];
                int a =
                    !strcmp(m->key, "agg-stuck") ? T5_AGGS : atoi(m->key + 4);
                int seq = atoi(m->value);
                cr_assert(seq <= last[a] + 1, "%s: seq %d first seen after %d",
                          m->key, seq, last[a]);
                if (seq > last[a])
                        last[a] = seq;
        }
        for (int a = 0; a < T5_AGGS; a++)
                cr_assert(eq(int, last[a], T5_EVENTS - 1), "agg %d", a);
        cr_assert(eq(int, last[T5_AGGS], 2));
        free(last);
        msgs_free(&got);
        mock_stop(&mk);
}

/*
 * relay.pipeline = 2 and a batch that stalls: the row of aggregate "slow"
 * goes to a partition whose leader is down, the other aggregates' runs to
 * live brokers that take 300 ms to answer (their produce requests are
 * written on arrival and stay in flight that long). The stalled batch's
 * delivery deadline must not fail the rows of the younger batches still
 * in flight: those may already be on the topic, and publishing their runs
 * again would put an older row after a newer one ("seq 0 after 1").
 */
#define PP_AGGS 24
#define PP_EVENTS 16

KT_BACKENDS_PARAMS(outbox_pipeline_stall, backends)
ParameterizedTest(int *bidx, outbox_pipeline_stall, backends, .timeout = 300)
{
        const char *backend = kt_backend(*bidx);
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(backend);
        char *live = kt_unique("obx_live");
        char *dead = kt_unique("obx_stall");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, live, 4, 1) == 0);
        cr_assert(rd_kafka_mock_topic_create(mk.mc, dead, 1, 1) == 0);
        for (int p = 0; p < 4; p++)
                rd_kafka_mock_partition_set_leader(mk.mc, live, p, 2 + p % 2);
        rd_kafka_mock_partition_set_leader(mk.mc, dead, 0, 1);
        rd_kafka_mock_broker_set_rtt(mk.mc, 2, 300);
        rd_kafka_mock_broker_set_rtt(mk.mc, 3, 300);
        rd_kafka_mock_broker_set_down(mk.mc, 1);

        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        /* Blocks of 8 rows per aggregate, "slow" first: a claim of 40
         * finds 10 heads in its window of 80 rows and takes a run of 4 of
         * each (a full claim: the next one follows at once). */
        for (int seq = 0; seq < 8; seq++) {
                char key[16], pay[16];
                snprintf(key, sizeof(key), "slow-%d", seq);
                int n = snprintf(pay, sizeof(pay), "%d", seq);
                kinbox_outbox_msg_t m = {.destination = dead,
                                         .idem_key = key,
                                         .aggregate_id = "slow",
                                         .payload = pay,
                                         .payload_size = (size_t)n,
                                         .max_attempts = 100000};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        for (int b = 0; b < PP_EVENTS / 8; b++) {
                for (int a = 0; a < PP_AGGS; a++) {
                        for (int seq = 8 * b; seq < 8 * b + 8; seq++) {
                                char key[48], agg[32], pay[16];
                                snprintf(key, sizeof(key), "a%d-s%d", a, seq);
                                snprintf(agg, sizeof(agg), "agg-%d", a);
                                int n = snprintf(pay, sizeof(pay), "%d", seq);
                                kinbox_outbox_msg_t m = {
                                    .destination = live,
                                    .idem_key = key,
                                    .aggregate_id = agg,
                                    .payload = pay,
                                    .payload_size = (size_t)n,
                                    .max_attempts = 100000};
                                cr_assert(eq(int, tc_append(&c, &m, NULL),
                                             KINBOX_OK));
                        }
                }
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        kinbox_conf_t *conf = relay_conf(url, mk.bootstrap);
        if (!getenv("KT_RELAY_PIPELINE"))
                cset(conf, "relay.pipeline", "2");
        cset(conf, "relay.batch.size", "40");
        cset(conf, "kafka.message.timeout.ms", "1000");
        cset(conf, "relay.lease.ms", "4000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        int total = PP_AGGS * PP_EVENTS;
        bool ok = wait_q(url, total, 120,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent' AND aggregate_id <> 'slow'");
        rd_kafka_mock_broker_set_up(mk.mc, 1);
        ok = ok && wait_q(url, total + 8, 60,
                          "SELECT count(*) FROM kinbox_outbox WHERE "
                          "status = 'sent'");
        relay_stop(&tr);
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        kinbox_relay_destroy(r);
        cr_assert(ok, "not all sent: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                "status = 'sent'"));
        cr_assert(st.retried >= 1, "the slow row never timed out");

        tmsgs_t got;
        consume(mk.bootstrap, live, (size_t)total, 60, 1000, &got);
        int last[PP_AGGS];
        for (int a = 0; a < PP_AGGS; a++)
                last[a] = -1;
        size_t dups = 0;
        for (size_t i = 0; i < got.n; i++) {
                const tmsg_t *m = &got.v[i];
                int a = atoi(m->key + 4), seq = atoi(m->value);
                cr_assert(a >= 0 && a < PP_AGGS);
                cr_assert(seq == last[a] + 1 || seq == last[a],
                          "%s: seq %d after %d", m->key, seq, last[a]);
                dups += seq == last[a];
                last[a] = seq;
        }
        for (int a = 0; a < PP_AGGS; a++)
                cr_assert(eq(int, last[a], PP_EVENTS - 1), "agg %d", a);
        cr_log_info("%zu messages, %zu duplicates, %" PRIu64 " retried", got.n,
                    dups, st.retried);
        msgs_free(&got);
        mock_stop(&mk);
}

/* ------------------------------------------------------------ hop by hop */

typedef struct hopctx {
        const char *out_topic;
        atomic_int calls, dup_seen, bad;
} hopctx_t;

/* Each input message emits its next event in the consumer's transaction:
 * pipelined (no id wanted) for most, with an id (one round trip, and a
 * duplicate reported) for every 10th. */
static kinbox_result_t
hop_handler(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        hopctx_t *x = opaque;
        atomic_fetch_add(&x->calls, 1);
        char idem[300];
        snprintf(idem, sizeof(idem), "next-%s", kinbox_msg_id(msg));
        size_t n = 0;
        const void *p = kinbox_msg_payload(msg, &n);
        kinbox_outbox_msg_t m = {.destination = x->out_topic,
                                 .idem_key = idem,
                                 .aggregate_id = "hop",
                                 .payload = p,
                                 .payload_size = n};
        int seq = atoi(p ? (const char *)p : "0");
        if (seq % 10 == 0) {
                int64_t id = 0, id2 = 0;
                kinbox_err_t rc = kinbox_outbox_append(tx, &m, &id);
                if (rc != KINBOX_OK || id <= 0)
                        atomic_fetch_add(&x->bad, 1);
                rc = kinbox_outbox_append(tx, &m, &id2);
                if (rc == KINBOX_ERR_DUPLICATE && id2 == id)
                        atomic_fetch_add(&x->dup_seen, 1);
                else
                        atomic_fetch_add(&x->bad, 1);
        } else {
                if (kinbox_outbox_append(tx, &m, NULL) != KINBOX_OK)
                        atomic_fetch_add(&x->bad, 1);
                /* A queued duplicate is a no-op, not an error. */
                if (kinbox_outbox_append(tx, &m, NULL) != KINBOX_OK)
                        atomic_fetch_add(&x->bad, 1);
        }
        return KINBOX_RESULT_OK;
}

/*
 * kinbox_outbox_append inside a handler transaction: the next event
 * commits with the inbox row; redelivered input adds nothing; the relay
 * publishes every event once, in order.
 */
KT_BACKENDS_PARAMS(outbox_hop, backends)
ParameterizedTest(int *bidx, outbox_hop, backends, .timeout = 180)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *in = kt_unique("obx_hop_in");
        char *out = kt_unique("obx_hop_out");
        char *group = kt_unique("obx_hop_g");
        kt_topic(in, 1);
        kt_topic(out, 1);
        const int N = 50;
        kt_producer_t *p = kt_producer_new();
        for (int i = 0; i < N; i++) {
                char id[32], pay[16];
                snprintf(id, sizeof(id), "in-%d", i);
                snprintf(pay, sizeof(pay), "%d", i);
                kt_produce(p, in, 0, "k", pay, id);
                if (i % 7 == 0) /* redelivered duplicates */
                        kt_produce(p, in, 0, "k", pay, id);
        }
        kt_producer_flush_destroy(p);

        hopctx_t x;
        memset(&x, 0, sizeof(x));
        x.out_topic = out;
        kinbox_conf_t *cc = kt_conf(url, "hop", group, in);
        kt_run_t *run = kt_run_start(cc, hop_handler, NULL, &x);
        bool ok = wait_q(url, N, 60, "SELECT count(*) FROM kinbox_outbox");
        kt_run_stop(run);
        cr_assert(ok, "outbox rows: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox"));
        cr_assert(eq(int, atomic_load(&x.bad), 0));
        cr_assert(atomic_load(&x.dup_seen) >= N / 10);

        kinbox_relay_t *r = relay_new(relay_conf(url, bootstrap));
        trelay_t tr;
        relay_start(&tr, r);
        ok = wait_q(url, N, 30,
                    "SELECT count(*) FROM kinbox_outbox WHERE "
                    "status = 'sent'");
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        cr_assert(ok);

        tmsgs_t got;
        consume(bootstrap, out, (size_t)N, 30, 1000, &got);
        cr_assert(eq(sz, got.n, (size_t)N));
        for (size_t i = 0; i < got.n; i++)
                cr_assert(eq(int, atoi(got.v[i].value), (int)i),
                          "order broken at %zu", i);
        msgs_free(&got);
}

/* ------------------------------------------------------------ issue 11 */

/* Rows of a query as one text ("a|b\n" per row), for plan checks. */
static char *
qall(const char *url, const char *sql)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        kinbox_rows_t *r = NULL;
        cr_assert(kinbox__db_query(db, sql, 0, NULL, &r) == 0, "%s: %s", sql,
                  db->err.msg);
        size_t cap = 1 << 16, len = 0;
        char *out = calloc(cap, 1);
        for (size_t i = 0; i < kinbox_rows_count(r); i++) {
                for (int c = 0; c < r->ncols; c++) {
                        const char *v = kinbox_rows_value(r, i, c, NULL);
                        len += (size_t)snprintf(out + len, cap - len, "%s%s",
                                                c ? "|" : "", v ? v : "");
                        if (len >= cap - 1)
                                break;
                }
                if (len < cap - 1)
                        len += (size_t)snprintf(out + len, cap - len, "\n");
        }
        kinbox_rows_destroy(r);
        kinbox__db_destroy(db);
        return out;
}

static const char *
my_or_pg(const char *backend, const char *my, const char *pg)
{
        return strcmp(backend, "mysql") ? pg : my;
}

static const struct kinbox__outbox_ops *
ob_ops(const char *backend)
{
        return strcmp(backend, "mysql") ? &kinbox__pg_outbox_ops
                                        : &kinbox__mysql_outbox_ops;
}

/*
 * The claim walks the pending-rows index only, whatever the statistics
 * say: 200,000 sent + 20,000 pending rows analyzed; and a table analyzed
 * while every row was pending, most of which were sent since (stale
 * statistics that made the old claim walk the primary key).
 */
KT_BACKENDS_PARAMS(outbox_claim_plan, backends)
ParameterizedTest(int *bidx, outbox_claim_plan, backends, .timeout = 300)
{
        const char *backend = kt_backend(*bidx);
        bool my = !strcmp(backend, "mysql");
        char *url = kt_fresh_db(backend);
        const char *scan = ob_ops(backend)->heads_scan;
        char sql[2048];
        for (int phase = 0; phase < 2; phase++) {
                kt_exec(url, "DELETE FROM kinbox_outbox");
                const char *status = phase == 0 ? "'sent'" : "'pending'";
                int n = phase == 0 ? 200000 : 100000;
                snprintf(sql, sizeof(sql),
                         my ? "INSERT INTO kinbox_outbox (destination, "
                              "idem_key, aggregate_id, status) SELECT 't', "
                              "CONCAT('k', seq), CONCAT('a', seq %% 1000), "
                              "%s FROM seq_1_to_%d"
                            : "INSERT INTO kinbox_outbox (destination, "
                              "idem_key, aggregate_id, status) SELECT 't', "
                              "'k' || i, 'a' || (i %% 1000), %s "
                              "FROM generate_series(1, %d) i",
                         status, n);
                kt_exec(url, sql);
                if (phase == 0) {
                        snprintf(sql, sizeof(sql),
                                 my ? "INSERT INTO kinbox_outbox (destination,"
                                      " idem_key, aggregate_id) SELECT 't', "
                                      "CONCAT('p', seq), CONCAT('a', seq %% "
                                      "1000) FROM seq_1_to_20000"
                                    : "INSERT INTO kinbox_outbox (destination,"
                                      " idem_key, aggregate_id) SELECT 't', "
                                      "'p' || i, 'a' || (i %% 1000) FROM "
                                      "generate_series(1, 20000) i");
                        kt_exec(url, sql);
                }
                kt_exec(url, my ? "ANALYZE TABLE kinbox_outbox"
                                : "ANALYZE kinbox_outbox");
                if (phase == 1)
                        kt_exec(url, "UPDATE kinbox_outbox SET status = 'sent'"
                                     " WHERE id % 10 <> 0");
                snprintf(sql, sizeof(sql), "EXPLAIN %s", scan);
                char *plan = qall(url, sql);
                if (my) {
                        /* id|select_type|table|type|possible_keys|key|... */
                        char *row = strstr(plan, "|o|");
                        cr_assert(row != NULL, "plan:\n%s", plan);
                        char *eol = strchr(row, '\n');
                        if (eol)
                                *eol = '\0';
                        cr_assert(strstr(row, "kinbox_outbox_pending") !=
                                          NULL &&
                                      strstr(row, "Using index") != NULL,
                                  "phase %d: the walk is not index-only on "
                                  "kinbox_outbox_pending: %s",
                                  phase, row);
                        cr_assert(strstr(row, "Using filesort") == NULL,
                                  "phase %d: sorts: %s", phase, row);
                } else {
                        cr_assert(strstr(plan, "Index Only Scan using "
                                               "kinbox_outbox_pending on "
                                               "kinbox_outbox o") != NULL,
                                  "phase %d plan:\n%s", phase, plan);
                        cr_assert(
                            strstr(plan, "kinbox_outbox_pkey") == NULL &&
                                strstr(plan, "Seq Scan on kinbox_outbox o") ==
                                    NULL,
                            "phase %d plan:\n%s", phase, plan);
                }
                free(plan);
        }
}

/* A lease taken over: the first owner's marks change nothing (counted as
 * conflicts), the new owner's marks land; the row is sent once. */
KT_BACKENDS_PARAMS(outbox_cas_takeover, backends)
ParameterizedTest(int *bidx, outbox_cas_takeover, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        char *url = kt_fresh_db(backend);
        tconn_t c;
        tc_open(&c, backend, url);
        for (int i = 0; i < 5; i++) {
                char key[16];
                snprintf(key, sizeof(key), "k%d", i);
                kinbox_outbox_msg_t m = {.destination = "t",
                                         .idem_key = key,
                                         .aggregate_id = "one"};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        tc_close(&c);
        char e[512];
        kinbox__db_t *a = kinbox__db_new(url, NULL, e, sizeof(e));
        kinbox__db_t *b = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(a && b && !kinbox__db_connect(a) && !kinbox__db_connect(b));
        /* A claims the whole run with a lease that is over at once. */
        kinbox__claim_req_t ra = {100, 0, "relay-a", 100, 0, false, 0, 0},
                            rb = {100, 60000, "relay-b", 100, 0, false, 0, 0};
        struct kinbox_rows_s *ca = NULL, *cb = NULL;
        cr_assert(eq(int, a->ops->outbox->claim(a, &ra, &ca), 0), "%s",
                  a->err.msg);
        cr_assert(eq(sz, ca->nrows, 5), "the run of 5 rows in one claim");
        usleep(20 * 1000);
        cr_assert(eq(int, b->ops->outbox->claim(b, &rb, &cb), 0), "%s",
                  b->err.msg);
        cr_assert(eq(sz, cb->nrows, 5));
        int64_t ids[5], va[5], vb[5];
        for (int i = 0; i < 5; i++) {
                ids[i] = atoll(ca->values[i * (size_t)ca->ncols]);
                va[i] = atoll(ca->values[i * (size_t)ca->ncols + 1]);
                vb[i] = atoll(cb->values[i * (size_t)cb->ncols + 1]);
                cr_assert(strcmp(cb->values[i * (size_t)cb->ncols +
                                            KINBOX__CL_RECLAIMED],
                                 my_or_pg(backend, "1", "t")) == 0,
                          "row %d not reported as reclaimed", i);
        }
        uint64_t done = 99;
        cr_assert(eq(int, a->ops->outbox->mark_sent(a, 5, ids, va, &done), 0));
        cr_assert(eq(u64, done, 0), "A overwrote B's rows");
        cr_assert(eq(
            int, a->ops->outbox->fail(a, ids[0], va[0], true, "x", 0, &done),
            0));
        cr_assert(eq(u64, done, 0));
        cr_assert(eq(int, b->ops->outbox->mark_sent(b, 5, ids, vb, &done), 0));
        cr_assert(eq(u64, done, 5));
        cr_assert(eq(int, b->ops->outbox->mark_sent(b, 5, ids, vb, &done), 0));
        cr_assert(eq(u64, done, 0), "marked twice");
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent' AND attempts = 0"),
                     5));
        kinbox_rows_destroy(ca);
        kinbox_rows_destroy(cb);
        kinbox__db_destroy(a);
        kinbox__db_destroy(b);
}

/* ------------------------------------------------ lock-held claims */

/* The idem_keys of a claim's rows, sorted, joined by ','. */
static char *
claim_keys(struct kinbox_rows_s *rows)
{
        size_t n = rows ? rows->nrows : 0;
        char **k = calloc(n + 1, sizeof(*k));
        for (size_t i = 0; i < n; i++)
                k[i] = rows->values[i * (size_t)rows->ncols +
                                    KINBOX__CL_IDEM_KEY];
        for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && strcmp(k[j - 1], k[j]) > 0; j--) {
                        char *t = k[j];
                        k[j] = k[j - 1];
                        k[j - 1] = t;
                }
        size_t len = 1;
        for (size_t i = 0; i < n; i++)
                len += strlen(k[i]) + 1;
        char *out = calloc(1, len);
        for (size_t i = 0; i < n; i++) {
                if (i)
                        strcat(out, ",");
                strcat(out, k[i]);
        }
        free(k);
        return out;
}

/* Claim with req on db; the rows' idem_keys (see claim_keys); *rowsp gets
 * the rows (NULL: freed here). */
static char *
claim_on(kinbox__db_t *db, const kinbox__claim_req_t *req,
         struct kinbox_rows_s **rowsp)
{
        struct kinbox_rows_s *rows = NULL;
        cr_assert(eq(int, db->ops->outbox->claim(db, req, &rows), 0), "%s",
                  db->err.msg);
        char *k = claim_keys(rows);
        if (rowsp)
                *rowsp = rows;
        else
                kinbox_rows_destroy(rows);
        return k;
}

static void
claim_ids(struct kinbox_rows_s *rows, int64_t *ids, int64_t *vers)
{
        for (size_t i = 0; i < rows->nrows; i++) {
                ids[i] = atoll(rows->values[i * (size_t)rows->ncols]);
                vers[i] = atoll(rows->values[i * (size_t)rows->ncols + 1]);
        }
}

/*
 * The lock-held claim on its own (relay.claim = lock), on the statements:
 *  - a claim whose transaction dies (connection closed) leaves every row
 *    pending, unversioned, no attempt charged;
 *  - a run stops at a row another transaction holds (the prefix rule):
 *    with k4 of aggregate "one" locked elsewhere, the claim takes k0..k3
 *    and never k5..k9, which would overtake k4;
 *  - a second relay, lock-held or leasing, gets nothing of aggregates
 *    whose heads the first holds, nor of one whose head is held elsewhere;
 *  - marks in the claim's transaction write each row once (version 1);
 *  - a lock-held batch degraded to leases (lease() + commit) is not due
 *    for other relays of either kind and is marked with its new versions.
 */
KT_BACKENDS_PARAMS(outbox_lock_claim, backends)
ParameterizedTest(int *bidx, outbox_lock_claim, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        char *url = kt_fresh_db(backend);
        tconn_t c;
        tc_open(&c, backend, url);
        for (int i = 0; i < 10; i++) {
                char key[16];
                snprintf(key, sizeof(key), "k%d", i);
                kinbox_outbox_msg_t m = {.destination = "t",
                                         .idem_key = key,
                                         .aggregate_id = "one"};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        for (int i = 0; i < 3; i++) {
                char key[16];
                snprintf(key, sizeof(key), "t%d", i);
                kinbox_outbox_msg_t m = {.destination = "t",
                                         .idem_key = key,
                                         .aggregate_id = "two"};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        char e[512];
        kinbox__db_t *a = kinbox__db_new(url, NULL, e, sizeof(e));
        kinbox__db_t *b = kinbox__db_new(url, NULL, e, sizeof(e));
        kinbox__db_t *z = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(a && b && z && !kinbox__db_connect(a) &&
                  !kinbox__db_connect(b) && !kinbox__db_connect(z));
        const char *all = "k0,k1,k2,k3,k4,k5,k6,k7,k8,k9,t0,t1,t2";
        kinbox__claim_req_t lk = {100, 5000, "relay-a", 100, 200, true, 0, 0},
                            lk0 = {100, 5000, "relay-a", 100, 0, true, 0, 0},
                            ls = {100, 60000, "relay-b", 100,
                                  200, false, 0,         0};

        /* A claim whose transaction dies: nothing changed. */
        char *k = claim_on(z, &lk, NULL);
        cr_assert(eq(str, k, (char *)all));
        free(k);
        cr_assert(z->in_tx, "a lock-held claim keeps its transaction open");
        kinbox__db_destroy(z);
        cr_assert(wait_q(url, 13, 10,
                         "SELECT count(*) FROM kinbox_outbox WHERE status ="
                         " 'pending' AND version = 0 AND attempts = 0 AND"
                         " lease_owner IS NULL AND next_attempt_at <= %s",
                         my_or_pg(backend, "CURRENT_TIMESTAMP(6)", "now()")));

        /* Another transaction holds k4: the run of "one" stops before it. */
        /* By primary key: a record lock on k4 alone (a scan would lock
         * every row it reads under MariaDB's REPEATABLE READ). */
        long long k4 = kt_qint(url, "SELECT id FROM kinbox_outbox WHERE "
                                    "idem_key = 'k4'");
        char lock4[128];
        snprintf(lock4, sizeof(lock4),
                 "SELECT id FROM kinbox_outbox WHERE id = %lld FOR UPDATE",
                 k4);
        tc_sql(&c, "BEGIN");
        tc_sql(&c, lock4);
        struct kinbox_rows_s *ra = NULL;
        k = claim_on(a, &lk, &ra);
        cr_assert(eq(str, k, "k0,k1,k2,k3,t0,t1,t2"),
                  "the run must stop at the row it could not lock");
        free(k);
        /* Neither kind of claim gets anything meanwhile (both windows). */
        for (int w = 0; w < 2; w++) {
                k = claim_on(b, w ? &lk0 : &lk, NULL);
                cr_assert(eq(str, k, ""), "lock-held claim took %s", k);
                free(k);
                cr_assert(eq(int, b->in_tx, 0));
        }
        k = claim_on(b, &ls, NULL);
        cr_assert(eq(str, k, ""), "leasing claim took %s", k);
        free(k);
        /* Marks in A's transaction, one write per row. */
        int64_t ids[16], vers[16];
        claim_ids(ra, ids, vers);
        uint64_t done = 0;
        cr_assert(
            eq(int, a->ops->outbox->mark_sent(a, 7, ids, vers, &done), 0),
            "%s", a->err.msg);
        cr_assert(eq(u64, done, 7));
        cr_assert(eq(int, a->ops->commit(a), 0), "%s", a->err.msg);
        kinbox_rows_destroy(ra);
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent' AND version = 1"),
                     7));

        /* k4, the head of "one" now, is still held elsewhere. */
        for (int w = 0; w < 2; w++) {
                k = claim_on(b, w ? &lk0 : &lk, NULL);
                cr_assert(eq(str, k, ""), "took %s past a held head", k);
                free(k);
        }
        k = claim_on(b, &ls, NULL);
        cr_assert(eq(str, k, ""));
        free(k);
        tc_sql(&c, "COMMIT");

        /* B holds the rest, then degrades to leases. */
        struct kinbox_rows_s *rb = NULL;
        k = claim_on(b, &lk, &rb);
        cr_assert(eq(str, k, "k4,k5,k6,k7,k8,k9"));
        free(k);
        claim_ids(rb, ids, vers);
        cr_assert(
            eq(int,
               b->ops->outbox->lease(b, "relay-b", 60000, 6, ids, vers, &done),
               0),
            "%s", b->err.msg);
        cr_assert(eq(u64, done, 6));
        cr_assert(eq(int, b->ops->commit(b), 0), "%s", b->err.msg);
        kinbox_rows_destroy(rb);
        for (int w = 0; w < 2; w++) {
                k = claim_on(a, w ? &lk0 : &lk, NULL);
                cr_assert(eq(str, k, ""), "took leased rows %s", k);
                free(k);
        }
        k = claim_on(a, &ls, NULL);
        cr_assert(eq(str, k, ""));
        free(k);
        /* Old versions no longer match; the leased ones do. */
        cr_assert(
            eq(int, b->ops->outbox->mark_sent(b, 6, ids, vers, &done), 0));
        cr_assert(eq(u64, done, 0));
        for (int i = 0; i < 6; i++)
                vers[i]++;
        cr_assert(
            eq(int, b->ops->outbox->mark_sent(b, 6, ids, vers, &done), 0));
        cr_assert(eq(u64, done, 6));
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent' AND attempts = 0"),
                     13));
        tc_close(&c);
        kinbox__db_destroy(a);
        kinbox__db_destroy(b);
}

/* Per key, payloads are "seq" in id order: on the topic they never go
 * back, and every seq in want[] arrived; returns the last seq per key. */
static int
check_order(const tmsgs_t *got, const char *key)
{
        int last = -1;
        for (size_t i = 0; i < got->n; i++) {
                const tmsg_t *m = &got->v[i];
                if (!m->key || strcmp(m->key, key))
                        continue;
                int seq = atoi(m->value);
                cr_assert(seq > last, "%s: seq %d after %d", key, seq, last);
                last = seq;
        }
        return last;
}

/* One aggregate with 3,000 pending rows drains in runs (far fewer claims
 * than rows), in order on the topic. */
KT_BACKENDS_PARAMS(outbox_hot_aggregate, backends)
ParameterizedTest(int *bidx, outbox_hot_aggregate, backends, .timeout = 180)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_hot");
        kt_topic(topic, 4);
        enum { N = 3000 };
        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        for (int i = 0; i < N; i++) {
                char key[16], pay[16];
                snprintf(key, sizeof(key), "h%d", i);
                int n = snprintf(pay, sizeof(pay), "%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = key,
                                         .aggregate_id = "hot",
                                         .payload = pay,
                                         .payload_size = (size_t)n};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);
        kinbox_relay_t *r = relay_new(relay_conf(url, bootstrap));
        trelay_t tr;
        relay_start(&tr, r);
        bool ok = wait_q(url, N, 120,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        relay_stop(&tr);
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        kinbox_relay_destroy(r);
        cr_assert(ok, "not all sent");
        cr_assert(eq(u64, st.published, N));
        cr_assert(st.batches < N / 10,
                  "%" PRIu64 " claims for %d rows: no runs", st.batches, N);
        tmsgs_t got;
        consume(bootstrap, topic, N, 60, 500, &got);
        cr_assert(eq(sz, got.n, N));
        cr_assert(eq(int, check_order(&got, "hot"), N - 1));
        msgs_free(&got);
}

/*
 * Failures inside runs: aggregate "f" has a row that can never be
 * produced (larger than kafka.message.max.bytes) in the middle: no retry
 * can help, so it is dead at its first attempt (max_attempts 2 is not
 * used up), and the rows after it wait for it (released, not charged),
 * then follow in order. Aggregate "p" has a row for a paused destination
 * in the middle: the rows after it stay pending, unpublished, until it is
 * resumed.
 */
KT_BACKENDS_PARAMS(outbox_run_failures, backends)
ParameterizedTest(int *bidx, outbox_run_failures, backends, .timeout = 180)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_runf");
        char *paused = kt_unique("obx_paused");
        kt_topic(topic, 4);
        kt_topic(paused, 1);
        enum { N = 60, BAD = 20 };
        static char big[20000];
        memset(big, 'x', sizeof(big));
        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        for (int i = 0; i < N; i++) {
                char key[16], pay[16];
                int n = snprintf(pay, sizeof(pay), "%d", i);
                snprintf(key, sizeof(key), "f%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = key,
                                         .aggregate_id = "f",
                                         .payload = i == BAD ? big : pay,
                                         .payload_size = i == BAD ? sizeof(big)
                                                                  : (size_t)n,
                                         .max_attempts = i == BAD ? 2 : 0};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                snprintf(key, sizeof(key), "p%d", i);
                kinbox_outbox_msg_t q = {.destination =
                                             i == BAD ? paused : topic,
                                         .idem_key = key,
                                         .aggregate_id = "p",
                                         .payload = pay,
                                         .payload_size = (size_t)n};
                cr_assert(eq(int, tc_append(&c, &q, NULL), KINBOX_OK));
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox_paused (destination) VALUES "
                 "('%s')",
                 paused);
        kt_exec(url, sql);

        kinbox_conf_t *conf = relay_conf(url, bootstrap);
        cset(conf, "kafka.message.max.bytes", "10000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        /* f: 59 sent + 1 dead; p: the 20 rows before the paused one. */
        bool ok = wait_q(url, N - 1 + BAD, 60,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        cr_assert(ok, "sent: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                "status = 'sent'"));
        cr_assert(eq(int,
                     kt_qintf(url,
                              "SELECT count(*) FROM kinbox_outbox "
                              "WHERE idem_key = 'f%d' AND status = "
                              "'dead' AND attempts = 1",
                              BAD),
                     1));
        /* Nothing charged to the rows that waited behind it. */
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox "
                                  "WHERE aggregate_id = 'f' AND "
                                  "attempts > 0"),
                     1));
        /* A few more rounds: p's rows after the paused one stay put. */
        usleep(500 * 1000);
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox "
                                  "WHERE aggregate_id = 'p' AND "
                                  "status = 'pending'"),
                     N - BAD));
        snprintf(sql, sizeof(sql),
                 "DELETE FROM kinbox_outbox_paused WHERE destination = '%s'",
                 paused);
        kt_exec(url, sql);
        ok = wait_q(url, 2 * N - 1, 60,
                    "SELECT count(*) FROM kinbox_outbox WHERE status = "
                    "'sent'");
        relay_stop(&tr);
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        kinbox_relay_destroy(r);
        cr_assert(ok, "not all sent after resume");
        cr_assert(st.released >= 1, "the run behind the failing row was "
                                    "not handed back");
        tmsgs_t got;
        consume(bootstrap, topic, 2 * N - 2, 60, 500, &got);
        cr_assert(eq(sz, got.n, 2 * N - 2));
        cr_assert(eq(int, check_order(&got, "f"), N - 1));
        cr_assert(eq(int, check_order(&got, "p"), N - 1));
        for (size_t i = 0; i < got.n; i++)
                cr_assert(strcmp(got.v[i].value, "20") ||
                              strcmp(got.v[i].key, "f"),
                          "the dead row was published");
        msgs_free(&got);
        tmsgs_t gp;
        consume(bootstrap, paused, 1, 60, 200, &gp);
        cr_assert(eq(sz, gp.n, 1));
        msgs_free(&gp);
}

/* A lock timeout while appending on the caller's own connection is
 * KINBOX_ERR_TRANSIENT (retry the transaction), not KINBOX_ERR_DB. */
KT_BACKENDS_PARAMS(outbox_append_transient, backends)
ParameterizedTest(int *bidx, outbox_append_transient, backends, .timeout = 60)
{
        const char *backend = kt_backend(*bidx);
        char *url = kt_fresh_db(backend);
        tconn_t a, b;
        tc_open(&a, backend, url);
        tc_open(&b, backend, url);
        kinbox_outbox_msg_t m = {.destination = "t", .idem_key = "same"};
        tc_sql(&a, "BEGIN");
        cr_assert(eq(int, tc_append(&a, &m, NULL), KINBOX_OK));
        tc_sql(&b, a.my ? "SET SESSION innodb_lock_wait_timeout = 1"
                        : "SET lock_timeout = '300ms'");
        tc_sql(&b, "BEGIN");
        char e[512];
        /* b waits for a's uncommitted row with the same key. */
        kinbox_err_t rc =
            b.my ? kinbox_outbox_append_mysql(b.m, &m, NULL, e, sizeof(e))
                 : kinbox_outbox_append_pg(b.pg, &m, NULL, e, sizeof(e));
        cr_assert(eq(int, rc, KINBOX_ERR_TRANSIENT), "%s: %s",
                  kinbox_err_name(rc), e);
        tc_sql(&b, "ROLLBACK");
        tc_sql(&a, "COMMIT");
        /* The retry after the rollback sees the committed row. */
        tc_sql(&b, "BEGIN");
        cr_assert(eq(int, tc_append(&b, &m, NULL), KINBOX_ERR_DUPLICATE));
        tc_sql(&b, "COMMIT");
        tc_close(&a);
        tc_close(&b);
}

typedef struct listed {
        int sent_ok, pending_ok, n;
} listed_t;

static int
check_listed(const kinbox_outbox_row_t *row, void *opaque)
{
        listed_t *l = opaque;
        l->n++;
        if (row->status == KINBOX_OUTBOX_SENT && row->sent_at &&
            !row->next_attempt_at && row->version >= 1)
                l->sent_ok++;
        if (row->status == KINBOX_OUTBOX_PENDING && !row->sent_at &&
            row->next_attempt_at && row->version == 0)
                l->pending_ok++;
        return 0;
}

/* kinbox_outbox_list (and `outbox list --json`) shows sent_at and version;
 * a sent row shows no next_attempt_at (its column may hold an old lease).
 * A sent row's version is 1 when it was sent from a lock-held claim (one
 * write), 2 or more after a lease. */
KT_BACKENDS_PARAMS(outbox_list_fields, backends)
ParameterizedTest(int *bidx, outbox_list_fields, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_list");
        kt_topic(topic, 1);
        tconn_t c;
        tc_open(&c, backend, url);
        kinbox_outbox_msg_t m = {.destination = topic, .idem_key = "a"};
        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        kinbox_relay_t *r = relay_new(relay_conf(url, bootstrap));
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(wait_q(url, 1, 60,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'"));
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        kinbox_outbox_msg_t m2 = {.destination = topic, .idem_key = "b"};
        cr_assert(eq(int, tc_append(&c, &m2, NULL), KINBOX_OK));
        tc_close(&c);
        kinbox_conf_t *conf = kinbox_conf_new();
        cset(conf, "database.url", url);
        char e[512];
        kinbox_admin_t *adm = kinbox_admin_new(conf, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        listed_t l = {0};
        cr_assert(eq(int,
                     kinbox_outbox_list(adm, KINBOX_OUTBOX_ANY, NULL, 0, 0,
                                        check_listed, &l),
                     KINBOX_OK));
        cr_assert(eq(int, l.n, 2));
        cr_assert(eq(int, l.sent_ok, 1));
        cr_assert(eq(int, l.pending_ok, 1));
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(conf);
}

/* ------------------------------------------------ lock-held relays */

/* One statement's first value on db (helper threads: no assertions;
 * -1 on error). */
static long long
db_int(kinbox__db_t *db, const char *sql)
{
        kinbox_rows_t *r = NULL;
        if (kinbox__db_query(db, sql, 0, NULL, &r)) {
                kinbox_rows_destroy(r);
                if (db->err.code == KINBOX_ERR_DB_CONN)
                        kinbox__db_connect(db);
                return -1;
        }
        const char *v =
            kinbox_rows_count(r) ? kinbox_rows_value(r, 0, 0, NULL) : NULL;
        long long n = v ? strtoll(v, NULL, 10) : 0;
        kinbox_rows_destroy(r);
        return n;
}

/* Per key "h-A" (payload = seq, appended in seq order): every seq first
 * appears right after the one before it (copies of older ones may follow:
 * at-least-once), and every seq up to rows - 1 arrived. */
static void
check_first_order(const tmsgs_t *got, int aggs, int rows)
{
        int *last = malloc(sizeof(int) * (size_t)aggs);
        for (int a = 0; a < aggs; a++)
                last[a] = -1;
        for (size_t i = 0; i < got->n; i++) {
                const tmsg_t *m = &got->v[i];
                cr_assert(m->key && !strncmp(m->key, "h-", 2));
                int a = atoi(m->key + 2), seq = atoi(m->value);
                cr_assert(a >= 0 && a < aggs);
                cr_assert(seq <= last[a] + 1, "%s: seq %d first seen after %d",
                          m->key, seq, last[a]);
                if (seq > last[a])
                        last[a] = seq;
        }
        for (int a = 0; a < aggs; a++)
                cr_assert(eq(int, last[a], rows - 1),
                          "h-%d (%zu messages read from the topic)", a,
                          got->n);
        free(last);
}

#define LR_AGGS 6
#define LR_ROWS 300

typedef struct lrctx {
        const char *backend, *url, *topic;
        atomic_bool stop, locker_up;
        atomic_int appended, locked;
        int failed; /* helper thread errors */
} lrctx_t;

/* Appends LR_ROWS rows to each of LR_AGGS hot aggregates, ten per
 * transaction, while the relays run. */
/* tc_open / tc_sql for helper threads: no assertions, false on error. */
static bool
raw_open(tconn_t *c, const char *backend, const char *url)
{
        memset(c, 0, sizeof(*c));
        c->my = !strcmp(backend, "mysql");
        if (!c->my) {
                c->pg = PQconnectdb(url);
                return PQstatus(c->pg) == CONNECTION_OK;
        }
        kinbox__dburl_t u;
        char e[256];
        if (kinbox__dburl_parse(url, &u, e, sizeof(e)))
                return false;
        c->m = mysql_init(NULL);
        bool ok = c->m && mysql_real_connect(c->m, u.host, u.user, u.password,
                                             u.dbname, (unsigned)u.port, NULL,
                                             0) != NULL;
        kinbox__dburl_free(&u);
        return ok;
}

static bool
raw_sql(tconn_t *c, const char *sql)
{
        if (!c->my) {
                PGresult *r = PQexec(c->pg, sql);
                ExecStatusType st = PQresultStatus(r);
                PQclear(r);
                return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
        }
        if (mysql_query(c->m, sql))
                return false;
        MYSQL_RES *res = mysql_store_result(c->m);
        if (res)
                mysql_free_result(res);
        return true;
}

static void *
lr_writer(void *arg)
{
        lrctx_t *x = arg;
        char e[512];
        tconn_t c;
        if (!raw_open(&c, x->backend, x->url)) {
                x->failed = 1;
                tc_close(&c);
                return NULL;
        }
        /* The locker first: on a slow machine the relays drained the rows
         * before it had connected (no row was ever held). */
        for (int i = 0; i < 10000 && !atomic_load(&x->locker_up) && !x->failed;
             i++)
                usleep(1000);
        int n = 0;
        for (int seq = 0; seq < LR_ROWS && !x->failed; seq++) {
                for (int a = 0; a < LR_AGGS; a++) {
                        char key[48], agg[16], pay[16];
                        snprintf(key, sizeof(key), "h%d-s%d", a, seq);
                        snprintf(agg, sizeof(agg), "h-%d", a);
                        int pn = snprintf(pay, sizeof(pay), "%d", seq);
                        kinbox_outbox_msg_t m = {.destination = x->topic,
                                                 .idem_key = key,
                                                 .aggregate_id = agg,
                                                 .payload = pay,
                                                 .payload_size = (size_t)pn};
                        if (n % 10 == 0 && !raw_sql(&c, "BEGIN"))
                                x->failed = 1;
                        kinbox_err_t rc =
                            c.my ? kinbox_outbox_append_mysql(c.m, &m, NULL, e,
                                                              sizeof(e))
                                 : kinbox_outbox_append_pg(c.pg, &m, NULL, e,
                                                           sizeof(e));
                        if (rc)
                                x->failed = 1;
                        if (++n % 10 == 0 && !raw_sql(&c, "COMMIT"))
                                x->failed = 1;
                        atomic_store(&x->appended, n);
                }
                if (seq % 20 == 0)
                        usleep(10 * 1000);
        }
        if (n % 10)
                raw_sql(&c, "COMMIT");
        tc_close(&c);
        return NULL;
}

/* Holds a row lock on some pending row behind a head, a few ms at a time,
 * as another relay or an operator would: a lock-held claim must end an
 * aggregate's run there, never take the rows after it. */
static void *
lr_locker(void *arg)
{
        lrctx_t *x = arg;
        char e[512];
        kinbox__db_t *db = kinbox__db_new(x->url, NULL, e, sizeof(e));
        if (!db || kinbox__db_connect(db)) {
                x->failed = 1;
                kinbox__db_destroy(db);
                return NULL;
        }
        unsigned seed = 7;
        atomic_store(&x->locker_up, true);
        while (!atomic_load(&x->stop)) {
                char sql[256];
                snprintf(sql, sizeof(sql),
                         "SELECT id FROM kinbox_outbox WHERE status = "
                         "'pending' ORDER BY id LIMIT 1 OFFSET %u",
                         1 + rand_r(&seed) % 40);
                long long id = db_int(db, sql);
                if (id > 0 && !kinbox__db_query(db, "BEGIN", 0, NULL, NULL)) {
                        snprintf(sql, sizeof(sql),
                                 "SELECT id FROM kinbox_outbox WHERE id = "
                                 "%lld AND status = 'pending' FOR UPDATE",
                                 id);
                        if (db_int(db, sql) > 0)
                                atomic_fetch_add(&x->locked, 1);
                        usleep((useconds_t)(5 + rand_r(&seed) % 40) * 1000);
                        kinbox__db_query(db, "COMMIT", 0, NULL, NULL);
                }
                usleep(10 * 1000);
        }
        kinbox__db_destroy(db);
        return NULL;
}

/*
 * Two relays on hot aggregates while rows are appended and rows behind
 * the heads are held by another transaction now and then: lock + lock,
 * then lock + lease on the same table. Every row is sent, and per key the
 * topic's first appearances are in append order.
 */
KT_BACKENDS_PARAMS(outbox_lock_relays, backends)
ParameterizedTest(int *bidx, outbox_lock_relays, backends, .timeout = 400)
{
        const char *backend = kt_backend(*bidx);
        static const char *pairs[2][2] = {{"lock", "lock"}, {"lock", "lease"}};
        for (int pi = 0; pi < 2; pi++) {
                mock_t mk;
                mock_start(&mk, 3);
                char *url = kt_fresh_db(backend);
                char *topic = kt_unique("obx_lockrel");
                cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 4, 1) == 0);
                lrctx_t x;
                memset(&x, 0, sizeof(x));
                x.backend = backend;
                x.url = url;
                x.topic = topic;
                trelay_t tr[2];
                kinbox_relay_t *r[2];
                for (int i = 0; i < 2; i++) {
                        kinbox_conf_t *conf = relay_conf(url, mk.bootstrap);
                        char name[32];
                        snprintf(name, sizeof(name), "lockrel-%d", i);
                        cset(conf, "name", name);
                        cset(conf, "relay.claim", pairs[pi][i]);
                        cset(conf, "relay.pipeline", "1");
                        cset(conf, "relay.batch.size", "64");
                        cset(conf, "relay.run.max", "16");
                        r[i] = relay_new(conf);
                        relay_start(&tr[i], r[i]);
                }
                pthread_t w, l;
                cr_assert(pthread_create(&w, NULL, lr_writer, &x) == 0);
                cr_assert(pthread_create(&l, NULL, lr_locker, &x) == 0);
                pthread_join(w, NULL);
                cr_assert(eq(int, x.failed, 0), "writer failed");
                int total = LR_AGGS * LR_ROWS;
                bool ok = wait_q(url, total, 180,
                                 "SELECT count(*) FROM kinbox_outbox WHERE "
                                 "status = 'sent'");
                atomic_store(&x.stop, true);
                pthread_join(l, NULL);
                for (int i = 0; i < 2; i++)
                        relay_stop(&tr[i]);
                kinbox_relay_stats_t st[2];
                for (int i = 0; i < 2; i++) {
                        kinbox_relay_stats(r[i], &st[i]);
                        kinbox_relay_destroy(r[i]);
                }
                cr_assert(ok, "%s+%s: not all sent: %lld", pairs[pi][0],
                          pairs[pi][1],
                          kt_qintf(url, "SELECT count(*) FROM kinbox_outbox "
                                        "WHERE status = 'sent'"));
                cr_assert(atomic_load(&x.locked) > 0,
                          "no row was ever held by the other transaction");
                long long once = kt_qintf(url, "SELECT count(*) FROM "
                                               "kinbox_outbox WHERE version = "
                                               "1");
                cr_log_info(
                    "%s %s+%s: %llu + %llu published, %d rows held "
                    "elsewhere meanwhile, %lld of %d rows written once",
                    backend, pairs[pi][0], pairs[pi][1],
                    (unsigned long long)st[0].published,
                    (unsigned long long)st[1].published,
                    atomic_load(&x.locked), once, total);
                tmsgs_t got;
                consume(mk.bootstrap, topic, (size_t)total, 60, 1000, &got);
                check_first_order(&got, LR_AGGS, LR_ROWS);
                msgs_free(&got);
                mock_stop(&mk);
        }
}

/* Longest open transaction of another session on this database, in ms
 * (MariaDB: whole seconds of trx_started), while a test runs. */
typedef struct txwatch {
        const char *backend, *url;
        atomic_bool stop;
        atomic_llong max_ms;
        atomic_int samples;
} txwatch_t;

static void *
tx_watch(void *arg)
{
        txwatch_t *x = arg;
        char e[512];
        kinbox__db_t *db = kinbox__db_new(x->url, NULL, e, sizeof(e));
        if (!db || kinbox__db_connect(db)) {
                kinbox__db_destroy(db);
                return NULL;
        }
        bool my = !strcmp(x->backend, "mysql");
        const char *sql =
            my ? "SELECT COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND,"
                 " t.trx_started, NOW(6))) DIV 1000, 0)"
                 " FROM information_schema.innodb_trx t"
                 " JOIN information_schema.processlist p"
                 " ON p.id = t.trx_mysql_thread_id"
                 " WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()"
               : "SELECT COALESCE(MAX(EXTRACT(EPOCH FROM clock_timestamp()"
                 " - xact_start) * 1000), 0)::bigint FROM pg_stat_activity"
                 " WHERE datname = current_database()"
                 " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL";
        while (!atomic_load(&x->stop)) {
                long long v = db_int(db, sql);
                if (v > atomic_load(&x->max_ms))
                        atomic_store(&x->max_ms, v);
                if (v >= 0)
                        atomic_fetch_add(&x->samples, 1);
                /* MariaDB refreshes innodb_trx only when it was not read
                 * for 100 ms. */
                usleep((useconds_t)(my ? 150 : 20) * 1000);
        }
        kinbox__db_destroy(db);
        return NULL;
}

#define SB_AGGS 10
#define SB_ROWS 12

/* Appends rows "h-A" seq 0..rows-1 for aggs aggregates (one transaction). */
static void
append_hot(const char *backend, const char *url, const char *topic, int aggs,
           int rows)
{
        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        for (int seq = 0; seq < rows; seq++) {
                for (int a = 0; a < aggs; a++) {
                        char key[48], agg[16], pay[16];
                        snprintf(key, sizeof(key), "h%d-s%d", a, seq);
                        snprintf(agg, sizeof(agg), "h-%d", a);
                        int n = snprintf(pay, sizeof(pay), "%d", seq);
                        kinbox_outbox_msg_t m = {.destination = topic,
                                                 .idem_key = key,
                                                 .aggregate_id = agg,
                                                 .payload = pay,
                                                 .payload_size = (size_t)n};
                        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                }
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);
}

/*
 * A slow broker (every answer 3 s late) and relay.lock.ms = 200: no
 * lock-held batch can have its reports in time, so every one degrades to
 * leases. No transaction stays open anywhere near the broker's delay
 * (measured from another session: pg_stat_activity / innodb_trx), every
 * row is sent once or more, in order per key, each written twice (lease,
 * mark: version 2).
 *
 * The delivery deadline (kafka.message.timeout.ms) is 40 s: a new
 * producer's first batch takes 22 to 25 s at 3 s a round trip (ASan,
 * loaded or not), and a batch after an expired one ~10.8 s. With 10 s
 * (11 s with the relay's margin) the first batch always expired, the next
 * one just made it, and under ASan and load it did not now and then: its
 * purge of requests in flight is fatal to the gap-less producer, the relay
 * makes a new one, whose first batch expires again, and such runs of
 * expired batches used up the 200 s ("not all sent: 114" in a full ASan
 * run).
 */
KT_BACKENDS_PARAMS(outbox_lock_slow_broker, backends)
ParameterizedTest(int *bidx, outbox_lock_slow_broker, backends, .timeout = 300)
{
        const char *backend = kt_backend(*bidx);
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_slow");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 4, 1) == 0);
        append_hot(backend, url, topic, SB_AGGS, SB_ROWS);
        for (int id = 1; id <= 3; id++)
                rd_kafka_mock_broker_set_rtt(mk.mc, id, 3000);

        txwatch_t tw;
        memset(&tw, 0, sizeof(tw));
        tw.backend = backend;
        tw.url = url;
        pthread_t wt;
        cr_assert(pthread_create(&wt, NULL, tx_watch, &tw) == 0);
        kinbox_conf_t *conf =
            lock_relay_conf(url, mk.bootstrap, "200", "40000", "45000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        int total = SB_AGGS * SB_ROWS;
        bool ok = wait_q(url, total, 200,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        relay_stop(&tr);
        atomic_store(&tw.stop, true);
        pthread_join(wt, NULL);
        kinbox_relay_destroy(r);
        cr_assert(ok, "not all sent: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                "status = 'sent'"));
        cr_assert(atomic_load(&tw.samples) > 10);
        cr_log_info("%s: longest transaction seen %lld ms", backend,
                    (long long)atomic_load(&tw.max_ms));
        /* The bound is 200 ms from BEGIN, plus the lease statement and
         * commit; MariaDB reports whole seconds. A batch that waited for
         * its reports in the transaction would show 3 s or more. */
        cr_assert(atomic_load(&tw.max_ms) < 2000,
                  "a transaction stayed open %lld ms",
                  (long long)atomic_load(&tw.max_ms));
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "version >= 2"),
                     total),
                  "every batch degraded to leases");
        for (int id = 1; id <= 3; id++) /* read the topic back at speed */
                rd_kafka_mock_broker_set_rtt(mk.mc, id, 0);
        tmsgs_t got;
        consume(mk.bootstrap, topic, (size_t)total, 60, 1000, &got);
        check_first_order(&got, SB_AGGS, SB_ROWS);
        msgs_free(&got);
        mock_stop(&mk);
}

/* Ends (pg_terminate_backend / KILL) a session of this database that is
 * inside a transaction: the relay's, holding its row locks. */
typedef struct killer {
        const char *backend, *url;
        atomic_bool stop;
        atomic_int kills;
} killer_t;

static void *
tx_killer(void *arg)
{
        killer_t *x = arg;
        char e[512];
        kinbox__db_t *db = kinbox__db_new(x->url, NULL, e, sizeof(e));
        if (!db || kinbox__db_connect(db)) {
                kinbox__db_destroy(db);
                return NULL;
        }
        bool my = !strcmp(x->backend, "mysql");
        while (!atomic_load(&x->stop) && atomic_load(&x->kills) < 3) {
                long long id = db_int(
                    db, my ? "SELECT COALESCE(MIN(t.trx_mysql_thread_id), 0)"
                             " FROM information_schema.innodb_trx t"
                             " JOIN information_schema.processlist p"
                             " ON p.id = t.trx_mysql_thread_id"
                             " WHERE p.db = DATABASE()"
                             " AND p.id <> CONNECTION_ID()"
                           : "SELECT COALESCE(MIN(pid), 0) FROM "
                             "pg_stat_activity WHERE datname = "
                             "current_database() AND pid <> "
                             "pg_backend_pid() AND state = 'idle in "
                             "transaction'");
                if (id > 0) {
                        char sql[128];
                        if (my)
                                snprintf(sql, sizeof(sql), "KILL %lld", id);
                        else
                                snprintf(sql, sizeof(sql),
                                         "SELECT pg_terminate_backend(%lld)",
                                         id);
                        if (!kinbox__db_query(db, sql, 0, NULL, NULL)) {
                                atomic_fetch_add(&x->kills, 1);
                                usleep(400 * 1000);
                        }
                }
                /* MariaDB refreshes innodb_trx only when it was not read
                 * for 100 ms. */
                usleep((useconds_t)(my ? 120 : 5) * 1000);
        }
        kinbox__db_destroy(db);
        return NULL;
}

/*
 * The relay's connection is killed while it holds a batch's row locks
 * (broker answers 300 ms late, so each batch waits in its transaction):
 * the marks fail, nothing is marked from the dead transaction, the relay
 * reconnects, and every row is still sent, in order per key.
 */
KT_BACKENDS_PARAMS(outbox_lock_conn_lost, backends)
ParameterizedTest(int *bidx, outbox_lock_conn_lost, backends, .timeout = 300)
{
        const char *backend = kt_backend(*bidx);
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_killed");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 4, 1) == 0);
        append_hot(backend, url, topic, 20, 20);
        for (int id = 1; id <= 3; id++)
                rd_kafka_mock_broker_set_rtt(mk.mc, id, 300);
        killer_t kx;
        memset(&kx, 0, sizeof(kx));
        kx.backend = backend;
        kx.url = url;
        pthread_t kt;
        cr_assert(pthread_create(&kt, NULL, tx_killer, &kx) == 0);
        kinbox_conf_t *conf =
            lock_relay_conf(url, mk.bootstrap, "1500", "4000", "6000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        int total = 20 * 20;
        bool ok = wait_q(url, total, 200,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        atomic_store(&kx.stop, true);
        pthread_join(kt, NULL);
        relay_stop(&tr);
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        kinbox_relay_destroy(r);
        cr_assert(ok, "not all sent: %lld",
                  kt_qintf(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                "status = 'sent'"));
        cr_assert(atomic_load(&kx.kills) >= 1, "no session was killed");
        cr_assert(st.db_errors >= 1, "the relay never saw its session end");
        cr_assert(eq(int,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "attempts > 0"),
                     0),
                  "an attempt was charged");
        for (int id = 1; id <= 3; id++) /* read the topic back at speed */
                rd_kafka_mock_broker_set_rtt(mk.mc, id, 0);
        tmsgs_t got;
        consume(mk.bootstrap, topic, (size_t)total, 60, 1000, &got);
        check_first_order(&got, 20, 20);
        cr_log_info("%s: %d kills, %zu messages for %d rows", backend,
                    atomic_load(&kx.kills), got.n, total);
        msgs_free(&got);
        mock_stop(&mk);
}
