/*
 * mysql_int.h -- what the files of the MySQL / MariaDB backend share.
 *
 *   mysql.c         the ops: begin, exec, exec_values, query, commit,
 *                   rollback, savepoints, script, the inbox insert; the
 *                   dialect table and the ops table
 *   mysql_conn.c    the session: URL parameters, TLS, connect, error
 *                   classification (errno -> kinbox code)
 *   mysql_trip.c    round trips and the deferred statement queue
 *   mysql_rows.c    row maps of exec_values() statements: which row failed,
 *                   and dropping its message's rows
 *   mysql_merge.c   single-row INSERTs merged into multi-row ones
 *   mysql_render.c  $N placeholders rendered into escaped literals
 *
 * A function one of these files calls in another is named kinbox__my_*
 * (hidden like every internal symbol); the rest stay static.
 */
#ifndef KINBOX_DB_MYSQL_INT_H
#define KINBOX_DB_MYSQL_INT_H

#include "db.h"
#include "internal.h"

#include <stdbool.h>
#include <stddef.h>

#include <mysql.h>

struct mergestate;

struct mystate {
        kinbox__buf_t q; /* deferred statements, ";\n"-joined */
        int *tags; /* one per statement in q */
        size_t ntags, captags;
        bool begin_queued; /* START TRANSACTION sits in q, unsent */
        bool tx_sent; /* the server may hold an open transaction */
        size_t flush_at; /* flush before q grows beyond this */
        kinbox__buf_t tmp; /* one rendered statement */
        struct mergestate *merge; /* coalescing (db->coalesce), lazily */
        bool returning; /* MariaDB >= 10.5: INSERT ... RETURNING */
        /* The last SAVEPOINT queued: queue length and tag count right
         * after it (0: sent, or none). */
        size_t sp_len, sp_ntags;
        char sp_name[64];
        /* Per statement of q, beside tags: where its text starts and
         * ST_* flags; next_flags are the flags of the next one queued. */
        size_t *offs;
        unsigned char *flags;
        unsigned char next_flags;
        /* The exec_values() statements in q (see rm_drop()), and the
         * index of the statement whose result failed in the last round
         * trip. */
        struct rowmap *rmaps;
        size_t nrmaps, caprmaps;
        size_t fail_stmt;
        bool no_rownum; /* the server has no ROW_NUMBER diagnostics */
        /* Tags of handler calls whose effectful statements ran in an
         * earlier round trip of this transaction (since the last
         * rollback to a savepoint). */
        int *sent_tags;
        size_t nsent, capsent;
        /* Owners of exec_values() rows that ran, likewise. */
        int *ran_owners;
        size_t nran, capran;
};

/* Statement flags. */
#define ST_EFF 1u /* may change data (anything but a SELECT query) */
#define ST_VALUES 2u /* an exec_values() statement (has a rowmap) */

/* An exec_values() statement in the queue: its text and the owner of
 * each of its rows. */
struct rowmap {
        size_t stmt; /* its index in the queue (s->tags) */
        int tag; /* the statement's tag */
        char *text; /* rendered: head, rows joined by ", ", tail */
        size_t len, head_len, tail_off;
        size_t *rs, *rl; /* row r is text[rs[r], rs[r] + rl[r]) */
        int *tags; /* row r's owner */
        size_t n;
};

static inline struct mystate *
st_get(kinbox__db_t *db)
{
        return db->impl;
}

/* mysql_conn.c: the session; mysql_err.c: its errors and its end. */
int kinbox__my_connect(kinbox__db_t *db);
void kinbox__my_disconnect(kinbox__db_t *db);
void kinbox__my_mark_down(kinbox__db_t *db);
int kinbox__my_fail(kinbox__db_t *db, int tag, bool in_commit,
                    const char *what);
int kinbox__my_down_err(kinbox__db_t *db);
int kinbox__my_oom(kinbox__db_t *db);

/* mysql_render.c: literals and $N placeholders. */
void kinbox__my_append_literal(MYSQL *m, kinbox__buf_t *b, const char *v,
                               size_t n, bool binary);
int kinbox__my_render(MYSQL *m, kinbox__buf_t *b, const char *sql, int n,
                      const kinbox__param_t *p, int *nstmts, char *err,
                      size_t errsz);

/* mysql_trip.c: round trips and raw appends to the queue. */
int kinbox__my_roundtrip(kinbox__db_t *db, const char *sql, size_t len,
                         const int *tags, size_t ntags,
                         struct kinbox_rows_s **out, bool in_commit);
int kinbox__my_q_append_raw(kinbox__db_t *db, const char *text, size_t len,
                            int tag, int count);
/* mysql_queue.c: the queue after the merged groups, and its sending. */
void kinbox__my_q_reset(struct mystate *s);
int kinbox__my_q_append(kinbox__db_t *db, const char *text, size_t len,
                        int tag, int count);
int kinbox__my_q_send(kinbox__db_t *db, struct kinbox_rows_s **out,
                      bool in_commit);

/* mysql_err.c: row maps' and merge groups' memory. */
void kinbox__my_rm_free(struct rowmap *rm);
void kinbox__my_rm_cut(struct mystate *s, size_t from);
void kinbox__my_m_begin(struct mergestate *ms);
void kinbox__my_m_off_next(struct mergestate *ms);
void kinbox__my_m_drop(struct mergestate *ms);
void kinbox__my_m_free(struct mergestate *ms);
/* mysql_rows.c: row maps. */
void kinbox__my_sent_note(struct mystate *s, size_t upto);
int kinbox__my_rm_pin(kinbox__db_t *db, int rc);
bool kinbox__my_rm_can_drop(kinbox__db_t *db, bool in_commit);
int kinbox__my_rm_drop(kinbox__db_t *db);

/* mysql_merge.c: merged INSERTs. kinbox__my_m_try() returns M_NOT_MERGED
 * for a statement to be queued as it is, M_SEND_NOW when the queue and
 * the groups (now flushed into it) must be sent before the next one. */
#define M_NOT_MERGED 1000
#define M_SEND_NOW 1001
int kinbox__my_m_try(kinbox__db_t *db, const char *sql, int n,
                     const kinbox__param_t *p, int tag);
int kinbox__my_m_flush(kinbox__db_t *db);

#endif
