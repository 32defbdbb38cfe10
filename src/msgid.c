/*
 * msgid.c -- message id extraction.
 */
#include "msgid.h"
#include "internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* True for valid UTF-8 without NUL bytes. */
static bool
valid_text(const unsigned char *s, size_t n)
{
        for (size_t i = 0; i < n;) {
                unsigned char c = s[i];
                size_t need;
                if (c == 0)
                        return false;
                if (c < 0x80)
                        need = 1;
                else if ((c & 0xE0) == 0xC0 && c >= 0xC2)
                        need = 2;
                else if ((c & 0xF0) == 0xE0)
                        need = 3;
                else if ((c & 0xF8) == 0xF0 && c <= 0xF4)
                        need = 4;
                else
                        return false;
                if (i + need > n)
                        return false;
                for (size_t k = 1; k < need; k++)
                        if ((s[i + k] & 0xC0) != 0x80)
                                return false;
                i += need;
        }
        return true;
}

static char *
check_id(const void *p, size_t n, const char *what, char *why, size_t wsz)
{
        if (!p || n == 0) {
                kinbox__errstr(why, wsz, "message id from %s is empty", what);
                return NULL;
        }
        if (n > KINBOX__MSGID_MAX) {
                kinbox__errstr(why, wsz,
                               "message id from %s is %zu bytes, longer than "
                               "%d",
                               what, n, KINBOX__MSGID_MAX);
                return NULL;
        }
        const char *nul = memchr(p, '\0', n);
        if (nul) {
                kinbox__errstr(why, wsz,
                               "message id from %s contains a NUL byte (at "
                               "byte %zu)",
                               what, (size_t)(nul - (const char *)p));
                return NULL;
        }
        if (!valid_text(p, n)) {
                kinbox__errstr(why, wsz,
                               "message id from %s is not valid UTF-8 text",
                               what);
                return NULL;
        }
        char *id = kinbox__strndup(p, n);
        if (!id)
                kinbox__errstr(why, wsz, "out of memory");
        return id;
}

char *
kinbox__json_pointer(const char *json, size_t len, const char *ptr, char *why,
                     size_t wsz)
{
        json_error_t jerr;
        json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
        if (!root) {
                kinbox__errstr(why, wsz,
                               "payload is not valid JSON (line %d: %s)",
                               jerr.line, jerr.text);
                return NULL;
        }
        json_t *cur = root;
        const char *p = ptr;
        char tok[256];
        while (*p == '/') {
                p++;
                size_t n = 0;
                while (*p && *p != '/' && n + 1 < sizeof(tok)) {
                        if (*p == '~' && p[1] == '0') {
                                tok[n++] = '~';
                                p += 2;
                        } else if (*p == '~' && p[1] == '1') {
                                tok[n++] = '/';
                                p += 2;
                        } else {
                                tok[n++] = *p++;
                        }
                }
                tok[n] = '\0';
                if (json_is_object(cur)) {
                        cur = json_object_get(cur, tok);
                } else if (json_is_array(cur)) {
                        char *end;
                        long idx = strtol(tok, &end, 10);
                        cur = (*tok && !*end && idx >= 0)
                                  ? json_array_get(cur, (size_t)idx)
                                  : NULL;
                } else {
                        cur = NULL;
                }
                if (!cur)
                        break;
        }
        char *out = NULL;
        if (!cur) {
                kinbox__errstr(why, wsz,
                               "JSON pointer %s not found in payload", ptr);
        } else if (json_is_string(cur)) {
                out = check_id(json_string_value(cur), json_string_length(cur),
                               ptr, why, wsz);
        } else if (json_is_integer(cur)) {
                char b[32];
                snprintf(b, sizeof(b), "%" JSON_INTEGER_FORMAT,
                         json_integer_value(cur));
                out = kinbox__strdup(b);
        } else {
                kinbox__errstr(why, wsz,
                               "JSON pointer %s is not a string or integer",
                               ptr);
        }
        json_decref(root);
        return out;
}

