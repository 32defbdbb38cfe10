/*
 * walrelay_test.c -- the log relay on PostgreSQL (relay.source = wal),
 * against the real server (wal_level = logical, scripts/services) and the
 * broker of the run (dev broker, or real Apache Kafka: walrelay_test@kafka):
 * the same records as the polling relay, nothing updated in the table;
 * two writers with rollbacks and a SIGKILL of `kinbox run`, also with
 * every broker killed (kill -9 of Apache Kafka on @kafka); a 100,000-row
 * transaction, 1 MB TOASTed payloads and an ALTER TABLE mid-stream; an
 * idle outbox while other tables write (the slot's retained WAL stays
 * bounded); the refusals (exit 2 naming the setting); event rows pruned
 * (relay.source = wal retention) before the relay read them still
 * published from the WAL; a lost slot refused, and the way back (a new
 * slot, kinbox outbox resend --since) exact.
 *
 * Each test makes its own database (kt_fresh_db), its own topics and its
 * own slot (dropped at the end: slots outlive databases' connections).
 */
#include "logrelay_common.h"

#include "metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *PG = "postgresql";

static void
drop_slot(const char *url, const char *slot)
{
        for (int i = 0; i < 100; i++) {
                if (!kt_qintf(url,
                              "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = '%s' AND NOT active",
                              slot) &&
                    !kt_qintf(url,
                              "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = '%s'",
                              slot))
                        return;
                char sql[300];
                snprintf(sql, sizeof(sql),
                         "SELECT pg_drop_replication_slot(slot_name) FROM "
                         "pg_replication_slots WHERE slot_name = '%s' AND "
                         "NOT active",
                         slot);
                if (!kt_exec_err(url, sql) &&
                    !kt_qintf(url,
                              "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = '%s'",
                              slot))
                        return;
                usleep(100 * 1000);
        }
        cr_assert(false, "slot %s still active", slot);
}

/* Whether the slot confirmed everything written so far (within s). */
static bool
slot_caught_up(const char *url, const char *slot, int timeout_s)
{
        char *lsn = qtext(url, "SELECT pg_current_wal_lsn()::text");
        bool ok = wait_q(url, 1, timeout_s,
                         "SELECT count(*) FROM pg_replication_slots WHERE "
                         "slot_name = '%s' AND confirmed_flush_lsn >= '%s'",
                         slot, lsn);
        free(lsn);
        return ok;
}

/* slot_caught_up() within 90 s: the shared tests' check. */
static bool
wal_caught_up(const char *url, const char *slot)
{
        return slot_caught_up(url, slot, 90);
}

/*
 * The wal relay publishes what the polling relay publishes for the same
 * rows: key, value, headers (message_id, user headers, CloudEvents),
 * timestamp, partition. A rolled-back row is never published; an action
 * row is run by the polling relay of the same kinbox_relay_t (which claims
 * nothing else); no event row is updated.
 */
Test(walrelay, parity_with_polling, .timeout = 180)
{
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(PG);
        char *topic = kt_unique("wal_par");
        char *slot = kt_unique("kbt_par");
        kt_topic(topic, 4);
        /* The slot first: the log keeps what is appended from here on. */
        kinbox_conf_t *wc = log_conf(url, bootstrap, "wal", slot);
        cset(wc, "relay.cloudevents.source", "/walrelay-test");
        const int n = 40;
        kinbox_relay_t *r = relay_new(wc);
        cr_assert(eq(
            int, kinbox_relay_register_action(r, "count", count_action, NULL),
            KINBOX_OK));
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(log_reading(PG, url, slot, 30));
        /* One WAL sender for the relay (its checks leave none behind). */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM pg_stat_replication "
                                  "WHERE application_name = 'kinbox-wal'"),
                     1));
        parity_rows(PG, url, topic, n);
        cr_assert(slot_caught_up(url, slot, 60), "slot not confirmed");
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "kind = 'action' AND status = 'sent'"));
        relay_stop(&tr);
        cr_assert(eq(int, actions_run, 1));
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        cr_assert(eq(u64, st.published, (uint64_t)n));
        kinbox_relay_destroy(r);
        /* The operator's figures: the slot sampled at the start. */
        char lb[300];
        snprintf(lb, sizeof(lb),
                 "relay=\"outbox-test\",slot=\"%s\",status=\"reserved\"",
                 slot);
        cr_assert(kinbox__metrics_value("kinbox_relay_slot_wal_status", lb) ==
                  1.0);
        snprintf(lb, sizeof(lb), "relay=\"outbox-test\",slot=\"%s\"", slot);
        cr_assert(kinbox__metrics_value("kinbox_relay_slot_lag_bytes", lb) >=
                  0.0);
        cr_assert(kinbox__metrics_value("kinbox_relay_published_total",
                                        "relay=\"outbox-test\"") >= n);
        /* Not one event row was updated: all still pending, version 0. */
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT count(*) FROM kinbox_outbox "
                                   "WHERE status = 'pending' AND version = 0"
                                   " AND kind = 'event'"),
                     n));
        tmsgs_t wal;
        consume(bootstrap, topic, (size_t)n, 30, 1500, &wal);
        cr_assert(eq(sz, wal.n, (size_t)n), "wal relay: %zu messages", wal.n);
        msgs_free(&wal);

        assert_polling_parity(url, bootstrap, topic, n, "/walrelay-test");
        drop_slot(url, slot);
}

