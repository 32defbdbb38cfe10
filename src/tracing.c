/*
 * tracing.c -- spans and the process's OTLP/HTTP exporter (see tracing.h).
 *
 * The queue holds finished spans by value; the exporter thread takes up to
 * tracing.batch.size of them at a time, writes one OTLP/JSON request and
 * POSTs it with libcurl (tracing.timeout.ms). A request that fails is
 * dropped and counted, never retried: spans are diagnostics, and a retry
 * queue would hold memory exactly while the collector is down.
 */
#include "tracing.h"
#include "internal.h"
#include "metrics.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct exporter {
        pthread_cond_t cond; /* work queued, a flush asked, or stop */
        pthread_cond_t sent; /* a batch went out (flush waits on it) */
        int refs;
        bool stop, flush;
        pthread_t thr;
        kinbox__span_t *q; /* ring of cap spans */
        int cap, head, count;
        int batch, interval_ms, timeout_ms;
        double ratio;
        char *url, *service;
        struct curl_slist *headers;
        kinbox__log_t lg;
        int64_t last_warn_ms;
        /* Set by the last release: the kinbox__now_ms() by which the
         * exporter ends (0 while running). */
        _Atomic int64_t stop_by;
} exporter_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static exporter_t *g_ex; /* NULL while no one traces */
/* tracing.sample.ratio as a threshold on 53 random bits (2^53: every
 * root sampled, 0: none or no exporter), read without the lock. */
static _Atomic uint64_t g_sample;
/* g_ex != NULL, for the hot paths' "is anyone tracing?" without the lock */
static atomic_bool g_active;

int64_t
kinbox__tracing_now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------- spans */

static void
attrs_free(kinbox__span_t *sp)
{
        for (int i = 0; i < sp->nattrs; i++)
                if (sp->attrs[i].heap)
                        free(sp->attrs[i].s);
        sp->nattrs = 0;
        sp->sused = 0;
}

/* Copy a span by value: strings in its buffer point into the copy's. */
static void
span_move(kinbox__span_t *dst, kinbox__span_t *src)
{
        memcpy(dst, src, offsetof(kinbox__span_t, sbuf));
        memcpy(dst->sbuf, src->sbuf, src->sused);
        for (int i = 0; i < dst->nattrs; i++)
                if (dst->attrs[i].type == KINBOX__ATTR_STR &&
                    !dst->attrs[i].heap)
                        dst->attrs[i].s =
                            dst->sbuf + (src->attrs[i].s - src->sbuf);
        src->nattrs = 0; /* the heap strings are dst's now */
        src->sused = 0;
}

void
kinbox__span_start(kinbox__span_t *sp, const char *name,
                   enum kinbox__span_kind kind, const kinbox_trace_t *parent)
{
        memset(sp, 0, offsetof(kinbox__span_t, sbuf));
        sp->name = name;
        sp->kind = kind;
        if (parent) {
                kinbox_trace_child(parent, &sp->ctx);
                memcpy(sp->parent, parent->span_id, sizeof(sp->parent));
                sp->has_parent = true;
        } else {
                kinbox_trace_new(&sp->ctx);
                sp->ctx.flags = kinbox__tracing_sample_root() ? 0x01 : 0x00;
        }
        sp->start_ns = kinbox__tracing_now_ns();
}

static kinbox__span_attr_t *
attr_slot(kinbox__span_t *sp, const char *key)
{
        if (sp->nattrs == KINBOX__SPAN_ATTRS)
                return NULL;
        kinbox__span_attr_t *a = &sp->attrs[sp->nattrs++];
        memset(a, 0, sizeof(*a));
        a->key = key;
        return a;
}

