/*
 * mysql_binlog_pos.c -- the binlog reader's position table and lock
 * (mysql_binlog.h): its server id, the readers' GET_LOCK, the stored GTID state of a
 * relay, the server's. The purge check and its proof are in
 * mysql_binlog.c (they read the binlog).
 */
#include "mysql_binlog.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "internal.h"

uint32_t
kinbox__binlog_server_id(const char *name)
{
        uint32_t h = 2166136261u; /* FNV-1a */
        for (const char *p = name ? name : "kinbox"; *p; p++)
                h = (h ^ (unsigned char)*p) * 16777619u;
        return 0x4b420000u | (h & 0xffffu);
}

void
kinbox__binlog_lock_name(const char *name, char buf[65])
{
        snprintf(buf, 65, "kinbox_binlog_%08" PRIx32 "_%.40s",
                 kinbox__binlog_server_id(name), name);
}

int
kinbox__binlog_lock(kinbox__db_t *db, const char *name, int wait_s, char *err,
                    size_t sz)
{
        char lk[65], ws[16];
        kinbox__binlog_lock_name(name, lk);
        snprintf(ws, sizeof(ws), "%d", wait_s);
        kinbox__param_t p[2] = {{.v = lk}, {.v = ws}};
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db, "SELECT GET_LOCK($1, $2)", 2, p, &r);
        int got = !rc && r && r->nrows == 1 && r->values[0] &&
                  !strcmp(r->values[0], "1");
        kinbox_rows_destroy(r);
        if (rc) {
                kinbox__errstr(err, sz, "binlog: the reader's lock %s: %s", lk,
                               db->err.msg);
                return rc;
        }
        if (!got)
                kinbox__errstr(err, sz,
                               "binlog: another relay named %s reads the "
                               "binlog (it holds the lock %s): waiting to "
                               "take over",
                               name, lk);
        return got;
}

int
kinbox__binlog_pos_load(kinbox__db_t *db, const char *name, char **out)
{
        kinbox__param_t p = {.v = name};
        struct kinbox_rows_s *r = NULL;
        *out = NULL;
        int rc = kinbox__db_query(
            db, "SELECT gtid FROM kinbox_relay_position WHERE relay = $1", 1,
            &p, &r);
        if (!rc && r->nrows == 1 && r->values[0])
                *out = kinbox__strdup(r->values[0]);
        kinbox_rows_destroy(r);
        return rc;
}

int
kinbox__binlog_pos_store(kinbox__db_t *db, const char *name, const char *state)
{
        kinbox__param_t p[2] = {{.v = name}, {.v = state}};
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(
            db,
            "INSERT INTO kinbox_relay_position (relay, gtid) VALUES ($1, $2) "
            "ON DUPLICATE KEY UPDATE gtid = VALUES(gtid), updated_at = "
            "CURRENT_TIMESTAMP(6)",
            2, p, &r);
        kinbox_rows_destroy(r);
        return rc;
}

int
kinbox__binlog_pos_now(kinbox__db_t *db, char **out)
{
        int rc;
        struct kinbox_rows_s *r = NULL;
        rc = kinbox__db_query(db, "SELECT @@gtid_binlog_pos", 0, NULL, &r);
        if (!rc)
                *out = kinbox__strdup(r->nrows && r->values[0] ? r->values[0]
                                                               : "");
        kinbox_rows_destroy(r);
        return rc;
}
