/*
 * outbox_partition_test.c -- write-only retention of the outbox
 * (outbox.layout = partitioned) on both backends: kinbox migrate converts
 * a plain outbox (rows kept, the key still unique), relays publish from
 * the partitioned table (poll, wal, binlog), and `kinbox prune` drops
 * whole days past the retention with one DROP each, keeping a day that
 * still has a pending row (poll) or that the log relay has not confirmed
 * (wal, binlog), keeping dead rows, and deciding by the database's clock,
 * not this host's.
 *
 * Days in the past are made by the database: rows are inserted with
 * created_at = the database's now minus whole days.
 */
#include "logrelay_common.h"

#include "db.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DAY_S INT64_C(86400)

static bool
is_my(int backend)
{
        return backend == 1;
}

static kt_log_t plog; /* the last prune's log */

/* An outbox row created days_ago days ago by the database's clock
 * (hours_ago more hours), status st; a pending row's next attempt far
 * ahead when held (no relay claims it). */
static void
old_row(const char *url, int backend, const char *topic, const char *key,
        int days_ago, int hours_ago, const char *st, bool held)
{
        char sql[700];
        if (is_my(backend))
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_outbox (destination, idem_key, "
                         "aggregate_id, payload, status, created_at, "
                         "next_attempt_at) VALUES ('%s', '%s', '%s', '%s', "
                         "'%s', CURRENT_TIMESTAMP(6) - INTERVAL %d HOUR, "
                         "CURRENT_TIMESTAMP(6) + INTERVAL %d DAY)",
                         topic, key, key, key, st, days_ago * 24 + hours_ago,
                         held ? 30 : 0);
        else
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_outbox (destination, idem_key, "
                         "aggregate_id, payload, status, created_at, "
                         "next_attempt_at) VALUES ('%s', '%s', '%s', '%s', "
                         "'%s', now() - interval '%d hours', now() + "
                         "interval '%d days')",
                         topic, key, key, key, st, days_ago * 24 + hours_ago,
                         held ? 30 : 0);
        kt_exec(url, sql);
}

/* The day partition holding the time days_ago days before now exists. */
static bool
day_exists(const char *url, int backend, int days_ago)
{
        char lab[16];
        int64_t now = (int64_t)time(NULL);
        int64_t d = now - days_ago * DAY_S;
        kinbox__range_label(lab, d - d % DAY_S, DAY_S);
        return kt_qintf(
                   url,
                   is_my(backend)
                       ? "SELECT COUNT(*) FROM information_schema.PARTITIONS "
                         "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = "
                         "'kinbox_outbox' AND PARTITION_NAME = 'p_%s'"
                       : "SELECT COUNT(*) FROM pg_inherits i JOIN pg_class c "
                         "ON c.oid = i.inhrelid WHERE i.inhparent = "
                         "'kinbox_outbox'::regclass AND c.relname = "
                         "'kinbox_outbox_p%s'",
                   lab) == 1;
}

static bool
day_gone(const char *url, int backend, int days_ago)
{
        return !day_exists(url, backend, days_ago);
}

static bool
partitioned(const char *url, int backend)
{
        return kt_qint(url, is_my(backend)
                                ? "SELECT COUNT(*) > 0 FROM "
                                  "information_schema.PARTITIONS WHERE "
                                  "TABLE_SCHEMA = DATABASE() AND TABLE_NAME "
                                  "= 'kinbox_outbox' AND PARTITION_NAME IS "
                                  "NOT NULL"
                                : "SELECT COUNT(*) FROM pg_class WHERE oid = "
                                  "'kinbox_outbox'::regclass AND relkind = "
                                  "'p'") == 1;
}

/* The idem keys of kinbox_outbox, sorted, joined by ','. */
static char *
keys(const char *url, int backend)
{
        return qtext(url, is_my(backend)
                              ? "SELECT COALESCE(GROUP_CONCAT(idem_key ORDER "
                                "BY idem_key SEPARATOR ','), '') FROM "
                                "kinbox_outbox"
                              : "SELECT coalesce(string_agg(idem_key, ',' "
                                "ORDER BY idem_key), '') FROM kinbox_outbox");
}

static void
expect_keys(const char *url, int backend, const char *want)
{
        char *got = keys(url, backend);
        cr_expect(eq(str, got, (char *)want));
        free(got);
}

