/*
 * metrics_test.c -- `[metrics] listen` of `kinbox run` over HTTP on both
 * backends: /metrics validated by `promtool check metrics` (Debian's
 * prometheus package; the test fails without it), /healthz, /readyz.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/time.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int
http_get_within(int port, const char *path, int timeout_s, char **body)
{
        return kt_http_get(port, path, timeout_s, body);
}

static int
http_get(int port, const char *path, char **body)
{
        return kt_http_get(port, path, 0, body);
}

/* The port printed by `kinbox run` ("(port N)"). */
static int
wait_port(const char *log)
{
        for (int i = 0; i < 100; i++) {
                char *s = kt_slurp(log);
                const char *p = s ? strstr(s, "(port ") : NULL;
                int port = 0;
                if (p)
                        port = atoi(p + 6);
                free(s);
                if (port > 0)
                        return port;
                usleep(100000);
        }
        cr_fail("kinbox run never printed its metrics port");
        return 0;
}

/* A port free right now on loopback. */
/* Poll path until it answers want (up to 20 s); returns the last status,
 * and its body in *body when body is not NULL (caller frees). */
static int
wait_status(int port, const char *path, int want, char **body)
{
        return kt_wait_http(port, path, want, NULL, 20, body);
}

static double
metric(const char *text, const char *series)
{
        size_t n = strlen(series);
        for (const char *p = text; (p = strstr(p, series)); p += n)
                if ((p == text || p[-1] == '\n') && p[n] == ' ')
                        return strtod(p + n + 1, NULL);
        return -1;
}

