/*
 * hardening_test.c -- the holes a hostile test found (issue 15), each on
 * both backends where a backend is involved: prune's retention refusal, no
 * password in any output, configuration mistakes that must be errors,
 * dead-letter display of odd headers.
 */
#include "harness.h"
#include "http.h" /* internal: the endpoint of kinbox run */

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wformat-nonliteral"

static bool
has(const char *hay, const char *needle)
{
        return hay && strstr(hay, needle) != NULL;
}

/* Run `kinbox ARGS` (a format); stdout and stderr together into *out. */
static int
kb(char **out, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int rc = kt_kinboxv(out, NULL, true, fmt, ap);
        va_end(ap);
        return rc;
}

/* ---- (1) kinbox prune refuses like kinbox run ---- */

KT_BACKENDS_PARAMS(hardening, prune_refuses_short_retention)
ParameterizedTest(int *backend, hardening, prune_refuses_short_retention,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
                     "kafka_partition, kafka_offset) VALUES ('c', 'a', 't', "
                     "0, 1)");
        kt_exec(url, *backend ? "UPDATE kinbox_inbox SET processed_at = "
                                "CURRENT_TIMESTAMP(6) - INTERVAL 2 HOUR"
                              : "UPDATE kinbox_inbox SET processed_at = "
                                "now() - interval '2 hours'");
        /* The shared retention (what the pruner deletes by) */
        char *ini = kt_write_ini(url, "[prune]\ninbox.retention = 1m\n");
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "prune -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "inbox.retention (1m = 60000 ms)"), "%s", out);
        cr_assert(has(out, "7d = 604800000 ms"), "%s", out);
        free(out);
        cr_assert(eq(int, kb(&out, "prune --dry-run -c %s", ini), 2), "%s",
                  out);
        free(out);
        /* A consumer's window (its own kafka.redelivery.window) */
        char *topic = kt_unique("prn");
        ini = kt_write_ini(url,
                           "[prune]\ninbox.retention = 1h\n"
                           "kafka.redelivery.window = 30m\n"
                           "[consumer.points]\ntopics = %s\nhandler = points\n"
                           "kafka.redelivery.window = 2h\n",
                           topic);
        cr_assert(eq(int, kb(&out, "prune -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "consumer.points") &&
                      has(out, "inbox.retention (1h = 3600000 ms)") &&
                      has(out, "2h = 7200000 ms"),
                  "%s", out);
        free(out);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT count(*) FROM kinbox_inbox"), 1));
        /* Longer than the window: the row goes. */
        ini = kt_write_ini(url, "[prune]\ninbox.retention = 1h\n"
                                "kafka.redelivery.window = 30m\n");
        cr_assert(eq(int, kb(&out, "prune -c %s", ini), 0), "%s", out);
        free(out);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT count(*) FROM kinbox_inbox"), 0));
}

/* ---- (2) no password in any output ---- */

static const char *const all_cmds[] = {
    "run -c %s",
    "migrate -c %s",
    "status -c %s",
    "status --json -c %s",
    "dead list -c %s",
    "dead show 1 -c %s",
    "dead replay 1 -c %s",
    "dead discard 1 -c %s",
    "outbox list -c %s",
    "outbox requeue 1 -c %s",
    "outbox cancel 1 -c %s",
    "outbox pause d -c %s",
    "outbox resume d -c %s",
    "verify -c %s",
    "prune -c %s",
    "prune --dry-run --json -c %s",
};

#define NCMDS (sizeof(all_cmds) / sizeof(all_cmds[0]))

typedef struct secret_run {
        const char *secret;
        FILE *fps[NCMDS];
} secret_run_t;

/* Start all of all_cmds on url, as kb() runs one (stdout and stderr
 * together), without waiting: `run` and `prune` each wait 2 s for the dev
 * broker's missing DescribeConfigs answer before they look at the URL, so
 * one after the other the commands of the six URLs took 36 s. */
static void
secret_start(secret_run_t *x, const char *url, const char *secret)
{
        char *ini = kt_write_ini(url, "[consumer.c]\ntopics = t\nhandler = "
                                      "points\n[relay]\nenabled = true\n");
        x->secret = secret;
        for (size_t i = 0; i < NCMDS; i++) {
                char args[1024], cmd[2048];
                snprintf(args, sizeof(args), all_cmds[i], ini);
                snprintf(cmd, sizeof(cmd), "\"%s\" %s 2>&1 </dev/null",
                         kt_env("KINBOX_BIN"), args);
                x->fps[i] = popen(cmd, "r");
                cr_assert(x->fps[i] != NULL, "%s", cmd);
        }
}

/* Read each command's output and status: no secret anywhere. */
static void
no_secret_anywhere(secret_run_t *x)
{
        for (size_t i = 0; i < NCMDS; i++) {
                size_t cap = 1 << 16, n = 0;
                char *out = malloc(cap);
                cr_assert(out != NULL);
                for (size_t r;
                     (r = fread(out + n, 1, cap - n - 1, x->fps[i])) > 0;) {
                        n += r;
                        if (n + 1 == cap) {
                                out = realloc(out, cap *= 2);
                                cr_assert(out != NULL);
                        }
                }
                out[n] = '\0';
                int st = pclose(x->fps[i]);
                int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
                cr_assert(has(out, x->secret) == false,
                          "%s printed the secret (rc %d): %s", all_cmds[i], rc,
                          out);
                cr_assert(rc == 2 || rc == 3, "%s: rc %d: %s", all_cmds[i], rc,
                          out);
                free(out);
        }
}

Test(hardening, keyword_form_url_never_echoed, .timeout = 120)
{
        static const char *const urls[][2] = {
            {"host=127.0.0.1 port=1 user=postgres password=S3cretPW "
             "dbname=bench",
             "S3cretPW"},
            /* quoted keyword form and other shapes */
            {"dbname=x password='S3cret PW2'", "S3cret PW2"},
            {"pgsql://u:S3cretPW3@127.0.0.1:1/x", "S3cretPW3"},
            {"postgresql://u:S3cretPW4@127.0.0.1:notaport/x", "S3cretPW4"},
            {"mysql://u:S3cretPW5@127.0.0.1:1/x", "S3cretPW5"},
            {"S3cretPW6", "S3cretPW6"},
        };
        enum { NURLS = sizeof(urls) / sizeof(urls[0]) };
        static secret_run_t runs[NURLS];
        for (int u = 0; u < NURLS; u++)
                secret_start(&runs[u], urls[u][0], urls[u][1]);
        for (int u = 0; u < NURLS; u++)
                no_secret_anywhere(&runs[u]);
        char *out = NULL;
        char *ini = kt_write_ini("host=h password=S3cretPW dbname=b", "");
        cr_assert(eq(int, kb(&out, "status -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "libpq's \"key=value\" form is not supported"),
                  "%s", out);
        free(out);
        ini = kt_write_ini("pgsql://u:p@h/d", "");
        cr_assert(eq(int, kb(&out, "status -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "unsupported scheme \"pgsql://\""), "%s", out);
        free(out);
}

/* ---- (3) migrate checks handlers before applying anything ---- */

KT_BACKENDS_PARAMS(hardening, migrate_checks_handlers_first)
ParameterizedTest(int *backend, hardening, migrate_checks_handlers_first,
                  .timeout = 120)
{
        /* An empty database: kt_fresh_db migrates, so drop what it made by
         * taking a database of the other test's prefix... simpler: a new
         * schema-less database via the admin URL of the backend. */
        const char *base =
            kt_env(*backend ? "KINBOX_MYSQL_URL" : "KINBOX_PG_URL");
        char *name = kt_unique("mig");
        for (char *p = name; *p; p++)
                if (*p == '-')
                        *p = '_';
        char sql[256];
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
        kt_exec(base, sql);
        char url[512];
        snprintf(url, sizeof(url), "%.*s/%s", (int)(strrchr(base, '/') - base),
                 base, name);
        char *ini = kt_write_ini(url, "[consumer.c]\ntopics = t\n"
                                      "handler = nosuchhandler\n");
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "nosuchhandler"), "%s", out);
        free(out);
        snprintf(sql, sizeof(sql),
                 *backend ? "SELECT count(*) FROM information_schema.tables "
                            "WHERE table_schema = '%s'"
                          : "SELECT count(*) FROM information_schema.tables "
                            "WHERE table_schema = 'public' AND "
                            "table_catalog = '%s'",
                 name);
        cr_assert(eq(i64, kt_qint(url, sql), 0),
                  "migrate created tables before refusing");
        /* relay modules too */
        ini = kt_write_ini(url,
                           "[relay]\nenabled = true\nmodules = nosuchmod\n");
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 2), "%s", out);
        free(out);
        cr_assert(eq(i64, kt_qint(url, sql), 0));
        /* A good configuration migrates. */
        ini =
            kt_write_ini(url, "[consumer.c]\ntopics = t\nhandler = points\n");
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        free(out);
        cr_assert(kt_qint(url, sql) > 0);
}

