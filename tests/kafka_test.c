/*
 * kafka_test.c -- what only a real Apache Kafka broker shows: a consumer
 * group of three `kinbox run` processes killed and restarted under both
 * rebalance protocols, with and without static membership; topics that
 * do not exist (auto-creation off, as users run it); records the broker
 * refuses as too large; compressed batches. Both backends.
 *
 * Runs only as kafka_test@kafka (KT_BROKER=kafka, scripts/test's kafka
 * shard): the harness fails every test when the real broker is missing.
 */
#include "harness.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../handlers/points/points.h"

#define SQL_INBOX "SELECT COUNT(*) FROM kinbox_inbox"

/* Every test here needs the real broker (fails, never skips). */
static void
need_kafka(void)
{
        cr_assert(kt_real_kafka(),
                  "kafka_test runs on real Apache Kafka only (KT_BROKER=kafka "
                  "with KINBOX_KAFKA_BOOTSTRAP; ctest -L kafka)");
}

/* ---- 1. three processes, killed and restarted, one group ---- */

/* A case: backend, rebalance protocol, static membership. The default
 * run covers each backend with each protocol and each membership kind
 * (4 cases); KT_KAFKA_FULL=1 runs all 8. */
struct storm {
        int backend;
        int cooperative; /* cooperative-sticky, else eager (range) */
        int static_members; /* group.instance.id per process */
};

ParameterizedTestParameters(rebalance, storm)
{
        static struct storm all[] = {
            {0, 0, 0}, {1, 0, 1}, {0, 1, 1}, {1, 1, 0},
            {0, 0, 1}, {1, 0, 0}, {0, 1, 0}, {1, 1, 1},
        };
        const char *full = getenv("KT_KAFKA_FULL");
        return cr_make_param_array(struct storm, all,
                                   full && *full == '1' ? 8 : 4);
}

#define STORM_PROCS 3

static pid_t
storm_spawn(const char *ini, int i, char **logs)
{
        /* putenv keeps the pointer: one string per process, static. */
        static char env[STORM_PROCS][32];
        snprintf(env[i], sizeof(env[i]), "KT_MEMBER=m%d", i);
        return kt_spawn_kinbox(ini, env[i], logs[i]);
}

/* "assigned N partition(s)" lines in n logs (static members keep their
 * partitions through a clean stop until session.timeout.ms: up to 15 s). */
static int
assignments(char **logs, int n)
{
        int count = 0;
        for (int i = 0; i < n; i++) {
                char *s = kt_slurp(logs[i]);
                for (char *q = s; q && (q = strstr(q, ": assigned ")); q++)
                        count++;
                free(s);
        }
        return count;
}

