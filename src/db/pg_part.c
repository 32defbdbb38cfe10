/*
 * db/pg_part.c -- the partitioned inbox on PostgreSQL (db/part_ops.h):
 * declarative RANGE partitions of part_at, a DEFAULT partition as the
 * catch-all, and the online conversion of a plain inbox (a row trigger
 * mirrors new rows while batches copy the old ones; one short ACCESS
 * EXCLUSIVE transaction renames).
 *
 * Every DDL transaction sets lock_timeout: ATTACH needs SHARE UPDATE
 * EXCLUSIVE on the parent, DETACH and the rename ACCESS EXCLUSIVE, and a
 * waiting lock request queues the consumers' inserts behind it. Consumer
 * transactions last milliseconds; a request that cannot be granted in 5 s
 * gives up and the pruner tries again at its next run.
 */
#include "../db.h"
#include "../internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOCK_WAIT "SET LOCAL lock_timeout = '5s'"

int
kinbox__pg_part_tx(kinbox__db_t *db, const char *const *v)
{
        int rc = db->ops->begin(db);
        for (size_t i = 0; !rc && v[i]; i++)
                rc = db->ops->query(db, v[i], 0, NULL, -1, NULL);
        return kinbox__db_end(db, rc);
}

int
kinbox__pg_part_list(kinbox__db_t *db, const char *like, const char *table,
                     const char *count_fmt, kinbox__range_t **out, size_t *n,
                     int64_t *catchall_rows)
{
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "SELECT c.relname, c.reltuples::bigint, "
                 "pg_total_relation_size(c.oid) FROM pg_inherits i JOIN "
                 "pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = "
                 "to_regclass($1) AND c.relname LIKE '%s\\_p%%' ORDER BY "
                 "c.relname",
                 like);
        return kinbox__ranges_read(db, sql, table, count_fmt, out, n,
                                   catchall_rows);
}

static int
pg_list(kinbox__db_t *db, const char *table, kinbox__range_t **out, size_t *n,
        int64_t *catchall_rows)
{
        return kinbox__pg_part_list(db, "kinbox\\_inbox", table,
                                    "SELECT count(*) FROM %s_default", out, n,
                                    catchall_rows);
}

static int
pg_create(kinbox__db_t *db, const char *table, int64_t first_s)
{
        (void)first_s;
        char t[1024], d[160], i[200];
        snprintf(t, sizeof(t),
                 "CREATE TABLE %s (consumer text NOT NULL, message_id text "
                 "NOT NULL, topic text NOT NULL, kafka_partition integer NOT "
                 "NULL, kafka_offset bigint NOT NULL, processed_at "
                 "timestamptz NOT NULL DEFAULT now(), msg_at timestamptz, "
                 "part_at timestamptz NOT NULL, shadow boolean NOT NULL "
                 "DEFAULT false, CONSTRAINT %s_pkey PRIMARY KEY (consumer, "
                 "message_id, part_at), CHECK (octet_length(message_id) <= "
                 "255)) PARTITION BY RANGE (part_at)",
                 table, table);
        snprintf(d, sizeof(d),
                 "CREATE TABLE %s_default PARTITION OF %s DEFAULT", table,
                 table);
        /* Only the catch-all is pruned row by row, by processed_at. */
        snprintf(i, sizeof(i),
                 "CREATE INDEX %s_default_processed_at ON %s_default "
                 "(processed_at)",
                 table, table);
        const char *v[] = {t, d, i, NULL};
        return kinbox__pg_part_tx(db, v);
}

int
kinbox__pg_part_add(kinbox__db_t *db, const kinbox__pg_range_t *g,
                    int64_t start_s, int64_t width_s)
{
        char lab[16], from[48], to[48];
        kinbox__range_label(lab, start_s, width_s);
        kinbox__utc_quoted(from, sizeof(from), "+00", start_s);
        kinbox__utc_quoted(to, sizeof(to), "+00", start_s + width_s);
        const char *cols = g->cols ? g->cols : "*";
        char c[256], m[512], d[256], a[320];
        snprintf(c, sizeof(c),
                 "CREATE TABLE %s_p%s (LIKE %s INCLUDING DEFAULTS INCLUDING "
                 "CONSTRAINTS)",
                 g->prefix, lab, g->table);
        /* Rows that waited in the catch-all move in with it. */
        snprintf(m, sizeof(m),
                 "INSERT INTO %s_p%s%s%s%s SELECT %s FROM %s_default WHERE "
                 "%s >= %s AND %s < %s",
                 g->prefix, lab, g->cols ? " (" : "", g->cols ? cols : "",
                 g->cols ? ")" : "", cols, g->table, g->col, from, g->col, to);
        snprintf(d, sizeof(d),
                 "DELETE FROM %s_default WHERE %s >= %s AND %s < %s", g->table,
                 g->col, from, g->col, to);
        snprintf(a, sizeof(a),
                 "ALTER TABLE %s ATTACH PARTITION %s_p%s FOR VALUES FROM (%s) "
                 "TO (%s)",
                 g->table, g->prefix, lab, from, to);
        const char *v[] = {LOCK_WAIT, c, m, d, a, NULL};
        return kinbox__pg_part_tx(db, v);
}

