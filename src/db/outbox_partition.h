/*
 * db/outbox_partition.h -- the partitioned outbox's statements per
 * backend (internal; outbox.layout = partitioned): struct
 * kinbox__opart_ops, filled by db/pg_outbox_partition.c and
 * db/mysql_outbox_partition.c, used by partition_outbox.c through
 * db->ops->opart. db.h includes it at its end; include db.h.
 *
 * The layout both backends share (docs/outbox.md, Write-only retention):
 * kinbox_outbox is partitioned by RANGE of created_at, one partition per
 * UTC day named kinbox_outbox_pYYYYMMDD (PostgreSQL; p_YYYYMMDD on
 * MySQL), plus catch-alls (PostgreSQL's DEFAULT partition
 * kinbox_outbox_default; MySQL's p_past below the lowest range and
 * p_future above the highest). The primary key is (id, created_at); a
 * partitioned table can have no unique index without created_at, so the
 * (destination, idem_key) key is kept by a BEFORE INSERT trigger that
 * serializes appends of one key (a transaction-scoped lock) and looks the
 * key up through the non-unique index kinbox_outbox_dest_idem: on
 * PostgreSQL it skips the row (the append's ON CONFLICT DO NOTHING
 * returns no id), on MySQL it gives the row the existing one's primary
 * key (the append's ON DUPLICATE KEY UPDATE then changes nothing).
 */
#ifndef KINBOX_DB_OUTBOX_PARTITION_H
#define KINBOX_DB_OUTBOX_PARTITION_H

#include "../db.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KINBOX__OUTBOX_DAY_S 86400

/* Whose progress a log-mode drop waits for: the slot (PostgreSQL) or the
 * binlog relay's name in kinbox_relay_position (MySQL). NULL members and
 * a NULL pointer: relay.source = poll. */
typedef struct kinbox__opart_relay {
        const char *slot;
        const char *binlog_name;
} kinbox__opart_relay_t;

/*
 * Every call runs on db's connection outside any transaction and returns
 * as kinbox__db_ops calls do.
 */
struct kinbox__opart_ops {
        /* *partitioned: kinbox_outbox is the partitioned table. */
        int (*layout)(kinbox__db_t *db, bool *partitioned);
        /* The day ranges of kinbox_outbox, ascending (*out malloc'ed). */
        int (*list)(kinbox__db_t *db, kinbox__range_t **out, size_t *n);
        /* Replace the plain kinbox_outbox by a partitioned one with the
         * ranges [first_s, end_s) (days), copying every row (older ones
         * into the catch-all), in one go: writers wait for the copy (the
         * conversion's limits: docs/outbox.md). *rows: rows copied. */
        int (*convert)(kinbox__db_t *db, int64_t first_s, int64_t end_s,
                       uint64_t *rows);
        /* Add the day starting at start_s above every range. */
        int (*add)(kinbox__db_t *db, int64_t start_s);
        /* Record (the database's now, the log's position now) in
         * kinbox_outbox_marks, and forget marks over two days old. */
        int (*mark)(kinbox__db_t *db);
        /* Drop range r (one DROP of its partition), keeping its dead rows
         * (and, on MySQL, rows made pending again after the checks:
         * with relay only action rows) in the
         * catch-all or the next range up. Refused, KINBOX_ERR_STATE with
         * the reason in db->err, unless, decided by the database in the
         * step that detaches it: r's end is over ret_ms old by its
         * clock; r holds no pending row (relay NULL: any; otherwise
         * action rows only); and with relay, the relay's confirmed
         * position is past a mark taken at or after r's end. *kept: rows
         * kept. */
        int (*drop)(kinbox__db_t *db, const kinbox__range_t *r, int64_t ret_ms,
                    const kinbox__opart_relay_t *relay, uint64_t *kept);
        /* drop()'s checks alone, changing nothing (kinbox prune
         * --dry-run): KINBOX_OK when drop() would drop r now, else as
         * drop() refuses. */
        int (*check)(kinbox__db_t *db, const kinbox__range_t *r,
                     int64_t ret_ms, const kinbox__opart_relay_t *relay);
        /* Complete the drops a crash interrupted (relay as for drop()). */
        int (*finish)(kinbox__db_t *db, const kinbox__opart_relay_t *relay);
        /* One batched delete of catch-all rows past the retention (the
         * heap layout's rules: sent rows by sent_at; with log, event rows
         * but dead ones by created_at): *n rows. */
        int (*prune_catchall)(kinbox__db_t *db, int64_t age_ms, bool log,
                              int64_t batch, uint64_t *n);
};

/* A drop's refusal (db->err): the range's name, why. */
#define KINBOX__OPART_REFUSED "outbox range %s %s: kept"

/* db/outbox_partition.c: the checks of drop() both backends make, in
 * its step that detaches r: old (a query of no parameter) answers true,
 * r's end is over the retention old by the database's clock; from (r's
 * rows: a FROM clause) holds no pending row (log: no pending action
 * row). KINBOX_ERR_STATE with the reason in db->err. */
int kinbox__opart_checks(kinbox__db_t *db, const kinbox__range_t *r,
                         const char *old, const char *from, bool log);

extern const struct kinbox__opart_ops kinbox__pg_opart;
extern const struct kinbox__opart_ops kinbox__mysql_opart;

#endif