ParameterizedTest(struct storm *p, rebalance, storm, .timeout = 420)
{
        need_kafka();
        const char *proto = p->cooperative ? "cooperative-sticky" : "range";
        cr_log_info("storm: %s, %s, %s membership", kt_backend(p->backend),
                    proto, p->static_members ? "static" : "dynamic");
        char *url = kt_fresh_db(kt_backend(p->backend));
        char *topic = kt_unique("ks");
        char *group = kt_unique("ksg");
        kt_topic(topic, 6);
        char extra[512];
        snprintf(extra, sizeof(extra),
                 "batch.max = 50\n"
                 "kafka.partition.assignment.strategy = %s\n%s",
                 proto,
                 p->static_members ? "kafka.group.instance.id = ${KT_MEMBER}\n"
                                   : "");
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n%s",
                                 group, topic, extra);
        char *logs[STORM_PROCS];
        pid_t pid[STORM_PROCS];
        for (int i = 0; i < STORM_PROCS; i++) {
                char n[16];
                snprintf(n, sizeof(n), "storm%d", i);
                logs[i] = kt_tmp(n);
                pid[i] = storm_spawn(ini, i, logs);
        }
        /* A seeded sequence of kills: KT_SEED reproduces a run. */
        const char *seed_s = getenv("KT_SEED");
        unsigned seed = seed_s && *seed_s ? (unsigned)atoi(seed_s) : 4242u;
        seed += (unsigned)(p->backend * 8 + p->cooperative * 2 +
                           p->static_members);
        cr_log_info("storm: seed %u", seed);
        long long total = 0;
        int produced = 0, kills = 0;
        const int rounds = 10, per_round = 400;
        for (int round = 0; round < rounds; round++) {
                /* Re-sends of every 10th message at another offset. */
                total += kt_produce_grants(topic, produced, per_round, 10, "o",
                                           0, NULL);
                produced += per_round;
                int v = (int)(rand_r(&seed) % STORM_PROCS);
                usleep((useconds_t)(rand_r(&seed) % 1500) * 1000);
                kill(pid[v], SIGKILL);
                cr_assert(eq(int, kt_wait(pid[v], 30), -SIGKILL));
                kills++;
                usleep((useconds_t)(rand_r(&seed) % 2000) * 1000);
                pid[v] = storm_spawn(ini, v, logs);
                /* The group rebalances (or, static, takes it back). */
                usleep((useconds_t)(500 + rand_r(&seed) % 2000) * 1000);
        }
        /* The group settles and applies every message once. */
        cr_assert(
            eq(i64, kt_wait_qint(url, SQL_INBOX, produced, 180), produced),
            "inbox rows after %d kills", kills);
        /* The last one restarted is past its start-up (a SIGTERM between
         * fork and exec would meet the default action, not kinbox). */
        sleep(3);
        /* A rolling stop, one process at a time, as a deploy does: each
         * clean stop commits its partitions' last offsets, and the ones
         * left take the partitions over (and commit them at their own
         * stop). Three SIGTERMs at once would race their final commits
         * against the rebalances they cause: the coordinator refuses a
         * commit during a rebalance, and the group's committed position
         * may then lag. Harmless (the next owner resumes at the
         * database's watermark, proc::restart_commits_db_position) but
         * not what this checks. */
        for (int i = 0; i < STORM_PROCS; i++) {
                int before = assignments(logs + i + 1, STORM_PROCS - i - 1);
                kill(pid[i], SIGTERM);
                int st = kt_wait(pid[i], 60);
                if (st != 0) {
                        char *tail = kt_tail(logs[i], 25);
                        cr_fatal("process %d did not stop cleanly: status "
                                 "%d (log %s), its last lines:\n%s",
                                 i, st, logs[i], tail);
                }
                /* The others take the partitions (a rebalance after a
                 * LeaveGroup takes a few seconds on a real broker). */
                for (int t = 0;
                     t < 150 && i + 1 < STORM_PROCS &&
                     assignments(logs + i + 1, STORM_PROCS - i - 1) == before;
                     t++)
                        usleep(100000);
        }
        kt_assert_points(url, total, produced);
        /* Offsets: the group's committed position is the end of every
         * partition (committed only after the database COMMIT; a clean
         * stop commits the last of them). */
        cr_assert(
            eq(i64, kt_committed_sum(group, topic, 6), kt_high_sum(topic, 6)));
}

/* ---- 2. topics that do not exist: auto-creation is off ---- */

/* A consumer of a topic nobody created says so and keeps running; once
 * the topic exists it consumes it. Nothing is created by kinbox. */
