/*
 * console_test.c -- the operator's console of `kinbox run` (issue 41), on
 * both backends, against a real `kinbox run` with real dead letters: the
 * page in headless Chromium (tests/console_test.py, a small WebDriver
 * client) loads with no console error, shows the database's dead count
 * and lag, renders a payload holding <script> as text, replays one dead
 * letter (applied once: the balance in SQL) and discards another (its
 * parked followers applied in order); the JSON endpoints carry the
 * security headers, refuse actions without the token or from another
 * Origin, and hold no secret. Chromium missing fails the test.
 * Screenshots of the PostgreSQL run (dev broker) go to docs/console-*.png.
 * The relay's view (JSON level): a polling relay's state and counts, and
 * the log relay's slot lag against pg_replication_slots.
 */
#include "harness.h"

#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOKEN "kt-console-token-0123456789abcdef"

typedef struct run {
        char *url, *topic, *ini, *log;
        pid_t pid;
        int port;
} run_t;

static long long
dead_id(const char *url, const char *msgid)
{
        return kt_qintf(url,
                        "SELECT id FROM kinbox_dead_letter WHERE message_id "
                        "= '%s'",
                        msgid);
}

static void
grant(kt_producer_t *p, const char *topic, const char *key, int user,
      const char *order, int points)
{
        char payload[160], id[64];
        snprintf(payload, sizeof(payload),
                 "{\"order_id\":\"%s\",\"user_id\":%d,\"grant_points\":%d}",
                 order, user, points);
        snprintf(id, sizeof(id), "m-%s", order);
        kt_produce(p, topic, 0, key, payload, id);
}

/* A file holding TOKEN (console.token_file). */
static char *
token_file(void)
{
        char *tok = kt_tmp("console_token");
        FILE *f = fopen(tok, "w");
        cr_assert(f != NULL);
        fprintf(f, "%s\n", TOKEN);
        fclose(f);
        return tok;
}

/* A database with three dead letters (user 999: a rule, its key held
 * with two followers parked; user 998: a rule; a payload with markup) and
 * `kinbox run` with the console on it. */
static void
start(run_t *r, int backend)
{
        r->url = kt_fresh_db(kt_backend(backend));
        r->topic = kt_unique("con");
        kt_topic(r->topic, 1);
        kt_exec(r->url, "ALTER TABLE user_points_flow ADD CONSTRAINT kt_no999 "
                        "CHECK (user_id <> 999)");
        kt_exec(r->url, "ALTER TABLE user_points_flow ADD CONSTRAINT kt_no998 "
                        "CHECK (user_id <> 998)");
        kt_produce_grants(r->topic, 0, 20, 0, "o", 0, NULL);
        kt_producer_t *p = kt_producer_new();
        grant(p, r->topic, "hk", 999, "o-999", 7);
        grant(p, r->topic, "hk", 7001, "o-f1", 5);
        grant(p, r->topic, "hk", 7001, "o-f2", 6);
        grant(p, r->topic, "rk", 998, "o-998", 9);
        kt_produce(p, r->topic, 0, "xk",
                   "<script>window.__kbx=1</script><img src=x "
                   "onerror=\"window.__kbx=2\">",
                   "m-xss");
        kt_producer_flush_destroy(p);
        char *tok = token_file();
        r->port = kt_free_port();
        r->ini = kt_write_ini(
            r->url,
            "[metrics]\nlisten = 127.0.0.1:%d\n"
            "[console]\nenabled = true\ntoken_file = %s\n"
            "[consumer.points]\ngroup.id = %s\ntopics = %s\n"
            "handler = points\nretry.max = 2\nretry.backoff.base.ms = 10\n"
            "dead_letter.hold_key = true\n",
            r->port, tok, kt_unique("cong"), r->topic);
        r->log = kt_tmp("console_run");
        r->pid = kt_spawn_kinbox(r->ini, NULL, r->log);
        cr_assert(
            eq(i64,
               kt_wait_qint(r->url, "SELECT COUNT(*) FROM kinbox_dead_letter",
                            3, 90),
               3),
            "%s", kt_tail(r->log, 30));
        cr_assert(eq(
            i64,
            kt_wait_qint(r->url, "SELECT COUNT(*) FROM kinbox_parked", 2, 60),
            2));
}

static void
stop(run_t *r)
{
        kill(r->pid, SIGTERM);
        cr_assert(eq(int, kt_wait(r->pid, 60), 0), "%s", kt_tail(r->log, 30));
}

/* tests/console_test.py MODE ARGS: its JSON answer (the test fails on a
 * non-zero exit, with its reason). */
