/*
 * shutdown_test.c -- SIGTERM while `kinbox run` consumes a backlog: the
 * process exits 0 within the shutdown bound (never aborts, never dies of a
 * signal), with the database and the broker up (and then leaves its group:
 * a restarted process gets the partitions at once) or both down; after
 * the restarts every message took effect exactly once. Both backends; the
 * up test on Apache Kafka too (shutdown_test@kafka), the down test on the
 * dev broker only (it takes its brokers down).
 */
#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SQL_INBOX "SELECT COUNT(*) FROM kinbox_inbox"
#define ROUNDS 5
#define BACKLOG 60000
#define PARTITIONS 8
#define SHUTDOWN_BOUND_S 30 /* src/cli/watchdog.h, docs/operations.md */
/* The up test's session timeout on Apache Kafka: a member that did not
 * leave its group keeps its partitions this long after its process ended
 * (the broker: group.initial.rebalance.delay.ms = 0). */
#define SESSION_MS 60000
/* A restarted process that consumes within this many seconds got its
 * partitions without waiting out the old member's session (SESSION_MS). */
#define RESUME_S 20
/* The dev broker (librdkafka 2.0's mock cluster) cannot show that: after
 * any LeaveGroup it waits session.timeout.ms - 1 s before it assigns
 * again (rd_kafka_mock_cgrp_rebalance()), so there the up test runs with
 * 6 s sessions and checks exit status and exactness only; its
 * shutdown_test@kafka entry checks the group was left. */
#define MOCK_SESSION_MS 6000

/* A points consumer slow enough (small batches, one worker) for the
 * backlog to outlast the rounds (its batch lines come last). */
static char *
shutdown_ini(const char *url, const char *group, const char *topic,
             int session_ms)
{
        char *path = kt_tmp("shutdown_ini");
        FILE *fp = fopen(path, "w");
        cr_assert(fp != NULL);
        fprintf(fp,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "session.timeout.ms = %d\nheartbeat.interval.ms = 500\n"
                "[log]\nlevel = info\n"
                "[consumer.points]\ngroup.id = %s\ntopics = %s\n"
                "handler = points\nbatch.max = 5\nbatch.wait.ms = 0\n",
                url, kt_env("KINBOX_BOOTSTRAP"), session_ms, group, topic);
        fclose(fp);
        return path;
}

/* Start `kinbox run` and wait until it consumed past *seen (within
 * resume_s); returns its pid, *seen updated. */
static pid_t
start_consuming(const char *ini, const char *url, const char *log,
                long long *seen, int resume_s)
{
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        long long n = *seen;
        long long end = kt_clock_ms() + resume_s * 1000LL;
        while (n <= *seen && kt_clock_ms() < end) {
                usleep(100000);
                n = kt_qint(url, SQL_INBOX);
        }
        if (n <= *seen) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                cr_fatal("no message consumed within %d s of the start (%lld "
                         "before): partitions not assigned:\n%s",
                         resume_s, *seen, kt_slurp(log));
        }
        *seen = n;
        return pid;
}

static void
assert_clean_exit(int rc, int round, const char *log)
{
        cr_assert(rc != -1000,
                  "round %d: still running %d s after SIGTERM:\n%s", round,
                  SHUTDOWN_BOUND_S + 15, kt_slurp(log));
        cr_assert(rc >= 0, "round %d: died of signal %d after SIGTERM:\n%s",
                  round, -rc, kt_slurp(log));
        cr_assert(eq(int, rc, 0),
                  "round %d: exit status %d after SIGTERM:\n%s", round, rc,
                  kt_slurp(log));
}

/* The last run: consume the rest, then every message counted once. */
static void
finish_exact(const char *ini, const char *url, long long total)
{
        /* The same group, at the default batch size: the rest drains in
         * seconds, not a minute of 5-message transactions. */
        char *fast = kt_slurp(ini);
        cr_assert(fast != NULL);
        char *cut = strstr(fast, "batch.max = 5\n");
        if (cut)
                *cut = '\0';
        char *fast_ini = kt_tmp("shutdown_fast_ini");
        FILE *fp = fopen(fast_ini, "w");
        cr_assert(fp != NULL);
        fputs(fast, fp);
        fclose(fp);
        free(fast);
        ini = fast_ini;
        char *log = kt_tmp("shutdown_last");
        long long seen = 0;
        pid_t pid = start_consuming(ini, url, log, &seen, 90);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, BACKLOG, 120), BACKLOG),
                  "backlog not consumed:\n%s", kt_slurp(log));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait_exit(pid, SHUTDOWN_BOUND_S + 15), 0), "%s",
                  kt_slurp(log));
        kt_assert_points(url, total, BACKLOG);
}

/* With the database and the broker up: each SIGTERM lands while the
 * backlog is being consumed; the process exits 0 and leaves its group, so
 * the next one consumes at once, not after SESSION_MS. */
KT_BACKENDS_PARAMS(shutdown, term_under_load)
ParameterizedTest(int *backend, shutdown, term_under_load, .timeout = 600)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("sd");
        kt_topic(topic, PARTITIONS);
        long long total =
            kt_produce_grants(topic, 0, BACKLOG, 0, "o", 0, NULL);
        bool real = kt_real_kafka();
        char *ini = shutdown_ini(url, kt_unique("sdg"), topic,
                                 real ? SESSION_MS : MOCK_SESSION_MS);
        long long seen = 0;
        for (int round = 0; round < ROUNDS; round++) {
                char *log = kt_tmp("shutdown_up");
                /* Round 0 joins a new group; later rounds rejoin one whose
                 * last member left at the SIGTERM before. */
                pid_t pid = start_consuming(ini, url, log, &seen,
                                            round && real ? RESUME_S : 60);
                usleep(500000);
                kill(pid, SIGTERM);
                int rc = kt_wait_exit(pid, SHUTDOWN_BOUND_S + 15);
                assert_clean_exit(rc, round, log);
                seen = kt_qint(url, SQL_INBOX);
                cr_assert(lt(i64, seen, BACKLOG),
                          "round %d: the backlog was gone before SIGTERM",
                          round);
        }
        finish_exact(ini, url, total);
}

/* With the database stopped and every dev-broker broker down 1 s before
 * SIGTERM: the process still exits 0 within the bound. */
KT_BACKENDS_PARAMS(shutdown, term_all_down)
ParameterizedTest(int *backend, shutdown, term_all_down, .timeout = 900)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("sdd");
        kt_topic(topic, PARTITIONS);
        long long total =
            kt_produce_grants(topic, 0, BACKLOG, 0, "o", 0, NULL);
        /* The member is never told to leave: its session (6 s) expires
         * before the next round joins. */
        char *ini =
            shutdown_ini(url, kt_unique("sddg"), topic, MOCK_SESSION_MS);
        long long seen = 0;
        for (int round = 0; round < ROUNDS; round++) {
                char *log = kt_tmp("shutdown_down");
                pid_t pid = start_consuming(ini, url, log, &seen, 60);
                kt_services(*backend ? "mysql-stop kill"
                                     : "pg-stop immediate");
                kt_broker("broker-down all");
                sleep(1);
                kill(pid, SIGTERM);
                int rc = kt_wait_exit(pid, SHUTDOWN_BOUND_S + 15);
                kt_broker("broker-up all");
                kt_services(*backend ? "mysql-start" : "pg-start");
                assert_clean_exit(rc, round, log);
                seen = kt_qint(url, SQL_INBOX);
                cr_assert(lt(i64, seen, BACKLOG),
                          "round %d: the backlog was gone before SIGTERM",
                          round);
        }
        finish_exact(ini, url, total);
}
