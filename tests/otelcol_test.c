/*
 * otelcol_test.c -- the tracing tests' collector itself (tests/otelcol.c):
 * kinbox-otelcol starts on a loopback port, takes one OTLP/HTTP JSON
 * trace, and kt_otelcol_spans() reads back what it received. No database,
 * no Kafka. Fails (never skips) when the collector is missing.
 */
#include "harness.h"
#include "otelcol.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* POST body (Content-Type type) to url + path over HTTP/1.1; returns the
 * status (-1: no connection). */
static int
http_post(const char *url, const char *path, const char *type,
          const char *body)
{
        int port = 0;
        cr_assert(sscanf(url, "http://127.0.0.1:%d", &port) == 1, "%s", url);
        int fd = kt_connect(port, 10);
        if (fd < 0)
                return -1;
        char *req = NULL;
        int len = asprintf(&req,
                           "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                           "Content-Type: %s\r\nContent-Length: %zu\r\n"
                           "Connection: close\r\n\r\n%s",
                           path, port, type, strlen(body), body);
        cr_assert(len > 0);
        cr_assert(write(fd, req, (size_t)len) == len);
        free(req);
        char b[4096];
        size_t n = 0;
        ssize_t r;
        while (n < sizeof(b) - 1 &&
               (r = read(fd, b + n, sizeof(b) - 1 - n)) > 0)
                n += (size_t)r;
        close(fd);
        b[n] = '\0';
        int status = -1;
        sscanf(b, "HTTP/1.%*d %d", &status);
        return status;
}

/* One trace of two spans in OTLP/JSON: a producer span (root) and its
 * consumer child, in two resources. */
static const char trace_json[] =
    "{\"resourceSpans\":["
    " {\"resource\":{\"attributes\":["
    "   {\"key\":\"service.name\",\"value\":{\"stringValue\":\"orders\"}}]},"
    "  \"scopeSpans\":[{\"scope\":{\"name\":\"kinbox\",\"version\":\"1\"},"
    "   \"spans\":[{"
    "    \"traceId\":\"4bf92f3577b34da6a3ce929d0e0e4736\","
    "    \"spanId\":\"00f067aa0ba902b7\","
    "    \"name\":\"orders publish\",\"kind\":4,"
    "    \"startTimeUnixNano\":\"1760000000000000000\","
    "    \"endTimeUnixNano\":\"1760000000002000000\","
    "    \"attributes\":["
    "     "
    "{\"key\":\"messaging.system\",\"value\":{\"stringValue\":\"kafka\"}},"
    "     "
    "{\"key\":\"messaging.destination.name\",\"value\":{\"stringValue\":"
    "\"orders\"}}]}]}]},"
    " {\"resource\":{\"attributes\":["
    "   {\"key\":\"service.name\",\"value\":{\"stringValue\":\"points\"}}]},"
    "  \"scopeSpans\":[{\"scope\":{\"name\":\"kinbox\"},"
    "   \"spans\":[{"
    "    \"traceId\":\"4bf92f3577b34da6a3ce929d0e0e4736\","
    "    \"spanId\":\"b7ad6b7169203331\","
    "    \"parentSpanId\":\"00f067aa0ba902b7\","
    "    \"name\":\"orders process\",\"kind\":5,"
    "    \"startTimeUnixNano\":\"1760000000005000000\","
    "    \"endTimeUnixNano\":\"1760000000009000000\","
    "    \"status\":{\"code\":2,\"message\":\"dead-lettered\"},"
    "    \"attributes\":["
    "     "
    "{\"key\":\"messaging.system\",\"value\":{\"stringValue\":\"kafka\"}},"
    "     "
    "{\"key\":\"messaging.kafka.offset\",\"value\":{\"intValue\":\"42\"}},"
    "     "
    "{\"key\":\"messaging.destination.partition.id\",\"value\":{"
    "\"stringValue\":\"3\"}},"
    "     {\"key\":\"kinbox.duplicate\",\"value\":{\"boolValue\":false}},"
    "     {\"key\":\"kinbox.attempt\",\"value\":{\"intValue\":2}},"
    "     {\"key\":\"kinbox.ratio\",\"value\":{\"doubleValue\":0.5}}]}]}]}"
    "]}";

