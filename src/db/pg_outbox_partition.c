/*
 * db/pg_outbox_partition.c -- the partitioned outbox on PostgreSQL
 * (db/outbox_partition.h): declarative RANGE partitions of created_at,
 * one per UTC day, a DEFAULT partition as the catch-all, the publication
 * published through the root (publish_via_partition_root: the log relay
 * sees kinbox_outbox, never a partition's name).
 *
 * A day is added, detached and dropped by the inbox's machinery
 * (db/pg_part.c, kinbox__pg_part_*): its DDL transactions set
 * lock_timeout, as a waiting lock request queues the writers' appends
 * behind it.
 */
#include "../db.h"
#include "../internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A drop's checks' arguments. */
typedef struct pg_drop {
        int64_t ret_ms;
        const kinbox__opart_relay_t *relay;
} pg_drop_t;

/* The key check of a partitioned outbox: appends of one key wait for each
 * other (a transaction-scoped advisory lock on the key's hash), then the
 * row is skipped when the key is there, as ON CONFLICT DO NOTHING did. */
static const char idem_fn[] =
    "CREATE OR REPLACE FUNCTION kinbox_outbox_idem() RETURNS trigger "
    "LANGUAGE plpgsql AS $f$ BEGIN PERFORM pg_advisory_xact_lock("
    "1262633057, hashtext(NEW.destination || E'\\n' || NEW.idem_key)); "
    "IF EXISTS (SELECT 1 FROM kinbox_outbox WHERE destination = "
    "NEW.destination AND idem_key = NEW.idem_key) THEN RETURN NULL; END "
    "IF; RETURN NEW; END $f$";

static int
pg_layout(kinbox__db_t *db, bool *partitioned)
{
        return kinbox__db_exists(db,
                                 "SELECT 1 FROM pg_class WHERE oid = "
                                 "to_regclass('kinbox_outbox') AND relkind "
                                 "= 'p'",
                                 partitioned);
}

static int
pg_list(kinbox__db_t *db, kinbox__range_t **out, size_t *n)
{
        return kinbox__pg_part_list(db, "kinbox\\_outbox", "kinbox_outbox",
                                    NULL, out, n, NULL);
}

/* "CREATE TABLE kinbox_outbox_pDAY PARTITION OF table ..." */
static void
range_sql(char *out, size_t sz, const char *table, int64_t start_s)
{
        char lab[16], from[48], to[48];
        kinbox__range_label(lab, start_s, KINBOX__OUTBOX_DAY_S);
        kinbox__utc_quoted(from, sizeof(from), "+00", start_s);
        kinbox__utc_quoted(to, sizeof(to), "+00",
                           start_s + KINBOX__OUTBOX_DAY_S);
        snprintf(out, sz,
                 "CREATE TABLE kinbox_outbox_p%s PARTITION OF %s FOR VALUES "
                 "FROM (%s) TO (%s)",
                 lab, table, from, to);
}

/* Run every row's first column of sql (the plain table's other indexes
 * and triggers, as their definitions). */
static int
run_defs(kinbox__db_t *db, const char *sql)
{
        struct kinbox_rows_s *r = NULL;
        int rc = db->ops->query(db, sql, 0, NULL, -1, &r);
        for (size_t i = 0; !rc && i < r->nrows; i++)
                rc = db->ops->query(db, r->values[i * (size_t)r->ncols], 0,
                                    NULL, -1, NULL);
        kinbox_rows_destroy(r);
        return rc;
}

static const char *const conv_pre[] = {
    "SET LOCAL lock_timeout = '10s'",
    "LOCK TABLE kinbox_outbox IN ACCESS EXCLUSIVE MODE",
    "CREATE TEMP TABLE kinbox_outbox_defs ON COMMIT DROP AS SELECT "
    "pg_get_indexdef(i.indexrelid) AS def FROM pg_index i WHERE i.indrelid = "
    "'kinbox_outbox'::regclass AND NOT i.indisunique UNION ALL SELECT "
    "pg_get_triggerdef(t.oid) FROM pg_trigger t WHERE t.tgrelid = "
    "'kinbox_outbox'::regclass AND NOT t.tgisinternal",
    "CREATE TABLE kinbox_outbox_conv (LIKE kinbox_outbox INCLUDING DEFAULTS "
    "INCLUDING CONSTRAINTS INCLUDING IDENTITY, PRIMARY KEY (id, created_at)) "
    "PARTITION BY RANGE (created_at)",
    "CREATE TABLE kinbox_outbox_default PARTITION OF kinbox_outbox_conv "
    "DEFAULT",
    NULL};