static kinbox_conf_t *
part_conf(const char *url, const char *retention)
{
        kinbox_conf_t *c = kinbox_conf_new();
        cset(c, "database.url", url);
        cset(c, "outbox.layout", "partitioned");
        cset(c, "outbox.retention", retention);
        return c;
}

static void
migrate_part(const char *url)
{
        kinbox_conf_t *c = part_conf(url, "7d");
        char e[512];
        cr_assert(eq(int, kinbox_migrate(c, e, sizeof(e)), KINBOX_OK), "%s",
                  e);
        kinbox_conf_destroy(c);
}

/* kinbox prune with outbox.retention 2d (relay.source source, relay.slot
 * slot when not NULL); the log in plog.text. */
static kinbox_prune_result_t
prune(const char *url, const char *source, const char *slot)
{
        kinbox_conf_t *c = part_conf(url, "2d");
        if (source) {
                cset(c, "relay.source", source);
                cset(c, "relay.slot", slot);
        }
        return kt_prune(c, 0, &plog);
}

static kinbox_err_t
append(const char *backend, const char *url, const char *topic,
       const char *key)
{
        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        kinbox_outbox_msg_t m = {.destination = topic,
                                 .idem_key = key,
                                 .aggregate_id = "agg",
                                 .payload = key,
                                 .payload_size = strlen(key)};
        int64_t id = 0;
        kinbox_err_t rc = tc_append(&c, &m, &id);
        tc_sql(&c, "COMMIT");
        tc_close(&c);
        return rc;
}

static double
kept_metric(void)
{
        double v = kinbox__metrics_value(
            "kinbox_outbox_partition_changes_total", "op=\"keep\"");
        return v == v ? v : 0; /* NaN: not counted yet */
}

/*
 * Poll mode: a plain outbox with rows over several days is converted,
 * the polling relay publishes every due row, and prune drops the days
 * past the retention with one DROP each, except the day whose row is
 * still pending; its dead row is kept. Once that row is sent, its day
 * goes too.
 */
KT_BACKENDS_PARAMS(outbox_partition, poll)
ParameterizedTest(int *backend, outbox_partition, poll, .timeout = 180)
{
        const char *be = kt_backend(*backend);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(be);
        char *topic = kt_unique("opp");
        kt_topic(topic, 1);
        cr_assert(eq(int, partitioned(url, *backend), false));
        old_row(url, *backend, topic, "c-held", 5, 0, "pending", true);
        old_row(url, *backend, topic, "d-dead", 4, 0, "dead", false);
        old_row(url, *backend, topic, "a-4d", 4, 0, "pending", false);
        old_row(url, *backend, topic, "b-3d", 3, 0, "pending", false);
        migrate_part(url);
        cr_assert(partitioned(url, *backend));
        expect_keys(url, *backend, "a-4d,b-3d,c-held,d-dead");
        for (int d = -2; d <= 7; d++)
                cr_expect(day_exists(url, *backend, d), "day %d", d);
        /* The key stays unique, on the trigger now. */
        cr_assert(eq(int, append(be, url, topic, "y-young"), KINBOX_OK));
        cr_assert(
            eq(int, append(be, url, topic, "y-young"), KINBOX_ERR_DUPLICATE));
        cr_assert(
            eq(int, append(be, url, topic, "a-4d"), KINBOX_ERR_DUPLICATE));
        trelay_t tr;
        relay_start(&tr, relay_new(relay_conf(url, bootstrap)));
        cr_assert(wait_q(url, 3, 30,
                         "SELECT COUNT(*) FROM kinbox_outbox WHERE status = "
                         "'sent'"));
        relay_stop(&tr);
        tmsgs_t got = {0};
        consume(bootstrap, topic, 3, 30, 500, &got);
        cr_expect(eq(sz, got.n, 3));
        msgs_free(&got);
        double kept0 = kept_metric();
        kinbox_prune_result_t res = prune(url, NULL, NULL);
        /* Days 7..4 ago gone (4 ago with a-4d, d-dead moved out); 5 ago
         * kept: c-held is pending. */
        cr_expect(day_gone(url, *backend, 7));
        cr_expect(day_gone(url, *backend, 4));
        cr_expect(day_gone(url, *backend, 3));
        cr_expect(day_exists(url, *backend, 5));
        cr_expect(day_exists(url, *backend, 1));
        cr_expect(day_exists(url, *backend, 0));
        cr_expect(gt(u64, res.outbox_rows, 0));
        expect_keys(url, *backend, "c-held,d-dead,y-young");
        cr_expect(strstr(plog.text, "still holds pending rows") != NULL, "%s",
                  plog.text);
        cr_expect(eq(dbl, kept_metric(), kept0 + 1));
        kt_exec(url, is_my(*backend)
                         ? "UPDATE kinbox_outbox SET status = 'sent', "
                           "sent_at = CURRENT_TIMESTAMP(6) WHERE idem_key = "
                           "'c-held'"
                         : "UPDATE kinbox_outbox SET status = 'sent', "
                           "sent_at = now() WHERE idem_key = 'c-held'");
        prune(url, NULL, NULL);
        cr_expect(day_gone(url, *backend, 5));
        expect_keys(url, *backend, "d-dead,y-young");
}

