/*
 * harness.c -- shared test helpers (real PostgreSQL, MariaDB, dev broker).
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../handlers/points/points.h"
#include "db.h"
#include "internal.h"

const char *
kt_env(const char *name)
{
        const char *v = getenv(name);
        if (!v || !*v)
                cr_fatal("%s is not set: start the services with "
                         "`scripts/services start` and source "
                         "$KINBOX_RUN_DIR/services.env (scripts/test does)",
                         name);
        return v;
}

/* Strings handed to tests live until exit: freed by an atexit handler that
 * runs before LeakSanitizer's check, so sanitizer runs stay quiet. */
static void *kept[4096];
static int nkept;

static void
free_kept(void)
{
        for (int i = 0; i < nkept; i++)
                free(kept[i]);
        nkept = 0;
}

static void *
keep(void *p)
{
        if (!nkept)
                atexit(free_kept);
        if (nkept < (int)(sizeof(kept) / sizeof(kept[0])))
                kept[nkept++] = p;
        return p;
}

const char *
kt_backend(int idx)
{
        return idx == 1 ? "mysql" : "postgresql";
}

char *
kt_unique(const char *prefix)
{
        static int seq;
        char b[128];
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(b, sizeof(b), "%s_%d_%ld_%d", prefix, (int)getpid(),
                 (long)(ts.tv_nsec / 1000) % 1000000, ++seq);
        return keep(strdup(b));
}

char *
kt_tmp(const char *name)
{
        const char *dir = getenv("KT_TMPDIR");
        if (!dir || !*dir)
                dir = "/tmp/kinbox-tests";
        if (mkdir(dir, 0777) && errno != EEXIST)
                cr_fatal("cannot create %s: %s", dir, strerror(errno));
        char b[256];
        snprintf(b, sizeof(b), "%s/%s", dir, name);
        return kt_unique(b);
}

static kinbox__db_t *
kt_db(const char *url)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "bad url %s: %s", url, e);
        int rc = kinbox__db_connect(db);
        cr_assert(rc == 0, "cannot connect to %s: %s", url, db->err.msg);
        return db;
}

void
kt_exec(const char *url, const char *sql)
{
        kinbox__db_t *db = kt_db(url);
        int rc = db->ops->script(db, sql);
        cr_assert(rc == 0, "%s: %s", sql, db->err.msg);
        kinbox__db_destroy(db);
}

int
kt_exec_err(const char *url, const char *sql)
{
        kinbox__db_t *db = kt_db(url);
        int rc = db->ops->script(db, sql);
        int vendor = rc ? (db->err.vendor ? db->err.vendor : -1) : 0;
        kinbox__db_destroy(db);
        return vendor;
}

long long
kt_qint(const char *url, const char *sql)
{
        kinbox__db_t *db = kt_db(url);
        kinbox_rows_t *r = NULL;
        int rc = kinbox__db_query(db, sql, 0, NULL, &r);
        cr_assert(rc == 0, "%s: %s", sql, db->err.msg);
        const char *v = kinbox_rows_value(r, 0, 0, NULL);
        long long n = v ? strtoll(v, NULL, 10) : 0;
        kinbox_rows_destroy(r);
        kinbox__db_destroy(db);
        return n;
}

long long
kt_qintf(const char *url, const char *fmt, ...)
{
        char sql[4096];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        cr_assert(n >= 0 && (size_t)n < sizeof(sql), "statement too long");
        return kt_qint(url, sql);
}

long long
kt_clock_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long long
kt_wait_qint(const char *url, const char *sql, long long want, int timeout_s)
{
        /* A deadline by the clock, not a count of rounds: on a loaded
         * machine each query takes a while, and the test's own timeout
         * would end it before this one says what it saw. */
        long long end = kt_clock_ms() + timeout_s * 1000LL;
        long long v = -1;
        for (;;) {
                v = kt_qint(url, sql);
                if (v == want || kt_clock_ms() >= end)
                        return v;
                usleep(100000);
        }
}

