/*
 * partition_test.c -- the partitioned inbox (inbox.layout = partitioned)
 * on both backends: which copies of a message are caught across range
 * boundaries (midnight, the skew, a DST change, the relay's re-publish),
 * the lifecycle of `kinbox prune` (ranges dropped past the retention,
 * rows a dead letter needs kept, ranges created ahead, the catch-all), the
 * online conversion of a plain inbox under a running consumer, the
 * refusals, and the points stream end to end.
 */
#include "harness.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "metrics.h"
#include "../handlers/points/points.h"

#define DAY_MS INT64_C(86400000)
#define MIN_MS INT64_C(60000)

static bool
is_my(int backend)
{
        return backend == 1;
}

static int64_t
now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The next UTC midnight after now: a boundary between two ranges that
 * both exist (inbox.partition.ahead is 3 days). */
static int64_t
next_midnight(void)
{
        return (now_ms() / DAY_MS + 1) * DAY_MS;
}

/* The test handler: every application of a message is a row (no business
 * key, so a copy the inbox lets through shows as a second row); payload
 * "poison" is rejected (dead-lettered). */
static kinbox_result_t
record(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        size_t n = 0;
        const char *p = kinbox_msg_payload(msg, &n);
        if (n == 6 && !memcmp(p, "poison", 6))
                return KINBOX_RESULT_REJECT;
        char ts[32];
        snprintf(ts, sizeof(ts), "%lld", (long long)kinbox_msg_timestamp(msg));
        const char *v[2] = {kinbox_msg_id(msg), ts};
        return kinbox_tx_exec(tx,
                              "INSERT INTO pt_applied (id, ts) VALUES "
                              "($1, $2)",
                              2, v) == KINBOX_OK
                   ? KINBOX_RESULT_OK
                   : KINBOX_RESULT_RETRY;
}

static void
make_applied(const char *url, int backend)
{
        kt_exec(url, is_my(backend)
                         ? "CREATE TABLE pt_applied (id VARCHAR(200) NOT "
                           "NULL, ts BIGINT NOT NULL)"
                         : "CREATE TABLE pt_applied (id text NOT NULL, ts "
                           "bigint NOT NULL)");
}

static long long
applied(const char *url, const char *id)
{
        return kt_qintf(url, "SELECT COUNT(*) FROM pt_applied WHERE id = '%s'",
                        id);
}

/* A consumer configuration with the partitioned layout. */
static kinbox_conf_t *
part_conf(const char *url, const char *name, const char *topic)
{
        kinbox_conf_t *c = kt_conf(url, name, kt_unique(name), topic);
        kt_set(c, "inbox.layout", "partitioned");
        kt_set(c, "retry.max", "1");
        return c;
}

static void
migrate_ok(kinbox_conf_t *c)
{
        char e[512];
        kinbox_err_t rc = kinbox_migrate(c, e, sizeof(e));
        cr_assert(eq(int, rc, KINBOX_OK), "migrate: %s", e);
}

/* A fresh database with pt_applied, partitioned by kinbox migrate, and a
 * topic of parts partitions: the consumer's configuration. */
static kinbox_conf_t *
setup(int backend, const char *name, int parts, char **url, char **topic)
{
        *url = kt_fresh_db(kt_backend(backend));
        make_applied(*url, backend);
        *topic = kt_unique(name);
        kt_topic(*topic, parts);
        kinbox_conf_t *c = part_conf(*url, name, *topic);
        migrate_ok(c);
        return c;
}

/* Wait until group has committed every message of topic; asserts it. */
static void
wait_committed(const char *group, const char *topic, int parts, int secs)
{
        long long want = kt_high_sum(topic, parts), got = 0;
        long long end = kt_clock_ms() + secs * 1000LL;
        while (got < want && kt_clock_ms() < end) {
                usleep(100 * 1000);
                got = kt_committed_sum(group, topic, parts);
        }
        cr_assert(eq(i64, got, want), "committed %lld of %lld", got, want);
}

/* Run the consumer until every produced message is committed. */
static void
consume_all(kinbox_conf_t *conf, const char *topic, int parts)
{
        const char *group = kinbox_conf_get(conf, "group.id");
        char *g = strdup(group);
        kt_run_t *r = kt_run_start(conf, record, NULL, NULL);
        wait_committed(g, topic, parts, 60);
        kt_run_stop(r);
        free(g);
}

/* ---- which copies are caught ---- */

