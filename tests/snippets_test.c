/*
 * snippets_test.c -- the handlers of the documentation run as written: the
 * C blocks of README.md and docs/NAME.md marked "<!-- snippet: NAME -->" are
 * extracted at build time (tests/extract_snippets.sh into snippets.h,
 * compiled here with the project's warnings) and each one consumes a real
 * stream on both backends, every record carrying headers (what broke the
 * README's sscanf() on Apache Kafka: the bytes after a payload were the
 * record's headers), balances asserted in SQL; the README's main() runs
 * too, as a whole program (its literals swapped for the test's services
 * by two macros); the README's outbox append runs on PostgreSQL against
 * its inventory table, and the relay publishes the event (its destination
 * swapped for the test's topic by a third). docs_test checks that
 * every handler the Markdown defines is marked; this suite that every
 * marked one runs. Also on Apache Kafka (snippets_test@kafka).
 */
#include "harness.h"
#include "metrics.h"
#include "outbox_common.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The README's main() runs as written against the test's services: its
 * kinbox_conf_set() calls get the test's database, broker and topic in
 * place of the README's literals, and its kinbox_consumer_run() leaves
 * the consumer where the test can stop it (as a signal handler would). */
static const char *kt_sn_url, *kt_sn_topic;
static kinbox_consumer_t *_Atomic kt_sn_consumer;

static kinbox_err_t
kt_sn_conf_set(kinbox_conf_t *conf, const char *key, const char *value,
               char *errstr, size_t errstr_size)
{
        if (!strcmp(key, "database.url"))
                value = kt_sn_url;
        else if (!strcmp(key, "kafka.bootstrap.servers"))
                value = kt_env("KINBOX_BOOTSTRAP");
        else if (!strcmp(key, "topics"))
                value = kt_sn_topic;
        else if (!strcmp(key, "name") &&
                 kinbox_conf_set(conf, "group.id", kt_unique("gsnm"), errstr,
                                 errstr_size))
                return KINBOX_ERR_INVALID; /* a group of its own per run */
        return kinbox_conf_set(conf, key, value, errstr, errstr_size);
}

static kinbox_err_t
kt_sn_run(kinbox_consumer_t *c)
{
        kt_sn_consumer = c;
        return kinbox_consumer_run(c);
}

/* The README's outbox append publishes to the test's topic in place of
 * "order.paid" (a topic of its own per run). */
static const char *kt_sn_dest;

static kinbox_err_t
kt_sn_append_pg(PGconn *conn, const kinbox_outbox_msg_t *m, int64_t *idp,
                char *errstr, size_t errstr_size)
{
        kinbox_outbox_msg_t t = *m;
        if (kt_sn_dest && !strcmp(t.destination, "order.paid"))
                t.destination = kt_sn_dest;
        return kinbox_outbox_append_pg(conn, &t, idp, errstr, errstr_size);
}

#define kinbox_conf_set kt_sn_conf_set
#define kinbox_consumer_run kt_sn_run
#define kinbox_outbox_append_pg kt_sn_append_pg
#include "snippets.h"
#undef kinbox_conf_set
#undef kinbox_consumer_run
#undef kinbox_outbox_append_pg

/* Every marked snippet has its test below. */
Test(snippets, every_marked_snippet_runs)
{
        static const char *const tested[] = {"readme_credit", "readme_outbox",
                                             "handlers_credit_batch"};
        /* readme_credit: snippets/readme_credit (the handler) and
         * snippets/readme_main (the whole program). */
        size_t n = 0;
        for (; kt_snippet_names[n]; n++) {
                bool found = false;
                for (size_t k = 0; k < sizeof(tested) / sizeof(*tested); k++)
                        found =
                            found || !strcmp(kt_snippet_names[n], tested[k]);
                cr_assert(found, "snippet %s has no test in snippets_test.c",
                          kt_snippet_names[n]);
        }
        cr_assert(eq(sz, n, sizeof(tested) / sizeof(*tested)));
}

/* "ACCOUNT AMOUNT" credits, a key and a message_id header on every
 * record; returns the topic. */
static char *
produce_credits(const char *prefix, int n, int parts)
{
        char *topic = kt_unique(prefix);
        kt_topic(topic, parts);
        kt_producer_t *p = kt_producer_new();
        for (int i = 0; i < n; i++) {
                char id[32], pay[32];
                snprintf(id, sizeof(id), "c-%d", i);
                snprintf(pay, sizeof(pay), "acct-%d %d", i % 3, 10 + i);
                kt_produce(p, topic, -1, i % 2 ? "k1" : "k2", pay, id);
        }
        kt_producer_flush_destroy(p);
        return topic;
}

/* Expected balance of acct-a after n credits (acct-(i % 3) gets 10 + i). */
static long long
expected(int a, int n)
{
        long long s = 0;
        for (int i = a; i < n; i += 3)
                s += 10 + i;
        return s;
}