/* Replace the database name of url with db. */
static char *
url_with_db(const char *url, const char *db)
{
        const char *scheme_end = strstr(url, "://");
        const char *slash = strchr(scheme_end + 3, '/');
        size_t base = slash ? (size_t)(slash - url) : strlen(url);
        const char *q = slash ? strchr(slash, '?') : NULL;
        char *o = malloc(base + strlen(db) + (q ? strlen(q) : 0) + 2);
        memcpy(o, url, base);
        sprintf(o + base, "/%s%s", db, q ? q : "");
        return o;
}

char *
kt_empty_db(const char *backend)
{
        bool my = !strcmp(backend, "mysql");
        const char *url = kt_env(my ? "KINBOX_MYSQL_URL" : "KINBOX_PG_URL");
        char *name = kt_unique("kt");
        char sql[256];
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
        kt_exec(url, sql);
        return keep(url_with_db(url, name));
}

char *
kt_fresh_db(const char *backend)
{
        bool my = !strcmp(backend, "mysql");
        const char *url = kt_env(my ? "KINBOX_MYSQL_URL" : "KINBOX_PG_URL");
        char *name = kt_unique("kt");
        char sql[256];
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
        kt_exec(url, sql);
        char *u = keep(url_with_db(url, name));
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", u);
        char e[1024];
        kinbox_err_t rc = kinbox_migrate(c, e, sizeof(e));
        cr_assert(rc == KINBOX_OK, "migrate %s: %s", u, e);
        rc = kinbox_migrate_module(c, &kinbox_points_module, e, sizeof(e));
        cr_assert(rc == KINBOX_OK, "migrate points %s: %s", u, e);
        kinbox_conf_destroy(c);
        return u;
}

bool
kt_real_kafka(void)
{
        const char *b = getenv("KT_BROKER");
        return b && !strcmp(b, "kafka");
}

/* Before main (and so before Criterion forks a test): KT_BROKER=kafka
 * points every KINBOX_BOOTSTRAP reader at the real broker and removes the
 * dev broker's control socket, so nothing reaches the mock by mistake. */
__attribute__((constructor)) static void
kt_broker_select(void)
{
        const char *b = getenv("KT_BROKER");
        if (!b || !*b || !strcmp(b, "devbroker"))
                return;
        if (strcmp(b, "kafka")) {
                fprintf(stderr,
                        "harness: KT_BROKER=%s: want kafka or devbroker\n", b);
                exit(2);
        }
        const char *bs = getenv("KINBOX_KAFKA_BOOTSTRAP");
        if (!bs || !*bs) {
                fprintf(stderr, "harness: KT_BROKER=kafka but "
                                "KINBOX_KAFKA_BOOTSTRAP is not set "
                                "(scripts/services start starts Apache Kafka "
                                "and writes it to "
                                "services.env)\n");
                exit(2);
        }
        setenv("KINBOX_BOOTSTRAP", bs, 1);
        unsetenv("KINBOX_DEVBROKER_CONTROL");
}