KT_BACKENDS_PARAMS(metrics, endpoints)
ParameterizedTest(int *backend, metrics, endpoints, .timeout = 180)
{
        cr_assert(access("/usr/bin/promtool", X_OK) == 0 ||
                      system("command -v promtool >/dev/null") == 0,
                  "promtool is missing: install Debian's prometheus package "
                  "(scripts/setup)");
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("met");
        char *group = kt_unique("metg");
        kt_topic(topic, 2);
        kt_produce_grants(topic, 0, 200, 10, "o", 0, NULL);
        kt_producer_t *p = kt_producer_new();
        kt_produce(p, topic, 0, "k", "garbage", "m-garbage");
        kt_producer_flush_destroy(p);
        /* Outbox: a row of a paused destination stays pending (gauge);
         * rows of another topic are published by the relay. */
        char *out_topic = kt_unique("metout");
        kt_topic(out_topic, 1);
        kt_exec(url, "INSERT INTO kinbox_outbox_paused (destination) "
                     "VALUES ('metrics.test')");
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('metrics.test', 'k1')");
        for (int i = 0; i < 3; i++) {
                char sql[256];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_outbox (destination, idem_key, "
                         "payload) VALUES ('%s', 'e%d', NULL)",
                         out_topic, i);
                kt_exec(url, sql);
        }
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "[relay]\nenabled = true\n"
                                 "[metrics]\nlisten = 127.0.0.1:%d\n",
                                 group, topic, kt_free_port());
        char *log = kt_tmp("metrics");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        char *body = NULL;
        cr_assert(eq(int, http_get(port, "/healthz", &body), 200));
        free(body);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 201, 90),
               201));
        /* Ready once the database, the broker and the assignment are. */
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200));
        cr_assert(eq(int, http_get(port, "/nope", &body), 404));
        free(body);

        /* Counters reach their final values after the last batch. */
        char processed[200], dups[200], dead[200];
        snprintf(processed, sizeof(processed),
                 "kinbox_consumer_messages_total{consumer=\"points\","
                 "result=\"processed\"}");
        snprintf(dups, sizeof(dups),
                 "kinbox_consumer_messages_total{consumer=\"points\","
                 "result=\"duplicate\"}");
        snprintf(dead, sizeof(dead),
                 "kinbox_consumer_messages_total{consumer=\"points\","
                 "result=\"dead\"}");
        for (int i = 0; i < 50; i++) {
                cr_assert(eq(int, http_get(port, "/metrics", &body), 200));
                if (metric(body, processed) + metric(body, dups) +
                        metric(body, dead) ==
                    221)
                        break;
                free(body);
                body = NULL;
                usleep(100000);
        }
        cr_assert(body != NULL, "counters never reached 221 messages");
        cr_assert(eq(dbl, metric(body, processed), 200), "%s", body);
        cr_assert(eq(dbl, metric(body, dups), 20), "%s", body);
        cr_assert(eq(dbl, metric(body, dead), 1), "%s", body);
        cr_assert(eq(dbl,
                     metric(body, "kinbox_outbox_pending{destination="
                                  "\"metrics.test\"}"),
                     1),
                  "%s", body);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent'",
                                  3, 30),
                     3));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "destination = 'metrics.test' AND status = "
                                  "'pending'"),
                     1),
                  "a paused destination was relayed");
        free(body);
        cr_assert(eq(int, http_get(port, "/metrics", &body), 200));
        cr_assert(eq(dbl,
                     metric(body, "kinbox_relay_published_total{relay="
                                  "\"kinbox\"}"),
                     3),
                  "%s", body);
        cr_assert(
            eq(dbl,
               metric(body, "kinbox_relay_commit_to_publish_seconds_count"
                            "{relay=\"kinbox\"}"),
               3),
            "%s", body);
        cr_assert(eq(dbl,
                     metric(body, "kinbox_dead_letters{consumer=\"points\"}"),
                     1),
                  "%s", body);
        cr_assert(eq(dbl,
                     metric(body, "kinbox_consumer_assigned_partitions{"
                                  "consumer=\"points\"}"),
                     2),
                  "%s", body);
        cr_assert(strstr(body, "kinbox_consumer_batch_size_bucket{consumer="
                               "\"points\",le=\"+Inf\"}") != NULL,
                  "%s", body);
        cr_assert(strstr(body, "kinbox_consumer_transaction_seconds_count{") !=
                  NULL);
        cr_assert(strstr(body, "kinbox_handler_seconds_sum{") != NULL);
        cr_assert(strstr(body, "kinbox_consumer_lag{consumer=\"points\","
                               "topic=\"") != NULL,
                  "%s", body);
        cr_assert(strstr(body, "# TYPE kinbox_relay_commit_to_publish_seconds "
                               "histogram") != NULL);
        cr_assert(strstr(body, "# TYPE kinbox_pruned_rows_total counter") !=
                  NULL);

        /* promtool validates the exposition. */
        char *file = kt_tmp("metrics_body");
        FILE *fp = fopen(file, "w");
        cr_assert(fp != NULL);
        fputs(body, fp);
        fclose(fp);
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > %s.out 2>&1",
                 file, file);
        int rc = system(cmd);
        char outf[300];
        snprintf(outf, sizeof(outf), "%s.out", file);
        char *pout = kt_slurp(outf);
        cr_assert(rc != -1 && WIFEXITED(rc) != 0 && WEXITSTATUS(rc) == 0,
                  "promtool check metrics failed:\n%s", pout ? pout : "");
        free(pout);
        free(body);

        /* kinbox status reads the dedup hits of the local process. */
        char cmd2[1024], *outf2 = kt_tmp("metrics_status");
        snprintf(cmd2, sizeof(cmd2), "\"%s\" status --json -c %s > %s",
                 kt_env("KINBOX_BIN"), ini, outf2);
        cr_assert(eq(int, system(cmd2), 0));
        char *st_out = kt_slurp(outf2);
        cr_assert(st_out != NULL &&
                      strstr(st_out, "\"dedup_hits\": 20,") != NULL,
                  "%s", st_out ? st_out : "");
        free(st_out);

        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        /* Gone with the process. */
        cr_assert(eq(int, http_get(port, "/healthz", NULL), -1));
}

/* /readyz turns 503, naming the database, when the database goes away
 * (dropped, its sessions ended); /healthz, the liveness probe, stays 200. */
