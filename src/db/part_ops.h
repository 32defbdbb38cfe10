/*
 * db/part_ops.h -- the partitioned inbox's statements per backend
 * (internal): struct kinbox__part_ops, filled by db/pg_part.c and
 * db/mysql_part.c, used by partition.c through db->ops->part. db.h
 * includes it at its end; include db.h.
 *
 * The layout both backends share (docs/operations.md, Daily partitions):
 * kinbox_inbox is partitioned by RANGE of part_at, one range partition
 * named kinbox_inbox_pYYYYMMDD[HH] (PostgreSQL; p_YYYYMMDD[HH] on
 * MySQL) per inbox.partition.width, plus catch-alls for rows whose range
 * has no partition (PostgreSQL's DEFAULT partition kinbox_inbox_default;
 * MySQL's p_past below the lowest range and p_future above the highest).
 * The primary key is (consumer, message_id, part_at).
 */
#ifndef KINBOX_DB_PART_OPS_H
#define KINBOX_DB_PART_OPS_H

#include "../db.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** One range partition: [start_s, start_s + width) of part_at (UTC). */
typedef struct kinbox__range {
        int64_t start_s;
        char name[64]; /* its partition (PostgreSQL: table) name */
        int64_t rows; /* estimated from the catalog, -1 unknown */
        int64_t bytes; /* data and indexes, -1 unknown */
} kinbox__range_t;

/*
 * Every call runs on db's connection outside any transaction (DDL; on
 * MySQL it commits implicitly) and returns as kinbox__db_ops calls do.
 * table is kinbox_inbox or, during a conversion, kinbox_inbox_conv.
 */
struct kinbox__part_ops {
        /* The range partitions of table, ascending, with their sizes:
         * *out malloc'ed, *n. *catchall_rows: the rows in the
         * catch-all(s), counted (NULL: not wanted). */
        int (*list)(kinbox__db_t *db, const char *table, kinbox__range_t **out,
                    size_t *n, int64_t *catchall_rows);
        /* Create table (absent), partitioned, with only its catch-all(s);
         * first_s: where MySQL's p_past ends. */
        int (*create)(kinbox__db_t *db, const char *table, int64_t first_s);
        /* The database's clock (ms since the epoch, UTC): the only clock
         * a range is created or dropped by. */
        int (*clock)(kinbox__db_t *db, int64_t *now_ms);
        /* Add [start_s, start_s + width_s) above every range of table;
         * rows of it that a catch-all holds move in. Metadata only on
         * MySQL: p_future is reorganized only when empty (its rows,
         * future-dated messages, are swapped out to a table and back
         * around it). */
        int (*add)(kinbox__db_t *db, const char *table, int64_t start_s,
                   int64_t width_s);
        /* Drop the lowest range r of kinbox_inbox, keeping the rows that
         * an unresolved dead letter or a parked message still needs (they
         * move to a catch-all: on PostgreSQL in the DETACH's transaction,
         * the detached table dropped in one of its own; on MySQL through
         * the table kinbox_inbox_old_<start>). A crash between the steps
         * leaves that table, which finish() completes. *kept: rows
         * kept. Refused (KINBOX_ERR_STATE, db->err) unless r's end is
         * over ret_ms old by the database's clock, checked in the step
         * that detaches it, whatever the host's clock says. Metadata only
         * on both backends: MySQL swaps the range out (EXCHANGE) and
         * drops the empty partition; p_past is never folded in. */
        int (*drop)(kinbox__db_t *db, const kinbox__range_t *r,
                    int64_t width_s, int64_t ret_ms, uint64_t *kept);
        /* Complete the drops a crash interrupted. */
        int (*finish)(kinbox__db_t *db);
        /* Conversion of a plain kinbox_inbox into kinbox_inbox_conv:
         * mirror(on) makes every later insert (and delete) of
         * kinbox_inbox reach kinbox_inbox_conv, with the part_at and the
         * shadow row that the consumer would write (a row without msg_at,
         * or already keyed by the epoch's range: the epoch's range, no
         * shadow; copy() likewise); mirror(off) removes
         * it and kinbox_inbox_conv. */
        int (*mirror)(kinbox__db_t *db, bool on, int64_t width_s,
                      int64_t skew_s);
        /* Copy up to batch rows of kinbox_inbox after the key (consumer,
         * message_id) = (*c, *m) ("" "" first) into kinbox_inbox_conv;
         * moves *c, *m (malloc'ed, freed by the caller) to the last key
         * copied; *copied 0 when done. */
        int (*copy)(kinbox__db_t *db, int64_t width_s, int64_t skew_s,
                    int64_t batch, char **c, char **m, size_t *mlen,
                    uint64_t *copied);
        /* Atomically: kinbox_inbox becomes kinbox_inbox_plain (kept for
         * the operator), kinbox_inbox_conv becomes kinbox_inbox, the
         * mirror goes, and kinbox_partitioning records width and skew. */
        int (*swap)(kinbox__db_t *db, int64_t width_s, int64_t skew_s);
        /* After a conversion (idempotent): kinbox_partitioning's
         * legacy_until from the rows copied without msg_at (keyed by the
         * epoch's range): the latest one's processed_at + ret_ms, when
         * the catch-all's prune has deleted them all; NULL for none. */
        int (*legacy)(kinbox__db_t *db, int64_t ret_ms);
        /* One batched delete of catch-all rows processed over age_ms ago:
         * *n rows deleted. */
        int (*prune_catchall)(kinbox__db_t *db, int64_t age_ms, int64_t batch,
                              uint64_t *n);
};

