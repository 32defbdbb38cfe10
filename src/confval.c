/*
 * confval.c -- the one parser for configuration values.
 */
#include "confval.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errstr.h"
#include "internal.h"
#include <strings.h>

/* Self-contained (no internal.h): the kinbox command compiles this file in
 * too, since the library does not export it. */
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

#define err kinbox__errstr

/* Values are quoted in messages; keep a runaway value from hiding the rest
 * of the message. */
#define SHOW_MAX 80

static const char *
show(const char *value)
{
        return value ? value : "(null)";
}

int
kinbox__confval_bool(const char *key, const char *value, bool *out,
                     char *errstr, size_t errstr_size)
{
        static const char *const yes[] = {"true", "yes", "on", "1"};
        static const char *const no[] = {"false", "no", "off", "0"};
        if (value) {
                for (size_t i = 0; i < NELEM(yes); i++) {
                        if (!strcasecmp(value, yes[i])) {
                                *out = true;
                                return 0;
                        }
                        if (!strcasecmp(value, no[i])) {
                                *out = false;
                                return 0;
                        }
                }
        }
        err(errstr, errstr_size,
            "%s: \"%.*s\" is not a boolean (true/false, yes/no, "
            "on/off, 1/0)",
            key, SHOW_MAX, show(value));
        return -1;
}

int
kinbox__confval_int(const char *key, const char *value, int64_t min,
                    int64_t max, int64_t *out, char *errstr,
                    size_t errstr_size)
{
        int64_t n = 0;
        const char *end = NULL;
        int rc = kinbox__parse_i64(value, &n, &end);
        if (rc == -1 || (rc == 0 && *end)) {
                err(errstr, errstr_size, "%s: \"%.*s\" is not an integer", key,
                    SHOW_MAX, show(value));
                return -1;
        }
        if (rc == -2 || n < min || n > max) {
                err(errstr, errstr_size,
                    "%s: \"%.*s\" is out of range [%" PRId64 ", %" PRId64 "]",
                    key, SHOW_MAX, value, min, max);
                return -1;
        }
        *out = n;
        return 0;
}

const char *
kinbox__confval_duration_text(int64_t ms, char *buf, size_t sz)
{
        static const struct {
                const char *unit;
                int64_t ms;
        } units[] = {{"d", 86400000},
                     {"h", 3600000},
                     {"m", 60000},
                     {"s", 1000},
                     {"ms", 1}};
        size_t i = 0;
        while (ms && i + 1 < NELEM(units) && ms % units[i].ms)
                i++;
        snprintf(buf, sz, "%" PRId64 "%s", ms ? ms / units[i].ms : 0,
                 ms ? units[i].unit : "s");
        return buf;
}

int
kinbox__confval_duration(const char *key, const char *value, int64_t min_ms,
                         int64_t max_ms, int64_t *out, char *errstr,
                         size_t errstr_size)
{
        static const struct {
                const char *unit;
                int64_t ms;
        } units[] = {{"", 1000},   {"ms", 1},      {"s", 1000},
                     {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
        int64_t n = 0;
        const char *end = NULL;
        int rc = kinbox__parse_i64(value, &n, &end);
        if (rc == 0 && *value == '-')
                rc = -1; /* no negative durations */
        int64_t mul = 0;
        for (size_t i = 0; rc == 0 && i < NELEM(units); i++)
                if (!strcmp(end, units[i].unit))
                        mul = units[i].ms;
        if (rc == -1 || (rc == 0 && !mul)) {
                err(errstr, errstr_size,
                    "%s: \"%.*s\" is not a duration (a number "
                    "with a unit: 500ms, 30s, 5m, 2h, 14d)",
                    key, SHOW_MAX, show(value));
                return -1;
        }
        if (rc == -2 || n > INT64_MAX / mul) {
                err(errstr, errstr_size, "%s: \"%.*s\" is too long a duration",
                    key, SHOW_MAX, value);
                return -1;
        }
        int64_t ms = n * mul;
        if (ms < min_ms || ms > max_ms) {
                char lo[32], hi[32];
                if (max_ms == INT64_MAX)
                        err(errstr, errstr_size,
                            "%s: \"%.*s\" is below the minimum of "
                            "%s",
                            key, SHOW_MAX, value,
                            kinbox__confval_duration_str(min_ms, lo,
                                                         sizeof(lo)));
                else
                        err(errstr, errstr_size,
                            "%s: \"%.*s\" is out of range [%s, %s]", key,
                            SHOW_MAX, value,
                            kinbox__confval_duration_str(min_ms, lo,
                                                         sizeof(lo)),
                            kinbox__confval_duration_str(max_ms, hi,
                                                         sizeof(hi)));
                return -1;
        }
        *out = ms;
        return 0;
}

const char *
kinbox__confval_duration_str(int64_t ms, char *buf, size_t size)
{
        static const struct {
                const char *unit;
                int64_t ms;
        } units[] = {
            {"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
        const char *unit = "ms";
        int64_t n = ms;
        for (size_t i = 0; ms && i < NELEM(units); i++) {
                if (ms % units[i].ms == 0) {
                        unit = units[i].unit;
                        n = ms / units[i].ms;
                        break;
                }
        }
        if (size)
                snprintf(buf, size, "%" PRId64 "%s", n, unit);
        return buf;
}

int
kinbox__confval_topics(const char *key, const char *value, char *errstr,
                       size_t errstr_size)
{
        for (const char *p = value; p && *p;) {
                size_t n = strcspn(p, ","), s = 0, e = n;
                while (s < e && (p[s] == ' ' || p[s] == '\t'))
                        s++;
                while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
                        e--;
                size_t len = e - s;
                bool ok = len <= 249 && !(len == 1 && p[s] == '.') &&
                          !(len == 2 && p[s] == '.' && p[s + 1] == '.');
                for (size_t i = s; ok && i < e; i++)
                        ok = isalnum((unsigned char)p[i]) || p[i] == '.' ||
                             p[i] == '_' || p[i] == '-';
                if (!ok) {
                        if (errstr && errstr_size)
                                snprintf(errstr, errstr_size,
                                         "%s: \"%.*s%s\" is not a Kafka "
                                         "topic name (1 to 249 characters "
                                         "of a-z A-Z 0-9 . _ -, not \".\" "
                                         "or \"..\"; %zu characters): no "
                                         "broker can have it",
                                         key, len > 60 ? 60 : (int)len, p + s,
                                         len > 60 ? "..." : "", len);
                        return -1;
                }
                p += n + (p[n] ? 1 : 0);
        }
        return 0;
}
