/*
 * consumer_proc_test.c -- the consumer as real `kinbox run` processes:
 * crashes, database outages, rebalances, broker faults. Both backends.
 */
#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../handlers/points/points.h"

#define SQL_INBOX "SELECT COUNT(*) FROM kinbox_inbox"
#define SQL_WATERMARK                                                         \
        "SELECT COALESCE(SUM(next_offset), 0) FROM kinbox_offsets"

static char *
points_ini(const char *url, const char *group, const char *topic,
           const char *extra)
{
        return kt_write_ini(url,
                            "[consumer.points]\ngroup.id = %s\ntopics = %s\n"
                            "handler = points\n%s",
                            group, topic, extra ? extra : "");
}

/* ---- 2. SIGKILL between the DB commit and the offset commit ---- */

KT_BACKENDS_PARAMS(proc, crash_after_commit)
ParameterizedTest(int *backend, proc, crash_after_commit, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("p2");
        char *group = kt_unique("pg2");
        kt_topic(topic, 4);
        long long total = kt_produce_grants(topic, 0, 3000, 0, "o", 0, NULL);
        char *ini = points_ini(url, group, topic, "batch.max = 100\n");
        char *log1 = kt_tmp("crash1");
        /* The fault point fires after the 4th successful DB commit. */
        pid_t pid = kt_spawn_kinbox(ini, "KINBOX_FAULT=after_commit:3", log1);
        cr_assert(eq(int, kt_wait(pid, 90), -SIGKILL));
        long long db_mark = kt_qint(url, SQL_WATERMARK);
        long long inbox = kt_qint(url, SQL_INBOX);
        long long kafka_mark = kt_committed_sum(group, topic, 4);
        /* The crash window was real: the DB is ahead of Kafka. */
        cr_assert(gt(i64, db_mark, 0));
        cr_assert(lt(i64, kafka_mark, db_mark));
        cr_assert(eq(i64, inbox, db_mark));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM user_points_flow"),
                     inbox));
        /* Restart: finishes without re-running the committed batches. */
        char *log2 = kt_tmp("crash2");
        pid = kt_spawn_kinbox(ini, NULL, log2);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 3000, 90), 3000));
        /* Kafka learns where the DB says the group is, even on partitions
         * that got nothing new after the restart (auto commit: 5 s). */
        for (int i = 0; i < 100 && kt_committed_sum(group, topic, 4) < 3000;
             i++)
                usleep(100000);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        kt_assert_points(url, total, 3000);
        char *out = kt_slurp(log2);
        cr_assert(out != NULL);
        cr_assert(strstr(out, "duplicates 0 (redelivered)") != NULL,
                  "restarted consumer re-ran committed messages:\n%s", out);
        free(out);
        cr_assert(eq(i64, kt_committed_sum(group, topic, 4), 3000));
}

/* ---- 4. the database stopped mid-stream, then started again ---- */

KT_BACKENDS_PARAMS(proc, database_restart)
ParameterizedTest(int *backend, proc, database_restart, .timeout = 240)
{
        const char *be = kt_backend(*backend);
        char *url = kt_fresh_db(be);
        char *topic = kt_unique("p4");
        char *group = kt_unique("pg4");
        kt_topic(topic, 4);
        char *ini = points_ini(url, group, topic, "batch.max = 200\n");
        char *log = kt_tmp("dbrestart");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        long long total = kt_produce_grants(topic, 0, 1000, 0, "o", 0, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 1000, 60), 1000));
        kt_services(*backend ? "mysql-stop" : "pg-stop");
        /* Messages keep arriving while the database is down. */
        total += kt_produce_grants(topic, 1000, 1000, 0, "o", 0, NULL);
        sleep(4);
        kt_services(*backend ? "mysql-start" : "pg-start");
        total += kt_produce_grants(topic, 2000, 1000, 0, "o", 0, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 3000, 90), 3000));
        cr_assert(eq(i64, kt_wait_qint(url, SQL_WATERMARK, 3000, 30), 3000));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        kt_assert_points(url, total, 3000);
        char *out = kt_slurp(log);
        cr_assert(strstr(out, "reconnected") != NULL,
                  "the consumer never saw the outage:\n%s", out);
        free(out);
}

/* ---- 5. a second process joins mid-stream, then the first is killed ---- */

KT_BACKENDS_PARAMS(proc, rebalance_and_kill)
ParameterizedTest(int *backend, proc, rebalance_and_kill, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("p5");
        char *group = kt_unique("pg5");
        kt_topic(topic, 6);
        char *ini = points_ini(url, group, topic, "batch.max = 50\n");
        char *loga = kt_tmp("reb_a"), *logb = kt_tmp("reb_b");
        pid_t a = kt_spawn_kinbox(ini, NULL, loga);
        long long total = kt_produce_grants(topic, 0, 2000, 10, "o", 0, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 2000, 60), 2000));
        pid_t b = kt_spawn_kinbox(ini, NULL, logb);
        for (int round = 0; round < 4; round++) {
                total += kt_produce_grants(topic, 2000 + round * 500, 500, 10,
                                           "o", 0, NULL);
                sleep(2);
        }
        /* B has joined (it logged an assignment) before A dies: its
         * start and the rebalance take a few seconds, more on a loaded
         * machine, so wait for the log line rather than a fixed time. */
        char *outb = NULL;
        for (int i = 0; i < 600; i++) {
                free(outb);
                outb = kt_slurp(logb);
                if (outb && strstr(outb, "assigned"))
                        break;
                usleep(100 * 1000);
        }
        cr_assert(outb && strstr(outb, "assigned") != NULL,
                  "second consumer never got partitions:\n%s", outb);
        free(outb);
        kill(a, SIGKILL);
        cr_assert(eq(int, kt_wait(a, 30), -SIGKILL));
        total += kt_produce_grants(topic, 4000, 1000, 10, "o", 0, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 5000, 120), 5000));
        kill(b, SIGTERM);
        cr_assert(eq(int, kt_wait(b, 60), 0));
        kt_assert_points(url, total, 5000);
}

