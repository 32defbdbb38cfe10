/*
 * partition.c -- the life of a partitioned inbox (inbox.layout =
 * partitioned): kinbox migrate makes it, converting a plain inbox online;
 * the pruner keeps ranges created ahead, drops ranges past the retention
 * and prunes the catch-all; consumers refuse a configuration that expects
 * partitions the database does not have. The statements are the
 * backend's (db/part_ops.h); which rows a message writes is db/inbox.c.
 *
 * Why whole ranges: a DELETE of a day's rows costs as much as the day's
 * traffic (dead tuples and index bloat on PostgreSQL, purge and undo on
 * MySQL); dropping a partition costs the same at ten rows or a hundred
 * million. The ranges are of message time, so every copy of a message
 * finds its row (db/inbox.c); a range is dropped only when its whole span
 * is older than inbox.retention, which kinbox_retention_check() holds
 * above the broker's redelivery window.
 */
#include "partition.h"
#include "db.h"
#include "internal.h"
#include "metrics.h"
#include "settings.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRUNE_LOCK "kinbox_prune"
#define COPY_BATCH 5000
/* A host clock this far from the database's is logged (docs/operations.md,
 * Daily partitions). */
#define CLOCK_SKEW_WARN_S 60.0
/* Partitions of kinbox_inbox, catch-alls included: MariaDB's and MySQL's
 * hard limit; PostgreSQL is held to it too (planning and locking cost
 * grow with the partitions). */
#define MAX_PARTITIONS 8192

static void
count(const char *family, const char *op, double v)
{
        char lab[64];
        kinbox__m_add(
            family, kinbox__m_labels(lab, sizeof(lab), "op", op, (char *)NULL),
            v);
}

/* The layout the database records, now. */
static int
layout(kinbox__db_t *db, const kinbox__settings_t *s)
{
        return kinbox__inbox_layout_load(db, s->inbox_partition_width, true);
}

/* The range partitions the settings keep: the retention and the ranges
 * ahead, plus the two a span starts and ends inside. */
static int64_t
ranges_needed(const kinbox__settings_t *s)
{
        int64_t w = s->inbox_partition_width;
        return (s->inbox_retention + s->inbox_partition_ahead + w - 1) / w + 2;
}

/* ms as "400d", "36h" or "90s" (the largest whole unit). */
static const char *
span(char *out, size_t sz, int64_t ms)
{
        int64_t s = ms / 1000;
        if (s && s % 86400 == 0)
                snprintf(out, sz, "%" PRId64 "d", s / 86400);
        else if (s && s % 3600 == 0)
                snprintf(out, sz, "%" PRId64 "h", s / 3600);
        else
                snprintf(out, sz, "%" PRId64 "s", s);
        return out;
}

static int
check_count(const kinbox__settings_t *s, char *errstr, size_t sz)
{
        int64_t n = ranges_needed(s);
        if (n + 2 <= MAX_PARTITIONS)
                return KINBOX_OK;
        char r[24], a[24], w[24];
        kinbox__errstr(errstr, sz,
                       "inbox.retention (%s) and inbox.partition.ahead (%s) "
                       "in ranges of inbox.partition.width (%s) need %" PRId64
                       " partitions with the catch-alls; at most %d are "
                       "allowed (MariaDB's limit, kept on PostgreSQL too): "
                       "widen the ranges or shorten the retention",
                       span(r, sizeof(r), s->inbox_retention),
                       span(a, sizeof(a), s->inbox_partition_ahead),
                       span(w, sizeof(w), s->inbox_partition_width), n + 2,
                       MAX_PARTITIONS);
        return KINBOX_ERR_CONFIG;
}

int
kinbox__partition_check(kinbox__db_t *db, const kinbox__settings_t *s,
                        char *errstr, size_t sz)
{
        if (s->inbox_layout == KINBOX__LAYOUT_PARTITIONED &&
            check_count(s, errstr, sz))
                return KINBOX_ERR_CONFIG;
        int rc = layout(db, s);
        if (rc) {
                kinbox__errstr(errstr, sz, "reading the inbox layout: %s",
                               db->err.msg);
                return rc;
        }
        if (s->inbox_layout == KINBOX__LAYOUT_PARTITIONED &&
            !db->inbox_partitioned) {
                kinbox__errstr(errstr, sz,
                               "inbox.layout = partitioned, but kinbox_inbox "
                               "is the plain table: run kinbox migrate to "
                               "convert it");
                return KINBOX_ERR_SCHEMA;
        }
        return KINBOX_OK;
}

