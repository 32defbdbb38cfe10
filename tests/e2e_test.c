/*
 * e2e_test.c -- whole flows as real processes, on both backends:
 *   - issue 4 test 3: a relay SIGKILLed mid-batch (after publishing, before
 *     marking); another relay publishes its leased rows after the lease;
 *     the downstream consumer ends with exactly-once effect;
 *   - issue 4 test 7: order service → relay → Kafka → points consumer with
 *     a relay crash and a consumer crash in the middle;
 *   - issue 5: deposit service → payment.initiate action (simulated channel
 *     timeouts) → deposit.paid → ledger consumer → ledger.applied;
 *   - issue 5: handler modules from handler.path: a good one runs, a wrong
 *     ABI version and a missing symbol are refused at start-up.
 */
#include "harness.h"

#include <librdkafka/rdkafka.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../handlers/points/points.h"
#include "db.h"

#define SQL_INBOX "SELECT COUNT(*) FROM kinbox_inbox"

/* ------------------------------------------------------------ helpers */

/* Run a shell command line; returns its exit status (-1 on a signal). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int
sh(const char *fmt, ...)
{
        char cmd[4096];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof(cmd), fmt, ap);
        va_end(ap);
        int st = system(cmd);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool
log_has(const char *path, const char *needle)
{
        char *s = kt_slurp(path);
        bool ok = s && strstr(s, needle);
        free(s);
        return ok;
}

static void
assert_log_has(const char *path, const char *needle)
{
        char *s = kt_slurp(path);
        cr_assert(s && strstr(s, needle), "%s lacks \"%s\":\n%s", path, needle,
                  s ? s : "(no log)");
        free(s);
}

/* Apply a SQL file of the source tree. */
static void
apply_file(const char *url, const char *rel)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", KINBOX_SOURCE_DIR, rel);
        char *sql = kt_slurp(path);
        cr_assert(sql != NULL, "cannot read %s", path);
        kt_exec(url, sql);
        free(sql);
}

/* Append outbox rows on the test's own connection, one transaction. */
typedef struct tconn {
        PGconn *pg;
        MYSQL *m;
} tconn_t;

static void
tc_open(tconn_t *c, const char *url)
{
        memset(c, 0, sizeof(*c));
        if (strncmp(url, "mysql://", 8)) {
                c->pg = PQconnectdb(url);
                cr_assert(PQstatus(c->pg) == CONNECTION_OK, "%s",
                          PQerrorMessage(c->pg));
                return;
        }
        kinbox__dburl_t u;
        char e[256];
        cr_assert(kinbox__dburl_parse(url, &u, e, sizeof(e)) == 0, "%s", e);
        c->m = mysql_init(NULL);
        cr_assert(mysql_real_connect(c->m, u.host, u.user, u.password,
                                     u.dbname, (unsigned)u.port, NULL,
                                     0) != NULL,
                  "%s", mysql_error(c->m));
        kinbox__dburl_free(&u);
}

static void
tc_sql(tconn_t *c, const char *sql)
{
        if (c->pg) {
                PGresult *r = PQexec(c->pg, sql);
                cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK, "%s: %s", sql,
                          PQresultErrorMessage(r));
                PQclear(r);
        } else {
                cr_assert(mysql_query(c->m, sql) == 0, "%s: %s", sql,
                          mysql_error(c->m));
        }
}

static void
tc_append(tconn_t *c, const kinbox_outbox_msg_t *m)
{
        char e[512];
        kinbox_err_t rc =
            c->pg ? kinbox_outbox_append_pg(c->pg, m, NULL, e, sizeof(e))
                  : kinbox_outbox_append_mysql(c->m, m, NULL, e, sizeof(e));
        cr_assert(rc == KINBOX_OK, "append: %s: %s", kinbox_err_name(rc), e);
}

static void
tc_close(tconn_t *c)
{
        if (c->pg)
                PQfinish(c->pg);
        if (c->m)
                mysql_close(c->m);
}

/* qsort over an array of char *: the elements are pointers to strings. */
static int
cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Distinct message_id headers on topic (read from the beginning up to the
 * high watermarks); *total gets the number of messages read. */
