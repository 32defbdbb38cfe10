/*
 * trace_test.c -- W3C trace context through the consumer: what a handler
 * reads with kinbox_msg_trace() for a message with a valid, an invalid and
 * no `traceparent` (tracing off: the sender's context; tracing on: the
 * consume span's, a child of it). Both backends.
 */
#include "harness.h"
#include "otelcol.h"
#include "metrics.h" /* internal */

#include <arpa/inet.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TP_VALID "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#define TP_TRACE "4bf92f3577b34da6a3ce929d0e0e4736"
#define TP_SPAN "00f067aa0ba902b7"

/* One message with a message_id and, when tp is not NULL, a traceparent
 * header (tp_len bytes). */
static void
produce_traced(const char *topic, const char *id, const char *tp,
               size_t tp_len)
{
        char e[256];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(rk != NULL, "producer: %s", e);
        rd_kafka_headers_t *h = rd_kafka_headers_new(2);
        rd_kafka_header_add(h, "message_id", -1, id, -1);
        if (tp)
                rd_kafka_header_add(h, "traceparent", -1, tp, (ssize_t)tp_len);
        rd_kafka_resp_err_t err = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
            RD_KAFKA_V_VALUE((void *)id, strlen(id)), RD_KAFKA_V_HEADERS(h),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        cr_assert(eq(int, err, 0), "produce: %s", rd_kafka_err2str(err));
        cr_assert(eq(int, rd_kafka_flush(rk, 30000), 0));
        rd_kafka_destroy(rk);
}

/* Records what the handler saw: the message id, and the trace id and span
 * id from kinbox_msg_trace() ('-' when it found none). */
static kinbox_result_t
record_trace(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        kinbox_trace_t t;
        char id[33] = "-", span[17] = "-";
        if (kinbox_msg_trace(msg, &t) == KINBOX_OK) {
                kinbox_trace_id_hex(&t, id);
                kinbox_trace_span_hex(&t, span);
        }
        const char *p[3] = {kinbox_msg_id(msg), id, span};
        kinbox_tx_exec(tx,
                       "INSERT INTO kt_seen (message_id, trace_id, span_id) "
                       "VALUES ($1, $2, $3)",
                       3, p);
        return KINBOX_RESULT_OK;
}

/* 1 when the handler saw message id with col = want (each id once). */
static long long
seen_is(const char *url, const char *id, const char *col, const char *want)
{
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT COUNT(*) FROM kt_seen WHERE "
                              "message_id = '%s'",
                              id),
                     1),
                  "%s not seen once", id);
        return kt_qintf(url,
                        "SELECT COUNT(*) FROM kt_seen WHERE message_id = '%s' "
                        "AND %s = '%s'",
                        id, col, want);
}

static char *
setup(int backend, const char **topicp, const char **groupp)
{
        char *url = kt_fresh_db(kt_backend(backend));
        kt_exec(url, "CREATE TABLE kt_seen (message_id VARCHAR(64) PRIMARY "
                     "KEY, trace_id VARCHAR(32), span_id VARCHAR(16))");
        *topicp = kt_unique("tr");
        *groupp = kt_unique("trg");
        kt_topic(*topicp, 1);
        /* A valid context; upper-case hex (invalid: ignored); version 01
         * (unknown: ignored); none. */
        produce_traced(*topicp, "valid", TP_VALID, strlen(TP_VALID));
        const char *upper =
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";
        produce_traced(*topicp, "upper", upper, strlen(upper));
        const char *v01 =
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        produce_traced(*topicp, "v01", v01, strlen(v01));
        produce_traced(*topicp, "none", NULL, 0);
        return url;
}

/* A consumer with spans on, sent to an endpoint nobody listens on: they
 * are dropped (counted), and the consumer does not wait. */
static kinbox_conf_t *
traced_conf(const char *url, const char *group, const char *topic)
{
        kinbox_conf_t *c = kt_conf(url, "tr", group, topic);
        kt_set(c, "tracing.endpoint", "http://127.0.0.1:9/");
        kt_set(c, "tracing.timeout.ms", "200");
        return c;
}

/* Tracing off: the handler reads the sender's context as it came; bad or
 * unknown-version values are not an error of the message (applied). */
