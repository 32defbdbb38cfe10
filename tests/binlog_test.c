/*
 * binlog_test.c -- reading kinbox_outbox's inserts from MariaDB's binlog
 * (src/db/mysql_binlog.c, [relay] source = binlog; issue 38).
 *
 * Against the MariaDB of scripts/services, which runs with the binlog in
 * ROW format (KINBOX_MYSQL_BINLOG, default 1). A server without it fails
 * these tests. Every test works in a fresh, migrated database; the binlog
 * is the server's, so a reader skips what other databases write.
 *
 * The probe part: Debian 12's Connector/C 3.3 replication API reads GTID,
 * TABLE_MAP, WRITE_ROWS and XID events, heartbeats, 1 MB rows, and starts
 * from a GTID state (@slave_connect_state); its mariadb_rpl_extract_rows()
 * decodes kinbox_outbox's column types, and so does kinbox's own decoder
 * (mysql_binlog_rows.c), which the reader uses.
 */
#include "harness.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mysql.h>
#include <mariadb_rpl.h>

#include "db.h"
#include "db/mysql_binlog.h"
#include "db/mysql_binlog_int.h"
#include "internal.h"

/* A connection to url (fails the test when it cannot). */
static kinbox__db_t *
kt_db(const char *url)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        return db;
}

static kinbox__binlog_t *
reader_at(const char *url, const char *start, int hb_ms)
{
        kinbox__binlog_opts_t o = {.url = url,
                                   .start = start,
                                   .name = kt_unique("bl"),
                                   .heartbeat_ms = hb_ms};
        int code = 0;
        char err[600] = "";
        kinbox__binlog_t *b = kinbox__binlog_open(&o, &code, err, sizeof(err));
        cr_assert(b != NULL, "binlog open: %d %s", code, err);
        return b;
}

/* The next transaction with outbox rows, within timeout_s. */
static const kinbox__binlog_tx_t *
next_tx(kinbox__binlog_t *b, int timeout_s)
{
        time_t until = time(NULL) + timeout_s;
        while (time(NULL) < until) {
                const kinbox__binlog_tx_t *tx = NULL;
                int rc = kinbox__binlog_next(b, &tx);
                cr_assert(rc > 0, "binlog next: %d %s", rc,
                          kinbox__binlog_error(b));
                if (rc == KINBOX__BL_TX)
                        return tx;
        }
        cr_assert(false, "no outbox transaction within %d s", timeout_s);
        return NULL;
}

/* The columns the relay needs, as the table holds them, of row id. */
typedef struct dbrow {
        char kind[16], dest[256], idem[256], agg[256];
        bool agg_null, payload_null;
        char *payload;
        size_t payload_len;
        char *headers;
        int64_t created_us;
} dbrow_t;

static void
db_row(const char *url, int64_t id, dbrow_t *out)
{
        kinbox__db_t *db = kt_db(url);
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "SELECT kind, destination, idem_key, aggregate_id, payload, "
                 "headers, CAST(UNIX_TIMESTAMP(created_at) * 1000000 AS "
                 "SIGNED) FROM kinbox_outbox WHERE id = %" PRId64,
                 id);
        kinbox_rows_t *r = NULL;
        int rc = kinbox__db_query(db, sql, 0, NULL, &r);
        cr_assert(rc == 0 && kinbox_rows_count(r) == 1, "%s: %s", sql,
                  db->err.msg);
        memset(out, 0, sizeof(*out));
        size_t n = 0;
        snprintf(out->kind, sizeof(out->kind), "%s",
                 kinbox_rows_value(r, 0, 0, NULL));
        snprintf(out->dest, sizeof(out->dest), "%s",
                 kinbox_rows_value(r, 0, 1, NULL));
        snprintf(out->idem, sizeof(out->idem), "%s",
                 kinbox_rows_value(r, 0, 2, NULL));
        const char *agg = kinbox_rows_value(r, 0, 3, NULL);
        out->agg_null = !agg;
        snprintf(out->agg, sizeof(out->agg), "%s", agg ? agg : "");
        const char *pl = kinbox_rows_value(r, 0, 4, &n);
        out->payload_null = !pl;
        out->payload = pl ? malloc(n + 1) : NULL;
        if (pl)
                memcpy(out->payload, pl, n);
        out->payload_len = n;
        const char *h = kinbox_rows_value(r, 0, 5, NULL);
        out->headers = h ? kinbox__strdup(h) : NULL;
        out->created_us = strtoll(kinbox_rows_value(r, 0, 6, NULL), NULL, 10);
        kinbox_rows_destroy(r);
        kinbox__db_destroy(db);
}