static long long
distinct_ids(const char *topic, int partitions, long long *total)
{
        char e[256];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "bootstrap.servers",
                          kt_env("KINBOX_BOOTSTRAP"), e, sizeof(e));
        rd_kafka_conf_set(conf, "group.id", kt_unique("e2e-reader"), e,
                          sizeof(e));
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(partitions);
        long long want = 0;
        for (int p = 0; p < partitions; p++) {
                int64_t lo, hi;
                cr_assert(rd_kafka_query_watermark_offsets(rk, topic, p, &lo,
                                                           &hi, 10000) == 0);
                want += hi - lo;
                rd_kafka_topic_partition_list_add(l, topic, p)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        }
        cr_assert(rd_kafka_assign(rk, l) == 0);
        rd_kafka_topic_partition_list_destroy(l);
        char **ids = calloc((size_t)want + 1, sizeof(*ids));
        long long n = 0;
        for (int idle = 0; n < want && idle < 100;) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
                if (!m) {
                        idle++;
                        continue;
                }
                if (!m->err) {
                        rd_kafka_headers_t *h = NULL;
                        const void *v = NULL;
                        size_t sz = 0;
                        if (!rd_kafka_message_headers(m, &h) &&
                            !rd_kafka_header_get_last(h, "message_id", &v,
                                                      &sz))
                                ids[n] = strndup(v, sz);
                        else
                                ids[n] = strdup("");
                        n++;
                }
                rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        qsort(ids, (size_t)n, sizeof(*ids), cmp_str);
        long long distinct = 0;
        for (long long i = 0; i < n; i++) {
                if (*ids[i] && (i == 0 || strcmp(ids[i], ids[i - 1])))
                        distinct++;
        }
        for (long long i = 0; i < n; i++)
                free(ids[i]);
        free(ids);
        *total = n;
        return distinct;
}

/* ---- issue 4 test 3: a relay SIGKILLed mid-batch ---- */

KT_BACKENDS_PARAMS(e2e, relay_killed_mid_batch)
ParameterizedTest(int *backend, e2e, relay_killed_mid_batch, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("e3");
        kt_topic(topic, 4);
        const int N = 1000;
        long long total = 0;
        tconn_t c;
        tc_open(&c, url);
        tc_sql(&c, c.pg ? "BEGIN" : "START TRANSACTION");
        for (int i = 0; i < N; i++) {
                char payload[200], idem[64], agg[64];
                int user = i % 37 + 1, pts = i % 9 + 1;
                int n = snprintf(payload, sizeof(payload),
                                 "{\"order_id\":\"o-%d\",\"user_id\":%d,"
                                 "\"grant_points\":%d}",
                                 i, user, pts);
                snprintf(idem, sizeof(idem), "o-%d-points", i);
                snprintf(agg, sizeof(agg), "o-%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = idem,
                                         .aggregate_id = agg,
                                         .payload = payload,
                                         .payload_size = (size_t)n};
                tc_append(&c, &m);
                total += pts;
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        char *ini = kt_write_ini(url, "[relay]\nenabled = true\n"
                                      "lease.ms = 3000\nbatch.size = 100\n"
                                      "action.timeout.ms = 1000\n"
                                      "poll.ms = 100\n");
        /* Relay A publishes three batches, marks two, dies in the third:
         * its rows are on the broker and still leased. */
        char *loga = kt_tmp("e3a");
        pid_t a =
            kt_spawn_kinbox(ini, "KINBOX_FAULT=relay_after_publish:2", loga);
        cr_assert(eq(int, kt_wait(a, 60), -SIGKILL));
        assert_log_has(loga, "relay_after_publish");
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                   "status = 'sent'"),
                     200));
        cr_assert(eq(i64, kt_high_sum(topic, 4), 300));

        /* Relay B: everything else at once, A's 100 rows after the lease. */
        char *logb = kt_tmp("e3b");
        pid_t b = kt_spawn_kinbox(ini, NULL, logb);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent'",
                                  N, 60),
                     N));
        kill(b, SIGTERM);
        cr_assert(eq(int, kt_wait(b, 60), 0));
        assert_log_has(logb, "published 800,");
        /* A's leased batch went out twice: once by A, once by B. */
        cr_assert(eq(i64, kt_high_sum(topic, 4), N + 100));

        /* The downstream consumer applies each grant once. */
        kinbox_conf_t *conf = kt_conf(url, "points", kt_unique("e3g"), topic);
        kt_run_t *r =
            kt_run_start(conf, NULL, kinbox_points_module.handle_batch, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, N, 60), N));
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COALESCE(SUM(next_offset), 0) FROM "
                                  "kinbox_offsets",
                                  N + 100, 30),
                     N + 100));
        kinbox_consumer_stats_t st;
        kt_run_stop_stats(r, &st);
        cr_assert(eq(u64, st.duplicates, 100));
        kt_assert_points(url, total, N);
}

