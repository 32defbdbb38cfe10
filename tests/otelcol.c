/*
 * otelcol.c -- kinbox-otelcol for the tracing tests: start, stop, read
 * the spans it received (see otelcol.h).
 */
#include "otelcol.h"

#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KT_OTELCOL_VERSION
#error                                                                        \
    "KT_OTELCOL_VERSION (tools/otelcol/go.mod) comes from tests/CMakeLists.txt"
#endif

/* Collectors of this test process, killed at exit (a failed assertion
 * ends the test before its kt_otelcol_stop()). */
static pid_t collectors[16];
static size_t ncollectors;

static void
reap_collectors(void)
{
        for (size_t i = 0; i < ncollectors; i++)
                if (collectors[i] > 0 &&
                    waitpid(collectors[i], NULL, WNOHANG) == 0) {
                        kill(collectors[i], SIGKILL);
                        waitpid(collectors[i], NULL, 0);
                }
}

/* The endpoints returned, freed at exit (like the harness's strings). */
static char *urls[16];
static size_t nurls;

static void
free_urls(void)
{
        for (size_t i = 0; i < nurls; i++)
                free(urls[i]);
        nurls = 0;
}

static char *
own_url(int port)
{
        char *url = NULL;
        cr_assert(asprintf(&url, "http://127.0.0.1:%d", port) > 0);
        if (nurls < sizeof(urls) / sizeof(urls[0]))
                urls[nurls++] = url;
        return url;
}

static void
at_exit(void)
{
        reap_collectors();
        free_urls();
}

static const char *
otelcol_bin(void)
{
        const char *bin = getenv("KINBOX_OTELCOL");
        if (bin && *bin)
                return bin;
        static char path[512];
        const char *cache = getenv("KINBOX_CACHE");
        snprintf(path, sizeof(path), "%s/otelcol-%s/kinbox-otelcol",
                 cache && *cache ? cache : "/var/cache/kinbox",
                 KT_OTELCOL_VERSION);
        return path;
}

/* Does 127.0.0.1:port answer HTTP? (GET /v1/traces: 405 from the OTLP
 * receiver; any status line will do.) */
static bool
http_answers(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
                return false;
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool ok = false;
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
                static const char req[] =
                    "GET /v1/traces HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
                char b[16] = {0};
                if (write(fd, req, sizeof(req) - 1) == sizeof(req) - 1 &&
                    read(fd, b, sizeof(b) - 1) >= 7)
                        ok = strncmp(b, "HTTP/1.", 7) == 0;
        }
        close(fd);
        return ok;
}

static pid_t
spawn(const char *bin, const char *cfg, const char *log_path)
{
        pid_t parent = getpid();
        pid_t pid = fork();
        cr_assert(pid >= 0, "fork: %s", strerror(errno));
        if (pid == 0) {
                /* Dies with the test process, whatever ends it. */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(127);
                int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                        close(fd);
                }
                char arg[600];
                snprintf(arg, sizeof(arg), "--config=file:%s", cfg);
                execl(bin, bin, arg, (char *)NULL);
                fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
                _exit(127);
        }
        return pid;
}

static void
write_config(const char *cfg, int port, const char *spans)
{
        FILE *f = fopen(cfg, "w");
        cr_assert(f != NULL, "%s: %s", cfg, strerror(errno));
        /* tools/otelcol/config.yaml with the values filled in. */
        fprintf(f,
                "receivers:\n"
                "  otlp:\n"
                "    protocols:\n"
                "      http:\n"
                "        endpoint: 127.0.0.1:%d\n"
                "exporters:\n"
                "  spansfile:\n"
                "    path: %s\n"
                "service:\n"
                "  telemetry:\n"
                "    logs:\n"
                "      level: warn\n"
                "    metrics:\n"
                "      level: none\n"
                "  pipelines:\n"
                "    traces:\n"
                "      receivers: [otlp]\n"
                "      exporters: [spansfile]\n",
                port, spans);
        cr_assert(fclose(f) == 0);
}