static json_t *
driver(const run_t *r, const char *mode, const char *extra)
{
        char *out = kt_tmp("console_py_out"), *err = kt_tmp("console_py_err");
        char cmd[4096];
        snprintf(cmd, sizeof(cmd),
                 "python3 %s/tests/console_test.py %s --base "
                 "http://127.0.0.1:%d --token %s --secret '%s' %s >%s 2>%s",
                 KINBOX_SOURCE_DIR, mode, r->port, TOKEN, r->url, extra, out,
                 err);
        int st = system(cmd);
        char *e = kt_slurp(err), *o = kt_slurp(out);
        cr_assert(eq(int, st, 0), "console_test.py %s failed:\n%s\n%s", mode,
                  e ? e : "", o ? o : "");
        json_t *j = json_loads(o ? o : "", 0, NULL);
        cr_assert(j != NULL, "%s", o ? o : "");
        free(e);
        free(o);
        return j;
}

KT_BACKENDS_PARAMS(console, headers_token_origin)
ParameterizedTest(int *backend, console, headers_token_origin, .timeout = 240)
{
        run_t r;
        start(&r, *backend);
        json_t *j = driver(&r, "headers", "");
        json_decref(j);
        /* Refused actions changed nothing and were logged. */
        cr_assert(eq(i64,
                     kt_qint(r.url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                    "WHERE status = 'dead'"),
                     3));
        stop(&r);
        char *log = kt_slurp(r.log);
        cr_assert(strstr(log, "audit: by=127.0.0.1") != NULL, "%s", log);
        cr_assert(strstr(log, TOKEN) == NULL, "the token is in the log");
        free(log);
}

KT_BACKENDS_PARAMS(console, browser)
ParameterizedTest(int *backend, console, browser, .timeout = 300)
{
        run_t r;
        start(&r, *backend);
        long long d999 = dead_id(r.url, "m-o-999"),
                  d998 = dead_id(r.url, "m-o-998"),
                  dxss = dead_id(r.url, "m-xss");
        long long lag = kt_high_sum(r.topic, 1) -
                        kt_qint(r.url, "SELECT COALESCE(SUM(next_offset), 0) "
                                       "FROM kinbox_offsets");
        /* The outbox of a destination no relay of this process sends:
         * a dead row and a pending one. */
        kt_exec(r.url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                       "payload, status, attempts, last_error) VALUES "
                       "('points.audit', 'ob-dead', '{}', 'dead', 3, "
                       "'broker said no')");
        kt_exec(r.url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                       "payload) VALUES ('points.audit', 'ob-pend', '{}')");
        long long obd = kt_qint(r.url, "SELECT id FROM kinbox_outbox WHERE "
                                       "idem_key = 'ob-dead'"),
                  obp = kt_qint(r.url, "SELECT id FROM kinbox_outbox WHERE "
                                       "idem_key = 'ob-pend'");
        /* The bug behind 998's dead letter is fixed: its replay applies. */
        kt_exec(r.url,
                "ALTER TABLE user_points_flow DROP CONSTRAINT kt_no998");
        /* The screenshots in docs/: the PostgreSQL run on the dev broker. */
        bool shots = *backend == 0 && !kt_real_kafka();
        char extra[512];
        snprintf(extra, sizeof(extra),
                 "--replay %lld --discard %lld --xss %lld --ob-dead %lld "
                 "--ob-pend %lld --ob-dest points.audit%s%s",
                 d998, d999, dxss, obd, obp,
                 shots ? " --shots " KINBOX_SOURCE_DIR : "",
                 shots ? "/docs" : "");
        json_t *j = driver(&r, "browser", extra);
        char *dump = json_dumps(j, 0);
        cr_assert(
            eq(int, json_array_size(json_object_get(j, "console_errors")), 0),
            "browser console: %s", dump);
        cr_assert(
            eq(i64, json_integer_value(json_object_get(j, "dead_shown")), 3),
            "%s", dump);
        char lagtxt[32];
        snprintf(lagtxt, sizeof(lagtxt), "%lld", lag);
        cr_assert(
            eq(str, (char *)json_string_value(json_object_get(j, "lag_shown")),
               lagtxt),
            "%s", dump);
        const char *xt = json_string_value(json_object_get(j, "xss_text"));
        cr_assert(xt && strstr(xt, "<script>window.__kbx=1</script>"), "%s",
                  dump);
        bool ran = !json_is_false(json_object_get(j, "xss_ran"));
        cr_assert(eq(int, ran, 0), "the payload's script ran: %s", dump);
        cr_assert(
            eq(i64, json_integer_value(json_object_get(j, "xss_elements")), 0),
            "%s", dump);
        const char *rp = json_string_value(json_object_get(j, "replay"));
        const char *dc = json_string_value(json_object_get(j, "discard"));
        cr_assert(rp && !strncmp(rp, "done", 4), "%s", dump);
        cr_assert(dc && !strncmp(dc, "done", 4), "%s", dump);
        const char *acts[] = {"requeue", "cancel", "pause"};
        for (int i = 0; i < 3; i++) {
                const char *v = json_string_value(json_object_get(j, acts[i]));
                cr_assert(v && !strncmp(v, "done", 4), "%s: %s", acts[i],
                          dump);
        }
        free(dump);
        json_decref(j);
        /* The replay applied 998's grant once; the discard released the
         * held key: its followers applied, in offset order. */
        cr_assert(eq(i64,
                     kt_qint(r.url, "SELECT points FROM user_account WHERE "
                                    "user_id = 998"),
                     9));
        cr_assert(eq(i64,
                     kt_qint(r.url, "SELECT COUNT(*) FROM user_points_flow "
                                    "WHERE user_id = 998"),
                     1));
        cr_assert(eq(
            i64,
            kt_wait_qint(r.url, "SELECT COUNT(*) FROM kinbox_parked", 0, 60),
            0));
        cr_assert(eq(i64,
                     kt_wait_qint(r.url,
                                  "SELECT points FROM user_account WHERE "
                                  "user_id = 7001",
                                  11, 60),
                     11));
        cr_assert(
            eq(i64,
               kt_qint(r.url, "SELECT COUNT(*) FROM user_points_flow a JOIN "
                              "user_points_flow b ON a.order_id = 'o-f1' AND "
                              "b.order_id = 'o-f2' WHERE a.id < b.id"),
               1));
        cr_assert(eq(i64,
                     kt_qintf(r.url,
                              "SELECT COUNT(*) FROM kinbox_dead_letter WHERE "
                              "(id = %lld AND status = 'replayed') OR (id = "
                              "%lld AND status = 'discarded')",
                              d998, d999),
                     2));
        cr_assert(eq(i64,
                     kt_qintf(r.url,
                              "SELECT COUNT(*) FROM kinbox_outbox WHERE (id = "
                              "%lld AND status = 'pending' AND attempts = 0) "
                              "OR (id = %lld AND status = 'canceled')",
                              obd, obp),
                     2));
        cr_assert(
            eq(i64,
               kt_qint(r.url, "SELECT COUNT(*) FROM kinbox_outbox_paused "
                              "WHERE destination = 'points.audit'"),
               1));
        stop(&r);
        char *log = kt_slurp(r.log);
        cr_assert(strstr(log, "by=console-test@127.0.0.1 action=\"dead "
                              "replay") != NULL,
                  "%s", log);
        free(log);
}

