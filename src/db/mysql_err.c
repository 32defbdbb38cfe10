/*
 * mysql_err.c -- the bottom of the MySQL / MariaDB backend: the
 * classification of the server's and client library's error numbers, and
 * the end of a session's state (its queue, row maps and merge groups),
 * which an error on the connection brings. Every other file of the
 * backend calls down to this one; it calls none of them.
 */
#include "mysql_merge.h"

#include <stdlib.h>
#include <string.h>

void
kinbox__my_rm_free(struct rowmap *rm)
{
        free(rm->text);
        free(rm->rs);
        free(rm->rl);
        free(rm->tags);
}

/* Forget the row maps of statements from queue index from on. */
void
kinbox__my_rm_cut(struct mystate *s, size_t from)
{
        size_t keep = 0;
        for (size_t k = 0; k < s->nrmaps; k++) {
                if (s->rmaps[k].stmt < from)
                        s->rmaps[keep++] = s->rmaps[k];
                else
                        kinbox__my_rm_free(&s->rmaps[k]);
        }
        s->nrmaps = keep;
}

void
kinbox__my_m_tmpl_clear(struct mtmpl *t)
{
        free(t->sql);
        free(t->tuple);
        free(t->schema);
        free(t->table);
        memset(t, 0, sizeof(*t));
}

/* A transaction begins: it merges unless the last one's merged statement
 * failed. */
void
kinbox__my_m_begin(struct mergestate *ms)
{
        if (ms) {
                ms->off = ms->off_next;
                ms->off_next = false;
        }
}

/* A merged statement failed: the next transaction sends rows as they
 * are, so the error is pinned on its message. */
void
kinbox__my_m_off_next(struct mergestate *ms)
{
        if (ms)
                ms->off_next = true;
}

void
kinbox__my_m_free(struct mergestate *ms)
{
        if (!ms)
                return;
        for (size_t k = 0; k < MERGE_TMPLS; k++)
                kinbox__my_m_tmpl_clear(&ms->tmpl[k]);
        for (size_t k = 0; k < MERGE_TABLES; k++) {
                free(ms->tables[k].schema);
                free(ms->tables[k].table);
        }
        for (size_t k = 0; k < MERGE_GROUPS; k++)
                kinbox__buf_free(&ms->groups[k].text);
        free(ms);
}

/* Drop open groups (rollback, reset). */
void
kinbox__my_m_drop(struct mergestate *ms)
{
        if (!ms)
                return;
        for (size_t k = 0; k < ms->ngroups; k++)
                kinbox__buf_reset(&ms->groups[k].text);
        ms->ngroups = 0;
        ms->bytes = 0;
}

static void
st_free(kinbox__db_t *db)
{
        struct mystate *s = db->impl;
        if (!s)
                return;
        kinbox__buf_free(&s->q);
        kinbox__buf_free(&s->tmp);
        free(s->tags);
        free(s->offs);
        free(s->flags);
        free(s->sent_tags);
        free(s->ran_owners);
        kinbox__my_rm_cut(s, 0);
        free(s->rmaps);
        kinbox__my_m_free(s->merge);
        free(s);
        db->impl = NULL;
        if (db->attr)
                db->attr->rows_queued = false;
}

/* ------------------------------------------------------------------ errors */

static bool
my_conn_errno(unsigned int e)
{
        switch (e) {
        case 2002: /* CR_CONNECTION_ERROR (socket) */
        case 2003: /* CR_CONN_HOST_ERROR */
        case 2006: /* CR_SERVER_GONE_ERROR */
        case 2013: /* CR_SERVER_LOST */
        case 2014: /* CR_COMMANDS_OUT_OF_SYNC: the handle is unusable */
        case 2026: /* CR_SSL_CONNECTION_ERROR */
        case 2055: /* CR_SERVER_LOST_EXTENDED */
        case 1040: /* ER_CON_COUNT_ERROR (too many connections) */
        case 1053: /* ER_SERVER_SHUTDOWN */
        case 1152: /* ER_ABORTING_CONNECTION */
        case 1927: /* MariaDB ER_CONNECTION_KILLED */
        case 4031: /* MySQL 8 ER_CLIENT_INTERACTION_TIMEOUT */
                return true;
        default:
                return false;
        }
}

/* Errors no retry can fix (see pg.c's permanent()); foreign-key
 * violations (1451/1452) are not among them. */
static bool
my_permanent(unsigned int e)
{
        switch (e) {
        case 1048: /* ER_BAD_NULL_ERROR */
        case 1364: /* ER_NO_DEFAULT_FOR_FIELD */
        case 4025: /* MariaDB ER_CONSTRAINT_FAILED (CHECK) */
        case 3819: /* MySQL ER_CHECK_CONSTRAINT_VIOLATED */
        case 1264: /* ER_WARN_DATA_OUT_OF_RANGE */
        case 1690: /* ER_DATA_OUT_OF_RANGE */
        case 1366: /* ER_TRUNCATED_WRONG_VALUE_FOR_FIELD */
        case 1292: /* ER_TRUNCATED_WRONG_VALUE */
        case 1406: /* ER_DATA_TOO_LONG */
        case 1365: /* ER_DIVISION_BY_ZERO */
        case 1367: /* ER_ILLEGAL_VALUE_FOR_TYPE */
        case 1411: /* ER_WRONG_VALUE_FOR_TYPE */
        case 3140: /* ER_INVALID_JSON_TEXT */
                return true;
        default:
                return false;
        }
}