/* ---------------------------------------------- two writers, SIGKILL */

/*
 * Two writers (rollbacks included) while `kinbox run` (relay.source =
 * wal) is SIGKILLed mid-stream and started again: every committed row on
 * the topic at least once, no rolled-back row, per-aggregate order, the
 * slot confirmed up to the end, no row updated.
 */
Test(walrelay, two_writers_sigkill, .timeout = 300)
{
        logrun_t lr;
        logrun_start(&lr, PG, "wal", "wal_kill");
        two_writers_kill(&lr, false, wal_caught_up);
        /* kinbox status names the slot and what it keeps. */
        char *st = NULL;
        cr_assert(
            eq(int, kt_kinbox(&st, NULL, true, "status -c %s", lr.ini), 0),
            "%s", st);
        char want[300];
        snprintf(want, sizeof(want), "Log relay: slot %s, wal_status reserved",
                 lr.name);
        cr_assert(strstr(st, want) != NULL, "%s", st);
        free(st);
        drop_slot(lr.url, lr.name);
}

/*
 * The same with every broker killed (kill -9 of Apache Kafka on
 * walrelay_test@kafka) before the relay's SIGKILL, records in flight, and
 * started again after the new relay started without one: nothing
 * confirmed past what Kafka acknowledged, so every committed row is on
 * the topic, in order, no rolled-back row.
 */
Test(walrelay, two_writers_broker_kill, .timeout = 400)
{
        logrun_t lr;
        logrun_start(&lr, PG, "wal", "wal_bkill");
        two_writers_kill(&lr, true, wal_caught_up);
        drop_slot(lr.url, lr.name);
}

/* ------------------------------------ large transaction, TOAST, DDL */

static char *
hex_of(const char *p, size_t n)
{
        char *h = malloc(2 * n + 1);
        cr_assert(h != NULL);
        for (size_t i = 0; i < n; i++)
                sprintf(h + 2 * i, "%02x", (unsigned char)p[i]);
        h[2 * n] = '\0';
        return h;
}

/* big_toast_ddl's other messages (arg: the database's URL): the TOASTed
 * payloads byte for byte, never the dead one. */
static void
toast_other(const tmsg_t *m, void *arg)
{
        if (strcmp(m->key, "t"))
                return; /* agg-after */
        cr_assert(strstr(m->msgid, "toast-2") == NULL);
        char q[200];
        snprintf(q, sizeof(q),
                 "SELECT encode(payload, 'hex') FROM "
                 "kinbox_outbox WHERE idem_key = '%s'",
                 strchr(m->msgid, ':') + 1);
        char *want_hex = qtext(arg, q);
        char *got_hex = hex_of(m->value, m->value_size);
        cr_assert(m->value_size > 800000);
        cr_assert(strcmp(want_hex, got_hex) == 0, "%s: payload differs",
                  m->msgid);
        free(want_hex);
        free(got_hex);
}

/*
 * A 100,000-row transaction; ~900 kB incompressible payloads (TOASTed)
 * published byte for byte; a 1.2 MB one dead (larger than the producer
 * takes) while the relay goes on; an ALTER TABLE on the outbox mid-stream
 * (a new Relation message) and rows after it.
 */
Test(walrelay, big_toast_ddl, .timeout = 400)
{
        logrel_t l;
        logrel_start(&l, PG, "wal", "wal_big", 4);
        const char *bootstrap = l.bootstrap, *url = l.url, *topic = l.topic,
                   *slot = l.name;
        const int big = 100000;
        char sql[1200];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key,"
                 " aggregate_id, payload) SELECT '%s', 'big-' || g,"
                 " 'agg-' || (g %% 16), convert_to(g::text, 'UTF8')"
                 " FROM generate_series(0, %d) g",
                 topic, big - 1);
        kt_exec(url, sql);
        /* TOASTed payloads: random hex decoded, incompressible. */
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key,"
                 " aggregate_id, payload) SELECT '%s', 'toast-' || k, 't',"
                 " (SELECT decode(string_agg(md5(random()::text || g::text ||"
                 " k::text), ''), 'hex') FROM generate_series(1,"
                 " CASE WHEN k = 2 THEN 75000 ELSE 56250 END) g)"
                 " FROM generate_series(1, 3) k",
                 topic);
        kt_exec(url, sql);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "idem_key LIKE 'toast-%' AND "
                                  "pg_column_size(payload) > 800000"),
                     3));
        kt_exec(url, "ALTER TABLE kinbox_outbox ADD COLUMN walrelay_extra "
                     "text DEFAULT 'x'");
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key,"
                 " aggregate_id, payload) SELECT '%s', 'after-' || g,"
                 " 'agg-after', convert_to(g::text, 'UTF8')"
                 " FROM generate_series(0, 9) g",
                 topic);
        kt_exec(url, sql);
        cr_assert(slot_caught_up(url, slot, 200), "slot not confirmed");
        logrel_stop(&l);
        /* The 1.2 MB row is dead, with the reason; nothing else changed;
         * the TOASTed ones byte for byte. */
        size_t want = (size_t)big + 2 + 10;
        tmsgs_t got;
        consume(bootstrap, topic, want, 120, 2000, &got);
        check_big_stream(url, &got, want, "toast-2", toast_other, (void *)url);
        msgs_free(&got);
        drop_slot(url, slot);
}