char *
kt_broker(const char *fmt, ...)
{
        if (kt_real_kafka())
                cr_fatal("kt_broker(\"%s\"): this test injects faults into "
                         "the dev broker; "
                         "it cannot run on real Kafka (KT_BROKER=kafka)",
                         fmt);
        const char *path = kt_env("KINBOX_DEVBROKER_CONTROL");
        char cmd[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
        va_end(ap);
        strcat(cmd, "\n");
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        cr_assert(fd >= 0 &&
                      connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0,
                  "dev broker control socket %s: %s", path, strerror(errno));
        cr_assert(write(fd, cmd, strlen(cmd)) == (ssize_t)strlen(cmd));
        char reply[1024];
        size_t n = 0;
        while (n < sizeof(reply) - 1) {
                ssize_t r = read(fd, reply + n, sizeof(reply) - 1 - n);
                if (r <= 0)
                        break;
                n += (size_t)r;
                if (memchr(reply, '\n', n))
                        break;
        }
        close(fd);
        reply[n] = '\0';
        reply[strcspn(reply, "\n")] = '\0';
        cr_assert(strncmp(reply, "ok", 2) == 0, "dev broker: %s -> %s", cmd,
                  reply);
        return keep(strdup(reply));
}

/* Every partition of topic has a leader in a metadata answer. */
static bool
kt_topic_ready(rd_kafka_t *rk, const char *topic, int partitions)
{
        rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
        const struct rd_kafka_metadata *md = NULL;
        bool ok = false;
        if (rd_kafka_metadata(rk, 0, t, &md, 5000) == 0 &&
            md->topic_cnt == 1 && md->topics[0].err == 0 &&
            md->topics[0].partition_cnt == partitions) {
                ok = true;
                for (int i = 0; i < partitions; i++)
                        if (md->topics[0].partitions[i].err ||
                            md->topics[0].partitions[i].leader < 0)
                                ok = false;
        }
        if (md)
                rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(t);
        return ok;
}

static void
kt_topic_kafka(const char *topic, int partitions)
{
        char e[512];
        const char *rf_s = getenv("KT_REPLICATION");
        int rf = rf_s && *rf_s ? atoi(rf_s) : 1;
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(rk != NULL, "admin client: %s", e);
        rd_kafka_NewTopic_t *nt =
            rd_kafka_NewTopic_new(topic, partitions, rf, e, sizeof(e));
        cr_assert(nt != NULL, "new topic %s: %s", topic, e);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AdminOptions_t *o =
            rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
        rd_kafka_AdminOptions_set_operation_timeout(o, 30000, e, sizeof(e));
        rd_kafka_CreateTopics(rk, &nt, 1, o, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 60000);
        cr_assert(ev != NULL, "create topic %s: no answer in 60 s", topic);
        cr_assert(rd_kafka_event_error(ev) == 0, "create topic %s: %s", topic,
                  rd_kafka_event_error_string(ev));
        size_t n = 0;
        const rd_kafka_topic_result_t **r =
            rd_kafka_CreateTopics_result_topics(
                rd_kafka_event_CreateTopics_result(ev), &n);
        cr_assert(n == 1, "create topic %s: %zu results", topic, n);
        rd_kafka_resp_err_t te = rd_kafka_topic_result_error(r[0]);
        cr_assert(te == 0 || te == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS,
                  "create topic %s (%d partitions, replication %d): %s", topic,
                  partitions, rf, rd_kafka_topic_result_error_string(r[0]));
        rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(o);
        rd_kafka_NewTopic_destroy(nt);
        rd_kafka_queue_destroy(q);
        int tries = 0;
        while (!kt_topic_ready(rk, topic, partitions)) {
                tries++;
                cr_assert(tries < 300,
                          "topic %s: partitions without a leader after 30 s",
                          topic);
                usleep(100 * 1000);
        }
        rd_kafka_destroy(rk);
}

void
kt_topic(const char *topic, int partitions)
{
        if (kt_real_kafka())
                kt_topic_kafka(topic, partitions);
        else
                kt_broker("topic %s %d", topic, partitions);
}

struct kt_producer {
        rd_kafka_t *rk;
};

kt_producer_t *
kt_producer_new(void)
{
        char e[256];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_conf_set(c, "enable.idempotence", "true", e, sizeof(e));
        rd_kafka_conf_set(c, "linger.ms", "5", e, sizeof(e));
        /* The mock does not check idempotent sequence numbers: with more
         * than one request in flight, injected errors can lose a message
         * librdkafka reports delivered (see relay_conf in outbox_test.c).
         * Only there: real Kafka runs librdkafka's default (5). */
        if (!kt_real_kafka())
                rd_kafka_conf_set(c, "max.in.flight.requests.per.connection",
                                  "1", e, sizeof(e));
        kt_producer_t *p = calloc(1, sizeof(*p));
        p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(p->rk != NULL, "producer: %s", e);
        return p;
}

void
kt_produce(kt_producer_t *p, const char *topic, int32_t partition,
           const char *key, const char *payload, const char *msgid)
{
        kt_produce_at(p, topic, partition, key, payload, msgid, 0);
}

void
kt_produce_at(kt_producer_t *p, const char *topic, int32_t partition,
              const char *key, const char *payload, const char *msgid,
              int64_t ts_ms)
{
        rd_kafka_headers_t *h = rd_kafka_headers_new(1);
        if (msgid)
                rd_kafka_header_add(h, "message_id", -1, msgid, -1);
        for (;;) {
                rd_kafka_resp_err_t e = rd_kafka_producev(
                    p->rk, RD_KAFKA_V_TOPIC(topic),
                    RD_KAFKA_V_PARTITION(partition < 0 ? RD_KAFKA_PARTITION_UA
                                                       : partition),
                    RD_KAFKA_V_KEY(key, key ? strlen(key) : 0),
                    RD_KAFKA_V_VALUE((void *)payload,
                                     payload ? strlen(payload) : 0),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_TIMESTAMP(ts_ms), RD_KAFKA_V_HEADERS(h),
                    RD_KAFKA_V_END);
                if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                        rd_kafka_poll(p->rk, 50);
                        continue;
                }
                cr_assert(e == 0, "produce: %s", rd_kafka_err2str(e));
                break;
        }
        rd_kafka_poll(p->rk, 0);
}

