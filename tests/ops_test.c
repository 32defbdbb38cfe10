/*
 * ops_test.c -- operations on both backends: pruning, the retention check
 * of `kinbox run`, and every admin subcommand (status, dead, outbox,
 * verify, prune) run as a child process against real data.
 */
#include "harness.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "admin_int.h"
#include "db.h"
#include "internal.h"
#include "metrics.h"

/* kb() / kb_json() take the command line as a format. */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

/* Run `kinbox ARGS` and capture stdout (and stderr into *err when not
 * NULL). Returns the exit status. */
static int
kb(char **out, char **err, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int rc = kt_kinboxv(out, err, false, fmt, ap);
        va_end(ap);
        return rc;
}

static json_t *
kb_json(int want_rc, const char *fmt, const char *ini, const char *extra)
{
        char *out = NULL, *err = NULL;
        int rc = kb(&out, &err, fmt, ini, extra ? extra : "");
        cr_assert(eq(int, rc, want_rc),
                  "kinbox %s: rc %d\nstdout:%s\nstderr:%s", fmt, rc, out, err);
        json_error_t je;
        json_t *j = json_loads(out, 0, &je);
        cr_assert(j != NULL, "not JSON: %s (%s)", out, je.text);
        free(out);
        free(err);
        return j;
}

static bool
is_my(int backend)
{
        return backend == 1;
}

/* Rows for pruning: 25 inbox rows (20 old), outbox rows of every status,
 * two old dead letters. */
static void
seed_prune_rows(const char *url, bool my)
{
        for (int i = 0; i < 25; i++) {
                char sql[256];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_inbox (consumer, message_id, "
                         "topic, kafka_partition, kafka_offset) VALUES "
                         "('c', 'id-%d', 't', 0, %d)",
                         i, i);
                kt_exec(url, sql);
        }
        const char *old = my ? "CURRENT_TIMESTAMP(6) - INTERVAL 30 DAY"
                             : "now() - interval '30 days'";
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "UPDATE kinbox_inbox SET processed_at = %s WHERE "
                 "kafka_offset < 20",
                 old);
        kt_exec(url, sql);
        /* outbox: 7 old sent, 2 new sent, 3 old dead, 2 pending, 1 old
         * canceled. */
        static const struct {
                const char *status;
                int n;
                bool old;
        } rows[] = {{"sent", 7, true},
                    {"sent", 2, false},
                    {"dead", 3, true},
                    {"pending", 2, false},
                    {"canceled", 1, true}};
        int k = 0;
        for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
                for (int i = 0; i < rows[r].n; i++, k++) {
                        snprintf(sql, sizeof(sql),
                                 "INSERT INTO kinbox_outbox (destination, "
                                 "idem_key, status, sent_at, created_at) "
                                 "VALUES ('d', 'k%d', '%s', %s, %s)",
                                 k, rows[r].status,
                                 rows[r].old ? old
                                 : my        ? "CURRENT_TIMESTAMP(6)"
                                             : "now()",
                                 rows[r].old ? old
                                 : my        ? "CURRENT_TIMESTAMP(6)"
                                             : "now()");
                        kt_exec(url, sql);
                }
        for (int i = 0; i < 2; i++) {
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_dead_letter (consumer, "
                         "message_id, topic, kafka_partition, kafka_offset, "
                         "error, dead_at, first_failed_at) VALUES ('c', "
                         "'dl-%d', 't', 0, %d, 'bad', %s, %s)",
                         i, 100 + i, old, old);
                kt_exec(url, sql);
        }
}

static char *
prune_ini(const char *url, const char *batch)
{
        return kt_write_ini(url,
                            "[prune]\ninbox.retention = 14d\n"
                            "outbox.retention = 7d\nprune.batch = %s\n",
                            batch);
}

/* ---- pruning: only old rows go, dead rows and dead letters stay ---- */

KT_BACKENDS_PARAMS(ops, prune_only_old)
ParameterizedTest(int *backend, ops, prune_only_old, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        seed_prune_rows(url, is_my(*backend));
        char *ini = prune_ini(url, "3");

        json_t *j = kb_json(0, "prune --dry-run --json -c %s%s", ini, NULL);
        cr_assert(
            eq(i64, json_integer_value(json_object_get(j, "inbox_rows")), 20));
        cr_assert(
            eq(i64, json_integer_value(json_object_get(j, "outbox_rows")), 7));
        json_decref(j);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 25),
            "dry run deleted rows");

        char *out = NULL;
        cr_assert(eq(int, kb(&out, NULL, "prune -c %s", ini), 0));
        cr_assert(strstr(out, "deleted 20 rows") != NULL, "%s", out);
        free(out);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 5));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT MIN(kafka_offset) FROM kinbox_inbox"),
               20));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent'"),
                     2));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'dead'"),
                     3),
                  "dead outbox rows must never be pruned");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status <> 'sent'"),
                     6));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"),
                     2),
                  "dead letters must never be pruned");
        /* Again: nothing left to do. */
        j = kb_json(0, "prune --json -c %s%s", ini, NULL);
        cr_assert(
            eq(i64, json_integer_value(json_object_get(j, "inbox_rows")), 0));
        json_decref(j);
}

/* ---- relay.source = wal | binlog: event rows go by created_at ---- */

/* The log relay never marks an event row: with relay.source = wal
 * (PostgreSQL) or binlog (MariaDB) configured, prune deletes event rows
 * created more than outbox.retention ago whatever their status (dead ones
 * aside) and leaves action rows to the sent rule; status does not count
 * event rows as pending. The relay itself is not run: prune and status
 * only read the setting. */
