/*
 * kinbox-chaos -- the two helpers of scripts/chaos that a shell cannot be.
 *
 *   kinbox-chaos writer --url URL --topic TOPIC --out FILE
 *                [--aggregates N] [--rows-per-tx K] [--pause-ms MS] [--seed S]
 *       An outbox writer that keeps going through database restarts. Until
 *       SIGTERM/SIGINT it appends rows with the public API
 *       (kinbox_outbox_append_pg / _mysql), K rows per transaction, each
 *       for a random aggregate a<i> with the next sequence number of that
 *       aggregate: idem_key "<aggregate>-<seq>", payload "<aggregate> <seq>".
 *       A transaction that fails (connection lost, even during COMMIT) is
 *       run again with the same rows after a reconnect: a row that did
 *       commit comes back as KINBOX_ERR_DUPLICATE, so the writer knows
 *       exactly what committed. At the end FILE gets one "aggregate count"
 *       line per aggregate (rows a<i>-1 .. a<i>-count committed) and stdout
 *       one summary line.
 *
 *   kinbox-chaos topic-audit --bootstrap B --topic TOPIC --expect FILE
 *       Reads every partition of TOPIC from its start to its high watermark
 *       (no consumer group) and checks the relay's promise against the
 *       writer's FILE: every committed row is on the topic, nothing else
 *       is, the Kafka key is the aggregate, and per aggregate the first
 *       copy of <seq> comes after the first copy of <seq-1> (re-published
 *       copies after a relay crash are counted, not errors). Exit 0 when
 *       all holds, 1 on any failure (each printed), 2 on usage errors.
 */
#include <kinbox/kinbox.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <mysql.h>

#include "mysql_url.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_AGG 100000

static volatile sig_atomic_t g_stop;

static void
on_signal(int sig)
{
        (void)sig;
        g_stop = 1;
}

static void
sleep_ms(long ms)
{
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) && errno == EINTR)
                ;
}

static int
parse_long(const char *opt, const char *v, long min, long max, long *out)
{
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < min || x > max) {
                fprintf(stderr,
                        "kinbox-chaos: %s: expected an integer in "
                        "%ld..%ld, got \"%s\"\n",
                        opt, min, max, v);
                return -1;
        }
        *out = x;
        return 0;
}

/* ------------------------------------------------------------ writer */

typedef struct wconn {
        PGconn *pg;
        MYSQL *my;
} wconn_t;

static void
wclose(wconn_t *c)
{
        if (c->pg)
                PQfinish(c->pg);
        if (c->my)
                mysql_close(c->my);
        c->pg = NULL;
        c->my = NULL;
}

static int
wopen(wconn_t *c, const char *url, char *err, size_t errsz)
{
        if (!strncmp(url, "mysql://", 8)) {
                c->my = bench_mysql_connect(url, err, errsz);
                if (!c->my)
                        return -1;
                if (mysql_autocommit(c->my, 0)) {
                        snprintf(err, errsz, "autocommit: %s",
                                 mysql_error(c->my));
                        wclose(c);
                        return -1;
                }
                return 0;
        }
        c->pg = PQconnectdb(url);
        if (PQstatus(c->pg) != CONNECTION_OK) {
                snprintf(err, errsz, "%s", PQerrorMessage(c->pg));
                wclose(c);
                return -1;
        }
        return 0;
}

static int
wexec(wconn_t *c, const char *sql, char *err, size_t errsz)
{
        if (c->my) {
                if (mysql_query(c->my, sql)) {
                        snprintf(err, errsz, "%s: %s", sql,
                                 mysql_error(c->my));
                        return -1;
                }
                return 0;
        }
        PGresult *r = PQexec(c->pg, sql);
        int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        if (!ok)
                snprintf(err, errsz, "%s: %s", sql, PQresultErrorMessage(r));
        PQclear(r);
        return ok ? 0 : -1;
}

/* One transaction with rows (agg[i], seq[i]). 0: committed; -1: failed
 * (outcome of COMMIT possibly unknown: the caller retries the same rows). */