KT_BACKENDS_PARAMS(metrics, readyz_reports_database_loss)
ParameterizedTest(int *backend, metrics, readyz_reports_database_loss,
                  .timeout = 120)
{
        bool my = !strcmp(kt_backend(*backend), "mysql");
        char *url = kt_fresh_db(kt_backend(*backend));
        const char *dbname = strrchr(url, '/') + 1;
        char *topic = kt_unique("rdz");
        char *group = kt_unique("rdzg");
        kt_topic(topic, 2);
        kt_produce_grants(topic, 0, 20, 0, "o", 0, NULL);
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "[metrics]\nlisten = 127.0.0.1:%d\n",
                                 group, topic, kt_free_port());
        char *log = kt_tmp("readyz");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200));
        kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 20, 60);

        const char *admin = kt_env(my ? "KINBOX_MYSQL_URL" : "KINBOX_PG_URL");
        char sql[512];
        if (my) {
                snprintf(sql, sizeof(sql), "DROP DATABASE %s", dbname);
                kt_exec(admin, sql);
                /* Its sessions keep the dropped name as their database:
                 * end them, so the next check has to reconnect. */
                long long id;
                while ((id = kt_qintf(admin,
                                      "SELECT COALESCE(MIN(id), 0) FROM "
                                      "information_schema.PROCESSLIST WHERE "
                                      "db = '%s'",
                                      dbname)) > 0) {
                        /* 1094: it ended between the look-up and the
                         * KILL. */
                        snprintf(sql, sizeof(sql), "KILL %lld", id);
                        int e = kt_exec_err(admin, sql);
                        cr_assert(e == 0 || e == 1094, "%s: MySQL %d", sql, e);
                }
        } else {
                snprintf(sql, sizeof(sql), "DROP DATABASE %s WITH (FORCE)",
                         dbname);
                kt_exec(admin, sql);
        }
        char *body = NULL;
        cr_assert(eq(int, wait_status(port, "/readyz", 503, &body), 503));
        cr_assert(body && strstr(body, "not ready: database") != NULL, "%s",
                  body ? body : "");
        free(body);
        cr_assert(eq(int, http_get(port, "/healthz", NULL), 200));
        kill(pid, SIGKILL);
        kt_wait(pid, 30);
}

/* A partition held by an error no retry can fix (the handler's table is
 * missing) makes /readyz 503, naming it, with the held gauge and the
 * counter by cause in /metrics; once the table is back the partition
 * resumes by itself, every grant applied once, nothing dead-lettered. */
KT_BACKENDS_PARAMS(metrics, readyz_reports_held_partition)
ParameterizedTest(int *backend, metrics, readyz_reports_held_partition,
                  .timeout = 180)
{
        bool my = !strcmp(kt_backend(*backend), "mysql");
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "ALTER TABLE user_account RENAME TO user_account_away");
        char *topic = kt_unique("rdh");
        kt_topic(topic, 1);
        long long total = kt_produce_grants(topic, 0, 30, 0, "o", 0, NULL);
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "retry.max = 2\n"
                                 "retry.backoff.max.ms = 300\n"
                                 "[metrics]\nlisten = 127.0.0.1:%d\n",
                                 kt_unique("rdhg"), topic, kt_free_port());
        char *log = kt_tmp("readyz_held");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        char *body = NULL;
        cr_assert(eq(int, wait_status(port, "/readyz", 503, &body), 503));
        for (int i = 0; i < 100 && !strstr(body, "held"); i++) {
                free(body);
                body = NULL;
                usleep(100000);
                http_get(port, "/readyz", &body);
        }
        cr_assert(strstr(body, "not ready: consumer points: 1 partition(s) "
                               "held by an error no retry can fix") != NULL,
                  "%s", body);
        free(body);
        body = NULL;
        cr_assert(eq(int, http_get(port, "/metrics", &body), 200));
        cr_assert(eq(dbl,
                     metric(body, "kinbox_consumer_held_partitions{consumer="
                                  "\"points\"}"),
                     1.0));
        char series[200];
        snprintf(series, sizeof(series),
                 "kinbox_consumer_held_errors_total{consumer=\"points\","
                 "cause=\"%s\"}",
                 my ? "1146" : "42P01");
        cr_assert(metric(body, series) >= 1.0, "%s", body);
        free(body);
        char *text = kt_slurp(log);
        cr_assert(text && strstr(text, "partition held") &&
                      strstr(text, topic),
                  "%s", text ? text : "");
        free(text);
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 0));
        kt_exec(url, "ALTER TABLE user_account_away RENAME TO user_account");
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200));
        kt_wait_qint(
            url, "SELECT COALESCE(SUM(next_offset), 0) FROM kinbox_offsets",
            30, 60);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        kt_assert_points(url, total, 30);
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 0));
}

/* An INI of `kinbox run` with a points consumer (or none: topic NULL), the
 * relay, [metrics] and extra [kafka] lines. */