static int
pg_add(kinbox__db_t *db, const char *table, int64_t start_s, int64_t width_s)
{
        const kinbox__pg_range_t g = {table, "kinbox_inbox", "part_at",
                                      KINBOX__INBOX_COLS};
        return kinbox__pg_part_add(db, &g, start_s, width_s);
}

static int
pg_clock(kinbox__db_t *db, int64_t *now_ms)
{
        return kinbox__db_clock_ms(db,
                                   "SELECT floor(extract(epoch FROM "
                                   "clock_timestamp()) * 1000)::bigint",
                                   now_ms);
}

/* In the drop's transaction, before the DETACH: whether the range is over
 * the retention old by the database's clock; KINBOX_ERR_STATE when not. */
static int
pg_old_enough(kinbox__db_t *db, const kinbox__pg_detach_t *x)
{
        const int64_t *lim = x->arg; /* end_s, ret_ms */
        char g[200];
        snprintf(g, sizeof(g),
                 "SELECT to_timestamp(%" PRId64 ") <= now() - %" PRId64
                 " * interval '1 millisecond'",
                 lim[0], lim[1]);
        return kinbox__db_must(db, g, 0, NULL,
                               "range %s is not past the retention by the "
                               "database's clock: not dropped",
                               x->r->name);
}

/* DROP TABLE name in a transaction of its own. */
static int
drop_table(kinbox__db_t *db, const char *name)
{
        char x[160];
        snprintf(x, sizeof(x), "DROP TABLE %s", name);
        const char *w[] = {x, NULL};
        return kinbox__pg_part_tx(db, w);
}

int
kinbox__pg_part_detach(kinbox__db_t *db, const kinbox__pg_detach_t *x,
                       uint64_t *kept)
{
        char d[160];
        snprintf(d, sizeof(d), "ALTER TABLE %s DETACH PARTITION %s", x->parent,
                 x->r->name);
        int rc = db->ops->begin(db);
        struct kinbox_rows_s *n = NULL;
        if (!rc)
                rc = db->ops->query(db, LOCK_WAIT, 0, NULL, -1, NULL);
        if (!rc && x->before)
                rc = x->before(db, x);
        if (!rc)
                rc = db->ops->query(db, d, 0, NULL, -1, NULL);
        if (!rc && x->after)
                rc = x->after(db, x);
        if (!rc)
                rc = db->ops->query(db, x->keep, 0, NULL, -1, &n);
        rc = kinbox__db_end(db, rc);
        *kept = !rc && n && n->nrows && n->values[0]
                    ? strtoull(n->values[0], NULL, 10)
                    : 0;
        kinbox_rows_destroy(n);
        /* The files go in a transaction of their own: removing them takes
         * longer the bigger the range (about 0.3 s for 5 M rows), and
         * inside the DETACH's transaction the writers' inserts would
         * wait on its ACCESS EXCLUSIVE lock as long. A crash in between
         * leaves the detached table; finish() drops it. */
        return rc ? rc : drop_table(db, x->r->name);
}

static int
pg_drop(kinbox__db_t *db, const kinbox__range_t *r, int64_t width_s,
        int64_t ret_ms, uint64_t *kept)
{
        char k[1024];
        /* Detached, its range is the catch-all's: the rows still needed
         * land there. */
        snprintf(k, sizeof(k),
                 "WITH i AS (INSERT INTO kinbox_inbox (" KINBOX__INBOX_COLS
                 ") SELECT " KINBOX__INBOX_XCOLS KINBOX__PART_NEEDED(
                     "%s") " ON CONFLICT DO NOTHING RETURNING 1) SELECT "
                           "count(*) FROM i",
                 r->name);
        const int64_t lim[2] = {r->start_s + width_s, ret_ms};
        const kinbox__pg_detach_t x = {"kinbox_inbox", r,    k,
                                       pg_old_enough,  NULL, lim};
        return kinbox__pg_part_detach(db, &x, kept);
}