/* ---- (3) outbox requeue/cancel of a destination nobody has: exit 4 ---- */

KT_BACKENDS_PARAMS(hardening, outbox_unknown_destination)
ParameterizedTest(int *backend, hardening, outbox_unknown_destination,
                  .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                     "status) VALUES ('d1', 'a', 'sent')");
        char *ini = kt_write_ini(url, "");
        char *out = NULL;
        cr_assert(
            eq(int, kb(&out, "outbox requeue --destination nosuch -c %s", ini),
               4),
            "%s", out);
        cr_assert(has(out, "no outbox row has destination \"nosuch\""), "%s",
                  out);
        free(out);
        cr_assert(eq(int,
                     kb(&out, "outbox cancel --destination nosuch -c %s", ini),
                     4),
                  "%s", out);
        free(out);
        /* A known destination with nothing to change is fine: 0 rows. */
        cr_assert(
            eq(int, kb(&out, "outbox requeue --destination d1 -c %s", ini), 0),
            "%s", out);
        cr_assert(has(out, "0 rows requeued"), "%s", out);
        free(out);
        cr_assert(
            eq(int, kb(&out, "outbox cancel --destination d1 -c %s", ini), 0),
            "%s", out);
        free(out);
}

/* ---- (5) the metrics listener: bounded, logs through kinbox ---- */

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

