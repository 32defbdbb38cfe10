/*
 * internal.h -- helpers shared by every kinbox module (not installed).
 */
#ifndef KINBOX_INTERNAL_H
#define KINBOX_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kinbox/kinbox.h"

#define KINBOX__UNUSED(x) ((void)(x))
#define KINBOX__ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---- memory: abort on OOM is not acceptable in a library; callers check */
void *kinbox__calloc(size_t n, size_t size);
char *kinbox__strdup(const char *s);
char *kinbox__strndup(const char *s, size_t n);
void *kinbox__memdup(const void *p, size_t n);

/* ---- time */
int64_t kinbox__now_ms(void); /* monotonic */
int64_t kinbox__now_us(void); /* monotonic, microseconds */
/* realtime; env KINBOX_FAULT_CLOCK_S (seconds, tests only) shifts it, a
 * host clock that far from the database's */
int64_t kinbox__wall_ms(void);
void kinbox__sleep_ms(int64_t ms);
/* The instant ms from now on CLOCK_REALTIME (or on clock), for
 * pthread_cond_timedwait. */
void kinbox__deadline(int64_t ms, struct timespec *ts);
void kinbox__deadline_on(clockid_t clock, int64_t ms, struct timespec *ts);

/* ---- text to int64: the one parser. Decimal digits after an optional
 * '-' (no space, no '+'); *end (may be NULL) set past them. 0; -1 when s
 * is NULL or does not start with a number; -2 out of range. */
int kinbox__parse_i64(const char *s, int64_t *out, const char **end);
/* The whole of s as an int64 (nothing after the digits): as above, -1
 * also for trailing text. */
int kinbox__parse_i64_all(const char *s, int64_t *out);
/* Database text (a cell): its leading number, dflt for NULL or none. */
int64_t kinbox__i64_or(const char *s, int64_t dflt);

/* ---- backoff: full jitter, min(cap, base * 2^attempt) * U(0,1] */
int64_t kinbox__backoff_ms(int attempt, int64_t base_ms, int64_t cap_ms);

/* ---- growable arrays: make room for need elements of elem bytes in the
 * array *pp of capacity *cap (doubling, at least 8). 0, or -1 when out of
 * memory (the array is then unchanged). */
int kinbox__grow(void *pp, size_t *cap, size_t need, size_t elem);

/* ---- growable string buffer */
typedef struct kinbox__buf {
        char *p;
        size_t len, cap;
        bool oom;
} kinbox__buf_t;
void kinbox__buf_init(kinbox__buf_t *b);
void kinbox__buf_free(kinbox__buf_t *b);
void kinbox__buf_reset(kinbox__buf_t *b);
void kinbox__buf_add(kinbox__buf_t *b, const void *p, size_t n);
void kinbox__buf_adds(kinbox__buf_t *b, const char *s);
void kinbox__buf_printf(kinbox__buf_t *b, const char *fmt, ...)
    KINBOX_PRINTF(2, 3);
/* JSON string literal (with quotes) of n bytes; invalid UTF-8 and control
 * characters are escaped as \u00XX. */
void kinbox__buf_json_str(kinbox__buf_t *b, const char *s, size_t n);

/* ---- snprintf into a caller's errstr (NULL-safe) */
#include "errstr.h"

/* ---- logging: a logger captured from a conf */
typedef struct kinbox__log {
        kinbox_log_cb cb;
        void *opaque;
        int level; /* max level emitted */
        bool json; /* default logger format */
} kinbox__log_t;
void kinbox__log(const kinbox__log_t *lg, int level, const char *facility,
                 const char *fmt, ...) KINBOX_PRINTF(4, 5);
void kinbox__vlog(const kinbox__log_t *lg, int level, const char *facility,
                  const char *fmt, va_list ap);

/* ---- configuration access for modules: the table's keys as typed
 * fields in settings.h (kinbox__settings_of()); here the rest */
#include "settings.h"
void kinbox__conf_logger(const struct kinbox_conf_s *conf, kinbox__log_t *out);
/* Iterate over kafka.* pass-through properties (key without prefix). */
/* The librdkafka handle (an rd_kafka_t *) of a kinbox_kafka_new() client,
 * owned by k; NULL for NULL. Not public: the operator's calls that need
 * the broker are the library's (kinbox_admin_lag(), kinbox_offsets_*()). */
void *kinbox__kafka_handle(kinbox_kafka_t *k);
void kinbox__conf_kafka_each(const struct kinbox_conf_s *conf,
                             void (*fn)(const char *k, const char *v,
                                        void *arg),
                             void *arg);
/* Read database.password_file (first line) or NULL; errstr on failure.
 * Returns 0 on success (*out may be NULL when no file is configured). */
int kinbox__conf_password(const struct kinbox_conf_s *conf, char **out,
                          char *errstr, size_t errstr_size);

/* ---- "did you mean": the candidate closest to word (edit distance, a
 * few edits at most for its length), or NULL. */
const char *kinbox__closest(const char *word, const char *const *cands,
                            size_t n);

/* ---- fault injection for the crash-window tests (env KINBOX_FAULT,
 * "POINT:N"): returns true when the named point should fire. */
bool kinbox__fault(const char *point);

#endif
