/*
 * kbtool -- small measuring helpers for bench/run.
 *
 *   kbtool wait (--pg URL | --mysql URL) --mode watermark|inbox
 *               --consumer NAME --want N [--timeout SEC] [--interval-ms MS]
 *       Polls the database on one connection until the consumer's progress
 *       reaches N (watermark: sum of kinbox_offsets.next_offset; inbox:
 *       count of its kinbox_inbox rows). Prints
 *       "t_first n_first t_last n_last" (CLOCK_REALTIME seconds): the first
 *       poll that saw progress and the poll that saw N. Exit 1 on timeout.
 *
 *   kbtool offsets -b BOOTSTRAP -t TOPIC -g GROUP
 *       Prints "low_sum high_sum committed_sum" over the topic's partitions
 *       (committed offsets of GROUP; a partition without one counts 0).
 *
 *   kbtool order -b BOOTSTRAP -t TOPIC -n N
 *       Reads the whole topic (every partition from the start) and checks
 *       per-aggregate order: per key, the number after "o-" in the payload
 *       (the row's append sequence) never goes back (a repeat of the last
 *       one, an at-least-once duplicate, is allowed). Prints
 *       "messages keys violations duplicates"; exit 1 on a violation or
 *       fewer than N messages.
 *
 *   kbtool produce -b BOOTSTRAP -t TOPIC -n N [-a AGGREGATES]
 *       A plain librdkafka idempotent producer pushing N messages shaped as
 *       the relay's (key = aggregate, message_id header, ~60-byte payload).
 *       Prints "seconds rate" from the first produce call to the last
 *       delivery report.
 */
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <mysql.h>

#include "mysql_url.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double
now_rt(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return ts.tv_sec + ts.tv_nsec / 1e9;
}

static MYSQL *
my_connect_url(const char *url)
{
        char err[600];
        MYSQL *my = bench_mysql_connect(url, err, sizeof(err));
        if (!my) {
                fprintf(stderr, "kbtool: %s\n", err);
                return NULL;
        }
        mysql_autocommit(my, 1);
        return my;
}

static int
cmd_wait(int argc, char **argv)
{
        const char *pgurl = NULL, *myurl = NULL, *mode = "watermark",
                   *consumer = NULL;
        long long want = -1;
        double timeout = 600;
        int interval = 10;
        for (int i = 0; i + 1 < argc; i += 2) {
                const char *a = argv[i], *v = argv[i + 1];
                if (!strcmp(a, "--pg"))
                        pgurl = v;
                else if (!strcmp(a, "--mysql"))
                        myurl = v;
                else if (!strcmp(a, "--mode"))
                        mode = v;
                else if (!strcmp(a, "--consumer"))
                        consumer = v;
                else if (!strcmp(a, "--want"))
                        want = atoll(v);
                else if (!strcmp(a, "--timeout"))
                        timeout = atof(v);
                else if (!strcmp(a, "--interval-ms"))
                        interval = atoi(v);
                else {
                        fprintf(stderr, "kbtool wait: unknown %s\n", a);
                        return 2;
                }
        }
        if ((!pgurl == !myurl) || !consumer || want < 0)
                return 2;
        int wm = !strcmp(mode, "watermark");
        char sql[512];
        PGconn *pg = NULL;
        MYSQL *my = NULL;
        if (pgurl) {
                pg = PQconnectdb(pgurl);
                if (PQstatus(pg) != CONNECTION_OK) {
                        fprintf(stderr, "kbtool: %s", PQerrorMessage(pg));
                        return 1;
                }
        } else if (!(my = my_connect_url(myurl))) {
                return 1;
        }
        if (wm)
                snprintf(sql, sizeof(sql),
                         "SELECT COALESCE(SUM(next_offset), 0) FROM "
                         "kinbox_offsets WHERE consumer = '%s'",
                         consumer);
        else
                snprintf(sql, sizeof(sql),
                         "SELECT COUNT(*) FROM kinbox_inbox WHERE consumer "
                         "= '%s'",
                         consumer);
        double t0 = now_rt(), tf = 0, tl = 0;
        long long nf = 0, n = 0;
        for (;;) {
                double t = now_rt();
                n = -1;
                if (pg) {
                        PGresult *r = PQexec(pg, sql);
                        if (PQresultStatus(r) == PGRES_TUPLES_OK)
                                n = atoll(PQgetvalue(r, 0, 0));
                        PQclear(r);
                        if (PQstatus(pg) != CONNECTION_OK)
                                PQreset(pg);
                } else if (!mysql_query(my, sql)) {
                        MYSQL_RES *res = mysql_store_result(my);
                        MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
                        if (row && row[0])
                                n = atoll(row[0]);
                        if (res)
                                mysql_free_result(res);
                }
                if (n > 0 && !tf) {
                        tf = t;
                        nf = n;
                }
                if (n >= want) {
                        tl = t;
                        break;
                }
                if (t - t0 > timeout) {
                        printf("%.6f %lld %.6f %lld\n", tf, nf, t, n);
                        fprintf(stderr,
                                "kbtool wait: timeout at %lld of %lld\n", n,
                                want);
                        return 1;
                }
                usleep((useconds_t)interval * 1000);
        }
        printf("%.6f %lld %.6f %lld\n", tf, nf, tl, n);
        if (pg)
                PQfinish(pg);
        if (my)
                mysql_close(my);
        return 0;
}