static char *
run_ini(const char *url, const char *topic, const char *kafka_extra,
        const char *log_level, int port)
{
        char *path = kt_tmp("metrics_ini");
        FILE *fp = fopen(path, "w");
        cr_assert(fp != NULL);
        fprintf(fp,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "session.timeout.ms = 6000\n%s"
                "[log]\nlevel = %s\n[relay]\nenabled = true\n"
                "[metrics]\nlisten = 127.0.0.1:%d\n",
                url, kt_env("KINBOX_BOOTSTRAP"), kafka_extra, log_level, port);
        if (topic)
                fprintf(fp,
                        "[consumer.points]\ngroup.id = %s\ntopics = %s\n"
                        "handler = points\n",
                        kt_unique("mlg"), topic);
        fclose(fp);
        return path;
}

/* Every line of text is a kinbox log line (src/util.c, text format) or a
 * message of the kinbox command itself ("kinbox CMD: ..."); returns the
 * first other line (static) or NULL. */
static const char *
foreign_line(const char *text)
{
        regex_t re;
        cr_assert(eq(int,
                     regcomp(&re,
                             "^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:"
                             "[0-9]{2}\\.[0-9]{3}Z (critical|error|warning|"
                             "notice|info|debug) [^ ]+: |kinbox [a-z]+: )",
                             REG_EXTENDED | REG_NOSUB),
                     0));
        static char line[512];
        const char *bad = NULL;
        for (const char *p = text; p && *p && !bad;) {
                const char *nl = strchr(p, '\n');
                size_t n = nl ? (size_t)(nl - p) : strlen(p);
                snprintf(line, sizeof(line), "%.*s", (int)n, p);
                if (n && regexec(&re, line, 0, NULL, 0))
                        bad = line;
                p = nl ? nl + 1 : NULL;
        }
        regfree(&re);
        return bad;
}

/* With librdkafka's debug contexts on and log.level = debug, every
 * librdkafka handle kinbox creates (consumer, relay producer and its admin
 * client, the retention check, the readiness client, `kinbox status`'s
 * group client) and libmicrohttpd log through kinbox's logger: nothing
 * else reaches stderr. */
KT_BACKENDS_PARAMS(metrics, stderr_only_log_lines)
ParameterizedTest(int *backend, metrics, stderr_only_log_lines, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("mlog");
        kt_topic(topic, 2);
        kt_produce_grants(topic, 0, 20, 0, "o", 0, NULL);
        /* A row for the relay: publishing it runs its durability check on
         * the admin client. */
        char *out_topic = kt_unique("mlogout");
        kt_topic(out_topic, 1);
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key, payload) "
                 "VALUES ('%s', 'e1', NULL)",
                 out_topic);
        kt_exec(url, sql);
        char *ini =
            run_ini(url, topic, "debug = all\n", "debug", kt_free_port());
        char *log = kt_tmp("metrics_stderr");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200),
                  "never ready");
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 20, 60),
               20));
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COUNT(*) FROM kinbox_outbox "
                                  "WHERE status = 'sent'",
                                  1, 60),
                     1));
        sleep(2); /* the relay's background durability check */
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        char *out = kt_slurp(log);
        cr_assert(out != NULL);
        cr_assert(strstr(out, " debug rdkafka: ") != NULL,
                  "no librdkafka debug line in kinbox's log");
        /* libmicrohttpd's logger option went first: no warning that
         * messages may have gone to its standard logger. */
        cr_assert(strstr(out, "is not the first option") == NULL,
                  "libmicrohttpd: logger option not first");
        const char *bad = foreign_line(out);
        cr_assert(bad == NULL, "kinbox run: a line not in kinbox's format: %s",
                  bad ? bad : "");
        free(out);
        char *err = NULL;
        cr_assert(
            eq(int, kt_kinbox(NULL, &err, false, "status -c %s", ini), 0));
        bad = foreign_line(err);
        cr_assert(bad == NULL,
                  "kinbox status: a line not in kinbox's format: %s",
                  bad ? bad : "");
        free(err);
}

/* /readyz asks the broker with the consumers' [kafka] settings: TLS
 * against the plaintext dev broker cannot connect, so not ready (a
 * plaintext probe said ready); with the right settings, ready. */