/* ------------------------------------------------- retention */

/*
 * Why the pruner may delete event rows the relay has not read yet
 * (relay.source = wal): the WAL holds the rows as inserted, TOASTed
 * values included. Rows appended while no relay reads the slot, backdated
 * past outbox.retention (an UPDATE: not published) and pruned, are all
 * published byte for byte once the relay starts; a pending action row of
 * the same age stays for the polling relay.
 */
Test(walrelay, pruned_before_read, .timeout = 240)
{
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(PG);
        char *topic = kt_unique("wal_prune");
        char *slot = kt_unique("kbt_prune");
        kt_topic(topic, 2);
        /* The slot exists (made by a first relay), nobody reads it. */
        kinbox_relay_t *r = relay_new(log_conf(url, bootstrap, "wal", slot));
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM pg_replication_slots "
                         "WHERE slot_name = '%s' AND active",
                         slot));
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM pg_replication_slots "
                         "WHERE slot_name = '%s' AND NOT active",
                         slot));
        char sql[1200];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key,"
                 " aggregate_id, payload) SELECT '%s', 'pr-' || g, 'agg',"
                 " convert_to(g::text, 'UTF8') FROM generate_series(0, 4) g",
                 topic);
        kt_exec(url, sql);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key,"
                 " aggregate_id, payload) SELECT '%s', 'pr-toast', 't',"
                 " decode(string_agg(md5(random()::text || g::text), ''),"
                 " 'hex') FROM generate_series(1, 56250) g",
                 topic);
        kt_exec(url, sql);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, kind, "
                     "idem_key) VALUES ('action:later', 'action', 'act-1')");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "idem_key = 'pr-toast' AND "
                                  "pg_column_size(payload) > 800000"),
                     1));
        char *want_hex = qtext(url, "SELECT encode(payload, 'hex') FROM "
                                    "kinbox_outbox WHERE idem_key = "
                                    "'pr-toast'");
        kt_exec(url, "UPDATE kinbox_outbox SET created_at = now() - "
                     "interval '30 days'");
        kinbox_conf_t *pc = kinbox_conf_new();
        kt_set(pc, "database.url", url);
        kt_set(pc, "relay.source", "wal");
        kinbox_prune_result_t res;
        char e[512];
        cr_assert(
            eq(int, kinbox_prune(pc, 0, NULL, &res, e, sizeof(e)), KINBOX_OK),
            "%s", e);
        kinbox_conf_destroy(pc);
        cr_assert(eq(u64, res.outbox_log_rows, 6));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT count(*) FROM kinbox_outbox"), 1),
            "the pending action row must stay");
        /* The relay reads the log: every pruned row is published. */
        r = relay_new(log_conf(url, bootstrap, "wal", slot));
        relay_start(&tr, r);
        tmsgs_t got;
        consume(bootstrap, topic, 6, 120, 2000, &got);
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        cr_assert(eq(sz, got.n, 6), "%zu of 6 pruned rows published", got.n);
        for (int g = 0; g < 5; g++) {
                char id[64];
                snprintf(id, sizeof(id), "pr-%d", g);
                bool found = false;
                for (size_t i = 0; i < got.n; i++)
                        found |= strstr(got.v[i].msgid, id) != NULL;
                cr_assert(found, "%s not published", id);
        }
        const tmsg_t *t = NULL;
        for (size_t i = 0; i < got.n; i++)
                if (strstr(got.v[i].msgid, "pr-toast"))
                        t = &got.v[i];
        cr_assert(t != NULL, "the TOASTed row was not published");
        char *got_hex = hex_of(t->value, t->value_size);
        cr_assert(strcmp(want_hex, got_hex) == 0, "TOASTed payload differs");
        free(got_hex);
        free(want_hex);
        msgs_free(&got);
        drop_slot(url, slot);
}

/* ------------------------------------------------------- idle slot */

static long long
slot_lag(const char *url, const char *slot, const char *col)
{
        return kt_qintf(url,
                        "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(),"
                        " %s), -1)::bigint FROM pg_replication_slots WHERE "
                        "slot_name = '%s'",
                        col, slot);
}

/*
 * An idle outbox on a busy database pins no WAL: other tables write about
 * 200 MB while the wal relay has nothing to publish; the slot's confirmed
 * and restart positions follow the server (keepalives confirmed when
 * nothing is in flight), so the WAL it retains stays bounded.
 */