/* ---- the relay's view */

static void
execf(const char *url, const char *fmt, ...)
{
        char sql[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        kt_exec(url, sql);
}

/* `kinbox run` with the console and a relay only ([relay] enabled, the
 * lines of extra) on url, its broker bootstrap. */
static void
start_relay(run_t *r, char *url, const char *bootstrap, const char *extra)
{
        memset(r, 0, sizeof(*r));
        r->url = url;
        char *tok = token_file();
        FILE *f;
        r->port = kt_free_port();
        r->ini = kt_tmp("console_relay_ini");
        f = fopen(r->ini, "w");
        cr_assert(f != NULL);
        fprintf(f,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "[log]\nlevel = info\n[metrics]\nlisten = 127.0.0.1:%d\n"
                "[console]\nenabled = true\ntoken_file = %s\n"
                "[relay]\nenabled = true\npoll.ms = 100\n%s",
                url, bootstrap, r->port, tok, extra);
        fclose(f);
        r->log = kt_tmp("console_relay_run");
        r->pid = kt_spawn_kinbox(r->ini, NULL, r->log);
}

static json_t *
relay_shown(const run_t *r, const char *extra)
{
        json_t *j = driver(r, "relay", extra);
        json_t *rel = json_incref(json_object_get(j, "relay"));
        json_decref(j);
        bool obj = json_is_object(rel);
        cr_assert(obj, "no relay in the overview");
        return rel;
}

/* A polling relay: the console shows it enabled, its source and what it
 * published (the rows the topic got). */
KT_BACKENDS_PARAMS(console, relay_state)
ParameterizedTest(int *backend, console, relay_state, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("conrel");
        kt_topic(topic, 1);
        for (int i = 0; i < 3; i++)
                execf(url,
                      "INSERT INTO kinbox_outbox (destination, idem_key, "
                      "payload) VALUES ('%s', 'r-%d', '{}')",
                      topic, i);
        run_t r;
        start_relay(&r, url, kt_env("KINBOX_BOOTSTRAP"), "");
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent'",
                                  3, 60),
                     3),
                  "%s", kt_tail(r.log, 30));
        json_t *rel = relay_shown(&r, "--min-published 3");
        char *dump = json_dumps(rel, 0);
        bool enabled = json_is_true(json_object_get(rel, "enabled"));
        cr_assert(enabled, "%s", dump);
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(rel, "source")),
                     "poll"),
                  "%s", dump);
        /* Counters are JSON numbers (3.0). */
        double pub = json_number_value(json_object_get(rel, "published"));
        double failed = json_number_value(json_object_get(rel, "failed"));
        cr_assert(eq(dbl, pub, 3.0), "%s", dump);
        cr_assert(eq(dbl, failed, 0.0), "%s", dump);
        cr_assert(eq(i64, kt_high_sum(topic, 1), 3));
        free(dump);
        json_decref(rel);
        stop(&r);
}

