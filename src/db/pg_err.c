/*
 * pg_err.c -- PostgreSQL's errors: SQLSTATE classes to kinbox codes
 * (retry, permanent, held, duplicate, reconnect; docs/failures.md), and the
 * row a constraint's detail names.
 */
#include "pg_int.h"

#include <stdio.h>
#include <string.h>

static int
classify(PGconn *conn, const char *state)
{
        if (!conn || PQstatus(conn) == CONNECTION_BAD)
                return KINBOX_ERR_DB_CONN;
        if (!state || !*state)
                return KINBOX_ERR_DB;
        if (!strcmp(state, "23505"))
                return KINBOX_ERR_DUPLICATE;
        if (!strcmp(state, "40001") || !strcmp(state, "40P01") ||
            !strcmp(state, "55P03") || !strncmp(state, "53", 2))
                return KINBOX_ERR_TRANSIENT;
        if (!strncmp(state, "08", 2) || !strcmp(state, "57P01") ||
            !strcmp(state, "57P02") || !strcmp(state, "57P03"))
                return KINBOX_ERR_DB_CONN;
        return KINBOX_ERR_DB;
}

int
kinbox__pg_fail_conn(kinbox__db_t *db, int tag, const char *what)
{
        pg_t *pg = PG(db);
        const char *m = pg && pg->conn ? PQerrorMessage(pg->conn) : "";
        kinbox__db_seterr(db, KINBOX_ERR_DB_CONN, "08006", 0, tag,
                          "PostgreSQL connection lost during %s: %s", what,
                          m && *m ? m : "no response");
        return KINBOX_ERR_DB_CONN;
}

/* Errors no retry can fix: the same statement on the same row fails the
 * same way every time. Foreign-key violations (23503) are not among them:
 * the referenced row may arrive. */
static bool
permanent(const char *state)
{
        if (!state)
                return false;
        return !strncmp(state, "22", 2) || /* data exception */
               !strcmp(state, "23502") || /* not_null_violation */
               !strcmp(state, "23514") || /* check_violation */
               !strcmp(state, "23P01"); /* exclusion_violation */
}

/* Errors no retry can fix and no message is to blame for: the statement
 * cannot run against the database as deployed. Class 42 (syntax error or
 * access rule violation: undefined table 42P01, column 42703, function
 * 42883, syntax 42601, insufficient privilege 42501, no unique index for
 * ON CONFLICT 42P10, ...) is found before any row is read; 3F000 is an
 * undefined schema. */
static bool
deploy_error(const char *state)
{
        return state && (!strncmp(state, "42", 2) || !strcmp(state, "3F000"));
}

int
kinbox__pg_fail_res(kinbox__db_t *db, PGresult *res, int tag)
{
        pg_t *pg = PG(db);
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        const char *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
        const char *cons = PQresultErrorField(res, PG_DIAG_CONSTRAINT_NAME);
        int code = classify(pg->conn, state);
        kinbox__db_seterr(db, code, state, 0, tag, "SQLSTATE %s: %s%s%s",
                          state ? state : "?????",
                          msg ? msg : PQresultErrorMessage(res),
                          detail ? " — " : "", detail ? detail : "");
        db->err.permanent = code == KINBOX_ERR_DB && permanent(state);
        db->err.deploy = code == KINBOX_ERR_DB && deploy_error(state);
        snprintf(db->err.constraint, sizeof(db->err.constraint), "%s",
                 cons ? cons : "");
        return code;
}

/* The row the server's detail describes: PostgreSQL shows the row a
 * CHECK or NOT NULL constraint rejected ("Failing row contains (...)",
 * values cut to 64 bytes; absent without the right to read every
 * column); NULL when none. Its owner is the suspect. */
const char *
kinbox__pg_failing_row(PGresult *res)
{
        static const char pre[] = "Failing row contains ";
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
        if (!state || !detail ||
            (strcmp(state, "23514") && strcmp(state, "23502")) ||
            strncmp(detail, pre, sizeof(pre) - 1))
                return NULL;
        return detail + sizeof(pre) - 1;
}