KT_BACKENDS_PARAMS(trace, handler_reads_the_senders_context)
ParameterizedTest(int *backend, trace, handler_reads_the_senders_context,
                  .timeout = 120)
{
        const char *topic, *group;
        char *url = setup(*backend, &topic, &group);
        kinbox_conf_t *c = kt_conf(url, "tr", group, topic);
        kt_run_t *r = kt_run_start(c, record_trace, NULL, NULL);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM kt_seen", 4, 60), 4));
        kt_run_stop(r);
        cr_assert(eq(i64, seen_is(url, "valid", "trace_id", TP_TRACE), 1));
        cr_assert(eq(i64, seen_is(url, "valid", "span_id", TP_SPAN), 1));
        cr_assert(eq(i64, seen_is(url, "upper", "trace_id", "-"), 1));
        cr_assert(eq(i64, seen_is(url, "v01", "trace_id", "-"), 1));
        cr_assert(eq(i64, seen_is(url, "none", "trace_id", "-"), 1));
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 0));
}

/* Tracing on (an endpoint nobody listens on: spans are dropped, counted,
 * and the consumer does not wait): the handler reads the consume span's
 * context, a child of the message's; a message without a valid one gets
 * a new trace of its own. */
KT_BACKENDS_PARAMS(trace, handler_reads_the_consume_span)
ParameterizedTest(int *backend, trace, handler_reads_the_consume_span,
                  .timeout = 120)
{
        const char *topic, *group;
        char *url = setup(*backend, &topic, &group);
        kinbox_conf_t *c = traced_conf(url, group, topic);
        kt_run_t *r = kt_run_start(c, record_trace, NULL, NULL);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM kt_seen", 4, 60), 4));
        kt_run_stop(r);
        /* Same trace, a new span (not the sender's). */
        cr_assert(eq(i64, seen_is(url, "valid", "trace_id", TP_TRACE), 1));
        cr_assert(eq(i64, seen_is(url, "valid", "span_id", TP_SPAN), 0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kt_seen WHERE "
                                  "message_id = 'valid' AND span_id <> '-'"),
                     1));
        /* New traces, each its own. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(DISTINCT trace_id) FROM "
                                  "kt_seen WHERE message_id <> 'valid' AND "
                                  "trace_id <> '-'"),
                     3));
        cr_assert(eq(i64, seen_is(url, "upper", "trace_id", TP_TRACE), 0));
}

/* Appends an outbox row for the message (no trace header of its own). */
static kinbox_result_t
append_row(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        char key[80];
        snprintf(key, sizeof(key), "next-%s", kinbox_msg_id(msg));
        kinbox_outbox_msg_t m = {.destination =
                                     opaque ? (const char *)opaque : "kt-next",
                                 .idem_key = key,
                                 .aggregate_id = kinbox_msg_id(msg),
                                 .payload = "x",
                                 .payload_size = 1};
        return kinbox_outbox_append(tx, &m, NULL) ? KINBOX_RESULT_RETRY
                                                  : KINBOX_RESULT_OK;
}

static long long
row_has(const char *url, const char *id, const char *like)
{
        return kt_qintf(url,
                        "SELECT COUNT(*) FROM kinbox_outbox WHERE idem_key = "
                        "'next-%s' AND headers LIKE '%s'",
                        id, like);
}

/* Tracing off: a row appended while handling a message carries the
 * message's context as it came (the chain stays one trace); a message
 * without a valid one gives a row without a traceparent. */
KT_BACKENDS_PARAMS(trace, append_in_handler_continues_the_trace)
ParameterizedTest(int *backend, trace, append_in_handler_continues_the_trace,
                  .timeout = 120)
{
        const char *topic, *group;
        char *url = setup(*backend, &topic, &group);
        kinbox_conf_t *c = kt_conf(url, "tr", group, topic);
        kt_run_t *r = kt_run_start(c, append_row, NULL, NULL);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_outbox", 4, 60),
               4));
        kt_run_stop(r);
        cr_assert(eq(
            i64, row_has(url, "valid", "%[\"traceparent\",\"" TP_VALID "\"]%"),
            1));
        cr_assert(eq(i64, row_has(url, "upper", "%traceparent%"), 0));
        cr_assert(eq(i64, row_has(url, "none", "%traceparent%"), 0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "headers IS NULL"),
                     3));
}

