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

char *
kinbox__msgid_extract(const char *spec, const kinbox__msgview_t *m, char *why,
                      size_t wsz)
{
        if (!strncmp(spec, "header:", 7)) {
                const void *v = NULL;
                size_t n = 0;
                if (!m->headers ||
                    rd_kafka_header_get_last(m->headers, spec + 7, &v, &n)) {
                        kinbox__errstr(why, wsz, "no header \"%s\"", spec + 7);
                        return NULL;
                }
                /* Two id headers: which one the producer meant is unknown,
                 * and picking one could apply a message twice. */
                const void *v2;
                size_t n2;
                if (!rd_kafka_header_get(m->headers, 1, spec + 7, &v2, &n2)) {
                        size_t count = 2;
                        while (!rd_kafka_header_get(m->headers, count,
                                                    spec + 7, &v2, &n2))
                                count++;
                        kinbox__errstr(why, wsz,
                                       "ambiguous message id: %zu \"%s\" "
                                       "headers",
                                       count, spec + 7);
                        return NULL;
                }
                return check_id(v, n, spec, why, wsz);
        }
        if (!strcmp(spec, "key")) {
                if (!m->key) {
                        kinbox__errstr(why, wsz, "message has no key");
                        return NULL;
                }
                return check_id(m->key, m->key_len, "key", why, wsz);
        }
        if (!strncmp(spec, "json:", 5)) {
                if (!m->payload) {
                        kinbox__errstr(why, wsz, "message has no payload");
                        return NULL;
                }
                return kinbox__json_pointer(m->payload, m->len, spec + 5, why,
                                            wsz);
        }
        if (!strcmp(spec, "coords")) {
                char b[400];
                snprintf(b, sizeof(b), "%s/%" PRId32 "/%" PRId64, m->topic,
                         m->partition, m->offset);
                return check_id(b, strlen(b), "coords", why, wsz);
        }
        kinbox__errstr(why, wsz, "unknown message_id source \"%s\"", spec);
        return NULL;
}