void
kinbox__span_strn(kinbox__span_t *sp, const char *key, const char *v, size_t n)
{
        kinbox__span_attr_t *a = v ? attr_slot(sp, key) : NULL;
        if (!a)
                return;
        a->type = KINBOX__ATTR_STR;
        if (n < sizeof(sp->sbuf) - sp->sused) {
                a->s = sp->sbuf + sp->sused;
                sp->sused += n + 1;
        } else if ((a->s = malloc(n + 1))) {
                a->heap = true;
        } else {
                sp->nattrs--;
                return;
        }
        memcpy(a->s, v, n);
        a->s[n] = '\0';
}

void
kinbox__span_str(kinbox__span_t *sp, const char *key, const char *v)
{
        if (v)
                kinbox__span_strn(sp, key, v, strlen(v));
}

void
kinbox__span_int(kinbox__span_t *sp, const char *key, int64_t v)
{
        kinbox__span_attr_t *a = attr_slot(sp, key);
        if (a) {
                a->type = KINBOX__ATTR_INT;
                a->i = v;
        }
}

void
kinbox__span_bool(kinbox__span_t *sp, const char *key, bool v)
{
        kinbox__span_attr_t *a = attr_slot(sp, key);
        if (a) {
                a->type = KINBOX__ATTR_BOOL;
                a->i = v;
        }
}

void
kinbox__span_discard(kinbox__span_t *sp)
{
        attrs_free(sp);
}

