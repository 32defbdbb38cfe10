/*
 * binlogrelay_test.c -- the log relay on MariaDB (relay.source = binlog),
 * `kinbox run` against the real server (binlog in ROW format,
 * scripts/services) and the broker of the run (dev broker, or real Apache
 * Kafka: binlogrelay_test@kafka): two writers with rollbacks and a SIGKILL
 * of the relay, also with every broker killed (kill -9 of Apache Kafka on
 * @kafka); a second relay waiting on the readers' lock taking over
 * after a kill -9 of the first; a position whose binlog was purged refused
 * (exit 2) and `kinbox outbox resend --since` exact afterwards.
 *
 * Each test makes its own database (kt_fresh_db), topic and relay name
 * (relay.slot): the binlog and the readers' locks are the server's.
 */
#include "logrelay_common.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *MY = "mysql";

/*
 * Two writers (rollbacks included) while `kinbox run` (relay.source =
 * binlog) is SIGKILLed mid-stream and started again: every committed row
 * on the topic at least once, no rolled-back row, per-aggregate order;
 * no outbox row updated.
 */
Test(binlogrelay, two_writers_sigkill, .timeout = 300)
{
        logrun_t lr;
        logrun_start(&lr, MY, "binlog", "bl_kill");
        two_writers_kill(&lr, false, NULL);
}

/*
 * The same with every broker killed (kill -9 of Apache Kafka on
 * binlogrelay_test@kafka) before the relay's SIGKILL, records in flight,
 * and started again after the new relay started without one: the stored
 * GTID never passes what Kafka acknowledged, so every committed row is on
 * the topic, in order, no rolled-back row.
 */
Test(binlogrelay, two_writers_broker_kill, .timeout = 400)
{
        logrun_t lr;
        logrun_start(&lr, MY, "binlog", "bl_bkill");
        two_writers_kill(&lr, true, NULL);
}

/*
 * Two `kinbox run` of one relay name: the second waits on the readers'
 * lock; after a kill -9 of the first it takes over, from the first's
 * stored position: every row on the topic.
 */
Test(binlogrelay, takeover_after_kill9, .timeout = 300)
{
        logrun_t lr;
        takeover_after_kill9(&lr, MY, "binlog", "bl_take",
                             "waiting to take over", NULL, NULL);
}

/* Purge the binlog until its oldest file starts after the current
 * position (PURGE keeps a file the binlog checkpoint still needs). */
static void
purge_all(const char *url)
{
        long long seq = kt_qint(url, "SELECT SUBSTRING_INDEX("
                                     "@@gtid_binlog_pos, '-', -1)");
        long long until = kt_clock_ms() + 20000;
        while (kt_clock_ms() < until) {
                kt_exec(url, "FLUSH BINARY LOGS");
                char *cur = qtext(url, "SHOW MASTER STATUS");
                char q[256];
                snprintf(q, sizeof(q), "PURGE BINARY LOGS TO '%s'", cur);
                kt_exec(url, q);
                char *first = qtext(url, "SHOW BINARY LOGS");
                snprintf(q, sizeof(q),
                         "SELECT SUBSTRING_INDEX(BINLOG_GTID_POS('%s', 4), "
                         "'-', -1)",
                         first);
                free(cur);
                free(first);
                if (kt_qint(url, q) >= seq)
                        return;
                usleep(200 * 1000);
        }
        cr_assert(false, "the binlog was not purged");
}

/*
 * The relay stopped, rows committed meanwhile, the binlog purged past its
 * position: `kinbox run` exits 2 naming the position and `kinbox outbox
 * resend --since`; after the resend the relay starts again and every row
 * is on the topic (the ones the binlog lost from the resend).
 */
Test(binlogrelay, purged_then_resend, .timeout = 300)
{
        char *url = kt_fresh_db(MY);
        char *topic = kt_unique("bl_purge");
        char *name = kt_unique("blp");
        kt_topic(topic, 2);
        char *ini = log_ini(url, "binlog", name);
        char *log = kt_tmp("bl_purge_log");
        rows_a_then_stop(MY, url, name, ini, log, topic);

        char *since = qtext(url, "SELECT DATE_FORMAT(UTC_TIMESTAMP() - "
                                 "INTERVAL 1 SECOND, '%Y-%m-%dT%H:%i:%s')");
        append_rows(MY, url, topic, "b", 0, 30);
        purge_all(url);

        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(int, kt_wait(pid, 60), 2), "%s", kt_tail(log, 30));
        char *t = kt_tail(log, 30);
        cr_assert(strstr(t, "was purged") != NULL, "%s", t);
        cr_assert(strstr(t, "kinbox outbox resend --since") != NULL, "%s", t);

        resend_then_all(MY, url, ini, log, topic, since);
        free(since);
        free(t);
}