void
kt_producer_flush_destroy(kt_producer_t *p)
{
        rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, 30000);
        cr_assert(e == 0, "flush: %s", rd_kafka_err2str(e));
        rd_kafka_destroy(p->rk);
        free(p);
}

long long
kt_produce_grants(const char *topic, int from, int n, int dup_every,
                  const char *order_prefix, int user_base, int *dups_out)
{
        kt_producer_t *p = kt_producer_new();
        long long total = 0;
        int dups = 0;
        char key[32], payload[200], id[32];
        for (int i = from; i < from + n; i++) {
                int user = user_base + i % 97 + 1, pts = i % 13 + 1;
                snprintf(key, sizeof(key), "u%d", user);
                snprintf(id, sizeof(id), "m-%d", i);
                snprintf(payload, sizeof(payload),
                         "{\"order_id\":\"%s-%d\",\"user_id\":%d,"
                         "\"grant_points\":%d}",
                         order_prefix, i, user, pts);
                kt_produce(p, topic, -1, key, payload, id);
                total += pts;
                if (dup_every && i % dup_every == 0) {
                        /* Same id and order, other partition and offset. */
                        snprintf(key, sizeof(key), "dup-%d", i);
                        kt_produce(p, topic, -1, key, payload, id);
                        dups++;
                }
        }
        kt_producer_flush_destroy(p);
        if (dups_out)
                *dups_out = dups;
        return total;
}

void
kt_assert_points(const char *url, long long total, long long flows)
{
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COALESCE(SUM(points), 0) "
                                  "FROM user_account"),
                     total));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "user_points_flow"),
                     flows));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM user_account a WHERE "
                                  "points <> (SELECT COALESCE(SUM("
                                  "points_delta), 0) FROM user_points_flow f "
                                  "WHERE f.user_id = a.user_id)"),
                     0));
}

void
kt_set(kinbox_conf_t *c, const char *k, const char *v)
{
        char e[512];
        kinbox_err_t rc = kinbox_conf_set(c, k, v, e, sizeof(e));
        cr_assert(rc == KINBOX_OK, "conf %s=%s: %s", k, v, e);
}