static void
publish(const kinbox__db_t *db, const kinbox__range_t *r, size_t n,
        int64_t catchall, int64_t retention_ms)
{
        char lab[64], l[16];
        int64_t w = db->inbox_width_s;
        kinbox__m_drop("kinbox_inbox_partition_rows", "");
        kinbox__m_drop("kinbox_inbox_partition_bytes", "");
        kinbox__m_set("kinbox_inbox_partitions", "", (double)n);
        for (size_t i = 0; i < n; i++) {
                kinbox__range_label(l, r[i].start_s, w);
                kinbox__m_labels(lab, sizeof(lab), "partition", l,
                                 (char *)NULL);
                kinbox__m_set("kinbox_inbox_partition_rows", lab,
                              (double)(r[i].rows > 0 ? r[i].rows : 0));
                kinbox__m_set("kinbox_inbox_partition_bytes", lab,
                              (double)(r[i].bytes > 0 ? r[i].bytes : 0));
        }
        kinbox__m_set("kinbox_inbox_partition_rows",
                      kinbox__m_labels(lab, sizeof(lab), "partition",
                                       "catchall", (char *)NULL),
                      (double)(catchall > 0 ? catchall : 0));
        kinbox__m_set("kinbox_inbox_partition_covered_until_seconds", "",
                      n ? (double)(r[n - 1].start_s + w) : 0);
        kinbox__m_set("kinbox_inbox_partition_next_drop_seconds", "",
                      n ? (double)(r[0].start_s + w + retention_ms / 1000)
                        : 0);
}

/* The database's clock, now; the host's distance from it is a gauge and,
 * over CLOCK_SKEW_WARN_S, a warning (lg NULL: none). */
static int
db_now(kinbox__db_t *db, const kinbox__log_t *lg, int64_t *now)
{
        int64_t host0 = kinbox__wall_ms();
        int rc = db->ops->part->clock(db, now);
        if (rc)
                return rc;
        /* The round trip's middle, as the host saw it. */
        int64_t host = host0 + (kinbox__wall_ms() - host0) / 2;
        double skew = (double)(host - *now) / 1000.0;
        kinbox__m_set("kinbox_db_clock_skew_seconds", "", skew);
        if (lg && (skew > CLOCK_SKEW_WARN_S || skew < -CLOCK_SKEW_WARN_S))
                kinbox__log(lg, KINBOX_LOG_WARNING, "prune",
                            "this host's clock is %.0f s %s the database's: "
                            "inbox ranges follow the database's clock; fix "
                            "the host's (NTP)",
                            skew > 0 ? skew : -skew,
                            skew > 0 ? "ahead of" : "behind");
        return KINBOX_OK;
}

/* Ranges from the highest one's end (or now's range) to now + ahead. */
static int
create_ahead(kinbox__db_t *db, const char *table, const kinbox__range_t *r,
             size_t n, int64_t now, int64_t ahead_ms, uint64_t *created)
{
        int64_t w = db->inbox_width_s;
        int64_t next =
            n ? r[n - 1].start_s + w : kinbox__inbox_part_of(now, w);
        int rc = KINBOX_OK;
        for (; !rc && next * 1000 < now + ahead_ms; next += w) {
                rc = db->ops->part->add(db, table, next, w);
                if (rc) {
                        count("kinbox_inbox_partition_failures_total",
                              "create", 1);
                } else {
                        count("kinbox_inbox_partition_changes_total", "create",
                              1);
                        (*created)++;
                }
        }
        return rc;
}

