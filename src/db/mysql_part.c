/*
 * db/mysql_part.c -- the partitioned inbox on MySQL/MariaDB
 * (db/part_ops.h): RANGE COLUMNS partitions of part_at (a DATETIME in
 * UTC), p_past below the lowest range and p_future (MAXVALUE) above the
 * highest as the catch-alls, and the online conversion of a plain inbox
 * (row triggers mirror new rows while batches copy the old ones; one
 * atomic RENAME TABLE swaps).
 *
 * A range is dropped by swapping its rows out (EXCHANGE PARTITION with an
 * empty table: metadata only), dropping the emptied partition (metadata
 * only; p_past keeps its bound and is never copied), keeping the rows
 * still needed and dropping the table. DDL commits implicitly; a crash between
 * these steps leaves kinbox_inbox_old_<range>, which finish() completes.
 */
#include "../db.h"
#include "../internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EPOCH "TIMESTAMP '1970-01-01 00:00:00'"

/* The start of the range (width_s) of the DATETIME expression t. */
static void
bucket(char *out, size_t sz, const char *t, int64_t width_s)
{
        snprintf(out, sz,
                 "(" EPOCH " + INTERVAL (TIMESTAMPDIFF(SECOND, " EPOCH
                 ", %s) DIV %" PRId64 " * %" PRId64 ") SECOND)",
                 t, width_s, width_s);
}

static int
run(kinbox__db_t *db, const char *sql)
{
        return kinbox__db_query(db, sql, 0, NULL, NULL);
}

int
kinbox__my_part_count(kinbox__db_t *db, const char *sql, int n,
                      const kinbox__param_t *p, uint64_t *count)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_adds(&b, sql);
        kinbox__buf_adds(&b, ";\nSELECT ROW_COUNT()");
        *count = 0;
        int rc =
            b.oom ? KINBOX_ERR_NOMEM : kinbox__db_count(db, b.p, n, p, count);
        kinbox__buf_free(&b);
        return rc;
}

int
kinbox__my_part_list(kinbox__db_t *db, const char *table,
                     const char *count_fmt, kinbox__range_t **out, size_t *n,
                     int64_t *catchall_rows)
{
        return kinbox__ranges_read(
            db,
            "SELECT PARTITION_NAME, TABLE_ROWS, DATA_LENGTH + INDEX_LENGTH "
            "FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = "
            "DATABASE() AND TABLE_NAME = $1 AND PARTITION_NAME IS NOT NULL "
            "ORDER BY PARTITION_ORDINAL_POSITION",
            table, count_fmt, out, n, catchall_rows);
}

static int
my_list(kinbox__db_t *db, const char *table, kinbox__range_t **out, size_t *n,
        int64_t *catchall_rows)
{
        return kinbox__my_part_list(
            db, table, "SELECT count(*) FROM %s PARTITION (p_past, p_future)",
            out, n, catchall_rows);
}

static int
my_create(kinbox__db_t *db, const char *table, int64_t first_s)
{
        char first[40], sql[1600];
        kinbox__utc_quoted(first, sizeof(first), "", first_s);
        snprintf(
            sql, sizeof(sql),
            "CREATE TABLE %s (consumer VARCHAR(200) CHARACTER SET utf8mb4 "
            "COLLATE utf8mb4_bin NOT NULL, message_id VARBINARY(255) NOT "
            "NULL, topic VARCHAR(249) CHARACTER SET utf8mb4 COLLATE "
            "utf8mb4_bin NOT NULL, kafka_partition INT NOT NULL, "
            "kafka_offset BIGINT NOT NULL, tx_token CHAR(32) CHARACTER SET "
            "ascii COLLATE ascii_bin NULL, processed_at TIMESTAMP(6) NOT "
            "NULL DEFAULT CURRENT_TIMESTAMP(6), msg_at DATETIME(3) NULL, "
            "part_at DATETIME NOT NULL, shadow TINYINT(1) NOT NULL DEFAULT "
            "0, PRIMARY KEY (consumer, message_id, part_at), INDEX "
            "kinbox_inbox_processed_at (processed_at), INDEX "
            "kinbox_inbox_tx_token (consumer, tx_token)) ENGINE = InnoDB "
            "DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin PARTITION BY "
            "RANGE COLUMNS (part_at) (PARTITION p_past VALUES LESS THAN "
            "(%s), PARTITION p_future VALUES LESS THAN (MAXVALUE))",
            table, first);
        return run(db, sql);
}

static int
my_clock(kinbox__db_t *db, int64_t *now_ms)
{
        return kinbox__db_clock_ms(db,
                                   "SELECT TIMESTAMPDIFF(MICROSECOND, " EPOCH
                                   ", UTC_TIMESTAMP(6)) DIV 1000",
                                   now_ms);
}

