/*
 * trace.c -- W3C trace context (traceparent, version 00): strict parsing,
 * formatting, new traces and child spans (see include/kinbox/trace.h).
 * Pure functions; the id generator is per thread.
 */
#include "internal.h"

#include <kinbox/trace.h>

#include <stdbool.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char hexdig[] = "0123456789abcdef";

/* One lower-case hex digit, or -1 (the specification allows no other). */
static int
hexval(char c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

/* n bytes from 2n lower-case hex digits; false on any other character. */
static bool
unhex(const char *s, uint8_t *out, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
                if (hi < 0 || lo < 0)
                        return false;
                out[i] = (uint8_t)(hi << 4 | lo);
        }
        return true;
}

static void
tohex(const uint8_t *in, size_t n, char *out)
{
        for (size_t i = 0; i < n; i++) {
                out[2 * i] = hexdig[in[i] >> 4];
                out[2 * i + 1] = hexdig[in[i] & 15];
        }
        out[2 * n] = '\0';
}

static bool
all_zero(const uint8_t *b, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (b[i])
                        return false;
        return true;
}

/* version "-" trace-id "-" parent-id "-" trace-flags: 2+1+32+1+16+1+2. */
kinbox_err_t
kinbox_trace_parse(const void *value, size_t len, kinbox_trace_t *out)
{
        const char *s = value;
        if (!s || len != KINBOX_TRACEPARENT_LEN || s[0] != '0' ||
            s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-')
                return KINBOX_ERR_INVALID;
        kinbox_trace_t t;
        if (!unhex(s + 3, t.trace_id, 16) || !unhex(s + 36, t.span_id, 8) ||
            !unhex(s + 53, &t.flags, 1))
                return KINBOX_ERR_INVALID;
        if (all_zero(t.trace_id, 16) || all_zero(t.span_id, 8))
                return KINBOX_ERR_INVALID;
        *out = t;
        return KINBOX_OK;
}

void
kinbox_trace_format(const kinbox_trace_t *t,
                    char buf[KINBOX_TRACEPARENT_LEN + 1])
{
        buf[0] = '0';
        buf[1] = '0';
        buf[2] = '-';
        tohex(t->trace_id, 16, buf + 3);
        buf[35] = '-';
        tohex(t->span_id, 8, buf + 36);
        buf[52] = '-';
        tohex(&t->flags, 1, buf + 53);
}

/* splitmix64, seeded per thread from the kernel (ids must not repeat
 * across processes that start at the same instant). */
static uint64_t
next64(void)
{
        static _Thread_local uint64_t s;
        static _Thread_local bool seeded;
        if (!seeded) {
                if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != sizeof(s)) {
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        s = (uint64_t)ts.tv_nsec ^
                            ((uint64_t)ts.tv_sec << 32) ^
                            (uint64_t)(uintptr_t)&s;
                }
                seeded = true;
        }
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

/* n random bytes, never all zero. */
static void
random_id(uint8_t *b, size_t n)
{
        do {
                for (size_t i = 0; i < n; i += 8) {
                        uint64_t r = next64();
                        size_t k = n - i < 8 ? n - i : 8;
                        memcpy(b + i, &r, k);
                }
        } while (all_zero(b, n));
}

void
kinbox_trace_new(kinbox_trace_t *t)
{
        random_id(t->trace_id, sizeof(t->trace_id));
        random_id(t->span_id, sizeof(t->span_id));
        t->flags = 0x01;
}

void
kinbox_trace_child(const kinbox_trace_t *parent, kinbox_trace_t *child)
{
        if (child != parent)
                *child = *parent;
        random_id(child->span_id, sizeof(child->span_id));
}

void
kinbox_trace_id_hex(const kinbox_trace_t *t, char buf[33])
{
        tohex(t->trace_id, 16, buf);
}

void
kinbox_trace_span_hex(const kinbox_trace_t *t, char buf[17])
{
        tohex(t->span_id, 8, buf);
}

void
kinbox_trace_header(const kinbox_trace_t *t,
                    char buf[KINBOX_TRACEPARENT_LEN + 1], kinbox_header_t *hdr)
{
        kinbox_trace_format(t, buf);
        hdr->name = KINBOX_TRACEPARENT_HEADER;
        hdr->value = buf;
        hdr->size = KINBOX_TRACEPARENT_LEN;
}
