/*
 * otelcol.h -- a real OpenTelemetry Collector for the tracing tests.
 *
 * kinbox-otelcol (tools/otelcol, built by scripts/setup) receives OTLP
 * over HTTP on a loopback port and appends every batch of spans it gets
 * to a file as one line of OTLP/JSON; kt_otelcol_spans() reads them back.
 * The binary is $KINBOX_OTELCOL (scripts/services writes it into
 * services.env), else the one scripts/setup built under $KINBOX_CACHE
 * (default /var/cache/kinbox). A missing collector FAILS the test, naming
 * KINBOX_TEST_NO_OTEL when that knob is what left it unbuilt.
 *
 *      pid_t pid;
 *      char *spans;
 *      char *endpoint = kt_otelcol_start(&pid, &spans);
 *      ... export to endpoint (POST endpoint + "/v1/traces") ...
 *      kt_span_t *s;
 *      int n = kt_otelcol_wait_spans(spans, 3, 10, &s);
 *      ... kt_span_attr(&s[0], "messaging.system") ...
 *      kt_otelcol_spans_free(s, n);
 *      kt_otelcol_stop(pid);
 */
#ifndef KINBOX_TEST_OTELCOL_H
#define KINBOX_TEST_OTELCOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One attribute, its value as a string: a string as it is, an int in
 * decimal, a bool "true"/"false", a double with %.17g, anything else
 * (array, kvlist, bytes) as its OTLP/JSON text. */
typedef struct {
        char *key;
        char *value;
} kt_span_attr_t;

/* One span as the collector received it. Ids are lower-case hex, ""
 * when absent (a root span has parent_span_id ""). kind is the OTLP
 * SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, 4 producer,
 * 5 consumer. status_code: 0 unset, 1 ok, 2 error. */
typedef struct {
        char trace_id[33];
        char span_id[17];
        char parent_span_id[17];
        char *name;
        int kind;
        uint64_t start_ns, end_ns;
        int status_code;
        char *service; /* resource attribute service.name, or "" */
        char *scope; /* instrumentation scope name, or "" */
        kt_span_attr_t *attrs;
        size_t nattrs;
} kt_span_t;

/* Start the collector on a free loopback port, its spans going to a new
 * file under $KT_TMPDIR (*spans_file, owned by the harness), and wait
 * until its OTLP/HTTP endpoint answers (10 s). Returns the base endpoint
 * "http://127.0.0.1:PORT" (owned by the harness). The collector is
 * killed when the test process exits, even if the test never calls
 * kt_otelcol_stop(). Fails the test when it cannot be started. */
char *kt_otelcol_start(pid_t *pid, char **spans_file);

/* SIGTERM, then SIGKILL after 5 s; reaps it. */
void kt_otelcol_stop(pid_t pid);

/* Every span in spans_file so far, in the order received: *spans is a
 * malloc'ed array (NULL when none) for kt_otelcol_spans_free(). Returns
 * the number of spans; fails the test on a line it cannot parse. A file
 * that does not exist yet holds no spans. */
int kt_otelcol_spans(const char *spans_file, kt_span_t **spans);

/* kt_otelcol_spans() until it returns at least min spans or timeout_s
 * passed; returns the last count (the spans of that read in *spans). */
int kt_otelcol_wait_spans(const char *spans_file, int min, int timeout_s,
                          kt_span_t **spans);

void kt_otelcol_spans_free(kt_span_t *spans, int n);

/* The value of attribute key of a span, or NULL. */
const char *kt_span_attr(const kt_span_t *s, const char *key);

/* The first span named name, or NULL. */
kt_span_t *kt_span_find(kt_span_t *spans, int n, const char *name);

#endif
