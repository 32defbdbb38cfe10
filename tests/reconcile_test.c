/*
 * reconcile_test.c -- `kinbox reconcile` and the periodic reconciliation
 * of `kinbox run`, on both backends, with the built-in modules' checks:
 * clean after a normal run of the ledger consumer; a ledger posting
 * deleted behind kinbox's back is reported (exit 1, the deposit named,
 * the gauge kinbox_reconcile_discrepancies set); points balances that
 * differ from their flow rows are reported.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Run `kinbox ARGS`; stdout into *out (malloc'ed). Returns the exit
 * status. */
static int
kb(char **out, const char *args)
{
        return kt_kinbox(out, NULL, false, "%s", args);
}

static json_t *
reconcile_json(const char *ini, int want_rc)
{
        char args[1024], *out = NULL;
        snprintf(args, sizeof(args), "reconcile -c %s --json", ini);
        int rc = kb(&out, args);
        cr_assert(eq(int, rc, want_rc), "kinbox %s: exit %d, output:\n%s",
                  args, rc, out);
        json_error_t je;
        json_t *j = json_loads(out, 0, &je);
        cr_assert(j != NULL, "not JSON: %s (%s)", out, je.text);
        free(out);
        return j;
}

/* The rows array of check `name` in a `reconcile --json` document. */
static json_t *
check_rows(json_t *doc, const char *name)
{
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(doc, "checks"), i, c)
        {
                if (!strcmp(json_string_value(json_object_get(c, "check")),
                            name))
                        return json_object_get(c, "rows");
        }
        cr_fatal("check %s did not run", name);
        return NULL;
}

/* GET /metrics from 127.0.0.1:port; the body (malloc'ed) or NULL. */
static char *
scrape(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
                if (fd >= 0)
                        close(fd);
                return NULL;
        }
        const char req[] = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
        if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
                close(fd);
                return NULL;
        }
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap);
        for (ssize_t r; (r = read(fd, buf + n, cap - n - 1)) > 0;) {
                n += (size_t)r;
                if (n + 1 == cap)
                        buf = realloc(buf, cap *= 2);
        }
        buf[n] = '\0';
        close(fd);
        return buf;
}

/* The metrics port `kinbox run` printed in its log. */
static int
log_port(const char *log)
{
        for (int i = 0; i < 300; i++) {
                char *s = kt_slurp(log);
                const char *p = s ? strstr(s, "(port ") : NULL;
                long port = p ? strtol(p + 6, NULL, 10) : 0;
                free(s);
                if (port > 0)
                        return (int)port;
                usleep(100000);
        }
        cr_fatal("kinbox run never printed its metrics port");
        return 0;
}

/* Wait until the exposition has `series value`; fail naming the last
 * value seen. */
static void
wait_gauge(int port, const char *series, const char *value)
{
        char want[512];
        snprintf(want, sizeof(want), "\n%s %s\n", series, value);
        char *last = NULL;
        for (int i = 0; i < 300; i++) {
                free(last);
                last = scrape(port);
                if (last && strstr(last, want)) {
                        free(last);
                        return;
                }
                usleep(100000);
        }
        const char *p = last ? strstr(last, series) : NULL;
        cr_fatal("no \"%s %s\" on /metrics; found: %.120s", series, value,
                 p ? p : "(series absent)");
}

static const char *
now_sql(int backend)
{
        return backend ? "CURRENT_TIMESTAMP(6)" : "now()";
}

