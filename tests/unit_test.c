/*
 * unit_test.c -- pure functions: configuration, message ids, URLs,
 * backoff, errors, JSON escaping. No services needed.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#include "db.h"
#include "internal.h"
#include "kafka.h"
#include "msgid.h"
#include "startpos.h"
#include "tracing.h"
#include "tx.h"
#include "outbox_int.h"
#include "consumer_int.h"
#include "relay_int.h"

Test(conf, defaults_and_set)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        cr_assert(eq(str, (char *)kinbox_conf_get(c, "batch.max"), "500"));
        cr_assert(eq(str, (char *)kinbox_conf_get(c, "message_id"),
                     "header:message_id"));
        cr_assert(eq(int, kinbox_conf_set(c, "batch.max", "64", e, sizeof(e)),
                     KINBOX_OK));
        cr_assert(eq(i64, kinbox__settings_of(c)->batch_max, 64));
        /* group.id defaults to the name */
        kinbox_conf_set(c, "name", "points", e, sizeof(e));
        cr_assert(eq(str, (char *)kinbox_conf_get(c, "group.id"), "points"));
        kinbox_conf_t *d = kinbox_conf_dup(c);
        kinbox_conf_set(c, "batch.max", "7", e, sizeof(e));
        cr_assert(eq(str, (char *)kinbox_conf_get(d, "batch.max"), "64"));
        kinbox_conf_destroy(d);
        kinbox_conf_destroy(c);
        kinbox_conf_destroy(NULL);
}

/* The typed settings: each type from the table's defaults, set values,
 * enum positions, group.id following name, a dup's own copy. */
Test(conf, settings_typed_fields)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        const kinbox__settings_t *s = kinbox__settings_of(c);
        cr_assert(eq(i64, s->batch_max, 500));
        cr_assert(eq(i64, s->inbox_retention, 14LL * 86400 * 1000));
        cr_assert(s->mysql_coalesce);
        cr_assert(s->relay_notify);
        cr_assert(not(s->dead_letter_hold_key));
        cr_assert(eq(str, (char *)s->message_id, "header:message_id"));
        cr_assert(eq(str, (char *)s->group_id, "kinbox"));
        cr_assert(eq(ptr, (void *)s->database_url, NULL));
        cr_assert(eq(int, s->log_level, KINBOX__LEVEL_INFO));
        cr_assert(eq(int, s->log_format, KINBOX__LOGFMT_TEXT));
        cr_assert(eq(int, s->relay_claim, KINBOX__CLAIM_LOCK));
        kinbox_conf_set(c, "log.level", "debug", e, sizeof(e));
        kinbox_conf_set(c, "log.format", "json", e, sizeof(e));
        kinbox_conf_set(c, "relay.claim", "lease", e, sizeof(e));
        kinbox_conf_set(c, "relay.notify", "off", e, sizeof(e));
        kinbox_conf_set(c, "name", "points", e, sizeof(e));
        cr_assert(eq(int, s->log_level, KINBOX__LEVEL_DEBUG));
        cr_assert(eq(int, s->log_format, KINBOX__LOGFMT_JSON));
        cr_assert(eq(int, s->relay_claim, KINBOX__CLAIM_LEASE));
        cr_assert(not(s->relay_notify));
        cr_assert(eq(str, (char *)s->group_id, "points"));
        kinbox_conf_set(c, "group.id", "g", e, sizeof(e));
        kinbox_conf_set(c, "name", "other", e, sizeof(e));
        cr_assert(eq(str, (char *)s->group_id, "g"));
        kinbox__log_t lg;
        kinbox__conf_logger(c, &lg);
        cr_assert(eq(int, lg.level, KINBOX_LOG_DEBUG));
        cr_assert(lg.json, "log.format json");
        kinbox_conf_t *d = kinbox_conf_dup(c);
        kinbox_conf_set(c, "relay.claim", "lock", e, sizeof(e));
        const kinbox__settings_t *ds = kinbox__settings_of(d);
        cr_assert(eq(int, ds->relay_claim, KINBOX__CLAIM_LEASE));
        cr_assert(eq(str, (char *)ds->group_id, "g"));
        cr_assert(eq(str, (char *)ds->name, "other"));
        cr_assert(ds->name != s->name, "the dup's strings are its own");
        kinbox_conf_destroy(c);
        kinbox_conf_destroy(d);
}