/* ---- issue 4 test 7: orders → relay → Kafka → points, with crashes ---- */

static int
place_orders(const char *url, const char *topic, int from, int to)
{
        int placed = 0;
        for (int i = from; i < to; i++) {
                int rc = sh("\"%s\" \"%s\" place o-%d %d sku-1 %d %d %s "
                            ">/dev/null 2>&1",
                            kt_env("KINBOX_ORDERS_BIN"), url, i, i % 13 + 1,
                            i % 3 + 1, i % 7 + 1, topic);
                cr_assert(rc == 0 || rc == 2, "orders place o-%d: exit %d", i,
                          rc);
                placed += rc == 0;
        }
        return placed;
}

KT_BACKENDS_PARAMS(e2e, orders_to_points_with_crashes)
ParameterizedTest(int *backend, e2e, orders_to_points_with_crashes,
                  .timeout = 300)
{
        const char *be = kt_backend(*backend);
        char *url = kt_fresh_db(be);
        apply_file(url, *backend ? "examples/orders/schema.mysql.sql"
                                 : "examples/orders/schema.postgresql.sql");
        char *topic = kt_unique("e7");
        kt_topic(topic, 4);
        cr_assert(eq(int,
                     sh("\"%s\" \"%s\" stock sku-1 300",
                        kt_env("KINBOX_ORDERS_BIN"), url),
                     0));
        char *ini = kt_write_ini(
            url,
            "[consumer.points]\ngroup.id = %s\ntopics = %s\nhandler = points\n"
            "batch.max = 20\n"
            "[relay]\nenabled = true\nlease.ms = 3000\nbatch.size = 20\n"
            "action.timeout.ms = 1000\n"
            "poll.ms = 100\n",
            kt_unique("e7g"), topic);
        int placed = place_orders(url, topic, 0, 80);

        /* 1. The relay dies after publishing its 2nd batch (the whole
         *    process: the consumer with it). */
        char *log1 = kt_tmp("e7a");
        pid_t p =
            kt_spawn_kinbox(ini, "KINBOX_FAULT=relay_after_publish:1", log1);
        cr_assert(eq(int, kt_wait(p, 60), -SIGKILL));
        assert_log_has(log1, "relay_after_publish");
        placed += place_orders(url, topic, 80, 140);

        /* 2. The consumer dies after its 3rd commit, before storing the
         *    offsets. */
        char *log2 = kt_tmp("e7b");
        p = kt_spawn_kinbox(ini, "KINBOX_FAULT=after_commit:2", log2);
        cr_assert(eq(int, kt_wait(p, 90), -SIGKILL));
        assert_log_has(log2, "after_commit");
        cr_assert(gt(i64, kt_qintf(url, SQL_INBOX), 0));

        /* 3. A clean run finishes the job while more orders come in; stock
         *    runs out on the way. */
        char *log3 = kt_tmp("e7c");
        p = kt_spawn_kinbox(ini, NULL, log3);
        placed += place_orders(url, topic, 140, 220);
        cr_assert(gt(i64, kt_qintf(url, "SELECT COUNT(*) FROM orders"), 0));
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM orders"), placed));
        cr_assert(lt(int, placed, 220), "stock never ran out");
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, placed, 90), placed));
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent'",
                                  placed, 30),
                     placed));
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0));

        /* Points granted exactly once per order; stock never negative. */
        kt_assert_points(url,
                         kt_qintf(url, "SELECT COALESCE(SUM(points), 0) FROM "
                                       "orders"),
                         placed);
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COUNT(*) FROM orders o WHERE NOT "
                                   "EXISTS (SELECT 1 FROM user_points_flow f "
                                   "WHERE f.order_id = o.order_id AND "
                                   "f.user_id = o.user_id)"),
                     0));
        long long stock =
            kt_qintf(url, "SELECT stock FROM inventory WHERE sku = "
                          "'sku-1'");
        cr_assert(ge(i64, stock, 0));
        cr_assert(eq(i64, stock,
                     300 - kt_qintf(url, "SELECT COALESCE(SUM(qty), 0) FROM "
                                         "orders")));
        cr_assert(eq(
            i64, kt_qintf(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 0));
}

/* ---- issue 5: deposit → payment action → deposit.paid → ledger ---- */