static pthread_mutex_t http_lock = PTHREAD_MUTEX_INITIALIZER;
static int http_lines, http_limit_lines;

static void
http_log(int level, const char *fac, const char *msg, void *opaque)
{
        (void)opaque;
        pthread_mutex_lock(&http_lock);
        if (level == KINBOX_LOG_DEBUG && !strcmp(fac, "http")) {
                http_lines++;
                if (has(msg, "limit"))
                        http_limit_lines++;
        }
        pthread_mutex_unlock(&http_lock);
}

static int
connect_local(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
                close(fd);
                return -1;
        }
        return fd;
}

/* One GET /healthz on a new connection: true on "200". */
static bool
healthz(int port)
{
        int fd = connect_local(port);
        if (fd < 0)
                return false;
        const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                           "Connection: close\r\n\r\n";
        char buf[256] = "";
        bool ok = false;
        if (write(fd, req, sizeof(req) - 1) == (ssize_t)(sizeof(req) - 1)) {
                ssize_t n = read(fd, buf, sizeof(buf) - 1);
                ok = n > 12 && !strncmp(buf, "HTTP/1.1 200", 12);
        }
        close(fd);
        return ok;
}

static int
open_fds(void)
{
        int n = 0;
        DIR *d = opendir("/proc/self/fd");
        cr_assert(d != NULL);
        while (readdir(d))
                n++;
        closedir(d);
        return n;
}