void
kinbox__span_end(kinbox__span_t *sp)
{
        sp->end_ns = kinbox__tracing_now_ns();
        if (!(sp->ctx.flags & 0x01)) {
                attrs_free(sp);
                return;
        }
        pthread_mutex_lock(&g_lock);
        exporter_t *ex = g_ex;
        if (!ex || ex->count == ex->cap) {
                pthread_mutex_unlock(&g_lock);
                attrs_free(sp);
                if (ex)
                        kinbox__m_add("kinbox_tracing_spans_dropped_total",
                                      "reason=\"queue_full\"", 1);
                return;
        }
        span_move(&ex->q[(ex->head + ex->count) % ex->cap], sp);
        if (++ex->count >= ex->batch)
                pthread_cond_signal(&ex->cond);
        pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------- OTLP/JSON */

static void
hex(kinbox__buf_t *b, const uint8_t *p, size_t n)
{
        static const char d[] = "0123456789abcdef";
        char s[33];
        for (size_t i = 0; i < n; i++) {
                s[2 * i] = d[p[i] >> 4];
                s[2 * i + 1] = d[p[i] & 15];
        }
        kinbox__buf_add(b, "\"", 1);
        kinbox__buf_add(b, s, 2 * n);
        kinbox__buf_add(b, "\"", 1);
}

/* A JSON string: printable ASCII without quotes or backslashes (nearly
 * every attribute) in one copy, anything else through the escaper. */
static void
jstr(kinbox__buf_t *b, const char *s)
{
        size_t n = strlen(s), i = 0;
        while (i < n && (unsigned char)s[i] >= 0x20 &&
               (unsigned char)s[i] < 0x7f && s[i] != '"' && s[i] != '\\')
                i++;
        if (i < n) {
                kinbox__buf_json_str(b, s, n);
                return;
        }
        kinbox__buf_add(b, "\"", 1);
        kinbox__buf_add(b, s, n);
        kinbox__buf_add(b, "\"", 1);
}

/* A decimal integer in quotes (OTLP/JSON writes 64-bit integers as
 * strings), without printf's cost. */
static void
jint(kinbox__buf_t *b, int64_t v)
{
        char d[24];
        int i = (int)sizeof(d);
        uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
        d[--i] = '"';
        do {
                d[--i] = (char)('0' + u % 10);
                u /= 10;
        } while (u);
        if (v < 0)
                d[--i] = '-';
        d[--i] = '"';
        kinbox__buf_add(b, d + i, sizeof(d) - (size_t)i);
}

static void
json_attr(kinbox__buf_t *b, const kinbox__span_attr_t *a)
{
        kinbox__buf_adds(b, "{\"key\":");
        jstr(b, a->key);
        switch (a->type) {
        case KINBOX__ATTR_STR:
                kinbox__buf_adds(b, ",\"value\":{\"stringValue\":");
                jstr(b, a->s);
                kinbox__buf_adds(b, "}}");
                break;
        case KINBOX__ATTR_INT:
                kinbox__buf_adds(b, ",\"value\":{\"intValue\":");
                jint(b, a->i);
                kinbox__buf_adds(b, "}}");
                break;
        case KINBOX__ATTR_BOOL:
                kinbox__buf_adds(b, a->i
                                        ? ",\"value\":{\"boolValue\":true}}"
                                        : ",\"value\":{\"boolValue\":false}}");
                break;
        }
}

static void
json_span(kinbox__buf_t *b, const kinbox__span_t *sp)
{
        kinbox__buf_adds(b, "{\"traceId\":");
        hex(b, sp->ctx.trace_id, 16);
        kinbox__buf_adds(b, ",\"spanId\":");
        hex(b, sp->ctx.span_id, 8);
        if (sp->has_parent) {
                kinbox__buf_adds(b, ",\"parentSpanId\":");
                hex(b, sp->parent, 8);
        }
        kinbox__buf_adds(b, ",\"name\":");
        jstr(b, sp->name);
        char kind[16] = ",\"kind\":0";
        kind[8] = (char)('0' + (int)sp->kind % 10);
        kinbox__buf_adds(b, kind);
        kinbox__buf_adds(b, ",\"startTimeUnixNano\":");
        jint(b, sp->start_ns);
        kinbox__buf_adds(b, ",\"endTimeUnixNano\":");
        jint(b, sp->end_ns);
        kinbox__buf_adds(b, ",\"attributes\":[");
        for (int i = 0; i < sp->nattrs; i++) {
                if (i)
                        kinbox__buf_add(b, ",", 1);
                json_attr(b, &sp->attrs[i]);
        }
        static const char *const status[] = {"],\"status\":{\"code\":0}}",
                                             "],\"status\":{\"code\":1}}",
                                             "],\"status\":{\"code\":2}}"};
        kinbox__buf_adds(b, status[sp->status <= 2 ? sp->status : 0]);
}

static void
json_request(kinbox__buf_t *b, const exporter_t *ex, const kinbox__span_t *s,
             int n)
{
        kinbox__buf_reset(b);
        kinbox__buf_adds(b,
                         "{\"resourceSpans\":[{\"resource\":{\"attributes\":"
                         "[{\"key\":\"service.name\",\"value\":{"
                         "\"stringValue\":");
        kinbox__buf_json_str(b, ex->service, strlen(ex->service));
        kinbox__buf_printf(b,
                           "}}]},\"scopeSpans\":[{\"scope\":{\"name\":"
                           "\"kinbox\",\"version\":\"%d.%d.%d\"},\"spans\":[",
                           KINBOX_VERSION_MAJOR, KINBOX_VERSION_MINOR,
                           KINBOX_VERSION_PATCH);
        for (int i = 0; i < n; i++) {
                if (i)
                        kinbox__buf_add(b, ",", 1);
                json_span(b, &s[i]);
        }
        kinbox__buf_adds(b, "]}]}]}");
}

/* ------------------------------------------------------------- export */

static size_t
discard_body(char *p, size_t sz, size_t n, void *u)
{
        (void)p;
        (void)u;
        return sz * n;
}

/* libcurl's progress callback (at least once a second, also while the
 * collector says nothing): non-zero ends the request once the shutdown's
 * deadline passed. */
static int
past_stop(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
          curl_off_t un)
{
        (void)dt;
        (void)dn;
        (void)ut;
        (void)un;
        exporter_t *ex = arg;
        int64_t by = atomic_load(&ex->stop_by);
        return by && kinbox__now_ms() >= by;
}

/* POST one request; 0 when the collector took it (2xx). */
static int
post(exporter_t *ex, CURL *h, const kinbox__buf_t *body, char *why,
     size_t whysz)
{
        int64_t ms = ex->timeout_ms, by = atomic_load(&ex->stop_by);
        if (by && by - kinbox__now_ms() < ms)
                ms = by - kinbox__now_ms() > 0 ? by - kinbox__now_ms() : 1;
        curl_easy_setopt(h, CURLOPT_URL, ex->url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, ex->headers);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body->p);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)body->len);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)ms);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, past_stop);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, ex);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard_body);
        CURLcode rc = curl_easy_perform(h);
        if (rc != CURLE_OK) {
                snprintf(why, whysz, "%s", curl_easy_strerror(rc));
                return -1;
        }
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        if (code < 200 || code > 299) {
                snprintf(why, whysz, "HTTP status %ld", code);
                return -1;
        }
        return 0;
}