static void
seed_log_rows(const char *url, bool my)
{
        const char *old = my ? "CURRENT_TIMESTAMP(6) - INTERVAL 30 DAY"
                             : "now() - interval '30 days'";
        const char *now = my ? "CURRENT_TIMESTAMP(6)" : "now()";
        static const struct {
                const char *dest, *kind, *status;
                int n;
                bool old_created, old_sent;
        } rows[] = {
            {"orders", "event", "pending", 4, true, false},
            {"orders", "event", "pending", 2, false, false},
            {"orders", "event", "sent", 1, true, false},
            {"orders", "event", "canceled", 1, true, false},
            {"orders", "event", "dead", 1, true, false},
            {"action:mail", "action", "pending", 2, true, false},
            {"action:mail", "action", "sent", 1, true, true},
            {"action:mail", "action", "sent", 1, true, false},
        };
        int k = 0;
        for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
                for (int i = 0; i < rows[r].n; i++, k++) {
                        char sql[512];
                        bool sent = !strcmp(rows[r].status, "sent");
                        snprintf(sql, sizeof(sql),
                                 "INSERT INTO kinbox_outbox (destination, "
                                 "kind, idem_key, status, sent_at, "
                                 "created_at) VALUES ('%s', '%s', 'k%d', "
                                 "'%s', %s, %s)",
                                 rows[r].dest, rows[r].kind, k, rows[r].status,
                                 !sent              ? "NULL"
                                 : rows[r].old_sent ? old
                                                    : now,
                                 rows[r].old_created ? old : now);
                        kt_exec(url, sql);
                }
}

static long long
jint(json_t *j, const char *key)
{
        return (long long)json_integer_value(json_object_get(j, key));
}

/* kinbox_outbox_pending{destination="orders"} and {..."action:mail"} as
 * /metrics samples them with relay.source = src. */
static void
pending_gauges(const char *url, const char *src, double *orders, double *mail)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        kt_set(c, "relay.source", src);
        char e[512];
        kinbox_admin_t *adm = kinbox_admin_new(c, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        cr_assert(eq(int, kinbox__admin_collect_metrics(adm), KINBOX_OK), "%s",
                  kinbox_admin_errstr(adm));
        *orders = kinbox__metrics_value("kinbox_outbox_pending",
                                        "destination=\"orders\"");
        *mail = kinbox__metrics_value("kinbox_outbox_pending",
                                      "destination=\"action:mail\"");
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(c);
}

/* The outbox line of `kinbox status --json` for destination d. */
/* "from_log" of a status line: 1 true, 0 false, -1 absent. */
static int
from_log(json_t *o)
{
        json_t *v = json_object_get(o, "from_log");
        return !v ? -1 : json_is_true(v) ? 1 : 0;
}

static json_t *
status_dest(json_t *st, const char *d)
{
        json_t *a = json_object_get(st, "outbox");
        for (size_t i = 0; i < json_array_size(a); i++) {
                json_t *v = json_array_get(a, i);
                const char *name =
                    json_string_value(json_object_get(v, "destination"));
                if (name && !strcmp(name, d))
                        return v;
        }
        cr_assert(false, "no outbox line for %s", d);
        return NULL;
}