/* An empty unpartitioned copy of kinbox_inbox named t, and partition
 * part of table swapped with it (metadata only). */
static int
swap_out(kinbox__db_t *db, const char *table, const char *part, const char *t)
{
        char sql[300];
        snprintf(sql, sizeof(sql), "CREATE TABLE %s LIKE %s", t, table);
        int rc = run(db, sql);
        snprintf(sql, sizeof(sql), "ALTER TABLE %s REMOVE PARTITIONING", t);
        if (!rc)
                rc = run(db, sql);
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE %s EXCHANGE PARTITION %s WITH TABLE %s", table,
                 part, t);
        return rc ? rc : run(db, sql);
}

int
kinbox__my_part_swap_drop(kinbox__db_t *db, const char *table,
                          const char *part, const char *t)
{
        char sql[300];
        int rc = swap_out(db, table, part, t);
        snprintf(sql, sizeof(sql), "ALTER TABLE %s DROP PARTITION %s", table,
                 part);
        return rc ? rc : run(db, sql);
}

/* Put every row of the swapped-out table t back into table, drop t. */
static int
put_back(kinbox__db_t *db, const char *table, const char *t)
{
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "INSERT IGNORE INTO %s (" KINBOX__INBOX_COLS
                 ") SELECT " KINBOX__INBOX_COLS " FROM %s",
                 table, t);
        int rc = run(db, sql);
        snprintf(sql, sizeof(sql), "DROP TABLE %s", t);
        return rc ? rc : run(db, sql);
}

static int
my_add(kinbox__db_t *db, const char *table, int64_t start_s, int64_t width_s)
{
        char lab[16], end[40], sql[400], fut[80];
        kinbox__range_label(lab, start_s, width_s);
        kinbox__utc_quoted(end, sizeof(end), "", start_s + width_s);
        /* REORGANIZE copies p_future's rows under a lock that holds the
         * consumers' inserts: only an empty p_future is split. Its rows
         * (messages dated past every range) step out to a table and back
         * around it. */
        bool rows = false;
        snprintf(sql, sizeof(sql),
                 "SELECT 1 FROM %s PARTITION (p_future) LIMIT 1", table);
        snprintf(fut, sizeof(fut), "%s_fut", table);
        int rc = kinbox__db_true(db, sql, 0, NULL, &rows);
        if (!rc && rows)
                rc = swap_out(db, table, "p_future", fut);
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE %s REORGANIZE PARTITION p_future INTO "
                 "(PARTITION p_%s VALUES LESS THAN (%s), PARTITION p_future "
                 "VALUES LESS THAN (MAXVALUE))",
                 table, lab, end);
        if (!rc)
                rc = run(db, sql);
        return !rc && rows ? put_back(db, table, fut) : rc;
}

/* Keep the needed rows of the swapped-out table t, then drop it. *kept:
 * the rows kept, less those of an earlier range (below start_s; -1: none)
 * that an earlier drop kept and this one keeps again. */
static int
finish_one(kinbox__db_t *db, const char *t, int64_t start_s, uint64_t *kept)
{
        char sql[1024], st[40];
        uint64_t again = 0;
        int rc = KINBOX_OK;
        if (start_s >= 0) {
                kinbox__utc_quoted(st, sizeof(st), "", start_s);
                snprintf(sql, sizeof(sql),
                         "SELECT COUNT(*)" KINBOX__PART_NEEDED(
                             "%s") " WHERE x.part_at < %s",
                         t, st);
                rc = kinbox__db_count(db, sql, 0, NULL, &again);
        }
        snprintf(sql, sizeof(sql),
                 "INSERT IGNORE INTO kinbox_inbox (" KINBOX__INBOX_COLS
                 ") SELECT " KINBOX__INBOX_XCOLS KINBOX__PART_NEEDED("%s"),
                 t);
        if (!rc)
                rc = kinbox__my_part_count(db, sql, 0, NULL, kept);
        if (rc)
                return rc;
        *kept = *kept > again ? *kept - again : 0;
        snprintf(sql, sizeof(sql), "DROP TABLE %s", t);
        return run(db, sql);
}

static int
my_finish(kinbox__db_t *db)
{
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(
            db,
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE "
            "TABLE_SCHEMA = DATABASE() AND (TABLE_NAME LIKE "
            "'kinbox\\_inbox\\_old\\_%' OR TABLE_NAME = 'kinbox_inbox_fut')",
            0, NULL, &r);
        for (size_t i = 0; !rc && i < r->nrows; i++) {
                uint64_t kept = 0;
                const char *t = r->values[i * (size_t)r->ncols];
                rc = strcmp(t, "kinbox_inbox_fut")
                         ? finish_one(db, t, -1, &kept)
                         : put_back(db, "kinbox_inbox", t);
        }
        kinbox_rows_destroy(r);
        return rc;
}