int
kinbox__pg_part_strays(kinbox__db_t *db, const char *re)
{
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "SELECT c.relname FROM pg_class c WHERE c.relnamespace = "
                 "current_schema()::regnamespace AND c.relkind = 'r' AND NOT "
                 "c.relispartition AND c.relname ~ '%s'",
                 re);
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db, sql, 0, NULL, &r);
        for (size_t i = 0; !rc && i < r->nrows; i++)
                rc = drop_table(db, r->values[i * (size_t)r->ncols]);
        kinbox_rows_destroy(r);
        return rc;
}

/* Drop the tables a drop detached but a crash kept from dropping: a
 * kinbox_inbox_p<label> table that is nobody's partition. */
static int
pg_finish(kinbox__db_t *db)
{
        return kinbox__pg_part_strays(db,
                                      "^kinbox_inbox_p[0-9]{8}([0-9]{2})?$");
}

static int
pg_mirror(kinbox__db_t *db, bool on, int64_t width_s, int64_t skew_s)
{
        if (!on) {
                const char *v[] = {
                    "DROP TRIGGER IF EXISTS kinbox_inbox_mirror ON "
                    "kinbox_inbox",
                    "DROP FUNCTION IF EXISTS kinbox_inbox_mirror()",
                    "DROP TABLE IF EXISTS kinbox_inbox_conv", NULL};
                return kinbox__pg_part_tx(db, v);
        }
        char f[2048];
        snprintf(
            f, sizeof(f),
            "CREATE OR REPLACE FUNCTION kinbox_inbox_mirror() RETURNS trigger "
            "LANGUAGE plpgsql AS $f$ DECLARE t timestamptz; p timestamptz; "
            "BEGIN IF TG_OP = 'DELETE' THEN DELETE FROM kinbox_inbox_conv "
            "WHERE consumer = OLD.consumer AND message_id = OLD.message_id "
            "AND topic = OLD.topic AND kafka_partition = OLD.kafka_partition "
            "AND kafka_offset = OLD.kafka_offset; RETURN NULL; END IF; "
            "t := coalesce(NEW.msg_at, NEW.processed_at); "
            "p := to_timestamp(floor(extract(epoch FROM t) / %" PRId64
            ") * %" PRId64 "); "
            "IF NEW.msg_at IS NULL OR NEW.part_at = to_timestamp(0) THEN "
            "p := to_timestamp(0); END IF; "
            "INSERT INTO kinbox_inbox_conv (" KINBOX__INBOX_COLS ") VALUES "
            "(NEW.consumer, NEW.message_id, NEW.topic, NEW.kafka_partition, "
            "NEW.kafka_offset, NEW.processed_at, NEW.msg_at, p, false) ON "
            "CONFLICT DO NOTHING; "
            "IF p > to_timestamp(0) AND %" PRId64
            " > 0 AND extract(epoch FROM p + %" PRId64
            " * interval '1 second' - t) <= %" PRId64 " THEN "
            "INSERT INTO kinbox_inbox_conv (" KINBOX__INBOX_COLS ") VALUES "
            "(NEW.consumer, NEW.message_id, NEW.topic, NEW.kafka_partition, "
            "NEW.kafka_offset, NEW.processed_at, NEW.msg_at, p + %" PRId64
            " * interval '1 second', true) ON CONFLICT DO NOTHING; END IF; "
            "RETURN NULL; END $f$",
            width_s, width_s, skew_s, width_s, skew_s, width_s);
        const char *v[] = {
            f,
            "CREATE TRIGGER kinbox_inbox_mirror AFTER INSERT OR DELETE ON "
            "kinbox_inbox FOR EACH ROW EXECUTE FUNCTION kinbox_inbox_mirror()",
            NULL};
        return kinbox__pg_part_tx(db, v);
}