static int
write_tx(wconn_t *c, const char *topic, int k, const long *agg,
         const long *seq, long *dups, char *err, size_t errsz)
{
        if (wexec(c, c->my ? "START TRANSACTION" : "BEGIN", err, errsz))
                return -1;
        for (int i = 0; i < k; i++) {
                char a[32], idem[64], payload[64];
                snprintf(a, sizeof(a), "a%ld", agg[i]);
                snprintf(idem, sizeof(idem), "a%ld-%ld", agg[i], seq[i]);
                snprintf(payload, sizeof(payload), "a%ld %ld", agg[i], seq[i]);
                kinbox_outbox_msg_t m = {
                    .destination = topic,
                    .idem_key = idem,
                    .aggregate_id = a,
                    .payload = payload,
                    .payload_size = strlen(payload),
                };
                kinbox_err_t rc =
                    c->my
                        ? kinbox_outbox_append_mysql(c->my, &m, NULL, err,
                                                     errsz)
                        : kinbox_outbox_append_pg(c->pg, &m, NULL, err, errsz);
                if (rc == KINBOX_ERR_DUPLICATE) {
                        (*dups)++;
                        continue;
                }
                if (rc != KINBOX_OK)
                        return -1;
        }
        return wexec(c, "COMMIT", err, errsz);
}

static int
cmd_writer(int argc, char **argv)
{
        const char *url = NULL, *topic = NULL, *out = NULL;
        long naggs = 50, per_tx = 3, pause_ms = 20, seed = 1;
        for (int i = 0; i < argc; i += 2) {
                const char *o = argv[i],
                           *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (!v) {
                        fprintf(stderr,
                                "kinbox-chaos writer: %s needs a "
                                "value\n",
                                o);
                        return 2;
                }
                if (!strcmp(o, "--url"))
                        url = v;
                else if (!strcmp(o, "--topic"))
                        topic = v;
                else if (!strcmp(o, "--out"))
                        out = v;
                else if (!strcmp(o, "--aggregates")) {
                        if (parse_long(o, v, 1, MAX_AGG, &naggs))
                                return 2;
                } else if (!strcmp(o, "--rows-per-tx")) {
                        if (parse_long(o, v, 1, 1000, &per_tx))
                                return 2;
                } else if (!strcmp(o, "--pause-ms")) {
                        if (parse_long(o, v, 0, 60000, &pause_ms))
                                return 2;
                } else if (!strcmp(o, "--seed")) {
                        if (parse_long(o, v, 0, 0x7fffffff, &seed))
                                return 2;
                } else {
                        fprintf(stderr,
                                "kinbox-chaos writer: unknown "
                                "option %s\n",
                                o);
                        return 2;
                }
        }
        if (!url || !topic || !out) {
                fprintf(stderr, "kinbox-chaos writer: --url, --topic and "
                                "--out are required\n");
                return 2;
        }
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        srand((unsigned)seed);

        long *next = calloc((size_t)naggs, sizeof(*next));
        long *agg = calloc((size_t)per_tx, sizeof(*agg));
        long *seq = calloc((size_t)per_tx, sizeof(*seq));
        if (!next || !agg || !seq)
                return 1;
        wconn_t c = {0};
        char err[1024];
        long rows = 0, txs = 0, failures = 0, dups = 0, reconnects = 0;
        long backoff = 50;
        int pending = 0; /* rows chosen, not yet known to be committed */
        /* Stop only between transactions: a transaction whose outcome is
         * unknown is always resolved first (it may have committed). */
        while (pending || !g_stop) {
                if (!pending) {
                        for (int i = 0; i < per_tx; i++) {
                                agg[i] = rand() % naggs;
                                seq[i] = ++next[agg[i]];
                        }
                        pending = 1;
                }
                if (!c.pg && !c.my) {
                        if (wopen(&c, url, err, sizeof(err))) {
                                sleep_ms(backoff);
                                backoff = backoff < 1000 ? backoff * 2 : 1000;
                                continue;
                        }
                        reconnects++;
                }
                long d = 0;
                if (write_tx(&c, topic, (int)per_tx, agg, seq, &d, err,
                             sizeof(err))) {
                        failures++;
                        /* Whatever happened, start from a new connection:
                         * the rows are tried again, duplicates tell. */
                        wclose(&c);
                        sleep_ms(backoff);
                        backoff = backoff < 1000 ? backoff * 2 : 1000;
                        continue;
                }
                dups += d;
                backoff = 50;
                pending = 0;
                rows += per_tx;
                txs++;
                if (pause_ms)
                        sleep_ms(pause_ms);
        }
        wclose(&c);
        FILE *fp = fopen(out, "w");
        if (!fp) {
                fprintf(stderr, "kinbox-chaos writer: %s: %s\n", out,
                        strerror(errno));
                return 1;
        }
        for (long a = 0; a < naggs; a++)
                if (next[a])
                        fprintf(fp, "a%ld %ld\n", a, next[a]);
        if (fclose(fp)) {
                fprintf(stderr, "kinbox-chaos writer: %s: write failed\n",
                        out);
                return 1;
        }
        /* "rows already there" are rows of a transaction whose COMMIT
         * failed on the client's side but had committed on the server. */
        printf("writer: committed %ld rows in %ld transactions; %ld failed "
               "attempts, %ld connections, %ld rows found already committed "
               "on a retry\n",
               rows, txs, failures, reconnects, dups);
        free(next);
        free(agg);
        free(seq);
        return 0;
}

