/*
 * db/outbox_partition.c -- the partitioned outbox's part both backends
 * share (db/outbox_partition.h): the checks a day's drop makes first.
 */
#include "../db.h"
#include "../internal.h"

#include <stdio.h>

int
kinbox__opart_checks(kinbox__db_t *db, const kinbox__range_t *r,
                     const char *old, const char *from, bool log)
{
        int rc =
            kinbox__db_must(db, old, 0, NULL, KINBOX__OPART_REFUSED, r->name,
                            "is not past outbox.retention by the "
                            "database's clock");
        char sql[300];
        snprintf(sql, sizeof(sql),
                 "SELECT NOT EXISTS (SELECT 1 FROM %s WHERE status = "
                 "'pending'%s)",
                 from, log ? " AND kind = 'action'" : "");
        if (!rc)
                rc = kinbox__db_must(
                    db, sql, 0, NULL, KINBOX__OPART_REFUSED, r->name,
                    "still holds pending rows (not yet published)");
        return rc;
}