kinbox_conf_t *
kt_conf(const char *url, const char *name, const char *group,
        const char *topics)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        kt_set(c, "name", name);
        kt_set(c, "group.id", group);
        kt_set(c, "topics", topics);
        kt_set(c, "kafka.bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"));
        kt_set(c, "kafka.session.timeout.ms", "6000");
        kt_set(c, "kafka.heartbeat.interval.ms", "500");
        kt_set(c, "log.level", getenv("KT_DEBUG") ? "debug" : "notice");
        return c;
}

struct kt_run {
        kinbox_consumer_t *c;
        pthread_t thr;
        kinbox_err_t rc;
};

static void *
kt_run_main(void *arg)
{
        kt_run_t *r = arg;
        r->rc = kinbox_consumer_run(r->c);
        return NULL;
}

kt_run_t *
kt_run_start(kinbox_conf_t *conf, kinbox_handler_fn fn,
             kinbox_batch_handler_fn bfn, void *opaque)
{
        char e[512];
        kt_run_t *r = calloc(1, sizeof(*r));
        r->c = kinbox_consumer_new(conf, e, sizeof(e));
        cr_assert(r->c != NULL, "consumer: %s", e);
        if (bfn)
                kinbox_consumer_set_batch_handler(r->c, bfn, opaque);
        else
                kinbox_consumer_set_handler(r->c, fn, opaque);
        pthread_create(&r->thr, NULL, kt_run_main, r);
        return r;
}

kinbox_consumer_t *
kt_run_consumer(kt_run_t *r)
{
        return r->c;
}

void
kt_run_stop(kt_run_t *r)
{
        kt_run_stop_stats(r, NULL);
}

/* Every thread's stack of this process, on stderr (gdb, when the machine
 * has it): what a hung stop was waiting for. */
static void
kt_print_stacks(const char *why)
{
        fprintf(stderr, "kt: %s: the stacks of process %d follow\n", why,
                (int)getpid());
        char pid[16];
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        pid_t g = fork();
        if (g == 0) {
                dup2(2, 1);
                execlp("gdb", "gdb", "-q", "-batch", "-p", pid, "-ex",
                       "thread apply all bt", (char *)NULL);
                fprintf(stderr, "kt: no gdb on PATH: no stacks\n");
                _exit(127);
        }
        if (g > 0)
                waitpid(g, NULL, 0);
}

/* A watchdog over a step that must not hang: after secs it prints every
 * thread's stack once (the test's own timeout then ends it). */
typedef struct kt_watch {
        pthread_t thr;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool done;
        int secs;
        const char *what;
} kt_watch_t;

static void *
kt_watch_main(void *arg)
{
        kt_watch_t *w = arg;
        struct timespec ts;
        kinbox__deadline(w->secs * 1000LL, &ts);
        pthread_mutex_lock(&w->lock);
        int rc = 0;
        while (!w->done && rc != ETIMEDOUT)
                rc = pthread_cond_timedwait(&w->cond, &w->lock, &ts);
        bool late = !w->done;
        pthread_mutex_unlock(&w->lock);
        if (late) {
                char why[160];
                snprintf(why, sizeof(why), "%s took over %d s", w->what,
                         w->secs);
                kt_print_stacks(why);
        }
        return NULL;
}

static void
kt_watch_start(kt_watch_t *w, const char *what, int secs)
{
        *w = (kt_watch_t){.done = false, .secs = secs, .what = what};
        pthread_mutex_init(&w->lock, NULL);
        pthread_cond_init(&w->cond, NULL);
        pthread_create(&w->thr, NULL, kt_watch_main, w);
}

static void
kt_watch_end(kt_watch_t *w)
{
        pthread_mutex_lock(&w->lock);
        w->done = true;
        pthread_cond_signal(&w->cond);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thr, NULL);
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
}