/* The slot's lag as pg_replication_slots has it (bytes of WAL past its
 * confirmed position). */
static long long
slot_lag(const char *url, const char *slot)
{
        return kt_qintf(url,
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), "
                        "confirmed_flush_lsn)::bigint FROM "
                        "pg_replication_slots WHERE slot_name = '%s'",
                        slot);
}

/*
 * relay.source = wal: the console shows the slot's lag in bytes, >= 0
 * and near pg_replication_slots' once caught up; rows appended while the
 * relay is stopped grow it, and a relay that cannot publish them (its
 * broker unreachable) shows at least that lag, at most the slot's now.
 */
Test(console, relay_slot_lag, .timeout = 240)
{
        char *url = kt_fresh_db("postgresql");
        char *topic = kt_unique("conwal");
        char *slot = kt_unique("kbt_con");
        kt_topic(topic, 1);
        char extra[256];
        snprintf(extra, sizeof(extra), "source = wal\nslot = %s\n", slot);
        run_t r;
        start_relay(&r, url, kt_env("KINBOX_BOOTSTRAP"), extra);
        char q[256];
        snprintf(q, sizeof(q),
                 "SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name "
                 "= '%s' AND active",
                 slot);
        cr_assert(eq(i64, kt_wait_qint(url, q, 1, 60), 1), "%s",
                  kt_tail(r.log, 30));
        for (int i = 0; i < 3; i++)
                execf(url,
                      "INSERT INTO kinbox_outbox (destination, idem_key, "
                      "payload) VALUES ('%s', 'w-%d', '{}')",
                      topic, i);
        long long t0 = kt_clock_ms();
        while (kt_high_sum(topic, 1) < 3 && kt_clock_ms() - t0 < 60000)
                usleep(200000);
        cr_assert(eq(i64, kt_high_sum(topic, 1), 3), "%s", kt_tail(r.log, 30));
        json_t *rel = relay_shown(&r, "--min-lag 0");
        char *dump = json_dumps(rel, 0);
        cr_assert(eq(str,
                     (char *)json_string_value(json_object_get(rel, "source")),
                     "wal"),
                  "%s", dump);
        long long shown = (long long)json_number_value(
            json_object_get(rel, "slot_lag_bytes"));
        long long now = slot_lag(url, slot);
        cr_assert(shown >= 0 && shown < 1048576, "%s", dump);
        cr_assert(now >= 0 && now < 1048576, "pg_replication_slots: %lld",
                  now);
        free(dump);
        json_decref(rel);
        stop(&r);

        /* Stopped: 1 MB of events appended (random text: TOAST cannot
         * compress it away), the slot's lag grows. */
        long long before = slot_lag(url, slot);
        execf(url,
              "INSERT INTO kinbox_outbox (destination, idem_key, payload) "
              "SELECT '%s', 'big-' || i, convert_to((SELECT "
              "string_agg(md5(random()::text || i || j), '') FROM "
              "generate_series(1, 125) j), 'UTF8') FROM generate_series(1, "
              "250) i",
              topic);
        long long grown = slot_lag(url, slot);
        cr_assert(grown >= before + 500000, "slot lag %lld, then %lld", before,
                  grown);
        /* A relay that cannot publish them confirms nothing past them: the
         * console shows the grown lag. */
        start_relay(&r, url, "127.0.0.1:1", extra);
        char want[64];
        snprintf(want, sizeof(want), "--min-lag %lld", grown);
        rel = relay_shown(&r, want);
        shown = (long long)json_number_value(
            json_object_get(rel, "slot_lag_bytes"));
        now = slot_lag(url, slot);
        cr_assert(shown >= grown && shown <= now,
                  "shown %lld, pg_replication_slots %lld then %lld", shown,
                  grown, now);
        json_decref(rel);
        kill(r.pid, SIGTERM);
        kt_wait(r.pid, 60);
        /* Slots outlive databases' connections: drop this one. */
        snprintf(q, sizeof(q),
                 "SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name "
                 "= '%s' AND NOT active",
                 slot);
        kt_wait_qint(url, q, 1, 30);
        execf(url, "SELECT pg_drop_replication_slot('%s')", slot);
}
