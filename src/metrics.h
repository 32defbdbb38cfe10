/*
 * metrics.h -- the process-wide metrics registry (internal).
 *
 * Families are declared once in metrics.c (name, type, help, buckets);
 * series are created on first use from a label string built with
 * kinbox__m_labels(). Every call is thread-safe and cheap (one mutex, a
 * short list walk): fine once per batch or per relay round, not per byte.
 * The library's modules count here; http.c renders it for `kinbox run`
 * (src/cli/ops.c), which, like the tests, links the library's objects:
 * none of this is exported.
 */
#ifndef KINBOX_METRICS_H
#define KINBOX_METRICS_H

#include <stddef.h>

/* Build `k1="v1",k2="v2"` (values escaped) into buf from NULL-terminated
 * key/value pairs. Returns buf. */
char *kinbox__m_labels(char *buf, size_t size, ...);

/* Counter: add v (>= 0). */
void kinbox__m_add(const char *family, const char *labels, double v);
/* Gauge: set v. */
void kinbox__m_set(const char *family, const char *labels, double v);
/* Gauge: drop every series of a family whose labels start with prefix
 * (e.g. the lag of a consumer's revoked partitions, or destinations that
 * have no pending rows any more). */
void kinbox__m_drop(const char *family, const char *prefix);
/* Histogram: observe v. */
void kinbox__m_observe(const char *family, const char *labels, double v);

/* The process's metrics in Prometheus text format 0.0.4 (the body of
 * /metrics, http.c). Returns a malloc'ed string (free() it), NULL when out
 * of memory. */
char *kinbox__metrics_render(void);
/* One series' value (a histogram's count), NaN when absent; labels exactly
 * as rendered, e.g. `consumer="points"`, "" for none. */
double kinbox__metrics_value(const char *family, const char *labels);

#endif
