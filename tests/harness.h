/*
 * harness.h -- shared test helpers: real services only.
 *
 * Every integration test reads the services started by scripts/services
 * from the environment (KINBOX_PG_URL, KINBOX_MYSQL_URL, KINBOX_BOOTSTRAP,
 * KINBOX_DEVBROKER_CONTROL) and FAILS when one is missing or unreachable.
 */
#ifndef KINBOX_TEST_HARNESS_H
#define KINBOX_TEST_HARNESS_H

#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <criterion/parameterized.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <kinbox/kinbox.h>

/* The two backends every integration test runs on. Criterion re-executes
 * the test binary for each test, so parameters are plain integers:
 * 0 = PostgreSQL, 1 = MySQL (see kt_backend()). */
#define KT_BACKENDS_PARAMS(suite, name)                                       \
        ParameterizedTestParameters(suite, name)                              \
        {                                                                     \
                static int b[] = {0, 1};                                      \
                return cr_make_param_array(int, b, 2);                        \
        }

/* "postgresql" or "mysql" for a backend parameter. */
const char *kt_backend(int idx);

/* getenv or fail the test naming the variable. */
const char *kt_env(const char *name);

/* A fresh, migrated database (kinbox schema + points handler schema) on
 * the backend; returns its URL (static storage per call site is not
 * needed: the string is malloc'ed and lives until exit). */
char *kt_fresh_db(const char *backend);
/* A new database on the backend with nothing in it (not migrated). */
char *kt_empty_db(const char *backend);

/* A unique name with a prefix. Strings returned by kt_* functions are
 * owned by the harness and freed at exit. */
char *kt_unique(const char *prefix);
/* A unique path for a log or ini file under $KT_TMPDIR (default
 * /tmp/kinbox-tests; scripts/test empties it before each run). Freed at
 * exit. */
char *kt_tmp(const char *name);

/* Which Kafka the test runs against. Default: the dev broker (the
 * librdkafka mock cluster of scripts/services; request-level fault
 * injection through kt_broker()). With KT_BROKER=kafka: a real Apache
 * Kafka broker, KINBOX_KAFKA_BOOTSTRAP, which the harness then puts into
 * KINBOX_BOOTSTRAP for the whole test binary (the ctest entries NAME@kafka;
 * docs/kafka.md). The binary exits 2 when KINBOX_KAFKA_BOOTSTRAP is not
 * set: a missing broker fails, never skips. */
bool kt_real_kafka(void);

/* Create a topic: on the dev broker through its control socket; on real
 * Kafka with the Admin API (replication factor KT_REPLICATION, default 1),
 * returning once every partition has a leader. */
void kt_topic(const char *topic, int partitions);
/* Send one control command to the dev broker; returns its reply line
 * (owned by the harness). Fails the test on real Kafka: a test that
 * injects faults this way runs on the dev broker only. */
char *kt_broker(const char *fmt, ...);

/* Producer. msgid may be NULL (no header). partition -1 = by key. */
typedef struct kt_producer kt_producer_t;
kt_producer_t *kt_producer_new(void);
void kt_produce(kt_producer_t *p, const char *topic, int32_t partition,
                const char *key, const char *payload, const char *msgid);
/* kt_produce() with the record's timestamp (ms since the epoch, UTC; 0:
 * now). */
void kt_produce_at(kt_producer_t *p, const char *topic, int32_t partition,
                   const char *key, const char *payload, const char *msgid,
                   int64_t ts_ms);
void kt_producer_flush_destroy(kt_producer_t *p);

/* Produce n points grants (ids m-<i>, orders <order_prefix>-<i>, users
 * user_base+1..user_base+97, key = user) to topic; returns the expected
 * total. dup_every > 0 re-sends every dup_every-th message with the same
 * id at another offset (count in *dups_out, may be NULL). */
long long kt_produce_grants(const char *topic, int from, int n, int dup_every,
                            const char *order_prefix, int user_base,
                            int *dups_out);

/* Assert user_account/user_points_flow: total points and flow rows, and
 * every balance equal to the sum of its flows. */
void kt_assert_points(const char *url, long long total, long long flows);

/* A consumer configuration on url for topics. */
kinbox_conf_t *kt_conf(const char *url, const char *name, const char *group,
                       const char *topics);
void kt_set(kinbox_conf_t *c, const char *k, const char *v);

/* A consumer running in a thread. */
typedef struct kt_run kt_run_t;
kt_run_t *kt_run_start(kinbox_conf_t *conf, kinbox_handler_fn fn,
                       kinbox_batch_handler_fn bfn, void *opaque);
kinbox_consumer_t *kt_run_consumer(kt_run_t *r);
/* Stop, join, assert it returned KINBOX_OK, destroy. */
void kt_run_stop(kt_run_t *r);
/* The same, reading the consumer's final counters into *st first (a
 * batch's counters move just after its COMMIT, so counters read while the
 * consumer runs may lag the rows a test sees). */