char *
kt_otelcol_start(pid_t *pid_out, char **spans_file)
{
        const char *bin = otelcol_bin();
        if (access(bin, X_OK) != 0) {
                const char *knob = getenv("KINBOX_TEST_NO_OTEL");
                if (knob && *knob)
                        cr_fatal(
                            "no OpenTelemetry Collector (%s): "
                            "KINBOX_TEST_NO_OTEL is set, so scripts/setup "
                            "did not build it; this test needs it",
                            bin);
                cr_fatal("no OpenTelemetry Collector at %s (%s): run "
                         "scripts/setup, which builds it, or point "
                         "KINBOX_OTELCOL at one (KINBOX_TEST_NO_OTEL=1 "
                         "skips the build, and this test then fails)",
                         bin, strerror(errno));
        }
        static bool reaper;
        if (!reaper)
                reaper = atexit(at_exit) == 0;
        char *spans = kt_tmp("otelcol-spans.jsonl");
        char *cfg = kt_tmp("otelcol.yaml");
        char *log_path = kt_tmp("otelcol.log");
        /* The port is free when picked but may be taken before the
         * collector binds it: then another one. */
        for (int attempt = 0; attempt < 3; attempt++) {
                int port = kt_free_port();
                write_config(cfg, port, spans);
                pid_t pid = spawn(bin, cfg, log_path);
                if (ncollectors < sizeof(collectors) / sizeof(collectors[0]))
                        collectors[ncollectors++] = pid;
                int st = 0;
                bool exited = false;
                for (int i = 0; i < 200; i++) { /* 10 s */
                        if (waitpid(pid, &st, WNOHANG) == pid) {
                                exited = true;
                                break;
                        }
                        if (http_answers(port)) {
                                *pid_out = pid;
                                *spans_file = spans;
                                return own_url(port);
                        }
                        usleep(50000);
                }
                for (size_t i = 0; i < ncollectors; i++)
                        if (collectors[i] == pid)
                                collectors[i] = 0;
                char *tail = kt_tail(log_path, 20);
                bool in_use = strstr(tail, "address already in use") != NULL;
                if (!exited) {
                        kill(pid, SIGKILL);
                        waitpid(pid, NULL, 0);
                        cr_fatal("the OpenTelemetry Collector (%s) did not "
                                 "answer on 127.0.0.1:%d within 10 s; its "
                                 "log %s:\n%s",
                                 bin, port, log_path, tail);
                }
                if (!in_use)
                        cr_fatal("the OpenTelemetry Collector (%s) exited "
                                 "(status %d) at start; its log %s:\n%s",
                                 bin, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                                 log_path, tail);
                free(tail);
        }
        cr_fatal("the OpenTelemetry Collector found its port taken 3 times "
                 "(log %s)",
                 log_path);
        return NULL;
}

void
kt_otelcol_stop(pid_t pid)
{
        if (pid <= 0)
                return;
        for (size_t i = 0; i < ncollectors; i++)
                if (collectors[i] == pid)
                        collectors[i] = 0;
        kill(pid, SIGTERM);
        if (kt_wait_exit(pid, 5) == -1000)
                fprintf(stderr,
                        "the OpenTelemetry Collector (pid %d) ignored SIGTERM "
                        "for 5 s: killed\n",
                        (int)pid);
}

/* ------------------------------------------------------------ reading */

static char *
str_or_empty(json_t *o, const char *key)
{
        const char *s = json_string_value(json_object_get(o, key));
        return strdup(s ? s : "");
}

static void
copy_id(char *dst, size_t cap, json_t *o, const char *key)
{
        const char *s = json_string_value(json_object_get(o, key));
        snprintf(dst, cap, "%s", s ? s : "");
}

/* OTLP/JSON puts 64-bit integers in strings; take either. */
static uint64_t
u64_of(json_t *v)
{
        if (json_is_integer(v))
                return (uint64_t)json_integer_value(v);
        const char *s = json_string_value(v);
        return s ? strtoull(s, NULL, 10) : 0;
}

static char *
any_value_str(json_t *v)
{
        json_t *x;
        char b[64];
        if ((x = json_object_get(v, "stringValue")))
                return strdup(json_string_value(x) ? json_string_value(x)
                                                   : "");
        if ((x = json_object_get(v, "intValue"))) {
                if (json_is_integer(x))
                        snprintf(b, sizeof(b), "%" JSON_INTEGER_FORMAT,
                                 json_integer_value(x));
                else
                        snprintf(b, sizeof(b), "%s",
                                 json_string_value(x) ? json_string_value(x)
                                                      : "");
                return strdup(b);
        }
        if ((x = json_object_get(v, "boolValue")))
                return strdup(json_is_true(x) ? "true" : "false");
        if ((x = json_object_get(v, "doubleValue"))) {
                snprintf(b, sizeof(b), "%.17g", json_number_value(x));
                return strdup(b);
        }
        char *s =
            json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        return s ? s : strdup("");
}

/* attributes: [{"key": K, "value": AnyValue}] */
static void
read_attrs(kt_span_t *sp, json_t *attrs)
{
        size_t n = json_array_size(attrs);
        sp->attrs = n ? calloc(n, sizeof(*sp->attrs)) : NULL;
        for (size_t i = 0; i < n; i++) {
                json_t *kv = json_array_get(attrs, i);
                sp->attrs[sp->nattrs].key = str_or_empty(kv, "key");
                sp->attrs[sp->nattrs].value =
                    any_value_str(json_object_get(kv, "value"));
                sp->nattrs++;
        }
}