KT_BACKENDS_PARAMS(topics, missing_consumer_topic)
ParameterizedTest(int *backend, topics, missing_consumer_topic, .timeout = 180)
{
        need_kafka();
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("kmiss");
        char *group = kt_unique("kmissg");
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n",
                                 group, topic);
        char *log = kt_tmp("missing");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        /* It names the topic and what is wrong within a few seconds. */
        char *out = NULL;
        for (int i = 0; i < 300; i++) {
                free(out);
                out = kt_slurp(log);
                if (out && strstr(out, topic) && strstr(out, "does not exist"))
                        break;
                usleep(100 * 1000);
        }
        cr_assert(out && strstr(out, topic) && strstr(out, "does not exist"),
                  "no error naming the missing topic:\n%s", out);
        free(out);
        int st;
        cr_assert(eq(int, waitpid(pid, &st, WNOHANG), 0),
                  "kinbox exited on a missing topic");
        /* Still absent: kinbox created nothing. */
        cr_assert(eq(i64, kt_qint(url, SQL_INBOX), 0));
        kt_topic(topic, 2);
        long long total = kt_produce_grants(topic, 0, 300, 0, "o", 0, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_INBOX, 300, 90), 300));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        kt_assert_points(url, total, 300);
}

/* ---- 3. a record the broker refuses as too large; compression ---- */

/* Sets a topic config with the Admin API (IncrementalAlterConfigs is
 * newer than this librdkafka: AlterConfigs sets the whole resource). */
static void
topic_config(const char *topic, const char *name, const char *value)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        rd_kafka_ConfigResource_t *res =
            rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
        cr_assert(
            eq(int, rd_kafka_ConfigResource_set_config(res, name, value), 0));
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AlterConfigs(rk, &res, 1, NULL, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
        cr_assert(ev != NULL, "alter configs: no answer");
        cr_assert(eq(int, rd_kafka_event_error(ev), 0), "alter configs: %s",
                  rd_kafka_event_error_string(ev));
        size_t n = 0;
        const rd_kafka_ConfigResource_t **r =
            rd_kafka_AlterConfigs_result_resources(
                rd_kafka_event_AlterConfigs_result(ev), &n);
        cr_assert(eq(sz, n, 1));
        cr_assert(eq(int, rd_kafka_ConfigResource_error(r[0]), 0),
                  "alter %s %s=%s: %s", topic, name, value,
                  rd_kafka_ConfigResource_error_string(r[0]));
        rd_kafka_event_destroy(ev);
        rd_kafka_ConfigResource_destroy(res);
        rd_kafka_queue_destroy(q);
        rd_kafka_destroy(rk);
}

/* Reads every message of topic's partitions from the start: count and
 * the largest value size. */
static void
topic_read_all(const char *topic, int partitions, int want, int *count,
               size_t *max_len)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_conf_set(c, "group.id", kt_unique("kread"), e, sizeof(e));
        rd_kafka_conf_set(c, "enable.partition.eof", "false", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(partitions);
        for (int i = 0; i < partitions; i++)
                rd_kafka_topic_partition_list_add(l, topic, i)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        cr_assert(eq(int, rd_kafka_assign(rk, l), 0));
        rd_kafka_topic_partition_list_destroy(l);
        *count = 0;
        *max_len = 0;
        for (int idle = 0; idle < 100 && *count < want;) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
                if (!m) {
                        idle++;
                        continue;
                }
                if (!m->err) {
                        (*count)++;
                        if (m->len > *max_len)
                                *max_len = m->len;
                }
                rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
}

/* The broker refuses one row (larger than the topic's max.message.bytes,
 * smaller than the producer's limit, so only the broker knows; it refuses
 * the whole produce request with it). That row is dead-lettered naming
 * the limit; every other row is published, none charged an attempt (they
 * did nothing wrong), and nothing waits behind it. Without compression
 * and compressed (zstd, lz4): a compressed record could fit, so the
 * suspect is charged attempts until dead instead of dead at once. */
/* Parameters cross into the test's process as bytes: no pointers. */
static const char *const codecs[] = {"none", "zstd", "lz4"};
struct big {
        int backend;
        int codec; /* index into codecs */
};

ParameterizedTestParameters(relay, too_large)
{
        static struct big all[] = {{0, 0}, {1, 0}, {0, 1}, {1, 2}};
        return cr_make_param_array(struct big, all, 4);
}