KT_BACKENDS_PARAMS(ops, prune_log_source)
ParameterizedTest(int *backend, ops, prune_log_source, .timeout = 120)
{
        bool my = is_my(*backend);
        char *url = kt_fresh_db(kt_backend(*backend));
        seed_log_rows(url, my);
        const char *prune =
            "[prune]\noutbox.retention = 7d\nprune.batch = 2\n";
        char *poll = kt_write_ini(url, "%s", prune);
        char *logm = kt_write_ini(url, "%s[relay]\nsource = %s\n", prune,
                                  my ? "binlog" : "wal");

        /* poll: unchanged, the pending rows are a backlog. */
        json_t *st = kb_json(0, "status --json -c %s%s", poll, NULL);
        json_t *o = status_dest(st, "orders");
        cr_assert(eq(i64, jint(o, "pending"), 6));
        cr_assert(gt(i64, jint(o, "oldest_pending_age_s"), 29 * 86400));
        cr_assert(eq(int, from_log(o), 0));
        json_decref(st);
        json_t *j = kb_json(0, "prune --dry-run --json -c %s%s", poll, NULL);
        cr_assert(eq(i64, jint(j, "outbox_rows"), 1));
        cr_assert(eq(i64, jint(j, "outbox_log_rows"), 0));
        json_decref(j);

        /* log: event rows are not pending; action rows still are. */
        st = kb_json(0, "status --json -c %s%s", logm, NULL);
        o = status_dest(st, "orders");
        cr_assert(eq(i64, jint(o, "pending"), 0));
        cr_assert(eq(i64, jint(o, "oldest_pending_age_s"), 0));
        cr_assert(eq(i64, jint(o, "dead"), 1));
        cr_assert(eq(int, from_log(o), 1));
        json_t *a = status_dest(st, "action:mail");
        cr_assert(eq(i64, jint(a, "pending"), 2));
        cr_assert(eq(int, from_log(a), 0));
        json_decref(st);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, NULL, "status -c %s", logm), 0));
        cr_assert(strstr(out, "in the log") != NULL, "%s", out);
        free(out);

        /* /metrics: the same. */
        double orders, mail;
        pending_gauges(url, "poll", &orders, &mail);
        cr_assert(eq(dbl, orders, 6));
        cr_assert(eq(dbl, mail, 2));
        pending_gauges(url, my ? "binlog" : "wal", &orders, &mail);
        cr_assert(eq(dbl, orders, 0), "event rows counted as pending");
        cr_assert(eq(dbl, mail, 2));

        /* verify: old pending rows are gaps, event rows in poll mode only. */
        for (int m = 0; m < 2; m++) {
                char *vo = NULL;
                kb(&vo, NULL, "verify --older-than 1m --json -c %s",
                   m ? logm : poll);
                json_t *v = json_loads(vo ? vo : "", 0, NULL);
                cr_assert(v != NULL, "verify: %s", vo);
                char *gaps = json_dumps(json_object_get(v, "outbox"), 0);
                cr_assert(strstr(gaps, "outbox action:mail") != NULL, "%s",
                          gaps);
                cr_assert(eq(int, strstr(gaps, "outbox orders") != NULL, !m),
                          "%s: %s", m ? "log" : "poll", gaps);
                free(gaps);
                json_decref(v);
                free(vo);
        }

        /* The dry run reports them and deletes nothing. */
        j = kb_json(0, "prune --dry-run --json -c %s%s", logm, NULL);
        cr_assert(eq(i64, jint(j, "outbox_rows"), 1));
        cr_assert(eq(i64, jint(j, "outbox_log_rows"), 6));
        json_decref(j);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox"), 13));
        cr_assert(eq(int, kb(&out, NULL, "prune --dry-run -c %s", logm), 0));
        cr_assert(strstr(out, "would delete 6 event rows") != NULL, "%s", out);
        free(out);

        /* Old event rows go in batches whatever their status but dead;
         * young ones, the dead one and pending actions stay. */
        j = kb_json(0, "prune --json -c %s%s", logm, NULL);
        cr_assert(eq(i64, jint(j, "outbox_rows"), 1));
        cr_assert(eq(i64, jint(j, "outbox_log_rows"), 6));
        json_decref(j);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "destination = 'orders' AND status = "
                                  "'pending'"),
                     2),
                  "young event rows must stay");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "destination = 'orders' AND status = "
                                  "'dead'"),
                     1),
                  "dead event rows must stay");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "kind = 'action'"),
                     3),
                  "action rows go only when sent past retention");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "kind = 'action' AND status = 'pending'"),
                     2));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox"), 6));
}

/* ---- a dry run before the catalog has statistics ---- */

/* A partitioned inbox whose range 12 days back holds 3,000 rows the
 * catalog has not counted yet (no ANALYZE: PostgreSQL's reltuples -1,
 * MySQL's TABLE_ROWS 0): prune --dry-run reports them, not "about 0". */
KT_BACKENDS_PARAMS(ops, prune_dry_run_unanalyzed)
ParameterizedTest(int *backend, ops, prune_dry_run_unanalyzed, .timeout = 120)
{
        bool my = is_my(*backend);
        char *url = kt_fresh_db(kt_backend(*backend));
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        kt_set(c, "inbox.layout", "partitioned");
        char e[512];
        cr_assert(eq(int, kinbox_migrate(c, e, sizeof(e)), KINBOX_OK), "%s",
                  e);
        kinbox_conf_destroy(c);
        const char *day = my ? "DATE(UTC_TIMESTAMP() - INTERVAL 12 DAY)"
                             : "date_trunc('day', now() - interval '12 days')";
        static const char digits[] =
            "SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL "
            "SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT "
            "6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9";
        char sql[1600];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
                 "kafka_partition, kafka_offset, msg_at, part_at) SELECT "
                 "'c', CONCAT('m-', n), 't', 0, n, %s, %s FROM (SELECT "
                 "a.n + 10 * b.n + 100 * c.n + 1000 * d.n AS n FROM (%s) a, "
                 "(%s) b, (%s) c, (%s) d) s WHERE n < 3000",
                 day, day, digits, digits, digits, digits);
        kt_exec(url, sql);
        char *ini = kt_write_ini(url, "[prune]\ninbox.layout = partitioned\n"
                                      "inbox.retention = 9d\n");
        json_t *j = kb_json(0, "prune --dry-run --json -c %s%s", ini, NULL);
        long long rows =
            (long long)json_integer_value(json_object_get(j, "inbox_rows"));
        long long dropped = (long long)json_integer_value(
            json_object_get(j, "partitions_dropped"));
        json_decref(j);
        cr_assert(dropped >= 3, "%lld ranges would be dropped", dropped);
        /* Counted (3,000), or the catalog's estimate if it was meanwhile
         * analyzed: never 0. */
        cr_assert(rows >= 1500 && rows <= 4500,
                  "dry run: %lld rows in the ranges past retention", rows);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 3000),
            "the dry run deleted rows");
        /* The command names the ranges it would drop, the one 12 days
         * back among them, on its log (stderr). */
        char *out = NULL, *err = NULL, lab[32];
        cr_assert(
            eq(int, kt_kinbox(&out, &err, false, "prune --dry-run -c %s", ini),
               0),
            "%s", err);
        time_t t = time(NULL) - 12 * 86400;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(lab, sizeof(lab), "%Y%m%d ", &tm);
        long long named = 0;
        for (const char *p = err;
             (p = strstr(p, "would drop inbox partition")); p++)
                named++;
        cr_assert(eq(i64, named, dropped), "%s", err);
        cr_assert(strstr(err, lab) != NULL, "%s not named:\n%s", lab, err);
        free(out);
        free(err);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 3000));
}