/* ------------------------------------------------------- topic-audit */

typedef struct aggst {
        long expect; /* committed rows a<i>-1 .. a<i>-expect */
        long maxseen; /* highest seq seen; seqs 1..maxseen all seen */
} aggst_t;

/* What the audit counts. */
typedef struct audit {
        long msgs, copies, order_bad, unexpected, bad_key, bad_header;
} audit_t;

/* The writer's "aNN count" lines into st; 0, or 2 with a message. */
static int
read_expect(const char *expect, aggst_t *st, long *rows, long *naggs)
{
        FILE *fp = fopen(expect, "r");
        if (!fp) {
                fprintf(stderr, "kinbox-chaos topic-audit: %s: %s\n", expect,
                        strerror(errno));
                return 2;
        }
        long a, n;
        *rows = *naggs = 0;
        while (fscanf(fp, " a%ld %ld", &a, &n) == 2) {
                if (a < 0 || a >= MAX_AGG || n < 0) {
                        fprintf(stderr,
                                "kinbox-chaos topic-audit: %s: bad "
                                "line a%ld %ld\n",
                                expect, a, n);
                        fclose(fp);
                        return 2;
                }
                st[a].expect = n;
                *rows += n;
                (*naggs)++;
        }
        fclose(fp);
        return 0;
}

/* A group-less consumer for reading partitions from their start. */
static rd_kafka_t *
audit_consumer(const char *bootstrap)
{
        char err[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err,
                              sizeof(err)) ||
            rd_kafka_conf_set(conf, "group.id", "kinbox-chaos-audit", err,
                              sizeof(err)) ||
            rd_kafka_conf_set(conf, "enable.auto.commit", "false", err,
                              sizeof(err)) ||
            rd_kafka_conf_set(conf, "enable.partition.eof", "true", err,
                              sizeof(err))) {
                fprintf(stderr, "kinbox-chaos topic-audit: %s\n", err);
                rd_kafka_conf_destroy(conf);
                return NULL;
        }
        rd_kafka_t *rk =
            rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
        if (!rk)
                fprintf(stderr, "kinbox-chaos topic-audit: %s\n", err);
        return rk;
}

/* Every non-empty partition of topic from offset 0 into *tpp; *live how
 * many; a partition that does not start at 0 is a failure. -1: error. */