/*
 * kinbox_outbox_resend() on both backends (relay.source = poll): every
 * Kafka row created since the time, in id order, with the relay's key
 * and message id; older rows, action rows and canceled rows are not
 * sent; no row is updated.
 */
ParameterizedTestParameters(binlogrelay, resend_both_backends)
{
        static int b[] = {0, 1};
        return cr_make_param_array(int, b, 2);
}

ParameterizedTest(int *bk, binlogrelay, resend_both_backends, .timeout = 120)
{
        const char *backend = kt_backend(*bk);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("resend");
        kt_topic(topic, 2);
        tconn_t c;
        tc_open(&c, backend, url);
        kinbox_outbox_msg_t old = {.destination = topic,
                                   .idem_key = "old",
                                   .aggregate_id = "k",
                                   .payload = "o",
                                   .payload_size = 1};
        tc_sql(&c, "BEGIN");
        cr_assert(eq(int, tc_append(&c, &old, NULL), KINBOX_OK));
        tc_sql(&c, "COMMIT");
        tc_close(&c);
        usleep(1100 * 1000);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        int64_t since = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        usleep(20 * 1000);
        append_rows(backend, url, topic, "new", 0, 25);
        kt_exec(url, "UPDATE kinbox_outbox SET status = 'canceled' WHERE "
                     "idem_key = 'new-24'");

        kinbox_conf_t *conf = relay_conf(url, bootstrap);
        int64_t n = -1;
        char err[512] = "";
        cr_assert(eq(int,
                     kinbox_outbox_resend(conf, since, &n, err, sizeof(err)),
                     KINBOX_OK),
                  "%s", err);
        kinbox_conf_destroy(conf);
        cr_expect(eq(i64, n, 24));
        tmsgs_t got;
        consume(bootstrap, topic, 24, 60, 1000, &got);
        cr_expect(eq(sz, got.n, 24));
        assert_all(&got, topic, "new", 0, 24);
        char id[128];
        snprintf(id, sizeof(id), "%s:old", topic);
        cr_expect(eq(sz, count_msgid(&got, id), 0));
        qsort(got.v, got.n, sizeof(*got.v), by_offset);
        for (size_t i = 0; i < got.n; i++) {
                cr_expect(eq(str, got.v[i].key, "agg"));
                cr_expect(eq(int, atoi(got.v[i].value), (int)i));
        }
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "version <> 0 OR (status <> 'pending' AND "
                                  "idem_key <> 'new-24')"),
                     0));
        msgs_free(&got);
}

/* -------------------------------------------------------- refusals */

/*
 * log_bin off (a second MariaDB of this test's own, without --log-bin):
 * kinbox migrate and kinbox run exit 2 naming log_bin.
 */
Test(binlogrelay, refuse_log_bin_off, .timeout = 180)
{
        char *dir = kt_tmp("my_nobinlog");
        int port = kt_free_port();
        cr_assert(eq(int,
                     sh("mkdir -p %s/data && chown -R mysql:mysql %s && "
                        "mariadb-install-db --no-defaults --user=mysql "
                        "--datadir=%s/data --skip-test-db "
                        "--auth-root-authentication-method=socket "
                        ">%s.install.log 2>&1",
                        dir, dir, dir, dir),
                     0));
        cr_assert(eq(int,
                     sh("(setsid mariadbd --no-defaults --user=mysql "
                        "--datadir=%s/data --socket=%s/sock "
                        "--pid-file=%s/pid --port=%d "
                        "--bind-address=127.0.0.1 --skip-name-resolve "
                        ">%s.log 2>&1 </dev/null &) && for i in $(seq 100); "
                        "do mariadb-admin --no-defaults -u root -S %s/sock "
                        "ping >/dev/null 2>&1 && exit 0; sleep 0.2; done; "
                        "exit 1",
                        dir, dir, dir, port, dir, dir),
                     0));
        int rc = sh("mariadb --no-defaults -u root -S %s/sock -e \"CREATE "
                    "USER 'kinbox'@'127.0.0.1' IDENTIFIED BY 'kinbox'; GRANT "
                    "ALL ON *.* TO 'kinbox'@'127.0.0.1'; CREATE DATABASE "
                    "kinbox\"",
                    dir);
        char url[200];
        snprintf(url, sizeof(url), "mysql://kinbox:kinbox@127.0.0.1:%d/kinbox",
                 port);
        char *ini = kt_write_ini(url, "[relay]\nenabled = true\n"
                                      "source = binlog\n");
        char *mig = NULL, *run = NULL;
        int mig_rc =
            rc ? -1 : kt_kinbox(&mig, NULL, true, "migrate -c %s", ini);
        int run_rc = -1;
        if (!rc) {
                char *log = kt_tmp("bl_refuse_log");
                pid_t pid = kt_spawn_kinbox(ini, NULL, log);
                run_rc = kt_wait_exit(pid, 30);
                run = kt_slurp(log);
        }
        sh("kill -9 $(cat %s/pid) >/dev/null 2>&1; sleep 0.5; rm -rf %s", dir,
           dir);
        cr_assert(eq(int, rc, 0));
        cr_assert(eq(int, mig_rc, 2), "%s", mig);
        cr_assert(strstr(mig, "log_bin is OFF") != NULL, "%s", mig);
        cr_assert(eq(int, run_rc, 2), "%s", run);
        cr_assert(strstr(run, "log_bin is OFF") != NULL, "%s", run);
        free(mig);
        free(run);
}

