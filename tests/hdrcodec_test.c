/*
 * hdrcodec_test.c -- the stored header format, and message-id extraction
 * from odd headers. No services needed.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#include "hdrcodec.h"
#include "internal.h"
#include "msgid.h"

static bool
has(const char *hay, const char *needle)
{
        return hay && strstr(hay, needle) != NULL;
}

static void
roundtrip(const kinbox_header_t *in, size_t n)
{
        char e[200];
        char *s = kinbox__hdrcodec_encode(in, n, e, sizeof(e));
        cr_assert(s != NULL, "%s", e);
        kinbox__hdrs_t h;
        cr_assert(eq(int,
                     kinbox__hdrcodec_decode(s, strlen(s), &h, e, sizeof(e)),
                     0),
                  "%s: %s", s, e);
        cr_assert(eq(sz, h.n, n), "%s", s);
        for (size_t i = 0; i < n; i++) {
                cr_assert(eq(str, h.v[i].name, (char *)in[i].name));
                if (!in[i].value) {
                        cr_assert(h.v[i].value == NULL, "%zu: %s", i, s);
                        continue;
                }
                cr_assert(h.v[i].value != NULL, "%zu: %s", i, s);
                cr_assert(eq(sz, h.v[i].size, in[i].size), "%zu: %s", i, s);
                cr_assert(
                    eq(int, memcmp(h.v[i].value, in[i].value, in[i].size), 0),
                    "%zu: %s", i, s);
        }
        kinbox__hdrs_free(&h);
        free(s);
}

Test(hdrcodec, format_is_pairs)
{
        kinbox_header_t in[] = {{"a", "x", 1},
                                {"bin", "\xff\x00\x01", 3},
                                {"nul", NULL, 0},
                                {"empty", "", 0}};
        char *s = kinbox__hdrcodec_encode(in, 4, NULL, 0);
        cr_assert(eq(str, s,
                     "[[\"a\",\"x\"],[\"bin\",{\"b64\":\"/wAB\"}],"
                     "[\"nul\",null],[\"empty\",\"\"]]"));
        free(s);
        s = kinbox__hdrcodec_encode(NULL, 0, NULL, 0);
        cr_assert(eq(str, s, "[]"));
        free(s);
}

Test(hdrcodec, roundtrips)
{
        kinbox_header_t in[] = {
            {"text", "héllo wörld ☃ 𝄞", strlen("héllo wörld ☃ 𝄞")},
            {"latin1", "caf\xe9", 4},
            {"ff", "\xff", 1},
            {"nul-in-text", "a\0b", 3},
            {"controls", "\t\n\x01\x7f\"\\/", 8},
            {"null", NULL, 0},
            {"empty", "", 0},
            {"dup", "1", 1},
            {"dup", "2", 1},
            {"dup", NULL, 0},
            {"", "empty name", 10},
            {"n\xe9me", "non-UTF-8 name", 14},
            {"overlong", "\xc0\xaf", 2},
            {"surrogate", "\xed\xa0\x80", 3},
            {"truncated", "\xe2\x98", 2},
        };
        roundtrip(in, sizeof(in) / sizeof(in[0]));
        roundtrip(in, 0);
        /* every single byte value */
        static char bytes[256];
        static kinbox_header_t all[256];
        for (int i = 0; i < 256; i++) {
                bytes[i] = (char)i;
                all[i] = (kinbox_header_t){"b", &bytes[i], 1};
        }
        roundtrip(all, 256);
        kinbox_header_t whole = {"all", bytes, 256};
        roundtrip(&whole, 1);
}