static void
assert_row(const char *url, const kinbox__binlog_row_t *br)
{
        dbrow_t d;
        db_row(url, br->id, &d);
        cr_expect(eq(str, (char *)br->kind, d.kind));
        cr_expect(eq(str, (char *)br->destination, d.dest));
        cr_expect(eq(str, (char *)br->idem_key, d.idem));
        cr_expect(eq(int, br->aggregate_id == NULL, d.agg_null));
        if (br->aggregate_id)
                cr_expect(eq(str, (char *)br->aggregate_id, d.agg));
        cr_expect(eq(int, br->payload == NULL, d.payload_null));
        cr_expect(eq(sz, br->payload_size, d.payload_len), "row %" PRId64,
                  br->id);
        if (br->payload && d.payload)
                cr_expect(memcmp(br->payload, d.payload, d.payload_len) == 0,
                          "payload of row %" PRId64, br->id);
        cr_expect(eq(int, br->headers == NULL, d.headers == NULL));
        if (br->headers && d.headers)
                cr_expect(eq(str, (char *)br->headers, d.headers));
        cr_expect(eq(i64, br->created_at_us, d.created_us), "row %" PRId64,
                  br->id);
        free(d.payload);
        free(d.headers);
}

/* Purge the binlog up to the current file, until the oldest file starts
 * after GTID sequence seq of domain 0 (a file the binlog checkpoint
 * still needs is kept for a moment: PURGE skips it). */
static void
purge_after(const char *url, long long seq)
{
        int64_t until = kinbox__now_ms() + 20000;
        while (kinbox__now_ms() < until) {
                kt_exec(url, "FLUSH BINARY LOGS");
                kinbox__db_t *db = kt_db(url);
                kinbox_rows_t *r = NULL;
                cr_assert(kinbox__db_query(db, "SHOW MASTER STATUS", 0, NULL,
                                           &r) == 0);
                char q[256];
                snprintf(q, sizeof(q), "PURGE BINARY LOGS TO '%s'",
                         kinbox_rows_value(r, 0, 0, NULL));
                kinbox_rows_destroy(r);
                kinbox__db_destroy(db);
                kt_exec(url, q);
                db = kt_db(url);
                r = NULL;
                cr_assert(kinbox__db_query(db, "SHOW BINARY LOGS", 0, NULL,
                                           &r) == 0);
                snprintf(q, sizeof(q),
                         "SELECT SUBSTRING_INDEX(BINLOG_GTID_POS('%s', 4), "
                         "'-', -1)",
                         kinbox_rows_value(r, 0, 0, NULL));
                kinbox_rows_destroy(r);
                kinbox__db_destroy(db);
                if (kt_qint(url, q) > seq)
                        return;
                usleep(200000);
        }
        cr_assert(false, "the binlog was not purged past %lld", seq);
}

TestSuite(binlog, .timeout = 120);

/* Committed inserts come whole and in commit order, decoded field by
 * field as the table holds them; other tables, rolled-back
 * transactions, UPDATEs and DELETEs are not returned. */