static int
pg_copy(kinbox__db_t *db, int64_t width_s, int64_t skew_s, int64_t batch,
        char **c, char **m, size_t *mlen, uint64_t *copied)
{
        char sql[2048];
        snprintf(
            sql, sizeof(sql),
            "WITH b AS (SELECT consumer, message_id, topic, kafka_partition, "
            "kafka_offset, processed_at, msg_at, coalesce(msg_at, "
            "processed_at) AS t, (msg_at IS NULL OR part_at = "
            "to_timestamp(0)) IS TRUE AS e FROM kinbox_inbox WHERE consumer "
            "> $1 OR (consumer = $1 AND message_id > $2) ORDER BY consumer, "
            "message_id LIMIT %" PRId64 "), "
            /* No record time (written before msg_at, or a record without
             * a timestamp): the epoch's range, no marker (db/inbox.c). */
            "k AS (SELECT b.*, CASE WHEN e THEN to_timestamp(0) ELSE "
            "to_timestamp(floor(extract(epoch FROM t) / %" PRId64
            ") * %" PRId64 ") END AS p FROM b), "
            "i AS (INSERT INTO kinbox_inbox_conv (" KINBOX__INBOX_COLS ") "
            "SELECT consumer, message_id, topic, kafka_partition, "
            "kafka_offset, processed_at, msg_at, p, false FROM k UNION ALL "
            "SELECT consumer, message_id, topic, kafka_partition, "
            "kafka_offset, processed_at, msg_at, p + %" PRId64
            " * interval '1 second', true FROM k WHERE NOT e AND %" PRId64
            " > 0 AND extract(epoch FROM p + %" PRId64
            " * interval '1 second' - t) <= %" PRId64 " ON CONFLICT DO "
            "NOTHING) "
            "SELECT consumer, message_id, (SELECT count(*) FROM b) FROM b "
            "ORDER BY consumer DESC, message_id DESC LIMIT 1",
            batch, width_s, width_s, width_s, skew_s, width_s, skew_s);
        kinbox__param_t p[2] = {{*c ? *c : "", 0, 0}, {*m ? *m : "", 0, 0}};
        struct kinbox_rows_s *r = NULL;
        int rc = db->ops->query(db, sql, 2, p, -1, &r);
        *copied = 0;
        if (!rc && r->nrows) {
                rc = kinbox__copy_key(r, 0, c, m, mlen);
                *copied = rc ? 0 : strtoull(r->values[2], NULL, 10);
        }
        kinbox_rows_destroy(r);
        return rc;
}

static int
pg_swap(kinbox__db_t *db, int64_t width_s, int64_t skew_s)
{
        char rec[200];
        snprintf(rec, sizeof(rec),
                 "INSERT INTO kinbox_partitioning (table_name, width_s, "
                 "skew_s) VALUES ('kinbox_inbox', %" PRId64 ", %" PRId64 ")",
                 width_s, skew_s);
        const char *v[] = {
            "SET LOCAL lock_timeout = '10s'",
            "LOCK TABLE kinbox_inbox IN ACCESS EXCLUSIVE MODE",
            "DROP TRIGGER kinbox_inbox_mirror ON kinbox_inbox",
            "DROP FUNCTION kinbox_inbox_mirror()",
            "ALTER TABLE kinbox_inbox RENAME TO kinbox_inbox_plain",
            "ALTER INDEX IF EXISTS kinbox_inbox_pkey RENAME TO "
            "kinbox_inbox_plain_pkey",
            "ALTER INDEX IF EXISTS kinbox_inbox_processed_at RENAME TO "
            "kinbox_inbox_plain_processed_at",
            "ALTER TABLE kinbox_inbox_conv RENAME TO kinbox_inbox",
            "ALTER INDEX kinbox_inbox_conv_pkey RENAME TO kinbox_inbox_pkey",
            "ALTER TABLE kinbox_inbox_conv_default RENAME TO "
            "kinbox_inbox_default",
            "ALTER INDEX kinbox_inbox_conv_default_processed_at RENAME TO "
            "kinbox_inbox_default_processed_at",
            rec,
            NULL};
        return kinbox__pg_part_tx(db, v);
}

static int
pg_legacy(kinbox__db_t *db, int64_t ret_ms)
{
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "UPDATE kinbox_partitioning SET legacy_until = (SELECT "
                 "max(processed_at) FROM kinbox_inbox_default WHERE part_at "
                 "= to_timestamp(0) AND msg_at IS NULL) + %" PRId64
                 " * interval '1 millisecond' WHERE table_name = "
                 "'kinbox_inbox'",
                 ret_ms);
        return kinbox__db_query(db, sql, 0, NULL, NULL);
}

static int
pg_prune_catchall(kinbox__db_t *db, int64_t age_ms, int64_t batch, uint64_t *n)
{
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "WITH d AS (DELETE FROM kinbox_inbox_default WHERE ctid IN "
                 "(SELECT ctid FROM kinbox_inbox_default WHERE processed_at "
                 "< now() - %" PRId64 " * interval '1 millisecond' LIMIT "
                 "%" PRId64 ") RETURNING 1) SELECT count(*) FROM d",
                 age_ms, batch);
        return kinbox__db_count(db, sql, 0, NULL, n);
}

const struct kinbox__part_ops kinbox__pg_part = {
    .list = pg_list,
    .clock = pg_clock,
    .create = pg_create,
    .add = pg_add,
    .drop = pg_drop,
    .finish = pg_finish,
    .mirror = pg_mirror,
    .copy = pg_copy,
    .swap = pg_swap,
    .legacy = pg_legacy,
    .prune_catchall = pg_prune_catchall,
};