Test(hdrcodec, huge_counts)
{
        size_t n = 20000;
        kinbox_header_t *in = calloc(n, sizeof(*in));
        for (size_t i = 0; i < n; i++)
                in[i] = (kinbox_header_t){i % 2 ? "x" : "y", "v", 1};
        roundtrip(in, n);
        free(in);
        /* more than the maximum: refused both ways */
        size_t big = KINBOX__HDRS_MAX + 1;
        in = calloc(big, sizeof(*in));
        for (size_t i = 0; i < big; i++)
                in[i] = (kinbox_header_t){"x", NULL, 0};
        char e[200];
        cr_assert(kinbox__hdrcodec_encode(in, big, e, sizeof(e)) == NULL);
        cr_assert(has(e, "at most"), "%s", e);
        free(in);
        size_t len = 2 + big * 11;
        char *json = malloc(len + 1), *p = json;
        *p++ = '[';
        for (size_t i = 0; i < big; i++) {
                memcpy(p, i ? ",[\"x\",null]" : "[\"x\",null]", i ? 11 : 10);
                p += i ? 11 : 10;
        }
        *p++ = ']';
        kinbox__hdrs_t h;
        cr_assert(eq(int,
                     kinbox__hdrcodec_decode(json, (size_t)(p - json), &h, e,
                                             sizeof(e)),
                     -1));
        cr_assert(has(e, "at most"), "%s", e);
        kinbox__hdrs_free(&h);
        free(json);
}