extern const struct kinbox__part_ops kinbox__pg_part;
extern const struct kinbox__part_ops kinbox__mysql_part;

/* list() for both backends: sql ($1 table) returns each partition's
 * name, estimated rows and bytes; count_fmt (a printf format of the
 * table) counts the catch-all. */
int kinbox__ranges_read(kinbox__db_t *db, const char *sql, const char *table,
                        const char *count_fmt, kinbox__range_t **out,
                        size_t *n, int64_t *catchall_rows);

/* clock() for both backends: the number sql answers in its first row
 * (milliseconds since the epoch by the database's clock) in *now_ms, 0
 * when it answers none; the query's error. */
int kinbox__db_clock_ms(kinbox__db_t *db, const char *sql, int64_t *now_ms);

/* For both backends (db/inbox.c): */
/* Run sql (np parameters p) now; *yes = the first column of its first
 * row is true ("t", "1" or "true"; no row: false). The query's error. */
int kinbox__db_true(kinbox__db_t *db, const char *sql, int np,
                    const kinbox__param_t *p, bool *yes);
/* Run sql (np parameters p) now; *n = the number in the first column of
 * its first row (0: no row, NULL or negative). The query's error. */
int kinbox__db_count(kinbox__db_t *db, const char *sql, int np,
                     const kinbox__param_t *p, uint64_t *n);
/* A check the database decides: sql answers true (kinbox__db_true()), or
 * KINBOX_ERR_STATE with fmt's message in db->err; the query's error. */
