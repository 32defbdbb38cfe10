/*
 * migrate.c -- versioned, idempotent schema application, and the schema
 * version contract: every component (kinbox itself, each handler module)
 * records the versions it applied in kinbox_schema_migrations; a process
 * refuses a database whose recorded versions it does not match exactly.
 */
#include "migrate.h"
#include "db.h"
#include "internal.h"
#include "partition.h"
#include "partition_outbox.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kinbox__migration_t *
kinbox__migration_next(const kinbox__db_t *db, const kinbox__migration_t *m)
{
        return kinbox__db_migration(db, kinbox__migrations, m);
}

/* The versions recorded for a component, ascending. */
typedef struct vers {
        int v[128];
        size_t n;
        bool table; /* kinbox_schema_migrations exists */
} vers_t;

static bool
has(const vers_t *s, int v)
{
        for (size_t i = 0; i < s->n; i++)
                if (s->v[i] == v)
                        return true;
        return false;
}

/* Read the versions recorded for component (none without the table). */
static int
recorded(kinbox__db_t *db, const char *component, vers_t *out)
{
        memset(out, 0, sizeof(*out));
        kinbox_rows_t *rows = NULL;
        int rc = kinbox__db_queryv(db, db->ops->sql->migrations_exists, 0,
                                   NULL, &rows);
        if (rc)
                return rc;
        const char *t = kinbox_rows_count(rows)
                            ? kinbox_rows_value(rows, 0, 0, NULL)
                            : NULL;
        out->table = t && atoi(t) > 0;
        kinbox_rows_destroy(rows);
        if (!out->table)
                return KINBOX_OK;
        const char *v[1] = {component};
        rc = kinbox__db_queryv(db,
                               "SELECT version FROM kinbox_schema_migrations "
                               "WHERE component = $1 ORDER BY version",
                               1, v, &rows);
        if (rc)
                return rc;
        for (size_t i = 0; i < kinbox_rows_count(rows) &&
                           out->n < sizeof(out->v) / sizeof(out->v[0]);
             i++)
                out->v[out->n++] = atoi(kinbox_rows_value(rows, i, 0, NULL));
        kinbox_rows_destroy(rows);
        return KINBOX_OK;
}

static int
last_known(kinbox__db_t *db)
{
        int top = 0;
        for (const kinbox__migration_t *m = kinbox__migration_next(db, NULL);
             m; m = kinbox__migration_next(db, m))
                top = m->version > top ? m->version : top;
        return top;
}

/* A version recorded for kinbox that this binary does not have. */
static int
unknown_version(kinbox__db_t *db, const vers_t *got)
{
        for (size_t i = 0; i < got->n; i++) {
                bool known = false;
                for (const kinbox__migration_t *m =
                         kinbox__migration_next(db, NULL);
                     m && !known; m = kinbox__migration_next(db, m))
                        known = m->version == got->v[i];
                if (!known)
                        return got->v[i];
        }
        return 0;
}

static int
newer_kinbox(kinbox__db_t *db, const vers_t *got, char *errstr, size_t sz)
{
        int unk = unknown_version(db, got);
        if (!unk)
                return KINBOX_OK;
        kinbox__errstr(errstr, sz,
                       "the kinbox schema was written by a newer kinbox "
                       "(version %d; this kinbox knows up to %d): upgrade "
                       "this binary, or restore the database from before "
                       "the upgrade",
                       got->v[got->n - 1] > unk ? got->v[got->n - 1] : unk,
                       last_known(db));
        return KINBOX_ERR_SCHEMA;
}

static int
newer_module(const kinbox_module_t *mod, const vers_t *got, char *errstr,
             size_t sz)
{
        if (!got->n || got->v[got->n - 1] <= mod->schema_version)
                return KINBOX_OK;
        kinbox__errstr(errstr, sz,
                       "the %s schema was written by a newer %s (version "
                       "%d; this one has %d): upgrade the handler, or "
                       "restore the database from before the upgrade",
                       mod->name, mod->name, got->v[got->n - 1],
                       mod->schema_version);
        return KINBOX_ERR_SCHEMA;
}