Test(walrelay, idle_slot_bounded, .timeout = 400)
{
        logrel_t l;
        logrel_start(&l, PG, "wal", "wal_idle", 1);
        const char *url = l.url, *slot = l.name;
        kt_exec(url, "CREATE TABLE walrelay_filler (b bytea)");
        char *start = qtext(url, "SELECT pg_current_wal_lsn()::text");
        long long max_lag = 0;
        const long long mb = 1024 * 1024;
        for (int i = 0; i < 20; i++) {
                /* ~10 MB per statement: rows below the TOAST threshold,
                 * written to the WAL whole. */
                kt_exec(url, "INSERT INTO walrelay_filler SELECT "
                             "convert_to(repeat('x', 1900) || g::text, "
                             "'UTF8') FROM generate_series(1, 5500) g");
                long long lag = slot_lag(url, slot, "confirmed_flush_lsn");
                if (lag > max_lag)
                        max_lag = lag;
        }
        long long written = kt_qintf(url,
                                     "SELECT pg_wal_lsn_diff("
                                     "pg_current_wal_lsn(), '%s')::bigint",
                                     start);
        free(start);
        cr_assert(written > 190 * mb, "only %lld MB of WAL", written / mb);
        kt_exec(url, "CHECKPOINT");
        /* Within a few seconds of the last write the slot holds next to
         * nothing. */
        long long lag = -1, rlag = -1;
        for (int i = 0; i < 60; i++) {
                lag = slot_lag(url, slot, "confirmed_flush_lsn");
                rlag = slot_lag(url, slot, "restart_lsn");
                if (lag >= 0 && lag < 1 * mb && rlag < 16 * mb)
                        break;
                usleep(500 * 1000);
                if (i % 10 == 9)
                        kt_exec(url, "CHECKPOINT");
        }
        cr_log_info("WAL written %lld MB; slot lag at most %lld MB while "
                    "writing, then %lld bytes (restart %lld bytes)",
                    written / mb, max_lag / mb, lag, rlag);
        cr_assert(lag >= 0 && lag < 1 * mb, "confirmed lag %lld", lag);
        cr_assert(rlag >= 0 && rlag < 16 * mb, "restart lag %lld", rlag);
        cr_assert(max_lag < 64 * mb, "the slot pinned %lld MB", max_lag / mb);
        logrel_stop(&l);
        drop_slot(url, slot);
}

/* -------------------------------------------------------- refusals */

/* `kinbox CMD -c ini`: its exit status; *out its output (stderr too). */
static int
kinbox_cmd(const char *cmd, const char *ini, char **out)
{
        return kt_kinbox(out, NULL, true, "%s -c %s", cmd, ini);
}

/* `kinbox run` of ini: its exit status within 30 s, its log in *out. */
static int
run_refused(const char *ini, char **out)
{
        char *log = kt_tmp("wal_refuse_log");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int rc = kt_wait_exit(pid, 30);
        *out = kt_slurp(log);
        return rc;
}

/*
 * A role without REPLICATION, and no free replication slot: kinbox run
 * and kinbox migrate exit 2 naming the setting.
 */
Test(walrelay, refuse_role_and_slots, .timeout = 180)
{
        char *url = kt_fresh_db(PG);
        char *role = kt_unique("norepl");
        char sql[600];
        snprintf(sql, sizeof(sql),
                 "CREATE ROLE %s LOGIN PASSWORD 'pw'; GRANT SELECT ON ALL "
                 "TABLES IN SCHEMA public TO %s",
                 role, role);
        kt_exec(url, sql);
        /* The same database as that role. */
        const char *at = strchr(url, '@');
        cr_assert(at != NULL);
        char rurl[600];
        snprintf(rurl, sizeof(rurl), "postgresql://%s:pw%s", role, at);
        char *ini = kt_write_ini(rurl,
                                 "[relay]\nenabled = true\n"
                                 "source = wal\nslot = %s\n",
                                 role);
        char *out = NULL;
        cr_assert(eq(int, run_refused(ini, &out), 2), "%s", out);
        cr_assert(strstr(out, "relay.source = wal") &&
                      strstr(out, "REPLICATION"),
                  "%s", out);
        free(out);
        cr_assert(eq(int, kinbox_cmd("migrate", ini, &out), 2), "%s", out);
        cr_assert(strstr(out, "REPLICATION") != NULL, "%s", out);
        free(out);

        /* Every slot in use. */
        long long free_slots = kt_qint(
            url, "SELECT current_setting('max_replication_slots')::int - "
                 "(SELECT count(*) FROM pg_replication_slots)");
        char *fill = kt_unique("kbt_fill");
        for (long long i = 0; i < free_slots; i++) {
                snprintf(sql, sizeof(sql),
                         "SELECT 1 FROM pg_create_logical_replication_slot("
                         "'%s_%lld', 'pgoutput')",
                         fill, i);
                kt_exec(url, sql);
        }
        char *slot = kt_unique("kbt_none");
        ini = log_ini(url, "wal", slot);
        char *run_out = NULL;
        int run_rc = run_refused(ini, &run_out);
        int mig_rc = kinbox_cmd("migrate", ini, &out);
        char *mig_out = out;
        for (long long i = 0; i < free_slots; i++) {
                char s[200];
                snprintf(s, sizeof(s), "%s_%lld", fill, i);
                drop_slot(url, s);
        }
        cr_assert(eq(int, run_rc, 2), "%s", run_out);
        free(run_out);
        cr_assert(eq(int, mig_rc, 2), "%s", mig_out);
        cr_assert(strstr(mig_out, "max_replication_slots") != NULL, "%s",
                  mig_out);
        free(mig_out);
}