static int
topic_partitions(rd_kafka_t *rk, const char *topic,
                 rd_kafka_topic_partition_list_t **tpp, int *live,
                 int64_t *total_high)
{
        const rd_kafka_metadata_t *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
        if (e || md->topic_cnt != 1 || md->topics[0].err) {
                fprintf(stderr,
                        "kinbox-chaos topic-audit: metadata for %s: "
                        "%s\n",
                        topic, rd_kafka_err2str(e ? e : md->topics[0].err));
                return -1;
        }
        int parts = md->topics[0].partition_cnt, failures = 0;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(rkt);
        *tpp = rd_kafka_topic_partition_list_new(parts);
        *live = 0;
        *total_high = 0;
        for (int p = 0; p < parts; p++) {
                int64_t lo, hi;
                e = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi,
                                                     10000);
                if (e) {
                        fprintf(stderr,
                                "kinbox-chaos topic-audit: "
                                "watermarks %s [%d]: %s\n",
                                topic, p, rd_kafka_err2str(e));
                        return -1;
                }
                if (lo != 0) {
                        printf("topic-audit: FAIL partition %d starts at "
                               "offset %lld: the broker dropped data, the "
                               "topic cannot be audited\n",
                               p, (long long)lo);
                        failures++;
                }
                *total_high += hi;
                if (hi > lo) {
                        rd_kafka_topic_partition_list_add(*tpp, topic, p)
                            ->offset = lo;
                        (*live)++;
                }
        }
        return failures;
}

/* One message: its payload "aNN SEQ", key, message_id header and place in
 * its aggregate's order. */
static void
check_message(const rd_kafka_message_t *m, const char *topic, aggst_t *st,
              audit_t *au)
{
        au->msgs++;
        char pl[64] = "", key[64] = "", idh[160] = "", want[160];
        if (m->len < sizeof(pl))
                memcpy(pl, m->payload, m->len);
        if (m->key_len < sizeof(key))
                memcpy(key, m->key, m->key_len);
        rd_kafka_headers_t *h = NULL;
        const void *hv;
        size_t hs;
        if (!rd_kafka_message_headers(m, &h) &&
            !rd_kafka_header_get_last(h, "message_id", &hv, &hs) && hv &&
            hs < sizeof(idh))
                memcpy(idh, hv, hs);
        long a, s;
        if (sscanf(pl, "a%ld %ld", &a, &s) != 2 || a < 0 || a >= MAX_AGG ||
            s < 1) {
                if (au->unexpected++ < 10)
                        printf("topic-audit: FAIL partition %d offset %lld: "
                               "unknown payload\n",
                               (int)m->partition, (long long)m->offset);
                return;
        }
        char aname[32];
        snprintf(aname, sizeof(aname), "a%ld", a);
        if (strcmp(key, aname) && au->bad_key++ < 10)
                printf("topic-audit: FAIL %s: key \"%s\"\n", pl, key);
        snprintf(want, sizeof(want), "%s:a%ld-%ld", topic, a, s);
        if (strcmp(idh, want) && au->bad_header++ < 10)
                printf("topic-audit: FAIL %s: message_id \"%s\", expected "
                       "\"%s\"\n",
                       pl, idh, want);
        if (s > st[a].expect) {
                if (au->unexpected++ < 10)
                        printf("topic-audit: FAIL %s: the writer committed "
                               "only %ld rows of a%ld\n",
                               pl, st[a].expect, a);
        } else if (s <= st[a].maxseen) {
                au->copies++; /* re-published */
        } else if (s == st[a].maxseen + 1) {
                st[a].maxseen = s;
        } else {
                if (au->order_bad++ < 10)
                        printf("topic-audit: FAIL a%ld: %ld published "
                               "before %ld (partition %d offset %lld)\n",
                               a, s, st[a].maxseen + 1, (int)m->partition,
                               (long long)m->offset);
                /* count it seen so one slip is one error */
                st[a].maxseen = s;
        }
}

