/*
 * tracing.h -- spans and their export over OTLP/HTTP (JSON), internal.
 *
 * One exporter per process, shared by every consumer, relay and writer
 * whose configuration sets `tracing.endpoint` (reference counted: the
 * first acquire starts it with its settings, the last release flushes and
 * stops it). Finished spans go into a bounded queue; a background thread
 * sends them in batches. A full queue drops the span and counts it
 * (kinbox_tracing_spans_dropped_total): tracing never slows the consumer
 * down or blocks it on the collector. Thread-safe throughout.
 */
#ifndef KINBOX_TRACING_H
#define KINBOX_TRACING_H

#include <kinbox/trace.h>

#include <stdbool.h>
#include <stdint.h>

struct kinbox_conf_s;

/* OTLP span kinds. */
enum kinbox__span_kind {
        KINBOX__SPAN_INTERNAL = 1,
        KINBOX__SPAN_PRODUCER = 4,
        KINBOX__SPAN_CONSUMER = 5
};

/* OTLP status codes. */
enum kinbox__span_status {
        KINBOX__STATUS_UNSET = 0,
        KINBOX__STATUS_OK = 1,
        KINBOX__STATUS_ERROR = 2
};

#define KINBOX__SPAN_ATTRS 16

/* An attribute: a static key, a string (copied into the span's own
 * buffer, or malloc'ed when it does not fit), an integer or a bool. */
typedef struct kinbox__span_attr {
        const char *key;
        enum { KINBOX__ATTR_STR, KINBOX__ATTR_INT, KINBOX__ATTR_BOOL } type;
        bool heap; /* s was malloc'ed */
        int64_t i;
        char *s;
} kinbox__span_attr_t;

/* Bytes of attribute strings a span holds without an allocation. */
#define KINBOX__SPAN_STRBUF 512

typedef struct kinbox__span {
        kinbox_trace_t ctx; /* trace id, this span's id, flags */
        uint8_t parent[8];
        bool has_parent;
        const char *name; /* static */
        enum kinbox__span_kind kind;
        enum kinbox__span_status status;
        int64_t start_ns, end_ns; /* Unix epoch, nanoseconds */
        int nattrs;
        kinbox__span_attr_t attrs[KINBOX__SPAN_ATTRS];
        size_t sused; /* of sbuf */
        char sbuf[KINBOX__SPAN_STRBUF];
} kinbox__span_t;

/* Start the process's exporter or take another reference to it, when
 * conf sets tracing.endpoint. Returns 0 (also when tracing is off: then
 * kinbox__tracing_on() stays false for this caller) or -1 with errstr
 * naming the bad setting. Pair every 0 with kinbox__tracing_release(). */
int kinbox__tracing_acquire(const struct kinbox_conf_s *conf, bool *on,
                            char *errstr, size_t errstr_size);
/* The last reference's release sends what is queued and ends the
 * exporter, within KINBOX__TRACING_STOP_MS (or tracing.timeout.ms when
 * shorter) whatever the collector does: a request in flight is cut at
 * that deadline, and spans still queued are dropped (counted as
 * kinbox_tracing_spans_dropped_total{reason="shutdown"}, one warning). */
void kinbox__tracing_release(bool on);
#define KINBOX__TRACING_STOP_MS 5000

/* Whether this process's exporter runs (some consumer or relay set
 * tracing.endpoint): only then are spans recorded. */
bool kinbox__tracing_active(void);

/* Whether a new root trace is sampled (tracing.sample.ratio). */
bool kinbox__tracing_sample_root(void);

/* Wall clock in Unix nanoseconds. */
int64_t kinbox__tracing_now_ns(void);

/* A span as a child of parent (NULL: a new root trace, sampled by the
 * ratio); its start is now. */
void kinbox__span_start(kinbox__span_t *sp, const char *name,
                        enum kinbox__span_kind kind,
                        const kinbox_trace_t *parent);
void kinbox__span_str(kinbox__span_t *sp, const char *key, const char *v);
void kinbox__span_strn(kinbox__span_t *sp, const char *key, const char *v,
                       size_t n);
void kinbox__span_int(kinbox__span_t *sp, const char *key, int64_t v);
void kinbox__span_bool(kinbox__span_t *sp, const char *key, bool v);
/* End it now and queue it for export when sampled; frees its strings in
 * every case (the span may be reused after kinbox__span_start()). */
void kinbox__span_end(kinbox__span_t *sp);
/* Free a span's strings without exporting it. */
void kinbox__span_discard(kinbox__span_t *sp);

/* For tests and `kinbox run`'s shutdown: send what is queued now and wait
 * up to timeout_ms for it to be sent. Returns the spans still queued. */
int kinbox__tracing_flush(int timeout_ms);

#endif