/* The unique index named by error 1062's text ("Duplicate entry '...' for
 * key 'NAME'", MySQL 8: 'table.NAME'); the session's lc_messages is
 * en_US. The last "for key '" wins: the entry itself may contain it. */
static void
my_dup_key(const char *msg, char *out, size_t sz)
{
        const char *k = NULL;
        for (const char *p = msg; (p = strstr(p, "for key '")); p++)
                k = p + 9;
        out[0] = '\0';
        if (!k)
                return;
        const char *end = strrchr(k, '\'');
        if (!end || end < k)
                return;
        const char *dot = memchr(k, '.', (size_t)(end - k));
        if (dot)
                k = dot + 1;
        snprintf(out, sz, "%.*s", (int)(end - k), k);
}

/* Errors no retry can fix and no message is to blame for (see pg.c's
 * deploy_error()): the statement cannot run against the database as
 * deployed. */
static bool
my_deploy(unsigned int e)
{
        switch (e) {
        case 1044: /* ER_DBACCESS_DENIED_ERROR */
        case 1052: /* ER_NON_UNIQ_ERROR (ambiguous column) */
        case 1054: /* ER_BAD_FIELD_ERROR (unknown column) */
        case 1064: /* ER_PARSE_ERROR */
        case 1109: /* ER_UNKNOWN_TABLE */
        case 1128: /* ER_FUNCTION_NOT_DEFINED */
        case 1136: /* ER_WRONG_VALUE_COUNT_ON_ROW */
        case 1142: /* ER_TABLEACCESS_DENIED_ERROR */
        case 1143: /* ER_COLUMNACCESS_DENIED_ERROR */
        case 1146: /* ER_NO_SUCH_TABLE */
        case 1227: /* ER_SPECIFIC_ACCESS_DENIED_ERROR */
        case 1305: /* ER_SP_DOES_NOT_EXIST (function, procedure) */
        case 1318: /* ER_SP_WRONG_NO_OF_ARGS */
        case 1356: /* ER_VIEW_INVALID */
        case 1370: /* ER_PROCACCESS_DENIED_ERROR */
        case 1582: /* ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT */
        case 1630: /* ER_FUNC_INEXISTENT_NAME_COLLISION */
                return true;
        default:
                return false;
        }
}

static int
my_code(unsigned int e)
{
        if (e == 1062 || e == 1586) /* ER_DUP_ENTRY(_WITH_KEY_NAME) */
                return KINBOX_ERR_DUPLICATE;
        if (e == 1213 || e == 1205 || e == 3572) /* deadlock, lock wait,
                                                    NOWAIT */
                return KINBOX_ERR_TRANSIENT;
        /* Out of disk, memory or another server resource: retried like a
         * deadlock (kinbox__db_resource_error() tells them apart). */
        if (e == 3 || e == 5 || e == 1021 || e == 1037 || e == 1038 ||
            e == 1041 || e == 1114)
                return KINBOX_ERR_TRANSIENT;
        if (my_conn_errno(e))
                return KINBOX_ERR_DB_CONN;
        return KINBOX_ERR_DB;
}

/* Close the handle so the caller's next step is connect(). The queue is
 * dropped with it: the server has rolled the transaction back. */
void
kinbox__my_mark_down(kinbox__db_t *db)
{
        if (db->native)
                mysql_close(db->native);
        db->native = NULL;
        st_free(db);
}

/*
 * Record the handle's current error. tag is the failing statement's tag;
 * connection errors carry -1 because no statement is to blame. in_commit:
 * the round trip held a COMMIT, so a lost connection leaves its outcome
 * unknown. Returns the kinbox code.
 */
int
kinbox__my_fail(kinbox__db_t *db, int tag, bool in_commit, const char *what)
{
        MYSQL *m = db->native;
        unsigned int e = mysql_errno(m);
        int code;
        if (e == 0) /* e.g. out of memory in the client library */
                e = 2008, code = KINBOX_ERR_DB;
        else
                code = my_code(e);
        if (code == KINBOX_ERR_DB_CONN) {
                tag = -1;
                if (in_commit)
                        code = KINBOX_ERR_COMMIT_UNKNOWN;
        }
        kinbox__db_seterr(db, code, "", (int)e, tag, "MySQL %u (%s): %s%s%s",
                          e, mysql_sqlstate(m), what ? what : "",
                          what ? ": " : "", mysql_error(m));
        db->err.permanent = code == KINBOX_ERR_DB && my_permanent(e);
        db->err.deploy = code == KINBOX_ERR_DB && my_deploy(e);
        if (code == KINBOX_ERR_DUPLICATE)
                my_dup_key(mysql_error(m), db->err.constraint,
                           sizeof(db->err.constraint));
        if (tag == KINBOX__TAG_MERGED && db->impl)
                kinbox__my_m_off_next(st_get(db)->merge);
        if (my_conn_errno(e))
                kinbox__my_mark_down(db);
        return code;
}

int
kinbox__my_down_err(kinbox__db_t *db)
{
        kinbox__db_seterr(db, KINBOX_ERR_DB_CONN, "", 0, -1,
                          "MySQL: not connected");
        return KINBOX_ERR_DB_CONN;
}

int
kinbox__my_oom(kinbox__db_t *db)
{
        kinbox__db_seterr(db, KINBOX_ERR_NOMEM, "", 0, -1,
                          "MySQL: out of memory");
        return KINBOX_ERR_NOMEM;
}

void
kinbox__my_disconnect(kinbox__db_t *db)
{
        kinbox__my_mark_down(db);
        db->in_tx = false;
}
