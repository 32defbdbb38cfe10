/*
 * baseline_consumer -- the hand-written per-message consumer that kinbox's
 * benchmarks compare against.
 *
 * For every message: one database transaction doing the inbox INSERT (a
 * duplicate message id skips the effect) and the points effect (a
 * user_points_flow row + the user_account upsert), COMMIT, and only then a
 * SYNCHRONOUS offset commit of that message. The schema is the one
 * `kinbox migrate` creates for the points handler, so the same audit runs on
 * both.
 *
 * usage: baseline_consumer -b BOOTSTRAP -t TOPIC -g GROUP
 *            (--pg CONNINFO | --mysql mysql://user:pass@host:port/db)
 *            [-c CONSUMER_NAME]
 * Runs until SIGTERM/SIGINT, then closes the consumer (leaves the group).
 */
#include <errno.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <mysql.h>

#include "mysql_url.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t stop;
static void
on_sig(int s)
{
        (void)s;
        stop = 1;
}

static PGconn *pg;
static MYSQL *my;
static const char *consumer = "baseline";

static void
die(const char *what, const char *detail)
{
        fprintf(stderr, "baseline_consumer: %s: %s\n", what,
                detail ? detail : "");
        exit(1);
}

/* ---------------------------------------------------------- PostgreSQL */

static int
pg_ok(PGresult *r, const char *what)
{
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
                return 1;
        fprintf(stderr, "baseline_consumer: %s: %s", what,
                PQresultErrorMessage(r));
        return 0;
}

/* 1 applied, 0 duplicate, 2 business duplicate, -1 error (rolled back). */
static int
pg_apply(const char *topic, int part, long long off, const char *id,
         const char *order, long long user, long long pts)
{
        char ps[16], os[24], us[24], ptss[24];
        snprintf(ps, sizeof(ps), "%d", part);
        snprintf(os, sizeof(os), "%lld", off);
        snprintf(us, sizeof(us), "%lld", user);
        snprintf(ptss, sizeof(ptss), "%lld", pts);
        PGresult *r = PQexec(pg, "BEGIN");
        int ok = pg_ok(r, "BEGIN");
        PQclear(r);
        if (!ok)
                return -1;
        const char *ip[5] = {consumer, id, topic, ps, os};
        r = PQexecParams(pg,
                         "INSERT INTO kinbox_inbox (consumer, message_id, "
                         "topic, kafka_partition, kafka_offset) VALUES ($1, "
                         "$2, $3, $4, $5) ON CONFLICT DO NOTHING",
                         5, NULL, ip, NULL, NULL, 0);
        ok = pg_ok(r, "inbox insert");
        int fresh = ok && atoi(PQcmdTuples(r)) == 1;
        PQclear(r);
        if (ok && fresh) {
                const char *fp[3] = {us, order, ptss};
                r = PQexecParams(pg,
                                 "INSERT INTO user_points_flow (user_id, "
                                 "order_id, biz_type, points_delta) VALUES "
                                 "($1, $2, 'ORDER_REWARD', $3) ON CONFLICT "
                                 "(order_id, biz_type) DO NOTHING",
                                 3, NULL, fp, NULL, NULL, 0);
                ok = pg_ok(r, "flow insert");
                /* a taken order: a business duplicate, not credited */
                if (ok && atoi(PQcmdTuples(r)) != 1)
                        fresh = 2;
                PQclear(r);
        }
        if (ok && fresh == 1) {
                const char *ap[2] = {us, ptss};
                r = PQexecParams(pg,
                                 "INSERT INTO user_account (user_id, points) "
                                 "VALUES ($1, $2) ON CONFLICT (user_id) DO "
                                 "UPDATE SET points = user_account.points + "
                                 "EXCLUDED.points",
                                 2, NULL, ap, NULL, NULL, 0);
                ok = pg_ok(r, "account upsert");
                PQclear(r);
        }
        r = PQexec(pg, ok ? "COMMIT" : "ROLLBACK");
        int cok = pg_ok(r, "COMMIT");
        PQclear(r);
        if (!ok || !cok)
                return -1;
        return fresh;
}