KT_BACKENDS_PARAMS(metrics, readyz_uses_kafka_settings)
ParameterizedTest(int *backend, metrics, readyz_uses_kafka_settings,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        /* No consumer: the broker check alone decides. */
        char *ini = run_ini(url, NULL, "security.protocol = ssl\n", "info",
                            kt_free_port());
        char *log = kt_tmp("readyz_tls");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        char *body = NULL;
        cr_assert(eq(int, http_get(port, "/healthz", NULL), 200));
        /* Never ready: not once in several checks. */
        for (int i = 0; i < 5; i++) {
                free(body);
                body = NULL;
                cr_assert(eq(int, http_get(port, "/readyz", &body), 503),
                          "ready over TLS to a plaintext broker: %s",
                          body ? body : "");
        }
        cr_assert(body && strstr(body, "not ready: broker") != NULL, "%s",
                  body ? body : "");
        free(body);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));

        ini = run_ini(url, NULL, "client.id = kinbox-readyz\n", "info",
                      kt_free_port());
        log = kt_tmp("readyz_plain");
        pid = kt_spawn_kinbox(ini, NULL, log);
        port = wait_port(log);
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200));
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
}

/* ---- health that outages cannot starve (issue 29, items 4 and 5) ---- */

/* A TCP proxy in front of the database that can freeze: frozen, it keeps
 * every connection open and forwards nothing (a hung server, as SIGSTOP
 * makes one) without touching the server the other tests use. */
struct freezer {
        int lfd, port, target_port;
        atomic_int frozen, stop;
        pthread_t th;
};

struct pipe_pair {
        struct freezer *f;
        int a, b;
};

static void *
pump(void *arg)
{
        struct pipe_pair *p = arg;
        char buf[16384];
        struct pollfd pf[2] = {{p->a, POLLIN, 0}, {p->b, POLLIN, 0}};
        while (!atomic_load(&p->f->stop)) {
                if (atomic_load(&p->f->frozen)) {
                        usleep(20000);
                        continue;
                }
                if (poll(pf, 2, 100) <= 0)
                        continue;
                if (atomic_load(&p->f->frozen))
                        continue;
                for (int i = 0; i < 2; i++) {
                        if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                                continue;
                        ssize_t n = read(pf[i].fd, buf, sizeof(buf));
                        if (n <= 0 || write(pf[1 - i].fd, buf, (size_t)n) != n)
                                goto done;
                }
        }
done:
        close(p->a);
        close(p->b);
        free(p);
        return NULL;
}

static void *
freezer_main(void *arg)
{
        struct freezer *f = arg;
        while (!atomic_load(&f->stop)) {
                struct pollfd pf = {f->lfd, POLLIN, 0};
                if (poll(&pf, 1, 100) <= 0)
                        continue;
                int c = accept(f->lfd, NULL, NULL);
                if (c < 0)
                        continue;
                int s = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in a = {.sin_family = AF_INET,
                                        .sin_port =
                                            htons((uint16_t)f->target_port)};
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a))) {
                        close(c);
                        if (s >= 0)
                                close(s);
                        continue;
                }
                struct pipe_pair *p = malloc(sizeof(*p));
                *p = (struct pipe_pair){f, c, s};
                pthread_t t;
                pthread_create(&t, NULL, pump, p);
                pthread_detach(t);
        }
        return NULL;
}

/* url with its port replaced by a freezer's in front of it. */
static char *
freezer_url(struct freezer *f, const char *url)
{
        const char *at = strrchr(url, '@');
        const char *colon = strchr(at, ':');
        const char *slash = strchr(colon, '/');
        f->target_port = atoi(colon + 1);
        f->lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t l = sizeof(a);
        cr_assert(f->lfd >= 0 &&
                  bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                  listen(f->lfd, 64) == 0 &&
                  getsockname(f->lfd, (struct sockaddr *)&a, &l) == 0);
        f->port = ntohs(a.sin_port);
        cr_assert(pthread_create(&f->th, NULL, freezer_main, f) == 0);
        char *out = malloc(strlen(url) + 16);
        sprintf(out, "%.*s:%d%s", (int)(colon - url), url, f->port, slash);
        return out;
}

static void
freezer_stop(struct freezer *f)
{
        atomic_store(&f->stop, 1);
        pthread_join(f->th, NULL);
        close(f->lfd);
}

struct slow_readyz {
        int port, status;
        pthread_t th;
};

static void *
slow_readyz_main(void *arg)
{
        struct slow_readyz *s = arg;
        s->status = http_get_within(s->port, "/readyz", 30, NULL);
        return NULL;
}