/* Tracing on: the row's traceparent names the append span, a child of
 * the consume span: same trace, neither the sender's span nor the one the
 * handler saw. */
KT_BACKENDS_PARAMS(trace, append_in_handler_is_a_child_span)
ParameterizedTest(int *backend, trace, append_in_handler_is_a_child_span,
                  .timeout = 120)
{
        const char *topic, *group;
        char *url = setup(*backend, &topic, &group);
        kinbox_conf_t *c = traced_conf(url, group, topic);
        kt_run_t *r = kt_run_start(c, append_row, NULL, NULL);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_outbox", 4, 60),
               4));
        kt_run_stop(r);
        cr_assert(eq(i64,
                     row_has(url, "valid",
                             "%[\"traceparent\",\"00-" TP_TRACE "-%-01\"]%"),
                     1));
        cr_assert(eq(i64, row_has(url, "valid", "%" TP_SPAN "%"), 0));
        /* Every row has one (a new trace for the others), each its own. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(DISTINCT headers) FROM "
                                  "kinbox_outbox WHERE headers LIKE "
                                  "'[[\"traceparent\",\"00-%'"),
                     4));
}

/* Rejects the message whose id is "poison"; applies the others. */
static kinbox_result_t
reject_poison(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        if (!strcmp(kinbox_msg_id(msg), "poison")) {
                kinbox_tx_set_error(tx, "poison for the test");
                return KINBOX_RESULT_REJECT;
        }
        return record_trace(tx, msg, opaque);
}

/* Log lines that name the test's trace id (a dead letter's line must). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int traced_lines;

static void
count_traced(int level, const char *facility, const char *message,
             void *opaque)
{
        (void)level;
        (void)facility;
        (void)opaque;
        if (strstr(message, "dead-lettered") &&
            strstr(message, "(trace " TP_TRACE ")")) {
                pthread_mutex_lock(&log_mu);
                traced_lines++;
                pthread_mutex_unlock(&log_mu);
        }
}

/* A collector nobody answers changes nothing but the drop metric: every
 * message applied or dead-lettered as without tracing, the consumer
 * stops cleanly, no span counted as exported; and the dead letter's log
 * line carries the message's trace id. */
KT_BACKENDS_PARAMS(trace, unreachable_collector_changes_nothing_else)
ParameterizedTest(int *backend, trace,
                  unreachable_collector_changes_nothing_else, .timeout = 120)
{
        const char *topic, *group;
        char *url = setup(*backend, &topic, &group);
        produce_traced(topic, "poison", TP_VALID, strlen(TP_VALID));
        kinbox_conf_t *c = traced_conf(url, group, topic);
        kt_set(c, "tracing.interval.ms", "50");
        kinbox_conf_set_log_cb(c, count_traced, NULL);
        double dropped0 = kinbox__metrics_value(
            "kinbox_tracing_spans_dropped_total", "reason=\"export_failed\"");
        if (dropped0 != dropped0) /* NaN: no series yet */
                dropped0 = 0;
        kt_run_t *r = kt_run_start(c, reject_poison, NULL, NULL);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT SUM(next_offset) FROM "
                                  "kinbox_offsets",
                                  5, 60),
                     5));
        kinbox_consumer_stats_t st;
        kt_run_stop_stats(r, &st);
        cr_assert(eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_seen"), 4));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE message_id = 'poison'"),
                     1));
        cr_assert(eq(u64, st.processed, 4));
        cr_assert(eq(u64, st.dead, 1));
        /* The stop sent what was queued: every span was dropped. */
        double dropped = kinbox__metrics_value(
            "kinbox_tracing_spans_dropped_total", "reason=\"export_failed\"");
        cr_assert(dropped - dropped0 >= 5, "dropped %g", dropped - dropped0);
        double sent =
            kinbox__metrics_value("kinbox_tracing_spans_exported_total", "");
        cr_assert(sent != sent || sent == 0, "exported %g", sent);
        pthread_mutex_lock(&log_mu);
        int lines = traced_lines;
        pthread_mutex_unlock(&log_mu);
        cr_assert(eq(int, lines, 1));
}

/* ---- one trace through a real OpenTelemetry Collector ---- */

