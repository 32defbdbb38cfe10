/*
 * util.c -- memory, time, backoff, buffers, logging, fault points.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const err_names[] = {
#define KB_NAME_(name, val, s) "KINBOX_ERR_" #name,
    KINBOX_ERRNO_MAP(KB_NAME_)
#undef KB_NAME_
};
static const char *const err_strs[] = {
#define KB_STR_(name, val, s) s,
    KINBOX_ERRNO_MAP(KB_STR_)
#undef KB_STR_
};

/* Values run 0, -1, -2, ... without gaps: index = -value. */
const char *
kinbox_err_name(kinbox_err_t err)
{
        int i = -(int)err;
        if (i < 0 || (size_t)i >= KINBOX__ARRAY_SIZE(err_names))
                return "KINBOX_ERR_?";
        return err_names[i];
}

const char *
kinbox_strerror(kinbox_err_t err)
{
        int i = -(int)err;
        if (i < 0 || (size_t)i >= KINBOX__ARRAY_SIZE(err_strs))
                return "unknown error";
        return err_strs[i];
}

#define KB_STR2(x) #x
#define KB_STR(x) KB_STR2(x)
const char *
kinbox_version(void)
{
        return KB_STR(KINBOX_VERSION_MAJOR) "." KB_STR(
            KINBOX_VERSION_MINOR) "." KB_STR(KINBOX_VERSION_PATCH);
}

int
kinbox_version_num(void)
{
        return KINBOX_VERSION_NUM;
}

void *
kinbox__calloc(size_t n, size_t size)
{
        return calloc(n ? n : 1, size ? size : 1);
}

char *
kinbox__strdup(const char *s)
{
        return s ? strdup(s) : NULL;
}

char *
kinbox__strndup(const char *s, size_t n)
{
        char *p = malloc(n + 1);
        if (!p)
                return NULL;
        memcpy(p, s, n);
        p[n] = '\0';
        return p;
}

void *
kinbox__memdup(const void *p, size_t n)
{
        void *q = malloc(n ? n : 1);
        if (q && n)
                memcpy(q, p, n);
        return q;
}

int64_t
kinbox__now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
kinbox__now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
kinbox__wall_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        /* The tests' host clock far from the database's (internal.h). */
        const char *shift = getenv("KINBOX_FAULT_CLOCK_S");
        int64_t off = shift && *shift ? strtoll(shift, NULL, 10) * 1000 : 0;
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + off;
}

void
kinbox__sleep_ms(int64_t ms)
{
        struct timespec ts = {.tv_sec = ms / 1000,
                              .tv_nsec = (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
                ;
}

void
kinbox__deadline_on(clockid_t clock, int64_t ms, struct timespec *ts)
{
        clock_gettime(clock, ts);
        ts->tv_sec += ms / 1000;
        ts->tv_nsec += (ms % 1000) * 1000000L;
        if (ts->tv_nsec >= 1000000000L) {
                ts->tv_sec++;
                ts->tv_nsec -= 1000000000L;
        }
}

void
kinbox__deadline(int64_t ms, struct timespec *ts)
{
        kinbox__deadline_on(CLOCK_REALTIME, ms, ts);
}

/* xorshift64* seeded per thread: jitter only, not security. */
static uint64_t
rand64(void)
{
        static _Thread_local uint64_t s;
        if (!s) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
                    (uint64_t)(uintptr_t)&s;
                if (!s)
                        s = 88172645463325252ULL;
        }
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 2685821657736338717ULL;
}

int64_t
kinbox__backoff_ms(int attempt, int64_t base_ms, int64_t cap_ms)
{
        int64_t ceil = base_ms > 0 ? base_ms : 1;
        for (int i = 0; i < attempt && ceil < cap_ms; i++)
                ceil *= 2;
        if (ceil > cap_ms)
                ceil = cap_ms;
        if (ceil <= 0)
                return 0;
        return 1 + (int64_t)(rand64() % (uint64_t)ceil);
}

void
kinbox__buf_init(kinbox__buf_t *b)
{
        memset(b, 0, sizeof(*b));
}

void
kinbox__buf_free(kinbox__buf_t *b)
{
        free(b->p);
        kinbox__buf_init(b);
}

void
kinbox__buf_reset(kinbox__buf_t *b)
{
        b->len = 0;
        if (b->p)
                b->p[0] = '\0';
}

int
kinbox__grow(void *pp, size_t *cap, size_t need, size_t elem)
{
        void **p = pp;
        if (need <= *cap)
                return 0;
        size_t c = *cap ? *cap : 8;
        while (c < need)
                c *= 2;
        void *n = realloc(*p, c * elem);
        if (!n)
                return -1;
        *p = n;
        *cap = c;
        return 0;
}

static bool
buf_grow(kinbox__buf_t *b, size_t extra)
{
        if (b->oom)
                return false;
        if (b->len + extra + 1 <= b->cap)
                return true;
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + extra + 1)
                cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
                b->oom = true;
                return false;
        }
        b->p = p;
        b->cap = cap;
        return true;
}