/* While the database hangs (no answer at all, connections open): /healthz
 * answers at once, also while ten /readyz wait; each /readyz answers 503
 * within its deadline, naming it; /metrics answers. Then the database
 * comes back, and so does readiness. */
KT_BACKENDS_PARAMS(metrics, health_during_database_hang)
ParameterizedTest(int *backend, metrics, health_during_database_hang,
                  .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        struct freezer f = {0};
        char *furl = freezer_url(&f, url);
        char *ini = run_ini(furl, NULL, "", "info", kt_free_port());
        char *log = kt_tmp("health_hang");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200),
                  "never ready through the proxy:\n%s", kt_slurp(log));
        atomic_store(&f.frozen, 1);
        /* Past the last answer's freshness (1 s, served again). */
        usleep(1200000);
        struct slow_readyz r[10];
        for (int i = 0; i < 10; i++) {
                r[i].port = port;
                cr_assert(pthread_create(&r[i].th, NULL, slow_readyz_main,
                                         &r[i]) == 0);
        }
        /* Liveness: 20 probes, each answered within 2 s (it waited 20 s
         * behind the readiness checks on one thread before). */
        for (int i = 0; i < 20; i++) {
                cr_assert(
                    eq(int, http_get_within(port, "/healthz", 2, NULL), 200),
                    "/healthz %d did not answer while the database "
                    "hung",
                    i);
                usleep(100000);
        }
        for (int i = 0; i < 10; i++) {
                pthread_join(r[i].th, NULL);
                cr_assert(eq(int, r[i].status, 503),
                          "/readyz %d while the database hung: %d", i,
                          r[i].status);
        }
        char *body = NULL;
        cr_assert(eq(int, http_get_within(port, "/readyz", 10, &body), 503));
        cr_assert(body && strstr(body, "did not answer within 3 s"), "%s",
                  body ? body : "");
        free(body);
        body = NULL;
        cr_assert(eq(int, http_get_within(port, "/metrics", 15, &body), 200),
                  "/metrics did not answer while the database hung");
        cr_assert(body && strstr(body, "kinbox_") != NULL);
        free(body);
        /* Back: ready again, without a restart. */
        atomic_store(&f.frozen, 0);
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200),
                  "not ready again after the database came back");
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        freezer_stop(&f);
        free(furl);
}

/* One connection that sends its request head a byte every 300 ms: 0 when
 * the server closed it (before timeout_s), 1 when it was still open. */
static int
trickle_until_closed(int port, int timeout_s)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        cr_assert(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
        signal(SIGPIPE, SIG_IGN);
        const char *head = "GET /healthz HTTP/1.1\r\nX-Slow: ";
        if (write(fd, head, strlen(head)) < 0) {
                close(fd);
                return 0;
        }
        for (int i = 0; i < timeout_s * 10 / 3; i++) {
                usleep(300000);
                char c = 'a';
                struct pollfd pf = {fd, POLLIN, 0};
                if (poll(&pf, 1, 0) > 0 || write(fd, &c, 1) < 0) {
                        close(fd);
                        return 0;
                }
        }
        close(fd);
        return 1;
}

/* The broker unreachable: ten concurrent /readyz share one check, and
 * /healthz answers meanwhile. 300 connections from this address trickle
 * their request heads: every /healthz probe from the same address still
 * gets its answer, and a connection that trickles for longer than the
 * request deadline (10 s) is closed by the server. */