/* ---- batches: one statement deletes prune.batch rows ---- */

KT_BACKENDS_PARAMS(ops, prune_batches)
ParameterizedTest(int *backend, ops, prune_batches, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        seed_prune_rows(url, is_my(*backend));
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        kt_set(c, "prune.batch", "3");
        /* A stop request is honoured after each statement: one batch. */
        volatile int stop = 1;
        kinbox_prune_result_t res;
        char e[512];
        cr_assert(
            eq(int, kinbox_prune(c, 0, &stop, &res, e, sizeof(e)), KINBOX_OK),
            "%s", e);
        cr_assert(eq(u64, res.inbox_rows, 3));
        cr_assert(eq(u64, res.outbox_rows, 0));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 22));
        stop = 0;
        cr_assert(
            eq(int, kinbox_prune(c, 0, &stop, &res, e, sizeof(e)), KINBOX_OK),
            "%s", e);
        cr_assert(eq(u64, res.inbox_rows, 17));
        cr_assert(eq(u64, res.outbox_rows, 7));
        kinbox_conf_destroy(c);
}

/* ---- one pruner at a time across instances ---- */

KT_BACKENDS_PARAMS(ops, prune_single_instance)
ParameterizedTest(int *backend, ops, prune_single_instance, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        seed_prune_rows(url, is_my(*backend));
        char *ini = prune_ini(url, "2");
        /* Another instance holds the pruning lock. */
        char e[512];
        kinbox__db_t *holder = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(holder != NULL, "%s", e);
        cr_assert(eq(int, kinbox__db_connect(holder), 0));
        const char *name = "kinbox_prune";
        kinbox_rows_t *r = NULL;
        cr_assert(eq(int,
                     kinbox__db_queryv(holder, holder->ops->sql->try_lock, 1,
                                       &name, &r),
                     0));
        const char *got = kinbox_rows_value(r, 0, 0, NULL);
        cr_assert(got && (!strcmp(got, "t") || !strcmp(got, "1")));
        kinbox_rows_destroy(r);

        json_t *j = kb_json(0, "prune --json -c %s%s", ini, NULL);
        int skipped = json_is_true(json_object_get(j, "skipped"));
        cr_assert(eq(int, skipped, 1));
        json_decref(j);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 25),
            "a second pruner deleted rows");

        /* Two processes at once while nobody holds it: the rows go once,
         * and each process either pruned or stood aside. */
        kinbox__db_queryv(holder, holder->ops->sql->unlock, 1, &name, NULL);
        kinbox__db_destroy(holder);
        char *o1 = kt_tmp("prune1"), *o2 = kt_tmp("prune2");
        char cmd[2048];
        snprintf(cmd, sizeof(cmd),
                 "\"%s\" prune --json -c %s > %s & \"%s\" prune --json -c %s "
                 "> %s; wait",
                 kt_env("KINBOX_BIN"), ini, o1, kt_env("KINBOX_BIN"), ini, o2);
        cr_assert(eq(int, system(cmd), 0));
        long long deleted = 0;
        const char *outs[2] = {o1, o2};
        for (int i = 0; i < 2; i++) {
                char *s = kt_slurp(outs[i]);
                json_t *jj = json_loads(s, 0, NULL);
                cr_assert(jj != NULL, "%s", s);
                deleted +=
                    json_integer_value(json_object_get(jj, "inbox_rows"));
                json_decref(jj);
                free(s);
        }
        cr_assert(eq(i64, deleted, 20));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 5));
}

/* ---- kinbox run prunes every prune.interval ---- */

KT_BACKENDS_PARAMS(ops, prune_thread)
ParameterizedTest(int *backend, ops, prune_thread, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        seed_prune_rows(url, is_my(*backend));
        /* Keep the relay off the seeded pending rows. */
        kt_exec(url, "INSERT INTO kinbox_outbox_paused (destination) "
                     "VALUES ('d')");
        char *ini = kt_write_ini(url, "[prune]\nprune.interval = 1s\n"
                                      "prune.batch = 4\n[relay]\n"
                                      "enabled = true\n");
        char *log = kt_tmp("prune_thread");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 5, 30),
            5));
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent'",
                                  2, 30),
                     2));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        char *out = kt_slurp(log);
        cr_assert(out != NULL &&
                      strstr(out, "pruner: deleted 20 inbox") != NULL,
                  "%s", out ? out : "");
        free(out);
}

/* ---- kinbox run refuses an inbox retention inside the window ---- */