/* Read the assigned partitions to their ends; 1 when they went quiet. */
static int
read_all(rd_kafka_t *rk, int live, const char *topic, aggst_t *st, audit_t *au)
{
        int eof = 0, idle = 0;
        while (eof < live) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 1000);
                if (!m) {
                        if (++idle > 60) {
                                printf("topic-audit: FAIL no message for 60 "
                                       "s before the end of the topic\n");
                                return 1;
                        }
                        continue;
                }
                idle = 0;
                if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
                        eof++;
                else if (m->err)
                        fprintf(stderr, "kinbox-chaos topic-audit: %s\n",
                                rd_kafka_message_errstr(m));
                else
                        check_message(m, topic, st, au);
                rd_kafka_message_destroy(m);
        }
        return 0;
}

static int
cmd_topic_audit(int argc, char **argv)
{
        const char *bootstrap = NULL, *topic = NULL, *expect = NULL;
        for (int i = 0; i < argc; i += 2) {
                const char *o = argv[i],
                           *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (!v) {
                        fprintf(stderr,
                                "kinbox-chaos topic-audit: %s needs "
                                "a value\n",
                                o);
                        return 2;
                }
                if (!strcmp(o, "--bootstrap"))
                        bootstrap = v;
                else if (!strcmp(o, "--topic"))
                        topic = v;
                else if (!strcmp(o, "--expect"))
                        expect = v;
                else {
                        fprintf(stderr,
                                "kinbox-chaos topic-audit: unknown "
                                "option %s\n",
                                o);
                        return 2;
                }
        }
        if (!bootstrap || !topic || !expect) {
                fprintf(stderr, "kinbox-chaos topic-audit: --bootstrap, "
                                "--topic and --expect are required\n");
                return 2;
        }
        aggst_t *st = calloc(MAX_AGG, sizeof(*st));
        if (!st)
                return 1;
        long expected_rows, naggs;
        int rc = read_expect(expect, st, &expected_rows, &naggs);
        rd_kafka_t *rk = rc ? NULL : audit_consumer(bootstrap);
        if (!rk) {
                free(st);
                return rc ? rc : 1;
        }
        rd_kafka_topic_partition_list_t *tp = NULL;
        int live = 0;
        int64_t total_high = 0;
        int failures = topic_partitions(rk, topic, &tp, &live, &total_high);
        if (failures < 0) {
                rd_kafka_destroy(rk);
                free(st);
                return 1;
        }
        audit_t au = {0};
        if (live) {
                rd_kafka_assign(rk, tp);
                failures += read_all(rk, live, topic, st, &au);
        }
        long missing = 0;
        for (long a = 0; a < MAX_AGG; a++)
                if (st[a].maxseen < st[a].expect) {
                        if (missing < 10)
                                printf("topic-audit: FAIL a%ld: rows %ld..%ld "
                                       "committed but not on the topic\n",
                                       a, st[a].maxseen + 1, st[a].expect);
                        missing += st[a].expect - st[a].maxseen;
                }
        failures += missing > 0 || au.unexpected || au.order_bad ||
                    au.bad_key || au.bad_header;
        printf("topic-audit: %ld messages on %s (high watermarks %lld), %ld "
               "rows of %ld aggregates expected, %ld re-published copies; "
               "missing %ld, unexpected %ld, out of order %ld, wrong key "
               "%ld, wrong message_id %ld\n",
               au.msgs, topic, (long long)total_high, expected_rows, naggs,
               au.copies, missing, au.unexpected, au.order_bad, au.bad_key,
               au.bad_header);
        rd_kafka_topic_partition_list_destroy(tp);
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        free(st);
        return failures ? 1 : 0;
}

int
main(int argc, char **argv)
{
        if (argc >= 2 && !strcmp(argv[1], "writer"))
                return cmd_writer(argc - 2, argv + 2);
        if (argc >= 2 && !strcmp(argv[1], "topic-audit"))
                return cmd_topic_audit(argc - 2, argv + 2);
        fprintf(
            stderr,
            "usage: kinbox-chaos writer --url URL --topic TOPIC --out FILE "
            "[--aggregates N] [--rows-per-tx K] [--pause-ms MS] "
            "[--seed S]\n"
            "       kinbox-chaos topic-audit --bootstrap B --topic TOPIC "
            "--expect FILE\n");
        return 2;
}