KT_BACKENDS_PARAMS(partition, boundaries)
ParameterizedTest(int *backend, partition, boundaries, .timeout = 180)
{
        char *url, *topic;
        kinbox_conf_t *c = setup(*backend, "ptb", 3, &url, &topic);
        if (!is_my(*backend)) /* kinbox stores UTC whatever the session's */
                kt_exec(url, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I "
                             "SET timezone = %L', current_database(), "
                             "'America/New_York'); END $$");
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_partitioning"), 1));
        int64_t m = next_midnight(), now = now_ms();
        /* 2026-03-08 07:00 UTC: New York's clocks jump an hour. */
        int64_t dst = INT64_C(1772953200000);
        struct {
                const char *id;
                int part;
                int64_t ts;
        } s[] = {
            {"resent", 0, now - 3600000}, /* a producer's re-send */
            {"resent", 0, now - 3600000},
            {"midnight", 0, m - 1}, /* the last ms of a day ... */
            {"midnight", 1, m}, /* ... and the first of the next */
            {"at-midnight", 0, m},
            {"at-midnight", 2, m},
            {"late-first", 1, m + 5 * MIN_MS}, /* the later copy first */
            {"late-first", 2, m - 4 * MIN_MS},
            {"same-range", 0, m + 3600000},
            {"same-range", 1, m + 20 * 3600000},
            {"other-part", 0, now},
            {"other-part", 1, now},
            {"in-batch", 2, m - 2},
            {"in-batch", 2, m + 2},
            {"dst", 0, dst - 500},
            {"dst", 1, dst + 500},
            {"beyond-skew", 0, m - 30 * MIN_MS},
        };
        kt_producer_t *p = kt_producer_new();
        for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
                kt_produce_at(p, topic, s[i].part, s[i].id, "{}", s[i].id,
                              s[i].ts);
        kt_producer_flush_destroy(p);
        kinbox_conf_t *again = kinbox_conf_dup(c);
        consume_all(c, topic, 3);
        /* Beyond the skew (10 min) across a boundary, in a later batch: a
         * new message, as documented (docs/operations.md, Daily
         * partitions). */
        p = kt_producer_new();
        kt_produce_at(p, topic, 1, "beyond-skew", "{}", "beyond-skew",
                      m + 30 * MIN_MS);
        kt_producer_flush_destroy(p);
        consume_all(again, topic, 3);

        const char *once[] = {"resent",     "midnight",   "at-midnight",
                              "late-first", "same-range", "other-part",
                              "in-batch",   "dst"};
        for (size_t i = 0; i < sizeof(once) / sizeof(once[0]); i++)
                cr_expect(eq(i64, applied(url, once[i]), 1), "%s applied",
                          once[i]);
        cr_expect(eq(i64, applied(url, "beyond-skew"), 2));
        /* One copy's rows each: the marker row of a copy in the last
         * minutes before midnight waits in the next day; a copy found
         * duplicate there leaves no row behind. */
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id = 'in-batch' AND shadow = "
                                  "TRUE"),
                     1));
        const char *one_row[] = {"at-midnight", "same-range", "other-part",
                                 "resent"};
        for (size_t i = 0; i < sizeof(one_row) / sizeof(one_row[0]); i++)
                cr_expect(eq(i64,
                             kt_qintf(url,
                                      "SELECT COUNT(*) FROM kinbox_inbox "
                                      "WHERE message_id = '%s'",
                                      one_row[i]),
                             1),
                          "%s: one row", one_row[i]);
        /* The DST pair's range is the UTC day. */
        cr_expect(eq(i64,
                     kt_qint(url, is_my(*backend)
                                      ? "SELECT COUNT(*) FROM kinbox_inbox "
                                        "WHERE message_id = 'dst' AND "
                                        "part_at = '2026-03-08 00:00:00'"
                                      : "SELECT COUNT(*) FROM kinbox_inbox "
                                        "WHERE message_id = 'dst' AND "
                                        "part_at = '2026-03-08 00:00:00+00'"),
                     1));
}

/* ---- the relay's re-publish carries the row's time ---- */

KT_BACKENDS_PARAMS(partition, relay_republish)
ParameterizedTest(int *backend, partition, relay_republish, .timeout = 180)
{
        char *url, *topic;
        kinbox_conf_t *c = setup(*backend, "ptr", 1, &url, &topic);
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox (destination, idem_key, "
                 "aggregate_id, payload) VALUES ('%s', 'o-1', 'a-1', '{}')",
                 topic);
        kt_exec(url, sql);
        const char *sent = "SELECT COUNT(*) FROM kinbox_outbox WHERE status = "
                           "'sent'";
        for (int round = 0; round < 2; round++) {
                kinbox_conf_t *rc = kt_conf(url, "ptr-relay", "x", topic);
                kt_set(rc, "relay.poll.ms", "100");
                kt_relay_t *r = kt_relay_start(rc);
                cr_assert(eq(i64, kt_wait_qint(url, sent, 1, 30), 1));
                kt_relay_stop(r);
                /* A relay that published and died before its mark. */
                if (!round)
                        kt_exec(url, "UPDATE kinbox_outbox SET status = "
                                     "'pending', sent_at = NULL, "
                                     "lease_owner = NULL, next_attempt_at = "
                                     "CURRENT_TIMESTAMP");
        }
        cr_assert(eq(i64, kt_high_sum(topic, 1), 2), "published twice");
        consume_all(c, topic, 1);
        snprintf(sql, sizeof(sql), "%s:o-1", topic);
        cr_assert(eq(i64, applied(url, sql), 1));
        /* The record's time is the row's created_at, not the send's. */
        long long created =
            kt_qint(url, is_my(*backend)
                             ? "SELECT FLOOR(UNIX_TIMESTAMP(created_at) * "
                               "1000) FROM kinbox_outbox"
                             : "SELECT floor(extract(epoch FROM created_at) "
                               "* 1000)::bigint FROM kinbox_outbox");
        cr_assert(
            eq(i64, kt_qint(url, "SELECT MAX(ts) FROM pt_applied"), created));
}