static const char *const conv_post[] = {
    "INSERT INTO kinbox_outbox_conv OVERRIDING SYSTEM VALUE SELECT * FROM "
    "kinbox_outbox",
    "SELECT setval(pg_get_serial_sequence('kinbox_outbox_conv', 'id'), "
    "greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence("
    "'kinbox_outbox', 'id')::regclass), 0), (SELECT coalesce(max(id), 0) "
    "FROM kinbox_outbox), 1))",
    "DROP TABLE kinbox_outbox",
    "ALTER TABLE kinbox_outbox_conv RENAME TO kinbox_outbox",
    "ALTER INDEX kinbox_outbox_conv_pkey RENAME TO kinbox_outbox_pkey",
    "ALTER SEQUENCE kinbox_outbox_conv_id_seq RENAME TO kinbox_outbox_id_seq",
    NULL};

static const char *const conv_end[] = {
    "CREATE INDEX kinbox_outbox_dest_idem ON kinbox_outbox (destination, "
    "idem_key)",
    idem_fn,
    "CREATE TRIGGER kinbox_outbox_idem BEFORE INSERT ON kinbox_outbox FOR "
    "EACH ROW EXECUTE FUNCTION kinbox_outbox_idem()",
    /* DROP TABLE took it out of the publication: back, through the root. */
    "DO $d$ BEGIN IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = "
    "'kinbox_outbox_pub') THEN ALTER PUBLICATION kinbox_outbox_pub ADD "
    "TABLE kinbox_outbox; ALTER PUBLICATION kinbox_outbox_pub SET (publish "
    "= 'insert', publish_via_partition_root = true); END IF; END $d$",
    NULL};

static int
run_list(kinbox__db_t *db, const char *const *v)
{
        int rc = KINBOX_OK;
        for (size_t i = 0; !rc && v[i]; i++)
                rc = db->ops->query(db, v[i], 0, NULL, -1, NULL);
        return rc;
}

static int
pg_convert(kinbox__db_t *db, int64_t first_s, int64_t end_s, uint64_t *rows)
{
        struct kinbox_rows_s *n = NULL;
        int rc = db->ops->begin(db);
        if (!rc)
                rc = run_list(db, conv_pre);
        for (int64_t at = first_s; !rc && at < end_s;
             at += KINBOX__OUTBOX_DAY_S) {
                char sql[300];
                range_sql(sql, sizeof(sql), "kinbox_outbox_conv", at);
                rc = db->ops->query(db, sql, 0, NULL, -1, NULL);
        }
        if (!rc)
                rc = db->ops->query(db, "SELECT count(*) FROM kinbox_outbox",
                                    0, NULL, -1, &n);
        if (!rc)
                rc = run_list(db, conv_post);
        if (!rc)
                rc = run_defs(db, "SELECT def FROM kinbox_outbox_defs");
        if (!rc)
                rc = run_list(db, conv_end);
        rc = kinbox__db_end(db, rc);
        *rows = !rc && n && n->nrows ? strtoull(n->values[0], NULL, 10) : 0;
        kinbox_rows_destroy(n);
        return rc;
}

static int
pg_add(kinbox__db_t *db, int64_t start_s)
{
        const kinbox__pg_range_t g = {"kinbox_outbox", "kinbox_outbox",
                                      "created_at", NULL};
        return kinbox__pg_part_add(db, &g, start_s, KINBOX__OUTBOX_DAY_S);
}

static int
pg_mark(kinbox__db_t *db)
{
        const char *v[] = {
            "INSERT INTO kinbox_outbox_marks (at, pos) VALUES (now(), "
            "pg_current_wal_lsn()::text) ON CONFLICT DO NOTHING",
            "DELETE FROM kinbox_outbox_marks WHERE at < now() - interval "
            "'2 days'",
            NULL};
        return kinbox__pg_part_tx(db, v);
}

