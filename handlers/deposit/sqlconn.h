/*
 * sqlconn -- a tiny two-backend connection helper for the deposit example
 * (the service CLI and the payment action): open a connection from a
 * kinbox database URL, run statements with `$N` text parameters.
 * PostgreSQL: PQexecParams; MySQL: parameters escaped into literals.
 */
#ifndef KINBOX_DEPOSIT_SQLCONN_H
#define KINBOX_DEPOSIT_SQLCONN_H

#include <stddef.h>

struct pg_conn;
struct st_mysql;

typedef struct sqlconn {
        struct pg_conn *pg;
        struct st_mysql *my;
        char url[512];
        char err[512]; /* last error, one line */
} sqlconn_t;

/* Connect to url (postgresql://... or mysql://user[:pass]@host[:port]/db);
 * password may be NULL (then the URL's). Returns 0 or -1 with c->err. */
int sqlconn_open(sqlconn_t *c, const char *url, const char *password);
void sqlconn_close(sqlconn_t *c);

/* Run a statement; returns the rows affected, -1 on error (c->err). */
long long sqlconn_exec(sqlconn_t *c, const char *sql, int n,
                       const char *const *v);

/* Run a query and copy the first row's first ncols columns as text
 * ("" for NULL) into out. Returns the number of rows (0: out untouched),
 * -1 on error. */
int sqlconn_row(sqlconn_t *c, const char *sql, int n, const char *const *v,
                int ncols, char (*out)[256]);

#endif