Test(otelcol, one_trace_round_trip, .timeout = 60)
{
        pid_t pid = 0;
        char *spans_file = NULL;
        char *endpoint = kt_otelcol_start(&pid, &spans_file);
        cr_assert(pid > 0);
        cr_assert(strncmp(endpoint, "http://127.0.0.1:", 17) == 0, "%s",
                  endpoint);

        kt_span_t *s = NULL;
        cr_assert(eq(int, kt_otelcol_spans(spans_file, &s), 0),
                  "spans before any was sent");

        int st =
            http_post(endpoint, "/v1/traces", "application/json", trace_json);
        cr_assert(eq(int, st, 200), "POST %s/v1/traces: %d", endpoint, st);

        /* Written before the answer: no wait needed, but be lenient. */
        int n = kt_otelcol_wait_spans(spans_file, 2, 10, &s);
        cr_assert(eq(int, n, 2), "spans received: %d", n);

        kt_span_t *p = kt_span_find(s, n, "orders publish");
        kt_span_t *c = kt_span_find(s, n, "orders process");
        cr_assert(p && c);
        cr_assert(eq(str, p->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736"));
        cr_assert(eq(str, c->trace_id, p->trace_id));
        cr_assert(eq(str, p->span_id, "00f067aa0ba902b7"));
        cr_assert(eq(str, p->parent_span_id, ""), "a root has no parent");
        cr_assert(eq(str, c->span_id, "b7ad6b7169203331"));
        cr_assert(eq(str, c->parent_span_id, p->span_id));
        cr_assert(eq(int, p->kind, 4));
        cr_assert(eq(int, c->kind, 5));
        cr_assert(eq(str, p->service, "orders"));
        cr_assert(eq(str, c->service, "points"));
        cr_assert(eq(str, c->scope, "kinbox"));
        cr_assert(eq(u64, c->start_ns, 1760000000005000000ULL));
        cr_assert(eq(u64, c->end_ns - c->start_ns, 4000000));
        cr_assert(eq(int, c->status_code, 2));
        cr_assert(eq(int, p->status_code, 0));

        cr_assert(eq(sz, p->nattrs, 2));
        cr_assert(
            eq(str, (char *)kt_span_attr(p, "messaging.system"), "kafka"));
        cr_assert(eq(str,
                     (char *)kt_span_attr(p, "messaging.destination.name"),
                     "orders"));
        cr_assert(
            eq(str, (char *)kt_span_attr(c, "messaging.kafka.offset"), "42"));
        cr_assert(eq(
            str, (char *)kt_span_attr(c, "messaging.destination.partition.id"),
            "3"));
        cr_assert(
            eq(str, (char *)kt_span_attr(c, "kinbox.duplicate"), "false"));
        cr_assert(eq(str, (char *)kt_span_attr(c, "kinbox.attempt"), "2"));
        cr_assert(eq(str, (char *)kt_span_attr(c, "kinbox.ratio"), "0.5"));
        cr_assert(kt_span_attr(c, "messaging.destination.name") == NULL);
        kt_otelcol_spans_free(s, n);

        /* A second batch is a second line; the first is still there. */
        cr_assert(eq(
            int,
            http_post(endpoint, "/v1/traces", "application/json", trace_json),
            200));
        n = kt_otelcol_wait_spans(spans_file, 4, 10, &s);
        cr_assert(eq(int, n, 4));
        kt_otelcol_spans_free(s, n);

        /* Garbage is refused, and adds nothing. */
        st =
            http_post(endpoint, "/v1/traces", "application/json", "{not json");
        cr_assert(eq(int, st, 400), "bad JSON: %d", st);
        n = kt_otelcol_spans(spans_file, &s);
        cr_assert(eq(int, n, 4));
        kt_otelcol_spans_free(s, n);

        kt_otelcol_stop(pid);
        cr_assert(kill(pid, 0) != 0, "the collector still runs after stop");
        cr_assert(eq(int,
                     http_post(endpoint, "/v1/traces", "application/json",
                               trace_json),
                     -1),
                  "the endpoint still answers after stop");
}

/* Two collectors at once (two tests, or one test's two services): their
 * own ports and files. */
Test(otelcol, two_at_once, .timeout = 60)
{
        pid_t p1, p2;
        char *f1, *f2;
        char *e1 = kt_otelcol_start(&p1, &f1);
        char *e2 = kt_otelcol_start(&p2, &f2);
        cr_assert(ne(str, e1, e2));
        cr_assert(ne(str, f1, f2));
        cr_assert(eq(
            int, http_post(e2, "/v1/traces", "application/json", trace_json),
            200));
        kt_span_t *s;
        int n = kt_otelcol_wait_spans(f2, 2, 10, &s);
        cr_assert(eq(int, n, 2));
        kt_otelcol_spans_free(s, n);
        n = kt_otelcol_spans(f1, &s);
        cr_assert(eq(int, n, 0), "the other collector got spans");
        kt_otelcol_spans_free(s, n);
        kt_otelcol_stop(p1);
        kt_otelcol_stop(p2);
}