/* ---- the pruner's lifecycle ---- */

/* Range partitions of kinbox_inbox in the catalog. */
static long long
ranges(const char *url, int backend)
{
        return kt_qint(url, is_my(backend)
                                ? "SELECT COUNT(*) FROM "
                                  "information_schema.PARTITIONS WHERE "
                                  "TABLE_SCHEMA = DATABASE() AND TABLE_NAME "
                                  "= 'kinbox_inbox' AND PARTITION_NAME LIKE "
                                  "'p\\_2%'"
                                : "SELECT COUNT(*) FROM pg_inherits i JOIN "
                                  "pg_class c ON c.oid = i.inhrelid WHERE "
                                  "i.inhparent = 'kinbox_inbox'::regclass "
                                  "AND c.relname <> 'kinbox_inbox_default'");
}

static kinbox_prune_result_t
prune(const char *url, const char *retention, const char *ahead)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        kt_set(c, "inbox.retention", retention);
        kt_set(c, "inbox.partition.ahead", ahead);
        kinbox_prune_result_t res;
        char e[512];
        kinbox_err_t rc = kinbox_prune(c, 0, NULL, &res, e, sizeof(e));
        cr_assert(eq(int, rc, KINBOX_OK), "prune: %s", e);
        kinbox_conf_destroy(c);
        return res;
}

/* 1 when the table name exists in the test's database, else 0. */
static long long
table_count(const char *url, int backend, const char *name)
{
        return kt_qintf(url,
                        is_my(backend)
                            ? "SELECT COUNT(*) FROM information_schema.TABLES "
                              "WHERE TABLE_SCHEMA = DATABASE() AND "
                              "TABLE_NAME = '%s'"
                            : "SELECT COUNT(*) FROM pg_class WHERE relname = "
                              "'%s' AND relkind IN ('r', 'p')",
                        name);
}

KT_BACKENDS_PARAMS(partition, lifecycle)
ParameterizedTest(int *backend, partition, lifecycle, .timeout = 180)
{
        char *url, *topic;
        kinbox_conf_t *c = setup(*backend, "ptl", 1, &url, &topic);
        int64_t now = now_ms();
        long long before = ranges(url, *backend);
        /* 14 days back (inbox.retention) to 3 ahead: 17 or 18 ranges. */
        cr_assert(before >= 17 && before <= 18, "%lld ranges", before);
        kt_producer_t *p = kt_producer_new();
        kt_produce_at(p, topic, 0, "k", "{}", "old-1", now - 5 * DAY_MS);
        kt_produce_at(p, topic, 0, "k2", "poison", "old-2", now - 5 * DAY_MS);
        kt_produce_at(p, topic, 0, "k", "{}", "old-3", now - 5 * DAY_MS);
        kt_produce_at(p, topic, 0, "k", "{}", "new-1", now - DAY_MS);
        kt_produce_at(p, topic, 0, "k", "{}", "future", now + 30 * DAY_MS);
        kt_produce_at(p, topic, 0, "k", "{}", "future", now + 30 * DAY_MS);
        kt_producer_flush_destroy(p);
        consume_all(c, topic, 1);
        cr_assert(eq(i64, applied(url, "future"), 1), "catch-all dedup");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE status = 'dead'"),
                     1));

        /* Ranges whose whole span is over 2 days old go, oldest first. */
        int64_t w = DAY_MS, first = (now - 14 * DAY_MS) / w * w;
        uint64_t want = 0;
        for (int64_t s = first; s + w <= now - 2 * DAY_MS; s += w)
                want++;
        char e_buf[512];
        kinbox_prune_result_t res = prune(url, "2d", "3d");
        cr_assert(eq(u64, res.partitions_dropped, want));
        cr_assert(eq(u64, res.rows_kept, 1), "the dead letter's inbox row");
        cr_assert(eq(i64, ranges(url, *backend), before - (long long)want));
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id IN ('old-1', 'old-3')"),
                     0));
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id = 'old-2'"),
                     1));
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id IN ('new-1', 'future')"),
                     2));
        cr_expect(eq(dbl, kinbox__metrics_value("kinbox_inbox_partitions", ""),
                     (double)(before - (long long)want)));
        /* The kept old-2: PostgreSQL's catch-all; on MySQL the lowest
         * range, which took the dropped ranges' span (p_past is never
         * copied by a drop). */
        long long catchall = is_my(*backend) ? 1 : 2;
        cr_expect(eq(dbl,
                     kinbox__metrics_value("kinbox_inbox_partition_rows",
                                           "partition=\"catchall\""),
                     (double)catchall),
                  "future (and the kept old-2) in the catch-all");
        /* What `kinbox status` shows. */
        kinbox_conf_t *ac = kinbox_conf_new();
        kt_set(ac, "database.url", url);
        kinbox_admin_t *adm = kinbox_admin_new(ac, e_buf, sizeof(e_buf));
        cr_assert(adm != NULL, "%s", e_buf);
        kinbox_status_t *st = NULL;
        cr_assert(eq(int, kinbox_admin_status(adm, NULL, 0, &st), KINBOX_OK),
                  "%s", kinbox_admin_errstr(adm));
        cr_expect(
            eq(u64, st->npartitions, (uint64_t)(before - (long long)want)));
        cr_expect(eq(i64, st->partition_width_s, 86400));
        cr_expect(eq(i64, st->catchall_rows, catchall));
        kinbox_status_destroy(st);
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(ac);
        /* A drop a crash cut short leaves the range's table out of
         * kinbox_inbox (PostgreSQL: detached, not yet dropped; MySQL:
         * swapped out); the next run drops it, and nothing else: the
         * table a conversion keeps for the operator stays. */
        const char *left = is_my(*backend) ? "kinbox_inbox_old_20200101"
                                           : "kinbox_inbox_p20200101";
        if (is_my(*backend)) {
                kt_exec(url, "CREATE TABLE kinbox_inbox_old_20200101 LIKE "
                             "kinbox_inbox");
                kt_exec(url, "ALTER TABLE kinbox_inbox_old_20200101 REMOVE "
                             "PARTITIONING");
        } else {
                kt_exec(url, "CREATE TABLE kinbox_inbox_p20200101 (LIKE "
                             "kinbox_inbox)");
        }
        kt_exec(url, "CREATE TABLE kinbox_inbox_plain (consumer text)");
        cr_assert(eq(i64, table_count(url, *backend, left), 1));
        /* Two more days ahead; nothing more to drop. */
        res = prune(url, "2d", "5d");
        cr_assert(eq(u64, res.partitions_dropped, 0));
        cr_assert(eq(u64, res.partitions_created, 2));
        cr_expect(eq(i64, table_count(url, *backend, left), 0),
                  "%s left behind", left);
        cr_expect(
            eq(i64, table_count(url, *backend, "kinbox_inbox_plain"), 1));
}

