/*
 * pg_int.h -- what the files of the PostgreSQL backend share (internal):
 * the connection's state (pg.c) and its errors (pg_err.c).
 */
#ifndef KINBOX_DB_PG_INT_H
#define KINBOX_DB_PG_INT_H

#include "../db.h"
#include "../internal.h"

#include <libpq-fe.h>
#include <stdbool.h>

enum pkind { K_INTERNAL, K_PREPARE, K_EXEC, K_QUERY, K_COMMIT, K_SYNC };

typedef struct pend {
        enum pkind kind;
        int tag;
        int stmt; /* its statement's cache index, -1: none */
        kinbox__claims_t *claims; /* K_EXEC of exec_claims(), owned */
        bool gone; /* rolled back (rollback_to): its result means nothing */
} pend_t;

typedef struct stmt {
        char *sql;
        char name[24];
        bool prepared; /* Parse sent (and not known to have failed) */
} stmt_t;

typedef struct pg {
        PGconn *conn;
        pend_t *q;
        size_t qhead, qlen, qcap;
        stmt_t *stmts;
        size_t nstmts, capstmts;
        unsigned long next_name;
        bool pipeline;
        PGresult *want; /* K_QUERY result kept for the caller */
} pg_t;

#define PG(db) ((pg_t *)(db)->impl)
#define FLUSH_EVERY 256 /* read results before socket buffers fill */
#define STMT_CACHE_MAX 256 /* prepared statements per connection */

/* pg_err.c: record the connection's loss during what (tag: the statement
 * to blame, -1 none); KINBOX_ERR_DB_CONN. */
int kinbox__pg_fail_conn(kinbox__db_t *db, int tag, const char *what);
/* Record res's error (classified, with its constraint); the kinbox code. */
int kinbox__pg_fail_res(kinbox__db_t *db, PGresult *res, int tag);
/* The row a CHECK / NOT NULL violation's detail shows, or NULL. */
const char *kinbox__pg_failing_row(PGresult *res);

#endif