Test(conf, errors_name_the_key)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        cr_assert(eq(int, kinbox_conf_set(c, "batch.maxx", "1", e, sizeof(e)),
                     KINBOX_ERR_UNKNOWN_KEY));
        cr_assert(strstr(e, "batch.maxx") != NULL);
        cr_assert(eq(int, kinbox_conf_set(c, "batch.max", "0", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(strstr(e, "batch.max") != NULL && strstr(e, "range"));
        cr_assert(eq(int, kinbox_conf_set(c, "workers", "two", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(eq(int,
                     kinbox_conf_set(c, "message_id", "body", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(eq(int,
                     kinbox_conf_set(c, "log.format", "xml", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(
            eq(int,
               kinbox_conf_set(c, "inbox.retention", "2 weeks", e, sizeof(e)),
               KINBOX_ERR_INVALID));
        /* the old value is kept */
        cr_assert(eq(str, (char *)kinbox_conf_get(c, "batch.max"), "500"));
        kinbox_conf_destroy(c);
}

Test(conf, durations_and_kafka_passthrough)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        kinbox_conf_set(c, "inbox.retention", "14d", e, sizeof(e));
        cr_assert(eq(i64, kinbox__settings_of(c)->inbox_retention,
                     14LL * 86400 * 1000));
        kinbox_conf_set(c, "prune.interval", "1500ms", e, sizeof(e));
        cr_assert(eq(i64, kinbox__settings_of(c)->prune_interval, 1500));
        kinbox_conf_set(c, "prune.interval", "90", e, sizeof(e));
        cr_assert(eq(i64, kinbox__settings_of(c)->prune_interval, 90000));
        cr_assert(eq(
            int, kinbox_conf_set(c, "prune.interval", "250ms", e, sizeof(e)),
            KINBOX_ERR_INVALID));
        cr_assert(eq(
            int,
            kinbox_conf_set(c, "kafka.fetch.wait.max.ms", "5", e, sizeof(e)),
            KINBOX_OK));
        cr_assert(eq(
            str, (char *)kinbox_conf_get(c, "kafka.fetch.wait.max.ms"), "5"));
        cr_assert(kinbox_conf_get(c, "kafka.nope") == NULL);
        kinbox_conf_destroy(c);
}

Test(conf, kafka_property_refused_by_librdkafka)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        kinbox_conf_set(c, "database.url", "postgresql://x@127.0.0.1/x", e,
                        sizeof(e));
        kinbox_conf_set(c, "topics", "t", e, sizeof(e));
        kinbox_conf_set(c, "kafka.bootstrap.servers", "127.0.0.1:1", e,
                        sizeof(e));
        kinbox_conf_set(c, "kafka.no.such.property", "1", e, sizeof(e));
        kinbox_consumer_t *k = kinbox_consumer_new(c, e, sizeof(e));
        cr_assert(k == NULL);
        cr_assert(strstr(e, "kafka.no.such.property") != NULL, "%s", e);
        kinbox_conf_destroy(c); /* still ours on failure */
}

Test(conf, consumer_requires_topics_and_url)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        kinbox_consumer_t *k = kinbox_consumer_new(c, e, sizeof(e));
        cr_assert(k == NULL);
        cr_assert(strstr(e, "database.url") != NULL, "%s", e);
        kinbox_conf_set(c, "database.url", "oracle://x", e, sizeof(e));
        k = kinbox_consumer_new(c, e, sizeof(e));
        cr_assert(k == NULL);
        cr_assert(strstr(e, "unsupported scheme") != NULL, "%s", e);
        kinbox_conf_destroy(c);
}

Test(dburl, parse)
{
        kinbox__dburl_t u;
        char e[256];
        cr_assert(
            eq(int,
               kinbox__dburl_parse("mysql://app:s%40cret@db.local:3307/shop",
                                   &u, e, sizeof(e)),
               0));
        cr_assert(eq(int, u.backend, KINBOX_BACKEND_MYSQL));
        cr_assert(eq(str, u.user, "app"));
        cr_assert(eq(str, u.password, "s@cret"));
        cr_assert(eq(str, u.host, "db.local"));
        cr_assert(eq(int, u.port, 3307));
        cr_assert(eq(str, u.dbname, "shop"));
        kinbox__dburl_free(&u);
        cr_assert(
            eq(int,
               kinbox__dburl_parse("postgresql://[::1]:5433/a?sslmode=disable",
                                   &u, e, sizeof(e)),
               0));
        cr_assert(eq(str, u.host, "::1"));
        cr_assert(eq(int, u.port, 5433));
        cr_assert(eq(str, u.params, "sslmode=disable"));
        kinbox__dburl_free(&u);
        cr_assert(
            eq(int, kinbox__dburl_parse("mysql://h:99999/x", &u, e, sizeof(e)),
               -1));
}

/* A message view with a real librdkafka header list. */
static kinbox__msgview_t *
view(const char *payload, const char *key, const char *hname, const char *hval,
     size_t hlen)
{
        kinbox__msgview_t *m = calloc(1, sizeof(*m));
        m->topic = "orders";
        m->partition = 3;
        m->offset = 42;
        m->payload = payload;
        m->len = payload ? strlen(payload) : 0;
        m->key = key;
        m->key_len = key ? strlen(key) : 0;
        if (hname) {
                rd_kafka_headers_t *h = rd_kafka_headers_new(1);
                rd_kafka_header_add(h, hname, -1, hval, (ssize_t)hlen);
                m->headers = h;
        }
        return m;
}

static void
free_msg(kinbox__msgview_t *m)
{
        if (m->headers)
                rd_kafka_headers_destroy((rd_kafka_headers_t *)m->headers);
        free(m);
}

Test(msgid, sources)
{
        char why[256];
        kinbox__msgview_t *m =
            view("{\"a\":{\"id\":\"x-1\",\"n\":7},\"b/c\":\"s\"}", "k-9",
                 "message_id", "h-5", 3);
        char *id =
            kinbox__msgid_extract("header:message_id", m, why, sizeof(why));
        cr_assert(eq(str, id, "h-5"));
        free(id);
        id = kinbox__msgid_extract("key", m, why, sizeof(why));
        cr_assert(eq(str, id, "k-9"));
        free(id);
        id = kinbox__msgid_extract("json:/a/id", m, why, sizeof(why));
        cr_assert(eq(str, id, "x-1"));
        free(id);
        id = kinbox__msgid_extract("json:/a/n", m, why, sizeof(why));
        cr_assert(eq(str, id, "7"));
        free(id);
        id = kinbox__msgid_extract("json:/b~1c", m, why, sizeof(why));
        cr_assert(eq(str, id, "s"));
        free(id);
        id = kinbox__msgid_extract("coords", m, why, sizeof(why));
        cr_assert(eq(str, id, "orders/3/42"));
        free(id);
        id = kinbox__msgid_extract("json:/a/missing", m, why, sizeof(why));
        cr_assert(id == NULL);
        cr_assert(strstr(why, "/a/missing") != NULL);
        id = kinbox__msgid_extract("header:other", m, why, sizeof(why));
        cr_assert(id == NULL);
        cr_assert(eq(str, why, "no header \"other\""));
        free_msg(m);
}

Test(msgid, bad_ids_are_refused)
{
        char why[256];
        char big[300];
        memset(big, 'x', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        kinbox__msgview_t *m =
            view("not json", NULL, "message_id", big, strlen(big));
        cr_assert(kinbox__msgid_extract("header:message_id", m, why,
                                        sizeof(why)) == NULL);
        cr_assert(strstr(why, "longer than 255") != NULL, "%s", why);
        cr_assert(kinbox__msgid_extract("key", m, why, sizeof(why)) == NULL);
        cr_assert(eq(str, why, "message has no key"));
        cr_assert(kinbox__msgid_extract("json:/id", m, why, sizeof(why)) ==
                  NULL);
        cr_assert(strstr(why, "not valid JSON") != NULL);
        free_msg(m);
        m = view("{}", NULL, "message_id", "a\xff", 2);
        cr_assert(kinbox__msgid_extract("header:message_id", m, why,
                                        sizeof(why)) == NULL);
        cr_assert(strstr(why, "UTF-8") != NULL);
        free_msg(m);
        m = view("{}", NULL, "message_id", "", 0);
        cr_assert(kinbox__msgid_extract("header:message_id", m, why,
                                        sizeof(why)) == NULL);
        cr_assert(strstr(why, "empty") != NULL);
        free_msg(m);
}

Test(util, backoff_full_jitter_bounds)
{
        for (int attempt = 0; attempt < 20; attempt++)
                for (int i = 0; i < 200; i++) {
                        int64_t d = kinbox__backoff_ms(attempt, 100, 5000);
                        int64_t ceil = 100LL << (attempt < 10 ? attempt : 10);
                        if (ceil > 5000)
                                ceil = 5000;
                        cr_assert(ge(i64, d, 1));
                        cr_assert(le(i64, d, ceil));
                }
}

Test(util, errors_have_names)
{
        cr_assert(eq(str, (char *)kinbox_err_name(KINBOX_ERR_DUPLICATE),
                     "KINBOX_ERR_DUPLICATE"));
        cr_assert(
            eq(str, (char *)kinbox_err_name(KINBOX_OK), "KINBOX_ERR_OK"));
        cr_assert(eq(str, (char *)kinbox_err_name((kinbox_err_t)-999),
                     "KINBOX_ERR_?"));
        cr_assert(eq(str, (char *)kinbox_strerror(KINBOX_ERR_COMMIT_UNKNOWN),
                     "commit outcome unknown"));
        cr_assert(eq(str, (char *)kinbox_version(), "0.1.0"));
}

Test(util, json_escaping)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_json_str(&b, "a\"b\\c\n\x01\xff\xc3\xa9", 10);
        cr_assert(
            eq(str, b.p, "\"a\\\"b\\\\c\\u000a\\u0001\\u00ff\xc3\xa9\""));
        kinbox__buf_free(&b);
}

/* A suspect from a server's description of a failing row: the first row
 * with an owner whose key is a whole field; a key that is only part of a
 * field, or a row without an owner, names no one. */
Test(db, row_suspect_matches_whole_fields)
{
        const char *keys[] = {"x", "o-1", "o-12", "5000000"};
        int tags[] = {KINBOX__TAG_GROUP | 0, 3, 7, KINBOX__TAG_GROUP | 0};
        kinbox__attr_t at = {
            .hint_keys = keys, .hint_tags = tags, .hint_n = 4};
        kinbox__db_t db = {.attr = &at};
        cr_assert(eq(int,
                     kinbox__db_row_suspect(
                         &db, "(11, 42, o-12, ORDER_REWARD, 5000000, "
                              "2026-12-02 01:49:30+00)."),
                     1 + 7));
        cr_assert(eq(int, kinbox__db_row_suspect(&db, "(o-1)."), 1 + 3));
        cr_assert(eq(int, kinbox__db_row_suspect(&db, "(2, o-1, 3)"), 1 + 3));
        /* "x" is in a field but has no owner; o-1 only inside o-123. */
        cr_assert(eq(int, kinbox__db_row_suspect(&db, "(x, o-123, xo-1)"), 0));
        cr_assert(eq(int, kinbox__db_row_suspect(&db, "no row"), 0));
        cr_assert(eq(int, kinbox__db_row_suspect(&db, NULL), 0));
        at.hint_n = 0;
        cr_assert(eq(int, kinbox__db_row_suspect(&db, "(o-1)"), 0));
}

/* ---- W3C trace context (traceparent, version 00) ---- */

static kinbox_err_t
tp_parse(const char *s, kinbox_trace_t *t)
{
        return kinbox_trace_parse(s, strlen(s), t);
}

Test(trace, parses_and_formats_the_spec_example)
{
        const char *v =
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        kinbox_trace_t t;
        cr_assert(eq(int, tp_parse(v, &t), KINBOX_OK));
        char id[33], span[17], back[KINBOX_TRACEPARENT_LEN + 1];
        kinbox_trace_id_hex(&t, id);
        kinbox_trace_span_hex(&t, span);
        cr_assert(eq(str, id, "4bf92f3577b34da6a3ce929d0e0e4736"));
        cr_assert(eq(str, span, "00f067aa0ba902b7"));
        cr_assert(eq(u8, t.flags, 1));
        kinbox_trace_format(&t, back);
        cr_assert(eq(str, back, (char *)v));
        /* Not sampled. */
        cr_assert(eq(int,
                     tp_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-"
                              "00f067aa0ba902b7-00",
                              &t),
                     KINBOX_OK));
        cr_assert(eq(u8, t.flags, 0));
}

Test(trace, refuses_what_the_spec_forbids)
{
        static const char *bad[] = {
            "", /* empty */
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        };
        kinbox_trace_t t;
        memset(&t, 0x5a, sizeof(t));
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                cr_assert(eq(int, tp_parse(bad[i], &t), KINBOX_ERR_INVALID),
                          "accepted \"%s\"", bad[i]);
        cr_assert(
            eq(int, kinbox_trace_parse(NULL, 55, &t), KINBOX_ERR_INVALID));
        /* Untouched on error. */
        cr_assert(eq(u8, t.flags, 0x5a));
        /* Bytes, not a C string: a NUL inside is just a bad character. */
        char nul[KINBOX_TRACEPARENT_LEN] =
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0";
        cr_assert(eq(int, kinbox_trace_parse(nul, sizeof(nul), &t),
                     KINBOX_ERR_INVALID));
}

/* Two traceparent headers make the carrier invalid (W3C Trace Context):
 * the message has no context, whichever comes last; one is read. */
Test(trace, two_traceparents_are_ignored)
{
        static const char a[] =
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        static const char b[] =
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        kinbox_header_t h[3] = {{"traceparent", a, sizeof(a) - 1},
                                {"other", "x", 1},
                                {"traceparent", b, sizeof(b) - 1}};
        kinbox__msg_parts_t parts = {.id = "m",
                                     .topic = "t",
                                     .timestamp = -1,
                                     .headers = h,
                                     .nheaders = 3};
        kinbox_msg_t *m = kinbox__msg_from_parts(&parts);
        cr_assert(m != NULL);
        kinbox_trace_t t;
        cr_assert(eq(int, kinbox_msg_trace(m, &t), KINBOX_ERR_NOT_FOUND),
                  "two traceparent headers: one of them was taken");
        kinbox__msg_destroy(m);

        parts.nheaders = 2;
        m = kinbox__msg_from_parts(&parts);
        cr_assert(eq(int, kinbox_msg_trace(m, &t), KINBOX_OK));
        char back[KINBOX_TRACEPARENT_LEN + 1];
        kinbox_trace_format(&t, back);
        cr_assert(eq(str, back, (char *)a));

        /* An outbox row written with two: neither is its parent; it is
         * stored with the one context of the message being handled. */
        kinbox_outbox_msg_t row = {.destination = "d",
                                   .idem_key = "k",
                                   .headers = h,
                                   .header_count = 3};
        kinbox__outbox_trace_t ot;
        const kinbox_outbox_msg_t *out =
            kinbox__outbox_trace_begin(&ot, &row, m);
        int n = 0;
        for (size_t i = 0; i < out->header_count; i++)
                if (!strcmp(out->headers[i].name, "traceparent")) {
                        n++;
                        cr_assert(eq(int, (int)out->headers[i].size,
                                     KINBOX_TRACEPARENT_LEN));
                        cr_assert(eq(int,
                                     memcmp(out->headers[i].value, a,
                                            KINBOX_TRACEPARENT_LEN),
                                     0));
                }
        cr_assert(eq(int, n, 1), "the stored row has %d traceparents", n);
        cr_assert(eq(sz, out->header_count, 2));
        kinbox__outbox_trace_end(&ot, KINBOX_OK, 1);
        kinbox__msg_destroy(m);
}

Test(trace, new_and_child_ids)
{
        kinbox_trace_t a, b, c;
        kinbox_trace_new(&a);
        kinbox_trace_new(&b);
        cr_assert(eq(u8, a.flags, 1));
        cr_assert(memcmp(a.trace_id, b.trace_id, 16) != 0,
                  "two new traces share an id");
        kinbox_trace_child(&a, &c);
        cr_assert(memcmp(a.trace_id, c.trace_id, 16) == 0);
        cr_assert(memcmp(a.span_id, c.span_id, 8) != 0);
        cr_assert(eq(u8, c.flags, a.flags));
        /* What we format, we parse back. */
        char buf[KINBOX_TRACEPARENT_LEN + 1];
        kinbox_header_t h;
        kinbox_trace_header(&c, buf, &h);
        cr_assert(eq(str, (char *)h.name, "traceparent"));
        cr_assert(eq(sz, h.size, (size_t)KINBOX_TRACEPARENT_LEN));
        kinbox_trace_t d;
        cr_assert(eq(int, kinbox_trace_parse(h.value, h.size, &d), KINBOX_OK));
        cr_assert(memcmp(&c, &d, sizeof(c)) == 0);
        /* In place. */
        kinbox_trace_child(&d, &d);
        cr_assert(memcmp(d.trace_id, c.trace_id, 16) == 0);
        cr_assert(memcmp(d.span_id, c.span_id, 8) != 0);
}

/* Span attribute strings: in the span's own buffer while they fit, on the
 * heap beyond (freed by end, the exporter off: nothing queued). */
Test(trace, span_attribute_strings)
{
        kinbox__span_t sp;
        kinbox__span_start(&sp, "x", KINBOX__SPAN_INTERNAL, NULL);
        char big[1000];
        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        kinbox__span_str(&sp, "a", "short");
        kinbox__span_str(&sp, "b", big);
        kinbox__span_strn(&sp, "c", "tail-ignored", 4);
        kinbox__span_int(&sp, "d", -7);
        cr_assert(eq(int, sp.nattrs, 4));
        cr_assert(eq(str, sp.attrs[0].s, "short"));
        cr_assert(not(sp.attrs[0].heap));
        cr_assert(sp.attrs[1].heap);
        cr_assert(eq(sz, strlen(sp.attrs[1].s), sizeof(big) - 1));
        cr_assert(eq(str, sp.attrs[2].s, "tail"));
        cr_assert(eq(i64, sp.attrs[3].i, -7));
        for (int i = 0; i < 20; i++)
                kinbox__span_int(&sp, "more", i);
        cr_assert(eq(int, sp.nattrs, KINBOX__SPAN_ATTRS));
        kinbox__span_end(&sp);
        cr_assert(eq(int, sp.nattrs, 0));
}

/* tracing.sample.ratio: 0 samples no new trace, 1 every one, 0.25 about a
 * quarter; a bad ratio is refused naming the key. */
static int
sampled_of(const char *ratio, int n)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        cr_assert(eq(int,
                     kinbox_conf_set(c, "tracing.endpoint",
                                     "http://127.0.0.1:9", e, sizeof(e)),
                     KINBOX_OK));
        cr_assert(
            eq(int,
               kinbox_conf_set(c, "tracing.sample.ratio", ratio, e, sizeof(e)),
               KINBOX_OK));
        bool on = false;
        cr_assert(eq(int, kinbox__tracing_acquire(c, &on, e, sizeof(e)), 0),
                  "%s", e);
        cr_assert(on);
        int k = 0;
        for (int i = 0; i < n; i++)
                k += kinbox__tracing_sample_root();
        kinbox__tracing_release(on);
        kinbox_conf_destroy(c);
        return k;
}

Test(trace, sample_ratio)
{
        cr_assert(eq(int, sampled_of("0", 1000), 0));
        cr_assert(eq(int, sampled_of("1", 1000), 1000));
        int q = sampled_of("0.25", 20000);
        cr_assert(q > 4000 && q < 6000, "0.25 sampled %d of 20000", q);
        /* No exporter: nothing is sampled. */
        cr_assert(not(kinbox__tracing_sample_root()));
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        kinbox_conf_set(c, "tracing.endpoint", "http://127.0.0.1:9", e,
                        sizeof(e));
        kinbox_conf_set(c, "tracing.sample.ratio", "1.5", e, sizeof(e));
        bool on = true;
        cr_assert(eq(int, kinbox__tracing_acquire(c, &on, e, sizeof(e)), -1));
        cr_assert(not(on));
        cr_assert(strstr(e, "tracing.sample.ratio") != NULL, "%s", e);
        kinbox_conf_destroy(c);
}

/* The one start-position rule (docs/failures.md, "Start positions"): W the
 * DB watermark, C Kafka's committed offset, [L, H) the log; -1 none. */
Test(startpos, classify_every_case)
{
        cr_assert(eq(int, kinbox_startpos_classify(-1, -1, 0, 10),
                     KINBOX_STARTPOS_NEW));
        cr_assert(eq(int, kinbox_startpos_classify(-1, 5, 0, 10),
                     KINBOX_STARTPOS_UNKNOWN_GROUP));
        cr_assert(eq(int, kinbox_startpos_classify(5, -1, 0, 10),
                     KINBOX_STARTPOS_WATERMARK));
        cr_assert(eq(int, kinbox_startpos_classify(5, 5, 0, 10),
                     KINBOX_STARTPOS_WATERMARK));
        cr_assert(eq(int, kinbox_startpos_classify(10, 10, 0, 10),
                     KINBOX_STARTPOS_WATERMARK));
        cr_assert(eq(int, kinbox_startpos_classify(5, 3, 0, 10),
                     KINBOX_STARTPOS_BEHIND));
        cr_assert(eq(int, kinbox_startpos_classify(5, 7, 0, 10),
                     KINBOX_STARTPOS_COMMITTED_AHEAD));
        cr_assert(eq(int, kinbox_startpos_classify(11, 4, 0, 10),
                     KINBOX_STARTPOS_PAST_END));
        cr_assert(eq(int, kinbox_startpos_classify(3, 3, 4, 10),
                     KINBOX_STARTPOS_BEFORE_START));
        /* The log's range unknown: not checked. */
        cr_assert(eq(int, kinbox_startpos_classify(99, 99, -1, -1),
                     KINBOX_STARTPOS_WATERMARK));
        for (int v = 0; v <= KINBOX_STARTPOS_INCARNATION; v++)
                cr_assert(eq(int, kinbox_startpos_refused(v) != 0,
                             v >= KINBOX_STARTPOS_UNKNOWN_GROUP));
        cr_assert(eq(str,
                     (char *)kinbox_startpos_name(KINBOX_STARTPOS_INCARNATION),
                     "incarnation"));
}

/* The identity stored with a watermark tells a missing key from an empty
 * one and where the key ends. */
Test(startpos, record_hash)
{
        uint64_t a = kinbox__record_hash("ab", 2, "c", 1);
        cr_assert(a != kinbox__record_hash("a", 1, "bc", 2));
        cr_assert(kinbox__record_hash(NULL, 0, "x", 1) !=
                  kinbox__record_hash("", 0, "x", 1));
        cr_assert(eq(u64, a, kinbox__record_hash("ab", 2, "c", 1)));
}

/* ---- the librdkafka configuration of each handle kinbox makes: kinbox's
 * defaults, the user's kafka.* over them, and over those the settings the
 * guarantees depend on. */

/* Each "key=value" of the space-separated list s in turn: fn(key, value,
 * arg). */
static void
rk_pairs(const char *s, void (*fn)(const char *, const char *, void *),
         void *arg)
{
        while (*s) {
                size_t n = strcspn(s, " ");
                char t[256];
                cr_assert(n > 0 && n < sizeof(t), "%s", s);
                memcpy(t, s, n);
                t[n] = '\0';
                char *eq = strchr(t, '=');
                cr_assert(eq != NULL, "%s", t);
                *eq = '\0';
                fn(t, eq + 1, arg);
                s += n + strspn(s + n, " ");
        }
}

static void
rk_set(const char *k, const char *v, void *c)
{
        char e[256];
        cr_assert(eq(int, kinbox_conf_set(c, k, v, e, sizeof(e)), KINBOX_OK),
                  "%s", e);
}

/* A consumer's configuration (the settings every case needs), then the
 * key=value pairs of kv. */
static kinbox_conf_t *
rk_conf(const char *kv)
{
        kinbox_conf_t *c = kinbox_conf_new();
        rk_pairs("name=c1 database.url=postgresql://x@127.0.0.1/x topics=t "
                 "kafka.bootstrap.servers=127.0.0.1:1",
                 rk_set, c);
        rk_pairs(kv, rk_set, c);
        return c;
}

static void
rk_get(const char *k, const char *want, void *rc)
{
        char v[512] = "";
        size_t n = sizeof(v);
        rd_kafka_conf_res_t r = rd_kafka_conf_get(rc, k, v, &n);
        if (!*want) {
                cr_assert(r != RD_KAFKA_CONF_OK || !*v, "%s: %s", k, v);
                return;
        }
        cr_assert(eq(int, r, RD_KAFKA_CONF_OK), "%s", k);
        cr_assert(eq(str, v, (char *)want), "%s", k);
}

/* Each key=value of want as rc has it ("key=": not set). */
static void
rk_expect(const rd_kafka_conf_t *rc, const char *want)
{
        rk_pairs(want, rk_get, (void *)rc);
}

Test(kafkaconf, consumer)
{
        kinbox_conf_t *c =
            rk_conf("group.id=g1 kafka.queued.min.messages=1000 "
                    "kafka.session.timeout.ms=6000 "
                    "kafka.enable.auto.offset.store=true "
                    "kafka.enable.partition.eof=true");
        char e[256];
        kinbox_consumer_t *k = kinbox_consumer_new(c, e, sizeof(e));
        cr_assert(k != NULL, "%s", e);
        rk_expect(rd_kafka_conf(k->rk),
                  "group.id=g1 bootstrap.servers=127.0.0.1:1 "
                  "auto.offset.reset=smallest "
                  "topic.metadata.refresh.interval.ms=30000 "
                  "queued.max.messages.kbytes=16384 queued.min.messages=1000 "
                  "session.timeout.ms=6000 enable.auto.offset.store=false "
                  "enable.partition.eof=false");
        kinbox_consumer_destroy(k);
}

Test(kafkaconf, relay_producer)
{
        kinbox_conf_t *c = rk_conf("kafka.compression.type=lz4 "
                                   "kafka.enable.idempotence=false "
                                   "kafka.message.timeout.ms=20000");
        char e[256];
        kinbox_relay_t *r = kinbox_relay_new(c, e, sizeof(e));
        cr_assert(r != NULL, "%s", e);
        rk_expect(r->rkconf, "bootstrap.servers=127.0.0.1:1 linger.ms=1 "
                             "partitioner=murmur2_random "
                             "topic.metadata.refresh.interval.ms=10000 "
                             "compression.type=lz4 enable.idempotence=true "
                             "enable.gapless.guarantee=true "
                             "message.timeout.ms=0");
        cr_assert(eq(int, r->compressed, 1));
        kinbox_relay_destroy(r);
        /* The user's linger, partitioner and metadata refresh win. */
        c = rk_conf("kafka.queue.buffering.max.ms=20 "
                    "kafka.partitioner=consistent_random "
                    "kafka.topic.metadata.refresh.interval.ms=60000");
        r = kinbox_relay_new(c, e, sizeof(e));
        cr_assert(r != NULL, "%s", e);
        rk_expect(r->rkconf, "linger.ms=20 partitioner=consistent_random "
                             "topic.metadata.refresh.interval.ms=60000");
        cr_assert(eq(int, r->compressed, 0));
        kinbox_relay_destroy(r);
}

Test(kafkaconf, operator_client)
{
        kinbox_conf_t *c = rk_conf("kafka.group.id=theirs "
                                   "kafka.group.instance.id=inst "
                                   "kafka.session.timeout.ms=6000");
        char e[256];
        /* Never the consumers' group, nor their static membership. */
        kinbox_kafka_t *kk = kinbox_kafka_new(c, NULL, e, sizeof(e));
        cr_assert(kk != NULL, "%s", e);
        const rd_kafka_conf_t *rc =
            rd_kafka_conf((rd_kafka_t *)kinbox__kafka_handle(kk));
        rk_expect(rc, "bootstrap.servers=127.0.0.1:1 group.id= "
                      "group.instance.id= session.timeout.ms=6000");
        kinbox_kafka_destroy(kk);
        /* The caller's extra settings go over the user's. */
        const char *const extra[] = {"group.id", "ops", "session.timeout.ms",
                                     "7000", NULL};
        kk = kinbox_kafka_new(c, extra, e, sizeof(e));
        cr_assert(kk != NULL, "%s", e);
        rc = rd_kafka_conf((rd_kafka_t *)kinbox__kafka_handle(kk));
        rk_expect(rc, "group.id=ops session.timeout.ms=7000");
        kinbox_kafka_destroy(kk);
        kinbox_conf_destroy(c);
}

/* The log's range of many partitions comes back in one pass (a request per
 * leader, not two round trips per partition): 48 partitions over brokers
 * answering after 150 ms each take about two round trips, where one
 * partition after another took 48 x 2. A partition the topic does not
 * have is unknown, the others not. In-process mock cluster. */
Test(kafka, log_ranges_in_one_pass, .timeout = 60)
{
        char e[512];
        rd_kafka_conf_t *mconf = rd_kafka_conf_new();
        rd_kafka_conf_set(mconf, "log_level", "0", e, sizeof(e));
        rd_kafka_t *mrk = rd_kafka_new(RD_KAFKA_PRODUCER, mconf, e, sizeof(e));
        cr_assert(mrk != NULL, "%s", e);
        rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mrk, 3);
        cr_assert(mc != NULL);
        const char *bs = rd_kafka_mock_cluster_bootstraps(mc);
        const int n = 48;
        cr_assert(eq(int, rd_kafka_mock_topic_create(mc, "lr", n, 1), 0));
        rd_kafka_conf_t *pc = rd_kafka_conf_new();
        rd_kafka_conf_set(pc, "bootstrap.servers", bs, e, sizeof(e));
        rd_kafka_t *prod = rd_kafka_new(RD_KAFKA_PRODUCER, pc, e, sizeof(e));
        cr_assert(prod != NULL, "%s", e);
        for (int p = 0; p < n; p++)
                for (int k = 0; k < p % 4; k++)
                        cr_assert(
                            eq(int,
                               rd_kafka_producev(prod, RD_KAFKA_V_TOPIC("lr"),
                                                 RD_KAFKA_V_PARTITION(p),
                                                 RD_KAFKA_V_VALUE("x", 1),
                                                 RD_KAFKA_V_END),
                               0));
        cr_assert(eq(int, rd_kafka_flush(prod, 10000), 0));
        rd_kafka_destroy(prod);
        rd_kafka_conf_t *cc = rd_kafka_conf_new();
        rd_kafka_conf_set(cc, "bootstrap.servers", bs, e, sizeof(e));
        rd_kafka_conf_set(cc, "log_level", "0", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, cc, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        const struct rd_kafka_metadata *md = NULL;
        cr_assert(eq(int, rd_kafka_metadata(rk, 1, NULL, &md, 10000), 0));
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_partition_list_t *pl =
            rd_kafka_topic_partition_list_new(n + 1);
        for (int p = 0; p < n; p++)
                rd_kafka_topic_partition_list_add(pl, "lr", p);
        rd_kafka_topic_partition_list_add(pl, "lr", 99); /* no such one */
        for (int id = 1; id <= 3; id++)
                rd_kafka_mock_broker_set_rtt(mc, id, 150);
        int64_t lo[49], hi[49];
        rd_kafka_resp_err_t err[49];
        int64_t t0 = kinbox__now_ms();
        kinbox__log_ranges(rk, pl, lo, hi, err, 10000);
        int64_t took = kinbox__now_ms() - t0;
        for (int p = 0; p < n; p++) {
                cr_assert(eq(int, err[p], 0), "partition %d: %s", p,
                          rd_kafka_err2str(err[p]));
                cr_assert(eq(i64, lo[p], 0), "partition %d", p);
                cr_assert(eq(i64, hi[p], p % 4), "partition %d", p);
        }
        cr_assert(err[n] != 0);
        cr_assert(eq(i64, lo[n], -1));
        cr_assert(eq(i64, hi[n], -1));
        /* One partition after another: at least 48 x 2 x 150 ms. */
        cr_assert(lt(i64, took, 3000), "took %lld ms", (long long)took);
        rd_kafka_topic_partition_list_destroy(pl);
        rd_kafka_destroy(rk);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(mrk);
}
