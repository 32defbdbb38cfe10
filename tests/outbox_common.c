/*
 * outbox_common.c -- the outbox suites' shared helpers (outbox_common.h).
 */
#include "outbox_common.h"

#include <inttypes.h>
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

void
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

void
tc_close(tconn_t *c)
{
        if (c->pg)
                PQfinish(c->pg);
        if (c->m)
                mysql_close(c->m);
        free(c->url);
        memset(c, 0, sizeof(*c));
}

void
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

kinbox_err_t
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

kinbox_rows_t *
qrows(const char *url, const char *sql)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        kinbox_rows_t *r = NULL;
        cr_assert(kinbox__db_query(db, sql, 0, NULL, &r) == 0, "%s: %s", sql,
                  db->err.msg);
        kinbox__db_destroy(db);
        return r;
}

void
append_seq(tconn_t *c, const char *dest, const char *key, const char *agg,
           int seq, int max_attempts)
{
        char pay[16];
        int n = snprintf(pay, sizeof(pay), "%d", seq);
        kinbox_outbox_msg_t m = {.destination = dest,
                                 .idem_key = key,
                                 .aggregate_id = agg,
                                 .payload = pay,
                                 .payload_size = (size_t)n,
                                 .max_attempts = max_attempts};
        cr_assert(eq(int, tc_append(c, &m, NULL), KINBOX_OK), "%s", key);
}

/* Text of the first column of the first row. */
char *
qtext(const char *url, const char *sql)
{
        kinbox_rows_t *r = qrows(url, sql);
        const char *v =
            kinbox_rows_count(r) ? kinbox_rows_value(r, 0, 0, NULL) : NULL;
        char *out = strdup(v ? v : "");
        kinbox_rows_destroy(r);
        return out;
}

bool
wait_q(const char *url, long long want, int timeout_s, const char *fmt, ...)
{
        char sql[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        return kt_wait_qint(url, sql, want, timeout_s) == want;
}

void
cset(kinbox_conf_t *c, const char *k, const char *v)
{
        char e[512];
        kinbox_err_t rc = kinbox_conf_set(c, k, v, e, sizeof(e));
        cr_assert(rc == KINBOX_OK, "conf %s=%s: %s", k, v, e);
}

/* Relay configuration with short test timings. */
kinbox_conf_t *
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
kinbox_conf_t *
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

kinbox_relay_t *
relay_new(kinbox_conf_t *c)
{
        char e[512];
        kinbox_relay_t *r = kinbox_relay_new(c, e, sizeof(e));
        cr_assert(r != NULL, "relay_new: %s", e);
        return r;
}

static void *
relay_main(void *arg)
{
        trelay_t *t = arg;
        t->rc = kinbox_relay_run(t->r);
        return NULL;
}

void
relay_start(trelay_t *t, kinbox_relay_t *r)
{
        t->r = r;
        t->rc = KINBOX_OK;
        cr_assert(pthread_create(&t->th, NULL, relay_main, t) == 0);
}

void
relay_stop(trelay_t *t)
{
        kinbox_relay_stop(t->r);
        pthread_join(t->th, NULL);
        cr_assert(t->rc == KINBOX_OK, "relay_run: %s: %s",
                  kinbox_err_name(t->rc), kinbox_relay_errstr(t->r));
}

bool
relay_until_sent(kinbox_conf_t *conf, const char *url, long long n,
                 int timeout_s, kinbox_relay_stats_t *st)
{
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        bool ok = wait_q(url, n, timeout_s,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'");
        relay_stop(&tr);
        if (st)
                kinbox_relay_stats(r, st);
        kinbox_relay_destroy(r);
        return ok;
}

/* ---- Kafka read-back */

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

/* A reader that ended short, or stalled, says per partition what the
 * log holds against what was read: a log that lacks records is the
 * producer's fault, a log that holds them is the reader's. */
static void
log_short_read(rd_kafka_t *rk, const char *topic, int parts,
               const tmsgs_t *got)
{
        for (int p = 0; p < parts; p++) {
                int64_t lo = -1, hi = -1, last = -1;
                rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
                    rk, topic, p, &lo, &hi, 5000);
                size_t n = 0;
                for (size_t i = 0; i < got->n; i++)
                        if (got->v[i].partition == p) {
                                n++;
                                if (got->v[i].offset > last)
                                        last = got->v[i].offset;
                        }
                if (err || n != (size_t)(hi - lo))
                        fprintf(stderr,
                                "%s [%d]: log %lld..%lld (%s), read %zu, "
                                "last offset read %lld\n",
                                topic, p, (long long)lo, (long long)hi,
                                rd_kafka_err2name(err), n, (long long)last);
        }
}

/* A consumer of no group's offsets (assign(), nothing committed). */
static rd_kafka_t *
reader_new(const char *bootstrap)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, e, sizeof(e));
        rd_kafka_conf_set(c, "group.id", "outbox-test-reader", e, sizeof(e));
        rd_kafka_conf_set(c, "enable.auto.commit", "false", e, sizeof(e));
        rd_kafka_conf_set(c, "enable.partition.eof", "false", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        rd_kafka_poll_set_consumer(rk);
        return rk;
}