/* The checks, in the DETACH's transaction after it (the range is out of
 * reach of every writer and relay once detached); x->arg: pg_drop_t. */
static int
drop_checks(kinbox__db_t *db, const kinbox__pg_detach_t *x)
{
        const kinbox__range_t *r = x->r;
        const pg_drop_t *a = x->arg;
        int64_t end = r->start_s + KINBOX__OUTBOX_DAY_S;
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "SELECT to_timestamp(%" PRId64 ") <= now() - %" PRId64
                 " * interval '1 millisecond'",
                 end, a->ret_ms);
        bool poll = !a->relay || !a->relay->slot;
        int rc = kinbox__opart_checks(db, r, sql, r->name, !poll);
        if (rc || poll)
                return rc;
        snprintf(sql, sizeof(sql),
                 "SELECT EXISTS (SELECT 1 FROM kinbox_outbox_marks m, "
                 "pg_replication_slots s WHERE s.slot_name = $1 AND m.at >= "
                 "to_timestamp(%" PRId64 ") AND s.confirmed_flush_lsn >= "
                 "m.pos::pg_lsn)",
                 end);
        kinbox__param_t p = {a->relay->slot, 0, 0};
        return kinbox__db_must(
            db, sql, 1, &p, KINBOX__OPART_REFUSED, r->name,
            "is not behind the log relay's confirmed position yet");
}

static int
pg_drop(kinbox__db_t *db, const kinbox__range_t *r, int64_t ret_ms,
        const kinbox__opart_relay_t *relay, uint64_t *kept)
{
        /* Detached, its span is the catch-all's: dead rows land there. */
        char k[300];
        snprintf(k, sizeof(k),
                 "WITH i AS (INSERT INTO kinbox_outbox SELECT * FROM %s WHERE "
                 "status = 'dead' RETURNING 1) SELECT count(*) FROM i",
                 r->name);
        const pg_drop_t a = {ret_ms, relay};
        const kinbox__pg_detach_t x = {"kinbox_outbox", r, k, NULL,
                                       drop_checks,     &a};
        return kinbox__pg_part_detach(db, &x, kept);
}

/* drop_checks() alone, on the attached range (kinbox prune --dry-run). */
static int
pg_check(kinbox__db_t *db, const kinbox__range_t *r, int64_t ret_ms,
         const kinbox__opart_relay_t *relay)
{
        const pg_drop_t a = {ret_ms, relay};
        const kinbox__pg_detach_t x = {"kinbox_outbox", r, NULL, NULL,
                                       drop_checks,     &a};
        return drop_checks(db, &x);
}

static int
pg_finish(kinbox__db_t *db, const kinbox__opart_relay_t *relay)
{
        (void)relay; /* the checks ran in the DETACH's transaction */
        return kinbox__pg_part_strays(db, "^kinbox_outbox_p[0-9]{8}$");
}

static int
pg_prune_catchall(kinbox__db_t *db, int64_t age_ms, bool log, int64_t batch,
                  uint64_t *n)
{
        char sql[600];
        snprintf(sql, sizeof(sql),
                 "WITH d AS (DELETE FROM kinbox_outbox_default WHERE ctid IN "
                 "(SELECT ctid FROM kinbox_outbox_default WHERE (status = "
                 "'sent' AND sent_at < now() - %" PRId64
                 " * interval '1 millisecond') OR (%s AND kind = 'event' AND "
                 "status <> 'dead' AND created_at < now() - %" PRId64
                 " * interval '1 millisecond') LIMIT %" PRId64
                 ") RETURNING 1) SELECT count(*) FROM d",
                 age_ms, log ? "true" : "false", age_ms, batch);
        return kinbox__db_count(db, sql, 0, NULL, n);
}

const struct kinbox__opart_ops kinbox__pg_opart = {
    .layout = pg_layout,
    .list = pg_list,
    .convert = pg_convert,
    .add = pg_add,
    .mark = pg_mark,
    .drop = pg_drop,
    .check = pg_check,
    .finish = pg_finish,
    .prune_catchall = pg_prune_catchall,
};