/* Commit n one-row transactions on a table that is not the outbox. */
static void
fill_other(const char *url, int n)
{
        kt_exec(url, "CREATE TABLE IF NOT EXISTS bl_filler (id INT "
                     "AUTO_INCREMENT PRIMARY KEY, b VARBINARY(2000))");
        tconn_t c;
        tc_open(&c, MY, url);
        for (int i = 0; i < n; i++)
                tc_sql(&c, "INSERT INTO bl_filler (b) VALUES (REPEAT('x', "
                           "1900))");
        tc_close(&c);
}

/* Within 30 s the relay's stored position is at or past the server's
 * position now (a single GTID domain). */
static bool
position_follows(const logrel_t *l)
{
        long long seq = kt_qint(l->url, "SELECT SUBSTRING_INDEX("
                                        "@@gtid_binlog_pos, '-', -1)");
        return wait_q(l->url, 1, 30,
                      "SELECT count(*) FROM kinbox_relay_position WHERE "
                      "relay = '%s' AND CAST(SUBSTRING_INDEX(gtid, '-', "
                      "-1) AS UNSIGNED) >= %lld",
                      l->name, seq);
}

/*
 * The binlog's counterpart of walrelay/idle_slot_bounded: an idle outbox
 * on a busy server. Other tables commit 300 transactions while the relay
 * has nothing to publish; its stored position follows the server
 * (heartbeats after other tables' transactions are stored when nothing is
 * in flight), into the next binlog file after a rotation, so every file
 * before that one can be purged: stopped and started again the relay
 * publishes the rows appended since, all of them.
 */
Test(binlogrelay, idle_position_follows, .timeout = 300)
{
        logrel_t l;
        logrel_start(&l, MY, "binlog", "bl_idle", 2);
        fill_other(l.url, 300);
        cr_assert(position_follows(&l), "the position did not follow");
        kt_exec(l.url, "FLUSH BINARY LOGS");
        fill_other(l.url, 50);
        cr_assert(position_follows(&l), "the position stayed in the old file");
        char *cur = qtext(l.url, "SHOW MASTER STATUS");
        char q[256];
        snprintf(q, sizeof(q), "PURGE BINARY LOGS TO '%s'", cur);
        kt_exec(l.url, q);
        free(cur);
        logrel_stop(&l);
        append_rows(MY, l.url, l.topic, "after", 0, 20);
        l.r = relay_new(log_conf(l.url, l.bootstrap, "binlog", l.name));
        relay_start(&l.tr, l.r);
        tmsgs_t got;
        consume(l.bootstrap, l.topic, 20, 60, 1500, &got);
        logrel_stop(&l);
        assert_all(&got, l.topic, "after", 0, 20);
        msgs_free(&got);
}

/* ------------------------------------------------ parity with polling */

/*
 * The binlog relay publishes what the polling relay publishes for the
 * same rows: key, value, headers (message_id, user headers, CloudEvents),
 * timestamp, partition. A rolled-back row is never published; the action
 * row is run by the polling relay of the same kinbox_relay_t (which
 * claims nothing else: MariaDB's actions_only claim); no event row is
 * updated.
 */