KT_BACKENDS_PARAMS(e2e, ledger_flow)
ParameterizedTest(int *backend, e2e, ledger_flow, .timeout = 300)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *prefix = kt_unique("e5");
        char paid[200], applied[200];
        snprintf(paid, sizeof(paid), "%s.deposit.paid", prefix);
        snprintf(applied, sizeof(applied), "%s.ledger.applied", prefix);
        kt_topic(paid, 4);
        kt_topic(applied, 2);
        char *ini = kt_write_ini(
            url,
            "[consumer.ledger]\ngroup.id = %s\ntopics = %s\nhandler = ledger\n"
            "batch.max = 10\n"
            "[relay]\nenabled = true\nmodules = deposit\nlease.ms = 4000\n"
            "poll.ms = 100\nbackoff.base.ms = 50\nbackoff.max.ms = 300\n"
            "action.timeout.ms = 2000\n",
            kt_unique("e5g"), paid);
        /* `kinbox migrate` applies the ledger's and the deposit module's
         * schemas. */
        cr_assert(eq(int,
                     sh("\"%s\" migrate -c \"%s\" >/dev/null",
                        kt_env("KINBOX_BIN"), ini),
                     0));
        const int N = 60;
        long long total = 0;
        for (int i = 0; i < N; i++) {
                int amount = (i * 101) % 5000 + 100;
                cr_assert(eq(int,
                             sh("\"%s\" \"%s\" create d-%d %d %d EUR %s",
                                kt_env("KINBOX_DEPOSIT_BIN"), url, i,
                                i % 7 + 1, amount, paid),
                             0));
                total += amount;
        }
        /* A retried create is a no-op. */
        cr_assert(eq(int,
                     sh("\"%s\" \"%s\" create d-0 1 100 EUR %s",
                        kt_env("KINBOX_DEPOSIT_BIN"), url, paid),
                     0));
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM kinbox_outbox"), N));

        /* The ledger consumer dies after its 2nd commit (relay with it). */
        char *log1 = kt_tmp("e5a");
        pid_t p = kt_spawn_kinbox(ini, "KINBOX_FAULT=after_commit:1", log1);
        cr_assert(eq(int, kt_wait(p, 90), -SIGKILL));
        assert_log_has(log1, "after_commit");

        char *log2 = kt_tmp("e5b");
        p = kt_spawn_kinbox(ini, NULL, log2);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM ledger_posting", N, 90),
               N));
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "SELECT COUNT(*) FROM kinbox_outbox WHERE destination = '%s' "
                 "AND status = 'sent'",
                 applied);
        cr_assert(eq(i64, kt_wait_qint(url, sql, N, 60), N));

        /* A re-produced deposit.paid (new message id): a business
         * duplicate, absorbed and counted, nothing posted twice; and a
         * malformed one: dead-lettered. */
        kt_producer_t *pr = kt_producer_new();
        kt_produce(pr, paid, 0, "d-3",
                   "{\"deposit_id\":\"d-3\",\"user_id\":4,\"amount\":403,"
                   "\"currency\":\"EUR\"}",
                   "reproduced-d-3");
        kt_produce(pr, paid, 1, "d-x",
                   "{\"deposit_id\":\"d-x\",\"user_id\":4,\"amount\":\"12\","
                   "\"currency\":\"EUR\"}",
                   "malformed-1");
        kt_producer_flush_destroy(pr);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id IN ('reproduced-d-3', "
                                  "'malformed-1')",
                                  2, 30),
                     2));
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0));
        cr_assert(eq(
            i64, kt_qintf(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 1));
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM ledger_posting"), N));
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM ledger_line"), 2 * N));
        assert_log_has(log2, "+ 1 (business)");
        cr_assert(
            eq(i64,
               kt_qintf(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                             "WHERE message_id = 'malformed-1' AND error "
                             "LIKE '%%field amount%%'"),
               1));

        /* Every deposit paid exactly once at the channel, despite the
         * simulated timeouts (some after the payment went through). */
        cr_assert(
            eq(i64,
               kt_qintf(url, "SELECT COUNT(*) FROM deposits WHERE status "
                             "= 'PAYMENT_SUCCEEDED'"),
               N));
        cr_assert(eq(
            i64, kt_qintf(url, "SELECT COUNT(*) FROM payment_channel_orders"),
            N));
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COUNT(DISTINCT merchant_ref) FROM "
                                   "payment_channel_orders"),
                     N));
        cr_assert(gt(i64,
                     kt_qintf(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                   "destination = 'action:payment.initiate' "
                                   "AND attempts > 0"),
                     0),
                  "the simulated channel never timed out");
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                   "status <> 'sent'"),
                     0));

        /* Exactly-once postings, zero-sum ledger. */
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM ledger_posting"), N));
        cr_assert(
            eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM ledger_line"), 2 * N));
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COALESCE(SUM(amount), 0) FROM "
                                   "ledger_line"),
                     0));
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COUNT(*) FROM (SELECT deposit_id "
                                   "FROM ledger_line GROUP BY deposit_id "
                                   "HAVING SUM(amount) <> 0) z"),
                     0));
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COALESCE(SUM(balance), 0) FROM "
                                   "ledger_account"),
                     0));
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT balance FROM ledger_account WHERE "
                                   "account_id = "
                                   "'clearing:payment-channel:EUR'"),
                     total));
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT COUNT(*) FROM ledger_account a "
                                   "WHERE balance <> (SELECT SUM(amount) FROM "
                                   "ledger_line l WHERE l.account_id = "
                                   "a.account_id)"),
                     0));
        /* Each wallet holds its user's deposits (as a credit). */
        cr_assert(
            eq(i64,
               kt_qintf(url, "SELECT COUNT(*) FROM (SELECT user_id, "
                             "SUM(amount) AS s FROM deposits GROUP BY "
                             "user_id) d LEFT JOIN ledger_account a ON "
                             "a.account_id = CONCAT('wallet:', "
                             "d.user_id, ':EUR') WHERE a.balance IS NULL "
                             "OR a.balance <> -d.s"),
               0));
        cr_assert(eq(i64, kt_qintf(url, "SELECT COUNT(*) FROM kinbox_inbox"),
                     N + 2));

        /* ledger.applied on the topic: one distinct event per deposit. */
        long long read = 0;
        cr_assert(eq(i64, distinct_ids(applied, 2, &read), N));
        cr_assert(ge(i64, read, N));
        (void)log_has;
}

