/*
 * db/mysql_outbox_partition.c -- the partitioned outbox on MySQL /
 * MariaDB (db/outbox_partition.h): PARTITION BY RANGE
 * (UNIX_TIMESTAMP(created_at)), one partition per UTC day, p_past and
 * p_future as the catch-alls. A partitioned table's row events in the
 * binlog name the table (kinbox_outbox), never a partition, so the binlog
 * relay reads it as it reads the plain one.
 *
 * A range goes as the inbox's do (db/mysql_part.c, kinbox__my_part_*):
 * swapped out (EXCHANGE PARTITION, metadata only) to
 * kinbox_outbox_old_<day>, its empty partition dropped, the rows kept put
 * back, the table dropped; a crash between the steps leaves that table,
 * which finish() completes.
 */
#include "../db.h"
#include "../internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends of one key wait for each other (the key's hash picks a row of
 * kinbox_outbox_keylock, locked until commit). A key already there (a
 * locking read: it sees rows committed after the transaction's snapshot)
 * gives the new row that row's primary key, so the insert meets it as it
 * met the unique index: ON DUPLICATE KEY UPDATE changes nothing and
 * LAST_INSERT_ID() says 0 (a duplicate), a plain INSERT fails with 1062. */
#define KEYLOCK_ROWS 1024
static const char conv_trigger[] =
    "CREATE TRIGGER kinbox_outbox_idem BEFORE INSERT ON kinbox_outbox_conv "
    "FOR "
    "EACH ROW BEGIN DECLARE h INT; DECLARE i BIGINT DEFAULT NULL; DECLARE "
    "t TIMESTAMP(6); DECLARE CONTINUE HANDLER FOR NOT FOUND SET i = NULL; "
    "SELECT b INTO h FROM kinbox_outbox_keylock WHERE b = "
    "CRC32(CONCAT(NEW.destination, 0x0a, NEW.idem_key)) % 1024 FOR UPDATE; "
    "SELECT id, created_at INTO i, t FROM kinbox_outbox WHERE destination "
    "= NEW.destination AND idem_key = NEW.idem_key LIMIT 1 LOCK IN SHARE "
    "MODE; IF i IS NOT NULL THEN SET NEW.id = i, NEW.created_at = t; END "
    "IF; END";

static int
run(kinbox__db_t *db, const char *sql)
{
        return kinbox__db_query(db, sql, 0, NULL, NULL);
}

/* The first column of sql's first row, malloc'ed (NULL: no row). */
static int
first(kinbox__db_t *db, const char *sql, int np, const kinbox__param_t *p,
      char **out)
{
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db, sql, np, p, &r);
        *out = !rc && r->nrows && r->values[0] ? kinbox__strdup(r->values[0])
                                               : NULL;
        kinbox_rows_destroy(r);
        return rc;
}

static int
my_layout(kinbox__db_t *db, bool *partitioned)
{
        return kinbox__db_exists(db,
                                 "SELECT 1 FROM information_schema.PARTITIONS "
                                 "WHERE TABLE_SCHEMA = DATABASE() AND "
                                 "TABLE_NAME = 'kinbox_outbox' AND "
                                 "PARTITION_NAME IS NOT NULL LIMIT 1",
                                 partitioned);
}

static int
my_list(kinbox__db_t *db, kinbox__range_t **out, size_t *n)
{
        return kinbox__my_part_list(db, "kinbox_outbox", NULL, out, n, NULL);
}

/* The ALTER that partitions kinbox_outbox_conv: days [first_s, end_s). */
static int
conv_alter(kinbox__buf_t *b, int64_t first_s, int64_t end_s)
{
        kinbox__buf_printf(
            b,
            "ALTER TABLE kinbox_outbox_conv DROP PRIMARY KEY, ADD PRIMARY "
            "KEY (id, created_at), DROP INDEX kinbox_outbox_dest_idem, ADD "
            "INDEX kinbox_outbox_dest_idem (destination, idem_key) "
            "PARTITION BY RANGE (UNIX_TIMESTAMP(created_at)) (PARTITION "
            "p_past VALUES LESS THAN (%" PRId64 ")",
            first_s);
        for (int64_t at = first_s; at < end_s; at += KINBOX__OUTBOX_DAY_S) {
                char lab[16];
                kinbox__range_label(lab, at, KINBOX__OUTBOX_DAY_S);
                kinbox__buf_printf(b,
                                   ", PARTITION p_%s VALUES LESS THAN "
                                   "(%" PRId64 ")",
                                   lab, at + KINBOX__OUTBOX_DAY_S);
        }
        kinbox__buf_adds(b, ", PARTITION p_future VALUES LESS THAN MAXVALUE)");
        return b->oom ? KINBOX_ERR_NOMEM : KINBOX_OK;
}