/* Send up to ex->batch queued spans; called with g_lock held, returns
 * with it held. Returns the number taken off the queue. */
static int
send_batch(exporter_t *ex, CURL *h, kinbox__buf_t *b, kinbox__span_t *tmp)
{
        int n = ex->count < ex->batch ? ex->count : ex->batch;
        for (int i = 0; i < n; i++)
                span_move(&tmp[i], &ex->q[(ex->head + i) % ex->cap]);
        ex->head = (ex->head + n) % ex->cap;
        ex->count -= n;
        pthread_mutex_unlock(&g_lock);
        json_request(b, ex, tmp, n);
        for (int i = 0; i < n; i++)
                attrs_free(&tmp[i]);
        char why[256] = "";
        if (!h || post(ex, h, b, why, sizeof(why))) {
                kinbox__m_add("kinbox_tracing_spans_dropped_total",
                              "reason=\"export_failed\"", n);
                int64_t now = kinbox__now_ms();
                if (atomic_load(&ex->stop_by))
                        kinbox__log(&ex->lg, KINBOX_LOG_WARNING, "tracing",
                                    "shutdown: sending %d span(s) to the "
                                    "trace collector at %s failed (%s): "
                                    "dropped, the exit does not wait for "
                                    "it",
                                    n, ex->url, h ? why : "no HTTP client");
                else if (now - ex->last_warn_ms > 60000) {
                        ex->last_warn_ms = now;
                        kinbox__log(&ex->lg, KINBOX_LOG_WARNING, "tracing",
                                    "sending %d span(s) to %s failed: %s "
                                    "(dropped; said at most once a minute)",
                                    n, ex->url, h ? why : "no HTTP client");
                }
        } else {
                kinbox__m_add("kinbox_tracing_spans_exported_total", "", n);
        }
        pthread_mutex_lock(&g_lock);
        pthread_cond_broadcast(&ex->sent);
        return n;
}

/* The shutdown's deadline passed: drop what is queued (g_lock held). */
static void
drop_queued(exporter_t *ex)
{
        int n = ex->count;
        for (int i = 0; i < n; i++)
                attrs_free(&ex->q[(ex->head + i) % ex->cap]);
        ex->head = (ex->head + n) % ex->cap;
        ex->count = 0;
        kinbox__m_add("kinbox_tracing_spans_dropped_total",
                      "reason=\"shutdown\"", n);
        kinbox__log(&ex->lg, KINBOX_LOG_WARNING, "tracing",
                    "shutdown: %d span(s) not sent: the trace collector at "
                    "%s did not take them within %d ms",
                    n, ex->url,
                    ex->timeout_ms < KINBOX__TRACING_STOP_MS
                        ? ex->timeout_ms
                        : KINBOX__TRACING_STOP_MS);
}