Test(hardening, http_held_connections, .timeout = 300)
{
        enum { HELD = 1200 };
        struct rlimit rl;
        cr_assert(eq(int, getrlimit(RLIMIT_NOFILE, &rl), 0));
        if (rl.rlim_cur < HELD + 600) {
                rl.rlim_cur =
                    rl.rlim_max < HELD + 600 ? rl.rlim_max : HELD + 600;
                cr_assert(eq(int, setrlimit(RLIMIT_NOFILE, &rl), 0));
        }
        cr_assert(rl.rlim_cur >= HELD + 300,
                  "descriptor limit %llu is too low for this test",
                  (unsigned long long)rl.rlim_cur);
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        cr_assert(eq(int,
                     kinbox_conf_set(c, "log.level", "debug", e, sizeof(e)),
                     KINBOX_OK));
        kinbox_conf_set_log_cb(c, http_log, NULL);
        kinbox__http_t *h = kinbox__http_start("127.0.0.1:0", c, NULL, NULL,
                                               NULL, e, sizeof(e));
        cr_assert(h != NULL, "%s", e);
        int port = kinbox__http_port(h);
        cr_assert(healthz(port));
        int base = open_fds();
        static int held[HELD];
        int nheld = 0;
        for (int i = 0; i < HELD; i++) {
                int fd = connect_local(port);
                if (fd < 0)
                        continue;
                /* a request that never ends */
                if (write(fd, "GET /healthz HTTP/1.1\r\n", 23) != 23) {
                        close(fd);
                        continue;
                }
                held[nheld++] = fd;
        }
        cr_assert(nheld >= HELD - 10, "only %d connections opened", nheld);
        /* The server holds at most its limit, whatever the clients do:
         * our own descriptors are base + nheld. */
        sleep(1);
        int server_side = open_fds() - base - nheld;
        cr_assert(server_side <= 256 + 8,
                  "server holds %d descriptors for %d connections",
                  server_side, nheld);
        /* /healthz answers while the connections are still held (they
         * are closed by the server over the limits or when idle). */
        bool ok = false;
        for (int i = 0; i < 120 && !ok; i++) {
                ok = healthz(port);
                if (!ok)
                        usleep(500000);
        }
        cr_assert(ok, "/healthz never answered with %d held connections",
                  nheld);
        for (int i = 0; i < nheld; i++)
                close(held[i]);
        kinbox__http_stop(h);
        /* MHD's messages came through the logger, rate-limited. */
        pthread_mutex_lock(&http_lock);
        int lines = http_lines, limit_lines = http_limit_lines;
        pthread_mutex_unlock(&http_lock);
        /* (Over-limit connections are now mostly shut by the server's
         * per-address eviction before libmicrohttpd's own limit applies,
         * so its messages are about those, not always "limit".) */
        (void)limit_lines;
        cr_assert(lines >= 1, "no libmicrohttpd message logged");
        cr_assert(lines <= 10 + 1, "%d lines: not rate-limited", lines);
        kinbox_conf_destroy(c);
}

/* ---- (6) SIGTERM ends kinbox run within the bound, whatever the broker
 * and the database do ---- */

#include <fcntl.h>

#define SHUTDOWN_BOUND_S 30 /* src/cli/watchdog.h, docs/operations.md */

/* A private dev broker (this test stops it); returns its pid and writes
 * its bootstrap list into bs. */
static pid_t
private_broker(char *bs, size_t bs_size)
{
        char *file = kt_tmp("bsfile");
        unlink(file);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
                int fd = open("/dev/null", O_RDWR);
                dup2(fd, 1);
                dup2(fd, 2);
                const char *bin = getenv("KINBOX_DEVBROKER_BIN");
                execl(bin, bin, "--brokers", "1", "--bootstrap-file", file,
                      (char *)NULL);
                _exit(127);
        }
        for (int i = 0; i < 200; i++) {
                char *s = kt_slurp(file);
                if (s && *s) {
                        s[strcspn(s, "\r\n")] = '\0';
                        const char *v =
                            strchr(s, '=') ? strchr(s, '=') + 1 : s;
                        snprintf(bs, bs_size, "%s", v);
                        free(s);
                        return pid;
                }
                free(s);
                usleep(50000);
        }
        kill(pid, SIGKILL);
        cr_fatal("private dev broker did not start");
        return -1;
}