void kt_run_stop_stats(kt_run_t *r, kinbox_consumer_stats_t *st);

/* A relay (kinbox_relay_new() on conf, which it takes) running
 * kinbox_relay_run() in a thread; fails the test when it cannot be made. */
typedef struct kt_relay kt_relay_t;
kt_relay_t *kt_relay_start(kinbox_conf_t *conf);
/* Stop, join, assert it returned KINBOX_OK, destroy. */
void kt_relay_stop(kt_relay_t *r);

/* `kinbox run -c FILE` as a child process with extra environment
 * ("NAME=value" or NULL). stderr goes to log_path. */
pid_t kt_spawn_kinbox(const char *ini_path, const char *env1,
                      const char *log_path);
/* Wait for pid; returns its exit status or -signal. */
int kt_wait(pid_t pid, int timeout_s);
/* kt_wait() that does not fail: the exit status, -signal, or -1000 when
 * still running after timeout_s (then killed). */
int kt_wait_exit(pid_t pid, int timeout_s);
/* scripts/services CMD (KINBOX_SERVICES) for this run; fails the test
 * when it does not exit 0. */
void kt_services(const char *cmd);
/* Write an INI file for `kinbox run`; returns its path. */
char *kt_write_ini(const char *url, const char *sections_fmt, ...);

/* Single-value queries (fail the test on error). */
long long kt_qint(const char *url, const char *sql);
/* kt_qint with a printf-style statement. */
long long kt_qintf(const char *url, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Run a statement (fail the test on error). */
void kt_exec(const char *url, const char *sql);
/* Run sql; 0, or the MySQL errno of its failure (-1 for another error):
 * for statements that may fail in an expected way. */
int kt_exec_err(const char *url, const char *sql);

/* Milliseconds of CLOCK_MONOTONIC: for deadlines of waits. */
long long kt_clock_ms(void);

/* Poll until kt_qint(url, sql) == want or timeout_s seconds of the clock
 * passed; returns the last value. */
long long kt_wait_qint(const char *url, const char *sql, long long want,
                       int timeout_s);

/* The group's committed offset sum over topic's partitions. */
long long kt_committed_sum(const char *group, const char *topic,
                           int partitions);
/* Sum of high watermarks of topic (messages produced). */
long long kt_high_sum(const char *topic, int partitions);

/* Run `kinbox ARGS` (ARGS a printf format; KINBOX_BIN): stdout into *out
 * and stderr into *err (malloc'ed; NULL drops it), or, with merge, stderr
 * into *out too. Returns the exit status (-1: killed). */
int kt_kinbox(char **out, char **err, bool merge, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int kt_kinboxv(char **out, char **err, bool merge, const char *fmt,
               va_list ap);

/* Read a whole file (malloc'ed, NUL-terminated) or NULL. */
char *kt_slurp(const char *path);

/* A TCP port free on 127.0.0.1 right now (bound, read, closed). */
int kt_free_port(void);

/* The last `lines` lines of a file (malloc'ed; "(no log)" when it cannot
 * be read): for failure messages, since CI keeps only the test output. */
char *kt_tail(const char *path, int lines);

/* A TCP connection to 127.0.0.1:port (its fd), -1 when refused; reads
 * time out after timeout_s when timeout_s > 0. */
int kt_connect(int port, int timeout_s);

/* ---- the library's log, captured */

/* What a kinbox_conf_set_log_cb() callback of kt_log_grab() gathered:
 * each message and a newline (what does not fit is dropped). */
typedef struct kt_log {
        char text[16384];
} kt_log_t;

/* A log callback; opaque: the kt_log_t to append to. */
void kt_log_grab(int level, const char *facility, const char *message,
                 void *opaque);

/* kinbox_prune(c, dry) asserted KINBOX_OK, c destroyed; its log into
 * log (emptied first). */
kinbox_prune_result_t kt_prune(kinbox_conf_t *c, int dry, kt_log_t *log);

/* The word after each prefix in text, in order, ',' after each, into out. */
void kt_words_after(const char *text, const char *prefix, char *out,
                    size_t sz);

/* GET path from 127.0.0.1:port: the HTTP status (-1: no connection; -2:
 * nothing within timeout_s when timeout_s > 0), the body in *body
 * (malloc'ed; body may be NULL). */
int kt_http_get(int port, const char *path, int timeout_s, char **body);

/* kt_http_get() every 100 ms until path answers want with a body holding
 * has (NULL: any), up to timeout_s; the last status, and its body in *body
 * (may be NULL). */
int kt_wait_http(int port, const char *path, int want, const char *has,
                 int timeout_s, char **body);

#endif