KT_BACKENDS_PARAMS(ops, retention_refused)
ParameterizedTest(int *backend, ops, retention_refused, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("ret");
        kt_topic(topic, 1);
        char *ini = kt_write_ini(url,
                                 "[prune]\ninbox.retention = 1d\n"
                                 "kafka.redelivery.window = 2d\n"
                                 "[consumer.points]\ntopics = %s\n"
                                 "handler = points\n",
                                 topic);
        char *log = kt_tmp("ret");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(int, kt_wait(pid, 60), 2));
        char *out = kt_slurp(log);
        cr_assert(out != NULL &&
                      strstr(out, "inbox.retention (1d = 86400000 ms)") !=
                          NULL,
                  "%s", out);
        cr_assert(strstr(out, "2d = 172800000 ms") != NULL, "%s", out);
        cr_assert(strstr(out, "kafka.redelivery.window") != NULL, "%s", out);
        free(out);
        /* Equal is not enough either; longer starts. */
        ini = kt_write_ini(url,
                           "[prune]\ninbox.retention = 2d\n"
                           "kafka.redelivery.window = 2d\n"
                           "[consumer.points]\ntopics = %s\nhandler = "
                           "points\n",
                           topic);
        pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(int, kt_wait(pid, 60), 2));
        ini = kt_write_ini(url,
                           "[prune]\ninbox.retention = 3d\n"
                           "kafka.redelivery.window = 2d\n"
                           "[consumer.points]\ntopics = %s\nhandler = "
                           "points\n",
                           topic);
        pid = kt_spawn_kinbox(ini, NULL, log);
        /* Past the check: its consumer runs (the refusals above logged no
         * such line; the log is the same file). */
        bool running = false;
        for (int i = 0; i < 600 && !running; i++) {
                char *s = kt_slurp(log);
                running = s && strstr(s, "points: running") != NULL;
                free(s);
                cr_assert(eq(int, waitpid(pid, NULL, WNOHANG), 0),
                          "kinbox run exited:\n%s", kt_slurp(log));
                if (!running)
                        usleep(100000);
        }
        cr_assert(running, "kinbox run did not start:\n%s", kt_slurp(log));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
}

/* ---- dead letters, replay, verify, status: a real run ---- */

static long long
dead_id(const char *url, const char *msgid)
{
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "SELECT id FROM kinbox_dead_letter WHERE message_id = '%s'",
                 msgid);
        return kt_qint(url, sql);
}

KT_BACKENDS_PARAMS(ops, dead_replay_verify_status)
ParameterizedTest(int *backend, ops, dead_replay_verify_status, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("ops");
        char *group = kt_unique("opsg");
        kt_topic(topic, 1);
        /* A database rule that makes user 999's grant fail (a bug fixed
         * later), and a payload no handler can read. */
        kt_exec(url, "ALTER TABLE user_points_flow ADD CONSTRAINT kt_no999 "
                     "CHECK (user_id <> 999)");
        long long total = kt_produce_grants(topic, 0, 20, 0, "o", 0, NULL);
        kt_producer_t *p = kt_producer_new();
        kt_produce(p, topic, 0, "u999",
                   "{\"order_id\":\"o-999\",\"user_id\":999,"
                   "\"grant_points\":7}",
                   "m-999");
        kt_produce(p, topic, 0, "bad\x01key", "not json \x02", "m-bad");
        kt_producer_flush_destroy(p);
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "retry.max = 2\nretry.backoff.base.ms = 10\n",
                                 group, topic);
        char *log = kt_tmp("ops_run");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter", 2,
                            90),
               2));
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 22, 30),
               22));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        long long d999 = dead_id(url, "m-999"), dbad = dead_id(url, "m-bad");

        /* dead list / show */
        json_t *j = kb_json(0, "dead list --json -c %s%s", ini, NULL);
        cr_assert(eq(sz, json_array_size(j), 2));
        json_decref(j);
        char *out = NULL, *err = NULL;
        cr_assert(
            eq(int, kb(&out, NULL, "dead show %lld -c %s", dbad, ini), 0));
        cr_assert(strstr(out, "not json \\x02") != NULL, "%s", out);
        cr_assert(strstr(out, "bad\\x01key") != NULL, "%s", out);
        cr_assert(strstr(out, "m-bad") != NULL, "%s", out);
        free(out);
        char f[128];
        snprintf(f, sizeof(f), "dead show %lld --json -c %%s%%s", d999);
        j = kb_json(0, f, ini, NULL);
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(j, "payload")),
                     "{\"order_id\":\"o-999\",\"user_id\":999,"
                     "\"grant_points\":7}"));
        cr_assert(strstr(json_string_value(json_object_get(j, "headers")),
                         "m-999") != NULL);
        json_decref(j);
        cr_assert(eq(int, kb(NULL, &err, "dead show 999999 -c %s", ini), 4));
        cr_assert(strstr(err, "no dead letter with id 999999") != NULL, "%s",
                  err);
        free(err);

        /* replay: refused while the handler still fails (rolled back) */
        cr_assert(
            eq(int, kb(NULL, &err, "dead replay %lld -c %s", d999, ini), 1));
        cr_assert(strstr(err, "rolled back") != NULL, "%s", err);
        free(err);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE status = 'dead'"),
                     2));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id = 'm-999'"),
                     1),
                  "a failed replay lost the inbox row");
        /* the bug is fixed: replay applies the effect once */
        kt_exec(url, "ALTER TABLE user_points_flow DROP CONSTRAINT kt_no999");
        cr_assert(
            eq(int, kb(&out, &err, "dead replay %lld -c %s", d999, ini), 0),
            "%s", err);
        free(out);
        free(err);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM user_points_flow "
                                  "WHERE user_id = 999"),
                     1));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT points FROM user_account WHERE "
                                  "user_id = 999"),
                     7));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id = 'm-999'"),
                     1));
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "SELECT COUNT(*) FROM kinbox_dead_letter WHERE id = %lld "
                 "AND status = 'replayed'",
                 d999);
        cr_assert(eq(i64, kt_qint(url, sql), 1));
        /* twice: refused, nothing applied again */
        cr_assert(
            eq(int, kb(NULL, &err, "dead replay %lld -c %s", d999, ini), 1));
        cr_assert(strstr(err, "replayed") != NULL, "%s", err);
        free(err);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM user_points_flow "
                                  "WHERE user_id = 999"),
                     1));
        kt_assert_points(url, total + 7, 21);

        /* the unreadable one: replay rejected, then discarded */
        cr_assert(
            eq(int, kb(NULL, NULL, "dead replay %lld -c %s", dbad, ini), 1));
        cr_assert(
            eq(int, kb(NULL, NULL, "dead discard %lld -c %s", dbad, ini), 0));
        cr_assert(
            eq(int, kb(NULL, NULL, "dead discard %lld -c %s", dbad, ini), 1));
        cr_assert(eq(int, kb(NULL, NULL, "dead replay 424242 -c %s", ini), 4));
        j = kb_json(0, "dead list --status dead --json -c %s%s", ini, NULL);
        cr_assert(eq(sz, json_array_size(j), 0));
        json_decref(j);

        /* status */
        j = kb_json(0, "status --json -c %s%s", ini, NULL);
        json_t *c0 = json_array_get(json_object_get(j, "consumers"), 0);
        cr_assert(c0 != NULL);
        cr_assert(eq(
            i64, json_integer_value(json_object_get(c0, "inbox_rows")), 22));
        cr_assert(eq(
            i64, json_integer_value(json_object_get(c0, "dead_letters")), 0));
        cr_assert(
            eq(i64, json_integer_value(json_object_get(c0, "replayed")), 1));
        cr_assert(
            eq(i64, json_integer_value(json_object_get(c0, "discarded")), 1));
        cr_assert(eq(i64, json_integer_value(json_object_get(c0, "lag")), 0));
        cr_assert(
            eq(i64, json_integer_value(json_object_get(j, "inbox_rows")), 22));
        json_decref(j);
        cr_assert(eq(int, kb(&out, NULL, "status -c %s", ini), 0));
        cr_assert(strstr(out, "CONSUMER") != NULL &&
                      strstr(out, "Inbox size: 22") != NULL,
                  "%s", out);
        free(out);

        /* verify: consistent, then a planted gap (watermark below rows) */
        int vrc = kb(&out, NULL, "verify -c %s", ini);
        cr_assert(eq(int, vrc, 0), "%s", out);
        free(out);
        kt_exec(url, "UPDATE kinbox_offsets SET next_offset = 5");
        cr_assert(eq(int, kb(&out, NULL, "verify -c %s", ini), 1), "%s", out);
        cr_assert(strstr(out, "GAP") != NULL, "%s", out);
        free(out);
        j = kb_json(1, "verify --json -c %s%s", ini, NULL);
        int okfalse = json_is_false(json_object_get(j, "ok"));
        cr_assert(eq(int, okfalse, 1));
        json_decref(j);
}