Test(metrics, health_during_broker_outage_and_slowloris, .timeout = 180)
{
        char *url = kt_fresh_db("postgresql");
        char *path = kt_tmp("health_slow_ini");
        FILE *fp = fopen(path, "w");
        cr_assert(fp != NULL);
        /* Nothing listens on the broker's port. */
        fprintf(fp,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = "
                "127.0.0.1:%d\n[log]\nlevel = info\n[relay]\nenabled = "
                "true\n[metrics]\nlisten = 127.0.0.1:%d\n",
                url, kt_free_port(), kt_free_port());
        fclose(fp);
        char *log = kt_tmp("health_slow");
        pid_t pid = kt_spawn_kinbox(path, NULL, log);
        int port = wait_port(log);
        struct slow_readyz r[10];
        for (int i = 0; i < 10; i++) {
                r[i].port = port;
                cr_assert(pthread_create(&r[i].th, NULL, slow_readyz_main,
                                         &r[i]) == 0);
        }
        for (int i = 0; i < 10; i++)
                cr_assert(
                    eq(int, http_get_within(port, "/healthz", 2, NULL), 200),
                    "/healthz %d did not answer while /readyz waited "
                    "on the broker",
                    i);
        for (int i = 0; i < 10; i++) {
                pthread_join(r[i].th, NULL);
                cr_assert(eq(int, r[i].status, 503));
        }

        /* Slowloris from 127.0.0.1, the probes' own address. */
        signal(SIGPIPE, SIG_IGN);
        int held[300];
        int nheld = 0;
        for (int i = 0; i < 300; i++) {
                int fd = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in a = {.sin_family = AF_INET,
                                        .sin_port = htons((uint16_t)port)};
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                if (fd < 0)
                        break;
                if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
                        close(fd);
                        continue;
                }
                if (write(fd, "GET /healthz HTTP/1.1\r\n", 23) < 0) {
                }
                held[nheld++] = fd;
        }
        cr_assert(nheld > 64, "only %d connections opened", nheld);
        for (int i = 0; i < 20; i++) {
                /* The attackers keep trickling. */
                for (int k = 0; k < nheld; k++)
                        if (write(held[k], "x", 1) < 0) {
                        }
                cr_assert(
                    eq(int, http_get_within(port, "/healthz", 2, NULL), 200),
                    "/healthz probe %d refused while 300 slow "
                    "connections of its address were open",
                    i);
                usleep(100000);
        }
        for (int k = 0; k < nheld; k++)
                close(held[k]);
        /* The request deadline: closed by the server long before 20 s. */
        cr_assert(eq(int, trickle_until_closed(port, 20), 0),
                  "a trickling connection outlived the request deadline");
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
}

/* Before its first message a running consumer has counted no duplicate:
 * kinbox status shows 0 (not n/a, which means no process to ask). */
KT_BACKENDS_PARAMS(metrics, status_zero_before_first_message)
ParameterizedTest(int *backend, metrics, status_zero_before_first_message,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("met0");
        kt_topic(topic, 1);
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "[metrics]\nlisten = 127.0.0.1:%d\n",
                                 kt_unique("met0g"), topic, kt_free_port());
        char *log = kt_tmp("metrics0");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        cr_assert(eq(int, wait_status(port, "/readyz", 200, NULL), 200));
        char *out = NULL, *err = NULL;
        cr_assert(eq(int,
                     kt_kinbox(&out, &err, false, "status --json -c %s", ini),
                     0),
                  "%s", err);
        cr_assert(strstr(out, "\"dedup_hits\": 0,") != NULL, "%s", out);
        cr_assert(strstr(out, "\"business_duplicates\": 0,") != NULL, "%s",
                  out);
        free(out);
        free(err);
        cr_assert(
            eq(int, kt_kinbox(&out, &err, false, "status -c %s", ini), 0),
            "%s", err);
        const char *line = strstr(out, "\npoints ");
        cr_assert(line != NULL, "%s", out);
        const char *eol = strchr(line + 1, '\n');
        const char *na = strstr(line, "n/a");
        bool no_na = !na || (eol && na > eol);
        cr_assert(no_na, "%s", out);
        free(out);
        free(err);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
}

/* `[metrics] listen = HOST:0`: the start line prints the bound port in its
 * URL, and `kinbox status` finds that port (the dedup counters are not
 * n/a); after the process stopped they are n/a again. */
