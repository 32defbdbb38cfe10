/*
 * admin_int.h -- the operator's database handle (internal).
 */
#ifndef KINBOX_ADMIN_INT_H
#define KINBOX_ADMIN_INT_H

#include "db.h"
#include "kinbox/admin.h"

struct kinbox_admin_s {
        kinbox__db_t *db;
        char errstr[1024];
};

/* Put the database error of rc into adm->errstr, end a transaction, drop
 * a lost connection (the next call reconnects); returns the code. */
kinbox_err_t kinbox__admin_fail(kinbox_admin_t *adm, int rc);

#endif