void
kt_run_stop_stats(kt_run_t *r, kinbox_consumer_stats_t *st)
{
        /* The consumer bounds its own shutdown (the group leave at 10 s,
         * the final commit): a stop past 45 s is a bug, and its stacks
         * say where. */
        kt_watch_t wd;
        kt_watch_start(&wd, "stopping the consumer", 45);
        kinbox_consumer_stop(r->c);
        pthread_join(r->thr, NULL);
        if (st)
                kinbox_consumer_stats(r->c, st);
        kinbox_err_t rc = r->rc;
        char err[512];
        snprintf(err, sizeof(err), "%s", kinbox_consumer_errstr(r->c));
        kinbox_consumer_destroy(r->c);
        kt_watch_end(&wd);
        free(r);
        cr_assert(rc == KINBOX_OK, "consumer run: %s: %s", kinbox_err_name(rc),
                  err);
}

struct kt_relay {
        kinbox_relay_t *r;
        pthread_t thr;
        kinbox_err_t rc;
};

static void *
relay_thread(void *arg)
{
        kt_relay_t *t = arg;
        t->rc = kinbox_relay_run(t->r);
        return NULL;
}

kt_relay_t *
kt_relay_start(kinbox_conf_t *conf)
{
        kt_relay_t *t = calloc(1, sizeof(*t));
        char e[512];
        cr_assert(t != NULL);
        t->r = kinbox_relay_new(conf, e, sizeof(e));
        cr_assert(t->r != NULL, "relay: %s", e);
        cr_assert(pthread_create(&t->thr, NULL, relay_thread, t) == 0);
        return t;
}

void
kt_relay_stop(kt_relay_t *t)
{
        kinbox_relay_stop(t->r);
        pthread_join(t->thr, NULL);
        cr_assert(t->rc == KINBOX_OK, "relay run: %s: %s",
                  kinbox_err_name(t->rc), kinbox_relay_errstr(t->r));
        kinbox_relay_destroy(t->r);
        free(t);
}

char *
kt_write_ini(const char *url, const char *fmt, ...)
{
        char *path = kt_tmp("ini");
        char *p2 = keep(malloc(strlen(path) + 5));
        sprintf(p2, "%s.ini", path);
        FILE *fp = fopen(p2, "w");
        cr_assert(fp != NULL);
        fprintf(fp,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "session.timeout.ms = 6000\nheartbeat.interval.ms = 500\n"
                "[log]\nlevel = info\n",
                url, kt_env("KINBOX_BOOTSTRAP"));
        va_list ap;
        va_start(ap, fmt);
        vfprintf(fp, fmt, ap);
        va_end(ap);
        fclose(fp);
        return p2;
}

/* `kinbox run` children of this test process: a test that fails before
 * it stops its child must not leave it consuming (in a group the next
 * test joins). Killed when the test process exits. */
static pid_t spawned[256];
static size_t nspawned;

static void
reap_spawned(void)
{
        for (size_t i = 0; i < nspawned; i++)
                if (kill(spawned[i], 0) == 0 &&
                    waitpid(spawned[i], NULL, WNOHANG) == 0) {
                        kill(spawned[i], SIGKILL);
                        waitpid(spawned[i], NULL, 0);
                }
}

pid_t
kt_spawn_kinbox(const char *ini, const char *env1, const char *log_path)
{
        const char *bin = kt_env("KINBOX_BIN");
        static bool reaper;
        if (!reaper)
                reaper = atexit(reap_spawned) == 0;
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
                int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
                if (fd >= 0) {
                        dup2(fd, 2);
                        dup2(fd, 1);
                }
                if (env1)
                        putenv((char *)env1);
                execl(bin, bin, "run", "-c", ini, (char *)NULL);
                _exit(127);
        }
        if (nspawned < sizeof(spawned) / sizeof(spawned[0]))
                spawned[nspawned++] = pid;
        return pid;
}

int
kt_wait(pid_t pid, int timeout_s)
{
        for (int i = 0; i < timeout_s * 20; i++) {
                int st;
                pid_t r = waitpid(pid, &st, WNOHANG);
                if (r == pid)
                        return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
                usleep(50000);
        }
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_fail("process %d did not exit within %d s", (int)pid, timeout_s);
        return -1;
}