static void *
exporter_main(void *arg)
{
        exporter_t *ex = arg;
        CURL *h = curl_easy_init();
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__span_t *tmp = calloc((size_t)ex->batch, sizeof(*tmp));
        pthread_mutex_lock(&g_lock);
        while (tmp) {
                if (!ex->stop && !ex->flush && ex->count < ex->batch) {
                        struct timespec ts;
                        kinbox__deadline(ex->interval_ms, &ts);
                        pthread_cond_timedwait(&ex->cond, &g_lock, &ts);
                }
                bool last = ex->stop;
                while (ex->count > 0) {
                        int64_t by = atomic_load(&ex->stop_by);
                        if (by && kinbox__now_ms() >= by) {
                                drop_queued(ex);
                                break;
                        }
                        send_batch(ex, h, &b, tmp);
                }
                ex->flush = false;
                pthread_cond_broadcast(&ex->sent);
                if (last)
                        break;
        }
        pthread_mutex_unlock(&g_lock);
        free(tmp);
        kinbox__buf_free(&b);
        if (h)
                curl_easy_cleanup(h);
        return NULL;
}

/* ------------------------------------------------------------- settings */

/* "k=v,k2=v2" (OTEL_EXPORTER_OTLP_HEADERS' form) into curl's list. */
static int
parse_headers(exporter_t *ex, const char *spec, char *errstr, size_t sz)
{
        ex->headers =
            curl_slist_append(NULL, "Content-Type: application/json");
        char *dup = spec ? strdup(spec) : NULL;
        for (char *save = NULL, *t = dup ? strtok_r(dup, ",", &save) : NULL; t;
             t = strtok_r(NULL, ",", &save)) {
                char *eq = strchr(t, '=');
                while (*t == ' ')
                        t++;
                if (!eq || eq == t || strpbrk(t, "\r\n")) {
                        kinbox__errstr(errstr, sz,
                                       "tracing.headers: \"%s\" is not "
                                       "name=value",
                                       t);
                        free(dup);
                        return -1;
                }
                *eq = '\0';
                char line[1024];
                snprintf(line, sizeof(line), "%s: %s", t, eq + 1);
                ex->headers = curl_slist_append(ex->headers, line);
        }
        free(dup);
        return 0;
}

static void
exporter_free(exporter_t *ex)
{
        if (!ex)
                return;
        for (int i = 0; i < ex->count; i++)
                attrs_free(&ex->q[(ex->head + i) % ex->cap]);
        free(ex->q);
        free(ex->url);
        free(ex->service);
        curl_slist_free_all(ex->headers);
        pthread_cond_destroy(&ex->cond);
        pthread_cond_destroy(&ex->sent);
        free(ex);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void
curl_init_once(void)
{
        curl_global_init(CURL_GLOBAL_DEFAULT);
}

static exporter_t *
exporter_new(const kinbox_conf_t *conf, const char *endpoint, char *errstr,
             size_t sz)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        const char *ratio_s = s->tracing_sample_ratio;
        char *end = NULL;
        errno = 0;
        double ratio = strtod(ratio_s ? ratio_s : "1", &end);
        if (errno || !end || *end || end == ratio_s || !(ratio >= 0.0) ||
            ratio > 1.0) {
                kinbox__errstr(errstr, sz,
                               "tracing.sample.ratio: \"%s\" is not a "
                               "number from 0 to 1",
                               ratio_s ? ratio_s : "");
                return NULL;
        }
        exporter_t *ex = calloc(1, sizeof(*ex));
        if (!ex)
                return NULL;
        pthread_cond_init(&ex->cond, NULL);
        pthread_cond_init(&ex->sent, NULL);
        ex->ratio = ratio;
        ex->cap = (int)s->tracing_queue_size;
        ex->batch = (int)s->tracing_batch_size;
        ex->interval_ms = (int)s->tracing_interval_ms;
        ex->timeout_ms = (int)s->tracing_timeout_ms;
        if (ex->batch > ex->cap)
                ex->batch = ex->cap;
        kinbox__conf_logger(conf, &ex->lg);
        const char *svc = s->tracing_service_name;
        size_t n = strlen(endpoint);
        while (n && endpoint[n - 1] == '/')
                n--;
        const char *path =
            n >= 10 && !strncmp(endpoint + n - 10, "/v1/traces", 10)
                ? ""
                : "/v1/traces";
        ex->url = malloc(n + strlen(path) + 1);
        ex->service = strdup(svc && *svc ? svc : "kinbox");
        ex->q = calloc((size_t)ex->cap, sizeof(*ex->q));
        if (!ex->url || !ex->service || !ex->q ||
            parse_headers(ex, s->tracing_headers, errstr, sz)) {
                exporter_free(ex);
                return NULL;
        }
        memcpy(ex->url, endpoint, n);
        strcpy(ex->url + n, path);
        return ex;
}

