/*
 * relay_bench -- outbox relay benchmark on the public kinbox_relay_* API
 * (the same relay `kinbox run` starts with `[relay] enabled = true`).
 *
 *   Environment: KINBOX_BENCH_RELAY_CLAIM (relay.claim: lock / lease),
 *   RB_LOCK_MS (relay.lock.ms), RB_PIPELINE, RB_LINGER, RB_NAGLE, RB_LOG
 *   (log.level of the relays: debug logs every batch's timings), RB_KDEBUG
 *   (librdkafka's debug contexts of the relays' producers), RB_SOURCE
 *   (relay.source: wal reads the log; its slot RB_SLOT must exist before
 *   the backlog is written, e.g. made by `kinbox migrate`; binlog: its
 *   position in kinbox_relay_position, relay RB_SLOT, likewise).
 *
 *   relay_bench throughput --url URL -b BOOTSTRAP --relays K -n N
 *         [--batch B]
 *       The outbox already holds N committed pending rows. Starts K relays
 *       (threads of this process, each its own relay object: own DB
 *       connection, own producer) and measures from their start to the
 *       moment the relays' counters say N rows were acknowledged by the
 *       broker and marked sent. Prints "seconds rate conflicts".
 *
 *   relay_bench drain --url URL
 *       The plain SQL drain limit of kinbox_outbox, no Kafka: one
 *       connection claims 100 pending rows in id order FOR UPDATE SKIP
 *       LOCKED, marks them sent in one statement and commits, until none
 *       is left. Both backends walk the pending-rows index of migration
 *       0004 like the relay (PostgreSQL: an index-only read of the ids,
 *       then the lock; the plain one-step form walks the primary key on an
 *       analyzed table and steps over every sent row). Prints
 *       "seconds rate rows".
 *
 *   relay_bench latency --url URL -b BOOTSTRAP -t TOPIC -n N --rate R
 *         --notify true|false [--poll-ms MS]
 *       One relay, started together with the appends (the relay's first
 *       second is measured too); this process appends N rows at R rows/s,
 *       each in its own
 *       committed transaction (kinbox_outbox_append_pg/_mysql), waits until
 *       all are sent, and prints "p50_ms p99_ms max_ms" of sent_at -
 *       created_at (database clock: the single-row appending transaction's
 *       start, to the relay's mark-sent transaction after the broker ack).
 */
#include <kinbox/kinbox.h>
#include <kinbox/outbox.h>
#include <libpq-fe.h>
#include <mysql.h>

