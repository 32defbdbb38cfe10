/*
 * sqlconn.c -- see sqlconn.h.
 */
#include "sqlconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <mysql.h>

static void
seterr(sqlconn_t *c, const char *what, const char *msg)
{
        snprintf(c->err, sizeof(c->err), "%s: %s", what, msg ? msg : "");
        c->err[strcspn(c->err, "\n")] = '\0';
}

/* mysql://user[:pass]@host[:port]/db[?...] */
static int
my_open(sqlconn_t *c, const char *url, const char *password)
{
        char buf[512];
        snprintf(buf, sizeof(buf), "%s", url + strlen("mysql://"));
        char *at = strrchr(buf, '@');
        if (!at) {
                seterr(c, "database url", "expected mysql://user@host/db");
                return -1;
        }
        *at = '\0';
        char *user = buf, *host = at + 1, *pass = strchr(user, ':');
        if (pass)
                *pass++ = '\0';
        char *db = strchr(host, '/');
        if (!db) {
                seterr(c, "database url", "no database name");
                return -1;
        }
        *db++ = '\0';
        db[strcspn(db, "?")] = '\0';
        char *port = strchr(host, ':');
        if (port)
                *port++ = '\0';
        unsigned p = port ? (unsigned)strtoul(port, NULL, 10) : 0;
        c->my = mysql_init(NULL);
        if (!c->my) {
                seterr(c, "mysql_init", "out of memory");
                return -1;
        }
        if (!mysql_real_connect(c->my, host, user, password ? password : pass,
                                db, p, NULL, 0)) {
                seterr(c, "connect", mysql_error(c->my));
                mysql_close(c->my);
                c->my = NULL;
                return -1;
        }
        return 0;
}

int
sqlconn_open(sqlconn_t *c, const char *url, const char *password)
{
        memset(c, 0, sizeof(*c));
        snprintf(c->url, sizeof(c->url), "%s", url);
        if (!strncmp(url, "mysql://", 8))
                return my_open(c, url, password);
        const char *k[3] = {"dbname", password ? "password" : NULL, NULL};
        const char *v[3] = {url, password, NULL};
        c->pg = PQconnectdbParams(k, v, 1);
        if (PQstatus(c->pg) != CONNECTION_OK) {
                seterr(c, "connect", PQerrorMessage(c->pg));
                PQfinish(c->pg);
                c->pg = NULL;
                return -1;
        }
        return 0;
}

void
sqlconn_close(sqlconn_t *c)
{
        if (c->pg)
                PQfinish(c->pg);
        if (c->my)
                mysql_close(c->my);
        c->pg = NULL;
        c->my = NULL;
}

/* MySQL: replace $N by the escaped literal of v[N-1] (NULL → NULL). */
static char *
my_subst(sqlconn_t *c, const char *sql, int n, const char *const *v)
{
        size_t cap = strlen(sql) + 1;
        for (int i = 0; i < n; i++)
                cap += v[i] ? 2 * strlen(v[i]) + 3 : 4;
        /* A parameter may be used more than once. */
        cap *= 2;
        char *o = malloc(cap), *w = o;
        if (!o)
                return NULL;
        for (const char *s = sql; *s;) {
                if (*s == '$' && s[1] >= '1' && s[1] <= '9') {
                        char *end;
                        long k = strtol(s + 1, &end, 10);
                        if (k < 1 || k > n) {
                                free(o);
                                return NULL;
                        }
                        const char *p = v[k - 1];
                        size_t need = p ? 2 * strlen(p) + 3 : 4;
                        if ((size_t)(w - o) + need + strlen(end) + 1 > cap) {
                                free(o);
                                return NULL;
                        }
                        if (!p) {
                                memcpy(w, "NULL", 4);
                                w += 4;
                        } else {
                                *w++ = '\'';
                                w += mysql_real_escape_string(
                                    c->my, w, p, (unsigned long)strlen(p));
                                *w++ = '\'';
                        }
                        s = end;
                } else {
                        *w++ = *s++;
                }
        }
        *w = '\0';
        return o;
}

static MYSQL_RES *
my_run(sqlconn_t *c, const char *sql, int n, const char *const *v,
       long long *affected)
{
        char *q = my_subst(c, sql, n, v);
        *affected = -1;
        if (!q) {
                seterr(c, "statement", "bad parameters");
                return NULL;
        }
        int rc = mysql_query(c->my, q);
        free(q);
        if (rc) {
                seterr(c, "mysql", mysql_error(c->my));
                return NULL;
        }
        MYSQL_RES *res = mysql_store_result(c->my);
        if (!res && mysql_field_count(c->my)) {
                seterr(c, "mysql", mysql_error(c->my));
                return NULL;
        }
        *affected = res ? (long long)mysql_num_rows(res)
                        : (long long)mysql_affected_rows(c->my);
        return res;
}

long long
sqlconn_exec(sqlconn_t *c, const char *sql, int n, const char *const *v)
{
        if (c->my) {
                long long k;
                MYSQL_RES *res = my_run(c, sql, n, v, &k);
                if (res)
                        mysql_free_result(res);
                return k;
        }
        PGresult *r = PQexecParams(c->pg, sql, n, NULL, v, NULL, NULL, 0);
        ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
                seterr(c, "postgresql", PQresultErrorMessage(r));
                PQclear(r);
                return -1;
        }
        long long k = st == PGRES_TUPLES_OK
                          ? (long long)PQntuples(r)
                          : strtoll(PQcmdTuples(r), NULL, 10);
        PQclear(r);
        return k;
}

int
sqlconn_row(sqlconn_t *c, const char *sql, int n, const char *const *v,
            int ncols, char (*out)[256])
{
        if (c->my) {
                long long k;
                MYSQL_RES *res = my_run(c, sql, n, v, &k);
                if (!res)
                        return k < 0 ? -1 : 0;
                MYSQL_ROW row = mysql_fetch_row(res);
                int nf = (int)mysql_num_fields(res);
                for (int i = 0; row && i < ncols; i++)
                        snprintf(out[i], 256, "%s",
                                 i < nf && row[i] ? row[i] : "");
                mysql_free_result(res);
                return (int)k;
        }
        PGresult *r = PQexecParams(c->pg, sql, n, NULL, v, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
                seterr(c, "postgresql", PQresultErrorMessage(r));
                PQclear(r);
                return -1;
        }
        int rows = PQntuples(r);
        for (int i = 0; rows && i < ncols; i++)
                snprintf(out[i], 256, "%s",
                         i < PQnfields(r) && !PQgetisnull(r, 0, i)
                             ? PQgetvalue(r, 0, i)
                             : "");
        PQclear(r);
        return rows;
}