/* kinbox's own schema: every known version recorded, none unknown. */
static int
check_kinbox(kinbox__db_t *db, char *errstr, size_t sz)
{
        vers_t got;
        int rc = recorded(db, "kinbox", &got);
        if (rc) {
                kinbox__errstr(errstr, sz, "reading the schema version: %s",
                               db->err.msg);
                return rc;
        }
        if ((rc = newer_kinbox(db, &got, errstr, sz)))
                return rc;
        char miss[256] = "";
        size_t o = 0;
        for (const kinbox__migration_t *m = kinbox__migration_next(db, NULL);
             m; m = kinbox__migration_next(db, m))
                if (!has(&got, m->version) && o < sizeof(miss))
                        o += (size_t)snprintf(miss + o, sizeof(miss) - o,
                                              "%s%s", o ? ", " : "", m->name);
        if (!o)
                return KINBOX_OK;
        if (!got.n) {
                kinbox__errstr(errstr, sz,
                               "the database has no kinbox schema (this "
                               "kinbox needs version %d): run kinbox migrate",
                               last_known(db));
                return KINBOX_ERR_SCHEMA;
        }
        kinbox__errstr(errstr, sz,
                       "the kinbox schema is at version %d, this kinbox "
                       "needs %d (missing %s): run kinbox migrate",
                       got.n ? got.v[got.n - 1] : 0, last_known(db), miss);
        return KINBOX_ERR_SCHEMA;
}

static int
check_module(kinbox__db_t *db, const kinbox_module_t *mod, char *errstr,
             size_t sz)
{
        if (!kinbox__db_pick(db, mod->schema_postgresql, mod->schema_mysql))
                return KINBOX_OK;
        vers_t got;
        int rc = recorded(db, mod->name, &got);
        if (rc) {
                kinbox__errstr(errstr, sz, "reading the %s schema version: %s",
                               mod->name, db->err.msg);
                return rc;
        }
        if ((rc = newer_module(mod, &got, errstr, sz)) ||
            has(&got, mod->schema_version))
                return rc;
        kinbox__errstr(errstr, sz,
                       "the %s schema is at version %d, this %s needs %d: "
                       "run kinbox migrate",
                       mod->name, got.n ? got.v[got.n - 1] : 0, mod->name,
                       mod->schema_version);
        return KINBOX_ERR_SCHEMA;
}

int
kinbox__schema_check_db(kinbox__db_t *db, const kinbox_module_t *mod,
                        char *errstr, size_t sz)
{
        int rc = check_kinbox(db, errstr, sz);
        if (!rc && mod)
                rc = check_module(db, mod, errstr, sz);
        return rc;
}

static kinbox__db_t *
open_db(const kinbox_conf_t *conf, char *errstr, size_t sz, int *rc)
{
        *rc = KINBOX_ERR_CONFIG;
        kinbox__db_t *db = kinbox__db_new_conf(conf, errstr, sz);
        if (!db)
                return NULL;
        if ((*rc = kinbox__db_connect(db))) {
                kinbox__errstr(errstr, sz, "%s", db->err.msg);
                kinbox__db_destroy(db);
                return NULL;
        }
        return db;
}

kinbox_err_t
kinbox_schema_check(const kinbox_conf_t *conf, const kinbox_module_t *mod,
                    char *errstr, size_t sz)
{
        int rc;
        kinbox__db_t *db = open_db(conf, errstr, sz, &rc);
        if (!db)
                return (kinbox_err_t)rc;
        rc = kinbox__schema_check_db(db, mod, errstr, sz);
        kinbox__db_destroy(db);
        return (kinbox_err_t)rc;
}

/* Apply one script and record (component, version) in one step, unless
 * a concurrent migrate recorded it since the versions were read (*done). */