/* A span's attribute equals want. */
static void
attr_is(const kt_span_t *s, const char *key, const char *want)
{
        const char *v = kt_span_attr(s, key);
        cr_assert(v != NULL && !strcmp(v, want),
                  "span %s: %s is \"%s\", want \"%s\"", s->name, key,
                  v ? v : "(none)", want);
}

/* The span named name whose destination is topic (NULL: any). */
static kt_span_t *
span_of(kt_span_t *s, int n, const char *name, const char *topic)
{
        for (int i = 0; i < n; i++) {
                const char *d =
                    kt_span_attr(&s[i], "messaging.destination.name");
                if (!strcmp(s[i].name, name) &&
                    (!topic || (d && !strcmp(d, topic))))
                        return &s[i];
        }
        cr_fatal("no span %s for %s among %d", name, topic ? topic : "-", n);
        return NULL;
}

/* An event from a foreign producer (with a traceparent) is handled by a
 * consumer that appends the next event to the outbox; the relay publishes
 * it; a second consumer handles it. The collector receives one trace:
 * process(A) ← create(B) ← send(B), process(B), each the child of the one
 * before, with the messaging attributes and kinbox's decisions. */
KT_BACKENDS_PARAMS(trace, one_trace_through_the_collector)
ParameterizedTest(int *backend, trace, one_trace_through_the_collector,
                  .timeout = 180)
{
        pid_t cpid;
        char *spans_file = NULL;
        char *ep = kt_otelcol_start(&cpid, &spans_file);
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "CREATE TABLE kt_seen (message_id VARCHAR(128) PRIMARY "
                     "KEY, trace_id VARCHAR(32), span_id VARCHAR(16))");
        const char *a = kt_unique("tra"), *ga = kt_unique("trga");
        const char *b = kt_unique("trb"), *gb = kt_unique("trgb");
        kt_topic(a, 1);
        kt_topic(b, 1);
        produce_traced(a, "order-1", TP_VALID, strlen(TP_VALID));
        /* The same message again at another offset: absorbed. */
        produce_traced(a, "order-1", TP_VALID, strlen(TP_VALID));

        kinbox_conf_t *ca = kt_conf(url, "points", ga, a);
        kt_set(ca, "tracing.endpoint", ep);
        kt_set(ca, "tracing.interval.ms", "100");
        kt_set(ca, "tracing.service.name", "kt-points");
        kt_run_t *ra = kt_run_start(ca, append_row, NULL, (void *)b);
        kinbox_conf_t *cb = kt_conf(url, "notify", gb, b);
        kt_set(cb, "tracing.endpoint", ep);
        kt_run_t *rb = kt_run_start(cb, record_trace, NULL, NULL);
        kinbox_conf_t *cr = kinbox_conf_new();
        kt_set(cr, "name", "kt-relay");
        kt_set(cr, "database.url", url);
        kt_set(cr, "kafka.bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"));
        kt_set(cr, "relay.poll.ms", "100");
        if (!kt_real_kafka())
                kt_set(cr, "kafka.max.in.flight.requests.per.connection", "1");
        kt_set(cr, "tracing.endpoint", ep);
        kt_relay_t *rel = kt_relay_start(cr);

        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM kt_seen", 1, 60), 1));
        /* process(A) twice (one absorbed), create, send, process(B). */
        kt_span_t *s = NULL;
        int n = kt_otelcol_wait_spans(spans_file, 5, 30, &s);
        kt_relay_stop(rel);
        kt_run_stop(rb);
        kt_run_stop(ra);

        cr_assert(n >= 5, "%d spans", n);
        for (int i = 0; i < n; i++)
                cr_assert(eq(str, s[i].trace_id, TP_TRACE),
                          "span %s in trace %s", s[i].name, s[i].trace_id);
        kt_span_t *pa = NULL, *pdup = NULL;
        for (int i = 0; i < n; i++)
                if (!strcmp(s[i].name, "process") &&
                    !strcmp(kt_span_attr(&s[i], "messaging.destination.name"),
                            a)) {
                        const char *d =
                            kt_span_attr(&s[i], "kinbox.duplicate");
                        if (d && !strcmp(d, "true"))
                                pdup = &s[i];
                        else
                                pa = &s[i];
                }
        cr_assert(pa != NULL && pdup != NULL, "the two process spans of A");
        cr_assert(eq(str, pa->parent_span_id, TP_SPAN));
        cr_assert(eq(int, pa->kind, 5));
        cr_assert(eq(str, pa->service, "kt-points"));
        attr_is(pa, "messaging.system", "kafka");
        attr_is(pa, "messaging.operation.type", "process");
        attr_is(pa, "messaging.kafka.offset", "0");
        attr_is(pa, "messaging.destination.partition.id", "0");
        attr_is(pa, "messaging.consumer.group.name", ga);
        attr_is(pa, "messaging.message.id", "order-1");
        attr_is(pa, "kinbox.consumer", "points");
        attr_is(pa, "kinbox.dead_lettered", "false");
        attr_is(pdup, "kinbox.duplicate.kind", "redelivery");
        attr_is(pdup, "messaging.kafka.offset", "1");

        kt_span_t *cre = span_of(s, n, "create", b);
        cr_assert(eq(str, cre->parent_span_id, pa->span_id));
        cr_assert(eq(int, cre->kind, 4));
        attr_is(cre, "kinbox.outbox.idem_key", "next-order-1");
        kt_span_t *snd = span_of(s, n, "send", b);
        cr_assert(eq(str, snd->parent_span_id, cre->span_id));
        attr_is(snd, "kinbox.outcome", "sent");
        attr_is(snd, "messaging.kafka.message.key", "order-1");
        cr_assert(eq(int, snd->status_code, 1));
        kt_span_t *pb = span_of(s, n, "process", b);
        cr_assert(eq(str, pb->parent_span_id, cre->span_id));
        char mid[128];
        snprintf(mid, sizeof(mid), "%s:next-order-1", b);
        attr_is(pb, "messaging.message.id", mid);
        /* The handler downstream saw its process span's context. */
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT COUNT(*) FROM kt_seen WHERE trace_id = "
                              "'%s' AND span_id = '%s'",
                              TP_TRACE, pb->span_id),
                     1));
        kt_otelcol_spans_free(s, n);
        kt_otelcol_stop(cpid);
}

