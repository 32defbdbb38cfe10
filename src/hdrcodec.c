/*
 * hdrcodec.c -- the stored form of a header list, on jansson.
 *
 * Self-contained (jansson, libc and the public headers only): the kinbox
 * command compiles it in as well.
 */
#include "hdrcodec.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errstr.h"

#define err kinbox__errstr

/* ------------------------------------------------------------- lists */

int
kinbox__hdrs_add(kinbox__hdrs_t *h, const char *name, const void *value,
                 size_t size)
{
        if (!name || h->n >= KINBOX__HDRS_MAX)
                return -1;
        if (h->n == h->cap) {
                size_t cap = h->cap ? h->cap * 2 : 8;
                kinbox__hdr_t *v = realloc(h->v, cap * sizeof(*v));
                if (!v)
                        return -1;
                h->v = v;
                h->cap = cap;
        }
        kinbox__hdr_t e = {strdup(name), NULL, 0};
        if (value) {
                e.value = malloc(size + 1);
                if (e.value) {
                        if (size)
                                memcpy(e.value, value, size);
                        e.value[size] = '\0';
                        e.size = size;
                }
        }
        if (!e.name || (value && !e.value)) {
                free(e.name);
                free(e.value);
                return -1;
        }
        h->v[h->n++] = e;
        return 0;
}

void
kinbox__hdrs_free(kinbox__hdrs_t *h)
{
        for (size_t i = 0; i < h->n; i++) {
                free(h->v[i].name);
                free(h->v[i].value);
        }
        free(h->v);
        memset(h, 0, sizeof(*h));
}

/* ------------------------------------------------------- byte helpers */

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if none.
 * Overlong forms, surrogates and code points past U+10FFFF are invalid. */