Test(binlog, decodes_committed_outbox_inserts)
{
        char *url = kt_fresh_db("mysql");
        kinbox__binlog_t *b = reader_at(url, NULL, 500);
        kt_exec(url,
                "START TRANSACTION;"
                "INSERT INTO kinbox_outbox (kind, destination, idem_key, "
                "aggregate_id, payload, headers) VALUES "
                "('event', 'orders', 'k1', 'a1', 'p1', '[[\"h\",\"v\"]]'),"
                "('event', 'orders', 'k2', NULL, X'00ff0041', NULL),"
                "('action', 'action:mail', 'k3', 'a1', NULL, '[]');"
                "COMMIT");
        kt_exec(url, "INSERT INTO kinbox_hold (consumer, topic, "
                     "kafka_partition, hold_key, blocker_id) VALUES "
                     "('c', 't', 0, 'k', 1)");
        kt_exec(url, "START TRANSACTION;"
                     "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('orders', 'rolled-back');"
                     "ROLLBACK");
        kt_exec(url, "UPDATE kinbox_outbox SET status = 'sent'");
        kt_exec(url, "DELETE FROM kinbox_outbox WHERE idem_key = 'k3'");
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                     "payload) VALUES ('orders', 'k4', 'p4')");

        const kinbox__binlog_tx_t *tx = next_tx(b, 20);
        cr_assert(eq(sz, tx->nrows, 3));
        cr_expect(eq(str, (char *)tx->rows[0].idem_key, "k1"));
        cr_expect(eq(str, (char *)tx->rows[2].kind, "action"));
        cr_expect(eq(str, (char *)tx->rows[0].status, "pending"));
        cr_expect(strstr(tx->state, tx->gtid) != NULL, "%s in %s", tx->gtid,
                  tx->state);
        for (size_t i = 0; i < 2; i++) /* k3 is deleted since */
                assert_row(url, &tx->rows[i]);
        tx = next_tx(b, 20);
        cr_assert(eq(sz, tx->nrows, 1));
        cr_expect(eq(str, (char *)tx->rows[0].idem_key, "k4"));
        assert_row(url, &tx->rows[0]);
        kinbox__binlog_close(b);
}

/* 1 MB payloads (a row event larger than the default
 * binlog_row_event_max_size) and a 2,000-row transaction. */
Test(binlog, large_rows_and_transactions)
{
        char *url = kt_fresh_db("mysql");
        kinbox__binlog_t *b = reader_at(url, NULL, 500);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                     "aggregate_id, payload) VALUES "
                     "('big', 'b1', 'x', CONCAT(REPEAT('a', 1048575), 'z')),"
                     "('big', 'b2', 'x', REPEAT(X'00ff', 524288))");
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "SELECT 'many', CONCAT('m', seq) FROM seq_1_to_2000");
        const kinbox__binlog_tx_t *tx = next_tx(b, 30);
        cr_assert(eq(sz, tx->nrows, 2));
        cr_expect(eq(sz, tx->rows[0].payload_size, 1048576));
        cr_expect(eq(int, tx->rows[0].payload[1048575], 'z'));
        assert_row(url, &tx->rows[0]);
        assert_row(url, &tx->rows[1]);
        tx = next_tx(b, 30);
        cr_assert(eq(sz, tx->nrows, 2000));
        for (size_t i = 0; i < tx->nrows; i++) {
                char want[32];
                snprintf(want, sizeof(want), "m%zu", i + 1);
                cr_assert(eq(str, (char *)tx->rows[i].idem_key, want));
                cr_assert(i == 0 || tx->rows[i].id > tx->rows[i - 1].id);
        }
        kinbox__binlog_close(b);
}

/* Nothing written: the reader still returns, on the server's heartbeats,
 * and its state stays put. */