/*
 * relay.slot_failover = true: before PostgreSQL 17 (Debian 12's 15) kinbox
 * run and kinbox migrate exit 2 naming the setting; from 17 on the slot is
 * made a failover slot (walfailover_test: the failover itself).
 */
Test(walrelay, slot_failover_by_version, .timeout = 120)
{
        char *url = kt_fresh_db(PG);
        char *slot = kt_unique("kbt_fov");
        char *ini = kt_write_ini(url,
                                 "[relay]\nenabled = true\nsource = wal\n"
                                 "slot = %s\nslot_failover = true\n",
                                 slot);
        char *out = NULL;
        if (kt_qint(url, "SELECT current_setting('server_version_num')::int") <
            170000) {
                cr_assert(eq(int, run_refused(ini, &out), 2), "%s", out);
                cr_assert(strstr(out, "relay.slot_failover needs "
                                      "PostgreSQL 17") != NULL,
                          "%s", out);
                free(out);
                cr_assert(eq(int, kinbox_cmd("migrate", ini, &out), 2), "%s",
                          out);
                cr_assert(strstr(out, "relay.slot_failover") != NULL, "%s",
                          out);
                free(out);
                return;
        }
        cr_assert(eq(int, kinbox_cmd("migrate", ini, &out), 0), "%s", out);
        free(out);
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = '%s' AND failover",
                              slot),
                     1));
        drop_slot(url, slot);
}

/* A PostgreSQL server of a test's own (initdb, trust), its role kinbox
 * (SUPERUSER: REPLICATION) and database kinbox. */
typedef struct ownpg {
        char bin[300];
        char *dir;
        char url[200];
        int rc; /* 0: running */
} ownpg_t;

/* Start it with conf (postgresql.conf lines, "\n"-separated). */
static void
ownpg_start(ownpg_t *o, const char *conf)
{
        const char *ctl = kt_env("KINBOX_PG_CTL");
        const char *p = strstr(ctl, "/pg_ctl");
        const char *b = p;
        while (b > ctl && b[-1] != ' ')
                b--;
        cr_assert(p != NULL);
        snprintf(o->bin, sizeof(o->bin), "%.*s", (int)(p - b), b);
        o->dir = kt_tmp("pg_own");
        int port = kt_free_port();
        cr_assert(eq(int,
                     sh("mkdir -p %s && chown postgres %s && runuser -u "
                        "postgres -- %s/initdb -D %s/data -A trust "
                        ">%s.initdb.log 2>&1",
                        o->dir, o->dir, o->bin, o->dir, o->dir),
                     0));
        cr_assert(eq(int,
                     sh("printf \"port = %d\\nlisten_addresses = "
                        "'127.0.0.1'\\nunix_socket_directories = '%s'\\n"
                        "%s\\n\" >> %s/data/postgresql.conf "
                        "&& runuser -u postgres -- %s/pg_ctl -D %s/data -l "
                        "%s/log -w start >/dev/null 2>&1",
                        port, o->dir, conf, o->dir, o->bin, o->dir, o->dir),
                     0));
        o->rc = sh("%s/psql -X -q -h 127.0.0.1 -p %d -U postgres -d postgres "
                   "-c \"CREATE ROLE kinbox LOGIN SUPERUSER\" -c \"CREATE "
                   "DATABASE kinbox OWNER kinbox\" >/dev/null 2>&1",
                   o->bin, port);
        snprintf(o->url, sizeof(o->url),
                 "postgresql://kinbox@127.0.0.1:%d/kinbox", port);
}

static void
ownpg_stop(ownpg_t *o)
{
        sh("runuser -u postgres -- %s/pg_ctl -D %s/data -m immediate -w stop "
           ">/dev/null 2>&1; rm -rf %s",
           o->bin, o->dir, o->dir);
}

/*
 * wal_level = replica (a second PostgreSQL of this test's own): kinbox
 * migrate applies the schema (the publication can be made anyway) and
 * exits 2 naming wal_level; kinbox run exits 2 too.
 */
Test(walrelay, refuse_wal_level, .timeout = 180)
{
        ownpg_t o;
        ownpg_start(&o, "wal_level = replica");
        char *ini = kt_write_ini(o.url, "[relay]\nenabled = true\n"
                                        "source = wal\n");
        char *mig = NULL, *run = NULL;
        int mig_rc = o.rc ? -1 : kinbox_cmd("migrate", ini, &mig);
        int run_rc = o.rc ? -1 : run_refused(ini, &run);
        ownpg_stop(&o);
        cr_assert(eq(int, o.rc, 0));
        cr_assert(eq(int, mig_rc, 2), "%s", mig);
        cr_assert(strstr(mig, "applied") && strstr(mig, "wal_level = logical"),
                  "%s", mig);
        cr_assert(eq(int, run_rc, 2), "%s", run);
        cr_assert(strstr(run, "wal_level = logical") != NULL, "%s", run);
        free(mig);
        free(run);
}

/* Write about mb MB of WAL (a filler table) and end the segment. */
static void
write_wal(const char *url, int mb)
{
        kt_exec(url, "CREATE TABLE IF NOT EXISTS walrelay_filler (b bytea)");
        for (int i = 0; i < mb / 10; i++)
                kt_exec(url, "INSERT INTO walrelay_filler SELECT "
                             "convert_to(repeat('x', 1900) || g::text, "
                             "'UTF8') FROM generate_series(1, 5500) g");
        kt_exec(url, "SELECT pg_switch_wal()");
        kt_exec(url, "CHECKPOINT");
}

