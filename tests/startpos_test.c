/*
 * startpos_test.c -- start positions you can audit (issue 36), on real
 * Apache Kafka and both backends, with a handler that has NO business key
 * (it only adds to a balance): whatever the inbox and the watermarks let
 * through is applied again, whatever they skip is lost.
 *
 *  1. the topic deleted and created again with more records than the old
 *     watermark: the partition is refused (the record at W-1 is another
 *     one), nothing of the new log is applied until `kinbox offsets reset
 *     --to earliest`, then every new record exactly once;
 *  2. a new database under a group that already committed offsets:
 *     refused; after the reset the whole history is applied once;
 *  3. the group's offsets reset forward (as kafka-consumer-groups
 *     --reset-offsets --to-latest does): refused; a reset while the
 *     consumer runs is refused by Kafka ("stop the consumers"); --to
 *     committed accepts the skip;
 *  4. the crash case (Kafka's offset behind the watermark): no refusal,
 *     the record at W-1 is read again and dropped, nothing applied twice,
 *     nothing skipped;
 *  5. `kinbox verify` (exit 1), `kinbox status` and `kinbox offsets list`
 *     report each disagreement; `kinbox run`'s /readyz answers 503 and
 *     /metrics counts the refused partition.
 *
 * Runs only as startpos_test@kafka (KT_BROKER=kafka): topics are deleted
 * and created again, offsets committed for groups, as on a real broker.
 */
#include "harness.h"
#include "metrics.h"

#include <arpa/inet.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SUM "SELECT COALESCE(SUM(amount), 0) FROM sp_balance"
#define INBOX "SELECT COUNT(*) FROM kinbox_inbox WHERE consumer = 'sp'"
#define WM                                                                    \
        "SELECT COALESCE(MAX(next_offset), -1) FROM kinbox_offsets WHERE "    \
        "consumer = 'sp'"

static void
need_kafka(void)
{
        cr_assert(kt_real_kafka(),
                  "startpos_test runs on real Apache Kafka only (KT_BROKER="
                  "kafka with KINBOX_KAFKA_BOOTSTRAP; ctest -L kafka)");
}

/* ---- the handler: no business key, it only adds */

static kinbox_result_t
add_balance(kinbox_tx_t *tx, const kinbox_msg_t *m, void *opaque)
{
        (void)opaque;
        size_t kl = 0, pl = 0;
        const char *k = kinbox_msg_key(m, &kl);
        const char *p = kinbox_msg_payload(m, &pl);
        char acct[64], amt[32];
        snprintf(acct, sizeof(acct), "%.*s", (int)kl, k ? k : "");
        snprintf(amt, sizeof(amt), "%.*s", (int)pl, p ? p : "0");
        const char *params[2] = {amt, acct};
        kinbox_tx_exec(tx,
                       "UPDATE sp_balance SET amount = amount + $1 WHERE "
                       "account = $2",
                       2, params);
        return KINBOX_RESULT_OK;
}

static char *
db(int backend)
{
        char *url = kt_fresh_db(kt_backend(backend));
        kt_exec(url, "CREATE TABLE sp_balance (account VARCHAR(32) PRIMARY "
                     "KEY, amount BIGINT NOT NULL)");
        kt_exec(url, "INSERT INTO sp_balance VALUES ('a0', 0), ('a1', 0), "
                     "('a2', 0), ('a3', 0), ('a4', 0)");
        return url;
}

/* n records: ids PREFIX-i, keys a0..a4, each worth amount; returns their
 * sum. */
static long long
produce(const char *topic, const char *prefix, int from, int n, int amount)
{
        kt_producer_t *p = kt_producer_new();
        char id[64], key[8], val[16];
        snprintf(val, sizeof(val), "%d", amount);
        for (int i = from; i < from + n; i++) {
                snprintf(id, sizeof(id), "%s-%d", prefix, i);
                snprintf(key, sizeof(key), "a%d", i % 5);
                kt_produce(p, topic, 0, key, val, id);
        }
        kt_producer_flush_destroy(p);
        return (long long)n * amount;
}

/* ---- log capture */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;