/* The topic's partition count, asked until the broker knows the topic. */
static int
topic_parts(rd_kafka_t *rk, const char *topic)
{
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
        return parts;
}

/* Every partition from the record after the last one read (from the
 * start when none was): a new reader goes on exactly where the last
 * stopped, reading no record twice. */
static void
reader_assign(rd_kafka_t *rk, const char *topic, int parts, const tmsgs_t *got)
{
        rd_kafka_topic_partition_list_t *tl =
            rd_kafka_topic_partition_list_new(parts);
        for (int p = 0; p < parts; p++)
                rd_kafka_topic_partition_list_add(tl, topic, p)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        for (size_t i = 0; i < got->n; i++) {
                rd_kafka_topic_partition_t *tp =
                    &tl->elems[got->v[i].partition];
                if (tp->offset < got->v[i].offset + 1)
                        tp->offset = got->v[i].offset + 1;
        }
        cr_assert(rd_kafka_assign(rk, tl) == 0);
        rd_kafka_topic_partition_list_destroy(tl);
}

/* A copy of the record into out. */
static void
msg_keep(tmsgs_t *out, const rd_kafka_message_t *m)
{
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
        x->ts = rd_kafka_message_timestamp(m, NULL);
        rd_kafka_headers_t *h = NULL;
        if (rd_kafka_message_headers((rd_kafka_message_t *)m, &h) == 0 && h) {
                x->hdrs = rd_kafka_headers_copy(h);
                const void *v;
                size_t n;
                if (rd_kafka_header_get_last(h, "message_id", &v, &n) == 0)
                        x->msgid = dupn(v, n);
        }
}

static long long
mono_ms(void)
{
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

#define READER_STALL_MS 3000

/* A partition with records left to read (its high watermark past the
 * record after the last one read) that gave none for stall_ms; -1 when
 * there is none. */
static int
stalled_part(rd_kafka_t *rk, const char *topic, int parts, const tmsgs_t *got,
             const long long *moved_at, long long now, int stall_ms)
{
        for (int p = 0; p < parts; p++) {
                int64_t lo, hi;
                if (now - moved_at[p] <= stall_ms ||
                    rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi,
                                                     5000))
                        continue;
                int64_t next = lo;
                for (size_t i = 0; i < got->n; i++)
                        if (got->v[i].partition == p &&
                            got->v[i].offset + 1 > next)
                                next = got->v[i].offset + 1;
                if (hi > next)
                        return p;
        }
        return -1;
}

/* Read every partition of topic from the start until want messages came
 * (then on, to see extras: until every message in the log was read, the
 * log's size asked after each linger_ms without a message) or timeout_s
 * passed. Callers have stopped every producer of the topic, so a
 * log read to its end holds every extra there is.
 *
 * A reader one partition of which gives nothing for READER_STALL_MS
 * while the log holds records of it not read yet is replaced by a new
 * one going on from where it stopped, and says so: librdkafka 2.0.2's
 * consumer, after a mock cluster's brokers all went down and up, was seen
 * to stop fetching some partitions for good after their first batch while
 * it read the others, with the records in the log (high watermark 100, 2
 * read, for a minute). */
