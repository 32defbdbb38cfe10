/*
 * backend.c -- which backend a database URL names: the top of the
 * database layer. It alone knows every backend (their ops tables and log
 * sources); the backends know only db.c's neutral parts below them, so no
 * file of src/db/ calls back into one that calls it.
 */
#include "../db.h"
#include "../internal.h"

#include <stdlib.h>

int
kinbox__dburl_parse(const char *url, kinbox__dburl_t *u, char *errstr,
                    size_t sz)
{
        if (kinbox__dburl_split(url, u, errstr, sz))
                return -1;
        if (u->backend == KINBOX_BACKEND_MYSQL &&
            kinbox__mysql_url_check(u->params, errstr, sz)) {
                kinbox__dburl_free(u);
                return -1;
        }
        return 0;
}

kinbox__db_t *
kinbox__db_new(const char *url, const char *password, char *errstr,
               size_t errstr_size)
{
        kinbox__dburl_t u;
        if (kinbox__dburl_parse(url, &u, errstr, errstr_size))
                return NULL;
        const struct kinbox__db_ops *ops = u.backend == KINBOX_BACKEND_MYSQL
                                               ? &kinbox__mysql_ops
                                               : &kinbox__pg_ops;
        kinbox__dburl_free(&u);
        return kinbox__db_new_ops(ops, url, password, errstr, errstr_size);
}

kinbox__db_t *
kinbox__db_new_conf(const kinbox_conf_t *conf, char *errstr, size_t sz)
{
        /* No URL: said before the password file is read. */
        const char *url = kinbox_conf_get(conf, "database.url");
        if (!url || !*url) {
                kinbox__errstr(errstr, sz, "database.url is not set");
                return NULL;
        }
        char *pw = NULL;
        if (kinbox__conf_password(conf, &pw, errstr, sz))
                return NULL;
        kinbox__db_t *db = kinbox__db_new(url, pw, errstr, sz);
        free(pw);
        return db;
}

const struct kinbox__logsrc_ops *
kinbox__db_logsrc(const kinbox__db_t *db)
{
        return db->ops->backend == KINBOX_BACKEND_MYSQL
                   ? &kinbox__binlog_src_ops
                   : &kinbox__pg_repl_ops;
}