/* ---- kinbox prune --dry-run ---- */

static kt_log_t dry_log;

/* prune() with dry (1: --dry-run), its log in dry_log. */
static kinbox_prune_result_t
prune_logged(const char *url, int dry)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        kt_set(c, "inbox.retention", "2d");
        kt_set(c, "inbox.partition.ahead", "3d");
        return kt_prune(c, dry, &dry_log);
}

/*
 * `kinbox prune --dry-run` on a partitioned inbox names the ranges the
 * real run would drop, with their rows, and changes nothing (every range
 * and row still there); the real run then drops exactly those.
 */
KT_BACKENDS_PARAMS(partition, dry_run)
ParameterizedTest(int *backend, partition, dry_run, .timeout = 180)
{
        char *url, *topic;
        kinbox_conf_t *c = setup(*backend, "ptd", 1, &url, &topic);
        int64_t now = now_ms();
        kt_producer_t *p = kt_producer_new();
        kt_produce_at(p, topic, 0, "k", "{}", "old-1", now - 5 * DAY_MS);
        kt_produce_at(p, topic, 0, "k", "{}", "old-2", now - 5 * DAY_MS);
        kt_produce_at(p, topic, 0, "k", "{}", "new-1", now - DAY_MS);
        kt_producer_flush_destroy(p);
        consume_all(c, topic, 1);
        long long before = ranges(url, *backend);
        long long rows = kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox");
        cr_assert(eq(i64, rows, 3));
        int64_t w = DAY_MS, first = (now - 14 * DAY_MS) / w * w;
        uint64_t want = 0;
        for (int64_t s = first; s + w <= now - 2 * DAY_MS; s += w)
                want++;

        kinbox_prune_result_t res = prune_logged(url, 1);
        cr_assert(eq(u64, res.partitions_dropped, want));
        char dry[4096], done[4096], lab[16];
        kt_words_after(dry_log.text, "would drop inbox partition ", dry,
                       sizeof(dry));
        int64_t old = (now - 5 * DAY_MS) / 1000;
        kinbox__range_label(lab, old - old % 86400, 86400);
        cr_assert(strstr(dry, lab) != NULL, "%s not named:\n%s", lab,
                  dry_log.text);
        size_t named = 0;
        for (const char *q = dry; (q = strchr(q, ',')); q++)
                named++;
        cr_assert(eq(sz, named, (size_t)want), "%s", dry_log.text);
        cr_assert(strstr(dry_log.text, "rows; dry run)") != NULL, "%s",
                  dry_log.text);
        /* Nothing changed. */
        cr_assert(eq(i64, ranges(url, *backend), before));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), rows));

        res = prune_logged(url, 0);
        cr_assert(eq(u64, res.partitions_dropped, want));
        kt_words_after(dry_log.text, "dropped inbox partition ", done,
                       sizeof(done));
        cr_assert(eq(str, done, dry), "dry run: %s; real run: %s", dry, done);
        cr_assert(eq(i64, ranges(url, *backend), before - (long long)want));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 1));
}