ParameterizedTest(struct big *p, relay, too_large, .timeout = 180)
{
        const int *backend = &p->backend;
        const char *codec = codecs[p->codec];
        need_kafka();
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("kbig");
        kt_topic(topic, 2);
        topic_config(topic, "max.message.bytes", "65536");
        bool my = *backend == 1;
        /* 200 rows of 2 KB that compress well; row 100 is 200 KB of hex
         * noise (about 100 KB compressed: over the topic's limit). */
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 my ? "INSERT INTO kinbox_outbox (destination, idem_key, "
                      "aggregate_id, payload) SELECT '%s', CONCAT('k', seq), "
                      "CONCAT('agg-', seq %% 20), REPEAT('a', 2047) "
                      "FROM seq_0_to_199 WHERE seq <> 100"
                    : "INSERT INTO kinbox_outbox (destination, idem_key, "
                      "aggregate_id, payload) SELECT '%s', 'k' || i, "
                      "'agg-' || (i %% 20), convert_to(repeat('a', 2047), "
                      "'UTF8') FROM generate_series(0, 199) i WHERE i <> 100",
                 topic);
        kt_exec(url, sql);
        snprintf(sql, sizeof(sql),
                 my ? "INSERT INTO kinbox_outbox (destination, idem_key, "
                      "aggregate_id, payload) SELECT '%s', 'k100', 'agg-0', "
                      "GROUP_CONCAT(MD5(RAND()) SEPARATOR '') "
                      "FROM seq_1_to_6400"
                    : "INSERT INTO kinbox_outbox (destination, idem_key, "
                      "aggregate_id, payload) SELECT '%s', 'k100', 'agg-0', "
                      "convert_to(string_agg(md5(random()::text), ''), "
                      "'UTF8') FROM generate_series(1, 6400)",
                 topic);
        kt_exec(url, sql);
        char *ini = kt_tmp("bigrelay.ini");
        FILE *fp = fopen(ini, "w");
        cr_assert(fp != NULL);
        fprintf(fp,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "compression.type = %s\n[log]\nlevel = info\n"
                "[relay]\nenabled = true\nbatch.size = 50\n"
                "backoff.base.ms = 50\nbackoff.max.ms = 200\n",
                url, kt_env("KINBOX_BOOTSTRAP"), codec);
        fclose(fp);
        char *log = kt_tmp("bigrelay");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent'",
                                  199, 90),
                     199),
                  "log %s", log);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'dead'",
                                  1, 90),
                     1),
                  "log %s", log);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        /* The innocent rows were never charged. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent' AND attempts > 0"),
                     0),
                  "rows charged for the large one (log %s)", log);
        cr_assert(
            eq(i64,
               kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                            "status = 'dead' AND idem_key = 'k100' AND "
                            "last_error LIKE '%max.message.bytes (65536)%'"),
               1),
            "the dead row does not name the topic's limit (log %s)", log);
        /* The single test broker's topics have one replica: said once. */
        char *out = kt_slurp(log);
        cr_assert(
            out && strstr(out, "replication factor 1, min.insync.replicas 1"),
            "no warning about the topic's durability settings:\n%s", out);
        free(out);
        if (!strcmp(codec, "none"))
                cr_assert(eq(i64,
                             kt_qint(url, "SELECT attempts FROM kinbox_outbox "
                                          "WHERE idem_key = 'k100'"),
                             1),
                          "uncompressed, a too-large row is dead at once");
        int count;
        size_t max_len;
        topic_read_all(topic, 2, 199, &count, &max_len);
        cr_assert(eq(int, count, 199));
        cr_assert(eq(sz, max_len, 2047));
}

/* ---- partitions added to a relay's topic ---- */