Test(binlogrelay, parity_with_polling, .timeout = 180)
{
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(MY);
        char *topic = kt_unique("bl_par");
        char *name = kt_unique("blpar");
        kt_topic(topic, 4);
        kinbox_conf_t *bc = log_conf(url, bootstrap, "binlog", name);
        cset(bc, "relay.cloudevents.source", "/binlogrelay-test");
        kinbox_relay_t *r = relay_new(bc);
        cr_assert(eq(
            int, kinbox_relay_register_action(r, "count", count_action, NULL),
            KINBOX_OK));
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(log_reading(MY, url, name, 30));
        const int n = 40;
        parity_rows(MY, url, topic, n);
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "kind = 'action' AND status = 'sent'"));
        kinbox_relay_stats_t st = {0};
        for (long long t = kt_clock_ms() + 30000;
             st.published < (uint64_t)n && kt_clock_ms() < t; usleep(50000))
                kinbox_relay_stats(r, &st);
        relay_stop(&tr);
        cr_assert(eq(int, actions_run, 1));
        kinbox_relay_stats(r, &st);
        cr_assert(eq(u64, st.published, (uint64_t)n));
        kinbox_relay_destroy(r);
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT count(*) FROM kinbox_outbox "
                                   "WHERE status = 'pending' AND version = 0"
                                   " AND kind = 'event'"),
                     n));
        tmsgs_t bl;
        consume(bootstrap, topic, (size_t)n, 30, 1500, &bl);
        cr_assert(eq(sz, bl.n, (size_t)n), "binlog relay: %zu messages", bl.n);
        msgs_free(&bl);

        assert_polling_parity(url, bootstrap, topic, n, "/binlogrelay-test");
}

/* ------------------------------------- large transaction, large rows, DDL */

/* big_rows_ddl's other messages: "agg-after" in order, the large ones. */
typedef struct big {
        int after, large;
} big_t;

static void
big_other(const tmsg_t *m, void *arg)
{
        big_t *bt = arg;
        if (!strcmp(m->key, "agg-after")) {
                cr_assert(eq(int, atoi(m->value), bt->after));
                bt->after++;
        } else {
                cr_assert(eq(str, m->key, "t"));
                cr_assert(eq(sz, m->value_size, 900000));
                bt->large++;
        }
}

/*
 * A 100,000-row transaction; ~900 kB payloads published byte for byte; a
 * 1.2 MB one dead (larger than the producer takes) while the relay goes
 * on; an ALTER TABLE adding a column to the outbox mid-stream, and rows
 * after it.
 */
Test(binlogrelay, big_rows_ddl, .timeout = 400)
{
        logrel_t l;
        logrel_start(&l, MY, "binlog", "bl_big", 4);
        const char *bootstrap = l.bootstrap, *url = l.url, *topic = l.topic;
        const int big = 100000;
        char sql[1200];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key, "
                 "aggregate_id, payload) SELECT '%s', CONCAT('big-', seq), "
                 "CONCAT('agg-', seq %% 16), seq FROM seq_0_to_%d",
                 topic, big - 1);
        kt_exec(url, sql);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key, "
                 "aggregate_id, payload) SELECT '%s', CONCAT('large-', seq), "
                 "'t', REPEAT(MD5(seq), IF(seq = 2, 37500, 28125)) FROM "
                 "seq_1_to_3",
                 topic);
        kt_exec(url, sql);
        kt_exec(url, "ALTER TABLE kinbox_outbox ADD COLUMN binlog_extra "
                     "VARCHAR(10) DEFAULT 'x'");
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key, "
                 "aggregate_id, payload) SELECT '%s', CONCAT('after-', seq), "
                 "'agg-after', seq FROM seq_0_to_9",
                 topic);
        kt_exec(url, sql);
        size_t want = (size_t)big + 2 + 10;
        tmsgs_t got;
        consume(bootstrap, topic, want, 200, 2000, &got);
        logrel_stop(&l);
        big_t bt = {0, 0};
        check_big_stream(url, &got, want, "large-2", big_other, &bt);
        cr_assert(eq(int, bt.after, 10));
        cr_assert(eq(int, bt.large, 2));
        msgs_free(&got);
}

/*
 * MariaDB killed (SIGKILL: crash recovery) and started again under a
 * running binlog relay: it reconnects, resumes from its stored position,
 * and every committed row before and after is on the topic, in order.
 */
Test(binlogrelay, database_restart, .timeout = 240)
{
        logrel_t l;
        restart_under_relay(&l, MY, "binlog", "bl_myrs", NULL);
}

/* The sequence number of the server's binlog position (one domain). */
static long long
server_seq(const char *url)
{
        return kt_qint(url, "SELECT SUBSTRING_INDEX(@@gtid_binlog_pos, "
                            "'-', -1)");
}

/*
 * An idle, caught-up relay: in 10 s it stores its position at most once
 * (its own position writes do not make it write again), and the stored
 * position stays one transaction behind the server (that write). The
 * binlog rotated and purged up to that write, MariaDB killed (SIGKILL)
 * and started again: the relay proves the one purged transaction was its
 * own write, reads on without `kinbox outbox resend`, and publishes the
 * rows appended since, all of them.
 */