static int
my_drop(kinbox__db_t *db, const kinbox__range_t *r, int64_t width_s,
        int64_t ret_ms, uint64_t *kept)
{
        char lab[16], end[40], t[64], sql[400];
        kinbox__range_label(lab, r->start_s, width_s);
        kinbox__utc_quoted(end, sizeof(end), "", r->start_s + width_s);
        snprintf(t, sizeof(t), "kinbox_inbox_old_%s", lab);
        *kept = 0;
        /* The database's clock decides, right before the swap. */
        snprintf(sql, sizeof(sql),
                 "SELECT TIMESTAMP %s <= UTC_TIMESTAMP(6) - INTERVAL %" PRId64
                 " MICROSECOND",
                 end, ret_ms * 1000);
        int rc = kinbox__db_must(db, sql, 0, NULL,
                                 "range %s is not past the retention by the "
                                 "database's clock: not dropped",
                                 r->name);
        /* Swapped out, the range is empty: dropping it is metadata only,
         * and p_past (the catch-all) is not touched. Its span then
         * belongs to the next range up: the rows kept for dead letters
         * and parked messages go there, and are kept again when it
         * goes. */
        if (!rc)
                rc = kinbox__my_part_swap_drop(db, "kinbox_inbox", r->name, t);
        return rc ? rc : finish_one(db, t, r->start_s, kept);
}

/* The INSERT ... SELECT of a row and, within skew of its range's end,
 * its shadow (db/inbox.c): cols are the source's columns up to msg_at,
 * t its time, e true for a row without a record time (the epoch's range,
 * no shadow), from/where the rest of the SELECT. */
static void
copy_sql(char *out, size_t sz, const char *ins, const char *cols,
         const char *t, const char *e, const char *from, int64_t width_s,
         int64_t skew_s)
{
        char b[400], bk[600];
        bucket(b, sizeof(b), t, width_s);
        snprintf(bk, sizeof(bk), "(CASE WHEN %s THEN " EPOCH " ELSE %s END)",
                 e, b);
        snprintf(out, sz,
                 "%s (" KINBOX__INBOX_COLS ") SELECT %s, %s, 0%s UNION ALL "
                 "SELECT %s, %s + INTERVAL %" PRId64
                 " SECOND, 1%s AND NOT %s AND %" PRId64
                 " > 0 AND TIMESTAMPDIFF(MICROSECOND, %s, %s + INTERVAL "
                 "%" PRId64 " SECOND) <= %" PRId64,
                 ins, cols, bk, from, cols, b, width_s, from, e, skew_s, t, b,
                 width_s, skew_s * 1000000);
}

static int
my_mirror(kinbox__db_t *db, bool on, int64_t width_s, int64_t skew_s)
{
        if (!on) {
                int rc =
                    run(db, "DROP TRIGGER IF EXISTS kinbox_inbox_mirror_ins");
                if (!rc)
                        rc = run(
                            db,
                            "DROP TRIGGER IF EXISTS kinbox_inbox_mirror_del");
                return rc ? rc
                          : run(db, "DROP TABLE IF EXISTS kinbox_inbox_conv");
        }
        char sql[4096];
        copy_sql(sql, sizeof(sql),
                 "CREATE TRIGGER kinbox_inbox_mirror_ins AFTER INSERT ON "
                 "kinbox_inbox FOR EACH ROW INSERT IGNORE INTO "
                 "kinbox_inbox_conv",
                 "NEW.consumer, NEW.message_id, NEW.topic, "
                 "NEW.kafka_partition, NEW.kafka_offset, NEW.processed_at, "
                 "NEW.msg_at",
                 "COALESCE(NEW.msg_at, UTC_TIMESTAMP(3))",
                 "(NEW.msg_at IS NULL OR NEW.part_at <=> " EPOCH ")",
                 " FROM DUAL WHERE 1", width_s, skew_s);
        int rc = run(db, sql);
        if (!rc)
                rc = run(
                    db,
                    "CREATE TRIGGER kinbox_inbox_mirror_del AFTER DELETE ON "
                    "kinbox_inbox FOR EACH ROW DELETE FROM "
                    "kinbox_inbox_conv WHERE consumer = OLD.consumer AND "
                    "message_id = OLD.message_id AND topic = OLD.topic AND "
                    "kafka_partition = OLD.kafka_partition AND "
                    "kafka_offset = OLD.kafka_offset");
        return rc;
}

#define AFTER_KEY "(consumer > $1 OR (consumer = $1 AND message_id > $2))"