int kinbox__db_must(kinbox__db_t *db, const char *sql, int np,
                    const kinbox__param_t *p, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* copy(): the key (consumer, message_id) in columns 0 and 1 of row of r
 * replaces *c, *m (freed), *mlen. KINBOX_ERR_NOMEM (or a NULL column):
 * *c, *m unchanged. */
int kinbox__copy_key(const struct kinbox_rows_s *r, size_t row, char **c,
                     char **m, size_t *mlen);

/* "'YYYY-MM-DD HH:MM:SS<zone>'" of s seconds (UTC): a bound literal. */
void kinbox__utc_quoted(char *out, size_t sz, const char *zone, int64_t s);

/* The name part of range start_s: YYYYMMDD, or YYYYMMDDHH when width_s
 * is under a day. out holds 16 bytes. */
void kinbox__range_label(char *out, int64_t start_s, int64_t width_s);
/* The start of the range a partition name ends in (its label after the
 * last 'p' or "p_"), or -1. */
int64_t kinbox__range_parse(const char *name);

/* ---- One backend's partition machinery, shared by the partitioned inbox
 * and the partitioned outbox (db/outbox_partition.h). */

/* db/pg_part.c: run the statements of v (NULL-terminated) in one
 * transaction. */
int kinbox__pg_part_tx(kinbox__db_t *db, const char *const *v);
/* db/pg_part.c: list() of the partitions of table named like (a LIKE
 * pattern, "_" escaped) then "_p" and a label; count_fmt, catchall_rows
 * as kinbox__ranges_read(). */
int kinbox__pg_part_list(kinbox__db_t *db, const char *like, const char *table,
                         const char *count_fmt, kinbox__range_t **out,
                         size_t *n, int64_t *catchall_rows);
/* A PostgreSQL range partitioning: the partitioned table, its partitions'
 * name prefix (prefix_p<label>; the catch-all is table_default), the
 * column ranged over and the column list a copy names (NULL: all). */
typedef struct kinbox__pg_range {
        const char *table, *prefix, *col, *cols;
} kinbox__pg_range_t;
/* db/pg_part.c: add the range [start_s, start_s + width_s) above every
 * other, made apart, the catch-all's rows of its span moved in, then
 * attached; one transaction with lock_timeout. */
int kinbox__pg_part_add(kinbox__db_t *db, const kinbox__pg_range_t *g,
                        int64_t start_s, int64_t width_s);
/* The drop of range r of parent: before and after (either NULL) are
 * checks run in the DETACH's transaction before and after it (arg is
 * theirs); keep answers the count of the rows it puts back. */
typedef struct kinbox__pg_detach {
        const char *parent;
        const kinbox__range_t *r;
        const char *keep;
        int (*before)(kinbox__db_t *db, const struct kinbox__pg_detach *x);
        int (*after)(kinbox__db_t *db, const struct kinbox__pg_detach *x);
        const void *arg;
} kinbox__pg_detach_t;
/* db/pg_part.c: in one transaction with lock_timeout: the checks, DETACH
 * and keep (*kept: its count); then DROP TABLE in a transaction of its
 * own (a crash in between leaves the table to
 * kinbox__pg_part_strays()). */
int kinbox__pg_part_detach(kinbox__db_t *db, const kinbox__pg_detach_t *x,
                           uint64_t *kept);
/* db/pg_part.c: drop every table of the schema whose name matches the
 * regular expression re and that is nobody's partition, one transaction
 * each. */
int kinbox__pg_part_strays(kinbox__db_t *db, const char *re);

/* db/mysql_part.c: list() of the partitions of table; count_fmt,
 * catchall_rows as kinbox__ranges_read(). */
int kinbox__my_part_list(kinbox__db_t *db, const char *table,
                         const char *count_fmt, kinbox__range_t **out,
                         size_t *n, int64_t *catchall_rows);
/* db/mysql_part.c: partition part of table swapped out (EXCHANGE with a
 * new empty table t, metadata only), then dropped (empty: metadata only);
 * each step commits. */
int kinbox__my_part_swap_drop(kinbox__db_t *db, const char *table,
                              const char *part, const char *t);
/* db/mysql_part.c: run sql (n parameters p), then ROW_COUNT(): *count,
 * the rows it changed. */
int kinbox__my_part_count(kinbox__db_t *db, const char *sql, int n,
                          const kinbox__param_t *p, uint64_t *count);

/* The rows of table x that a dead letter still 'dead' or a parked
 * message needs, found from the small side (their ids) through x's
 * primary key: "SELECT <x.cols>" KINBOX__PART_NEEDED("tbl"). Both
 * backends. */
#define KINBOX__PART_NEEDED(tbl)                                              \
        " FROM (SELECT consumer, message_id FROM kinbox_dead_letter WHERE"    \
        " status = 'dead' AND message_id IS NOT NULL UNION SELECT consumer,"  \
        " message_id FROM kinbox_parked) n JOIN " tbl " x ON x.consumer ="    \
        " n.consumer AND x.message_id = n.message_id"
#define KINBOX__INBOX_XCOLS                                                   \
        "x.consumer, x.message_id, x.topic, x.kafka_partition,"               \
        " x.kafka_offset, x.processed_at, x.msg_at, x.part_at, x.shadow"

/* The columns of an inbox row, in the order every copy uses. */
#define KINBOX__INBOX_COLS                                                    \
        "consumer, message_id, topic, kafka_partition, kafka_offset,"         \
        " processed_at, msg_at, part_at, shadow"

#endif