static void
capture(int level, const char *fac, const char *msg, void *opaque)
{
        (void)fac;
        (void)opaque;
        pthread_mutex_lock(&log_lock);
        int n = snprintf(log_buf + log_len, sizeof(log_buf) - log_len,
                         "%d %s\n", level, msg);
        if (n > 0 && log_len + (size_t)n < sizeof(log_buf))
                log_len += (size_t)n;
        pthread_mutex_unlock(&log_lock);
        if (getenv("KT_DEBUG"))
                fprintf(stderr, "%d %s\n", level, msg);
}

static bool
logged(const char *what)
{
        pthread_mutex_lock(&log_lock);
        bool y = strstr(log_buf, what) != NULL;
        pthread_mutex_unlock(&log_lock);
        return y;
}

static bool
wait_logged(const char *what, int timeout_s)
{
        for (int i = 0; i < timeout_s * 10; i++) {
                if (logged(what))
                        return true;
                usleep(100000);
        }
        return logged(what);
}

static kt_run_t *
start(const char *url, const char *group, const char *topic)
{
        kinbox_conf_t *c = kt_conf(url, "sp", group, topic);
        kt_set(c, "log.level", "info");
        kinbox_conf_set_log_cb(c, capture, NULL);
        return kt_run_start(c, add_balance, NULL, NULL);
}

/* The consumer run until its inbox holds n rows (then settle_s more, for
 * a record applied twice to show), then stopped; its stats in *st (may be
 * NULL). */
static void
run_until(const char *url, const char *group, const char *topic, long long n,
          int settle_s, kinbox_consumer_stats_t *st)
{
        kt_run_t *r = start(url, group, topic);
        cr_assert(eq(i64, kt_wait_qint(url, INBOX, n, 90), n));
        sleep((unsigned)settle_s);
        if (st)
                kt_run_stop_stats(r, st);
        else
                kt_run_stop(r);
}

/* Forget the log captured so far. */
static void
log_clear(void)
{
        pthread_mutex_lock(&log_lock);
        log_len = 0;
        log_buf[0] = '\0';
        pthread_mutex_unlock(&log_lock);
}

static double
refused_gauge(void)
{
        return kinbox__metrics_value("kinbox_consumer_partitions_refused",
                                     "consumer=\"sp\"");
}

/* Refused: the error line (with its reason) and the gauge. */
static void
assert_refused(const char *verdict)
{
        char want[64];
        snprintf(want, sizeof(want), "refused (%s)", verdict);
        cr_assert(wait_logged(want, 60), "no \"%s\" in the log:\n%s", want,
                  log_buf);
        cr_assert(logged("kinbox offsets reset"), "%s", log_buf);
        cr_assert(eq(dbl, refused_gauge(), 1.0));
}

static char *
ini_for(const char *url, const char *group, const char *topic)
{
        return kt_write_ini(url,
                            "[consumer.sp]\ntopics = %s\ngroup.id = %s\n"
                            "handler = points\n",
                            topic, group);
}

/* ---- Kafka: delete a topic, commit a group's offset */

static rd_kafka_t *
client(const char *group)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        if (group)
                rd_kafka_conf_set(c, "group.id", group, e, sizeof(e));
        rd_kafka_conf_set(c, "enable.auto.commit", "false", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        return rk;
}

static bool
topic_gone(rd_kafka_t *rk, const char *topic)
{
        const struct rd_kafka_metadata *md = NULL;
        bool gone = false;
        if (rd_kafka_metadata(rk, 1, NULL, &md, 5000) == 0) {
                gone = true;
                for (int i = 0; i < md->topic_cnt; i++)
                        if (!strcmp(md->topics[i].topic, topic))
                                gone = false;
                rd_kafka_metadata_destroy(md);
        }
        return gone;
}

static void
topic_delete(const char *topic)
{
        rd_kafka_t *rk = client(NULL);
        rd_kafka_DeleteTopic_t *dt = rd_kafka_DeleteTopic_new(topic);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_DeleteTopics(rk, &dt, 1, NULL, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 60000);
        cr_assert(ev != NULL && rd_kafka_event_error(ev) == 0,
                  "delete topic %s", topic);
        rd_kafka_event_destroy(ev);
        rd_kafka_DeleteTopic_destroy(dt);
        rd_kafka_queue_destroy(q);
        int tries = 0;
        while (!topic_gone(rk, topic)) {
                tries++;
                cr_assert(tries < 300, "topic %s still there after 30 s",
                          topic);
                usleep(100000);
        }
        rd_kafka_destroy(rk);
        sleep(2); /* the broker's own metadata settles */
}