/* ---------------------------------------------------------- MySQL */

static int
my_q(const char *sql, const char *what)
{
        if (mysql_query(my, sql)) {
                fprintf(stderr, "baseline_consumer: %s: %u %s\n", what,
                        mysql_errno(my), mysql_error(my));
                return 0;
        }
        MYSQL_RES *res = mysql_store_result(my);
        if (res)
                mysql_free_result(res);
        return 1;
}

static int
my_apply(const char *topic, int part, long long off, const char *id,
         const char *order, long long user, long long pts)
{
        char eid[600], eorder[600], etopic[600], sql[2400];
        mysql_real_escape_string(my, eid, id, strlen(id));
        mysql_real_escape_string(my, eorder, order, strlen(order));
        mysql_real_escape_string(my, etopic, topic, strlen(topic));
        if (!my_q("START TRANSACTION", "START TRANSACTION"))
                return -1;
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
                 "kafka_partition, kafka_offset) VALUES ('%s', '%s', '%s', "
                 "%d, %lld) ON DUPLICATE KEY UPDATE kafka_offset = "
                 "kafka_offset",
                 consumer, eid, etopic, part, off);
        int ok = my_q(sql, "inbox insert");
        int fresh = ok && mysql_affected_rows(my) == 1;
        if (ok && fresh) {
                snprintf(sql, sizeof(sql),
                         "INSERT INTO user_points_flow (user_id, order_id, "
                         "biz_type, points_delta) VALUES (%lld, '%s', "
                         "'ORDER_REWARD', %lld) ON DUPLICATE KEY UPDATE "
                         "order_id = order_id",
                         user, eorder, pts);
                ok = my_q(sql, "flow insert");
                /* a taken order: a business duplicate, not credited */
                if (ok && mysql_affected_rows(my) != 1)
                        fresh = 2;
        }
        if (ok && fresh == 1) {
                snprintf(sql, sizeof(sql),
                         "INSERT INTO user_account (user_id, points) VALUES "
                         "(%lld, %lld) ON DUPLICATE KEY UPDATE points = "
                         "points + VALUES(points)",
                         user, pts);
                ok = my_q(sql, "account upsert");
        }
        int cok = my_q(ok ? "COMMIT" : "ROLLBACK", "COMMIT");
        if (!ok || !cok)
                return -1;
        return fresh;
}

static void
my_connect(const char *url)
{
        char err[600];
        my = bench_mysql_connect(url, err, sizeof(err));
        if (!my)
                die("mysql", err);
        my_q("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
             "isolation");
        my_q("SET NAMES utf8mb4", "names");
}

/* ---------------------------------------------------------- main */