/* Ranges whose whole span is older than the retention, oldest first. */
static int
drop_old(kinbox__db_t *db, const kinbox__log_t *lg, kinbox__range_t *r,
         size_t n, int64_t now, int64_t ret_ms, bool dry,
         const volatile int *stop, kinbox_prune_result_t *res)
{
        int64_t w = db->inbox_width_s;
        size_t i = 0;
        for (; i < n && (r[i].start_s + w) * 1000 <= now - ret_ms; i++) {
                if (stop && *stop)
                        break;
                uint64_t kept = 0;
                int rc =
                    dry ? KINBOX_OK
                        : db->ops->part->drop(db, &r[i], w, ret_ms, &kept);
                if (rc) {
                        count("kinbox_inbox_partition_failures_total", "drop",
                              1);
                        return rc;
                }
                res->partitions_dropped++;
                res->rows_kept += kept;
                res->inbox_rows += r[i].rows > 0 ? (uint64_t)r[i].rows : 0;
                if (dry) {
                        kinbox__log(lg, KINBOX_LOG_NOTICE, "prune",
                                    "would drop inbox partition %s (about "
                                    "%" PRId64 " rows; dry run)",
                                    r[i].name, r[i].rows > 0 ? r[i].rows : 0);
                        continue;
                }
                count("kinbox_inbox_partition_changes_total", "drop", 1);
                count("kinbox_inbox_partition_kept_rows_total", "drop",
                      (double)kept);
                kinbox__log(lg, KINBOX_LOG_NOTICE, "prune",
                            "dropped inbox partition %s (about %" PRId64
                            " rows; %" PRIu64 " kept for dead letters and "
                            "parked messages)",
                            r[i].name, r[i].rows > 0 ? r[i].rows : 0, kept);
        }
        return KINBOX_OK;
}

static int
prune_catchall(kinbox__db_t *db, int64_t ret_ms, int64_t batch,
               const volatile int *stop, uint64_t *total)
{
        char lab[64];
        kinbox__m_labels(lab, sizeof(lab), "table", "inbox", (char *)NULL);
        for (;;) {
                uint64_t n = 0;
                int rc = db->ops->part->prune_catchall(db, ret_ms, batch, &n);
                if (rc) {
                        count("kinbox_inbox_partition_failures_total", "prune",
                              1);
                        return rc;
                }
                *total += n;
                kinbox__m_add("kinbox_pruned_rows_total", lab, (double)n);
                if (n < (uint64_t)batch || (stop && *stop))
                        return KINBOX_OK;
                kinbox__sleep_ms(20);
        }
}

int
kinbox__partition_prune(kinbox__db_t *db, const kinbox__settings_t *s,
                        const kinbox__log_t *lg, bool dry,
                        const volatile int *stop, kinbox_prune_result_t *res,
                        bool *partitioned)
{
        int rc = layout(db, s);
        *partitioned = !rc && db->inbox_partitioned;
        if (rc || !*partitioned)
                return rc;
        const struct kinbox__part_ops *po = db->ops->part;
        if (!dry && po->finish && (rc = po->finish(db)))
                return rc;
        kinbox__range_t *r = NULL;
        size_t n = 0;
        int64_t catchall = 0;
        int64_t now = 0;
        if ((rc = db_now(db, lg, &now)) ||
            (rc = po->list(db, "kinbox_inbox", &r, &n, NULL)))
                return rc;
        rc = drop_old(db, lg, r, n, now, s->inbox_retention, dry, stop, res);
        if (!rc && !dry)
                rc = create_ahead(db, "kinbox_inbox", r, n, now,
                                  s->inbox_partition_ahead,
                                  &res->partitions_created);
        if (!rc && !dry)
                rc = prune_catchall(db, s->inbox_retention, s->prune_batch,
                                    stop, &res->inbox_rows);
        free(r);
        r = NULL;
        n = 0;
        /* After the run, for the gauges. */
        int lrc = po->list(db, "kinbox_inbox", &r, &n, &catchall);
        if (!lrc)
                publish(db, r, n, catchall, s->inbox_retention);
        free(r);
        return rc ? rc : lrc;
}

/* ------------------------------------------------------------------ */
/* kinbox migrate */

int
kinbox__prune_lock(kinbox__db_t *db, int tries, bool *locked)
{
        const char *name = PRUNE_LOCK;
        *locked = false;
        for (int i = 0; i < tries && !*locked; i++) {
                if (i)
                        kinbox__sleep_ms(100);
                struct kinbox_rows_s *rows = NULL;
                int rc = kinbox__db_queryv(db, db->ops->sql->try_lock, 1,
                                           &name, &rows);
                const char *v =
                    !rc && rows && rows->nrows ? rows->values[0] : NULL;
                *locked = v && (!strcmp(v, "t") || !strcmp(v, "1"));
                kinbox_rows_destroy(rows);
                if (rc)
                        return rc;
        }
        return KINBOX_OK;
}