/* ---- a plain inbox converted under a running consumer ---- */

static void
produce_range(const char *topic, int from, int n, int64_t base)
{
        kt_producer_t *p = kt_producer_new();
        char id[32];
        for (int i = from; i < from + n; i++) {
                snprintf(id, sizeof(id), "c-%d", i);
                /* Every 7 minutes back over 35 hours: two midnights. */
                kt_produce_at(p, topic, i % 3, id, "{}", id,
                              base - (int64_t)i * 7 * MIN_MS);
        }
        kt_producer_flush_destroy(p);
}

KT_BACKENDS_PARAMS(partition, convert_online)
ParameterizedTest(int *backend, partition, convert_online, .timeout = 300)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        make_applied(url, *backend);
        char *topic = kt_unique("pt-c");
        kt_topic(topic, 3);
        int64_t base = next_midnight() + 5 * MIN_MS;
        produce_range(topic, 0, 150, base);
        kinbox_conf_t *c = kt_conf(url, "ptc", kt_unique("ptc"), topic);
        char *group = strdup(kinbox_conf_get(c, "group.id"));
        kt_run_t *r = kt_run_start(c, record, NULL, NULL);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM pt_applied", 150, 60),
            150));
        /* The conversion runs while the consumer goes on. */
        kinbox_conf_t *mc = kinbox_conf_new();
        kt_set(mc, "database.url", url);
        kt_set(mc, "inbox.layout", "partitioned");
        produce_range(topic, 150, 150, base);
        migrate_ok(mc);
        kinbox_conf_destroy(mc);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM pt_applied", 300, 60),
            300));
        /* Past the consumers' 10 s look at the layout: every copy again. */
        sleep(11);
        produce_range(topic, 0, 300, base);
        wait_committed(group, topic, 3, 60);
        kt_run_stop(r);
        free(group);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM pt_applied"), 300));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(DISTINCT id) FROM pt_applied"),
                     300));
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_partitioning"), 1));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "shadow = FALSE"),
                     300));
        cr_assert(gt(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox_plain"), 0));
}

/* ---- refusals ---- */

KT_BACKENDS_PARAMS(partition, refusals)
ParameterizedTest(int *backend, partition, refusals, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char e[512];
        /* A consumer that expects partitions the database lacks. */
        kinbox_conf_t *c = part_conf(url, "ptx", "pt-none");
        kinbox_consumer_t *k = kinbox_consumer_new(c, e, sizeof(e));
        cr_assert(k != NULL, "%s", e);
        kinbox_consumer_set_handler(k, record, NULL);
        cr_assert(eq(int, kinbox_consumer_run(k), KINBOX_ERR_SCHEMA));
        cr_assert(strstr(kinbox_consumer_errstr(k), "run kinbox migrate") !=
                      NULL,
                  "%s", kinbox_consumer_errstr(k));
        kinbox_consumer_destroy(k);
        /* Width and skew. */
        kinbox_conf_t *m = kinbox_conf_new();
        kt_set(m, "database.url", url);
        cr_assert(
            eq(int,
               kinbox_conf_set(m, "inbox.partition.width", "5h", e, sizeof(e)),
               KINBOX_ERR_INVALID));
        cr_assert(strstr(e, "divides a day") != NULL, "%s", e);
        kt_set(m, "inbox.layout", "partitioned");
        kt_set(m, "inbox.retention", "2d");
        kt_set(m, "inbox.partition.width", "1h");
        kt_set(m, "inbox.partition.skew", "30m");
        cr_assert(eq(int, kinbox_migrate(m, e, sizeof(e)), KINBOX_ERR_CONFIG));
        cr_assert(strstr(e, "under half") != NULL, "%s", e);
        kt_set(m, "inbox.partition.skew", "5m");
        migrate_ok(m);
        kt_set(m, "inbox.partition.width", "1d");
        cr_assert(eq(int, kinbox_migrate(m, e, sizeof(e)), KINBOX_ERR_CONFIG));
        cr_assert(strstr(e, "cannot change") != NULL, "%s", e);
        /* Hourly ranges: 2 days back and 3 ahead. */
        long long n = kt_qint(
            url, is_my(*backend)
                     ? "SELECT COUNT(*) FROM "
                       "information_schema.PARTITIONS WHERE "
                       "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
                       "'kinbox_inbox' AND PARTITION_NAME LIKE 'p\\_2%'"
                     : "SELECT COUNT(*) FROM pg_inherits WHERE "
                       "inhparent = 'kinbox_inbox'::regclass");
        cr_assert(n >= 5 * 24, "%lld ranges", n);
        /* More partitions than MariaDB allows (8,192), at migrate and at
         * run, with the number: 400 days and 3 ahead of hourly ranges. */
        kinbox_conf_t *big = kinbox_conf_dup(m);
        kt_set(big, "inbox.retention", "400d");
        kt_set(big, "inbox.partition.width", "1h");
        cr_assert(
            eq(int, kinbox_migrate(big, e, sizeof(e)), KINBOX_ERR_CONFIG));
        cr_assert(strstr(e, "need 9676 partitions") != NULL, "%s", e);
        kinbox_conf_t *bc = part_conf(url, "ptx", "pt-none");
        kt_set(bc, "inbox.retention", "400d");
        kt_set(bc, "inbox.partition.width", "1h");
        k = kinbox_consumer_new(bc, e, sizeof(e));
        cr_assert(k != NULL, "%s", e);
        kinbox_consumer_set_handler(k, record, NULL);
        cr_assert(eq(int, kinbox_consumer_run(k), KINBOX_ERR_CONFIG));
        cr_assert(strstr(kinbox_consumer_errstr(k), "9676") != NULL, "%s",
                  kinbox_consumer_errstr(k));
        kinbox_consumer_destroy(k);
        kinbox_conf_destroy(big);
        /* The retention must still cover the redelivery window. */
        kt_set(m, "inbox.retention", "1d");
        kt_set(m, "kafka.redelivery.window", "7d");
        kt_set(m, "topics", "pt-none");
        kt_set(m, "kafka.bootstrap.servers", "127.0.0.1:1");
        cr_assert(eq(int, kinbox_retention_check(m, NULL, NULL, e, sizeof(e)),
                     KINBOX_ERR_CONFIG));
        kinbox_conf_destroy(m);
}

/* ---- the database's clock, never the host's ---- */

static char logged[16384];

static void
grab_log(int level, const char *facility, const char *message, void *opaque)
{
        (void)facility;
        (void)opaque;
        size_t n = strlen(logged);
        if (level <= KINBOX_LOG_WARNING &&
            n + strlen(message) + 2 < sizeof(logged))
                snprintf(logged + n, sizeof(logged) - n, "%s\n", message);
}

KT_BACKENDS_PARAMS(partition, clock_ahead)
ParameterizedTest(int *backend, partition, clock_ahead, .timeout = 180)
{
        char *url, *topic;
        kinbox_conf_t *c = setup(*backend, "ptk", 1, &url, &topic);
        kinbox_conf_t *again = kinbox_conf_dup(c);
        int64_t now = now_ms();
        kt_producer_t *p = kt_producer_new();
        const char *ids[] = {"today-1", "today-2", "yesterday"};
        int64_t ts[] = {now, now - 1000, now - DAY_MS};
        for (int i = 0; i < 3; i++)
                kt_produce_at(p, topic, 0, "k", "{}", ids[i], ts[i]);
        kt_producer_flush_destroy(p);
        consume_all(c, topic, 1);
        long long before = ranges(url, *backend);
        /* This host's clock 30 days ahead of the database's. */
        setenv("KINBOX_FAULT_CLOCK_S", "2592000", 1);
        int64_t w = DAY_MS, first = (now - 14 * DAY_MS) / w * w;
        uint64_t want = 0;
        for (int64_t s = first; s + w <= now - 2 * DAY_MS; s += w)
                want++;
        kinbox_conf_t *pc = kinbox_conf_new();
        kt_set(pc, "database.url", url);
        kt_set(pc, "inbox.retention", "2d");
        kt_set(pc, "inbox.partition.ahead", "3d");
        kinbox_conf_set_log_cb(pc, grab_log, NULL);
        kinbox_prune_result_t res;
        char e[512];
        cr_assert(
            eq(int, kinbox_prune(pc, 0, NULL, &res, e, sizeof(e)), KINBOX_OK),
            "%s", e);
        kinbox_conf_destroy(pc);
        /* Only what the database's clock says is past the retention. */
        cr_expect(eq(u64, res.partitions_dropped, want));
        cr_expect(le(u64, res.partitions_created, 1), "ranges 30 days ahead");
        cr_expect(
            eq(i64, ranges(url, *backend),
               before - (long long)want + (long long)res.partitions_created));
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "shadow = FALSE"),
                     3));
        cr_expect(strstr(logged, "2592000 s ahead of the database's") != NULL,
                  "%s", logged);
        double skew =
            kinbox__metrics_value("kinbox_db_clock_skew_seconds", "");
        cr_expect(skew > 2592000 - 60 && skew < 2592000 + 60, "%f", skew);
        /* And what `kinbox status` shows. */
        kinbox_conf_t *ac = kinbox_conf_new();
        kt_set(ac, "database.url", url);
        kinbox_admin_t *adm = kinbox_admin_new(ac, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        kinbox_status_t *st = NULL;
        cr_assert(eq(int, kinbox_admin_status(adm, NULL, 0, &st), KINBOX_OK),
                  "%s", kinbox_admin_errstr(adm));
        cr_expect(st->db_clock_skew_ms > INT64_C(2592000000) - 60000 &&
                      st->db_clock_skew_ms < INT64_C(2592000000) + 60000,
                  "%" PRId64, st->db_clock_skew_ms);
        kinbox_status_destroy(st);
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(ac);
        /* Asked to drop today's range, the backend refuses: the
         * database's clock says it is young, whatever this host says. */
        kinbox_conf_t *dc = kinbox_conf_new();
        kt_set(dc, "database.url", url);
        kinbox__db_t *db = kinbox__db_new_conf(dc, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(eq(int, kinbox__db_connect(db), KINBOX_OK));
        kinbox__range_t today = {.start_s = now / DAY_MS * 86400};
        kinbox__range_label(today.name, today.start_s, 86400);
        char nm[sizeof(today.name) + 16];
        snprintf(nm, sizeof(nm), "%s%s",
                 is_my(*backend) ? "p_" : "kinbox_inbox_p", today.name);
        cr_assert(lt(sz, strlen(nm), sizeof(today.name)));
        memcpy(today.name, nm, strlen(nm) + 1);
        uint64_t kept = 0;
        cr_expect(eq(int,
                     db->ops->part->drop(db, &today, 86400, 2 * DAY_MS, &kept),
                     KINBOX_ERR_STATE));
        cr_expect(strstr(db->err.msg, "not past the retention") != NULL, "%s",
                  db->err.msg);
        kinbox__db_destroy(db);
        kinbox_conf_destroy(dc);
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "shadow = FALSE"),
                     3));
        /* Copies of the three, still consumed under that clock: none
         * applied again. */
        p = kt_producer_new();
        for (int i = 0; i < 3; i++)
                kt_produce_at(p, topic, 0, "k", "{}", ids[i], ts[i]);
        kt_producer_flush_destroy(p);
        consume_all(again, topic, 1);
        for (int i = 0; i < 3; i++)
                cr_expect(eq(i64, applied(url, ids[i]), 1), "%s", ids[i]);
        unsetenv("KINBOX_FAULT_CLOCK_S");
}