/* A consumer of topic in group, committing only what the loop stores. */
static rd_kafka_t *
subscribe(const char *bootstrap, const char *group, const char *topic)
{
        char err[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        const char *kv[][2] = {{"bootstrap.servers", bootstrap},
                               {"group.id", group},
                               {"enable.auto.commit", "false"},
                               {"enable.auto.offset.store", "false"},
                               {"auto.offset.reset", "earliest"},
                               {"session.timeout.ms", "6000"}};
        for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
                if (rd_kafka_conf_set(conf, kv[i][0], kv[i][1], err,
                                      sizeof(err)))
                        die("kafka conf", err);
        rd_kafka_t *rk =
            rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
        if (!rk)
                die("rd_kafka_new", err);
        rd_kafka_poll_set_consumer(rk);
        rd_kafka_topic_partition_list_t *sub =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
        if (rd_kafka_subscribe(rk, sub))
                die("subscribe", topic);
        rd_kafka_topic_partition_list_destroy(sub);
        return rk;
}

int
main(int argc, char **argv)
{
        const char *bootstrap = NULL, *topic = NULL, *group = NULL,
                   *pgurl = NULL, *myurl = NULL;
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i],
                           *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (!v)
                        die("missing value for", a);
                if (!strcmp(a, "-b"))
                        bootstrap = v;
                else if (!strcmp(a, "-t"))
                        topic = v;
                else if (!strcmp(a, "-g"))
                        group = v;
                else if (!strcmp(a, "-c"))
                        consumer = v;
                else if (!strcmp(a, "--pg"))
                        pgurl = v;
                else if (!strcmp(a, "--mysql"))
                        myurl = v;
                else
                        die("unknown option", a);
                i++;
        }
        if (!bootstrap || !topic || !group || (!pgurl == !myurl))
                die("usage", "-b BOOTSTRAP -t TOPIC -g GROUP (--pg URL | "
                             "--mysql URL) [-c CONSUMER]");
        if (pgurl) {
                pg = PQconnectdb(pgurl);
                if (PQstatus(pg) != CONNECTION_OK)
                        die("pg connect", PQerrorMessage(pg));
        } else {
                my_connect(myurl);
        }
        signal(SIGTERM, on_sig);
        signal(SIGINT, on_sig);

        rd_kafka_t *rk = subscribe(bootstrap, group, topic);

        long long applied = 0, dups = 0, bizdups = 0, bad = 0;
        while (!stop) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
                if (!m)
                        continue;
                if (m->err) {
                        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                                fprintf(stderr, "baseline_consumer: %s\n",
                                        rd_kafka_message_errstr(m));
                        rd_kafka_message_destroy(m);
                        continue;
                }
                const void *idv = NULL;
                size_t idlen = 0;
                rd_kafka_headers_t *hdrs = NULL;
                char id[256] = "";
                if (!rd_kafka_message_headers(m, &hdrs) &&
                    !rd_kafka_header_get_last(hdrs, "message_id", &idv,
                                              &idlen) &&
                    idv && idlen < sizeof(id)) {
                        memcpy(id, idv, idlen);
                        id[idlen] = 0;
                }
                json_error_t je;
                json_t *root = json_loadb(m->payload, m->len, 0, &je);
                json_t *o = json_object_get(root, "order_id");
                json_t *u = json_object_get(root, "user_id");
                json_t *p = json_object_get(root, "grant_points");
                const char *tname = rd_kafka_topic_name(m->rkt);
                if (!*id || !json_is_string(o) || !json_is_integer(u) ||
                    !json_is_integer(p)) {
                        bad++; /* the benchmark produces none */
                } else {
                        int rc;
                        do {
                                rc = pg ? pg_apply(tname, m->partition,
                                                   m->offset, id,
                                                   json_string_value(o),
                                                   json_integer_value(u),
                                                   json_integer_value(p))
                                        : my_apply(tname, m->partition,
                                                   m->offset, id,
                                                   json_string_value(o),
                                                   json_integer_value(u),
                                                   json_integer_value(p));
                        } while (rc < 0 && !stop);
                        if (rc < 0) {
                                json_decref(root);
                                rd_kafka_message_destroy(m);
                                break; /* not committed: offset not stored */
                        }
                        if (rc == 1)
                                applied++;
                        else if (rc == 2)
                                bizdups++;
                        else
                                dups++;
                }
                json_decref(root);
                /* Only after COMMIT: store and synchronously commit. */
                rd_kafka_topic_partition_list_t *l =
                    rd_kafka_topic_partition_list_new(1);
                rd_kafka_topic_partition_list_add(l, tname, m->partition)
                    ->offset = m->offset + 1;
                rd_kafka_offsets_store(rk, l);
                rd_kafka_topic_partition_list_destroy(l);
                rd_kafka_resp_err_t ce = rd_kafka_commit(rk, NULL, 0);
                if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET)
                        fprintf(stderr, "baseline_consumer: commit: %s\n",
                                rd_kafka_err2str(ce));
                rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        if (pg)
                PQfinish(pg);
        if (my)
                mysql_close(my);
        fprintf(
            stderr,
            "baseline_consumer: applied %lld, duplicates %lld (redelivered) "
            "+ %lld (business), bad %lld\n",
            applied, dups, bizdups, bad);
        return 0;
}