void
kinbox__prune_unlock(kinbox__db_t *db)
{
        const char *name = PRUNE_LOCK;
        kinbox__db_queryv(db, db->ops->sql->unlock, 1, &name, NULL);
}

/* Copy every row of the plain inbox into kinbox_inbox_conv. */
static int
copy_all(kinbox__db_t *db, int64_t w, int64_t skew, uint64_t *rows)
{
        char *c = NULL, *m = NULL;
        size_t mlen = 0;
        uint64_t got = 0;
        int rc;
        *rows = 0;
        do {
                rc = db->ops->part->copy(db, w, skew, COPY_BATCH, &c, &m,
                                         &mlen, &got);
                *rows += got;
        } while (!rc && got);
        free(c);
        free(m);
        return rc;
}

static int
convert(kinbox__db_t *db, const kinbox__settings_t *s, uint64_t *rows,
        int64_t *swap_ms)
{
        const struct kinbox__part_ops *po = db->ops->part;
        int64_t w = s->inbox_partition_width / 1000;
        int64_t skew = s->inbox_partition_skew / 1000;
        int64_t now = 0;
        int rc = db_now(db, NULL, &now);
        if (rc)
                return rc;
        /* Ranges over the retention; older rows go to the catch-all. */
        int64_t first = kinbox__inbox_part_of(now - s->inbox_retention, w);
        rc = po->mirror(db, false, w, skew);
        if (!rc)
                rc = po->create(db, "kinbox_inbox_conv", first);
        for (int64_t at = first;
             !rc && at * 1000 < now + s->inbox_partition_ahead; at += w)
                rc = po->add(db, "kinbox_inbox_conv", at, w);
        if (!rc)
                rc = po->mirror(db, true, w, skew);
        if (!rc)
                rc = copy_all(db, w, skew, rows);
        int64_t t0 = kinbox__now_ms();
        if (!rc)
                rc = po->swap(db, w, skew);
        *swap_ms = kinbox__now_ms() - t0;
        if (!rc)
                rc = po->legacy(db, s->inbox_retention);
        if (rc) {
                int keep = rc;
                po->mirror(db, false, w, skew);
                rc = keep;
        }
        return rc;
}

static int
check_settings(const kinbox__settings_t *s, char *errstr, size_t sz)
{
        if (check_count(s, errstr, sz))
                return KINBOX_ERR_CONFIG;
        if (s->inbox_partition_skew * 2 >= s->inbox_partition_width) {
                kinbox__errstr(errstr, sz,
                               "inbox.partition.skew (%" PRId64 " s) must be "
                               "under half of inbox.partition.width "
                               "(%" PRId64 " s)",
                               s->inbox_partition_skew / 1000,
                               s->inbox_partition_width / 1000);
                return KINBOX_ERR_CONFIG;
        }
        return KINBOX_OK;
}

int
kinbox__partition_settings_check(const kinbox__settings_t *s, char *errstr,
                                 size_t sz)
{
        if (s->inbox_layout != KINBOX__LAYOUT_PARTITIONED)
                return KINBOX_OK;
        return check_settings(s, errstr, sz);
}

/* A partitioned inbox already: the width stays, the skew may change. */
static int
keep_partitioned(kinbox__db_t *db, const kinbox__settings_t *s, char *errstr,
                 size_t sz)
{
        int64_t w = s->inbox_partition_width / 1000;
        int64_t skew = s->inbox_partition_skew / 1000;
        if (w != db->inbox_width_s) {
                kinbox__errstr(errstr, sz,
                               "kinbox_inbox is partitioned by %" PRId64
                               " s ranges, inbox.partition.width says "
                               "%" PRId64 " s: the width of a partitioned "
                               "inbox cannot change",
                               db->inbox_width_s, w);
                return KINBOX_ERR_CONFIG;
        }
        /* A crash between a conversion's swap and its legacy_until. */
        int rc = db->ops->part->legacy(db, s->inbox_retention);
        if (rc || skew == db->inbox_skew_s)
                return rc;
        char v[24];
        snprintf(v, sizeof(v), "%" PRId64, skew);
        const char *p[1] = {v};
        return kinbox__db_queryv(db,
                                 "UPDATE kinbox_partitioning SET skew_s = $1 "
                                 "WHERE table_name = 'kinbox_inbox'",
                                 1, p, NULL);
}