void
kinbox__buf_add(kinbox__buf_t *b, const void *p, size_t n)
{
        if (!buf_grow(b, n))
                return;
        if (n)
                memcpy(b->p + b->len, p, n);
        b->len += n;
        b->p[b->len] = '\0';
}

void
kinbox__buf_adds(kinbox__buf_t *b, const char *s)
{
        kinbox__buf_add(b, s, strlen(s));
}

void
kinbox__buf_printf(kinbox__buf_t *b, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        va_list ap2;
        va_copy(ap2, ap);
        int n = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (n >= 0 && buf_grow(b, (size_t)n)) {
                vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
                b->len += (size_t)n;
        }
        va_end(ap2);
}

/* Length of a valid UTF-8 sequence at s (1..4), 0 if invalid. */
static size_t
utf8_len(const unsigned char *s, size_t n)
{
        if (s[0] < 0x80)
                return 1;
        size_t need;
        if ((s[0] & 0xE0) == 0xC0 && s[0] >= 0xC2)
                need = 2;
        else if ((s[0] & 0xF0) == 0xE0)
                need = 3;
        else if ((s[0] & 0xF8) == 0xF0 && s[0] <= 0xF4)
                need = 4;
        else
                return 0;
        if (n < need)
                return 0;
        for (size_t i = 1; i < need; i++)
                if ((s[i] & 0xC0) != 0x80)
                        return 0;
        return need;
}