/*
 * A lost slot (a server of this test's own with max_slot_wal_keep_size =
 * 16MB; the relay stopped while rows and 100 MB of other WAL were
 * written): `kinbox run` exits 2 naming the lost slot. The documented way
 * back (docs/outbox.md, a lost slot): drop the slot, start the relay (a
 * new slot from now on), `kinbox outbox resend --since` a time before the
 * loss; then every row is on the topic, the lost ones from the resend.
 */
Test(walrelay, lost_slot_then_resend, .timeout = 400)
{
        ownpg_t o;
        ownpg_start(&o, "wal_level = logical\\nmax_slot_wal_keep_size = "
                        "16MB\\nmax_wal_size = 64MB\\nmin_wal_size = 32MB");
        cr_assert(eq(int, o.rc, 0));
        char *topic = kt_unique("wal_lost"), *slot = kt_unique("kbt_lost");
        kt_topic(topic, 2);
        char *ini = log_ini(o.url, "wal", slot), *log = kt_tmp("wal_lost");
        char *out = NULL;
        cr_assert(eq(int, kinbox_cmd("migrate", ini, &out), 0), "%s", out);
        free(out);
        rows_a_then_stop(PG, o.url, slot, ini, log, topic);

        char *since = qtext(o.url, "SELECT to_char(now() AT TIME ZONE 'UTC' "
                                   "- interval '1 second', "
                                   "'YYYY-MM-DD\"T\"HH24:MI:SS')");
        append_rows(PG, o.url, topic, "b", 0, 30);
        bool lost = false;
        for (int i = 0; i < 5 && !lost; i++) {
                write_wal(o.url, 40);
                lost = kt_qintf(o.url,
                                "SELECT count(*) FROM pg_replication_slots "
                                "WHERE slot_name = '%s' AND "
                                "wal_status = 'lost'",
                                slot) == 1;
        }
        cr_assert(lost, "the slot was not lost");

        char *run = NULL;
        int run_rc = run_refused(ini, &run);
        cr_assert(eq(int, run_rc, 2), "%s", run);
        cr_assert(strstr(run, "is lost") && strstr(run, slot), "%s", run);
        free(run);

        drop_slot(o.url, slot);
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(log_reading(PG, o.url, slot, 30), "%s", kt_tail(log, 20));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 30), 0), "%s", kt_tail(log, 30));
        resend_then_all(PG, o.url, ini, log, topic, since);
        drop_slot(o.url, slot);
        ownpg_stop(&o);
        free(since);
}

/* ------------------------------------------------ table-less events */

static void
emit(PGconn *c, const char *topic, const char *idem, const char *agg,
     const char *payload, const kinbox_header_t *h, size_t nh)
{
        kinbox_outbox_msg_t m = {.destination = topic,
                                 .idem_key = idem,
                                 .aggregate_id = agg,
                                 .payload = payload,
                                 .payload_size = payload ? strlen(payload) : 0,
                                 .headers = h,
                                 .header_count = nh};
        char err[300];
        cr_assert(
            eq(int, kinbox_outbox_emit_pg(c, &m, err, sizeof(err)), KINBOX_OK),
            "%s", err);
}

/*
 * kinbox_outbox_emit_pg(): published like a table row (key, payload,
 * headers, message_id), never when rolled back, with no table row; bad
 * envelopes under kinbox's prefix (unknown version, truncated, another
 * writer's) are dead-lettered with their bytes while the relay goes on.
 */