/* kinbox_inbox has ranges but no record (a crash between MySQL's
 * RENAME and the record): record it. KINBOX_ERR_NOT_FOUND: not partitioned. */
static int
swapped(kinbox__db_t *db, const kinbox__settings_t *s, char *errstr, size_t sz)
{
        kinbox__range_t *r = NULL;
        size_t n = 0;
        int rc = db->ops->part->list(db, "kinbox_inbox", &r, &n, NULL);
        free(r);
        if (!rc && !n)
                return KINBOX_ERR_NOT_FOUND;
        char v[2][24];
        snprintf(v[0], sizeof(v[0]), "%" PRId64,
                 s->inbox_partition_width / 1000);
        snprintf(v[1], sizeof(v[1]), "%" PRId64,
                 s->inbox_partition_skew / 1000);
        const char *p[2] = {v[0], v[1]};
        if (!rc)
                rc = kinbox__db_queryv(db,
                                       "INSERT INTO kinbox_partitioning "
                                       "(table_name, width_s, skew_s) VALUES "
                                       "('kinbox_inbox', $1, $2)",
                                       2, p, NULL);
        if (!rc)
                rc = db->ops->part->legacy(db, s->inbox_retention);
        if (rc)
                kinbox__errstr(errstr, sz, "partitioning kinbox_inbox: %s",
                               db->err.msg);
        return rc ? rc : layout(db, s);
}

int
kinbox__partition_apply(kinbox__db_t *db, const kinbox__settings_t *s,
                        bool dry, char *note, size_t note_sz, char *errstr,
                        size_t sz)
{
        *note = '\0';
        if (s->inbox_layout != KINBOX__LAYOUT_PARTITIONED)
                return KINBOX_OK;
        int rc = check_settings(s, errstr, sz);
        if (!rc && (rc = layout(db, s)) && dry) {
                /* No schema yet: the scripts would make it plain. */
                snprintf(note, note_sz, "partition kinbox_inbox");
                return KINBOX_OK;
        }
        if (rc && rc != KINBOX_ERR_CONFIG)
                kinbox__errstr(errstr, sz, "reading the inbox layout: %s",
                               db->err.msg);
        if (rc)
                return rc;
        if (db->inbox_partitioned) {
                if (dry)
                        return KINBOX_OK;
                return keep_partitioned(db, s, errstr, sz);
        }
        if (dry) {
                snprintf(note, note_sz, "partition kinbox_inbox");
                return KINBOX_OK;
        }
        if ((rc = swapped(db, s, errstr, sz)) != KINBOX_ERR_NOT_FOUND)
                return rc;
        bool locked = false;
        uint64_t rows = 0;
        int64_t swap_ms = 0;
        /* The pruner's run is short: wait for it (60 s) rather than fail. */
        if (!(rc = kinbox__prune_lock(db, 600, &locked)))
                rc = locked ? convert(db, s, &rows, &swap_ms)
                            : KINBOX_ERR_STATE;
        if (locked)
                kinbox__prune_unlock(db);
        if (rc) {
                kinbox__errstr(errstr, sz, "partitioning kinbox_inbox: %s",
                               rc == KINBOX_ERR_STATE ? "the pruner's lock "
                                                        "stayed taken"
                                                      : db->err.msg);
                return rc;
        }
        /* An empty plain table is of no use to anyone. */
        if (!rows && !kinbox__db_queryv(db, "DROP TABLE kinbox_inbox_plain", 0,
                                        NULL, NULL))
                snprintf(note, note_sz, "partition kinbox_inbox");
        else
                snprintf(note, note_sz,
                         "partition kinbox_inbox (%" PRIu64 " rows copied "
                         "online; the swap held writers %" PRId64 " ms; the "
                         "plain table is kept as kinbox_inbox_plain)",
                         rows, swap_ms);
        return layout(db, s);
}