static rd_kafka_t *
mk(rd_kafka_type_t type, const char *bootstrap, const char *group)
{
        char err[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof(err));
        if (group)
                rd_kafka_conf_set(c, "group.id", group, err, sizeof(err));
        if (type == RD_KAFKA_PRODUCER) {
                rd_kafka_conf_set(c, "enable.idempotence", "true", err,
                                  sizeof(err));
                rd_kafka_conf_set(c, "linger.ms", "5", err, sizeof(err));
        }
        rd_kafka_t *rk = rd_kafka_new(type, c, err, sizeof(err));
        if (!rk)
                fprintf(stderr, "kbtool: %s\n", err);
        return rk;
}

static int
cmd_offsets(int argc, char **argv)
{
        const char *b = NULL, *t = NULL, *g = NULL;
        for (int i = 0; i + 1 < argc; i += 2) {
                if (!strcmp(argv[i], "-b"))
                        b = argv[i + 1];
                else if (!strcmp(argv[i], "-t"))
                        t = argv[i + 1];
                else if (!strcmp(argv[i], "-g"))
                        g = argv[i + 1];
        }
        if (!b || !t || !g)
                return 2;
        rd_kafka_t *rk = mk(RD_KAFKA_CONSUMER, b, g);
        if (!rk)
                return 1;
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t, NULL);
        if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) || !md->topic_cnt) {
                fprintf(stderr, "kbtool: metadata failed\n");
                return 1;
        }
        int np = md->topics[0].partition_cnt;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(np);
        long long lo_sum = 0, hi_sum = 0, c_sum = 0;
        for (int p = 0; p < np; p++) {
                int64_t lo = 0, hi = 0;
                if (rd_kafka_query_watermark_offsets(rk, t, p, &lo, &hi,
                                                     10000)) {
                        fprintf(stderr, "kbtool: watermarks failed\n");
                        return 1;
                }
                lo_sum += lo;
                hi_sum += hi;
                rd_kafka_topic_partition_list_add(l, t, p);
        }
        if (rd_kafka_committed(rk, l, 10000)) {
                fprintf(stderr, "kbtool: committed failed\n");
                return 1;
        }
        for (int i = 0; i < l->cnt; i++)
                if (l->elems[i].offset >= 0)
                        c_sum += l->elems[i].offset;
        rd_kafka_topic_partition_list_destroy(l);
        rd_kafka_destroy(rk);
        printf("%lld %lld %lld\n", lo_sum, hi_sum, c_sum);
        return 0;
}

static long delivered, failed;

static void
dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *o)
{
        (void)rk;
        (void)o;
        if (m->err)
                failed++;
        else
                delivered++;
}

typedef struct keyseq {
        char *key;
        long long last;
} keyseq_t;

static int
cmp_ks(const void *a, const void *b)
{
        return strcmp(((const keyseq_t *)a)->key, ((const keyseq_t *)b)->key);
}