/* ---- outbox subcommands ---- */

KT_BACKENDS_PARAMS(ops, outbox_cli)
ParameterizedTest(int *backend, ops, outbox_cli, .timeout = 120)
{
        bool my = is_my(*backend);
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                     "status, last_error) VALUES ('d1', 'a', 'dead', 'boom'), "
                     "('d1', 'b', 'pending', NULL), ('d1', 'c', 'pending', "
                     "NULL), ('d2', 'd', 'dead', 'x'), ('d2', 'e', 'sent', "
                     "NULL)");
        char *ini = kt_write_ini(url, "");
        json_t *j = kb_json(0, "outbox list --json -c %s%s", ini, NULL);
        cr_assert(eq(sz, json_array_size(j), 5));
        json_decref(j);
        j = kb_json(0,
                    "outbox list --status dead --destination d1 --json -c "
                    "%s%s",
                    ini, NULL);
        cr_assert(eq(sz, json_array_size(j), 1));
        long long dead_id =
            json_integer_value(json_object_get(json_array_get(j, 0), "id"));
        json_decref(j);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, NULL, "outbox list -c %s", ini), 0));
        cr_assert(strstr(out, "boom") != NULL, "%s", out);
        free(out);

        cr_assert(eq(int,
                     kb(NULL, NULL, "outbox requeue %lld -c %s", dead_id, ini),
                     0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "idem_key = 'a' AND status = 'pending' "
                                  "AND attempts = 0 AND last_error IS NULL"),
                     1));
        /* the list no longer shows the error from before the requeue */
        cr_assert(eq(int, kb(&out, NULL, "outbox list -c %s", ini), 0));
        cr_assert(strstr(out, "boom") == NULL, "%s", out);
        free(out);
        cr_assert(eq(int,
                     kb(NULL, NULL, "outbox requeue %lld -c %s", dead_id, ini),
                     4));
        cr_assert(eq(
            int, kb(NULL, NULL, "outbox requeue --destination d2 -c %s", ini),
            0));
        j = kb_json(0, "outbox cancel --destination d1 --json -c %s%s", ini,
                    NULL);
        cr_assert(eq(i64, json_integer_value(json_object_get(j, "count")), 3));
        json_decref(j);
        cr_assert(
            eq(int, kb(NULL, NULL, "outbox cancel 999999 -c %s", ini), 4));

        cr_assert(eq(int, kb(NULL, NULL, "outbox pause d2 -c %s", ini), 0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_outbox_paused"),
                     1));
        j = kb_json(0, "status --json -c %s%s", ini, NULL);
        json_t *ob = json_object_get(j, "outbox");
        bool seen = false;
        for (size_t i = 0; i < json_array_size(ob); i++) {
                json_t *d = json_array_get(ob, i);
                if (!strcmp(
                        json_string_value(json_object_get(d, "destination")),
                        "d2")) {
                        seen = true;
                        int paused =
                            json_is_true(json_object_get(d, "paused"));
                        cr_assert(eq(int, paused, 1));
                        cr_assert(eq(
                            i64,
                            json_integer_value(json_object_get(d, "pending")),
                            1));
                }
        }
        cr_assert(seen);
        json_decref(j);
        cr_assert(eq(int, kb(NULL, NULL, "outbox resume d2 -c %s", ini), 0));
        cr_assert(eq(int, kb(NULL, NULL, "outbox resume d2 -c %s", ini), 4));

        /* verify: a row pending for 10 minutes is a gap at 5m */
        kt_exec(url, my ? "UPDATE kinbox_outbox SET created_at = "
                          "CURRENT_TIMESTAMP(6) - INTERVAL 10 MINUTE WHERE "
                          "destination = 'd2' AND status = 'pending'"
                        : "UPDATE kinbox_outbox SET created_at = now() - "
                          "interval '10 minutes' WHERE destination = 'd2' "
                          "AND status = 'pending'");
        cr_assert(eq(int, kb(&out, NULL, "verify -c %s", ini), 1));
        cr_assert(strstr(out, "outbox d2: 1 row(s) pending longer than 5m") !=
                      NULL,
                  "%s", out);
        free(out);
        cr_assert(
            eq(int, kb(NULL, NULL, "verify --older-than 1h -c %s", ini), 0));
}