void
kinbox__buf_json_str(kinbox__buf_t *b, const char *s, size_t n)
{
        const unsigned char *u = (const unsigned char *)s;
        kinbox__buf_add(b, "\"", 1);
        for (size_t i = 0; i < n;) {
                unsigned char c = u[i];
                if (c == '"' || c == '\\') {
                        char e[2] = {'\\', (char)c};
                        kinbox__buf_add(b, e, 2);
                        i++;
                } else if (c < 0x20 || c == 0x7f) {
                        kinbox__buf_printf(b, "\\u%04x", c);
                        i++;
                } else {
                        size_t l = utf8_len(u + i, n - i);
                        if (!l) {
                                kinbox__buf_printf(b, "\\u%04x", c);
                                i++;
                        } else {
                                kinbox__buf_add(b, u + i, l);
                                i += l;
                        }
                }
        }
        kinbox__buf_add(b, "\"", 1);
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
/* kinbox_log_set_level(): -1 = each logger's own level. */
static atomic_int log_level_override = -1;

void
kinbox_log_set_level(int level)
{
        atomic_store_explicit(&log_level_override, level < 0 ? -1 : level,
                              memory_order_relaxed);
}

/* Passwords never reach a log line: every "scheme://user:password@" in a
 * message becomes "scheme://user:***@". */
static void
redact_urls(char *msg)
{
        for (char *p = strstr(msg, "://"); p; p = strstr(p, "://")) {
                p += 3;
                char *end = p + strcspn(p, "/@ \t\"'?#");
                if (*end != '@')
                        continue;
                char *colon = memchr(p, ':', (size_t)(end - p));
                if (!colon || (end - colon == 4 && !strncmp(colon, ":***", 4)))
                        continue;
                size_t tail = strlen(end) + 1;
                /* ":***" is never longer than the password it replaces
                 * plus the colon, unless the password has < 3 bytes:
                 * keep within the buffer either way. */
                size_t room = 1024 - (size_t)(colon - msg) - 4;
                if (tail > room)
                        tail = room;
                memmove(colon + 4, end, tail);
                memcpy(colon, ":***", 4);
                colon[4 + tail - 1] = '\0';
                p = colon + 4;
        }
}

/* libpq's keyword form: "password=S3cret" (or password='S 3') becomes
 * "password=***". */
static void
redact_keywords(char *msg)
{
        for (char *p = strstr(msg, "password="); p;
             p = strstr(p, "password=")) {
                p += 9;
                char *end;
                if (*p == '\'') {
                        end = p + 1;
                        while (*end && *end != '\'')
                                end += (end[0] == '\\' && end[1]) ? 2 : 1;
                        if (*end)
                                end++;
                } else {
                        end = p + strcspn(p, " \t\"");
                }
                if (end - p == 3 && !strncmp(p, "***", 3))
                        continue;
                size_t len = (size_t)(end - p);
                size_t tail = strlen(end) + 1;
                if (len >= 3) {
                        memcpy(p, "***", 3);
                        memmove(p + 3, end, tail);
                } else {
                        /* shorter than the mask: drop it (no room) */
                        memmove(p, end, tail);
                }
        }
}

static const char *
level_name(int level)
{
        switch (level) {
        case KINBOX_LOG_ERR:
                return "error";
        case KINBOX_LOG_WARNING:
                return "warning";
        case KINBOX_LOG_NOTICE:
                return "notice";
        case KINBOX_LOG_INFO:
                return "info";
        default:
                return level < KINBOX_LOG_ERR ? "critical" : "debug";
        }
}

void
kinbox__vlog(const kinbox__log_t *lg, int level, const char *facility,
             const char *fmt, va_list ap)
{
        int ov =
            atomic_load_explicit(&log_level_override, memory_order_relaxed);
        if (ov >= 0 ? level > ov : lg && level > lg->level)
                return;
        char msg[1024];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        redact_urls(msg);
        redact_keywords(msg);
        /* One event, one line. */
        for (char *p = msg; *p; p++)
                if (*p == '\n' || *p == '\r')
                        *p = ' ';
        if (lg && lg->cb) {
                lg->cb(level, facility, msg, lg->opaque);
                return;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[96];
        snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
        pthread_mutex_lock(&log_lock);
        if (lg && lg->json) {
                kinbox__buf_t b;
                kinbox__buf_init(&b);
                kinbox__buf_printf(&b,
                                   "{\"ts\":\"%s\",\"level\":\"%s\","
                                   "\"facility\":",
                                   when, level_name(level));
                kinbox__buf_json_str(&b, facility, strlen(facility));
                kinbox__buf_adds(&b, ",\"msg\":");
                kinbox__buf_json_str(&b, msg, strlen(msg));
                kinbox__buf_adds(&b, "}\n");
                if (b.p)
                        fputs(b.p, stderr);
                kinbox__buf_free(&b);
        } else {
                fprintf(stderr, "%s %s %s: %s\n", when, level_name(level),
                        facility, msg);
        }
        pthread_mutex_unlock(&log_lock);
}

void
kinbox__log(const kinbox__log_t *lg, int level, const char *facility,
            const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        kinbox__vlog(lg, level, facility, fmt, ap);
        va_end(ap);
}

/*
 * KINBOX_FAULT=point[:skip] fires `point` after `skip` earlier hits (default
 * 0). Used by the crash-window tests; inert unless the variable is set.
 */
bool
kinbox__fault(const char *point)
{
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static long hits;
        const char *spec = getenv("KINBOX_FAULT");
        if (!spec || !*spec)
                return false;
        size_t n = strlen(point);
        if (strncmp(spec, point, n) != 0 || (spec[n] && spec[n] != ':'))
                return false;
        long skip = 0;
        if (spec[n] == ':')
                skip = strtol(spec + n + 1, NULL, 10);
        pthread_mutex_lock(&lock);
        bool fire = hits++ >= skip;
        pthread_mutex_unlock(&lock);
        return fire;
}

/* Levenshtein distance of a and b, stopping above cap (then cap + 1). */
static size_t
edit_distance(const char *a, const char *b, size_t cap)
{
        size_t la = strlen(a), lb = strlen(b);
        if (la > 64 || lb > 64 || (la > lb ? la - lb : lb - la) > cap)
                return cap + 1;
        size_t row[65];
        for (size_t j = 0; j <= lb; j++)
                row[j] = j;
        for (size_t i = 1; i <= la; i++) {
                size_t diag = row[0], best = row[0] = i;
                for (size_t j = 1; j <= lb; j++) {
                        size_t up = row[j];
                        size_t v = diag + (a[i - 1] != b[j - 1]);
                        if (up + 1 < v)
                                v = up + 1;
                        if (row[j - 1] + 1 < v)
                                v = row[j - 1] + 1;
                        row[j] = v;
                        diag = up;
                        if (v < best)
                                best = v;
                }
                if (best > cap)
                        return cap + 1;
        }
        return row[lb];
}

const char *
kinbox__closest(const char *word, const char *const *cands, size_t n)
{
        size_t len = strlen(word);
        size_t cap = len < 5 ? 1 : len < 12 ? 2 : 3;
        const char *best = NULL;
        size_t bd = cap + 1;
        for (size_t i = 0; i < n; i++) {
                if (!cands[i])
                        continue;
                size_t d = edit_distance(word, cands[i], cap);
                if (d < bd) {
                        bd = d;
                        best = cands[i];
                }
        }
        return best;
}

int
kinbox__parse_i64(const char *s, int64_t *out, const char **end)
{
        const char *p = s;
        if (!s)
                return -1;
        if (*p == '-')
                p++;
        if (*p < '0' || *p > '9')
                return -1;
        char *e;
        errno = 0;
        long long n = strtoll(s, &e, 10);
        if (errno == ERANGE)
                return -2;
        *out = (int64_t)n;
        if (end)
                *end = e;
        return 0;
}

int
kinbox__parse_i64_all(const char *s, int64_t *out)
{
        const char *end = NULL;
        int64_t n = 0;
        int rc = kinbox__parse_i64(s, &n, &end);
        if (rc)
                return rc;
        if (*end)
                return -1;
        *out = n;
        return 0;
}

int64_t
kinbox__i64_or(const char *s, int64_t dflt)
{
        int64_t n = 0;
        return kinbox__parse_i64(s, &n, NULL) ? dflt : n;
}