Test(binlog, heartbeats_when_idle)
{
        char *url = kt_fresh_db("mysql");
        kinbox__binlog_t *b = reader_at(url, NULL, 200);
        char before[256];
        snprintf(before, sizeof(before), "%s", kinbox__binlog_state(b));
        int64_t t0 = kinbox__now_ms();
        int idle = 0;
        while (idle < 5) {
                const kinbox__binlog_tx_t *tx = NULL;
                int rc = kinbox__binlog_next(b, &tx);
                cr_assert(rc > 0, "%d %s", rc, kinbox__binlog_error(b));
                if (rc == KINBOX__BL_IDLE)
                        idle++;
        }
        /* Five heartbeats of 200 ms, not a read timeout's 30 s. */
        cr_expect(lt(i64, kinbox__now_ms() - t0, 5000));
        kinbox__binlog_close(b);
        (void)before;
}

/* Reopened at the state after a transaction, the reader starts with the
 * next one (@slave_connect_state). */
Test(binlog, starts_after_a_gtid_state)
{
        char *url = kt_fresh_db("mysql");
        kinbox__binlog_t *b = reader_at(url, NULL, 500);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('t', 'first')");
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('t', 'second')");
        const kinbox__binlog_tx_t *tx = next_tx(b, 20);
        cr_assert(eq(str, (char *)tx->rows[0].idem_key, "first"));
        char after_first[512];
        snprintf(after_first, sizeof(after_first), "%s", tx->state);
        kinbox__binlog_close(b);

        b = reader_at(url, after_first, 500);
        tx = next_tx(b, 20);
        cr_expect(eq(str, (char *)tx->rows[0].idem_key, "second"));
        kinbox__binlog_close(b);
}

/* A position whose binlog was purged: refused, naming the position and
 * the way back (outbox resend --since). */
Test(binlog, purged_position_refused)
{
        char *url = kt_fresh_db("mysql");
        kinbox__binlog_t *b = reader_at(url, NULL, 500);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('t', 'old')");
        const kinbox__binlog_tx_t *tx = next_tx(b, 20);
        char old[512];
        /* The state before it: its own GTID's sequence minus one. */
        snprintf(old, sizeof(old), "%s", tx->gtid);
        char *dash = strrchr(old, '-');
        long long seq = strtoll(dash + 1, NULL, 10);
        snprintf(dash + 1, sizeof(old) - (size_t)(dash + 1 - old), "%lld",
                 seq - 1);
        kinbox__binlog_close(b);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('t', 'new')");
        purge_after(url, seq);

        kinbox__binlog_opts_t o = {.url = url, .start = old, .name = "p"};
        int code = 0;
        char err[600] = "";
        b = kinbox__binlog_open(&o, &code, err, sizeof(err));
        if (b) {
                const kinbox__binlog_tx_t *t2 = NULL;
                code = kinbox__binlog_next(b, &t2);
                snprintf(err, sizeof(err), "%s", kinbox__binlog_error(b));
                kinbox__binlog_close(b);
        }
        cr_expect(eq(int, code, KINBOX_ERR_NOT_FOUND), "%d %s", code, err);
        cr_expect(strstr(err, old) != NULL, "%s", err);
        cr_expect(strstr(err, "kinbox outbox resend --since") != NULL, "%s",
                  err);
}

/* binlog_format other than ROW: refused, naming the setting. */
Test(binlog, statement_format_refused)
{
        char *url = kt_fresh_db("mysql");
        kt_exec(url, "SET GLOBAL binlog_format = 'STATEMENT'");
        kinbox__binlog_opts_t o = {.url = url, .name = "f"};
        int code = 0;
        char err[600] = "";
        kinbox__binlog_t *b = kinbox__binlog_open(&o, &code, err, sizeof(err));
        kt_exec(url, "SET GLOBAL binlog_format = 'ROW'");
        cr_expect(b == NULL);
        kinbox__binlog_close(b);
        cr_expect(eq(int, code, KINBOX_ERR_CONFIG));
        cr_expect(strstr(err, "binlog_format is STATEMENT") != NULL, "%s",
                  err);
}