static size_t
utf8_seq(const unsigned char *s, size_t n)
{
        unsigned char c = s[0];
        if (c < 0x80)
                return 1;
        size_t need;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
                need = 2;
                cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
                need = 3;
                cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
                need = 4;
                cp = c & 0x07;
        } else {
                return 0;
        }
        if (n < need)
                return 0;
        for (size_t i = 1; i < need; i++) {
                if ((s[i] & 0xC0) != 0x80)
                        return 0;
                cp = (cp << 6) | (s[i] & 0x3F);
        }
        if ((need == 3 && cp < 0x800) || (need == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return 0;
        return need;
}

static bool
utf8_valid(const unsigned char *s, size_t n)
{
        for (size_t i = 0, l; i < n; i += l)
                if (!(l = utf8_seq(s + i, n - i)))
                        return false;
        return true;
}

static const char b64t[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *
b64_encode(const unsigned char *p, size_t n)
{
        char *o = malloc((n + 2) / 3 * 4 + 1), *q = o;
        if (!o)
                return NULL;
        for (size_t i = 0; i < n; i += 3) {
                uint32_t v = (uint32_t)p[i] << 16;
                if (i + 1 < n)
                        v |= (uint32_t)p[i + 1] << 8;
                if (i + 2 < n)
                        v |= p[i + 2];
                *q++ = b64t[(v >> 18) & 63];
                *q++ = b64t[(v >> 12) & 63];
                *q++ = i + 1 < n ? b64t[(v >> 6) & 63] : '=';
                *q++ = i + 2 < n ? b64t[v & 63] : '=';
        }
        *q = '\0';
        return o;
}

/* Strict: length a multiple of 4, padding only at the end. Returns a
 * malloc'ed buffer (NUL after *outlen bytes) or NULL. */
static unsigned char *
b64_decode(const char *s, size_t n, size_t *outlen)
{
        if (n % 4)
                return NULL;
        unsigned char *o = malloc(n / 4 * 3 + 1);
        if (!o)
                return NULL;
        size_t k = 0;
        for (size_t i = 0; i < n; i += 4) {
                uint32_t v = 0;
                int pad = 0;
                for (int j = 0; j < 4; j++) {
                        const char *c =
                            s[i + j] ? strchr(b64t, s[i + j]) : NULL;
                        if (s[i + j] == '=' && i + 4 == n && j >= 2) {
                                pad++;
                                v <<= 6;
                                continue;
                        }
                        if (!c || pad) {
                                free(o);
                                return NULL;
                        }
                        v = (v << 6) | (uint32_t)(c - b64t);
                }
                o[k++] = (unsigned char)(v >> 16);
                if (pad < 2)
                        o[k++] = (unsigned char)(v >> 8);
                if (pad < 1)
                        o[k++] = (unsigned char)v;
        }
        o[k] = '\0';
        *outlen = k;
        return o;
}

/* ------------------------------------------------------------- encode */

/* A JSON string for UTF-8 bytes, {"b64": ...} for anything else. */
static json_t *
bytes_json(const char *p, size_t n)
{
        if (utf8_valid((const unsigned char *)p, n))
                return json_stringn(p, n);
        char *b = b64_encode((const unsigned char *)p, n);
        json_t *o = b ? json_pack("{s:s}", "b64", b) : NULL;
        free(b);
        return o;
}

char *
kinbox__hdrcodec_encode(const kinbox_header_t *hdr, size_t n, char *errstr,
                        size_t errstr_size)
{
        if (n > KINBOX__HDRS_MAX) {
                err(errstr, errstr_size, "%zu headers: at most %d are stored",
                    n, KINBOX__HDRS_MAX);
                return NULL;
        }
        json_t *a = json_array();
        if (!a)
                goto oom;
        for (size_t i = 0; i < n; i++) {
                if (!hdr[i].name) {
                        err(errstr, errstr_size, "header %zu has no name", i);
                        json_decref(a);
                        return NULL;
                }
                json_t *name = bytes_json(hdr[i].name, strlen(hdr[i].name));
                json_t *val = hdr[i].value
                                  ? bytes_json(hdr[i].value, hdr[i].size)
                                  : json_null();
                json_t *pair = json_array();
                /* the _new calls steal the references, also on failure */
                if (json_array_append_new(pair, name) ||
                    json_array_append_new(pair, val) ||
                    json_array_append_new(a, pair)) {
                        json_decref(a);
                        goto oom;
                }
        }
        char *s = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(a);
        if (!s)
                goto oom;
        return s;
oom:
        err(errstr, errstr_size, "out of memory encoding headers");
        return NULL;
}

/* ------------------------------------------------------------- decode */

/* A stored byte string: JSON string or {"b64": "..."}. */
static int
bytes_of(json_t *j, char **p, size_t *n)
{
        if (json_is_string(j)) {
                *n = json_string_length(j);
                *p = malloc(*n + 1);
                if (!*p)
                        return -1;
                memcpy(*p, json_string_value(j), *n + 1);
                return 0;
        }
        json_t *b = json_object_get(j, "b64");
        if (!json_is_object(j) || json_object_size(j) != 1 ||
            !json_is_string(b))
                return -1;
        *p =
            (char *)b64_decode(json_string_value(b), json_string_length(b), n);
        return *p ? 0 : -1;
}

static int
decode_pairs(json_t *root, kinbox__hdrs_t *out, char *errstr, size_t sz)
{
        size_t n = json_array_size(root);
        if (n > KINBOX__HDRS_MAX) {
                err(errstr, sz, "headers: %zu entries, at most %d", n,
                    KINBOX__HDRS_MAX);
                return -1;
        }
        for (size_t i = 0; i < n; i++) {
                json_t *e = json_array_get(root, i);
                if (!json_is_array(e) || json_array_size(e) != 2) {
                        err(errstr, sz,
                            "headers: entry %zu is not a [name, value] pair",
                            i);
                        return -1;
                }
                char *name = NULL, *value = NULL;
                size_t nl = 0, vl = 0;
                if (bytes_of(json_array_get(e, 0), &name, &nl)) {
                        err(errstr, sz,
                            "headers: entry %zu: the name is not a string or "
                            "{\"b64\": ...}",
                            i);
                        return -1;
                }
                json_t *v = json_array_get(e, 1);
                int bad = memchr(name, '\0', nl) != NULL;
                if (!bad && !json_is_null(v) && bytes_of(v, &value, &vl)) {
                        free(name);
                        err(errstr, sz,
                            "headers: entry %zu: the value is not a string, "
                            "null or {\"b64\": ...}",
                            i);
                        return -1;
                }
                if (bad) {
                        free(name);
                        err(errstr, sz,
                            "headers: entry %zu: the name holds a NUL byte",
                            i);
                        return -1;
                }
                int rc = kinbox__hdrs_add(out, name,
                                          json_is_null(v) ? NULL : value, vl);
                free(name);
                free(value);
                if (rc) {
                        err(errstr, sz, "out of memory decoding headers");
                        return -1;
                }
        }
        return 0;
}

/* --- the dead-letter form before 0005: [{"name": N, "value": V}], where
 * \u0000..\u00ff is the byte, not the code point. */

typedef struct lx {
        const char *p, *end;
} lx_t;

static void
lx_ws(lx_t *x)
{
        while (x->p < x->end && (*x->p == ' ' || *x->p == '\n' ||
                                 *x->p == '\t' || *x->p == '\r'))
                x->p++;
}

static bool
lx_is(lx_t *x, char c)
{
        lx_ws(x);
        if (x->p < x->end && *x->p == c) {
                x->p++;
                return true;
        }
        return false;
}

typedef struct sbuf {
        char *p;
        size_t n, cap;
} sbuf_t;

static int
sb_add(sbuf_t *b, const void *p, size_t n)
{
        if (b->n + n + 1 > b->cap) {
                size_t cap = b->cap ? b->cap * 2 : 32;
                while (cap < b->n + n + 1)
                        cap *= 2;
                char *q = realloc(b->p, cap);
                if (!q)
                        return -1;
                b->p = q;
                b->cap = cap;
        }
        memcpy(b->p + b->n, p, n);
        b->n += n;
        b->p[b->n] = '\0';
        return 0;
}

static int
hex4(const char *p, const char *end)
{
        if (end - p < 4)
                return -1;
        int v = 0;
        for (int i = 0; i < 4; i++) {
                char c = p[i];
                int d = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
                if (d < 0)
                        return -1;
                v = (v << 4) | d;
        }
        return v;
}

/* A legacy string into b (reset first). */
static int
lx_str(lx_t *x, sbuf_t *b)
{
        b->n = 0;
        if (sb_add(b, "", 0) || !lx_is(x, '"'))
                return -1;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        while (x->p < x->end && *x->p != '"') {
                if (*x->p != '\\') {
                        if (sb_add(b, x->p++, 1))
                                return -1;
                        continue;
                }
                if (++x->p >= x->end)
                        return -1;
                const char *k = *x->p ? strchr(from, *x->p) : NULL;
                if (k) {
                        x->p++;
                        if (sb_add(b, &to[k - from], 1))
                                return -1;
                        continue;
                }
                int v = *x->p == 'u' ? hex4(x->p + 1, x->end) : -1;
                if (v < 0)
                        return -1;
                x->p += 5;
                unsigned char u[3];
                size_t un = 1;
                if (v <= 0xff) {
                        u[0] = (unsigned char)v;
                } else if (v < 0x800) {
                        u[0] = (unsigned char)(0xC0 | (v >> 6));
                        u[1] = (unsigned char)(0x80 | (v & 0x3F));
                        un = 2;
                } else {
                        u[0] = (unsigned char)(0xE0 | (v >> 12));
                        u[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3F));
                        u[2] = (unsigned char)(0x80 | (v & 0x3F));
                        un = 3;
                }
                if (sb_add(b, u, un))
                        return -1;
        }
        if (x->p >= x->end)
                return -1;
        x->p++;
        return 0;
}

static int
decode_legacy(const char *json, size_t len, kinbox__hdrs_t *out, char *errstr,
              size_t sz)
{
        lx_t x = {json, json + len};
        sbuf_t k = {0}, name = {0}, value = {0};
        int rc = -1;
        if (!lx_is(&x, '['))
                goto bad;
        if (lx_is(&x, ']'))
                goto end;
        do {
                bool has_name = false, has_value = false;
                if (!lx_is(&x, '{'))
                        goto bad;
                do {
                        if (lx_str(&x, &k) || !lx_is(&x, ':'))
                                goto bad;
                        bool isname = !strcmp(k.p, "name");
                        bool isvalue = !strcmp(k.p, "value");
                        lx_ws(&x);
                        if (x.end - x.p >= 4 && !memcmp(x.p, "null", 4)) {
                                x.p += 4;
                                if (isname)
                                        goto bad;
                                if (isvalue)
                                        has_value = false;
                                continue;
                        }
                        sbuf_t *dst = isname ? &name : isvalue ? &value : &k;
                        if (lx_str(&x, dst))
                                goto bad;
                        has_name |= isname;
                        has_value |= isvalue;
                } while (lx_is(&x, ','));
                if (!lx_is(&x, '}') || !has_name ||
                    memchr(name.p, '\0', name.n))
                        goto bad;
                if (kinbox__hdrs_add(out, name.p, has_value ? value.p : NULL,
                                     has_value ? value.n : 0)) {
                        err(errstr, sz,
                            out->n >= KINBOX__HDRS_MAX
                                ? "headers: more than the maximum"
                                : "out of memory decoding headers");
                        goto end_err;
                }
        } while (lx_is(&x, ','));
        if (!lx_is(&x, ']'))
                goto bad;
        lx_ws(&x);
        if (x.p != x.end)
                goto bad;
end:
        rc = 0;
        goto end_err;
bad:
        err(errstr, sz,
            "headers: malformed stored list (byte %zu of the old "
            "dead-letter form)",
            (size_t)(x.p - json));
end_err:
        free(k.p);
        free(name.p);
        free(value.p);
        return rc;
}

int
kinbox__hdrcodec_decode(const char *json, size_t len, kinbox__hdrs_t *out,
                        char *errstr, size_t errstr_size)
{
        memset(out, 0, sizeof(*out));
        if (!json)
                return 0;
        lx_t x = {json, json + len};
        if (lx_is(&x, '[') && lx_is(&x, '{'))
                return decode_legacy(json, len, out, errstr, errstr_size);
        json_error_t je;
        json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
        if (!root) {
                err(errstr, errstr_size, "headers: not JSON (%s at byte %d)",
                    je.text, je.position);
                return -1;
        }
        int rc;
        if (!json_is_array(root)) {
                err(errstr, errstr_size, "headers: not a JSON array");
                rc = -1;
        } else {
                rc = decode_pairs(root, out, errstr, errstr_size);
        }
        json_decref(root);
        return rc;
}

/* ------------------------------------------------------------ display */

static int
show_bytes(sbuf_t *b, const char *s, size_t n)
{
        const unsigned char *u = (const unsigned char *)s;
        for (size_t i = 0; i < n;) {
                size_t l = utf8_seq(u + i, n - i);
                if (u[i] == '\\') {
                        if (sb_add(b, "\\\\", 2))
                                return -1;
                        i++;
                } else if (l && u[i] >= 0x20 && u[i] != 0x7f) {
                        if (sb_add(b, u + i, l))
                                return -1;
                        i += l;
                } else {
                        char x[5];
                        snprintf(x, sizeof(x), "\\x%02x", u[i]);
                        if (sb_add(b, x, 4))
                                return -1;
                        i++;
                }
        }
        return 0;
}

char *
kinbox__hdrcodec_display(const kinbox__hdrs_t *h, const char *sep)
{
        sbuf_t b = {0};
        int bad = sb_add(&b, "", 0);
        for (size_t i = 0; i < h->n && !bad; i++) {
                if (i)
                        bad |= sb_add(&b, sep, strlen(sep));
                bad |= show_bytes(&b, h->v[i].name, strlen(h->v[i].name));
                if (h->v[i].value) {
                        bad |= sb_add(&b, ": ", 2);
                        bad |= show_bytes(&b, h->v[i].value, h->v[i].size);
                }
        }
        if (bad) {
                free(b.p);
                return NULL;
        }
        return b.p;
}