/* ---- errors: flags, ids, unreachable database ---- */

KT_BACKENDS_PARAMS(ops, cli_errors)
ParameterizedTest(int *backend, ops, cli_errors, .timeout = 60)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *ini = kt_write_ini(url, "");
        char *err = NULL;
        cr_assert(eq(int, kb(NULL, &err, "status --bogus -c %s", ini), 2));
        cr_assert(strstr(err, "--bogus") != NULL, "%s", err);
        free(err);
        cr_assert(eq(int, kb(NULL, NULL, "dead frobnicate -c %s", ini), 2));
        cr_assert(eq(int, kb(NULL, NULL, "dead show abc -c %s", ini), 2));
        cr_assert(eq(int, kb(NULL, NULL, "outbox requeue -c %s", ini), 2));
        cr_assert(
            eq(int, kb(NULL, NULL, "verify --older-than soon -c %s", ini), 2));
        cr_assert(eq(int, kb(NULL, NULL, "prune"), 2));
        /* Unreachable database (with a password that must not show). */
        char *bad = kt_write_ini(
            *backend ? "mysql://kinbox:s3cretpw@127.0.0.1:1/x"
                     : "postgresql://kinbox:s3cretpw@127.0.0.1:1/x",
            "");
        cr_assert(eq(int, kb(NULL, &err, "status -c %s", bad), 3));
        cr_assert(strstr(err, "unreachable") != NULL, "%s", err);
        cr_assert(strstr(err, "s3cretpw") == NULL, "%s", err);
        free(err);
        cr_assert(eq(int, kb(NULL, NULL, "dead list -c %s", bad), 3));
        cr_assert(eq(int, kb(NULL, NULL, "prune -c %s", bad), 3));
        char *out = NULL;
        cr_assert(eq(int, kb(&out, NULL, "help"), 0));
        cr_assert(strstr(out, "4 not found") != NULL, "%s", out);
        free(out);
}

/* ---- log lines never carry a password ---- */

static char captured[1024];

static void
capture(int level, const char *fac, const char *msg, void *opaque)
{
        (void)level;
        (void)fac;
        (void)opaque;
        snprintf(captured, sizeof(captured), "%s", msg);
}

Test(ops, log_redacts_passwords)
{
        kinbox__log_t lg = {.cb = capture, .level = KINBOX_LOG_DEBUG};
        kinbox__log(&lg, KINBOX_LOG_ERR, "db",
                    "cannot reach postgresql://app:hunter2@db:5432/app and "
                    "mysql://u:p@h/d (user only: mysql://app@h/d)");
        cr_assert(strstr(captured, "hunter2") == NULL, "%s", captured);
        cr_assert(strstr(captured, "postgresql://app:***@db:5432/app") != NULL,
                  "%s", captured);
        cr_assert(strstr(captured, "mysql://u:***@h/d") != NULL, "%s",
                  captured);
        cr_assert(strstr(captured, "mysql://app@h/d") != NULL, "%s", captured);
}

/* ---- an embedded consumer: the handler lives in the test program ---- */

/* The handler of a program that embeds the library: credits the payload's
 * amount to kt_embedded; "bad" is rejected (a dead letter). */
static kinbox_result_t
embedded_credit(kinbox_tx_t *tx, const kinbox_msg_t *m, void *opaque)
{
        (void)opaque;
        size_t n;
        const char *p = kinbox_msg_payload(m, &n);
        char body[32];
        snprintf(body, sizeof(body), "%.*s", (int)n, p ? p : "");
        if (!strcmp(body, "bad")) {
                kinbox_tx_set_error(tx, "not an amount");
                return KINBOX_RESULT_REJECT;
        }
        const char *v[2] = {kinbox_msg_id(m), body};
        kinbox_tx_exec(tx,
                       "INSERT INTO kt_embedded (id, amount) VALUES ($1, "
                       "$2)",
                       2, v);
        return KINBOX_RESULT_OK;
}

/* `status`, `verify` and `dead list/show` as child processes on the
 * consumer's database: with [database] and [kafka] only (the consumers
 * are found in the database), and with a [consumer.NAME] section whose
 * handler cannot be loaded; `dead replay` says it needs the handler. */