/* The server ids: stable per name, never the server's own (1). */
Test(binlog, server_id_from_name)
{
        cr_expect(eq(u32, kinbox__binlog_server_id("a"),
                     kinbox__binlog_server_id("a")));
        cr_expect(ne(u32, kinbox__binlog_server_id("a"),
                     kinbox__binlog_server_id("b")));
        cr_expect(gt(u32, kinbox__binlog_server_id("kinbox"), 1));
}

/* ---- the source of the log relay (mysql_binlog_src.c) */

typedef struct src {
        kinbox__logsrc_t s;
        kinbox_conf_t *conf;
        kinbox__log_t log;
} src_t;

static src_t *
src_new(const char *url, const char *name)
{
        src_t *x = calloc(1, sizeof(*x));
        x->conf = kinbox_conf_new();
        char e[256];
        cr_assert(kinbox_conf_set(x->conf, "database.url", url, e,
                                  sizeof(e)) == KINBOX_OK);
        cr_assert(kinbox_conf_set(x->conf, "relay.slot", name, e, sizeof(e)) ==
                  KINBOX_OK);
        kinbox__conf_logger(x->conf, &x->log);
        x->s.ops = &kinbox__binlog_src_ops;
        x->s.url = url;
        x->s.conf = x->conf;
        x->s.log = &x->log;
        return x;
}

static void
src_free(src_t *x)
{
        if (x->s.impl)
                x->s.ops->close(&x->s);
        kinbox_conf_destroy(x->conf);
        free(x);
}

/* The next event other than KEEPALIVE, within 20 s. */
static kinbox__logev_t
src_next(src_t *x)
{
        int64_t until = kinbox__now_ms() + 20000;
        while (kinbox__now_ms() < until) {
                kinbox__logev_t ev;
                int rc = x->s.ops->next(&x->s, &ev, 200);
                cr_assert(rc >= 0, "next: %d %s", rc, x->s.err);
                if (rc == 1 && ev.kind != KINBOX__LOGEV_KEEPALIVE)
                        return ev;
        }
        cr_assert(false, "no event within 20 s");
        return (kinbox__logev_t){0};
}

/* Confirmed positions are stored and a new source starts after them;
 * action rows come marked as such. */
Test(binlog, source_resumes_after_confirmed)
{
        char *url = kt_fresh_db("mysql");
        const char *name = kt_unique("rel");
        src_t *x = src_new(url, name);
        cr_assert(eq(int, x->s.ops->open(&x->s), 0), "%s", x->s.err);
        cr_assert(eq(int, x->s.ops->start(&x->s), 0), "%s", x->s.err);
        kt_exec(url, "INSERT INTO kinbox_outbox (kind, destination, "
                     "idem_key, aggregate_id, payload) VALUES "
                     "('event', 'orders', 'one', 'agg', 'p1'),"
                     "('action', 'action:mail', 'two', NULL, NULL)");
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('orders', 'three')");
        kinbox__logev_t ev = src_next(x);
        cr_assert(eq(int, ev.kind, KINBOX__LOGEV_BEGIN));
        ev = src_next(x);
        cr_assert(eq(int, ev.kind, KINBOX__LOGEV_ROW));
        cr_expect(eq(str, (char *)ev.row.idem_key, "one"));
        cr_expect(eq(str, (char *)ev.row.aggregate_id, "agg"));
        cr_expect(eq(int, ev.row.action, 0));
        ev = src_next(x);
        cr_expect(eq(str, (char *)ev.row.idem_key, "two"));
        cr_expect(eq(int, ev.row.action, 1));
        ev = src_next(x);
        cr_assert(eq(int, ev.kind, KINBOX__LOGEV_COMMIT));
        cr_assert(eq(int, x->s.ops->confirm(&x->s, &ev.pos), 0));
        char pos[128];
        snprintf(pos, sizeof(pos), "%s", ev.pos.text);
        src_free(x); /* close() stores the confirmed position */
        char q[256];
        snprintf(q, sizeof(q),
                 "SELECT COUNT(*) FROM kinbox_relay_position WHERE relay = "
                 "'%s' AND gtid = '%s'",
                 name, pos);
        cr_expect(eq(i64, kt_qint(url, q), 1), "%s", pos);

        x = src_new(url, name);
        cr_assert(eq(int, x->s.ops->open(&x->s), 0), "%s", x->s.err);
        cr_assert(eq(int, x->s.ops->start(&x->s), 0), "%s", x->s.err);
        ev = src_next(x);
        cr_assert(eq(int, ev.kind, KINBOX__LOGEV_BEGIN));
        ev = src_next(x);
        cr_expect(eq(str, (char *)ev.row.idem_key, "three"));
        src_free(x);
}