KT_BACKENDS_PARAMS(hardening, shutdown_is_bounded)
ParameterizedTest(int *backend, hardening, shutdown_is_bounded, .timeout = 400)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        for (int round = 0; round < 3; round++) {
                char bs[512];
                pid_t broker = private_broker(bs, sizeof(bs));
                char *ini = kt_tmp("shutdown_ini");
                FILE *fp = fopen(ini, "w");
                cr_assert(fp != NULL);
                fprintf(fp,
                        "[database]\nurl = %s\n[kafka]\nbootstrap.servers = "
                        "%s\nsession.timeout.ms = 6000\n"
                        "[metrics]\nlisten = 127.0.0.1:0\n"
                        "[consumer.points]\ntopics = sd\nhandler = points\n"
                        "group.id = %s\n"
                        "[relay]\nenabled = true\n",
                        url, bs, kt_unique("sdg"));
                fclose(fp);
                char *log = kt_tmp("shutdown_log");
                pid_t pid = kt_spawn_kinbox(ini, NULL, log);
                /* running: joined (or joining) its group */
                sleep(4 + round);
                cr_assert(eq(int, waitpid(pid, NULL, WNOHANG), 0),
                          "kinbox run exited early:\n%s", kt_slurp(log));
                kill(pid, SIGTERM);
                kill(broker, SIGTERM);
                kt_services(*backend ? "mysql-stop kill"
                                     : "pg-stop immediate");
                int rc = kt_wait_exit(pid, SHUTDOWN_BOUND_S + 15);
                waitpid(broker, NULL, 0);
                kt_services(*backend ? "mysql-start" : "pg-start");
                char *out = kt_slurp(log);
                cr_assert(rc != -1000,
                          "round %d: still running %d s after SIGTERM:\n%s",
                          round, SHUTDOWN_BOUND_S + 15, out);
                cr_assert(rc >= 0, "round %d: died of signal %d:\n%s", round,
                          -rc, out);
                free(out);
        }
}

/* ---- (7) stored headers: migration 0005 and `dead show` ---- */

static void
insert_dead(const char *url, bool my, const char *msgid, const char *json)
{
        /* MySQL string literals take backslash escapes: double them. */
        char lit[1024];
        size_t k = 0;
        for (const char *p = json; *p && k + 2 < sizeof(lit); p++) {
                if (*p == '\\' && my)
                        lit[k++] = '\\';
                lit[k++] = *p;
        }
        lit[k] = '\0';
        char sql[2048];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_dead_letter (consumer, message_id, "
                 "topic, kafka_partition, kafka_offset, headers, error, "
                 "dead_at, first_failed_at) VALUES ('c', '%s', 't', 0, 1, "
                 "'%s', 'bad', %s, %s)",
                 msgid, lit, my ? "CURRENT_TIMESTAMP(6)" : "now()",
                 my ? "CURRENT_TIMESTAMP(6)" : "now()");
        kt_exec(url, sql);
}

static char *
dead_show(const char *ini, const char *url, const char *msgid)
{
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "SELECT id FROM kinbox_dead_letter WHERE message_id = '%s'",
                 msgid);
        char *out = NULL;
        cr_assert(eq(int,
                     kb(&out, "dead show %lld -c %s", kt_qint(url, sql), ini),
                     0),
                  "%s", out);
        return out;
}

KT_BACKENDS_PARAMS(hardening, dead_headers_stored_form)
ParameterizedTest(int *backend, hardening, dead_headers_stored_form,
                  .timeout = 120)
{
        bool my = *backend == 1;
        char *url = kt_fresh_db(kt_backend(*backend));
        /* the old dead-letter form, convertible */
        insert_dead(url, my, "h1",
                    "[{\"name\":\"a\",\"value\":\"x\\u0001\"},"
                    "{\"name\":\"n\",\"value\":null},"
                    "{\"value\":\"\",\"name\":\"e\"}]");
        /* the old form with a raw byte (\u00ff = the byte 0xff) */
        insert_dead(url, my, "h2",
                    "[{\"name\":\"b\",\"value\":\"x\\u00ffy\"}]");
        /* the stored form */
        insert_dead(url, my, "h3",
                    "[[\"c\",{\"b64\":\"/w==\"}],[\"c\",\"2\"]]");
        kt_exec(url, "DELETE FROM kinbox_schema_migrations WHERE component = "
                     "'kinbox' AND version = 5");
        char *ini = kt_write_ini(url, "");
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        free(out);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM "
                                  "kinbox_dead_letter WHERE message_id "
                                  "= 'h1' AND headers LIKE '[[%'"),
                     1),
                  "0005 did not convert the old form");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM "
                                  "kinbox_dead_letter WHERE message_id "
                                  "= 'h2' AND headers LIKE '[{%'"),
                     1));
        out = dead_show(ini, url, "h1");
        cr_assert(has(out, "a: x\\x01; n; e: "), "%s", out);
        free(out);
        out = dead_show(ini, url, "h2");
        cr_assert(has(out, "b: x\\xffy"), "%s", out);
        cr_assert(has(out, "u00ff") == false, "%s", out);
        free(out);
        out = dead_show(ini, url, "h3");
        cr_assert(has(out, "c: \\xff; c: 2"), "%s", out);
        free(out);
}