/* Grow topic to n partitions (CreatePartitions). */
static void
add_partitions(const char *topic, int n)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        rd_kafka_NewPartitions_t *np =
            rd_kafka_NewPartitions_new(topic, (size_t)n, e, sizeof(e));
        cr_assert(np != NULL, "%s", e);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_CreatePartitions(rk, &np, 1, NULL, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
        cr_assert(ev != NULL, "create partitions: no answer");
        cr_assert(eq(int, rd_kafka_event_error(ev), 0),
                  "create partitions: %s", rd_kafka_event_error_string(ev));
        size_t cnt = 0;
        const rd_kafka_topic_result_t **tr =
            rd_kafka_CreatePartitions_result_topics(
                rd_kafka_event_CreatePartitions_result(ev), &cnt);
        cr_assert(eq(sz, cnt, 1));
        cr_assert(eq(int, rd_kafka_topic_result_error(tr[0]), 0), "%s",
                  rd_kafka_topic_result_error_string(tr[0]));
        rd_kafka_event_destroy(ev);
        rd_kafka_NewPartitions_destroy(np);
        rd_kafka_queue_destroy(q);
        rd_kafka_destroy(rk);
}

static void
append_rows(const char *url, const char *topic, const char *prefix, int n)
{
        for (int i = 0; i < n; i++) {
                char sql[400];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_outbox (destination, idem_key, "
                         "aggregate_id) VALUES ('%s', '%s-%d', '%s-%d')",
                         topic, prefix, i, prefix, i);
                kt_exec(url, sql);
        }
}

/* Partitions added to a topic the relay publishes to: rows appended 15 s
 * later are keyed over the new count (librdkafka's default metadata
 * refresh kept the old count for 5 minutes; the relay asks every 10 s).
 * Of 40 new keys some land on the new partitions 2 and 3 (all missing
 * them: 2^-40). */
KT_BACKENDS_PARAMS(relay, partitions_added)
ParameterizedTest(int *backend, relay, partitions_added, .timeout = 240)
{
        need_kafka();
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("kgrow");
        kt_topic(topic, 2);
        char *ini = kt_write_ini(url, "[relay]\nenabled = true\n"
                                      "poll.ms = 100\n");
        char *log = kt_tmp("growrelay");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        append_rows(url, topic, "a", 20);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent'",
                                  20, 60),
                     20),
                  "log %s", log);
        add_partitions(topic, 4);
        sleep(15);
        append_rows(url, topic, "b", 40);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent'",
                                  60, 60),
                     60),
                  "log %s", log);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        long long all = kt_high_sum(topic, 4), old = kt_high_sum(topic, 2);
        cr_assert(eq(i64, all, 60));
        cr_assert(all - old > 0,
                  "no row on the added partitions 2 and 3 (%lld on 0 and 1): "
                  "the relay kept the old partition count",
                  old);
}

/* ---- 4. a relay publishing to a topic nobody created ---- */

/* The row's error and the log explain the missing topic (not a bare
 * _UNKNOWN_TOPIC or _PURGE_QUEUE); nothing is created; once the topic
 * exists the row is published. */
KT_BACKENDS_PARAMS(relay, missing_topic)
ParameterizedTest(int *backend, relay, missing_topic, .timeout = 240)
{
        need_kafka();
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("krelmiss");
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key, payload) "
                 "VALUES ('%s', 'miss-1', 'x')",
                 topic);
        kt_exec(url, sql);
        char *ini = kt_write_ini(url, "[relay]\nenabled = true\n"
                                      "backoff.base.ms = 200\n"
                                      "backoff.max.ms = 1000\n");
        char *log = kt_tmp("relaymiss");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        const char *q = "SELECT COUNT(*) FROM kinbox_outbox WHERE idem_key = "
                        "'miss-1' AND (last_error LIKE '%does not exist%' OR "
                        "last_error LIKE '%a missing topic%')";
        cr_assert(eq(i64, kt_wait_qint(url, q, 1, 120), 1), "log %s", log);
        char *out = kt_slurp(log);
        cr_assert(out && (strstr(out, "does not exist") ||
                          strstr(out, "a missing topic")),
                  "the log does not explain the missing topic:\n%s", out);
        free(out);
        kt_topic(topic, 1);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent'",
                                  1, 120),
                     1),
                  "log %s", log);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
}