/* Two sources of one name: the second opens, but its start() says
 * KINBOX_ERR_STATE (busy: the loop waits a second and tries again) until
 * the first's session ends; then it takes over, from the first's stored
 * position. */
Test(binlog, source_one_reader_per_name)
{
        char *url = kt_fresh_db("mysql");
        const char *name = kt_unique("rel");
        src_t *a = src_new(url, name), *b = src_new(url, name);
        cr_assert(eq(int, a->s.ops->open(&a->s), 0), "%s", a->s.err);
        cr_assert(eq(int, a->s.ops->start(&a->s), 0), "%s", a->s.err);
        cr_assert(eq(int, b->s.ops->open(&b->s), 0), "%s", b->s.err);
        cr_expect(eq(int, b->s.ops->start(&b->s), KINBOX_ERR_STATE));
        cr_expect(strstr(b->s.err, "waiting to take over") != NULL, "%s",
                  b->s.err);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('t', 'seen-by-a')");
        kinbox__logev_t ev = src_next(a);
        while (ev.kind != KINBOX__LOGEV_COMMIT)
                ev = src_next(a);
        cr_assert(eq(int, a->s.ops->confirm(&a->s, &ev.pos), 0));
        src_free(a);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key) "
                     "VALUES ('t', 'after-a')");
        cr_assert(eq(int, b->s.ops->start(&b->s), 0), "%s", b->s.err);
        ev = src_next(b);
        cr_assert(eq(int, ev.kind, KINBOX__LOGEV_BEGIN));
        ev = src_next(b);
        cr_expect(eq(str, (char *)ev.row.idem_key, "after-a"));
        src_free(b);
}

/* A stored position whose binlog is gone: open() refuses (exit 2),
 * naming the position and outbox resend --since. */
Test(binlog, source_refuses_purged_position)
{
        char *url = kt_fresh_db("mysql");
        const char *name = kt_unique("rel");
        long long seq = kt_qint(url, "SELECT SUBSTRING_INDEX("
                                     "@@gtid_binlog_pos, '-', -1)");
        char old[128], q[512];
        snprintf(old, sizeof(old), "0-1-%lld", seq - 1);
        snprintf(q, sizeof(q),
                 "INSERT INTO kinbox_relay_position (relay, gtid) VALUES "
                 "('%s', '%s')",
                 name, old);
        kt_exec(url, q);
        purge_after(url, seq);

        src_t *x = src_new(url, name);
        cr_expect(eq(int, x->s.ops->open(&x->s), KINBOX_ERR_CONFIG));
        cr_expect(strstr(x->s.err, old) != NULL, "%s", x->s.err);
        cr_expect(strstr(x->s.err, "kinbox outbox resend --since") != NULL,
                  "%s", x->s.err);
        src_free(x);
}

/* ---- Connector/C's own row decoder, for the record */

/*
 * The probe of Debian 12's Connector/C 3.3 API by itself: a dump opened
 * with mariadb_rpl_init_ex / _optionsv / _open from a GTID state, fetched
 * with mariadb_rpl_fetch (GTID, TABLE_MAP, WRITE_ROWS, XID), and
 * mariadb_rpl_extract_rows() on a row (BIGINT, VARCHAR, BLOB, TIMESTAMP(6),
 * VARCHAR): in 3.3.20 it decodes every column, the TIMESTAMP(6) into
 * val.ts (earlier 3.3 sources read its fraction with the precision as its
 * width and every later column wrong); kinbox's decoder
 * (mysql_binlog_rows.c) reads the same row image alike.
 */
