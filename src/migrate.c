/*
 * migrate.c -- versioned, idempotent schema application.
 */
#include "migrate.h"
#include "db.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        if ((*rc = db->ops->script(db, db->ops->sql->migrations_table))) {
                kinbox__errstr(errstr, sz,
                               "creating kinbox_schema_migrations: %s",
                               db->err.msg);
                kinbox__db_destroy(db);
                return NULL;
        }
        return db;
}

/* Apply one script unless (component, version) is recorded. */
static int
apply(kinbox__db_t *db, const char *component, int version, const char *name,
      const char *sql, char *errstr, size_t sz)
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
                goto fail;
        size_t have = kinbox_rows_count(rows);
        kinbox_rows_destroy(rows);
        if (have)
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
                goto fail;
        }
        rc =
            kinbox__db_queryv(db,
                              "INSERT INTO kinbox_schema_migrations "
                              "(component, version, name) VALUES ($1, $2, $3)",
                              3, v, NULL);
        if (rc == KINBOX_ERR_DUPLICATE)
                rc = KINBOX_OK; /* a concurrent migrate got there first */
        if (rc)
                goto fail;
        return KINBOX_OK;
fail:
        kinbox__errstr(errstr, sz, "%s %s: %s", component, name, db->err.msg);
        return rc;
}

kinbox_err_t
kinbox_migrate(const kinbox_conf_t *conf, char *errstr, size_t sz)
{
        int rc;
        kinbox__db_t *db = open_db(conf, errstr, sz, &rc);
        if (!db)
                return (kinbox_err_t)rc;
        rc = KINBOX_OK;
        for (const kinbox__migration_t *m = kinbox__db_migration(db, NULL);
             m && !rc; m = kinbox__db_migration(db, m))
                rc = apply(db, "kinbox", m->version, m->name, m->sql, errstr,
                           sz);
        kinbox__db_destroy(db);
        return (kinbox_err_t)rc;
}

kinbox_err_t
kinbox_migrate_module(const kinbox_conf_t *conf, const kinbox_module_t *mod,
                      char *errstr, size_t sz)
{
        int rc;
        kinbox__db_t *db = open_db(conf, errstr, sz, &rc);
        if (!db)
                return (kinbox_err_t)rc;
        const char *sql =
            kinbox__db_pick(db, mod->schema_postgresql, mod->schema_mysql);
        rc = KINBOX_OK;
        if (sql)
                rc = apply(db, mod->name, mod->schema_version, "schema", sql,
                           errstr, sz);
        kinbox__db_destroy(db);
        return (kinbox_err_t)rc;
}