static void
assert_balances(const char *url, int n)
{
        for (int a = 0; a < 3; a++)
                cr_assert(eq(i64,
                             kt_qintf(url,
                                      "SELECT balance FROM account WHERE id "
                                      "= 'acct-%d'",
                                      a),
                             expected(a, n)),
                          "acct-%d", a);
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 0));
}

/* A fresh database of backend with the table account (the three
 * accounts acct-0..2 at 0 when seeded); its url. */
static char *
accounts_db(int backend, bool seeded)
{
        char *url = kt_fresh_db(kt_backend(backend));
        kt_exec(url, "CREATE TABLE account (id VARCHAR(64) PRIMARY KEY, "
                     "balance BIGINT NOT NULL)");
        if (seeded)
                kt_exec(url, "INSERT INTO account VALUES ('acct-0', 0), "
                             "('acct-1', 0), ('acct-2', 0)");
        return url;
}

/* The offsets committed in url's inbox (their sum) once they reach n
 * within timeout_s. */
static long long
wait_offsets(const char *url, long long n, int timeout_s)
{
        return kt_wait_qint(
            url, "SELECT COALESCE(SUM(next_offset), 0) FROM kinbox_offsets", n,
            timeout_s);
}

/* The README's handler, as the README has it. */
KT_BACKENDS_PARAMS(snippets, readme_credit)
ParameterizedTest(int *backend, snippets, readme_credit, .timeout = 120)
{
        char *url = accounts_db(*backend, true);
        int n = 40;
        char *topic = produce_credits("tsnr", n, 2);
        kinbox_conf_t *c = kt_conf(url, "credits", kt_unique("g"), topic);
        kt_run_t *r = kt_run_start(c, credit, NULL, NULL);
        long long at = wait_offsets(url, n, 60);
        kinbox_consumer_stats_t st;
        kt_run_stop_stats(r, &st);
        cr_assert(eq(i64, at, n));
        assert_balances(url, n);
        cr_assert(eq(u64, st.processed, (uint64_t)n));
}

static void *
readme_main_thread(void *arg)
{
        int *rc = arg;
        *rc = kt_snippet_main_readme_credit();
        return NULL;
}

/* The README's whole program: its main() (configuration, handler,
 * kinbox_consumer_run()) on the test's database, broker and topic. */
KT_BACKENDS_PARAMS(snippets, readme_main)
ParameterizedTest(int *backend, snippets, readme_main, .timeout = 180)
{
        char *url = accounts_db(*backend, true);
        int n = 25;
        kt_sn_url = url;
        kt_sn_topic = produce_credits("tsnm", n, 2);
        pthread_t thr;
        int rc = -1;
        cr_assert(pthread_create(&thr, NULL, readme_main_thread, &rc) == 0);
        long long at = wait_offsets(url, n, 120);
        cr_assert(kt_sn_consumer != NULL);
        kinbox_consumer_stop(kt_sn_consumer);
        pthread_join(thr, NULL);
        cr_assert(eq(i64, at, n));
        cr_assert(eq(int, rc, 0), "the README's main() returned %d", rc);
        assert_balances(url, n);
}

/* docs/handlers.md's batch handler: every batch credits each account
 * several times (the PostgreSQL shape sums per key: no 21000, no split). */
KT_BACKENDS_PARAMS(snippets, handlers_credit_batch)
ParameterizedTest(int *backend, snippets, handlers_credit_batch,
                  .timeout = 120)
{
        char *url = accounts_db(*backend, false);
        int n = 60;
        char *topic = produce_credits("tsnb", n, 1);
        kinbox_conf_t *c = kt_conf(url, "batchcredits", kt_unique("g"), topic);
        kt_run_t *r = kt_run_start(c, NULL, credit_batch, NULL);
        long long at = wait_offsets(url, n, 60);
        kinbox_consumer_stats_t st;
        kt_run_stop_stats(r, &st);
        cr_assert(eq(i64, at, n));
        assert_balances(url, n);
        cr_assert(eq(u64, st.processed, (uint64_t)n));
        cr_assert(eq(u64, st.rolled_back, 0));
        char l[300];
        kinbox__m_labels(l, sizeof(l), "consumer", "batchcredits", "cause",
                         "21000", (char *)NULL);
        double splits =
            kinbox__metrics_value("kinbox_consumer_batch_splits_total", l);
        cr_assert(isnan(splits) || splits == 0.0);
}

/* kinbox_msg_payload(): the bytes are followed by a NUL not counted in
 * the size, for records with headers (whose bytes follow the payload in
 * librdkafka's buffer) and without. */
typedef struct nulcheck {
        int seen, bad;
} nulcheck_t;

static kinbox_result_t
nul_handler(kinbox_tx_t *tx, const kinbox_msg_t *m, void *opaque)
{
        (void)tx;
        nulcheck_t *nc = opaque;
        size_t n;
        const char *p = kinbox_msg_payload(m, &n);
        nc->seen++;
        if (!p || p[n] != '\0' || strlen(p) != n || n != 6)
                nc->bad++;
        return KINBOX_RESULT_OK;
}