/* ---- 7. OffsetCommit errors injected at the broker ---- */

KT_BACKENDS_PARAMS(proc, offset_commit_errors)
ParameterizedTest(int *backend, proc, offset_commit_errors, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("p7");
        char *group = kt_unique("pg7");
        kt_topic(topic, 3);
        long long total = kt_produce_grants(topic, 0, 1500, 7, "o", 0, NULL);
        /* Non-retriable and retriable commit failures, many of them. */
        kt_broker("push-errors OffsetCommit REBALANCE_IN_PROGRESS "
                  "ILLEGAL_GENERATION NOT_COORDINATOR REBALANCE_IN_PROGRESS "
                  "UNKNOWN_MEMBER_ID REBALANCE_IN_PROGRESS NOT_COORDINATOR "
                  "REQUEST_TIMED_OUT REBALANCE_IN_PROGRESS");
        kinbox_conf_t *c = kt_conf(url, "points", group, topic);
        kt_set(c, "kafka.auto.commit.interval.ms", "200");
        kt_run_t *r =
            kt_run_start(c, NULL, kinbox_points_module.handle_batch, NULL);
        long long high = kt_high_sum(topic, 3);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_WATERMARK, high, 60), high));
        kt_run_stop(r);
        /* A second run of the group: nothing is applied twice, and the
         * messages behind a failed commit are not even re-run. */
        total += kt_produce_grants(topic, 1500, 500, 0, "o", 0, NULL);
        high = kt_high_sum(topic, 3);
        c = kt_conf(url, "points", group, topic);
        r = kt_run_start(c, NULL, kinbox_points_module.handle_batch, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_WATERMARK, high, 60), high));
        kinbox_consumer_stats_t st;
        kt_run_stop_stats(r, &st);
        kt_assert_points(url, total, 2000);
        cr_assert(eq(u64, st.processed, 500));
        cr_assert(eq(u64, st.duplicates, 0));
        kt_broker("clear-errors OffsetCommit");
}

/* ---- 8. two consumer groups in one process, each its own handler ---- */

KT_BACKENDS_PARAMS(proc, two_groups_one_process)
ParameterizedTest(int *backend, proc, two_groups_one_process, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *ta = kt_unique("p8a"), *tb = kt_unique("p8b");
        char *ga = kt_unique("pg8a"), *gb = kt_unique("pg8b");
        kt_topic(ta, 3);
        kt_topic(tb, 2);
        /* The same message ids on both topics: each consumer applies its
         * copy once (the inbox key is the consumer name + id). */
        long long total_a = kt_produce_grants(ta, 0, 1000, 0, "a", 0, NULL);
        long long total_b = kt_produce_grants(tb, 0, 800, 0, "b", 1000, NULL);
        char *ini = kt_write_ini(
            url,
            "[consumer.orders]\ngroup.id = %s\ntopics = %s\nhandler = points\n"
            "[consumer.bonus]\ngroup.id = %s\ntopics = %s\n"
            "handler = points-single\nbatch.max = 1\n",
            ga, ta, gb, tb);
        char *log = kt_tmp("twogroups");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 1800, 120), 1800));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        kt_assert_points(url, total_a + total_b, 1800);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox "
                                  "WHERE consumer = 'orders'"),
                     1000));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox "
                                  "WHERE consumer = 'bonus'"),
                     800));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COALESCE(SUM(points), 0) FROM "
                                  "user_account WHERE user_id > 1000"),
                     total_b));
}

/* After a crash that left the DB ahead of Kafka on every partition, the
 * restarted consumer tells Kafka where the group really is — lag goes to
 * zero although no new message arrives. */
KT_BACKENDS_PARAMS(proc, restart_commits_db_position)
ParameterizedTest(int *backend, proc, restart_commits_db_position,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("p9");
        char *group = kt_unique("pg9");
        kt_topic(topic, 1);
        kt_produce_grants(topic, 0, 300, 0, "o", 0, NULL);
        char *ini = points_ini(url, group, topic,
                               "batch.max = 100\nbatch.wait.ms = 3000\n");
        /* The third commit is the last: everything is in the DB. */
        pid_t pid = kt_spawn_kinbox(ini, "KINBOX_FAULT=after_commit:2",
                                    kt_tmp("pos1"));
        cr_assert(eq(int, kt_wait(pid, 60), -SIGKILL));
        cr_assert(eq(i64, kt_qint(url, SQL_WATERMARK), 300));
        cr_assert(lt(i64, kt_committed_sum(group, topic, 1), 300));
        pid = kt_spawn_kinbox(ini, NULL, kt_tmp("pos2"));
        long long committed = 0;
        for (int i = 0; i < 150 && committed < 300; i++) {
                usleep(100000);
                committed = kt_committed_sum(group, topic, 1);
        }
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        cr_assert(eq(i64, committed, 300));
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM user_points_flow"), 300));
}