int
kinbox__tracing_acquire(const kinbox_conf_t *conf, bool *on, char *errstr,
                        size_t errstr_size)
{
        *on = false;
        const char *endpoint = kinbox__settings_of(conf)->tracing_endpoint;
        if (!endpoint || !*endpoint)
                return 0;
        pthread_once(&curl_once, curl_init_once);
        pthread_mutex_lock(&g_lock);
        if (g_ex) {
                g_ex->refs++;
                pthread_mutex_unlock(&g_lock);
                *on = true;
                return 0;
        }
        exporter_t *ex = exporter_new(conf, endpoint, errstr, errstr_size);
        if (!ex) {
                pthread_mutex_unlock(&g_lock);
                return -1;
        }
        if (pthread_create(&ex->thr, NULL, exporter_main, ex)) {
                pthread_mutex_unlock(&g_lock);
                exporter_free(ex);
                kinbox__errstr(errstr, errstr_size,
                               "tracing: cannot start the exporter thread");
                return -1;
        }
        ex->refs = 1;
        g_ex = ex;
        atomic_store(&g_active, true);
        atomic_store(&g_sample,
                     (uint64_t)(ex->ratio * (double)(UINT64_C(1) << 53)));
        pthread_mutex_unlock(&g_lock);
        *on = true;
        return 0;
}

void
kinbox__tracing_release(bool on)
{
        if (!on)
                return;
        pthread_mutex_lock(&g_lock);
        exporter_t *ex = g_ex;
        if (!ex || --ex->refs > 0) {
                pthread_mutex_unlock(&g_lock);
                return;
        }
        /* It sends what is queued, then ends: within the bound, so that a
         * hung collector cannot hold up the process's exit. */
        int64_t bound = ex->timeout_ms < KINBOX__TRACING_STOP_MS
                            ? ex->timeout_ms
                            : KINBOX__TRACING_STOP_MS;
        atomic_store(&ex->stop_by, kinbox__now_ms() + bound);
        ex->stop = true;
        pthread_cond_signal(&ex->cond);
        pthread_mutex_unlock(&g_lock);
        pthread_join(ex->thr, NULL);
        pthread_mutex_lock(&g_lock);
        g_ex = NULL;
        atomic_store(&g_active, false);
        atomic_store(&g_sample, 0);
        pthread_mutex_unlock(&g_lock);
        exporter_free(ex);
}

bool
kinbox__tracing_active(void)
{
        return atomic_load(&g_active);
}

bool
kinbox__tracing_sample_root(void)
{
        uint64_t th = atomic_load(&g_sample);
        if (th >= UINT64_C(1) << 53)
                return true;
        if (!th)
                return false;
        kinbox_trace_t t;
        kinbox_trace_new(&t);
        uint64_t v;
        memcpy(&v, t.trace_id, sizeof(v));
        return (v >> 11) < th;
}

int
kinbox__tracing_flush(int timeout_ms)
{
        pthread_mutex_lock(&g_lock);
        exporter_t *ex = g_ex;
        if (!ex) {
                pthread_mutex_unlock(&g_lock);
                return 0;
        }
        ex->flush = true;
        pthread_cond_signal(&ex->cond);
        struct timespec ts;
        kinbox__deadline(timeout_ms, &ts);
        while ((ex->count > 0 || ex->flush) &&
               pthread_cond_timedwait(&ex->sent, &g_lock, &ts) != ETIMEDOUT)
                ;
        int left = ex->count;
        pthread_mutex_unlock(&g_lock);
        return left;
}