/* ---- a misspelt key: the error names the closest one ---- */

Test(hardening, misspelt_keys_did_you_mean, .timeout = 60)
{
        char *out = NULL;
        char *path = kt_tmp("didyoumean");
        FILE *fp = fopen(path, "w");
        cr_assert(fp != NULL);
        fprintf(fp, "[database]\nurl = postgresql://u@127.0.0.1:1/x\n"
                    "[kafka]\nbootstrap.server = 127.0.0.1:9092\n");
        fclose(fp);
        cr_assert(eq(int, kb(&out, "status -c %s", path), 2), "%s", out);
        cr_assert(has(out, "[kafka] bootstrap.server: not a librdkafka "
                           "property (did you mean \"bootstrap.servers\"?)"),
                  "%s", out);
        free(out);
        fp = fopen(path, "w");
        cr_assert(fp != NULL);
        fprintf(fp, "[database]\nurl = postgresql://u@127.0.0.1:1/x\n"
                    "[kafka]\nbootstrap.servers = 127.0.0.1:9092\n"
                    "[consumer.c]\ntopic = t\nhandler = points\n");
        fclose(fp);
        cr_assert(eq(int, kb(&out, "run -c %s", path), 2), "%s", out);
        cr_assert(has(out, "unknown configuration key \"topic\" (did you "
                           "mean \"topics\"?)"),
                  "%s", out);
        free(out);
}

/* ---- a database that refuses: exit 3 from every command ---- */

KT_BACKENDS_PARAMS(hardening, database_refusal_exit_3)
ParameterizedTest(int *backend, hardening, database_refusal_exit_3,
                  .timeout = 180)
{
        static const char *const cmds[] = {
            "run -c %s",       "migrate -c %s",     "status -c %s",
            "dead list -c %s", "outbox list -c %s", "verify -c %s",
            "prune -c %s",     "dead show 1 -c %s",
        };
        const char *good =
            kt_env(*backend ? "KINBOX_MYSQL_URL" : "KINBOX_PG_URL");
        /* scheme://user[:pw]@host:port/db -> a refused variant */
        const char *at = strchr(good, '@'), *slash = strrchr(good, '/');
        cr_assert(at != NULL && slash != NULL && slash > at);
        char bad[2][512];
        /* no such database (both backends) */
        snprintf(bad[0], sizeof(bad[0]), "%.*s/kt_no_such_db",
                 (int)(slash - good), good);
        /* MariaDB: a wrong password (1045); PostgreSQL: no such role */
        const char *scheme_end = strstr(good, "://") + 3;
        if (*backend)
                snprintf(bad[1], sizeof(bad[1]), "%.*skinbox:wrong-pw%s",
                         (int)(scheme_end - good), good, at);
        else
                snprintf(bad[1], sizeof(bad[1]), "%.*skt_no_such_role%s",
                         (int)(scheme_end - good), good, at);
        for (int b = 0; b < 2; b++) {
                char *ini = kt_write_ini(bad[b], "[consumer.c]\ntopics = t\n"
                                                 "handler = points\n");
                for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
                        char *out = NULL;
                        int rc = kb(&out, cmds[i], ini);
                        cr_assert(eq(int, rc, 3), "%s on %s: rc %d: %s",
                                  cmds[i], bad[b], rc, out);
                        cr_assert(has(out, "database unreachable"), "%s: %s",
                                  cmds[i], out);
                        /* one line, no tab, no trailing space */
                        size_t n = strlen(out);
                        cr_assert(strchr(out, '\t') == NULL, "%s: %s", cmds[i],
                                  out);
                        cr_assert(n > 1 && out[n - 1] == '\n' &&
                                      out[n - 2] != ' ',
                                  "%s: [%s]", cmds[i], out);
                        free(out);
                }
        }
}