static int
keylock(kinbox__db_t *db)
{
        int rc = run(db, "CREATE TABLE IF NOT EXISTS kinbox_outbox_keylock "
                         "(b INT NOT NULL PRIMARY KEY) ENGINE = InnoDB");
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_adds(&b, "INSERT IGNORE INTO kinbox_outbox_keylock (b) "
                             "VALUES (0)");
        for (int i = 1; i < KEYLOCK_ROWS; i++)
                kinbox__buf_printf(&b, ",(%d)", i);
        if (!rc)
                rc = b.oom ? KINBOX_ERR_NOMEM : run(db, b.p);
        kinbox__buf_free(&b);
        return rc;
}

/* The trigger is made on kinbox_outbox_conv (its body names
 * kinbox_outbox, which it is after the renames): a table renamed under
 * LOCK TABLES is no longer locked by its new name. */
static const char *const conv_locked[] = {
    conv_trigger, "ALTER TABLE kinbox_outbox RENAME TO kinbox_outbox_plain",
    "ALTER TABLE kinbox_outbox_conv RENAME TO kinbox_outbox", NULL};

static int
my_convert(kinbox__db_t *db, int64_t first_s, int64_t end_s, uint64_t *rows)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        int rc = run(db, "DROP TABLE IF EXISTS kinbox_outbox_conv");
        if (!rc)
                rc = run(db, "CREATE TABLE kinbox_outbox_conv LIKE "
                             "kinbox_outbox");
        if (!rc && !(rc = conv_alter(&b, first_s, end_s)))
                rc = run(db, b.p);
        kinbox__buf_free(&b);
        if (!rc)
                rc = keylock(db);
        /* Writers wait from here to UNLOCK: no row is missed. */
        if (!rc)
                rc = run(db, "LOCK TABLES kinbox_outbox WRITE, "
                             "kinbox_outbox_conv WRITE, kinbox_outbox_keylock "
                             "WRITE");
        char *n = NULL;
        if (!rc)
                rc = first(db,
                           "INSERT INTO kinbox_outbox_conv SELECT * FROM "
                           "kinbox_outbox;\nSELECT ROW_COUNT()",
                           0, NULL, &n);
        size_t i = 0;
        for (; !rc && conv_locked[i]; i++)
                rc = run(db, conv_locked[i]);
        /* Failed between the renames: the plain table back in place. */
        if (rc && i == 3)
                run(db, "ALTER TABLE kinbox_outbox_plain RENAME TO "
                        "kinbox_outbox");
        int urc = run(db, "UNLOCK TABLES");
        *rows = n ? strtoull(n, NULL, 10) : 0;
        free(n);
        if (!rc)
                rc = urc;
        return rc ? rc : run(db, "DROP TABLE kinbox_outbox_plain");
}

static int
my_add(kinbox__db_t *db, int64_t start_s)
{
        char lab[16], sql[400];
        kinbox__range_label(lab, start_s, KINBOX__OUTBOX_DAY_S);
        /* p_future holds rows only when created_at ran past every range
         * (the pruner stopped for days): REORGANIZE then moves them. */
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE kinbox_outbox REORGANIZE PARTITION p_future "
                 "INTO (PARTITION p_%s VALUES LESS THAN (%" PRId64
                 "), PARTITION p_future VALUES LESS THAN MAXVALUE)",
                 lab, start_s + KINBOX__OUTBOX_DAY_S);
        return run(db, sql);
}

static int
my_mark(kinbox__db_t *db)
{
        int rc = run(db, "INSERT IGNORE INTO kinbox_outbox_marks (at, pos) "
                         "VALUES (CURRENT_TIMESTAMP(6), @@gtid_binlog_pos)");
        return rc ? rc
                  : run(db, "DELETE FROM kinbox_outbox_marks WHERE at < "
                            "CURRENT_TIMESTAMP(6) - INTERVAL 2 DAY");
}

/* The first GTID ("d-s-n") of the list *g ("d-s-n,d-s-n..."): its domain
 * and sequence number, *g past it (NULL at the end); false when *g holds
 * none. */
static bool
gtid_next(const char **g, unsigned long *dom, long long *n)
{
        if (!*g || !**g)
                return false;
        char *e = NULL;
        *dom = strtoul(*g, &e, 10);
        const char *s = e && *e == '-' ? strchr(e + 1, '-') : NULL;
        if (!s)
                return false;
        *n = strtoll(s + 1, &e, 10);
        *g = e && *e == ',' ? e + 1 : NULL;
        while (*g && (**g == ' ' || **g == '\n'))
                (*g)++;
        return true;
}

/* The sequence number of domain d in the GTID list g ("d-s-n,..."), or
 * -1 when g has no GTID of d. */
static long long
gtid_seq(const char *g, unsigned long d)
{
        long long best = -1, n = 0;
        unsigned long dom = 0;
        while (gtid_next(&g, &dom, &n))
                if (dom == d && n > best)
                        best = n;
        return best;
}

/* Whether the position pos is at or past mark in every domain of mark. */
static bool
gtid_past(const char *pos, const char *mark)
{
        const char *m = mark;
        long long n = 0;
        unsigned long dom = 0;
        while (gtid_next(&m, &dom, &n))
                if (gtid_seq(pos, dom) < n)
                        return false;
        return !m || !*m;
}