/* ---- records without a time, and records consumed late ---- */

KT_BACKENDS_PARAMS(partition, no_timestamp)
ParameterizedTest(int *backend, partition, no_timestamp, .timeout = 180)
{
        char *url, *topic;
        kinbox_conf_t *c = setup(*backend, "ptn", 1, &url, &topic);
        kinbox_conf_t *again = kinbox_conf_dup(c);
        kinbox_conf_t *third = kinbox_conf_dup(c);
        int64_t now = now_ms();
        kt_producer_t *p = kt_producer_new();
        kt_produce_at(p, topic, 0, "k", "{}", "no-time", -1);
        kt_produce_at(p, topic, 0, "k", "{}", "late", now - 26 * 3600000);
        kt_producer_flush_destroy(p);
        consume_all(c, topic, 1);
        cr_assert(eq(i64, applied(url, "no-time"), 1));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT ts FROM pt_applied WHERE id = "
                                  "'no-time'"),
                     -1),
                  "the record carried no time");
        /* Its row is keyed by the epoch's range, in the catch-all. */
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "message_id = 'no-time' AND part_at < "
                                  "'2000-01-01'"),
                     1));
        /* Redelivered a day later, then 20 days later (the consumer's
         * clock): caught each time. */
        const char *shift[] = {"86400", "1728000"};
        kinbox_conf_t *runs[] = {again, third};
        for (int i = 0; i < 2; i++) {
                setenv("KINBOX_FAULT_CLOCK_S", shift[i], 1);
                p = kt_producer_new();
                kt_produce_at(p, topic, 0, "k", "{}", "no-time", -1);
                kt_produce_at(p, topic, 0, "k", "{}", "late",
                              now - 26 * 3600000);
                kt_producer_flush_destroy(p);
                consume_all(runs[i], topic, 1);
        }
        unsetenv("KINBOX_FAULT_CLOCK_S");
        cr_expect(eq(i64, applied(url, "no-time"), 1));
        cr_expect(eq(i64, applied(url, "late"), 1));
}