KT_BACKENDS_PARAMS(reconcile, ledger_posting_deleted)
ParameterizedTest(int *backend, reconcile, ledger_posting_deleted,
                  .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *prefix = kt_unique("rc");
        char topic[256];
        snprintf(topic, sizeof(topic), "%s.deposit.paid", prefix);
        kt_topic(topic, 2);
        char *ini = kt_write_ini(url,
                                 "[reconcile]\ngrace = 0\ninterval = 1s\n"
                                 "[metrics]\nlisten = 127.0.0.1:0\n"
                                 "[relay]\nmodules = deposit\n"
                                 "[consumer.ledger]\ntopics = %s\n"
                                 "handler = ledger\n",
                                 topic);
        char args[1024], *out = NULL;
        snprintf(args, sizeof(args), "migrate -c %s", ini);
        cr_assert(eq(int, kb(&out, args), 0), "%s", out);
        free(out);

        /* Five paid deposits and their deposit.paid events. */
        kt_producer_t *p = kt_producer_new();
        for (int i = 1; i <= 5; i++) {
                char sql[512];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO deposits (deposit_id, user_id, amount, "
                         "currency, status, channel_order_id, updated_at) "
                         "VALUES ('d-%d', %d, %d, 'EUR', 'PAYMENT_SUCCEEDED', "
                         "NULL, %s)",
                         i, i, 100 * i, now_sql(*backend));
                kt_exec(url, sql);
                char payload[256], key[32], id[32];
                snprintf(payload, sizeof(payload),
                         "{\"deposit_id\": \"d-%d\", \"user_id\": %d, "
                         "\"amount\": %d, \"currency\": \"EUR\"}",
                         i, i, 100 * i);
                snprintf(key, sizeof(key), "%d", i);
                snprintf(id, sizeof(id), "deposit.paid:d-%d", i);
                kt_produce(p, topic, -1, key, payload, id);
        }
        kt_producer_flush_destroy(p);

        char *log = kt_tmp("reconcile_run");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = log_port(log);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM ledger_posting", 5, 60),
               5));

        /* After a normal run: clean, every check of both modules ran. */
        json_t *doc = reconcile_json(ini, 0);
        cr_assert(eq(i64,
                     json_integer_value(json_object_get(doc, "discrepancies")),
                     0));
        cr_assert(eq(sz, json_array_size(json_object_get(doc, "checks")), 5));
        json_decref(doc);
        wait_gauge(port,
                   "kinbox_reconcile_discrepancies{check=\"deposit.paid_"
                   "without_posting\"}",
                   "0");

        /* Behind kinbox's back: deposit d-3's posting disappears. */
        kt_exec(url, "DELETE FROM ledger_line WHERE deposit_id = 'd-3'");
        kt_exec(url, "DELETE FROM ledger_posting WHERE deposit_id = 'd-3'");

        doc = reconcile_json(ini, 1);
        json_t *rows = check_rows(doc, "deposit.paid_without_posting");
        cr_assert(eq(sz, json_array_size(rows), 1));
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(
                         json_array_get(rows, 0), "deposit_id")),
                     "d-3"));
        /* The wallet and the clearing account still hold its amount. */
        rows = check_rows(doc, "ledger.account_balances");
        cr_assert(eq(sz, json_array_size(rows), 2));
        cr_assert(eq(
            sz, json_array_size(check_rows(doc, "ledger.unbalanced_postings")),
            0));
        json_decref(doc);

        /* The human output names the deposit and the check. */
        snprintf(args, sizeof(args), "reconcile -c %s", ini);
        cr_assert(eq(int, kb(&out, args), 1));
        cr_assert(strstr(out, "deposit.paid_without_posting") &&
                      strstr(out, "deposit_id=d-3"),
                  "%s", out);
        free(out);

        /* kinbox run's periodic run exports it for the alert rules. */
        wait_gauge(port,
                   "kinbox_reconcile_discrepancies{check=\"deposit.paid_"
                   "without_posting\"}",
                   "1");
        wait_gauge(port,
                   "kinbox_reconcile_discrepancies{check=\"ledger.account_"
                   "balances\"}",
                   "2");
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
}

KT_BACKENDS_PARAMS(reconcile, points_balance_vs_flows)
ParameterizedTest(int *backend, reconcile, points_balance_vs_flows,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *ini = kt_write_ini(url, "[reconcile]\ngrace = 0\n"
                                      "[consumer.points]\ntopics = unused\n"
                                      "handler = points\n");
        kt_exec(url, "INSERT INTO user_account (user_id, points) VALUES "
                     "(1, 30), (2, 5)");
        kt_exec(url, "INSERT INTO user_points_flow (user_id, order_id, "
                     "biz_type, points_delta) VALUES (1, 'o-1', 'grant', 10), "
                     "(1, 'o-2', 'grant', 20), (2, 'o-3', 'grant', 5)");
        json_t *doc = reconcile_json(ini, 0);
        cr_assert(
            eq(sz, json_array_size(check_rows(doc, "points.balance_vs_flows")),
               0));
        json_decref(doc);

        /* A grant applied to the balance twice; a flow without account. */
        kt_exec(url, "UPDATE user_account SET points = 40 WHERE user_id = 1");
        kt_exec(url, "INSERT INTO user_points_flow (user_id, order_id, "
                     "biz_type, points_delta) VALUES (3, 'o-4', 'grant', 7)");
        doc = reconcile_json(ini, 1);
        json_t *rows = check_rows(doc, "points.balance_vs_flows");
        cr_assert(eq(sz, json_array_size(rows), 2));
        json_t *r0 = json_array_get(rows, 0), *r1 = json_array_get(rows, 1);
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(r0, "user_id")),
                     "1"));
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(r0, "balance")),
                     "40"));
        cr_assert(eq(
            str, (char *)json_string_value(json_object_get(r0, "flow_total")),
            "30"));
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(r1, "user_id")),
                     "3"));
        cr_assert(json_object_get(r1, "balance") &&
                  json_is_null(json_object_get(r1, "balance")));
        json_decref(doc);

        /* A grace period hides what is younger. */
        char *ini2 = kt_write_ini(url, "[reconcile]\ngrace = 1h\n"
                                       "[consumer.points]\ntopics = unused\n"
                                       "handler = points\n");
        doc = reconcile_json(ini2, 0);
        json_decref(doc);
}