static int
refuse(kinbox__db_t *db, const kinbox__range_t *r, const char *why)
{
        kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                          KINBOX__OPART_REFUSED, r->name, why);
        return KINBOX_ERR_STATE;
}

/* The relay's stored position is past the first mark after end. */
static int
confirmed(kinbox__db_t *db, const kinbox__range_t *r, int64_t end,
          const char *name)
{
        char sql[300], *pos = NULL, *mark = NULL;
        kinbox__param_t p = {name, 0, 0};
        int rc = first(db,
                       "SELECT gtid FROM kinbox_relay_position WHERE relay = "
                       "$1",
                       1, &p, &pos);
        snprintf(
            sql, sizeof(sql),
            "SELECT pos FROM kinbox_outbox_marks WHERE UNIX_TIMESTAMP(at) "
            ">= %" PRId64 " ORDER BY at LIMIT 1",
            end);
        if (!rc)
                rc = first(db, sql, 0, NULL, &mark);
        bool ok = !rc && pos && mark && gtid_past(pos, mark);
        free(pos);
        free(mark);
        if (!rc && !ok)
                rc = refuse(db, r,
                            "is not behind the log relay's confirmed "
                            "position yet");
        return rc;
}

static int
drop_checks(kinbox__db_t *db, const kinbox__range_t *r, int64_t ret_ms,
            const kinbox__opart_relay_t *relay)
{
        int64_t end = r->start_s + KINBOX__OUTBOX_DAY_S;
        char sql[300], from[160];
        snprintf(sql, sizeof(sql),
                 "SELECT UNIX_TIMESTAMP(CURRENT_TIMESTAMP(6)) * 1000 - "
                 "%" PRId64 " >= %" PRId64,
                 ret_ms, end * 1000);
        snprintf(from, sizeof(from), "kinbox_outbox PARTITION (%s)", r->name);
        bool poll = !relay || !relay->binlog_name;
        int rc = kinbox__opart_checks(db, r, sql, from, !poll);
        return rc || poll ? rc : confirmed(db, r, end, relay->binlog_name);
}

/* Put the rows still needed of the swapped-out table t back into
 * kinbox_outbox (dead ones; pending ones, made pending again since the
 * checks: with a log relay only action rows, its event rows are sent),
 * then drop t. */
static int
finish_one(kinbox__db_t *db, const char *t, const kinbox__opart_relay_t *relay,
           uint64_t *kept)
{
        char sql[400];
        bool poll = !relay || !relay->binlog_name;
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_outbox SELECT * FROM %s WHERE status = "
                 "'dead' OR (status = 'pending'%s)",
                 t, poll ? "" : " AND kind = 'action'");
        int rc = kinbox__my_part_count(db, sql, 0, NULL, kept);
        snprintf(sql, sizeof(sql), "DROP TABLE %s", t);
        return rc ? rc : run(db, sql);
}

static int
my_drop(kinbox__db_t *db, const kinbox__range_t *r, int64_t ret_ms,
        const kinbox__opart_relay_t *relay, uint64_t *kept)
{
        char lab[16], t[64];
        kinbox__range_label(lab, r->start_s, KINBOX__OUTBOX_DAY_S);
        snprintf(t, sizeof(t), "kinbox_outbox_old_%s", lab);
        *kept = 0;
        int rc = drop_checks(db, r, ret_ms, relay);
        if (!rc)
                rc =
                    kinbox__my_part_swap_drop(db, "kinbox_outbox", r->name, t);
        return rc ? rc : finish_one(db, t, relay, kept);
}

static int
my_finish(kinbox__db_t *db, const kinbox__opart_relay_t *relay)
{
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(
            db,
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE "
            "TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE "
            "'kinbox\\_outbox\\_old\\_%'",
            0, NULL, &r);
        for (size_t i = 0; !rc && i < r->nrows; i++) {
                uint64_t kept = 0;
                rc = finish_one(db, r->values[i * (size_t)r->ncols], relay,
                                &kept);
        }
        kinbox_rows_destroy(r);
        return rc;
}

static int
my_prune_catchall(kinbox__db_t *db, int64_t age_ms, bool log, int64_t batch,
                  uint64_t *n)
{
        char sql[600];
        snprintf(sql, sizeof(sql),
                 "DELETE FROM kinbox_outbox PARTITION (p_past, p_future) "
                 "WHERE (status = 'sent' AND sent_at < CURRENT_TIMESTAMP(6) - "
                 "INTERVAL %" PRId64 " MICROSECOND) OR (%d AND kind = "
                 "'event' AND status <> 'dead' AND created_at < "
                 "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64
                 " MICROSECOND) LIMIT %" PRId64,
                 age_ms * 1000, log ? 1 : 0, age_ms * 1000, batch);
        return kinbox__my_part_count(db, sql, 0, NULL, n);
}

const struct kinbox__opart_ops kinbox__mysql_opart = {
    .layout = my_layout,
    .list = my_list,
    .convert = my_convert,
    .add = my_add,
    .mark = my_mark,
    .drop = my_drop,
    .check = drop_checks,
    .finish = my_finish,
    .prune_catchall = my_prune_catchall,
};