/* `kinbox status --json -c ini` shows the binlog relay's state want. */
static void
relay_status_is(const char *ini, const char *want)
{
        char *out = NULL, *err = NULL, w[64];
        int ex = kt_kinbox(&out, &err, false, "status --json -c %s", ini);
        snprintf(w, sizeof(w), "\"wal_status\": \"%s\"", want);
        cr_assert(out && strstr(out, w) != NULL, "want %s (exit %d):\n%s\n%s",
                  w, ex, out, err);
        free(out);
        free(err);
}

Test(binlogrelay, rotate_purge_own_write, .timeout = 300)
{
        logrel_t l;
        logrel_start(&l, MY, "binlog", "bl_rot", 2);
        fill_other(l.url, 50);
        cr_assert(position_follows(&l), "the position did not follow");
        sleep(2);
        long long before = server_seq(l.url);
        sleep(10);
        long long idle = server_seq(l.url) - before;
        cr_assert(idle <= 1, "%lld position writes in 10 s idle", idle);
        kt_exec(l.url, "FLUSH BINARY LOGS");
        char *cur = qtext(l.url, "SHOW MASTER STATUS");
        char q[256];
        snprintf(q, sizeof(q), "PURGE BINARY LOGS TO '%s'", cur);
        kt_exec(l.url, q);
        free(cur);
        long long stored =
            kt_qintf(l.url,
                     "SELECT CAST(SUBSTRING_INDEX(gtid, '-', "
                     "-1) AS SIGNED) FROM kinbox_relay_position "
                     "WHERE relay = '%s'",
                     l.name);
        cr_assert(eq(llong, stored + 1, server_seq(l.url)),
                  "the stored position is not the one write behind");
        /* `kinbox status` agrees with the relay: not "purged". */
        char *ini = log_ini(l.url, "binlog", l.name);
        relay_status_is(ini, "ok"); /* ini: the harness's to free */
        kt_services("mysql-stop kill");
        sleep(1);
        kt_services("mysql-start");
        append_rows(MY, l.url, l.topic, "after", 0, 20);
        tmsgs_t got;
        consume(l.bootstrap, l.topic, 20, 60, 1500, &got);
        logrel_stop(&l);
        assert_all(&got, l.topic, "after", 0, 20);
        msgs_free(&got);
}

/*
 * Exactly one transaction purged after the stored position, and it is not
 * the relay's position write (an outbox row; the write that stored the
 * position came after it and is in the binlog left): nothing proves the
 * purged one publishes nothing, so `kinbox run` refuses the position (exit
 * 2, "was purged") instead of skipping the row.
 */
Test(binlogrelay, one_purged_not_own_write, .timeout = 300)
{
        char *url = kt_fresh_db(MY);
        char *topic = kt_unique("bl_one");
        char *name = kt_unique("blo");
        kt_topic(topic, 2);
        char *ini = log_ini(url, "binlog", name);
        char *log = kt_tmp("bl_one_log");
        rows_a_then_stop(MY, url, name, ini, log, topic);
        char *pos = qtext(url, "SELECT @@gtid_binlog_pos");
        long long seq = server_seq(url);
        append_rows(MY, url, topic, "b", 0, 1);
        kt_exec(url, "FLUSH BINARY LOGS");
        char *cur = qtext(url, "SHOW MASTER STATUS");
        char q[512];
        snprintf(q, sizeof(q),
                 "UPDATE kinbox_relay_position SET gtid = '%s' WHERE relay "
                 "= '%s'",
                 pos, name);
        kt_exec(url, q);
        snprintf(q, sizeof(q), "PURGE BINARY LOGS TO '%s'", cur);
        long long until = kt_clock_ms() + 20000;
        bool purged = false;
        while (!purged && kt_clock_ms() < until) {
                kt_exec(url, q);
                char *first = qtext(url, "SHOW BINARY LOGS");
                purged = !strcmp(first, cur);
                free(first);
                if (!purged)
                        usleep(200 * 1000);
        }
        cr_assert(purged, "the binlog was not purged");
        cr_assert(eq(llong, seq + 2, server_seq(url)));

        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(int, kt_wait(pid, 60), 2), "%s", kt_tail(log, 30));
        char *t = kt_tail(log, 30);
        cr_assert(strstr(t, "was purged") != NULL, "%s", t);
        relay_status_is(ini, "purged"); /* as the relay refused */
        free(t);
        free(cur);
        free(pos);
}