/* kinbox_prune() with outbox.retention 2d, dry (1: --dry-run), poll
 * mode; the log in plog.text. */
static kinbox_prune_result_t
prune_dry(const char *url, int dry)
{
        return kt_prune(part_conf(url, "2d"), dry, &plog);
}

/* The partition name of the day days_ago days before now. */
static void
day_name(int backend, int days_ago, char *out, size_t sz)
{
        char lab[16];
        int64_t d = (int64_t)time(NULL) - days_ago * DAY_S;
        kinbox__range_label(lab, d - d % DAY_S, DAY_S);
        snprintf(out, sz, "%s%s", is_my(backend) ? "p_" : "kinbox_outbox_p",
                 lab);
}

/*
 * `kinbox prune --dry-run` on a partitioned outbox: it names the days the
 * real run would drop, with their rows, and the day the database refuses
 * yet (a pending row), and changes nothing (every day and row still
 * there); the real run then drops exactly the days named.
 */
KT_BACKENDS_PARAMS(outbox_partition, dry_run)
ParameterizedTest(int *backend, outbox_partition, dry_run, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("opd");
        old_row(url, *backend, topic, "c-held", 5, 0, "pending", true);
        old_row(url, *backend, topic, "d-dead", 4, 0, "dead", false);
        old_row(url, *backend, topic, "a-4d", 4, 0, "sent", false);
        old_row(url, *backend, topic, "b-3d", 3, 0, "sent", false);
        migrate_part(url);
        cr_assert(partitioned(url, *backend));
        expect_keys(url, *backend, "a-4d,b-3d,c-held,d-dead");

        prune_dry(url, 1);
        char dry[2048], done[2048], d[64];
        kt_words_after(plog.text, "would drop outbox partition ", dry,
                       sizeof(dry));
        for (int k = 7; k >= 3; k--) {
                day_name(*backend, k, d, sizeof(d));
                bool named = strstr(dry, d) != NULL;
                cr_expect(eq(int, named, k != 5), "day %d (%s):\n%s", k, d,
                          plog.text);
        }
        day_name(*backend, 5, d, sizeof(d));
        char kept[200];
        snprintf(kept, sizeof(kept),
                 "outbox range %s still holds pending rows (not yet "
                 "published): kept (dry run)",
                 d);
        cr_expect(strstr(plog.text, kept) != NULL, "%s", plog.text);
        cr_expect(strstr(plog.text, "rows; dry run)") != NULL, "%s",
                  plog.text);
        /* Nothing changed. */
        for (int k = -2; k <= 7; k++)
                cr_expect(day_exists(url, *backend, k), "day %d", k);
        expect_keys(url, *backend, "a-4d,b-3d,c-held,d-dead");

        prune_dry(url, 0);
        kt_words_after(plog.text, "dropped outbox partition ", done,
                       sizeof(done));
        cr_expect(eq(str, done, dry), "dry run: %s; real run: %s", dry, done);
        cr_expect(day_exists(url, *backend, 5));
        cr_expect(day_gone(url, *backend, 4));
        cr_expect(day_gone(url, *backend, 3));
        expect_keys(url, *backend, "c-held,d-dead");
}

/*
 * This host's clock 30 days ahead of the database's: nothing young goes,
 * and a drop of today asked directly is refused by the database.
 */
