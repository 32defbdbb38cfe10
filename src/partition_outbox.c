/*
 * partition_outbox.c -- write-only retention for the outbox
 * (outbox.layout = partitioned): kinbox migrate makes the partitioned
 * outbox (converting a plain one); the pruner keeps days created ahead
 * and drops whole days past outbox.retention with one DROP each, reusing
 * the partitioned inbox's helpers (partition.c, db/part_ops.h). The
 * statements are the backend's (db/outbox_partition.h).
 *
 * When a day may go, decided by the database (never by this host's
 * clock), in the step that detaches it:
 *  - its whole span is older than outbox.retention by the database's now;
 *  - relay.source = poll: no row of it is pending (claimed or not): the
 *    polling relay has published or dead-lettered every one;
 *  - relay.source = wal | binlog: no action row of it is pending (actions
 *    are polled in every mode), and the relay's confirmed position (the
 *    slot's confirmed_flush_lsn, the binlog relay's stored GTID) is past
 *    a mark the pruner took after the day ended (kinbox_outbox_marks:
 *    where the log stood at the database's time): every transaction of
 *    the day that committed before the mark is confirmed, i.e. sent.
 * A day refused stays (logged, counted: op = keep) and is tried again at
 * the next run. Dead rows are kept (the log-mode prune's rule): they move
 * to the catch-all, where the batched prune never deletes them.
 */
#include "partition_outbox.h"
#include "db.h"
#include "db/mysql_binlog.h"
#include "internal.h"
#include "metrics.h"
#include "settings.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Days created ahead of the database's now. */
#define AHEAD_DAYS 2
#define DAY KINBOX__OUTBOX_DAY_S

static void
count(const char *op, double v)
{
        char lab[64];
        kinbox__m_add(
            "kinbox_outbox_partition_changes_total",
            kinbox__m_labels(lab, sizeof(lab), "op", op, (char *)NULL), v);
}

static int64_t
day_of(int64_t ms)
{
        int64_t s = ms / 1000;
        return s - s % DAY;
}

/* Days past the retention, oldest first; a refused one is kept and the
 * run goes on with the next. */
static int
drop_old(kinbox__db_t *db, const kinbox__log_t *lg, const kinbox__range_t *r,
         size_t n, int64_t now, int64_t ret_ms,
         const kinbox__opart_relay_t *relay, const volatile int *stop,
         kinbox_prune_result_t *res)
{
        for (size_t i = 0;
             i < n && (r[i].start_s + DAY) * 1000 <= now - ret_ms; i++) {
                if (stop && *stop)
                        break;
                uint64_t kept = 0;
                int rc = db->ops->opart->drop(db, &r[i], ret_ms, relay, &kept);
                if (rc == KINBOX_ERR_STATE) {
                        count("keep", 1);
                        kinbox__log(lg, KINBOX_LOG_NOTICE, "prune", "%s",
                                    db->err.msg);
                        continue;
                }
                if (rc)
                        return rc;
                count("drop", 1);
                res->outbox_rows += r[i].rows > 0 ? (uint64_t)r[i].rows : 0;
                kinbox__log(lg, KINBOX_LOG_NOTICE, "prune",
                            "dropped outbox partition %s (about %" PRId64
                            " rows; %" PRIu64 " dead rows kept)",
                            r[i].name, r[i].rows > 0 ? r[i].rows : 0, kept);
        }
        return KINBOX_OK;
}

/* Days from the highest one's end (or today) to now + AHEAD_DAYS. */
static int
create_ahead(kinbox__db_t *db, const kinbox__range_t *r, size_t n, int64_t now)
{
        int64_t next = n ? r[n - 1].start_s + DAY : day_of(now);
        int rc = KINBOX_OK;
        for (; !rc && next * 1000 < now + AHEAD_DAYS * DAY * 1000LL;
             next += DAY)
                if (!(rc = db->ops->opart->add(db, next)))
                        count("create", 1);
        return rc;
}

static int
prune_catchall(kinbox__db_t *db, const kinbox__settings_t *s, bool log,
               const volatile int *stop, uint64_t *total)
{
        char lab[64];
        kinbox__m_labels(lab, sizeof(lab), "table", "outbox", (char *)NULL);
        for (;;) {
                uint64_t n = 0;
                int rc = db->ops->opart->prune_catchall(
                    db, s->outbox_retention, log, s->prune_batch, &n);
                if (rc)
                        return rc;
                *total += n;
                kinbox__m_add("kinbox_pruned_rows_total", lab, (double)n);
                if (n < (uint64_t)s->prune_batch || (stop && *stop))
                        return KINBOX_OK;
                kinbox__sleep_ms(20);
        }
}

static int
ranges_gauge(kinbox__db_t *db)
{
        kinbox__range_t *r = NULL;
        size_t n = 0;
        int rc = db->ops->opart->list(db, &r, &n);
        if (!rc)
                kinbox__m_set("kinbox_outbox_partitions", "", (double)n);
        free(r);
        return rc;
}