Test(walrelay, emit_pg_and_bad_envelopes, .timeout = 180)
{
        logrel_t l;
        logrel_start(&l, PG, "wal", "wal_emit", 4);
        const char *bootstrap = l.bootstrap, *url = l.url, *topic = l.topic,
                   *slot = l.name;
        tconn_t c;
        tc_open(&c, PG, url);
        kinbox_header_t hdrs[] = {{"h1", "v1", 2}, {"nul", NULL, 0}};
        tc_sql(&c, "BEGIN");
        emit(c.pg, topic, "m-1", "agg-1", "one", hdrs, 2);
        emit(c.pg, topic, "m-2", "agg-1", NULL, NULL, 0);
        kinbox_outbox_msg_t row = {.destination = topic,
                                   .idem_key = "row-3",
                                   .aggregate_id = "agg-1",
                                   .payload = "three",
                                   .payload_size = 5};
        cr_assert(eq(int, tc_append(&c, &row, NULL), KINBOX_OK));
        emit(c.pg, topic, "m-4", NULL, "four", NULL, 0);
        tc_sql(&c, "COMMIT");
        tc_sql(&c, "BEGIN");
        emit(c.pg, topic, "rolled-back", "agg-1", "no", NULL, 0);
        tc_sql(&c, "ROLLBACK");
        /* An action needs the table. */
        kinbox_outbox_msg_t act = {.destination = "action:x", .idem_key = "a"};
        char err[300];
        cr_assert(eq(int, kinbox_outbox_emit_pg(c.pg, &act, err, sizeof(err)),
                     KINBOX_ERR_INVALID));
        /* Bad envelopes: unknown version, truncated, another writer's. */
        tc_sql(&c, "BEGIN");
        tc_sql(&c, "SELECT pg_logical_emit_message(true, 'kinbox.outbox.v1',"
                   " '\\x02000000'::bytea)");
        tc_sql(&c, "SELECT pg_logical_emit_message(true, 'kinbox.outbox.v1',"
                   " '\\x0100000010616263'::bytea)");
        tc_sql(&c, "SELECT pg_logical_emit_message(true, 'kinbox.audit',"
                   " 'hello'::bytea)");
        tc_sql(&c, "SELECT pg_logical_emit_message(true, 'someone.else',"
                   " 'ignored'::bytea)");
        tc_sql(&c, "COMMIT");
        tc_sql(&c, "BEGIN");
        emit(c.pg, topic, "m-5", "agg-1", "five", NULL, 0);
        tc_sql(&c, "COMMIT");
        tc_close(&c);
        cr_assert(slot_caught_up(url, slot, 60), "slot not confirmed");
        logrel_stop(&l);

        tmsgs_t got;
        consume(bootstrap, topic, 5, 30, 1500, &got);
        cr_assert(eq(sz, got.n, 5), "%zu messages", got.n);
        qsort(got.v, got.n, sizeof(*got.v), by_offset);
        char id[300];
        const char *agg1[] = {"m-1", "m-2", "row-3", "m-5"};
        int k = 0;
        for (size_t i = 0; i < got.n; i++) {
                const tmsg_t *m = &got.v[i];
                cr_assert(strstr(m->msgid, "rolled-back") == NULL);
                if (m->key && !strcmp(m->key, "agg-1")) {
                        snprintf(id, sizeof(id), "%s:%s", topic, agg1[k++]);
                        cr_assert(eq(str, m->msgid, id), "order");
                }
        }
        cr_assert(eq(int, k, 4));
        snprintf(id, sizeof(id), "%s:m-1", topic);
        const tmsg_t *m1 = find_msgid(&got, id);
        cr_assert(m1 && m1->value_size == 3 && !memcmp(m1->value, "one", 3));
        cr_assert(eq(sz, rd_kafka_header_cnt(m1->hdrs), 3));
        const void *hv;
        size_t hn;
        bool h1 = !rd_kafka_header_get_last(m1->hdrs, "h1", &hv, &hn) &&
                  hn == 2 && !memcmp(hv, "v1", 2);
        cr_assert(h1, "header h1");
        snprintf(id, sizeof(id), "%s:m-2", topic);
        const tmsg_t *m2 = find_msgid(&got, id);
        cr_assert(m2 && m2->value == NULL, "m-2: null value");
        snprintf(id, sizeof(id), "%s:m-4", topic);
        const tmsg_t *m4 = find_msgid(&got, id);
        cr_assert(m4 && m4->key == NULL);
        msgs_free(&got);
        /* One table row (row-3, pending, untouched); the three bad
         * envelopes dead with their bytes and the reason. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "status = 'pending'"),
                     1));
        cr_assert(
            eq(i64,
               kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                            "status = 'dead' AND destination = "
                            "'kinbox.invalid' AND idem_key LIKE 'wal:%'"),
               3));
        cr_assert(
            eq(i64,
               kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                            "status = 'dead' AND ("
                            "(payload = '\\x02000000'::bytea AND "
                            "last_error LIKE '%unknown version 2%') OR "
                            "(payload = '\\x0100000010616263'::bytea AND "
                            "last_error LIKE '%truncated%') OR "
                            "(payload = 'hello'::bytea AND "
                            "last_error LIKE '%kinbox.audit%'))"),
               3));
        drop_slot(url, slot);
}

/* kinbox_outbox_emit() from a handler: the next hop of each message,
 * keyed by the message's key. */
static kinbox_result_t
emit_hop(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        const char *out = opaque;
        size_t kn = 0;
        const void *k = kinbox_msg_key(msg, &kn);
        char key[64], idem[300];
        snprintf(key, sizeof(key), "%.*s", (int)kn, (const char *)k);
        snprintf(idem, sizeof(idem), "hop-%s", kinbox_msg_id(msg));
        kinbox_outbox_msg_t m = {.destination = out,
                                 .idem_key = idem,
                                 .aggregate_id = key,
                                 .payload = idem,
                                 .payload_size = strlen(idem)};
        return kinbox_outbox_emit(tx, &m) ? KINBOX_RESULT_RETRY
                                          : KINBOX_RESULT_OK;
}

/*
 * Hop by hop with no outbox table: a consumer's handler emits its next
 * event with kinbox_outbox_emit() in its transaction; the wal relay
 * publishes each once per committed inbox row, in the key's order.
 */
Test(walrelay, emit_from_handler, .timeout = 180)
{
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(PG);
        char *in = kt_unique("wal_hop_in"), *out = kt_unique("wal_hop_out");
        char *slot = kt_unique("kbt_hop");
        kt_topic(in, 2);
        kt_topic(out, 2);
        kinbox_relay_t *r = relay_new(log_conf(url, bootstrap, "wal", slot));
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(log_reading(PG, url, slot, 30));
        const int n = 60;
        kt_producer_t *p = kt_producer_new();
        for (int i = 0; i < n; i++) {
                char key[16], id[32], val[32];
                snprintf(key, sizeof(key), "k%d", i % 3);
                snprintf(id, sizeof(id), "m%03d", i);
                snprintf(val, sizeof(val), "%d", i);
                kt_produce(p, in, -1, key, val, id);
        }
        kt_producer_flush_destroy(p);
        kinbox_conf_t *cc = kt_conf(url, "hop", kt_unique("g_hop"), in);
        kt_set(cc, "message_id", "header:message_id");
        kt_run_t *cr = kt_run_start(cc, emit_hop, NULL, out);
        tmsgs_t got;
        consume(bootstrap, out, (size_t)n, 60, 1500, &got);
        kt_run_stop(cr);
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        cr_assert(eq(sz, got.n, (size_t)n), "%zu of %d", got.n, n);
        qsort(got.v, got.n, sizeof(*got.v), by_offset);
        int last[3] = {-1, -1, -1};
        for (size_t i = 0; i < got.n; i++) {
                int k = -1, m = -1;
                cr_assert(sscanf(got.v[i].key, "k%d", &k) == 1 && k >= 0 &&
                          k < 3);
                cr_assert(strstr(got.v[i].value, "hop-") != NULL);
                m = atoi(strchr(got.v[i].value, 'm') + 1);
                cr_assert(m > last[k], "k%d: m%d after m%d", k, m, last[k]);
                last[k] = m;
        }
        cr_assert(
            eq(i64, kt_qint(url, "SELECT count(*) FROM kinbox_outbox"), 0));
        msgs_free(&got);
        drop_slot(url, slot);
}

/*
 * Two `kinbox run` on one slot: the second waits (the slot has one
 * reader), takes over within seconds of a SIGKILL of the first, and
 * publishes what is appended after it; nothing lost.
 */
Test(walrelay, second_relay_takes_over, .timeout = 180)
{
        logrun_t lr;
        takeover_after_kill9(&lr, PG, "wal", "wal_take",
                             "in use by another reader", "is ours now",
                             wal_caught_up);
        drop_slot(lr.url, lr.name);
}

/*
 * The database stops (immediate: crash recovery) and starts again under a
 * running wal relay: it reconnects, resumes from the slot, and every
 * committed row before and after is on the topic, in order.
 */
Test(walrelay, database_restart, .timeout = 240)
{
        logrel_t l;
        restart_under_relay(&l, PG, "wal", "wal_pgrs", wal_caught_up);
        drop_slot(l.url, l.name);
}

/*
 * Broker trouble under the wal relay (librdkafka's mock cluster): retriable
 * produce errors, then every broker down past the delivery deadline and up
 * again. The relay starts again from the confirmed position: every row on
 * the topic at least once, per key in order (a copy only repeats rows
 * already seen).
 */
Test(walrelay, broker_outage, .timeout = 240)
{
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(PG);
        char *topic = kt_unique("wal_outage");
        char *slot = kt_unique("kbt_outage");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 16, 1) == 0);
        kinbox_conf_t *conf = log_conf(url, mk.bootstrap, "wal", slot);
        cset(conf, "kafka.message.timeout.ms", "1000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(log_reading(PG, url, slot, 30));
        rd_kafka_mock_push_request_errors(
            mk.mc, 0 /* Produce */, 4,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT);
        const int aggs = 20, per = 100;
        tconn_t c;
        tc_open(&c, PG, url);
        for (int seq = 0; seq < per; seq++) {
                if (seq == per / 2) {
                        kinbox_relay_stats_t st;
                        for (int i = 0; i < 300; i++) {
                                kinbox_relay_stats(r, &st);
                                if (st.published >= (uint64_t)aggs * 10)
                                        break;
                                usleep(100 * 1000);
                        }
                        mock_brokers(&mk, 3, false);
                }
                tc_sql(&c, "BEGIN");
                for (int a = 0; a < aggs; a++) {
                        char key[48], agg[32], pay[16];
                        snprintf(key, sizeof(key), "a%d-s%d", a, seq);
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
        usleep(2500 * 1000);
        mock_brokers(&mk, 3, true);
        cr_assert(slot_caught_up(url, slot, 120), "slot not confirmed");
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        tmsgs_t got;
        consume(mk.bootstrap, topic, (size_t)(aggs * per), 60, 1000, &got);
        int last[20];
        for (int a = 0; a < aggs; a++)
                last[a] = -1;
        for (size_t i = 0; i < got.n; i++) {
                const tmsg_t *m = &got.v[i];
                int a = atoi(m->key + 4), seq = atoi(m->value);
                cr_assert(seq <= last[a] + 1, "%s: seq %d first seen after %d",
                          m->key, seq, last[a]);
                if (seq > last[a])
                        last[a] = seq;
        }
        for (int a = 0; a < aggs; a++)
                cr_assert(eq(int, last[a], per - 1), "agg %d", a);
        cr_log_info("%zu records for %d rows", got.n, aggs * per);
        msgs_free(&got);
        mock_stop(&mk);
        drop_slot(url, slot);
}