#include "mysql_url.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double
now_mono(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *url, *bootstrap, *topic = "relay.bench", *notify = "true",
                                    *poll_ms = NULL, *batch = NULL;
static int nrelays = 1, rate = 200;
static long n;

static void *
run_relay(void *arg)
{
        kinbox_relay_t *r = arg;
        if (kinbox_relay_run(r))
                fprintf(stderr, "relay_bench: relay: %s\n",
                        kinbox_relay_errstr(r));
        return NULL;
}

static kinbox_relay_t *
mk_relay(int idx)
{
        char err[512], name[32];
        kinbox_conf_t *c = kinbox_conf_new();
        snprintf(name, sizeof(name), "bench-relay-%d", idx);
        const char *kv[][2] = {
            {"name", name},
            {"database.url", url},
            {"kafka.bootstrap.servers", bootstrap},
            {"relay.notify", notify},
            {"log.level", getenv("RB_LOG") ? getenv("RB_LOG") : "warning"},
            {"relay.poll.ms", poll_ms},
            {"relay.batch.size", batch},
            {"kafka.linger.ms", getenv("RB_LINGER")},
            {"relay.pipeline", getenv("RB_PIPELINE")},
            {"relay.claim", getenv("KINBOX_BENCH_RELAY_CLAIM")},
            {"relay.lock.ms", getenv("RB_LOCK_MS")},
            {"kafka.socket.nagle.disable", getenv("RB_NAGLE")},
            {"relay.source", getenv("RB_SOURCE")},
            {"relay.slot", getenv("RB_SLOT")},
            {"kafka.debug", getenv("RB_KDEBUG")}};
        for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
                if (kv[i][1] &&
                    kinbox_conf_set(c, kv[i][0], kv[i][1], err, sizeof(err))) {
                        fprintf(stderr, "relay_bench: %s\n", err);
                        exit(2);
                }
        kinbox_relay_t *r = kinbox_relay_new(c, err, sizeof(err));
        if (!r) {
                fprintf(stderr, "relay_bench: %s\n", err);
                exit(1);
        }
        return r;
}

static uint64_t
published(kinbox_relay_t **rs, int k, uint64_t *conflicts)
{
        uint64_t sum = 0, cf = 0;
        for (int i = 0; i < k; i++) {
                kinbox_relay_stats_t st;
                kinbox_relay_stats(rs[i], &st);
                sum += st.published;
                cf += st.conflicts;
        }
        if (conflicts)
                *conflicts = cf;
        return sum;
}

static int
throughput(void)
{
        kinbox_relay_t *rs[8];
        pthread_t th[8];
        for (int i = 0; i < nrelays; i++)
                rs[i] = mk_relay(i + 1);
        double t0 = now_mono();
        for (int i = 0; i < nrelays; i++)
                pthread_create(&th[i], NULL, run_relay, rs[i]);
        uint64_t cf = 0;
        while (published(rs, nrelays, &cf) < (uint64_t)n) {
                if (now_mono() - t0 > 600) {
                        fprintf(stderr, "relay_bench: timeout\n");
                        break;
                }
                usleep(2000);
        }
        double dt = now_mono() - t0;
        for (int i = 0; i < nrelays; i++)
                kinbox_relay_stop(rs[i]);
        for (int i = 0; i < nrelays; i++) {
                pthread_join(th[i], NULL);
                kinbox_relay_destroy(rs[i]);
        }
        printf("%.6f %.1f %llu\n", dt, n / dt, (unsigned long long)cf);
        return 0;
}

static int
cmpd(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;
        return x < y ? -1 : x > y;
}

static int
latency(void)
{
        int is_my = !strncmp(url, "mysql://", 8);
        PGconn *pg = NULL;
        MYSQL *my = NULL;
        char err[512];
        if (is_my) {
                if (!(my = bench_mysql_connect(url, err, sizeof(err)))) {
                        fprintf(stderr, "relay_bench: %s\n", err);
                        return 1;
                }
        } else {
                pg = PQconnectdb(url);
                if (PQstatus(pg) != CONNECTION_OK)
                        return 1;
        }
        kinbox_relay_t *r = mk_relay(1);
        pthread_t th;
        pthread_create(&th, NULL, run_relay, r);
        double t0 = now_mono();
        for (long i = 0; i < n; i++) {
                double due = t0 + (double)i / rate;
                double w = due - now_mono();
                if (w > 0)
                        usleep((useconds_t)(w * 1e6));
                char key[48], agg[32], pl[96];
                snprintf(key, sizeof(key), "lat-%ld", i);
                snprintf(agg, sizeof(agg), "agg-%ld", i % 100);
                snprintf(pl, sizeof(pl), "{\"order_id\":\"o-%ld\"}", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = key,
                                         .aggregate_id = agg,
                                         .payload = pl,
                                         .payload_size = strlen(pl)};
                kinbox_err_t e;
                if (pg) {
                        PQclear(PQexec(pg, "BEGIN"));
                        e = kinbox_outbox_append_pg(pg, &m, NULL, err,
                                                    sizeof(err));
                        PQclear(PQexec(pg, "COMMIT"));
                } else {
                        mysql_query(my, "START TRANSACTION");
                        e = kinbox_outbox_append_mysql(my, &m, NULL, err,
                                                       sizeof(err));
                        mysql_query(my, "COMMIT");
                }
                if (e) {
                        fprintf(stderr, "relay_bench: append: %s\n", err);
                        return 1;
                }
        }
        double tw = now_mono();
        while (published(&r, 1, NULL) < (uint64_t)n && now_mono() - tw < 60)
                usleep(2000);
        kinbox_relay_stop(r);
        pthread_join(th, NULL);
        kinbox_relay_destroy(r);

        double *d = calloc((size_t)n, sizeof(*d));
        long k = 0;
        const char *q =
            is_my ? "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) "
                    "/ 1000.0 FROM kinbox_outbox WHERE status = 'sent'"
                  : "SELECT EXTRACT(EPOCH FROM sent_at - created_at) * 1000 "
                    "FROM kinbox_outbox WHERE status = 'sent'";
        if (pg) {
                PGresult *res = PQexec(pg, q);
                for (int i = 0; i < PQntuples(res) && k < n; i++)
                        d[k++] = atof(PQgetvalue(res, i, 0));
                PQclear(res);
                PQfinish(pg);
        } else {
                if (!mysql_query(my, q)) {
                        MYSQL_RES *res = mysql_store_result(my);
                        MYSQL_ROW row;
                        while (res && (row = mysql_fetch_row(res)) && k < n)
                                d[k++] = atof(row[0]);
                        if (res)
                                mysql_free_result(res);
                }
                mysql_close(my);
        }
        if (k != n) {
                fprintf(stderr, "relay_bench: only %ld of %ld rows sent\n", k,
                        n);
                return 1;
        }
        qsort(d, (size_t)k, sizeof(*d), cmpd);
        printf("%.2f %.2f %.2f\n", d[k / 2], d[(k * 99) / 100], d[k - 1]);
        free(d);
        return 0;
}

static int
drain(void)
{
        int is_my = !strncmp(url, "mysql://", 8);
        char err[512];
        PGconn *pg = NULL;
        MYSQL *my = NULL;
        if (is_my) {
                if (!(my = bench_mysql_connect(url, err, sizeof(err)))) {
                        fprintf(stderr, "relay_bench: %s\n", err);
                        return 1;
                }
        } else {
                pg = PQconnectdb(url);
                if (PQstatus(pg) != CONNECTION_OK)
                        return 1;
        }
        long total = 0;
        double t0 = now_mono();
        for (;;) {
                long got = 0;
                if (pg) {
                        PGresult *res = PQexec(
                            pg,
                            "WITH w AS MATERIALIZED (SELECT id FROM "
                            "kinbox_outbox WHERE status = 'pending' AND "
                            "next_attempt_at <= now() ORDER BY id LIMIT "
                            "100), c AS (SELECT id FROM kinbox_outbox WHERE "
                            "id IN (SELECT id FROM w) AND status = "
                            "'pending' FOR UPDATE SKIP LOCKED) "
                            "UPDATE kinbox_outbox o SET "
                            "status = 'sent', sent_at = now(), version = "
                            "o.version + 1 FROM c WHERE o.id = c.id");
                        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                                fprintf(stderr, "relay_bench: %s",
                                        PQresultErrorMessage(res));
                                return 1;
                        }
                        got = atol(PQcmdTuples(res));
                        PQclear(res);
                } else {
                        char q[8192];
                        int k = snprintf(q, sizeof(q),
                                         "UPDATE kinbox_outbox SET status = "
                                         "'sent', sent_at = "
                                         "CURRENT_TIMESTAMP(6), version = "
                                         "version + 1 WHERE id IN (");
                        mysql_query(my, "START TRANSACTION");
                        if (mysql_query(my, "SELECT id FROM kinbox_outbox "
                                            "FORCE INDEX "
                                            "(kinbox_outbox_pending) "
                                            "WHERE status = 'pending' ORDER "
                                            "BY id LIMIT 100 FOR UPDATE SKIP "
                                            "LOCKED")) {
                                fprintf(stderr, "relay_bench: %s\n",
                                        mysql_error(my));
                                return 1;
                        }
                        MYSQL_RES *res = mysql_store_result(my);
                        MYSQL_ROW row;
                        while ((row = mysql_fetch_row(res)))
                                k +=
                                    snprintf(q + k, sizeof(q) - (size_t)k,
                                             "%s%s", got++ ? "," : "", row[0]);
                        mysql_free_result(res);
                        snprintf(q + k, sizeof(q) - (size_t)k, ")");
                        if (got && mysql_query(my, q)) {
                                fprintf(stderr, "relay_bench: %s\n",
                                        mysql_error(my));
                                return 1;
                        }
                        mysql_query(my, "COMMIT");
                }
                if (!got)
                        break;
                total += got;
        }
        double dt = now_mono() - t0;
        printf("%.6f %.1f %ld\n", dt, total / dt, total);
        if (pg)
                PQfinish(pg);
        else
                mysql_close(my);
        return 0;
}