static int
my_copy(kinbox__db_t *db, int64_t width_s, int64_t skew_s, int64_t batch,
        char **c, char **m, size_t *mlen, uint64_t *copied)
{
        /* Once, at the first batch (no key yet): processed_at (a
         * TIMESTAMP) reads as UTC in this session, and the copy's reads
         * take no locks on the source rows. */
        int rc = KINBOX_OK;
        if (!*c && !(rc = run(db, "SET time_zone = '+00:00'")))
                rc = run(db, "SET SESSION TRANSACTION ISOLATION LEVEL READ "
                             "COMMITTED");
        if (rc)
                return rc;
        char sql[4096], where[256];
        kinbox__param_t p[4] = {{*c ? *c : "", 0, 0},
                                {*m ? *m : "", *m ? *mlen : 0, 1},
                                {NULL, 0, 0},
                                {NULL, 0, 1}};
        snprintf(
            sql, sizeof(sql),
            "SELECT consumer, message_id FROM kinbox_inbox WHERE " AFTER_KEY
            " ORDER BY consumer, message_id LIMIT 1 OFFSET %" PRId64,
            batch - 1);
        struct kinbox_rows_s *r = NULL;
        if ((rc = kinbox__db_query(db, sql, 2, p, &r)))
                return rc;
        bool last = !r->nrows;
        if (!last) {
                p[2] = (kinbox__param_t){r->values[0], 0, 0};
                p[3] = (kinbox__param_t){r->values[1], r->lens[1], 1};
        }
        snprintf(where, sizeof(where),
                 " FROM kinbox_inbox WHERE " AFTER_KEY "%s",
                 last ? ""
                      : " AND (consumer < $3 OR (consumer = $3 AND "
                        "message_id <= $4))");
        copy_sql(sql, sizeof(sql), "INSERT IGNORE INTO kinbox_inbox_conv",
                 "consumer, message_id, topic, kafka_partition, kafka_offset, "
                 "processed_at, msg_at",
                 "COALESCE(msg_at, processed_at)",
                 "(msg_at IS NULL OR part_at <=> " EPOCH ")", where, width_s,
                 skew_s);
        uint64_t n = 0;
        rc = kinbox__my_part_count(db, sql, last ? 2 : 4, p, &n);
        if (!rc && !last)
                rc = kinbox__copy_key(r, 0, c, m, mlen);
        /* The tail (no boundary) is copied once more, finding nothing. */
        *copied = last ? n : (uint64_t)batch;
        kinbox_rows_destroy(r);
        return rc;
}

static int
my_swap(kinbox__db_t *db, int64_t width_s, int64_t skew_s)
{
        /* Atomic: no insert finds neither table; the triggers go along
         * with kinbox_inbox_plain and are dropped from it. */
        int rc = run(db, "RENAME TABLE kinbox_inbox TO kinbox_inbox_plain, "
                         "kinbox_inbox_conv TO kinbox_inbox");
        if (!rc)
                rc = run(db, "DROP TRIGGER IF EXISTS kinbox_inbox_mirror_ins");
        if (!rc)
                rc = run(db, "DROP TRIGGER IF EXISTS kinbox_inbox_mirror_del");
        char rec[200];
        snprintf(rec, sizeof(rec),
                 "INSERT INTO kinbox_partitioning (table_name, width_s, "
                 "skew_s) VALUES ('kinbox_inbox', %" PRId64 ", %" PRId64 ")",
                 width_s, skew_s);
        return rc ? rc : run(db, rec);
}

static int
my_legacy(kinbox__db_t *db, int64_t ret_ms)
{
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "UPDATE kinbox_partitioning SET legacy_until = (SELECT "
                 "MAX(processed_at) FROM kinbox_inbox PARTITION (p_past) "
                 "WHERE part_at = " EPOCH " AND msg_at IS NULL) + INTERVAL "
                 "%" PRId64 " MICROSECOND WHERE table_name = 'kinbox_inbox'",
                 ret_ms * 1000);
        return run(db, sql);
}

static int
my_prune_catchall(kinbox__db_t *db, int64_t age_ms, int64_t batch, uint64_t *n)
{
        char sql[300];
        snprintf(sql, sizeof(sql),
                 "DELETE FROM kinbox_inbox PARTITION (p_past, p_future) WHERE "
                 "processed_at < CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64
                 " MICROSECOND ORDER BY processed_at LIMIT %" PRId64,
                 age_ms * 1000, batch);
        return kinbox__my_part_count(db, sql, 0, NULL, n);
}

const struct kinbox__part_ops kinbox__mysql_part = {
    .list = my_list,
    .clock = my_clock,
    .create = my_create,
    .add = my_add,
    .drop = my_drop,
    .finish = my_finish,
    .mirror = my_mirror,
    .copy = my_copy,
    .swap = my_swap,
    .legacy = my_legacy,
    .prune_catchall = my_prune_catchall,
};