int
kt_wait_exit(pid_t pid, int timeout_s)
{
        for (int i = 0; i < timeout_s * 20; i++) {
                int st;
                if (waitpid(pid, &st, WNOHANG) == pid)
                        return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
                usleep(50000);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1000;
}

void
kt_services(const char *cmd)
{
        char line[512];
        snprintf(line, sizeof(line), "\"%s\" %s >/dev/null 2>&1",
                 kt_env("KINBOX_SERVICES"), cmd);
        cr_assert(eq(int, system(line), 0), "scripts/services %s failed", cmd);
}

static rd_kafka_t *
group_handle(const char *group)
{
        char e[256];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_conf_set(c, "group.id", group, e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        return rk;
}

long long
kt_committed_sum(const char *group, const char *topic, int partitions)
{
        rd_kafka_t *rk = group_handle(group);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(partitions);
        for (int i = 0; i < partitions; i++)
                rd_kafka_topic_partition_list_add(l, topic, i);
        rd_kafka_resp_err_t e = rd_kafka_committed(rk, l, 10000);
        cr_assert(e == 0, "committed: %s", rd_kafka_err2str(e));
        long long sum = 0;
        for (int i = 0; i < l->cnt; i++)
                if (l->elems[i].offset > 0)
                        sum += l->elems[i].offset;
        rd_kafka_topic_partition_list_destroy(l);
        rd_kafka_destroy(rk);
        return sum;
}

long long
kt_high_sum(const char *topic, int partitions)
{
        rd_kafka_t *rk = group_handle("kt-watermarks");
        long long sum = 0;
        for (int i = 0; i < partitions; i++) {
                int64_t lo, hi;
                rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(
                    rk, topic, i, &lo, &hi, 10000);
                cr_assert(e == 0, "watermarks: %s", rd_kafka_err2str(e));
                sum += hi;
        }
        rd_kafka_destroy(rk);
        return sum;
}

int
kt_free_port(void)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t l = sizeof(a);
        cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                  getsockname(fd, (struct sockaddr *)&a, &l) == 0);
        close(fd);
        return ntohs(a.sin_port);
}

char *
kt_slurp(const char *path)
{
        FILE *fp = fopen(path, "r");
        if (!fp)
                return NULL;
        fseek(fp, 0, SEEK_END);
        long n = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (!b) {
                fclose(fp);
                return NULL;
        }
        size_t r = fread(b, 1, (size_t)n, fp);
        b[r] = '\0';
        fclose(fp);
        return b;
}

char *
kt_tail(const char *path, int lines)
{
        char *s = kt_slurp(path);
        if (!s)
                return strdup("(no log)");
        size_t n = strlen(s);
        size_t i = n;
        if (i && s[i - 1] == '\n')
                i--;
        while (i > 0 && lines > 0) {
                i--;
                if (s[i] == '\n')
                        lines--;
        }
        if (s[i] == '\n')
                i++;
        memmove(s, s + i, n - i + 1);
        return s;
}

int
kt_kinboxv(char **out, char **err, bool merge, const char *fmt, va_list ap)
{
        char args[2048], cmd[4096];
        vsnprintf(args, sizeof(args), fmt, ap);
        char *errf = kt_tmp("kinbox_err");
        if (merge)
                snprintf(cmd, sizeof(cmd), "\"%s\" %s 2>&1 </dev/null",
                         kt_env("KINBOX_BIN"), args);
        else
                snprintf(cmd, sizeof(cmd), "\"%s\" %s 2>%s </dev/null",
                         kt_env("KINBOX_BIN"), args, errf);
        FILE *fp = popen(cmd, "r");
        cr_assert(fp != NULL);
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap);
        cr_assert(buf != NULL);
        for (size_t r; (r = fread(buf + n, 1, cap - n - 1, fp)) > 0;) {
                n += r;
                if (n + 1 == cap) {
                        buf = realloc(buf, cap *= 2);
                        cr_assert(buf != NULL);
                }
        }
        buf[n] = '\0';
        int st = pclose(fp);
        char *e = merge ? NULL : kt_slurp(errf);
        unlink(errf);
        if (out)
                *out = buf;
        else
                free(buf);
        if (err)
                *err = e ? e : strdup("");
        else
                free(e);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int