int
main(int argc, char **argv)
{
        if (argc < 2)
                return 2;
        for (int i = 2; i + 1 < argc; i += 2) {
                const char *a = argv[i], *v = argv[i + 1];
                if (!strcmp(a, "--url"))
                        url = v;
                else if (!strcmp(a, "-b"))
                        bootstrap = v;
                else if (!strcmp(a, "-t"))
                        topic = v;
                else if (!strcmp(a, "-n"))
                        n = atol(v);
                else if (!strcmp(a, "--relays"))
                        nrelays = atoi(v);
                else if (!strcmp(a, "--rate"))
                        rate = atoi(v);
                else if (!strcmp(a, "--notify"))
                        notify = v;
                else if (!strcmp(a, "--poll-ms"))
                        poll_ms = v;
                else if (!strcmp(a, "--batch"))
                        batch = v;
                else {
                        fprintf(stderr, "relay_bench: unknown %s\n", a);
                        return 2;
                }
        }
        if (url && !strcmp(argv[1], "drain"))
                return drain();
        if (!url || !bootstrap || n <= 0 || nrelays < 1 || nrelays > 8)
                return 2;
        if (!strcmp(argv[1], "throughput"))
                return throughput();
        if (!strcmp(argv[1], "latency"))
                return latency();
        return 2;
}