void
consume(const char *bootstrap, const char *topic, size_t want, int timeout_s,
        int linger_ms, tmsgs_t *out)
{
        memset(out, 0, sizeof(*out));
        rd_kafka_t *rk = reader_new(bootstrap);
        int parts = topic_parts(rk, topic);
        reader_assign(rk, topic, parts, out);
        long long t0 = mono_ms(), enough_at = -1, checked_at = t0;
        long long *moved_at = calloc((size_t)parts, sizeof(*moved_at));
        for (int p = 0; p < parts; p++)
                moved_at[p] = t0;
        int stall_ms = READER_STALL_MS; /* doubled per new reader */
        bool at_end = false;
        for (;;) {
                long long now = mono_ms(), ms = now - t0;
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
                        if (sz >= 0 && sz <= (long long)out->n) {
                                at_end = true;
                                break;
                        }
                        enough_at = ms;
                }
                if (now - checked_at >= 1000) {
                        checked_at = now;
                        int p = stalled_part(rk, topic, parts, out, moved_at,
                                             now, stall_ms);
                        if (p >= 0) {
                                fprintf(stderr,
                                        "reader of %s [%d]: nothing for "
                                        "%d ms with records left in the "
                                        "log: a new reader goes on\n",
                                        topic, p, stall_ms);
                                log_short_read(rk, topic, parts, out);
                                rd_kafka_consumer_close(rk);
                                rd_kafka_destroy(rk);
                                rk = reader_new(bootstrap);
                                reader_assign(rk, topic, parts, out);
                                stall_ms *= 2;
                                for (int i = 0; i < parts; i++)
                                        moved_at[i] = now;
                        }
                }
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
                /* Asked only when nothing came for a while: one round
                 * trip per partition, too slow to ask per message. */
                if (!m && enough_at >= 0 &&
                    log_size(rk, topic, parts) == (long long)out->n) {
                        at_end = true;
                        break;
                }
                if (!m)
                        continue;
                if (m->err) {
                        fprintf(stderr, "reader of %s [%d]: %s\n", topic,
                                (int)m->partition, rd_kafka_message_errstr(m));
                } else {
                        if (m->partition >= 0 && m->partition < parts)
                                moved_at[m->partition] = mono_ms();
                        msg_keep(out, m);
                }
                rd_kafka_message_destroy(m);
        }
        free(moved_at);
        if (!at_end)
                log_short_read(rk, topic, parts, out);
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
}

void
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

const tmsg_t *
find_msgid(const tmsgs_t *m, const char *id)
{
        for (size_t i = 0; i < m->n; i++)
                if (m->v[i].msgid && !strcmp(m->v[i].msgid, id))
                        return &m->v[i];
        return NULL;
}

size_t
count_msgid(const tmsgs_t *m, const char *id)
{
        size_t k = 0;
        for (size_t i = 0; i < m->n; i++)
                if (m->v[i].msgid && !strcmp(m->v[i].msgid, id))
                        k++;
        return k;
}

seqs_t
key_seqs(const tmsgs_t *m, const char *key, seq_rule_t rule)
{
        seqs_t s = {-1, 0, 0};
        for (size_t i = 0; i < m->n; i++) {
                const tmsg_t *x = &m->v[i];
                if (!x->key || strcmp(x->key, key))
                        continue;
                int seq = atoi(x->value ? x->value : "-2");
                bool ok = rule == SEQ_ONCE     ? seq == s.last + 1
                          : rule == SEQ_RISING ? seq > s.last
                          : rule == SEQ_AGAIN
                              ? seq == s.last + 1 || seq == s.last
                              : seq <= s.last + 1;
                cr_assert(ok, "%s: seq %d after %d", key, seq, s.last);
                s.n++;
                s.copies += seq <= s.last;
                if (seq > s.last)
                        s.last = seq;
        }
        return s;
}

size_t
aggs_seqs(const tmsgs_t *m, const char *prefix, int aggs, int rows,
          seq_rule_t rule, size_t *copies)
{
        size_t n = 0;
        for (int a = 0; a < aggs; a++) {
                char key[64];
                snprintf(key, sizeof(key), "%s%d", prefix, a);
                seqs_t s = key_seqs(m, key, rule);
                cr_assert(eq(int, s.last, rows - 1),
                          "%s (%zu messages read from the topic)", key, m->n);
                n += s.n;
                if (copies)
                        *copies += s.copies;
        }
        return n;
}

/* ---- an in-process mock cluster (faults only this test sees) */

void
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

void
mock_brokers(mock_t *m, int brokers, bool up)
{
        for (int id = 1; id <= brokers; id++) {
                if (up)
                        rd_kafka_mock_broker_set_up(m->mc, id);
                else
                        rd_kafka_mock_broker_set_down(m->mc, id);
        }
}

void
mock_stop(mock_t *m)
{
        rd_kafka_mock_cluster_destroy(m->mc);
        rd_kafka_destroy(m->rk);
}