/* ---- issue 5: handler modules from handler.path ---- */

static char *
module_ini(const char *url, const char *topic, const char *handler)
{
        return kt_write_ini(url,
                            "[consumer.mod]\ngroup.id = %s\ntopics = %s\n"
                            "handler = %s\nhandler.path = %s\n",
                            kt_unique("emg"), topic, handler,
                            kt_env("KINBOX_TEST_MODULES"));
}

KT_BACKENDS_PARAMS(e2e, handler_modules)
ParameterizedTest(int *backend, e2e, handler_modules, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("em");
        kt_topic(topic, 2);

        /* A wrong ABI version: refused at start-up, naming both. */
        char *ini = module_ini(url, topic, "ktwrongabi");
        char *log = kt_tmp("em_abi");
        cr_assert(eq(int, kt_wait(kt_spawn_kinbox(ini, NULL, log), 30), 2));
        assert_log_has(log, "module ABI version 999, this kinbox needs 1..2");

        /* No kinbox_module symbol: refused. */
        ini = module_ini(url, topic, "ktnosym");
        log = kt_tmp("em_nosym");
        cr_assert(eq(int, kt_wait(kt_spawn_kinbox(ini, NULL, log), 30), 2));
        assert_log_has(log, "exports no kinbox_module symbol");

        /* No such module: refused. */
        ini = module_ini(url, topic, "ktmissing");
        log = kt_tmp("em_missing");
        cr_assert(eq(int, kt_wait(kt_spawn_kinbox(ini, NULL, log), 30), 2));
        assert_log_has(log, "cannot load");

        /* A good module: migrated and run. */
        ini = module_ini(url, topic, "ktgood");
        cr_assert(eq(int,
                     sh("\"%s\" migrate -c \"%s\" >/dev/null",
                        kt_env("KINBOX_BIN"), ini),
                     0));
        kt_producer_t *pr = kt_producer_new();
        char id[32], payload[32];
        for (int i = 0; i < 50; i++) {
                snprintf(id, sizeof(id), "mod-%d", i);
                snprintf(payload, sizeof(payload), "%d", i);
                kt_produce(pr, topic, -1, id, payload, id);
        }
        kt_produce(pr, topic, -1, "again", "x", "mod-7"); /* a duplicate */
        kt_producer_flush_destroy(pr);
        log = kt_tmp("em_good");
        pid_t p = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM ktgood_seen", 50, 60),
            50));
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COALESCE(SUM(next_offset), 0) FROM "
                                  "kinbox_offsets",
                                  51, 30),
                     51));
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0));
        assert_log_has(log, "duplicates 1 (redelivered)");
}
