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
 *       (the row's append sequence) never goes back to one not seen yet (a
 *       sequence seen before, an at-least-once duplicate, is allowed and
 *       counted). Prints "messages keys violations duplicates distinct";
 *       exit 1 on a violation or fewer than N messages.
 *
 *   kbtool hw -b BOOTSTRAP -t TOPIC -n N [--timeout SEC] [--interval-ms MS]
 *       Polls the sum of the topic's high watermarks (what the broker
 *       acknowledged, whoever published it) until it reaches N. Prints
 *       "t_first n_first t_last n_last" (CLOCK_REALTIME seconds) like wait.
 *
 *   kbtool latency (--pg URL | --mysql URL) --table kinbox|debezium|emit
 *         -b BOOTSTRAP -t TOPIC -n N --rate R [-a AGGREGATES]
 *         [-w WRITERS] [--tx ROWS] [--dump FILE] [--append-time 1]
 *       Commit-to-receive latency of whatever relays the table to TOPIC:
 *       a writer thread appends N rows at R rows/s, each its own
 *       autocommitted INSERT (kinbox_outbox, or Debezium's outbox table
 *       outboxevent; emit: kinbox_outbox_emit_pg()'s logical messages,
 *       PostgreSQL), shaped like bench/run's fill, and notes the time the
 *       COMMIT returned; another reads TOPIC from the start and notes when
 *       each row (the number after "o-") first arrives. Row i is due at
 *       i / R s from the start and is never written before. -w: WRITERS
 *       threads, each on its own connection, each with the aggregates
 *       whose number modulo WRITERS is its own (so every aggregate's rows
 *       are committed by one connection, in order). --tx: ROWS rows of a
 *       writer in one multi-row INSERT (one commit; sent when its last row
 *       is due; each row's latency is counted from that commit). Prints
 *       "p50_ms p99_ms p999_ms max_ms received duplicates rate" (rate: the
 *       appends' achieved rows/s, N over the first row's due time to the
 *       last commit); exit 1 if not every row arrived. --dump: one line a
 *       row to FILE, "seq due_s latency_ms append_ms" (due_s: seconds
 *       from the first row's due time; latency -1 if it never arrived;
 *       append_ms: from the commit to the broker's append, -1 unknown).
 *       --append-time 1 first sets the topic's message.timestamp.type to
 *       LogAppendTime, so append_ms is known (the relay's part of the
 *       latency, apart from the consumer's fetch).
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
#include <math.h>
#include <pthread.h>
#include <stdint.h>
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
        long long got = 0, bad = 0, dups = 0, distinct = 0;
        size_t seencap = 1 << 20;
        unsigned char *seen = calloc(seencap, 1);
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
                int was = 0;
                if (seq >= 0) {
                        while ((size_t)seq >= seencap * 8) {
                                seen = realloc(seen, seencap * 2);
                                memset(seen + seencap, 0, seencap);
                                seencap *= 2;
                        }
                        was = seen[seq / 8] >> (seq % 8) & 1;
                        seen[seq / 8] |= (unsigned char)(1 << (seq % 8));
                        distinct += !was;
                }
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
                if (was)
                        dups++;
                else if (seq < k->last)
                        bad++;
                if (seq > k->last)
                        k->last = seq;
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        free(seen);
        printf("%lld %zu %lld %lld %lld\n", got, nk, bad, dups, distinct);
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

/* sum of the high watermarks of TOPIC (-1 on error) */
static long long
hw_sum(rd_kafka_t *rk, const char *t, int np)
{
        long long s = 0;
        for (int p = 0; p < np; p++) {
                int64_t lo = 0, hi = 0;
                if (rd_kafka_query_watermark_offsets(rk, t, p, &lo, &hi, 5000))
                        return -1;
                s += hi;
        }
        return s;
}

static int
partitions(rd_kafka_t *rk, const char *t)
{
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t, NULL);
        int np = -1;
        if (!rd_kafka_metadata(rk, 0, rkt, &md, 10000) && md->topic_cnt &&
            !md->topics[0].err)
                np = md->topics[0].partition_cnt;
        if (md)
                rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
        return np;
}

static int
cmd_hw(int argc, char **argv)
{
        const char *b = NULL, *t = NULL;
        long long want = 0;
        double timeout = 600;
        int interval = 50;
        for (int i = 0; i + 1 < argc; i += 2) {
                if (!strcmp(argv[i], "-b"))
                        b = argv[i + 1];
                else if (!strcmp(argv[i], "-t"))
                        t = argv[i + 1];
                else if (!strcmp(argv[i], "-n"))
                        want = atoll(argv[i + 1]);
                else if (!strcmp(argv[i], "--timeout"))
                        timeout = atof(argv[i + 1]);
                else if (!strcmp(argv[i], "--interval-ms"))
                        interval = atoi(argv[i + 1]);
        }
        if (!b || !t || want <= 0)
                return 2;
        rd_kafka_t *rk = mk(RD_KAFKA_CONSUMER, b, "kbtool-hw");
        if (!rk)
                return 1;
        int np = partitions(rk, t);
        if (np <= 0) {
                fprintf(stderr, "kbtool hw: no topic %s\n", t);
                return 1;
        }
        double t0 = now_rt(), tf = 0;
        long long nf = 0, n = 0;
        for (;;) {
                double tt = now_rt();
                n = hw_sum(rk, t, np);
                if (n > 0 && !tf) {
                        tf = tt;
                        nf = n;
                }
                if (n >= want)
                        break;
                if (tt - t0 > timeout) {
                        printf("%.6f %lld %.6f %lld\n", tf, nf, tt, n);
                        fprintf(stderr, "kbtool hw: timeout at %lld of %lld\n",
                                n, want);
                        return 1;
                }
                usleep((useconds_t)interval * 1000);
        }
        printf("%.6f %lld %.6f %lld\n", tf, nf, now_rt(), n);
        rd_kafka_destroy(rk);
        return 0;
}

/* ---- latency: appends at a steady rate, receive times from the topic */
static struct {
        const char *pgurl, *myurl, *table, *b, *t, *dump;
        long n, aggs, writers, tx;
        double rate;
        double *tc, *tr; /* commit returned / first received, per row 1..n */
        double *ta; /* the broker's append time (--append-time), per row */
        int append_time;
        volatile int writers_done;
        long long received, dups;
        double t_write0, t_write1;
        pthread_mutex_t mu;
} L;

/* appends one row's VALUES tuple to sql (cap bytes) */
static size_t
lat_values(char *sql, size_t at, size_t cap, int dbz, int my, long i)
{
        char payload[160];
        snprintf(payload, sizeof(payload),
                 "{\"order_id\":\"o-%ld\",\"user_id\":%ld,"
                 "\"grant_points\":%ld}",
                 i, i % 100 + 1, i % 13 + 1);
        int k;
        if (dbz)
                k = snprintf(sql + at, cap - at,
                             "(%s'%s', 'agg-%ld', 'grant', '%s')",
                             my ? "UUID(), " : "", L.t, i % L.aggs, payload);
        else
                k = snprintf(sql + at, cap - at,
                             "('%s', 'l-%ld', 'agg-%ld', '%s')", L.t, i,
                             i % L.aggs, payload);
        return at + (size_t)k;
}

/* --table emit: the rows as kinbox_outbox_emit_pg() writes them, one
 * logical message each with its envelope (docs/outbox.md; headers NULL),
 * from VALUES (destination, idem_key, aggregate_id, payload). */
#define LAT_EMIT_SQL                                                          \
        "SELECT count(pg_logical_emit_message(true, 'kinbox.outbox.v1', "     \
        "'\\x01'::bytea || int4send(octet_length(d)) || convert_to(d, "       \
        "'UTF8') || int4send(octet_length(a)) || convert_to(a, 'UTF8') || "   \
        "int4send(octet_length(k)) || convert_to(k, 'UTF8') || "              \
        "'\\xffffffff'::bytea || int4send(octet_length(p)) || "               \
        "convert_to(p, 'UTF8'))) FROM (VALUES "

static void *
lat_writer(void *arg)
{
        long w = (long)(intptr_t)arg;
        PGconn *pg = NULL;
        MYSQL *my = NULL;
        if (L.pgurl) {
                pg = PQconnectdb(L.pgurl);
                if (PQstatus(pg) != CONNECTION_OK) {
                        fprintf(stderr, "kbtool: %s", PQerrorMessage(pg));
                        exit(1);
                }
        } else if (!(my = my_connect_url(L.myurl))) {
                exit(1);
        }
        int dbz = !strcmp(L.table, "debezium"),
            emit = !strcmp(L.table, "emit");
        size_t cap = 1024 + (size_t)L.tx * 320;
        char *sql = malloc(cap);
        long *rows = malloc(sizeof(long) * (size_t)L.tx);
        long i = 0;
        for (;;) {
                /* this writer's next tx rows: aggregate % writers == w */
                long nr = 0;
                while (nr < L.tx) {
                        for (i++; i <= L.n && (i % L.aggs) % L.writers != w;
                             i++)
                                ;
                        if (i > L.n)
                                break;
                        rows[nr++] = i;
                }
                if (!nr)
                        break;
                double due = L.t_write0 + (rows[nr - 1] - 1) / L.rate,
                       now = now_rt();
                if (due > now)
                        usleep((useconds_t)((due - now) * 1e6));
                size_t at = (size_t)snprintf(
                    sql, cap, "%s",
                    emit ? LAT_EMIT_SQL
                    : dbz
                        ? (my ? "INSERT INTO outboxevent (id, aggregatetype, "
                                "aggregateid, type, payload) VALUES "
                              : "INSERT INTO outboxevent (aggregatetype, "
                                "aggregateid, type, payload) VALUES ")
                        : "INSERT INTO kinbox_outbox (destination, "
                          "idem_key, aggregate_id, payload) VALUES ");
                for (long r = 0; r < nr; r++) {
                        if (r)
                                at +=
                                    (size_t)snprintf(sql + at, cap - at, ", ");
                        at =
                            lat_values(sql, at, cap, dbz, my != NULL, rows[r]);
                }
                if (emit)
                        at += (size_t)snprintf(sql + at, cap - at,
                                               ") AS v (d, k, a, p)");
                if (pg) {
                        PGresult *r = PQexec(pg, sql);
                        if (PQresultStatus(r) !=
                            (emit ? PGRES_TUPLES_OK : PGRES_COMMAND_OK)) {
                                fprintf(stderr, "kbtool: %s",
                                        PQerrorMessage(pg));
                                exit(1);
                        }
                        PQclear(r);
                } else if (mysql_query(my, sql)) {
                        fprintf(stderr, "kbtool: %s\n", mysql_error(my));
                        exit(1);
                }
                double tc = now_rt();
                for (long r = 0; r < nr; r++)
                        L.tc[rows[r]] = tc;
                pthread_mutex_lock(&L.mu);
                if (tc > L.t_write1)
                        L.t_write1 = tc;
                pthread_mutex_unlock(&L.mu);
        }
        free(rows);
        free(sql);
        if (pg)
                PQfinish(pg);
        if (my)
                mysql_close(my);
        pthread_mutex_lock(&L.mu);
        L.writers_done++;
        pthread_mutex_unlock(&L.mu);
        return NULL;
}

static int
cmp_d(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

/* --append-time 1: the topic's records stamped by the broker
 * (message.timestamp.type = LogAppendTime), so each row's time of append
 * is known beside its receive (the relay's part and the consumer's). */
static void
set_append_time(rd_kafka_t *rk, const char *topic)
{
        rd_kafka_ConfigResource_t *res =
            rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
        rd_kafka_ConfigResource_set_config(res, "message.timestamp.type",
                                           "LogAppendTime");
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AlterConfigs(rk, &res, 1, NULL, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 10000);
        if (!ev || rd_kafka_event_error(ev))
                fprintf(stderr, "kbtool latency: LogAppendTime on %s: %s\n",
                        topic,
                        ev ? rd_kafka_event_error_string(ev) : "timeout");
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_queue_destroy(q);
        rd_kafka_ConfigResource_destroy(res);
}

/* kbtool latency's arguments into L; 2 on a bad one. */
static int
latency_args(int argc, char **argv)
{
        L.table = "kinbox";
        L.aggs = 10000;
        L.rate = 1000;
        L.writers = 1;
        L.tx = 1;
        for (int i = 0; i + 1 < argc; i += 2) {
                const char *a = argv[i], *v = argv[i + 1];
                if (!strcmp(a, "--pg"))
                        L.pgurl = v;
                else if (!strcmp(a, "--mysql"))
                        L.myurl = v;
                else if (!strcmp(a, "--table"))
                        L.table = v;
                else if (!strcmp(a, "-b"))
                        L.b = v;
                else if (!strcmp(a, "-t"))
                        L.t = v;
                else if (!strcmp(a, "-n"))
                        L.n = atol(v);
                else if (!strcmp(a, "-a"))
                        L.aggs = atol(v);
                else if (!strcmp(a, "--rate"))
                        L.rate = atof(v);
                else if (!strcmp(a, "-w"))
                        L.writers = atol(v);
                else if (!strcmp(a, "--tx"))
                        L.tx = atol(v);
                else if (!strcmp(a, "--dump"))
                        L.dump = v;
                else if (!strcmp(a, "--append-time"))
                        L.append_time = atoi(v);
                else {
                        fprintf(stderr, "kbtool latency: unknown %s\n", a);
                        return 2;
                }
        }
        if ((!L.pgurl == !L.myurl) || !L.b || !L.t || L.n <= 0 ||
            L.rate <= 0 || L.aggs <= 0 || L.writers <= 0 || L.tx <= 0)
                return 2;
        if (L.writers > L.aggs)
                L.writers = L.aggs;
        return 0;
}

/* Read TOPIC until every row arrived, or 60 s after the last append. */
static void
latency_receive(rd_kafka_t *rk)
{
        double tdone = 0;
        while (L.received < L.n) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 50);
                double now = now_rt();
                pthread_mutex_lock(&L.mu);
                int done = L.writers_done == L.writers;
                pthread_mutex_unlock(&L.mu);
                if (done && !tdone)
                        tdone = now;
                if (tdone && now - tdone > 60)
                        break;
                if (!m)
                        continue;
                if (m->err || !m->payload) {
                        rd_kafka_message_destroy(m);
                        continue;
                }
                char val[512];
                snprintf(val, sizeof(val), "%.*s", (int)m->len,
                         (const char *)m->payload);
                rd_kafka_timestamp_type_t tst;
                int64_t ts = rd_kafka_message_timestamp(m, &tst);
                rd_kafka_message_destroy(m);
                const char *o = strstr(val, "o-");
                long seq = o ? atol(o + 2) : 0;
                if (seq < 1 || seq > L.n)
                        continue;
                if (L.tr[seq]) {
                        L.dups++;
                        continue;
                }
                L.tr[seq] = now;
                if (tst == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME)
                        L.ta[seq] = (double)ts / 1e3;
                L.received++;
        }
}

static int
cmd_latency(int argc, char **argv)
{
        int bad = latency_args(argc, argv);
        if (bad)
                return bad;
        pthread_mutex_init(&L.mu, NULL);
        L.tc = calloc((size_t)L.n + 1, sizeof(double));
        L.tr = calloc((size_t)L.n + 1, sizeof(double));
        L.ta = calloc((size_t)L.n + 1, sizeof(double));
        char err[512];
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", L.b, err, sizeof(err));
        rd_kafka_conf_set(c, "group.id", "kbtool-latency", err, sizeof(err));
        rd_kafka_conf_set(c, "fetch.wait.max.ms", "100", err, sizeof(err));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof(err));
        if (!rk)
                return 1;
        if (L.append_time)
                set_append_time(rk, L.t);
        int np = partitions(rk, L.t);
        if (np <= 0) {
                fprintf(stderr, "kbtool latency: no topic %s\n", L.t);
                return 1;
        }
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(np);
        for (int p = 0; p < np; p++)
                rd_kafka_topic_partition_list_add(l, L.t, p)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_assign(rk, l);
        rd_kafka_topic_partition_list_destroy(l);
        /* let the fetchers start before the first append */
        for (double t0 = now_rt(); now_rt() - t0 < 1;) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
                if (m)
                        rd_kafka_message_destroy(m);
        }
        pthread_t *th = calloc((size_t)L.writers, sizeof(*th));
        L.t_write0 = now_rt();
        for (long w = 0; w < L.writers; w++)
                pthread_create(&th[w], NULL, lat_writer, (void *)(intptr_t)w);
        latency_receive(rk);
        for (long w = 0; w < L.writers; w++)
                pthread_join(th[w], NULL);
        free(th);
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        if (L.dump) {
                FILE *f = fopen(L.dump, "w");
                if (!f) {
                        perror(L.dump);
                        return 1;
                }
                for (long i = 1; i <= L.n; i++)
                        fprintf(f, "%ld %.4f %.3f %.3f\n", i, (i - 1) / L.rate,
                                L.tr[i] && L.tc[i] ? (L.tr[i] - L.tc[i]) * 1e3
                                                   : -1.0,
                                L.ta[i] && L.tc[i] ? (L.ta[i] - L.tc[i]) * 1e3
                                                   : -1.0);
                fclose(f);
        }
        double *d = malloc(sizeof(double) * (size_t)L.n);
        long k = 0;
        for (long i = 1; i <= L.n; i++)
                if (L.tr[i] && L.tc[i])
                        d[k++] = (L.tr[i] - L.tc[i]) * 1e3;
        qsort(d, (size_t)k, sizeof(double), cmp_d);
#define PCT(q) (k ? d[(long)fmin((double)k - 1, floor((q)*k))] : 0)
        printf("%.2f %.2f %.2f %.2f %lld %lld %.1f\n", PCT(0.5), PCT(0.99),
               PCT(0.999), k ? d[k - 1] : 0, L.received, L.dups,
               L.n / (L.t_write1 - L.t_write0));
        return L.received == L.n ? 0 : 1;
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
        if (!strcmp(argv[1], "hw"))
                return cmd_hw(argc - 2, argv + 2);
        if (!strcmp(argv[1], "latency"))
                return cmd_latency(argc - 2, argv + 2);
        fprintf(stderr, "kbtool: unknown command %s\n", argv[1]);
        return 2;
}