/* ---- a conversion from an inbox written before msg_at ---- */

KT_BACKENDS_PARAMS(partition, convert_legacy)
ParameterizedTest(int *backend, partition, convert_legacy, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        make_applied(url, *backend);
        char *topic = kt_unique("pt-g");
        kt_topic(topic, 1);
        int64_t now = now_ms();
        const char *ids[] = {"legacy-late", "legacy-now", "plain-no-time"};
        int64_t ts[] = {now - 2 * DAY_MS - 3600000, now, -1};
        kt_producer_t *p = kt_producer_new();
        for (int i = 0; i < 3; i++)
                kt_produce_at(p, topic, 0, "k", "{}", ids[i], ts[i]);
        kt_producer_flush_destroy(p);
        kinbox_conf_t *c = kt_conf(url, "ptg", kt_unique("ptg"), topic);
        kinbox_conf_t *later = kinbox_conf_dup(c);
        kt_set(later, "inbox.layout", "partitioned");
        consume_all(c, topic, 1);
        /* Rows as kinbox wrote them before msg_at (schema 0008): the
         * first consumed two days after it was produced. */
        kt_exec(url, "UPDATE kinbox_inbox SET msg_at = NULL, part_at = NULL "
                     "WHERE message_id LIKE 'legacy-%'");
        kinbox_conf_t *mc = kinbox_conf_new();
        kt_set(mc, "database.url", url);
        kt_set(mc, "inbox.layout", "partitioned");
        migrate_ok(mc);
        kinbox_conf_destroy(mc);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_partitioning "
                                  "WHERE legacy_until IS NOT NULL"),
                     1));
        /* The three keyed by the epoch's range, in the catch-all. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "part_at < '2000-01-01'"),
                     3));
        /* Redelivered a day later, with one never seen: only that one
         * applied. */
        setenv("KINBOX_FAULT_CLOCK_S", "86400", 1);
        p = kt_producer_new();
        for (int i = 0; i < 3; i++)
                kt_produce_at(p, topic, 0, "k", "{}", ids[i], ts[i]);
        kt_produce_at(p, topic, 0, "k", "{}", "fresh", now);
        kt_producer_flush_destroy(p);
        consume_all(later, topic, 1);
        unsetenv("KINBOX_FAULT_CLOCK_S");
        for (int i = 0; i < 3; i++)
                cr_expect(eq(i64, applied(url, ids[i]), 1), "%s", ids[i]);
        cr_expect(eq(i64, applied(url, "fresh"), 1));
}