Test(binlog, connector_api_probe)
{
        char *url = kt_fresh_db("mysql");
        kt_exec(url, "CREATE TABLE probe_t (id BIGINT PRIMARY KEY, v "
                     "VARCHAR(20), b BLOB, t TIMESTAMP(6) NULL, w "
                     "VARCHAR(20))");
        kinbox__db_t *db = kt_db(url);
        kinbox_rows_t *r = NULL;
        cr_assert(kinbox__db_query(db, "SELECT @@gtid_binlog_pos", 0, NULL,
                                   &r) == 0);
        char set[512];
        snprintf(set, sizeof(set),
                 "SET @mariadb_slave_capability = 4, "
                 "@master_binlog_checksum = @@global.binlog_checksum, "
                 "@slave_connect_state = '%s'",
                 kinbox_rows_value(r, 0, 0, NULL));
        kinbox_rows_destroy(r);
        bool down = false;
        MYSQL *m = kinbox__db_mysql(db, &down);
        cr_assert(m != NULL && mysql_query(m, set) == 0, "%s", set);
        MARIADB_RPL *rpl = mariadb_rpl_init_ex(m, MARIADB_RPL_VERSION);
        cr_assert(rpl != NULL);
        cr_assert(mariadb_rpl_optionsv(rpl, MARIADB_RPL_SERVER_ID,
                                       kinbox__binlog_server_id("probe")) ==
                  0);
        cr_assert(mariadb_rpl_optionsv(rpl, MARIADB_RPL_FILENAME, "", 0) == 0);
        cr_assert(mariadb_rpl_optionsv(rpl, MARIADB_RPL_START, 4UL) == 0);
        cr_assert(mariadb_rpl_open(rpl) == 0, "%s", mariadb_rpl_error(rpl));
        kt_exec(url, "INSERT INTO probe_t VALUES (42, 'vee', X'00ff', "
                     "'2026-12-06 01:02:03.000456', 'after')");

        MARIADB_RPL_EVENT *ev = NULL, *tm = NULL;
        bool gtid = false, xid = false, rows = false;
        int64_t until = kinbox__now_ms() + 20000;
        while (!xid && kinbox__now_ms() < until) {
                ev = mariadb_rpl_fetch(rpl, ev);
                cr_assert(ev != NULL, "%s", mariadb_rpl_error(rpl));
                if (ev->event_type == GTID_EVENT)
                        gtid = true;
                if (ev->event_type == TABLE_MAP_EVENT &&
                    ev->event.table_map.table.length == 7 &&
                    !memcmp(ev->event.table_map.table.str, "probe_t", 7)) {
                        tm = ev;
                        ev = NULL; /* keep the table map */
                        continue;
                }
                if (tm && (ev->event_type == WRITE_ROWS_EVENT_V1 ||
                           ev->event_type == WRITE_ROWS_EVENT)) {
                        rows = true;
                        MARIADB_RPL_ROW *row =
                            mariadb_rpl_extract_rows(rpl, tm, ev);
                        cr_assert(row != NULL, "%s", mariadb_rpl_error(rpl));
                        cr_expect(eq(i64, row->columns[0].val.ll, 42));
                        cr_expect(eq(sz, row->columns[1].val.str.length, 3));
                        cr_expect(memcmp(row->columns[1].val.str.str, "vee",
                                         3) == 0);
                        cr_expect(eq(sz, row->columns[2].val.str.length, 2));
                        const MARIADB_STRING *w = &row->columns[4].val.str;
                        cr_expect(eq(sz, w->length, 5));
                        cr_expect(w->str && !memcmp(w->str, "after", 5));
                        cr_expect(
                            eq(u32, row->columns[3].val.ts.second_part, 456));
                        cr_log_info(
                            "extract_rows: t (type %d) = '%.*s' "
                            "(as a number %llu, as a timestamp "
                            "%u.%u), w = %.*s",
                            (int)row->columns[3].field_type,
                            (int)row->columns[3].val.str.length,
                            row->columns[3].val.str.str,
                            (unsigned long long)row->columns[3].val.ull,
                            row->columns[3].val.ts.second,
                            row->columns[3].val.ts.second_part,
                            w->str ? (int)w->length : 0, w->str ? w->str : "");
                        /* kinbox's own decoder on the same bytes. */
                        kinbox__bl_tmap_t t = {0};
                        char err[256];
                        struct st_mariadb_rpl_table_map_event *x =
                            &tm->event.table_map;
                        cr_assert(
                            kinbox__bl_tmap_set(
                                &t, x->table_id,
                                (const unsigned char *)x->column_types.str,
                                x->column_count,
                                (const unsigned char *)x->metadata.str,
                                x->metadata.length, err, sizeof(err)) == 0,
                            "%s", err);
                        kinbox__bl_col_t cols[5];
                        const unsigned char *p = ev->event.rows.row_data;
                        cr_assert(kinbox__bl_row_decode(
                                      &t, ev->event.rows.column_bitmap, &p,
                                      p + ev->event.rows.row_data_size, cols,
                                      err, sizeof(err)) == 0,
                                  "%s", err);
                        cr_expect(eq(i64, cols[0].i, 42));
                        cr_expect(eq(i64, cols[3].us,
                                     kt_qint(url, "SELECT CAST(UNIX_TIMESTAMP("
                                                  "t) * 1000000 AS SIGNED) "
                                                  "FROM probe_t")));
                        cr_expect(eq(sz, cols[4].n, 5));
                        cr_expect(memcmp(cols[4].p, "after", 5) == 0);
                        kinbox__bl_tmap_free(&t);
                }
                if (ev->event_type == XID_EVENT && rows)
                        xid = true;
        }
        cr_expect(gtid && rows && xid);
        mariadb_free_rpl_event(ev);
        mariadb_free_rpl_event(tm);
        mariadb_rpl_close(rpl);
        kinbox__db_destroy(db);
}