/* kinbox prune --dry-run: the days past the retention that drop_old()
 * would drop (logged with their rows, as the catalog estimates them) and
 * those the database refuses yet (drop()'s own checks, logged), changing
 * nothing: no mark is taken (a day waiting for the log relay's next mark
 * shows as kept), no interrupted drop completed. */
static int
dry_days(kinbox__db_t *db, const kinbox__log_t *lg, int64_t ret_ms,
         const kinbox__opart_relay_t *relay, const volatile int *stop)
{
        kinbox__range_t *r = NULL;
        size_t n = 0;
        int64_t now = 0;
        int rc = db->ops->part->clock(db, &now);
        if (!rc)
                rc = db->ops->opart->list(db, &r, &n);
        for (size_t i = 0;
             !rc && i < n && (r[i].start_s + DAY) * 1000 <= now - ret_ms &&
             !(stop && *stop);
             i++) {
                rc = db->ops->opart->check(db, &r[i], ret_ms, relay);
                if (rc == KINBOX_ERR_STATE)
                        kinbox__log(lg, KINBOX_LOG_NOTICE, "prune",
                                    "%s (dry run)", db->err.msg);
                else if (!rc)
                        kinbox__log(lg, KINBOX_LOG_NOTICE, "prune",
                                    "would drop outbox partition %s (about "
                                    "%" PRId64 " rows; dry run)",
                                    r[i].name, r[i].rows > 0 ? r[i].rows : 0);
                if (rc == KINBOX_ERR_STATE)
                        rc = KINBOX_OK;
        }
        free(r);
        return rc;
}

int
kinbox__outbox_partition_prune(kinbox__db_t *db, const kinbox_conf_t *conf,
                               const kinbox__log_t *lg, bool dry,
                               const volatile int *stop,
                               kinbox_prune_result_t *res, bool *partitioned)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        const struct kinbox__opart_ops *po = db->ops->opart;
        int rc = po->layout(db, partitioned);
        if (rc || !*partitioned)
                return rc;
        bool log = s->relay_source != KINBOX__SOURCE_POLL;
        char *slot = log ? kinbox__wal_slot_name(conf) : NULL;
        kinbox__opart_relay_t relay = {slot,
                                       log ? kinbox__binlog_name(conf) : NULL};
        if (dry) {
                rc = dry_days(db, lg, s->outbox_retention, log ? &relay : NULL,
                              stop);
                free(slot);
                return rc;
        }
        kinbox__range_t *r = NULL;
        size_t n = 0;
        int64_t now = 0;
        if (!(rc = po->finish(db, log ? &relay : NULL)) && log)
                rc = po->mark(db);
        if (!rc)
                rc = db->ops->part->clock(db, &now);
        if (!rc)
                rc = po->list(db, &r, &n);
        if (!rc)
                rc = drop_old(db, lg, r, n, now, s->outbox_retention,
                              log ? &relay : NULL, stop, res);
        if (!rc)
                rc = create_ahead(db, r, n, now);
        if (!rc)
                rc = prune_catchall(db, s, log, stop, &res->outbox_rows);
        free(r);
        free(slot);
        return rc ? rc : ranges_gauge(db);
}

int
kinbox__outbox_partition_apply(kinbox__db_t *db, const kinbox__settings_t *s,
                               bool dry, char *note, size_t note_sz,
                               char *errstr, size_t sz)
{
        *note = '\0';
        if (s->outbox_layout != KINBOX__LAYOUT_PARTITIONED)
                return KINBOX_OK;
        bool parted = false;
        int rc = db->ops->opart->layout(db, &parted);
        if (rc || parted || dry) {
                if (!rc && !parted)
                        snprintf(note, note_sz, "partition kinbox_outbox");
                return dry ? KINBOX_OK : rc;
        }
        int64_t now = 0;
        uint64_t rows = 0;
        bool locked = false;
        /* The pruner's run is short: wait for it (60 s) rather than fail. */
        if (!(rc = db->ops->part->clock(db, &now)) &&
            !(rc = kinbox__prune_lock(db, 600, &locked)))
                rc = locked ? db->ops->opart->convert(
                                  db, day_of(now - s->outbox_retention),
                                  day_of(now) + (AHEAD_DAYS + 1) * DAY, &rows)
                            : KINBOX_ERR_STATE;
        if (locked)
                kinbox__prune_unlock(db);
        if (rc) {
                kinbox__errstr(errstr, sz, "partitioning kinbox_outbox: %s",
                               rc == KINBOX_ERR_STATE ? "the pruner's lock "
                                                        "stayed taken"
                                                      : db->err.msg);
                return rc;
        }
        snprintf(note, note_sz,
                 "partition kinbox_outbox (%" PRIu64 " rows copied)", rows);
        return KINBOX_OK;
}