KT_BACKENDS_PARAMS(metrics, status_finds_port_zero)
ParameterizedTest(int *backend, metrics, status_finds_port_zero,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("mport0");
        char *group = kt_unique("mport0g");
        kt_topic(topic, 1);
        kt_producer_t *pr = kt_producer_new();
        const char *grant = "{\"order_id\":\"o-1\",\"user_id\":1,"
                            "\"grant_points\":5}";
        kt_produce(pr, topic, 0, "1", grant, "p0-1");
        kt_produce(pr, topic, 0, "1", grant, "p0-1"); /* a re-send */
        kt_producer_flush_destroy(pr);
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "[metrics]\nlisten = 127.0.0.1:0\n",
                                 group, topic);
        char *log = kt_tmp("mport0");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        int port = wait_port(log);
        char *s = kt_slurp(log);
        char want[64];
        snprintf(want, sizeof(want), "http://127.0.0.1:%d ", port);
        cr_assert(s && strstr(s, want), "start line without the port:\n%s", s);
        free(s);
        kt_wait_qint(url, "SELECT SUM(next_offset) FROM kinbox_offsets", 2,
                     60);
        char *out = NULL, *err = NULL;
        long long hits = -1;
        for (int i = 0; i < 50 && hits != 1; i++) {
                free(out);
                out = NULL;
                cr_assert(eq(int,
                             kt_kinbox(&out, &err, false,
                                       "status --json -c %s", ini),
                             0),
                          "%s", err);
                free(err);
                err = NULL;
                const char *p = strstr(out, "\"dedup_hits\":");
                hits = p ? strtoll(p + 13, NULL, 10) : -1;
                if (p && !strncmp(p + 13, " null", 5))
                        hits = -1;
                usleep(100000);
        }
        cr_assert(eq(i64, hits, 1), "status did not read the counters:\n%s",
                  out);
        free(out);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        cr_assert(
            eq(int, kt_kinbox(&out, NULL, false, "status -c %s", ini), 0));
        cr_assert(strstr(out, "n/a") != NULL, "%s", out);
        free(out);
}

/* The row kinbox_consumer_counters keeps for one `kinbox run`: its
 * updated_at (µs; on PostgreSQL plus its xmin, the transaction that last
 * wrote it, so a rewrite of the same instant shows too). */
static long long
counters_version(const char *url, bool pg)
{
        long long v = kt_qint(
            url, pg ? "SELECT (extract(epoch FROM updated_at) * 1000000)"
                      "::bigint * 1000 + (xmin::text::bigint % 1000)"
                      " FROM kinbox_consumer_counters"
                    : "SELECT CAST(UNIX_TIMESTAMP(updated_at) * 1000000 AS"
                      " SIGNED) FROM kinbox_consumer_counters");
        return v;
}

/* `kinbox run` writes its counters row when a counter changed, not every
 * second: after traffic the row holds the duplicates counted; idle, the
 * row is not rewritten (updated_at, and on PostgreSQL xmin, stay the same
 * over 4 s); the next duplicate is recorded (within a second or so), and
 * status reads it. */
KT_BACKENDS_PARAMS(metrics, counters_written_on_change)
ParameterizedTest(int *backend, metrics, counters_written_on_change,
                  .timeout = 120)
{
        bool pg = *backend == 0;
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("mcnt");
        char *group = kt_unique("mcntg");
        kt_topic(topic, 1);
        kt_producer_t *pr = kt_producer_new();
        const char *grant = "{\"order_id\":\"o-1\",\"user_id\":1,"
                            "\"grant_points\":5}";
        kt_produce(pr, topic, 0, "1", grant, "c-1");
        kt_produce(pr, topic, 0, "1", grant, "c-1"); /* a re-send */
        kt_producer_flush_destroy(pr);
        char *ini = kt_write_ini(url,
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n",
                                 group, topic);
        char *log = kt_tmp("mcnt");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        kt_wait_qint(url, "SELECT SUM(next_offset) FROM kinbox_offsets", 2,
                     60);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT COALESCE(SUM(duplicates), -1) FROM "
                                  "kinbox_consumer_counters",
                                  1, 10),
                     1),
                  "the row does not hold the duplicate");
        sleep(2); /* past the write of the change */
        long long v0 = counters_version(url, pg);
        sleep(4);
        long long v1 = counters_version(url, pg);
        cr_assert(eq(i64, v1, v0), "an idle consumer rewrote its counters");
        pr = kt_producer_new();
        kt_produce(pr, topic, 0, "1", grant, "c-1"); /* another re-send */
        kt_producer_flush_destroy(pr);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT SUM(duplicates) FROM "
                                  "kinbox_consumer_counters",
                                  2, 30),
                     2),
                  "the change was not recorded");
        cr_assert(counters_version(url, pg) != v0);
        char *out = NULL;
        cr_assert(eq(
            int, kt_kinbox(&out, NULL, false, "status --json -c %s", ini), 0));
        cr_assert(strstr(out, "\"dedup_hits\": 2,") != NULL, "%s", out);
        free(out);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 60), 0), "%s", kt_tail(log, 20));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_consumer_counters"),
                     0),
                  "the clean stop left its row");
}