KT_BACKENDS_PARAMS(outbox_partition, clock_ahead)
ParameterizedTest(int *backend, outbox_partition, clock_ahead, .timeout = 120)
{
        const char *be = kt_backend(*backend);
        char *url = kt_fresh_db(be);
        migrate_part(url);
        old_row(url, *backend, "t", "old", 4, 0, "sent", false);
        old_row(url, *backend, "t", "day1", 1, 0, "sent", false);
        old_row(url, *backend, "t", "now", 0, 0, "sent", false);
        setenv("KINBOX_FAULT_CLOCK_S", "2592000", 1);
        prune(url, NULL, NULL);
        cr_expect(day_gone(url, *backend, 4));
        cr_expect(day_exists(url, *backend, 1));
        cr_expect(day_exists(url, *backend, 0));
        expect_keys(url, *backend, "day1,now");
        kinbox_conf_t *dc = part_conf(url, "2d");
        char e[512];
        kinbox__db_t *db = kinbox__db_new_conf(dc, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(eq(int, kinbox__db_connect(db), KINBOX_OK));
        int64_t now = (int64_t)time(NULL);
        kinbox__range_t today = {.start_s = now - now % DAY_S};
        char lab[16];
        kinbox__range_label(lab, today.start_s, DAY_S);
        snprintf(today.name, sizeof(today.name), "%s%s",
                 is_my(*backend) ? "p_" : "kinbox_outbox_p", lab);
        uint64_t kept = 0;
        cr_expect(
            eq(int,
               db->ops->opart->drop(db, &today, 2 * DAY_S * 1000, NULL, &kept),
               KINBOX_ERR_STATE));
        cr_expect(strstr(db->err.msg, "not past outbox.retention") != NULL,
                  "%s", db->err.msg);
        kinbox__db_destroy(db);
        kinbox_conf_destroy(dc);
        unsetenv("KINBOX_FAULT_CLOCK_S");
        expect_keys(url, *backend, "day1,now");
}

/* A log relay (source) on url started in tr, once it reads: its position
 * stored (MariaDB) or its slot active (PostgreSQL). */
static void
log_relay_up(trelay_t *tr, int backend, const char *url, const char *bootstrap,
             const char *source, const char *slot)
{
        relay_start(tr, relay_new(log_conf(url, bootstrap, source, slot)));
        cr_assert(wait_q(url, 1, 30,
                         is_my(backend)
                             ? "SELECT COUNT(*) FROM kinbox_relay_position "
                               "WHERE relay = '%s'"
                             : "SELECT COUNT(*) FROM pg_replication_slots "
                               "WHERE slot_name = '%s' AND active",
                         slot));
}

/*
 * The log relay (wal on PostgreSQL, binlog on MariaDB) on a partitioned
 * outbox publishes every row (the stream names kinbox_outbox, not a
 * partition); a day with a row the relay has not confirmed is kept; once
 * it has, the day goes whole.
 */
static void
log_relay(int backend, const char *source)
{
        const char *be = kt_backend(backend);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(be);
        char *topic = kt_unique("opl");
        char *slot = kt_unique("kbt_opl");
        kt_topic(topic, 1);
        migrate_part(url);
        if (!is_my(backend))
                cr_assert(eq(i64,
                             kt_qint(url, "SELECT COUNT(*) FROM "
                                          "pg_publication WHERE pubname = "
                                          "'kinbox_outbox_pub' AND "
                                          "pubviaroot"),
                             1));
        trelay_t tr;
        log_relay_up(&tr, backend, url, bootstrap, source, slot);
        old_row(url, backend, topic, "a-4d", 4, 0, "pending", false);
        old_row(url, backend, topic, "b-3d", 3, 0, "pending", false);
        cr_assert(eq(int, append(be, url, topic, "y-young"), KINBOX_OK));
        tmsgs_t got = {0};
        consume(bootstrap, topic, 3, 30, 500, &got);
        cr_expect(eq(sz, got.n, 3));
        msgs_free(&got);
        relay_stop(&tr);
        /* Appended while no relay reads: its day is kept. */
        old_row(url, backend, topic, "c-3d", 3, 1, "pending", false);
        prune(url, source, slot);
        cr_expect(day_exists(url, backend, 3));
        cr_expect(strstr(plog.text, "not behind the log relay's confirmed") !=
                      NULL,
                  "%s", plog.text);
        relay_start(&tr, relay_new(log_conf(url, bootstrap, source, slot)));
        consume(bootstrap, topic, 4, 30, 500, &got);
        cr_expect(eq(sz, got.n, 4));
        msgs_free(&got);
        bool gone = false;
        for (long long end = kt_clock_ms() + 30000;
             !gone && kt_clock_ms() < end; usleep(500 * 1000)) {
                prune(url, source, slot);
                gone = !day_exists(url, backend, 3);
        }
        relay_stop(&tr);
        cr_expect(gone, "%s", plog.text);
        cr_expect(day_gone(url, backend, 4));
        expect_keys(url, backend, "y-young");
}

Test(outbox_partition, wal, .timeout = 180)
{
        log_relay(0, "wal");
}

Test(outbox_partition, binlog, .timeout = 180)
{
        log_relay(1, "binlog");
}

/*
 * Converting a plain outbox under a running log relay: the rows copied
 * into the partitioned table are not published again (PostgreSQL: the
 * new table joins the publication after the copy, in the same
 * transaction; MariaDB: the copy's row events name kinbox_outbox_conv),
 * and rows appended after the conversion are.
 */
static void
log_convert(int backend, const char *source)
{
        const char *be = kt_backend(backend);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(be);
        char *topic = kt_unique("opc");
        char *slot = kt_unique("kbt_opc");
        kt_topic(topic, 1);
        trelay_t tr;
        log_relay_up(&tr, backend, url, bootstrap, source, slot);
        for (int i = 0; i < 3; i++) {
                char k[16];
                snprintf(k, sizeof(k), "before-%d", i);
                cr_assert(eq(int, append(be, url, topic, k), KINBOX_OK));
        }
        tmsgs_t got = {0};
        consume(bootstrap, topic, 3, 30, 500, &got);
        cr_assert(eq(sz, got.n, 3));
        msgs_free(&got);
        migrate_part(url);
        cr_assert(partitioned(url, backend));
        cr_assert(eq(int, append(be, url, topic, "after"), KINBOX_OK));
        cr_assert(
            eq(int, append(be, url, topic, "before-1"), KINBOX_ERR_DUPLICATE));
        /* Read on past the fourth, to see copies. */
        consume(bootstrap, topic, 4, 30, 3000, &got);
        relay_stop(&tr);
        cr_expect(eq(sz, got.n, 4));
        msgs_free(&got);
        expect_keys(url, backend, "after,before-0,before-1,before-2");
}

Test(outbox_partition, wal_convert, .timeout = 180)
{
        log_convert(0, "wal");
}

Test(outbox_partition, binlog_convert, .timeout = 180)
{
        log_convert(1, "binlog");
}

/* ---- the key, kept by the trigger under concurrent appends ---- */

typedef struct racer {
        const char *backend, *url, *topic;
        kinbox_err_t rc;
        _Atomic int done;
} racer_t;

static void *
racer_main(void *arg)
{
        racer_t *x = arg;
        x->rc = append(x->backend, x->url, x->topic, "same");
        x->done = 1;
        return NULL;
}

/*
 * Two transactions append one key at once: the second waits for the
 * first and, once it commits, is a duplicate; the table has one row.
 */
KT_BACKENDS_PARAMS(outbox_partition, key_race)
ParameterizedTest(int *backend, outbox_partition, key_race, .timeout = 120)
{
        const char *be = kt_backend(*backend);
        char *url = kt_fresh_db(be);
        migrate_part(url);
        tconn_t a;
        tc_open(&a, be, url);
        tc_sql(&a, "BEGIN");
        kinbox_outbox_msg_t m = {.destination = "t", .idem_key = "same"};
        int64_t id = 0;
        cr_assert(eq(int, tc_append(&a, &m, &id), KINBOX_OK));
        racer_t x = {.backend = be, .url = url, .topic = "t"};
        pthread_t th;
        cr_assert(eq(int, pthread_create(&th, NULL, racer_main, &x), 0));
        usleep(700 * 1000);
        cr_expect(eq(int, x.done, 0), "the second append did not wait");
        tc_sql(&a, "COMMIT");
        pthread_join(th, NULL);
        tc_close(&a);
        cr_expect(eq(int, x.rc, KINBOX_ERR_DUPLICATE));
        cr_expect(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "idem_key = 'same'"),
                     1));
}