static void
commit_offset(const char *group, const char *topic, int64_t off)
{
        rd_kafka_t *rk = client(group);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, topic, 0)->offset = off;
        rd_kafka_resp_err_t e = rd_kafka_commit(rk, l, 0);
        cr_assert(e == 0, "commit %s %s@%lld: %s", group, topic,
                  (long long)off, rd_kafka_err2str(e));
        rd_kafka_topic_partition_list_destroy(l);
        rd_kafka_destroy(rk);
}

/* `kinbox CMD -c INI EXTRA` with output (stdout and stderr merged) into
 * *out. */
static int
kb(char **out, const char *cmd, const char *ini, const char *extra)
{
        return kt_kinbox(out, NULL, true, "%s -c %s%s", cmd, ini,
                         extra ? extra : "");
}

/* ---- 1. the topic deleted and created again */

KT_BACKENDS_PARAMS(startpos, topic_recreated)
ParameterizedTest(int *backend, startpos, topic_recreated, .timeout = 300)
{
        need_kafka();
        char *url = db(*backend);
        char *topic = kt_unique("sp_re");
        char *group = kt_unique("g_re");
        kt_topic(topic, 1);
        long long old = produce(topic, "old", 0, 30, 1);
        run_until(url, group, topic, 30, 0, NULL);
        cr_assert(eq(i64, kt_qint(url, WM), 30));

        topic_delete(topic);
        kt_topic(topic, 1);
        long long fresh = produce(topic, "new", 0, 50, 10);

        kt_run_t *r = start(url, group, topic);
        assert_refused("incarnation");
        sleep(3);
        cr_assert(eq(i64, kt_qint(url, SUM), old),
                  "nothing of the new log may be applied while refused");
        cr_assert(eq(i64, kt_qint(url, INBOX), 30));
        kt_run_stop(r);

        char *ini = ini_for(url, group, topic);
        char *out = NULL;
        /* verify and offsets list read the record at W-1 too. */
        cr_assert(eq(int, kb(&out, "verify", ini, NULL), 1), "%s", out);
        cr_assert(strstr(out, "start refused (incarnation)") != NULL, "%s",
                  out);
        free(out);
        cr_assert(eq(int, kb(&out, "offsets list", ini, NULL), 0), "%s", out);
        cr_assert(strstr(out, "incarnation (REFUSED)") != NULL, "%s", out);
        free(out);
        /* Dry run: the plan, nothing changed. */
        cr_assert(eq(int,
                     kb(&out, "offsets reset --consumer sp --to earliest", ini,
                        " --dry-run"),
                     0),
                  "%s", out);
        cr_assert(strstr(out, "dry run") != NULL, "%s", out);
        free(out);
        cr_assert(eq(i64, kt_qint(url, WM), 30));
        cr_assert(eq(int,
                     kb(&out, "offsets reset --consumer sp --to earliest", ini,
                        NULL),
                     0),
                  "%s", out);
        free(out);
        cr_assert(eq(i64, kt_qint(url, WM), 0));
        cr_assert(eq(i64, kt_committed_sum(group, topic, 1), 0));

        log_clear();
        run_until(url, group, topic, 80, 2, NULL);
        cr_assert(eq(i64, kt_qint(url, SUM), old + fresh),
                  "every new record exactly once");
        cr_assert(eq(i64, kt_qint(url, WM), 50));
        bool none = !logged("refused (");
        cr_assert(none, "%s", log_buf);
        cr_assert(eq(int, kb(&out, "verify", ini, NULL), 0), "%s", out);
        free(out);
}

/* ---- 2. a new database under a group that already committed */

