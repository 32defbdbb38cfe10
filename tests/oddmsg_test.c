/*
 * oddmsg_test.c -- big and odd records in one stream, on both backends and
 * both brokers (oddmsg_test and oddmsg_test@kafka): 900 KB payloads, 1,000
 * headers, 64 KB keys, and every kind of bad message id, between ordinary
 * grants. What a user must see: the good ones applied once, each bad one a
 * dead letter at its first attempt with its own reason and its bytes kept
 * whole (payload, key, every header), and the stream never stuck.
 */
#include "harness.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BIG = 900 * 1024, KEY = 64 * 1024, NHDR = 1000 };

typedef struct rec {
        const char *id; /* NULL: no message_id header */
        size_t id_len;
        char *key; /* NULL: "k" */
        size_t key_len;
        char *payload;
        size_t payload_len;
        int extra_headers; /* h0..hN-1 = "v" */
} rec_t;

static void
produce(const char *topic, const rec_t *r, size_t n)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_conf_set(c, "enable.idempotence", "true", e, sizeof(e));
        if (!kt_real_kafka())
                rd_kafka_conf_set(c, "max.in.flight.requests.per.connection",
                                  "1", e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        for (size_t i = 0; i < n; i++) {
                rd_kafka_headers_t *h = rd_kafka_headers_new(8);
                for (int k = 0; k < r[i].extra_headers; k++) {
                        char name[16];
                        snprintf(name, sizeof(name), "h%d", k);
                        rd_kafka_header_add(h, name, -1, "v", 1);
                }
                if (r[i].id)
                        rd_kafka_header_add(h, "message_id", -1, r[i].id,
                                            (ssize_t)r[i].id_len);
                rd_kafka_resp_err_t err = rd_kafka_producev(
                    rk, RD_KAFKA_V_TOPIC(topic),
                    RD_KAFKA_V_KEY(r[i].key ? r[i].key : "k",
                                   r[i].key ? r[i].key_len : 1),
                    RD_KAFKA_V_VALUE(r[i].payload, r[i].payload_len),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
                cr_assert(err == 0, "produce %zu: %s", i,
                          rd_kafka_err2str(err));
                rd_kafka_poll(rk, 0);
        }
        cr_assert(rd_kafka_flush(rk, 60000) == 0, "flush");
        rd_kafka_destroy(rk);
}

static char *
grant(const char *order, int user, int pts, size_t pad)
{
        char *p = malloc(pad + 200);
        int n = sprintf(p,
                        "{\"order_id\":\"%s\",\"user_id\":%d,"
                        "\"grant_points\":%d,\"pad\":\"",
                        order, user, pts);
        memset(p + n, 'x', pad);
        strcpy(p + n + pad, "\"}");
        return p;
}

static char *
filled(size_t n, char c)
{
        char *p = malloc(n + 1);
        memset(p, c, n);
        p[n] = '\0';
        return p;
}

KT_BACKENDS_PARAMS(oddmsg, big_and_odd)
ParameterizedTest(int *backend, oddmsg, big_and_odd, .timeout = 300)
{
        bool my = *backend == 1;
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("odd");
        kt_topic(topic, 2);
        rec_t r[200];
        size_t n = 0;
        long long total = 0;
        char ids[120][32];
        for (int i = 0; i < 100; i++) {
                if (i == 50) {
                        /* the odd ones, in the middle of the stream */
                        char *bigkey = filled(KEY, 'K');
                        r[n++] = (rec_t){
                            "big-ok", 6, NULL, 0, grant("o-big", 1, 7, BIG),
                            0,        0};
                        r[n++] = (rec_t){"big-bad",        7,   NULL, 0,
                                         filled(BIG, '#'), BIG, 0};
                        r[n++] = (rec_t){
                            "hdr-ok", 6,   NULL, 0, grant("o-hdr", 2, 5, 0),
                            0,        NHDR};
                        r[n++] = (rec_t){"hdr-bad",       7,  NULL, 0,
                                         filled(10, '#'), 10, NHDR};
                        r[n++] = (rec_t){
                            "key-ok", 6, bigkey, KEY, grant("o-key", 3, 3, 0),
                            0,        0};
                        r[n++] = (rec_t){"key-bad",       7,  bigkey, KEY,
                                         filled(10, '#'), 10, 0};
                        total += 7 + 5 + 3;
                        static char longid[300];
                        memset(longid, 'L', 299);
                        r[n++] = (rec_t){"", 0, NULL, 0, grant("o-e", 4, 1, 0),
                                         0,  0};
                        r[n++] = (rec_t){
                            longid, 299, NULL, 0, grant("o-l", 4, 1, 0), 0, 0};
                        r[n++] = (rec_t){
                            "a\0b", 3, NULL, 0, grant("o-n", 4, 1, 0), 0, 0};
                        r[n++] = (rec_t){
                            "\xff\xfe", 2, NULL, 0, grant("o-u", 4, 1, 0),
                            0,          0};
                        r[n++] = (rec_t){
                            NULL, 0, NULL, 0, grant("o-x", 4, 1, 0), 0, 0};
                }
                snprintf(ids[i], sizeof(ids[i]), "m-%d", i);
                char order[32];
                snprintf(order, sizeof(order), "o-%d", i);
                int pts = i % 13 + 1;
                total += pts;
                r[n++] = (rec_t){ids[i],
                                 strlen(ids[i]),
                                 NULL,
                                 0,
                                 grant(order, 10 + i % 7, pts, 0),
                                 0,
                                 0};
        }
        for (size_t i = 0; i < n; i++)
                if (!r[i].payload_len)
                        r[i].payload_len = strlen(r[i].payload);
        produce(topic, r, n);

        char *group = kt_unique("godd");
        char *ini =
            kt_write_ini(url,
                         "[consumer.p]\ntopics = %s\nhandler = points\n"
                         "group.id = %s\n",
                         topic, group);
        char *log = kt_tmp("oddmsg.log");
        pid_t p = kt_spawn_kinbox(ini, NULL, log);
        /* 103 applied + 3 dead (big-bad, hdr-bad, key-bad) in the inbox;
         * 5 without a usable id dead-lettered. */
        long long dead = kt_wait_qint(
            url, "SELECT COUNT(*) FROM kinbox_dead_letter", 8, 120);
        long long inbox =
            kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 106, 60);
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0), "see %s", log);
        cr_assert(eq(i64, dead, 8), "see %s", log);
        kt_assert_points(url, total, 103);
        cr_assert(eq(i64, inbox, 100 + 3 + 3));
        cr_assert(eq(i64, kt_committed_sum(group, topic, 2), (long long)n));

        /* Each bad one with its own reason, its bytes whole. */
        const char *len = my ? "LENGTH" : "octet_length";
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT %s(payload) FROM kinbox_dead_letter "
                              "WHERE message_id = 'big-bad'",
                              len),
                     BIG));
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT %s(msg_key) FROM kinbox_dead_letter "
                              "WHERE message_id = 'key-bad'",
                              len),
                     KEY));
        char *out = NULL;
        long long id = kt_qint(url, "SELECT id FROM kinbox_dead_letter WHERE "
                                    "message_id = 'hdr-bad'");
        cr_assert(
            eq(int,
               kt_kinbox(&out, NULL, true, "dead show %lld -c %s", id, ini),
               0),
            "%s", out);
        cr_assert(strstr(out, "h0: v; h1: v;") && strstr(out, "h999: v"),
                  "the 1,000 headers are not all kept: %.300s", out);
        free(out);
        static const char *const why[] = {"is empty", "longer than",
                                          "NUL byte", "not valid UTF-8",
                                          "no header"};
        for (size_t i = 0; i < sizeof(why) / sizeof(why[0]); i++)
                cr_assert(
                    eq(i64,
                       kt_qintf(url,
                                "SELECT COUNT(*) FROM kinbox_dead_letter "
                                "WHERE error LIKE '%%%s%%'",
                                why[i]),
                       1),
                    "no dead letter saying \"%s\": see %s", why[i], log);
        for (size_t i = 0; i < n; i++) {
                free(r[i].payload);
                if (r[i].key && (i == 0 || r[i].key != r[i - 1].key))
                        free(r[i].key);
        }
}