KT_BACKENDS_PARAMS(ops, embedded_consumer)
ParameterizedTest(int *backend, ops, embedded_consumer, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "CREATE TABLE kt_embedded (id varchar(64) PRIMARY KEY, "
                     "amount bigint NOT NULL)");
        char *topic = kt_unique("emb");
        kt_topic(topic, 2);
        kt_producer_t *pr = kt_producer_new();
        for (int i = 0; i < 10; i++) {
                char id[32], amount[16];
                snprintf(id, sizeof(id), "e-%d", i);
                snprintf(amount, sizeof(amount), "%d", i == 7 ? 0 : i + 1);
                kt_produce(pr, topic, i % 2, NULL, i == 7 ? "bad" : amount,
                           id);
        }
        kt_producer_flush_destroy(pr);
        /* group.id is the name (the default), as status assumes */
        char *name = kt_unique("embedded");
        kinbox_conf_t *c = kt_conf(url, name, name, topic);
        kt_run_t *r = kt_run_start(c, embedded_credit, NULL, NULL);
        kt_wait_qint(url, "SELECT SUM(next_offset) FROM kinbox_offsets", 10,
                     90);
        kt_run_stop(r);
        cr_assert(eq(i64, kt_qint(url, "SELECT SUM(amount) FROM kt_embedded"),
                     55 - 8));

        /* only [database] and [kafka]: found in the database */
        char *ini = kt_write_ini(url, "");
        json_t *j = kb_json(0, "status --json -c %s%s", ini, NULL);
        json_t *cs = json_object_get(j, "consumers");
        cr_assert(eq(sz, json_array_size(cs), 1));
        json_t *c0 = json_array_get(cs, 0);
        const char *cname = json_string_value(json_object_get(c0, "consumer"));
        cr_assert(eq(str, (char *)cname, name));
        int disc = json_is_true(json_object_get(c0, "discovered"));
        cr_assert(eq(int, disc, 1));
        cr_assert(eq(
            i64, json_integer_value(json_object_get(c0, "inbox_rows")), 10));
        cr_assert(eq(
            i64, json_integer_value(json_object_get(c0, "dead_letters")), 1));
        cr_assert(eq(i64, json_integer_value(json_object_get(c0, "lag")), 0));
        json_decref(j);
        char *out = NULL, *err = NULL;
        cr_assert(eq(int, kb(&out, NULL, "status -c %s", ini), 0));
        cr_assert(strstr(out, name) != NULL &&
                      strstr(out, "found in the database") != NULL,
                  "%s", out);
        free(out);
        cr_assert(eq(int, kb(&out, &err, "verify -c %s", ini), 0), "%s%s", out,
                  err);
        cr_assert(strstr(out, "OK: 0 gap(s); checked 1 consumer(s)") != NULL &&
                      strstr(out, "2 partition(s) (2 against Kafka's") != NULL,
                  "%s", out);
        free(out);
        free(err);
        j = kb_json(0, "dead list --json -c %s%s", ini, NULL);
        cr_assert(eq(sz, json_array_size(j), 1));
        long long dead_id =
            json_integer_value(json_object_get(json_array_get(j, 0), "id"));
        json_decref(j);
        cr_assert(
            eq(int, kb(&out, NULL, "dead show %lld -c %s", dead_id, ini), 0));
        cr_assert(strstr(out, "not an amount") != NULL, "%s", out);
        free(out);

        /* a [consumer.NAME] whose handler does not load here */
        char *ini2 = kt_write_ini(url,
                                  "[consumer.%s]\ntopics = %s\n"
                                  "handler = in_my_program\n",
                                  name, topic);
        j = kb_json(0, "status --json -c %s%s", ini2, NULL);
        c0 = json_array_get(json_object_get(j, "consumers"), 0);
        disc = json_is_true(json_object_get(c0, "discovered"));
        cr_assert(eq(int, disc, 0));
        cr_assert(eq(
            i64, json_integer_value(json_object_get(c0, "inbox_rows")), 10));
        json_decref(j);
        cr_assert(eq(int, kb(&out, NULL, "verify -c %s", ini2), 0), "%s", out);
        free(out);
        j = kb_json(0, "dead list --json -c %s%s", ini2, NULL);
        cr_assert(eq(sz, json_array_size(j), 1));
        json_decref(j);
        cr_assert(eq(int, kb(NULL, NULL, "outbox list -c %s", ini2), 0));
        cr_assert(eq(
            int, kb(NULL, &err, "dead replay %lld -c %s", dead_id, ini2), 2));
        cr_assert(strstr(err, "kinbox_dead_replay()") != NULL, "%s", err);
        free(err);
        /* `run` still needs it */
        cr_assert(eq(int, kb(NULL, &err, "run -c %s", ini2), 2));
        cr_assert(strstr(err, "in_my_program") != NULL, "%s", err);
        free(err);

        /* a database no consumer has used: nothing checked is not OK */
        char *empty = kt_fresh_db(kt_backend(*backend));
        char *ini3 = kt_write_ini(empty, "");
        cr_assert(eq(int, kb(&out, NULL, "verify -c %s", ini3), 4), "%s", out);
        cr_assert(strstr(out, "NOTHING CHECKED") != NULL, "%s", out);
        free(out);
        j = kb_json(4, "verify --json -c %s%s", ini3, NULL);
        int okv = json_is_true(json_object_get(j, "ok"));
        cr_assert(eq(int, okv, 0));
        json_decref(j);
}