KT_BACKENDS_PARAMS(startpos, new_database_old_group)
ParameterizedTest(int *backend, startpos, new_database_old_group,
                  .timeout = 300)
{
        need_kafka();
        char *url1 = db(*backend);
        char *topic = kt_unique("sp_nd");
        char *group = kt_unique("g_nd");
        kt_topic(topic, 1);
        long long total = produce(topic, "h", 0, 40, 3);
        run_until(url1, group, topic, 40, 0, NULL);
        cr_assert(eq(i64, kt_committed_sum(group, topic, 1), 40));

        char *url2 = db(*backend);
        kt_run_t *r = start(url2, group, topic);
        assert_refused("unknown_group");
        sleep(2);
        cr_assert(eq(i64, kt_qint(url2, SUM), 0));
        kt_run_stop(r);

        char *ini = ini_for(url2, group, topic);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "verify", ini, NULL), 1), "%s", out);
        cr_assert(strstr(out, "start refused (unknown_group)") != NULL, "%s",
                  out);
        free(out);
        cr_assert(eq(int,
                     kb(&out, "offsets reset --consumer sp --to earliest", ini,
                        NULL),
                     0),
                  "%s", out);
        free(out);
        run_until(url2, group, topic, 40, 2, NULL);
        cr_assert(eq(i64, kt_qint(url2, SUM), total),
                  "the whole history applied once");
        cr_assert(eq(i64, kt_qint(url1, SUM), total));
}

/* ---- 3. the group's offsets reset forward by an operator */

KT_BACKENDS_PARAMS(startpos, offset_reset_forward)
ParameterizedTest(int *backend, startpos, offset_reset_forward, .timeout = 300)
{
        need_kafka();
        char *url = db(*backend);
        char *topic = kt_unique("sp_fw");
        char *group = kt_unique("g_fw");
        kt_topic(topic, 1);
        long long first = produce(topic, "f", 0, 20, 2);
        run_until(url, group, topic, 20, 0, NULL);
        produce(topic, "f", 20, 20, 2);
        /* kafka-consumer-groups --reset-offsets --to-latest */
        commit_offset(group, topic, 40);

        kt_run_t *r = start(url, group, topic);
        assert_refused("committed_ahead");
        sleep(2);
        cr_assert(eq(i64, kt_qint(url, SUM), first));
        cr_assert(eq(i64, kt_committed_sum(group, topic, 1), 40),
                  "a refused partition commits nothing");

        char *ini = ini_for(url, group, topic);
        char *out = NULL;
        /* status shows it; a reset while the group has a member is refused
         * by Kafka, and changes nothing. */
        cr_assert(eq(int, kb(&out, "status", ini, " --json"), 0), "%s", out);
        cr_assert(strstr(out, "start refused (committed_ahead)") != NULL, "%s",
                  out);
        free(out);
        cr_assert(eq(int,
                     kb(&out, "offsets reset --consumer sp --to committed",
                        ini, NULL),
                     1),
                  "%s", out);
        cr_assert(strstr(out, "stop the consumers of group") != NULL, "%s",
                  out);
        free(out);
        cr_assert(eq(i64, kt_qint(url, WM), 20));
        kt_run_stop(r);

        cr_assert(eq(int, kb(&out, "verify", ini, NULL), 1), "%s", out);
        cr_assert(strstr(out, "start refused (committed_ahead)") != NULL, "%s",
                  out);
        free(out);
        cr_assert(eq(int,
                     kb(&out, "offsets reset --consumer sp --to committed",
                        ini, NULL),
                     0),
                  "%s", out);
        free(out);
        cr_assert(eq(i64, kt_qint(url, WM), 40));

        long long later = produce(topic, "f", 40, 5, 7);
        run_until(url, group, topic, 25, 2, NULL);
        cr_assert(eq(i64, kt_qint(url, SUM), first + later),
                  "the skip accepted, the records after it applied once");
        cr_assert(eq(int, kb(&out, "verify", ini, NULL), 0), "%s", out);
        free(out);
}

/* ---- 4. the crash case: Kafka's offset behind the watermark */