static const char *
resource_service(json_t *resource)
{
        json_t *attrs = json_object_get(resource, "attributes");
        for (size_t i = 0; i < json_array_size(attrs); i++) {
                json_t *kv = json_array_get(attrs, i);
                const char *key =
                    json_string_value(json_object_get(kv, "key"));
                if (key && strcmp(key, "service.name") == 0) {
                        const char *s = json_string_value(json_object_get(
                            json_object_get(kv, "value"), "stringValue"));
                        return s ? s : "";
                }
        }
        return "";
}

typedef struct {
        kt_span_t *v;
        int n, cap;
} spans_t;

static void
add_span(spans_t *a, json_t *s, const char *service, const char *scope)
{
        if (a->n == a->cap) {
                a->cap = a->cap ? a->cap * 2 : 16;
                a->v = realloc(a->v, (size_t)a->cap * sizeof(*a->v));
                cr_assert(a->v != NULL);
        }
        kt_span_t *sp = &a->v[a->n++];
        memset(sp, 0, sizeof(*sp));
        copy_id(sp->trace_id, sizeof(sp->trace_id), s, "traceId");
        copy_id(sp->span_id, sizeof(sp->span_id), s, "spanId");
        copy_id(sp->parent_span_id, sizeof(sp->parent_span_id), s,
                "parentSpanId");
        sp->name = str_or_empty(s, "name");
        sp->kind = (int)json_integer_value(json_object_get(s, "kind"));
        sp->start_ns = u64_of(json_object_get(s, "startTimeUnixNano"));
        sp->end_ns = u64_of(json_object_get(s, "endTimeUnixNano"));
        sp->status_code = (int)json_integer_value(
            json_object_get(json_object_get(s, "status"), "code"));
        sp->service = strdup(service);
        sp->scope = strdup(scope);
        read_attrs(sp, json_object_get(s, "attributes"));
}

/* One line: {"resourceSpans": [{"resource", "scopeSpans": [{"scope",
 * "spans": [...]}]}]} */
static void
read_line(spans_t *a, json_t *doc)
{
        json_t *rss = json_object_get(doc, "resourceSpans");
        for (size_t i = 0; i < json_array_size(rss); i++) {
                json_t *rs = json_array_get(rss, i);
                const char *service =
                    resource_service(json_object_get(rs, "resource"));
                json_t *sss = json_object_get(rs, "scopeSpans");
                for (size_t j = 0; j < json_array_size(sss); j++) {
                        json_t *ss = json_array_get(sss, j);
                        const char *scope = json_string_value(json_object_get(
                            json_object_get(ss, "scope"), "name"));
                        json_t *spans = json_object_get(ss, "spans");
                        for (size_t k = 0; k < json_array_size(spans); k++)
                                add_span(a, json_array_get(spans, k), service,
                                         scope ? scope : "");
                }
        }
}

int
kt_otelcol_spans(const char *spans_file, kt_span_t **out)
{
        *out = NULL;
        char *text = kt_slurp(spans_file);
        if (!text)
                return 0;
        spans_t a = {0};
        /* Whole lines only: the collector may be writing the last one. */
        char *line = text, *nl;
        int lineno = 0;
        while ((nl = strchr(line, '\n'))) {
                *nl = '\0';
                lineno++;
                if (*line) {
                        json_error_t e;
                        json_t *doc = json_loads(line, 0, &e);
                        cr_assert(doc != NULL, "%s:%d: %s", spans_file, lineno,
                                  e.text);
                        read_line(&a, doc);
                        json_decref(doc);
                }
                line = nl + 1;
        }
        free(text);
        *out = a.v;
        return a.n;
}

int
kt_otelcol_wait_spans(const char *spans_file, int min, int timeout_s,
                      kt_span_t **out)
{
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
                int n = kt_otelcol_spans(spans_file, out);
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (n >= min || t.tv_sec - t0.tv_sec >= timeout_s)
                        return n;
                kt_otelcol_spans_free(*out, n);
                *out = NULL;
                usleep(100000);
        }
}

void
kt_otelcol_spans_free(kt_span_t *spans, int n)
{
        for (int i = 0; i < n; i++) {
                kt_span_t *s = &spans[i];
                for (size_t j = 0; j < s->nattrs; j++) {
                        free(s->attrs[j].key);
                        free(s->attrs[j].value);
                }
                free(s->attrs);
                free(s->name);
                free(s->service);
                free(s->scope);
        }
        free(spans);
}

const char *
kt_span_attr(const kt_span_t *s, const char *key)
{
        for (size_t i = 0; i < s->nattrs; i++)
                if (strcmp(s->attrs[i].key, key) == 0)
                        return s->attrs[i].value;
        return NULL;
}

kt_span_t *
kt_span_find(kt_span_t *spans, int n, const char *name)
{
        for (int i = 0; i < n; i++)
                if (strcmp(spans[i].name, name) == 0)
                        return &spans[i];
        return NULL;
}