static int
cmd_order(int argc, char **argv)
{
        const char *b = NULL, *t = NULL;
        long long want = 0;
        for (int i = 0; i + 1 < argc; i += 2) {
                if (!strcmp(argv[i], "-b"))
                        b = argv[i + 1];
                else if (!strcmp(argv[i], "-t"))
                        t = argv[i + 1];
                else if (!strcmp(argv[i], "-n"))
                        want = atoll(argv[i + 1]);
        }
        if (!b || !t)
                return 2;
        rd_kafka_t *rk = mk(RD_KAFKA_CONSUMER, b, "kbtool-order");
        if (!rk)
                return 1;
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t, NULL);
        if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) || !md->topic_cnt)
                return 1;
        int np = md->topics[0].partition_cnt;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(np);
        long long total = 0;
        for (int p = 0; p < np; p++) {
                int64_t lo = 0, hi = 0;
                rd_kafka_query_watermark_offsets(rk, t, p, &lo, &hi, 10000);
                total += hi - lo;
                rd_kafka_topic_partition_list_add(l, t, p)->offset = lo;
        }
        rd_kafka_assign(rk, l);
        rd_kafka_topic_partition_list_destroy(l);
        size_t cap = 1024, nk = 0;
        keyseq_t *ks = calloc(cap, sizeof(*ks));
        long long got = 0, bad = 0, dups = 0;
        double t0 = now_rt();
        while (got < total && now_rt() - t0 < 300) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);
                if (!m)
                        continue;
                if (m->err) {
                        rd_kafka_message_destroy(m);
                        continue;
                }
                got++;
                char key[256] = "", val[512] = "";
                snprintf(key, sizeof(key), "%.*s", (int)m->key_len,
                         m->key ? (const char *)m->key : "");
                snprintf(val, sizeof(val), "%.*s", (int)m->len,
                         m->payload ? (const char *)m->payload : "");
                rd_kafka_message_destroy(m);
                const char *o = strstr(val, "o-");
                long long seq = o ? atoll(o + 2) : -1;
                keyseq_t probe = {key, 0};
                keyseq_t *k =
                    nk ? bsearch(&probe, ks, nk, sizeof(*ks), cmp_ks) : NULL;
                if (!k) {
                        if (nk == cap)
                                ks = realloc(ks, (cap *= 2) * sizeof(*ks));
                        size_t lo = 0, hi = nk;
                        while (lo < hi) {
                                size_t mid = (lo + hi) / 2;
                                if (strcmp(ks[mid].key, key) < 0)
                                        lo = mid + 1;
                                else
                                        hi = mid;
                        }
                        memmove(ks + lo + 1, ks + lo, (nk - lo) * sizeof(*ks));
                        ks[lo].key = strdup(key);
                        ks[lo].last = seq;
                        nk++;
                        continue;
                }
                if (seq == k->last)
                        dups++;
                else if (seq < k->last)
                        bad++;
                k->last = seq;
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        printf("%lld %zu %lld %lld\n", got, nk, bad, dups);
        for (size_t i = 0; i < nk; i++)
                free(ks[i].key);
        free(ks);
        return bad || got < want ? 1 : 0;
}

static int
cmd_produce(int argc, char **argv)
{
        const char *b = NULL, *t = NULL;
        long n = 0, aggs = 10000;
        for (int i = 0; i + 1 < argc; i += 2) {
                if (!strcmp(argv[i], "-b"))
                        b = argv[i + 1];
                else if (!strcmp(argv[i], "-t"))
                        t = argv[i + 1];
                else if (!strcmp(argv[i], "-n"))
                        n = atol(argv[i + 1]);
                else if (!strcmp(argv[i], "-a"))
                        aggs = atol(argv[i + 1]);
        }
        if (!b || !t || n <= 0)
                return 2;
        char err[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", b, err, sizeof(err));
        rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof(err));
        rd_kafka_conf_set_dr_msg_cb(c, dr);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof(err));
        if (!rk)
                return 1;
        char key[32], id[32], payload[128];
        double t0 = now_rt();
        for (long i = 0; i < n; i++) {
                snprintf(key, sizeof(key), "agg-%ld", i % aggs);
                snprintf(id, sizeof(id), "%ld", i + 1);
                snprintf(payload, sizeof(payload),
                         "{\"order_id\":\"o-%ld\",\"user_id\":%ld,"
                         "\"grant_points\":%ld}",
                         i, i % 100 + 1, i % 13 + 1);
                rd_kafka_headers_t *h = rd_kafka_headers_new(1);
                rd_kafka_header_add(h, "message_id", -1, id, -1);
                for (;;) {
                        rd_kafka_resp_err_t e = rd_kafka_producev(
                            rk, RD_KAFKA_V_TOPIC(t),
                            RD_KAFKA_V_KEY(key, strlen(key)),
                            RD_KAFKA_V_VALUE(payload, strlen(payload)),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
                        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                                rd_kafka_poll(rk, 5);
                                continue;
                        }
                        if (e) {
                                fprintf(stderr, "kbtool: produce: %s\n",
                                        rd_kafka_err2str(e));
                                return 1;
                        }
                        break;
                }
                rd_kafka_poll(rk, 0);
        }
        rd_kafka_flush(rk, 60000);
        double dt = now_rt() - t0;
        rd_kafka_destroy(rk);
        if (failed || delivered != n) {
                fprintf(stderr, "kbtool: delivered %ld of %ld\n", delivered,
                        n);
                return 1;
        }
        printf("%.6f %.1f\n", dt, n / dt);
        return 0;
}

int
main(int argc, char **argv)
{
        if (argc < 2) {
                fprintf(stderr, "usage: kbtool wait|offsets|produce ...\n");
                return 2;
        }
        if (!strcmp(argv[1], "wait"))
                return cmd_wait(argc - 2, argv + 2);
        if (!strcmp(argv[1], "offsets"))
                return cmd_offsets(argc - 2, argv + 2);
        if (!strcmp(argv[1], "order"))
                return cmd_order(argc - 2, argv + 2);
        if (!strcmp(argv[1], "produce"))
                return cmd_produce(argc - 2, argv + 2);
        fprintf(stderr, "kbtool: unknown command %s\n", argv[1]);
        return 2;
}