/* lag() (kinbox status, the relay's metrics), without open(): no position
 * yet, then the binlog bytes after the stored one, then purged. */
Test(binlog, source_lag)
{
        char *url = kt_fresh_db("mysql");
        const char *name = kt_unique("rel");
        src_t *x = src_new(url, name);
        kinbox__loglag_t lag;
        cr_assert(eq(int, x->s.ops->lag(&x->s, &lag), 0), "%s", x->s.err);
        cr_expect(eq(str, lag.state, "none"));
        cr_expect(eq(i64, lag.retained_bytes, -1));
        long long seq = kt_qint(url, "SELECT SUBSTRING_INDEX("
                                     "@@gtid_binlog_pos, '-', -1)");
        char q[512];
        snprintf(q, sizeof(q),
                 "INSERT INTO kinbox_relay_position (relay, gtid) VALUES "
                 "('%s', '0-1-%lld')",
                 name, seq);
        kt_exec(url, q);
        kt_exec(url, "INSERT INTO kinbox_outbox (destination, idem_key, "
                     "payload) VALUES ('t', 'lag', REPEAT('x', 100000))");
        cr_assert(eq(int, x->s.ops->lag(&x->s, &lag), 0), "%s", x->s.err);
        cr_expect(eq(str, lag.state, "ok"));
        cr_expect(gt(i64, lag.retained_bytes, 100000));
        purge_after(url, seq);
        cr_assert(eq(int, x->s.ops->lag(&x->s, &lag), 0), "%s", x->s.err);
        cr_expect(eq(str, lag.state, "purged"));
        src_free(x);
}