static int
apply(kinbox__db_t *db, const char *component, int version, const char *name,
      const char *sql, bool *done)
{
        char ver[16];
        snprintf(ver, sizeof(ver), "%d", version);
        const char *v[3] = {component, ver, name};
        kinbox_rows_t *rows = NULL;
        int rc = kinbox__db_queryv(db,
                                   "SELECT 1 FROM kinbox_schema_migrations "
                                   "WHERE component = $1 AND version = $2",
                                   2, v, &rows);
        if (rc)
                return rc;
        *done = kinbox_rows_count(rows) > 0;
        kinbox_rows_destroy(rows);
        if (*done)
                return KINBOX_OK;
        /* PostgreSQL runs the script and its record in one transaction;
         * MySQL commits DDL implicitly, so its scripts are idempotent. */
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        const struct kinbox__sql *d = db->ops->sql;
        kinbox__buf_adds(&b, d->script_begin);
        kinbox__buf_adds(&b, sql);
        kinbox__buf_adds(&b, ";\n");
        kinbox__buf_adds(&b, d->script_commit);
        if (b.oom) {
                kinbox__buf_free(&b);
                return KINBOX_ERR_NOMEM;
        }
        rc = db->ops->script(db, b.p);
        kinbox__buf_free(&b);
        if (rc) {
                if (*d->script_begin) /* end the failed transaction */
                        db->ops->script(db, "ROLLBACK");
                return rc;
        }
        rc =
            kinbox__db_queryv(db,
                              "INSERT INTO kinbox_schema_migrations "
                              "(component, version, name) VALUES ($1, $2, $3)",
                              3, v, NULL);
        return rc == KINBOX_ERR_DUPLICATE ? KINBOX_OK : rc; /* a concurrent
                                                           migrate was first */
}

typedef struct run {
        kinbox__db_t *db;
        int flags;
        kinbox_migrate_cb cb;
        void *opaque;
        char *errstr;
        size_t sz;
} run_t;

/* One step: skip it when recorded, report it, apply it (not dry). */
static int
step(run_t *r, const vers_t *got, const char *component, int version,
     const char *name, const char *sql)
{
        if (has(got, version))
                return KINBOX_OK;
        bool dry = r->flags & KINBOX_MIGRATE_DRY_RUN, done = false;
        int rc = dry ? KINBOX_OK
                     : apply(r->db, component, version, name, sql, &done);
        if (rc) {
                kinbox__errstr(r->errstr, r->sz, "%s %s: %s", component, name,
                               r->db->err.msg);
                return rc;
        }
        if (r->cb && !done)
                r->cb(component, version, name, !dry, r->opaque);
        return KINBOX_OK;
}

static int
migrate_kinbox(run_t *r, const vers_t *got)
{
        int rc = newer_kinbox(r->db, got, r->errstr, r->sz);
        for (const kinbox__migration_t *m =
                 kinbox__migration_next(r->db, NULL);
             m && !rc; m = kinbox__migration_next(r->db, m))
                rc = step(r, got, "kinbox", m->version, m->name, m->sql);
        return rc;
}

static int
migrate_module(run_t *r, const kinbox_module_t *mod, const vers_t *got)
{
        const char *sql =
            kinbox__db_pick(r->db, mod->schema_postgresql, mod->schema_mysql);
        if (!sql)
                return KINBOX_OK;
        int rc = newer_module(mod, got, r->errstr, r->sz);
        return rc ? rc
                  : step(r, got, mod->name, mod->schema_version, "schema",
                         sql);
}

/* inbox.layout / outbox.layout = partitioned: the conversions, reported
 * as steps of kinbox's own (version 0). */