/* ---- the catch-all is never copied by a drop or an add ---- */

KT_BACKENDS_PARAMS(partition, catchall_million)
ParameterizedTest(int *backend, partition, catchall_million, .timeout = 600)
{
        char *url, *topic;
        kinbox_conf_destroy(setup(*backend, "ptm", 1, &url, &topic));
        /* A million rows without a time (the epoch's range: MySQL's
         * p_past, PostgreSQL's default partition), one far in the future
         * (MySQL's p_future). */
        kt_exec(url, is_my(*backend)
                         ? "INSERT INTO kinbox_inbox (consumer, message_id, "
                           "topic, kafka_partition, kafka_offset, msg_at, "
                           "part_at) SELECT 'bulk', CONCAT('b-', seq), 't', "
                           "0, seq, UTC_TIMESTAMP(), '1970-01-01 00:00:00' "
                           "FROM seq_1_to_1000000"
                         : "INSERT INTO kinbox_inbox (consumer, message_id, "
                           "topic, kafka_partition, kafka_offset, msg_at, "
                           "part_at) SELECT 'bulk', 'b-' || g, 't', 0, g, "
                           "now(), to_timestamp(0) FROM generate_series(1, "
                           "1000000) g");
        kt_exec(url, is_my(*backend)
                         ? "INSERT INTO kinbox_inbox (consumer, message_id, "
                           "topic, kafka_partition, kafka_offset, msg_at, "
                           "part_at) VALUES ('bulk', 'far', 't', 0, 0, "
                           "'2100-01-01', '2100-01-01')"
                         : "INSERT INTO kinbox_inbox (consumer, message_id, "
                           "topic, kafka_partition, kafka_offset, msg_at, "
                           "part_at) VALUES ('bulk', 'far', 't', 0, 0, "
                           "'2100-01-01+00', '2100-01-01+00')");
        long long before = ranges(url, *backend);
        long long t0 = kt_clock_ms();
        kinbox_prune_result_t res = prune(url, "2d", "5d");
        long long took = kt_clock_ms() - t0;
        fprintf(stderr,
                "catchall_million (%s): prune dropped %" PRIu64
                " and created %" PRIu64 " ranges in %lld ms\n",
                is_my(*backend) ? "mysql" : "postgresql",
                res.partitions_dropped, res.partitions_created, took);
        cr_assert(gt(u64, res.partitions_dropped, 10));
        cr_assert(eq(u64, res.partitions_created, 2));
        cr_assert(eq(i64, ranges(url, *backend),
                     before - (long long)res.partitions_dropped + 2));
        /* Every catch-all row where it was: none moved, none lost. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "consumer = 'bulk'"),
                     1000001));
        if (is_my(*backend)) {
                cr_assert(eq(i64,
                             kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox "
                                          "PARTITION (p_past)"),
                             1000000));
                cr_assert(eq(i64,
                             kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox "
                                          "PARTITION (p_future)"),
                             1));
        }
}

/* ---- the points stream, end to end ---- */

KT_BACKENDS_PARAMS(partition, points_exact)
ParameterizedTest(int *backend, partition, points_exact, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("pt-e");
        kt_topic(topic, 4);
        kinbox_conf_t *c = part_conf(url, "pte", topic);
        kt_set(c, "batch.max", "64");
        migrate_ok(c);
        int dups = 0;
        long long total = kt_produce_grants(topic, 0, 600, 9, "pe", 0, &dups);
        char *group = strdup(kinbox_conf_get(c, "group.id"));
        kt_run_t *r =
            kt_run_start(c, NULL, kinbox_points_module.handle_batch, NULL);
        wait_committed(group, topic, 4, 90);
        kt_run_stop(r);
        free(group);
        kt_assert_points(url, total, 600);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox WHERE "
                                  "shadow = FALSE"),
                     600));
}