/* A trace collector that takes the connection and never answers, with
 * tracing.timeout.ms a minute: SIGTERM still ends `kinbox run` with 0
 * within the tracer's bound (KINBOX__TRACING_STOP_MS, 5 s, far inside the
 * 30 s watchdog), and the log says the spans were not sent because of
 * the collector. */
KT_BACKENDS_PARAMS(trace, shutdown_with_a_hung_collector)
ParameterizedTest(int *backend, trace, shutdown_with_a_hung_collector,
                  .timeout = 180)
{
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(ls >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof(a);
        cr_assert(eq(int, bind(ls, (struct sockaddr *)&a, sizeof(a)), 0));
        cr_assert(eq(int, listen(ls, 64), 0)); /* never accepted */
        cr_assert(eq(int, getsockname(ls, (struct sockaddr *)&a, &al), 0));
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("trhang");
        kt_topic(topic, 1);
        kt_produce_grants(topic, 0, 50, 0, "h", 0, NULL);
        char *ini = kt_write_ini(url,
                                 "[tracing]\nendpoint = http://127.0.0.1:%d\n"
                                 "timeout.ms = 60000\ninterval.ms = 100\n"
                                 "batch.size = 1\n"
                                 "[consumer.points]\ngroup.id = %s\n"
                                 "topics = %s\nhandler = points\n"
                                 "batch.max = 1\n",
                                 ntohs(a.sin_port), kt_unique("trhg"), topic);
        char *log = kt_tmp("trace_hang");
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 50, 90),
               50));
        sleep(1); /* the exporter is inside a request that hangs */
        long long t0 = kt_clock_ms();
        kill(pid, SIGTERM);
        int st = kt_wait_exit(pid, 60);
        long long took = kt_clock_ms() - t0;
        char *text = kt_slurp(log);
        cr_assert(eq(int, st, 0), "exit %d after %lld ms: %s", st, took, text);
        cr_assert(took < 15000, "SIGTERM took %lld ms: %s", took, text);
        cr_assert(strstr(text, "shutdown: ") &&
                      strstr(text, "trace collector at http://127.0.0.1:"),
                  "%s", text);
        cr_assert(strstr(text, "shutdown did not finish") == NULL, "%s", text);
        free(text);
        close(ls);
}