KT_BACKENDS_PARAMS(snippets, payload_nul_terminated)
ParameterizedTest(int *backend, snippets, payload_nul_terminated,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("tsnn");
        kt_topic(topic, 1);
        kt_producer_t *p = kt_producer_new();
        for (int i = 0; i < 20; i++) {
                char id[16];
                snprintf(id, sizeof(id), "n-%d", i);
                kt_produce(p, topic, 0, "key", "abc 25", id);
        }
        kt_producer_flush_destroy(p);
        kinbox_conf_t *c = kt_conf(url, "nul", kt_unique("g"), topic);
        kt_set(c, "batch.max", "7");
        nulcheck_t nc = {0, 0};
        kt_run_t *r = kt_run_start(c, nul_handler, NULL, &nc);
        kt_wait_qint(
            url, "SELECT COALESCE(SUM(next_offset), 0) FROM kinbox_offsets",
            20, 60);
        kt_run_stop(r);
        cr_assert(eq(int, nc.seen, 20));
        cr_assert(eq(int, nc.bad, 0));
}

/* The README's outbox append (order_paid()) on PostgreSQL, on the test's
 * own connection: the stock taken and the outbox row written in one
 * transaction; the same append again is KINBOX_ERR_DUPLICATE, changes
 * nothing, and leaves a transaction usable; the relay publishes the event
 * once, as appended. */
Test(snippets, readme_outbox, .timeout = 120)
{
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db("postgresql");
        kt_exec(url, "CREATE TABLE inventory (sku VARCHAR(64) PRIMARY KEY, "
                     "stock INT NOT NULL)");
        kt_exec(url, "INSERT INTO inventory VALUES ('sku-1', 10)");
        char *topic = kt_unique("tsno");
        kt_topic(topic, 2);
        kt_sn_dest = topic;
        PGconn *conn = PQconnectdb(url);
        cr_assert(PQstatus(conn) == CONNECTION_OK, "%s", PQerrorMessage(conn));
        static const char json[] = "{\"order_id\":\"o-1\",\"points\":12}";
        char err[256] = "";
        cr_assert(eq(int, order_paid(conn, json, err, sizeof(err)), KINBOX_OK),
                  "%s", err);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT stock FROM inventory WHERE sku = "
                                  "'sku-1'"),
                     9));
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT count(*) FROM kinbox_outbox WHERE "
                              "destination = '%s' AND idem_key = "
                              "'order-o-1-points' AND aggregate_id = 'o-1' "
                              "AND status = 'pending'",
                              topic),
                     1));
        /* Again: a duplicate, rolled back by the snippet (stock unchanged). */
        cr_assert(eq(int, order_paid(conn, json, err, sizeof(err)),
                     KINBOX_ERR_DUPLICATE),
                  "%s", err);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT stock FROM inventory WHERE sku = "
                                  "'sku-1'"),
                     9));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT count(*) FROM kinbox_outbox"), 1));
        /* The transaction a duplicate leaves is usable: its next
         * statement and its commit apply. */
        PQclear(PQexec(conn, "BEGIN"));
        kinbox_outbox_msg_t m = {.destination = topic,
                                 .idem_key = "order-o-1-points",
                                 .aggregate_id = "o-1",
                                 .payload = json,
                                 .payload_size = strlen(json)};
        cr_assert(eq(int,
                     kinbox_outbox_append_pg(conn, &m, NULL, err, sizeof(err)),
                     KINBOX_ERR_DUPLICATE),
                  "%s", err);
        PGresult *res = PQexec(conn, "UPDATE inventory SET stock = stock + 5 "
                                     "WHERE sku = 'sku-1'");
        cr_assert(eq(int, PQresultStatus(res), PGRES_COMMAND_OK), "%s",
                  PQresultErrorMessage(res));
        PQclear(res);
        res = PQexec(conn, "COMMIT");
        cr_assert(eq(int, PQresultStatus(res), PGRES_COMMAND_OK), "%s",
                  PQresultErrorMessage(res));
        PQclear(res);
        PQfinish(conn);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT stock FROM inventory WHERE sku = "
                                  "'sku-1'"),
                     14));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT count(*) FROM kinbox_outbox"), 1));
        /* The relay publishes it: key o-1, the payload, its message id. */
        cr_assert(
            relay_until_sent(relay_conf(url, bootstrap), url, 1, 30, NULL),
            "the row was not sent");
        tmsgs_t got;
        consume(bootstrap, topic, 1, 30, 1000, &got);
        cr_assert(eq(sz, got.n, 1), "got %zu messages", got.n);
        char want[256];
        snprintf(want, sizeof(want), "%s:order-o-1-points", topic);
        cr_assert(eq(str, got.v[0].msgid ? got.v[0].msgid : "", want));
        cr_assert(eq(str, got.v[0].key ? got.v[0].key : "", "o-1"));
        cr_assert(eq(str, got.v[0].value ? got.v[0].value : "", (char *)json));
        msgs_free(&got);
}