void
kinbox__msgview_of(const rd_kafka_message_t *rkm, kinbox__msgview_t *v)
{
        rd_kafka_headers_t *h = NULL;
        v->topic = rd_kafka_topic_name(rkm->rkt);
        v->partition = rkm->partition;
        v->offset = rkm->offset;
        v->key = rkm->key;
        v->key_len = rkm->key_len;
        v->payload = rkm->payload;
        v->len = rkm->len;
        /* rd_kafka_message_headers takes a non-const message. */
        if (rd_kafka_message_headers((rd_kafka_message_t *)rkm, &h))
                h = NULL;
        v->headers = h;
}

/* The value of header name: the only one, or (several) none picked. */
static kinbox__field_rc_t
field_header(const kinbox__msgview_t *m, const char *name, const char *what,
             kinbox__field_t *out, char *why, size_t wsz)
{
        if (!m->headers ||
            rd_kafka_header_get_last(m->headers, name, &out->v, &out->n)) {
                kinbox__errstr(why, wsz, "no header \"%s\"", name);
                return KINBOX__FIELD_NONE;
        }
        /* Repeated: which one the producer meant is unknown, and picking
         * one could apply a message twice or out of its key's order. */
        const void *v2;
        size_t n2, count = 1;
        while (!rd_kafka_header_get(m->headers, count, name, &v2, &n2))
                count++;
        if (count == 1)
                return KINBOX__FIELD_SET;
        out->v = NULL;
        out->n = 0;
        kinbox__errstr(why, wsz, "ambiguous %s: %zu \"%s\" headers", what,
                       count, name);
        return KINBOX__FIELD_AMBIGUOUS;
}

kinbox__field_rc_t
kinbox__msgfield_locate(const char *spec, const kinbox__msgview_t *m,
                        const char *what, kinbox__field_t *out, char *why,
                        size_t wsz)
{
        *out = (kinbox__field_t){0};
        if (!strncmp(spec, "header:", 7))
                return field_header(m, spec + 7, what, out, why, wsz);
        if (!strcmp(spec, "key")) {
                if (!m->key) {
                        kinbox__errstr(why, wsz, "message has no key");
                        return KINBOX__FIELD_NONE;
                }
                out->v = m->key;
                out->n = m->key_len;
                return KINBOX__FIELD_SET;
        }
        if (!strncmp(spec, "json:", 5)) {
                if (!m->payload) {
                        kinbox__errstr(why, wsz, "message has no payload");
                        return KINBOX__FIELD_NONE;
                }
                out->own = kinbox__json_pointer(m->payload, m->len, spec + 5,
                                                why, wsz);
        } else if (!strcmp(spec, "coords")) {
                char b[400];
                snprintf(b, sizeof(b), "%s/%" PRId32 "/%" PRId64, m->topic,
                         m->partition, m->offset);
                out->own = kinbox__strdup(b);
                if (!out->own)
                        kinbox__errstr(why, wsz, "out of memory");
        } else {
                kinbox__errstr(why, wsz, "unknown %s source \"%s\"", what,
                               spec);
                return KINBOX__FIELD_NONE;
        }
        if (!out->own)
                return KINBOX__FIELD_NONE;
        out->v = out->own;
        out->n = strlen(out->own);
        return KINBOX__FIELD_SET;
}

char *
kinbox__msgid_extract(const char *spec, const kinbox__msgview_t *m, char *why,
                      size_t wsz)
{
        kinbox__field_t f;
        if (kinbox__msgfield_locate(spec, m, "message id", &f, why, wsz) !=
            KINBOX__FIELD_SET)
                return NULL;
        if (f.own && strncmp(spec, "coords", 6))
                return f.own; /* json: taken as it is */
        const char *what = !strcmp(spec, "key") ? "key" : spec;
        char *id = check_id(f.v, f.n, what, why, wsz);
        free(f.own);
        return id;
}