kt_kinbox(char **out, char **err, bool merge, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int rc = kt_kinboxv(out, err, merge, fmt, ap);
        va_end(ap);
        return rc;
}

/* ---- the library's log, captured */

void
kt_log_grab(int level, const char *facility, const char *message, void *opaque)
{
        (void)level;
        (void)facility;
        kt_log_t *l = opaque;
        size_t n = strlen(l->text);
        if (n + strlen(message) + 2 < sizeof(l->text))
                snprintf(l->text + n, sizeof(l->text) - n, "%s\n", message);
}

kinbox_prune_result_t
kt_prune(kinbox_conf_t *c, int dry, kt_log_t *log)
{
        log->text[0] = '\0';
        kinbox_conf_set_log_cb(c, kt_log_grab, log);
        kinbox_prune_result_t res;
        char e[512];
        kinbox_err_t rc = kinbox_prune(c, dry, NULL, &res, e, sizeof(e));
        cr_assert(eq(int, rc, KINBOX_OK), "prune: %s", e);
        kinbox_conf_destroy(c);
        return res;
}

void
kt_words_after(const char *text, const char *prefix, char *out, size_t sz)
{
        size_t n = 0;
        out[0] = '\0';
        for (const char *p = strstr(text, prefix); p;
             p = strstr(p + 1, prefix)) {
                p += strlen(prefix);
                size_t len = strcspn(p, " \n");
                n += (size_t)snprintf(out + n, sz - n, "%.*s,", (int)len, p);
                if (n >= sz)
                        break;
        }
}

/* ---- HTTP (the metrics endpoint of `kinbox run`) */

int
kt_connect(int port, int timeout_s)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(fd >= 0);
        if (timeout_s > 0) {
                struct timeval tv = {.tv_sec = timeout_s};
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        }
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
                close(fd);
                return -1;
        }
        return fd;
}

/* GET path from 127.0.0.1:port; returns the HTTP status (-1: no
 * connection), body in *body. timeout_s > 0 bounds the wait for the
 * answer: -2 when nothing came within it. */
int
kt_http_get(int port, const char *path, int timeout_s, char **body)
{
        int fd = kt_connect(port, timeout_s);
        if (fd < 0)
                return -1;
        char req[256];
        snprintf(req, sizeof(req),
                 "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
        cr_assert(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap);
        ssize_t r = 0;
        while ((r = read(fd, buf + n, cap - n - 1)) > 0) {
                n += (size_t)r;
                if (n + 1 == cap)
                        buf = realloc(buf, cap *= 2);
        }
        close(fd);
        buf[n] = '\0';
        if (timeout_s > 0 && r < 0 && n == 0) {
                free(buf);
                return -2; /* timed out (or reset) with nothing read */
        }
        int status = -1;
        sscanf(buf, "HTTP/1.%*d %d", &status);
        char *b = strstr(buf, "\r\n\r\n");
        if (body)
                *body = strdup(b ? b + 4 : "");
        free(buf);
        return status;
}

int
kt_wait_http(int port, const char *path, int want, const char *has,
             int timeout_s, char **body)
{
        int st = -1;
        char *b = NULL;
        for (int i = 0; i < timeout_s * 10; i++) {
                free(b);
                b = NULL;
                st = kt_http_get(port, path, 0, &b);
                if (st == want && (!has || strstr(b, has)))
                        break;
                usleep(100000);
        }
        if (body)
                *body = b;
        else
                free(b);
        return st;
}