Test(hdrcodec, malformed_rejected_with_a_reason)
{
        static const struct {
                const char *json, *why;
        } bad[] = {
            {"", "not JSON"},
            {"{", "not JSON"},
            {"{\"a\":1}", "not a JSON array"},
            {"[1]", "entry 0 is not a [name, value] pair"},
            {"[[\"a\"]]", "entry 0 is not a [name, value] pair"},
            {"[[\"a\",\"b\",\"c\"]]", "entry 0 is not a [name, value] pair"},
            {"[[1,\"b\"]]", "the name is not"},
            {"[[null,\"b\"]]", "the name is not"},
            {"[[\"a\",1]]", "the value is not"},
            {"[[\"a\",{\"b64\":\"!!!!\"}]]", "the value is not"},
            {"[[\"a\",{\"b64\":\"QQ\"}]]", "the value is not"},
            {"[[\"a\",{\"b64\":\"QQ==\",\"x\":1}]]", "the value is not"},
            {"[[\"a\",{\"hex\":\"00\"}]]", "the value is not"},
            {"[[\"a\\u0000b\",\"v\"]]", "NUL"},
            {"[[\"a\",\"b\"]] x", "not JSON"},
            {"[{\"name\":\"a\"", "malformed"},
            {"[{\"value\":\"a\"}]", "malformed"},
            {"[{\"name\":null}]", "malformed"},
            {"[{\"name\":\"a\",\"value\":\"\\u12\"}]", "malformed"},
            {"[{\"name\":\"a\"}] x", "malformed"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                kinbox__hdrs_t h;
                char e[200] = "";
                cr_assert(eq(int,
                             kinbox__hdrcodec_decode(bad[i].json,
                                                     strlen(bad[i].json), &h,
                                                     e, sizeof(e)),
                             -1),
                          "accepted %s", bad[i].json);
                cr_assert(has(e, bad[i].why), "%s: %s", bad[i].json, e);
                kinbox__hdrs_free(&h);
        }
}

/* Dead letters written before migration 0005: \u00XX is the byte. */
Test(hdrcodec, old_dead_letter_form)
{
        const char *old = "[{\"name\":\"a\",\"value\":\"x\\u00ffy\"},"
                          "{\"name\":\"n\",\"value\":null},"
                          "{\"value\":\"\",\"name\":\"e\"},"
                          "{\"name\":\"u\",\"value\":\"\\u0001é\"}]";
        kinbox__hdrs_t h;
        char e[200];
        cr_assert(
            eq(int,
               kinbox__hdrcodec_decode(old, strlen(old), &h, e, sizeof(e)), 0),
            "%s", e);
        cr_assert(eq(sz, h.n, 4));
        cr_assert(eq(sz, h.v[0].size, 3));
        cr_assert(eq(int, memcmp(h.v[0].value, "x\xffy", 3), 0));
        cr_assert(h.v[1].value == NULL);
        cr_assert(eq(str, h.v[2].name, "e"));
        cr_assert(eq(sz, h.v[2].size, 0));
        cr_assert(eq(str, h.v[3].value, "\x01é"));
        char *d = kinbox__hdrcodec_display(&h, "; ");
        cr_assert(eq(str, d, "a: x\\xffy; n; e: ; u: \\x01é"));
        free(d);
        kinbox__hdrs_free(&h);
        cr_assert(
            eq(int, kinbox__hdrcodec_decode(NULL, 0, &h, e, sizeof(e)), 0));
        cr_assert(eq(sz, h.n, 0));
}

Test(hdrcodec, display_uses_xNN)
{
        kinbox_header_t in[] = {{"k\xfe", "a\\b\xff\x00", 5}, {"z", NULL, 0}};
        char *s = kinbox__hdrcodec_encode(in, 2, NULL, 0);
        kinbox__hdrs_t h;
        cr_assert(
            eq(int, kinbox__hdrcodec_decode(s, strlen(s), &h, NULL, 0), 0));
        char *d = kinbox__hdrcodec_display(&h, "; ");
        cr_assert(eq(str, d, "k\\xfe: a\\\\b\\xff\\x00; z"));
        free(d);
        free(s);
        kinbox__hdrs_free(&h);
}

/* ---- message ids from odd headers ---- */

static char *
id_of(rd_kafka_headers_t *hs, char *why, size_t wsz)
{
        kinbox__msgview_t m = {.topic = "t", .headers = hs};
        return kinbox__msgid_extract("header:message_id", &m, why, wsz);
}

Test(msgid, two_id_headers_are_ambiguous)
{
        rd_kafka_headers_t *hs = rd_kafka_headers_new(4);
        rd_kafka_header_add(hs, "message_id", -1, "a", 1);
        rd_kafka_header_add(hs, "other", -1, "x", 1);
        rd_kafka_header_add(hs, "message_id", -1, "b", 1);
        char why[200] = "";
        cr_assert(id_of(hs, why, sizeof(why)) == NULL);
        cr_assert(has(why, "ambiguous message id: 2 \"message_id\" headers"),
                  "%s", why);
        /* even when both carry the same id */
        rd_kafka_headers_destroy(hs);
        hs = rd_kafka_headers_new(4);
        rd_kafka_header_add(hs, "message_id", -1, "a", 1);
        rd_kafka_header_add(hs, "message_id", -1, "a", 1);
        rd_kafka_header_add(hs, "message_id", -1, "a", 1);
        cr_assert(id_of(hs, why, sizeof(why)) == NULL);
        cr_assert(has(why, "3 \"message_id\" headers"), "%s", why);
        rd_kafka_headers_destroy(hs);
        hs = rd_kafka_headers_new(4);
        rd_kafka_header_add(hs, "message_id", -1, "a", 1);
        rd_kafka_header_add(hs, "message_idx", -1, "b", 1);
        char *id = id_of(hs, why, sizeof(why));
        cr_assert(eq(str, id, "a"));
        free(id);
        rd_kafka_headers_destroy(hs);
}

Test(msgid, nul_has_its_own_reason)
{
        rd_kafka_headers_t *hs = rd_kafka_headers_new(2);
        rd_kafka_header_add(hs, "message_id", -1, "ab\0cd", 5);
        char why[200] = "";
        cr_assert(id_of(hs, why, sizeof(why)) == NULL);
        cr_assert(has(why, "contains a NUL byte (at byte 2)"), "%s", why);
        cr_assert(has(why, "UTF-8") == false, "%s", why);
        rd_kafka_headers_destroy(hs);
        hs = rd_kafka_headers_new(2);
        rd_kafka_header_add(hs, "message_id", -1, "ab\xff", 3);
        cr_assert(id_of(hs, why, sizeof(why)) == NULL);
        cr_assert(has(why, "not valid UTF-8"), "%s", why);
        rd_kafka_headers_destroy(hs);
        /* and from a JSON pointer */
        const char *json = "{\"id\":\"x\\u0000y\"}";
        kinbox__msgview_t m = {
            .topic = "t", .payload = json, .len = strlen(json)};
        cr_assert(kinbox__msgid_extract("json:/id", &m, why, sizeof(why)) ==
                  NULL);
        cr_assert(has(why, "NUL byte"), "%s", why);
}