static int
layout_step(run_t *r, const kinbox__settings_t *s)
{
        bool dry = r->flags & KINBOX_MIGRATE_DRY_RUN;
        char note[200];
        int rc = kinbox__partition_apply(r->db, s, dry, note, sizeof(note),
                                         r->errstr, r->sz);
        if (!rc && *note && r->cb)
                r->cb("kinbox", 0, note, !dry, r->opaque);
        if (!rc)
                rc = kinbox__outbox_partition_apply(
                    r->db, s, dry, note, sizeof(note), r->errstr, r->sz);
        if (!rc && *note && r->cb)
                r->cb("kinbox", 0, note, !dry, r->opaque);
        return rc;
}

/* One migrate at a time per database: a second one waits here until the
 * first one's connection closes, then finds its steps recorded (two
 * concurrent CREATE ... IF NOT EXISTS can fail on PostgreSQL's catalog,
 * and MySQL's DDL cannot be rolled back). */
static int
migrate_lock(run_t *r)
{
        const char *v[1] = {"kinbox_migrate"};
        kinbox_rows_t *rows = NULL;
        int rc =
            kinbox__db_queryv(r->db, r->db->ops->sql->lock_wait, 1, v, &rows);
        const char *got = !rc && kinbox_rows_count(rows)
                              ? kinbox_rows_value(rows, 0, 0, NULL)
                              : NULL;
        bool held = got && atoi(got) == 1;
        kinbox_rows_destroy(rows);
        if (rc)
                kinbox__errstr(r->errstr, r->sz,
                               "waiting for the migrate lock: %s",
                               r->db->err.msg);
        else if (!held) {
                kinbox__errstr(r->errstr, r->sz,
                               "another kinbox migrate held the lock "
                               "kinbox_migrate of this database for 10 "
                               "minutes: try again when it finished");
                rc = KINBOX_ERR_TIMEOUT;
        }
        return rc;
}

kinbox_err_t
kinbox_migrate_run(const kinbox_conf_t *conf, const kinbox_module_t *mod,
                   int flags, kinbox_migrate_cb cb, void *opaque, char *errstr,
                   size_t sz)
{
        int rc;
        run_t r = {.flags = flags,
                   .cb = cb,
                   .opaque = opaque,
                   .errstr = errstr,
                   .sz = sz};
        /* Settings kinbox would refuse after the scripts: refused first. */
        if (!mod && (rc = kinbox__partition_settings_check(
                         kinbox__settings_of(conf), errstr, sz)))
                return (kinbox_err_t)rc;
        if (!(r.db = open_db(conf, errstr, sz, &rc)))
                return (kinbox_err_t)rc;
        vers_t got;
        if (!(flags & KINBOX_MIGRATE_DRY_RUN) && (rc = migrate_lock(&r)))
                ; /* said */
        else if ((rc = recorded(r.db, mod ? mod->name : "kinbox", &got)))
                kinbox__errstr(errstr, sz, "reading the schema version: %s",
                               r.db->err.msg);
        else if (!got.table && !(flags & KINBOX_MIGRATE_DRY_RUN) &&
                 (rc = r.db->ops->script(r.db,
                                         r.db->ops->sql->migrations_table)))
                kinbox__errstr(errstr, sz,
                               "creating kinbox_schema_migrations: %s",
                               r.db->err.msg);
        if (!rc)
                rc = mod ? migrate_module(&r, mod, &got)
                         : migrate_kinbox(&r, &got);
        if (!rc && !mod)
                rc = layout_step(&r, kinbox__settings_of(conf));
        kinbox__db_destroy(r.db);
        return (kinbox_err_t)rc;
}

kinbox_err_t
kinbox_migrate(const kinbox_conf_t *conf, char *errstr, size_t sz)
{
        return kinbox_migrate_run(conf, NULL, 0, NULL, NULL, errstr, sz);
}

kinbox_err_t
kinbox_migrate_module(const kinbox_conf_t *conf, const kinbox_module_t *mod,
                      char *errstr, size_t sz)
{
        if (!mod)
                return KINBOX_ERR_INVALID;
        return kinbox_migrate_run(conf, mod, 0, NULL, NULL, errstr, sz);
}