KT_BACKENDS_PARAMS(startpos, crash_behind)
ParameterizedTest(int *backend, startpos, crash_behind, .timeout = 300)
{
        need_kafka();
        char *url = db(*backend);
        char *topic = kt_unique("sp_cr");
        char *group = kt_unique("g_cr");
        kt_topic(topic, 1);
        long long first = produce(topic, "c", 0, 20, 1);
        run_until(url, group, topic, 20, 0, NULL);
        /* As after a kill between the database's COMMIT and the offset
         * commit: Kafka's offset behind the watermark. */
        commit_offset(group, topic, 10);
        long long more = produce(topic, "c", 20, 10, 100);

        log_clear();
        kinbox_consumer_stats_t st;
        run_until(url, group, topic, 30, 2, &st);
        cr_assert(eq(i64, kt_qint(url, SUM), first + more),
                  "nothing applied twice, nothing skipped");
        cr_assert(eq(u64, st.processed, 10));
        cr_assert(eq(u64, st.duplicates, 0),
                  "the record at W-1 is dropped, not counted as a "
                  "duplicate");
        cr_assert(logged("is behind the DB watermark"), "%s", log_buf);
        bool none = !logged("refused (");
        cr_assert(none, "%s", log_buf);
        cr_assert(eq(dbl, refused_gauge(), 0.0));
        cr_assert(eq(i64, kt_committed_sum(group, topic, 1), 30));
        char *ini = ini_for(url, group, topic);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "offsets list", ini, " --json"), 0), "%s",
                  out);
        cr_assert(strstr(out, "\"verdict\": \"watermark\"") != NULL, "%s",
                  out);
        cr_assert(strstr(out, "\"identity_matches\": true") != NULL, "%s",
                  out);
        free(out);
}

/* ---- 5. `kinbox run`: /readyz and /metrics while a partition is refused */

/* `kinbox run` pid stopped (SIGTERM): exit 0 within 60 s. */
static void
stop_kinbox(pid_t pid, const char *log)
{
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0), "see %s", log);
}

static char *
run_ini(const char *url, const char *group, const char *topic, int port)
{
        return kt_write_ini(url,
                            "[consumer.points]\ngroup.id = %s\n"
                            "topics = %s\nhandler = points\n"
                            "[metrics]\nlisten = 127.0.0.1:%d\n",
                            group, topic, port);
}

KT_BACKENDS_PARAMS(startpos, readyz_while_refused)
ParameterizedTest(int *backend, startpos, readyz_while_refused, .timeout = 300)
{
        need_kafka();
        char *url1 = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("sp_rz");
        char *group = kt_unique("g_rz");
        kt_topic(topic, 1);
        long long total = kt_produce_grants(topic, 0, 20, 0, "o", 0, NULL);
        char *ini1 = run_ini(url1, group, topic, kt_free_port());
        char *log1 = kt_tmp("sp_rz1");
        pid_t pid = kt_spawn_kinbox(ini1, NULL, log1);
        cr_assert(
            eq(i64,
               kt_wait_qint(url1, "SELECT COUNT(*) FROM kinbox_inbox", 20, 90),
               20));
        stop_kinbox(pid, log1);

        /* A new database under the same group. */
        char *url2 = kt_fresh_db(kt_backend(*backend));
        int port = kt_free_port();
        char *ini2 = run_ini(url2, group, topic, port);
        char *log2 = kt_tmp("sp_rz2");
        pid = kt_spawn_kinbox(ini2, NULL, log2);
        char *body = NULL;
        cr_assert(eq(int,
                     kt_wait_http(port, "/readyz", 503, "refused", 60, &body),
                     503),
                  "%s", body);
        free(body);
        cr_assert(eq(int,
                     kt_wait_http(port, "/metrics", 200,
                                  "kinbox_consumer_partitions_refused{"
                                  "consumer=\"points\"} 1",
                                  60, &body),
                     200));
        cr_assert(strstr(body, "kinbox_consumer_partitions_refused{"
                               "consumer=\"points\"} 1") != NULL,
                  "%s", body);
        free(body);
        cr_assert(
            eq(i64, kt_qint(url2, "SELECT COUNT(*) FROM kinbox_inbox"), 0));
        stop_kinbox(pid, log2);
        char *s = kt_slurp(log2);
        cr_assert(s && strstr(s, "refused (unknown_group)") &&
                      strstr(s, group),
                  "%s", s ? s : "");
        free(s);

        char *out = NULL;
        cr_assert(eq(int,
                     kb(&out, "offsets reset --consumer points --to earliest",
                        ini2, NULL),
                     0),
                  "%s", out);
        free(out);
        pid = kt_spawn_kinbox(ini2, NULL, log2);
        cr_assert(
            eq(int, kt_wait_http(port, "/readyz", 200, NULL, 60, &body), 200),
            "%s", body);
        free(body);
        cr_assert(
            eq(i64,
               kt_wait_qint(url2, "SELECT COUNT(*) FROM kinbox_inbox", 20, 90),
               20));
        stop_kinbox(pid, log2);
        kt_assert_points(url2, total, 20);
}
