/*
 * mysql.c -- MySQL / MariaDB backend over the libmysqlclient C API.
 *
 * Only calls that both Oracle's libmysqlclient and MariaDB Connector/C
 * provide are used, so kinbox builds against either.
 *
 * Deferral: inside a transaction, exec() does not talk to the server. The
 * statement is rendered (placeholders replaced by escaped literals) and
 * appended to a per-transaction queue together with its tag. flush(),
 * query(), commit() and inbox_insert() send the queue -- and their own
 * statement -- as ONE multi-statement round trip. The server executes the
 * statements in order and stops at the first error, so the index of the
 * failing result tells which statement (and so which tag) failed. BEGIN is
 * deferred the same way: "START TRANSACTION" is the first queued statement,
 * and a transaction that never queued anything costs no round trip at all.
 *
 * Placeholders: $1..$n are rewritten to literals because the text protocol
 * has no parameters and prepared statements cannot be sent in one
 * multi-statement packet. String literals, quoted identifiers and comments
 * are skipped, so a '$1' inside quotes stays as it is.
 */
#include "db.h"
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include <inttypes.h>
#include <mysql.h>

/* Column widths the migration declares; checked before sending so a long
 * id is rejected with a clear message instead of a truncation or 1406. */
#define MY_ID_MAX 255
#define MY_NAME_MAX 200 /* kinbox_inbox.consumer, characters */
#define MY_TOPIC_MAX 249 /* kinbox_inbox.topic, characters */

/* Characters in a UTF-8 string (bytes that do not continue one). */
static size_t
utf8_chars(const char *p)
{
        size_t n = 0;
        for (; *p; p++)
                if (((unsigned char)*p & 0xC0) != 0x80)
                        n++;
        return n;
}

/* Defaults (seconds); overridable with ?connect_timeout=&read_timeout=
 * &write_timeout= in the URL. The read timeout must exceed the server's
 * innodb_lock_wait_timeout (50 s by default) or a plain lock wait would be
 * reported as a lost connection instead of the transient 1205. */
#define MY_CONNECT_TIMEOUT 10
#define MY_READ_TIMEOUT 60
#define MY_WRITE_TIMEOUT 30

/* Never let one deferred packet grow past this, whatever the server's
 * max_allowed_packet says: a huge packet just delays the first error. */
#define MY_FLUSH_CAP (8u << 20)

/* The session sql_mode is fixed so the placeholder rewriting is sound:
 * no NO_BACKSLASH_ESCAPES, no ANSI_QUOTES, and strict so over-long values
 * fail instead of being truncated. */
#define MY_SQL_MODE                                                           \
        "STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"                     \
        "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"

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

struct mergestate;
static void rm_cut(struct mystate *s, size_t from);
static void m_free(struct mergestate *ms);
static void m_drop(struct mergestate *ms);
static int m_flush(kinbox__db_t *db);
static void m_off_next(struct mergestate *ms);

static pthread_once_t my_once = PTHREAD_ONCE_INIT;
static int my_lib_rc;

/* mysql_library_init() is not thread-safe; mysql_init() calls it lazily,
 * so do it once before any worker thread connects. */
static void
my_lib_init(void)
{
        my_lib_rc = mysql_library_init(0, NULL, NULL);
}

static struct mystate *
st_get(kinbox__db_t *db)
{
        return db->impl;
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
        rm_cut(s, 0);
        free(s->rmaps);
        m_free(s->merge);
        free(s);
        db->impl = NULL;
        db->rows_queued = false;
}

static void
rm_free(struct rowmap *rm)
{
        free(rm->text);
        free(rm->rs);
        free(rm->rl);
        free(rm->tags);
}

/* Forget the row maps of statements from queue index from on. */
static void
rm_cut(struct mystate *s, size_t from)
{
        size_t keep = 0;
        for (size_t k = 0; k < s->nrmaps; k++) {
                if (s->rmaps[k].stmt < from)
                        s->rmaps[keep++] = s->rmaps[k];
                else
                        rm_free(&s->rmaps[k]);
        }
        s->nrmaps = keep;
}

static void
q_reset(struct mystate *s)
{
        kinbox__buf_reset(&s->q);
        rm_cut(s, 0);
        s->ntags = 0;
        s->sp_len = s->sp_ntags = 0;
        s->begin_queued = false;
        m_drop(s->merge);
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
static void
my_mark_down(kinbox__db_t *db)
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
static int
my_fail(kinbox__db_t *db, int tag, bool in_commit, const char *what)
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
        if (code == KINBOX_ERR_DUPLICATE)
                my_dup_key(mysql_error(m), db->err.constraint,
                           sizeof(db->err.constraint));
        if (tag == KINBOX__TAG_MERGED && db->impl)
                m_off_next(st_get(db)->merge);
        if (my_conn_errno(e))
                my_mark_down(db);
        return code;
}

static int
my_down_err(kinbox__db_t *db)
{
        kinbox__db_seterr(db, KINBOX_ERR_DB_CONN, "", 0, -1,
                          "MySQL: not connected");
        return KINBOX_ERR_DB_CONN;
}

static int
my_oom(kinbox__db_t *db)
{
        kinbox__db_seterr(db, KINBOX_ERR_NOMEM, "", 0, -1,
                          "MySQL: out of memory");
        return KINBOX_ERR_NOMEM;
}

/* -------------------------------------------------------------- rendering */

static void
buf_hex(kinbox__buf_t *b, const unsigned char *p, size_t n)
{
        static const char hx[] = "0123456789ABCDEF";
        char chunk[256];
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
                chunk[k++] = hx[p[i] >> 4];
                chunk[k++] = hx[p[i] & 15];
                if (k == sizeof(chunk)) {
                        kinbox__buf_add(b, chunk, k);
                        k = 0;
                }
        }
        kinbox__buf_add(b, chunk, k);
}

/*
 * Append a literal for n bytes of v: a quoted string escaped for the
 * connection's charset and sql_mode, with the _binary introducer for
 * blob data so the server takes the bytes as they are (no charset check
 * or conversion). Escaping costs ~1x the size where hex would cost 2x,
 * which matters for payloads near max_allowed_packet; it is byte-exact
 * for any data because utf8mb4 multibyte sequences never contain the
 * ASCII bytes that get escaped. Oracle's libmysqlclient refuses
 * mysql_real_escape_string() under NO_BACKSLASH_ESCAPES (returns -1); a
 * handler could set that through the native handle, so fall back to a hex
 * literal, which needs no escaping at all.
 */
static void
append_literal(MYSQL *m, kinbox__buf_t *b, const char *v, size_t n,
               bool binary)
{
        if (!v) {
                kinbox__buf_adds(b, "NULL");
                return;
        }
        size_t need = 2 * n + 1;
        char small[512];
        char *e = need <= sizeof(small) ? small : malloc(need);
        if (!e) {
                b->oom = true;
                return;
        }
        unsigned long r = mysql_real_escape_string(m, e, v, (unsigned long)n);
        if (r == (unsigned long)-1) {
                kinbox__buf_adds(b, binary ? "X'" : "_utf8mb4 X'");
                buf_hex(b, (const unsigned char *)v, n);
                kinbox__buf_add(b, "'", 1);
        } else {
                kinbox__buf_adds(b, binary ? "_binary'" : "'");
                kinbox__buf_add(b, e, r);
                kinbox__buf_add(b, "'", 1);
        }
        if (e != small)
                free(e);
}

static bool
is_ident(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '_' || c == '$' || c >= 0x80;
}

/* Does the rendered text in b[from..) end with keyword kw (then blanks)? */
static bool
ends_with_kw(const kinbox__buf_t *b, size_t from, const char *kw)
{
        size_t e = b->len;
        while (e > from && (b->p[e - 1] == ' ' || b->p[e - 1] == '\t' ||
                            b->p[e - 1] == '\n' || b->p[e - 1] == '\r'))
                e--;
        size_t k = strlen(kw);
        if (e - from < k || strncasecmp(b->p + e - k, kw, k) != 0)
                return false;
        return e - k == from || !is_ident((unsigned char)b->p[e - k - 1]);
}

static bool
is_integer(const char *v, size_t n)
{
        if (n == 0 || n > 20)
                return false;
        for (size_t i = 0; i < n; i++)
                if (v[i] < '0' || v[i] > '9')
                        return false;
        return true;
}

/*
 * Render sql with its parameters into b (appending). Placeholders $N
 * outside literals, quoted identifiers and comments become escaped
 * literals. Top-level ';' separators are counted into *nstmts so that each
 * server result can be mapped back to its statement; empty statements and
 * trailing ';' are dropped (the caller joins statements itself). Line
 * comments at the very end get their newline so a joined ';' is not
 * swallowed by them.
 *
 * A parameter right after LIMIT or OFFSET that is a plain non-negative
 * integer is written unquoted: MySQL's grammar does not take a string
 * there, and elsewhere quoting keeps string comparisons index-friendly.
 *
 * Returns 0, or KINBOX_ERR_INVALID with a message in err.
 */
static int
render(MYSQL *m, kinbox__buf_t *b, const char *sql, int n,
       const kinbox__param_t *p, int *nstmts, char *err, size_t errsz)
{
        const size_t start = b->len;
        size_t i = 0, len = strlen(sql);
        bool seen = false, sep = false;
        int count = 0;

        while (i < len) {
                unsigned char c = (unsigned char)sql[i];
                /* Whitespace: copied, does not make a statement. */
                if (c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
                    c == '\f' || c == '\v') {
                        kinbox__buf_add(b, sql + i, 1);
                        i++;
                        continue;
                }
                /* Comments: copied verbatim, never rewritten. */
                if (c == '#' ||
                    (c == '-' && i + 1 < len && sql[i + 1] == '-' &&
                     (i + 2 == len || sql[i + 2] == ' ' ||
                      sql[i + 2] == '\t' || sql[i + 2] == '\n' ||
                      sql[i + 2] == '\r'))) {
                        size_t e = i;
                        while (e < len && sql[e] != '\n')
                                e++;
                        kinbox__buf_add(b, sql + i, e - i);
                        kinbox__buf_add(b, "\n", 1);
                        i = e < len ? e + 1 : e;
                        continue;
                }
                if (c == '/' && i + 1 < len && sql[i + 1] == '*' &&
                    !(i + 2 < len &&
                      (sql[i + 2] == '!' || sql[i + 2] == '+'))) {
                        const char *e = strstr(sql + i + 2, "*/");
                        size_t end = e ? (size_t)(e - sql) + 2 : len;
                        kinbox__buf_add(b, sql + i, end - i);
                        i = end;
                        continue;
                }
                /* Anything else is part of a statement. Executable
                 * comments and optimizer hints (slash-star followed by
                 * '!' or '+') are code the server runs, so their contents
                 * are rendered too. */
                if (c == ';') {
                        if (seen) {
                                count++;
                                sep = true;
                        }
                        seen = false;
                        i++;
                        continue;
                }
                if (sep) {
                        kinbox__buf_add(b, ";", 1);
                        sep = false;
                }
                seen = true;
                if (c == '\'' || c == '"' || c == '`') {
                        size_t e = i + 1;
                        while (e < len) {
                                if (sql[e] == '\\' && c != '`' &&
                                    e + 1 < len) {
                                        e += 2;
                                        continue;
                                }
                                if (sql[e] == (char)c) {
                                        if (e + 1 < len &&
                                            sql[e + 1] == (char)c) {
                                                e += 2;
                                                continue;
                                        }
                                        break;
                                }
                                e++;
                        }
                        size_t end = e < len ? e + 1 : len;
                        kinbox__buf_add(b, sql + i, end - i);
                        i = end;
                        continue;
                }
                if (c == '$' && i + 1 < len && sql[i + 1] >= '0' &&
                    sql[i + 1] <= '9' &&
                    (i == 0 || !is_ident((unsigned char)sql[i - 1]))) {
                        size_t e = i + 1;
                        long idx = 0;
                        while (e < len && sql[e] >= '0' && sql[e] <= '9') {
                                if (idx < 100000)
                                        idx = idx * 10 + (sql[e] - '0');
                                e++;
                        }
                        if (idx < 1 || idx > n) {
                                kinbox__errstr(err, errsz,
                                               "placeholder $%ld but %d "
                                               "parameter%s given",
                                               idx, n, n == 1 ? "" : "s");
                                b->len = start;
                                return KINBOX_ERR_INVALID;
                        }
                        const kinbox__param_t *q = &p[idx - 1];
                        size_t vl = q->v && !q->binary && q->len == 0
                                        ? strlen(q->v)
                                        : q->len;
                        if (q->v && !q->binary && is_integer(q->v, vl) &&
                            (ends_with_kw(b, start, "LIMIT") ||
                             ends_with_kw(b, start, "OFFSET")))
                                kinbox__buf_add(b, q->v, vl);
                        else
                                append_literal(m, b, q->v, vl, q->binary != 0);
                        i = e;
                        continue;
                }
                kinbox__buf_add(b, sql + i, 1);
                i++;
        }
        if (seen)
                count++;
        if (count == 0) {
                kinbox__errstr(err, errsz, "empty statement");
                b->len = start;
                return KINBOX_ERR_INVALID;
        }
        *nstmts = count;
        return 0;
}

/* ------------------------------------------------------------ round trips */

static struct kinbox_rows_s *
res_rows(MYSQL_RES *res)
{
        size_t nrows = (size_t)mysql_num_rows(res);
        int ncols = (int)mysql_num_fields(res);
        struct kinbox_rows_s *r = kinbox__rows_new(nrows, ncols);
        if (!r)
                return NULL;
        MYSQL_FIELD *f = mysql_fetch_fields(res);
        for (int c = 0; c < ncols; c++)
                if (kinbox__rows_set_name(r, c, f[c].name))
                        goto oom;
        for (size_t i = 0; i < nrows; i++) {
                MYSQL_ROW row = mysql_fetch_row(res);
                unsigned long *lens = mysql_fetch_lengths(res);
                if (!row || !lens)
                        goto oom;
                for (int c = 0; c < ncols; c++)
                        if (kinbox__rows_set(r, i, c, row[c],
                                             row[c] ? lens[c] : 0))
                                goto oom;
        }
        return r;
oom:
        kinbox_rows_destroy(r);
        return NULL;
}

/*
 * Send ntags statements (sql, len) in one packet and read every result.
 * On an error the failing statement is the one whose result was being
 * read; the server does not run the statements after it. With out, the
 * last result set at or after the last statement is returned (a CALL may
 * add results; the last one with rows wins). On a connection error the
 * handle is closed and db->impl freed before returning, so sql and tags
 * (which may live there) are not touched after a failure.
 */
static int
roundtrip(kinbox__db_t *db, const char *sql, size_t len, const int *tags,
          size_t ntags, struct kinbox_rows_s **out, bool in_commit)
{
        MYSQL *m = db->native;
        size_t idx = 0;
#define TAG_AT(i) (ntags ? tags[(i) < ntags ? (i) : ntags - 1] : -1)
        if (out)
                *out = NULL;
        if (db->impl)
                st_get(db)->fail_stmt = 0;
        if (mysql_real_query(m, sql, (unsigned long)len))
                return my_fail(db, TAG_AT(0), in_commit, NULL);
        for (;;) {
                MYSQL_RES *res = mysql_store_result(m);
                if (res) {
                        if (out && idx + 1 >= ntags) {
                                struct kinbox_rows_s *r = res_rows(res);
                                kinbox_rows_destroy(*out);
                                *out = r;
                                if (!r) {
                                        mysql_free_result(res);
                                        /* Drain so the handle stays in
                                         * sync, then report. */
                                        while (mysql_next_result(m) == 0) {
                                                MYSQL_RES *x =
                                                    mysql_store_result(m);
                                                if (x)
                                                        mysql_free_result(x);
                                        }
                                        return my_oom(db);
                                }
                        }
                        mysql_free_result(res);
                } else if (mysql_field_count(m) != 0) {
                        kinbox_rows_destroy(out ? *out : NULL);
                        if (out)
                                *out = NULL;
                        if (db->impl)
                                st_get(db)->fail_stmt = idx;
                        return my_fail(db, TAG_AT(idx), in_commit, NULL);
                } else if (TAG_AT(idx) >= 0 &&
                           (TAG_AT(idx) & KINBOX__TAG_CLAIM) &&
                           mysql_affected_rows(m) == 0) {
                        kinbox__db_note_none(db, TAG_AT(idx));
                }
                int st = mysql_next_result(m);
                if (st < 0)
                        break;
                idx++;
                if (st > 0) {
                        if (out) {
                                kinbox_rows_destroy(*out);
                                *out = NULL;
                        }
                        if (db->impl)
                                st_get(db)->fail_stmt = idx;
                        return my_fail(db, TAG_AT(idx), in_commit, NULL);
                }
        }
#undef TAG_AT
        if (out && !*out) {
                /* A statement without a result set: zero rows. */
                *out = kinbox__rows_new(0, 0);
                if (!*out)
                        return my_oom(db);
        }
        return KINBOX_OK;
}

/* Make room for need statements in the per-statement arrays. */
static int
q_reserve(struct mystate *s, size_t need)
{
        if (need <= s->captags)
                return 0;
        size_t cap = s->captags ? s->captags * 2 : 64;
        while (cap < need)
                cap *= 2;
        int *t = realloc(s->tags, cap * sizeof(*t));
        if (t)
                s->tags = t;
        size_t *o = realloc(s->offs, cap * sizeof(*o));
        if (o)
                s->offs = o;
        unsigned char *f = realloc(s->flags, cap);
        if (f)
                s->flags = f;
        if (!t || !o || !f)
                return -1;
        s->captags = cap;
        return 0;
}

/* count statements whose text starts at off, all with tag and the flags
 * s->next_flags (which go back to ST_EFF). */
static int
q_push_tags(struct mystate *s, int tag, int count, size_t off)
{
        unsigned char fl = s->next_flags;
        s->next_flags = ST_EFF;
        if (q_reserve(s, s->ntags + (size_t)count))
                return -1;
        for (int k = 0; k < count; k++) {
                s->offs[s->ntags] = off;
                s->flags[s->ntags] = fl;
                s->tags[s->ntags++] = tag;
        }
        return 0;
}

/* Append rendered text (count statements, all with tag) to the queue. */
static int
q_append_raw(kinbox__db_t *db, const char *text, size_t len, int tag,
             int count)
{
        struct mystate *s = st_get(db);
        if (s->ntags)
                kinbox__buf_add(&s->q, ";\n", 2);
        size_t off = s->q.len;
        kinbox__buf_add(&s->q, text, len);
        if (s->q.oom || q_push_tags(s, tag, count, off))
                return my_oom(db);
        return KINBOX_OK;
}

/* The same, after the open groups of merged INSERTs (their rows came
 * first). */
static int
q_append(kinbox__db_t *db, const char *text, size_t len, int tag, int count)
{
        struct mystate *s = st_get(db);
        unsigned char fl = s->next_flags; /* this statement's, not theirs */
        s->next_flags = ST_EFF;
        int rc = m_flush(db);
        s->next_flags = fl;
        return rc ? rc : q_append_raw(db, text, len, tag, count);
}

/* The handler call a tag stands for (its flags stripped). */
static int
call_of(int t)
{
        return t < 0 ? t : t & ~(KINBOX__TAG_UNIQUE | KINBOX__TAG_CLAIM);
}

/* Whether call t is in the list of calls whose effects ran earlier. */
static bool
sent_has(const struct mystate *s, int t)
{
        for (size_t k = 0; k < s->nsent; k++)
                if (s->sent_tags[k] == call_of(t))
                        return true;
        return false;
}

static struct rowmap *rm_at(struct mystate *s, size_t stmt);

/* Append v to a growing int list; false when out of memory. */
static bool
ints_add(int **a, size_t *n, size_t *cap, int v)
{
        if (kinbox__grow(a, cap, *n + 1, sizeof(**a)))
                return false;
        (*a)[(*n)++] = v;
        return true;
}

/* The statements [0, upto) of q ran: note the handler calls whose plain
 * statements ran, and the owners of exec_values() rows that ran. */
static void
sent_note(struct mystate *s, size_t upto)
{
        bool ok = true;
        for (size_t k = 0; k < upto && k < s->ntags && ok; k++) {
                int t = s->tags[k];
                /* Only a batch handler's group call queues row maps: a
                 * per-message call's or kinbox's own statements never
                 * decide a drop (and are most of a per-message batch). */
                if (t < 0 || !(t & KINBOX__TAG_GROUP) ||
                    !(s->flags[k] & ST_EFF))
                        continue;
                struct rowmap *rm =
                    s->flags[k] & ST_VALUES ? rm_at(s, k) : NULL;
                if (rm) {
                        for (size_t r = 0; r < rm->n && ok; r++)
                                ok = ints_add(&s->ran_owners, &s->nran,
                                              &s->capran,
                                              KINBOX__TAG_LOW(rm->tags[r]));
                } else if (!sent_has(s, t)) {
                        ok = ints_add(&s->sent_tags, &s->nsent, &s->capsent,
                                      call_of(t));
                }
        }
        /* Forgetting would allow a wrong drop: none in this session. */
        if (!ok)
                s->no_rownum = true;
}

/* Whether a row of message mt ran in an earlier round trip. */
static bool
ran_has(const struct mystate *s, int mt)
{
        for (size_t k = 0; k < s->nran; k++)
                if (s->ran_owners[k] == KINBOX__TAG_LOW(mt))
                        return true;
        return false;
}

static struct rowmap *
rm_at(struct mystate *s, size_t stmt)
{
        for (size_t k = 0; k < s->nrmaps; k++)
                if (s->rmaps[k].stmt == stmt)
                        return &s->rmaps[k];
        return NULL;
}

/* Whether rm has a row of the message with tag mt. */
static bool
rm_owns(const struct rowmap *rm, int mt)
{
        for (size_t r = 0; rm && r < rm->n; r++)
                if (KINBOX__TAG_LOW(rm->tags[r]) == KINBOX__TAG_LOW(mt))
                        return true;
        return false;
}

/*
 * The statement that failed in the last round trip was an exec_values()
 * one: ask the server which of its rows failed (MariaDB 10.7+ keeps the
 * row number in the diagnostics area until the next statement) and charge
 * the failure to that row's owner (db->err.tag; err.stmt_tag stays the
 * statement's). Without an answer the statement's own tag stays. Returns
 * rc, or the error of a lost connection.
 */
static int
rm_pin(kinbox__db_t *db, int rc)
{
        struct mystate *s = st_get(db);
        if ((rc != KINBOX_ERR_DB && rc != KINBOX_ERR_DUPLICATE) ||
            s->no_rownum)
                return rc;
        struct rowmap *rm = rm_at(s, s->fail_stmt);
        if (!rm)
                return rc;
        static const char q[] =
            "GET DIAGNOSTICS CONDITION 1 @kinbox_row = ROW_NUMBER;\n"
            "SELECT @kinbox_row";
        static const int t2[2] = {-1, -1};
        kinbox__dberr_t saved = db->err;
        size_t f = s->fail_stmt;
        struct kinbox_rows_s *r = NULL;
        int drc = roundtrip(db, q, sizeof(q) - 1, t2, 2, &r, false);
        if (!db->native) /* the connection went: that is the news now */
                return drc;
        s->fail_stmt = f; /* the statement that failed, not this one */
        long rn = 0;
        if (!drc && r && r->nrows == 1 && r->ncols >= 1 && r->values[0])
                rn = strtol(r->values[0], NULL, 10);
        else if (drc && db->err.vendor == 1064) /* no such item */
                s->no_rownum = true;
        kinbox_rows_destroy(r);
        db->err = saved;
        if (rn >= 1 && (size_t)rn <= rm->n)
                db->err.tag = rm->tags[rn - 1];
        return rc;
}

/*
 * Whether the failed exec_values() statement can go on without the row's
 * message (see rm_drop()): the consumer allows it (db->drop_rows), no
 * COMMIT rides in the round trip, the failure can never succeed (a unique
 * violation, a permanent error), the server named the row, the handler
 * call that queued it has returned, no statement of that call that ran
 * carries the message's effect (nothing effectful of the call ran in an
 * earlier round trip; before it in this one only exec_values() rows of
 * other messages), and every statement of the call after it is an
 * exec_values() one.
 */
static bool
rm_can_drop(kinbox__db_t *db, bool in_commit)
{
        struct mystate *s = st_get(db);
        const kinbox__dberr_t *e = &db->err;
        size_t f = s->fail_stmt;
        struct rowmap *rm = rm_at(s, f);
        if (!db->drop_rows || in_commit || !rm || e->tag == e->stmt_tag ||
            e->tag < 0 || (e->code != KINBOX_ERR_DUPLICATE && !e->permanent))
                return false;
        int t = call_of(rm->tag);
        if (t == call_of(db->call_tag) || sent_has(s, t) || ran_has(s, e->tag))
                return false;
        for (size_t k = 0; k < s->ntags; k++) {
                if (k == f || call_of(s->tags[k]) != t)
                        continue;
                bool values = s->flags[k] & ST_VALUES;
                if (k > f && !values)
                        return false;
                if (k < f && (s->flags[k] & ST_EFF) &&
                    (!values || rm_owns(rm_at(s, k), e->tag)))
                        return false;
        }
        return true;
}

/* Text of statement k of q and how many statements share it. */
static const char *
q_text(const struct mystate *s, size_t k, size_t *len, size_t *count)
{
        size_t j = k + 1;
        while (j < s->ntags && s->offs[j] == s->offs[k])
                j++;
        size_t end = j < s->ntags ? s->offs[j] - 2 : s->q.len;
        *len = end - s->offs[k];
        *count = j - k;
        return s->q.p + s->offs[k];
}

/* Take the rows of message mt out of rm (its text is rebuilt). */
static int
rm_remove(struct rowmap *rm, int mt)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_add(&b, rm->text, rm->head_len);
        size_t n = 0;
        for (size_t r = 0; r < rm->n; r++) {
                if (KINBOX__TAG_LOW(rm->tags[r]) == KINBOX__TAG_LOW(mt))
                        continue;
                if (n)
                        kinbox__buf_add(&b, ", ", 2);
                size_t at = b.len;
                kinbox__buf_add(&b, rm->text + rm->rs[r], rm->rl[r]);
                rm->rs[n] = at;
                rm->rl[n] = rm->rl[r];
                rm->tags[n++] = rm->tags[r];
        }
        size_t tail = b.len;
        kinbox__buf_add(&b, rm->text + rm->tail_off, rm->len - rm->tail_off);
        if (b.oom) {
                kinbox__buf_free(&b);
                return -1;
        }
        free(rm->text);
        rm->text = b.p; /* the buffer's bytes now belong to rm */
        rm->len = b.len;
        rm->tail_off = tail;
        rm->n = n;
        return 0;
}

/*
 * Drop the failed message's rows: the queue becomes the statements from
 * the failed one on (those before it ran), with the failed statement and
 * the call's later exec_values() statements without the message's rows
 * (a statement left with no row goes). The failure is recorded in
 * db->drops for the consumer. Returns 0 when the queue is ready to be
 * sent again.
 */
static int
rm_drop(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        size_t f = s->fail_stmt, n0 = s->ntags;
        int mt = db->err.tag, t = call_of(s->tags[f]);
        if (kinbox__grow(&db->drops, &db->capdrops, db->ndrops + 1,
                         sizeof(*db->drops)))
                return -1;
        kinbox__buf_t nq;
        kinbox__buf_init(&nq);
        size_t nt = 0;
        int *tags = malloc(n0 * sizeof(*tags));
        size_t *offs = malloc(n0 * sizeof(*offs));
        unsigned char *fl = malloc(n0);
        /* New index of each old statement, (size_t)-1 when it goes. */
        size_t *to = malloc(n0 * sizeof(*to));
        if (!tags || !offs || !fl || !to)
                goto oom;
        for (size_t k = 0; k < n0; k++)
                to[k] = (size_t)-1;
        for (size_t k = f; k < n0;) {
                size_t len, cnt;
                const char *txt = q_text(s, k, &len, &cnt);
                struct rowmap *rm = rm_at(s, k);
                if (rm && call_of(rm->tag) == t) {
                        if (rm_remove(rm, mt))
                                goto oom;
                        if (!rm->n) {
                                k += cnt;
                                continue;
                        }
                        txt = rm->text;
                        len = rm->len;
                }
                if (nt)
                        kinbox__buf_add(&nq, ";\n", 2);
                size_t at = nq.len;
                kinbox__buf_add(&nq, txt, len);
                for (size_t j = 0; j < cnt; j++) {
                        to[k + j] = nt;
                        tags[nt] = s->tags[k + j];
                        offs[nt] = at;
                        fl[nt++] = s->flags[k + j];
                }
                k += cnt;
        }
        if (nq.oom)
                goto oom;
        db->drops[db->ndrops++] = db->err;
        size_t keep = 0;
        for (size_t k = 0; k < s->nrmaps; k++) {
                struct rowmap *rm = &s->rmaps[k];
                if (to[rm->stmt] == (size_t)-1) {
                        rm_free(rm); /* it ran, or it went */
                        continue;
                }
                rm->stmt = to[rm->stmt];
                s->rmaps[keep++] = *rm;
        }
        s->nrmaps = keep;
        kinbox__buf_free(&s->q);
        s->q = nq;
        memcpy(s->tags, tags, nt * sizeof(*tags));
        memcpy(s->offs, offs, nt * sizeof(*offs));
        memcpy(s->flags, fl, nt);
        s->ntags = nt;
        s->sp_len = s->sp_ntags = 0;
        free(tags);
        free(offs);
        free(fl);
        free(to);
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        return 0;
oom:
        kinbox__buf_free(&nq);
        free(tags);
        free(offs);
        free(fl);
        free(to);
        return -1;
}

/*
 * Send the queue (plus whatever the caller appended last) and empty it.
 * The queue is emptied whatever happens: after an error the transaction
 * is dead and only rollback() may follow. A failed exec_values() row whose
 * message can be dropped (rm_can_drop()) is taken out and the rest is
 * sent again, so the transaction goes on.
 */
static int
q_send(kinbox__db_t *db, struct kinbox_rows_s **out, bool in_commit)
{
        struct mystate *s = st_get(db);
        if (out)
                *out = NULL;
        int rc0 = m_flush(db);
        if (rc0)
                return rc0;
        if (!s->ntags)
                return KINBOX_OK;
        s->tx_sent = true;
        int rc;
        for (;;) {
                rc = roundtrip(db, s->q.p, s->q.len, s->tags, s->ntags, out,
                               in_commit);
                if (!db->native)
                        return rc; /* the state went with the connection */
                if (!rc) {
                        sent_note(s, s->ntags);
                        break;
                }
                if (s->nrmaps)
                        rc = rm_pin(db, rc);
                if (!db->native)
                        return rc;
                if (!rm_can_drop(db, in_commit))
                        break;
                sent_note(s, s->fail_stmt);
                kinbox__dberr_t e = db->err;
                if (rm_drop(db)) {
                        db->err = e;
                        break;
                }
                rc = KINBOX_OK;
                if (!s->ntags)
                        break;
        }
        q_reset(s);
        db->rows_queued = false;
        return rc;
}

/* ------------------------------------------------------------- coalescing */

/*
 * Inside a consumer worker's transaction (db->coalesce), single-row
 *
 *   INSERT [IGNORE] [INTO] tbl [(cols)] VALUES (tuple)
 *       [ON DUPLICATE KEY UPDATE clause]
 *
 * statements that come from the same SQL text are merged into one
 * multi-row INSERT: a per-message handler's inserts cost one statement per
 * batch instead of one per message (the server parses and executes each
 * statement of a multi-statement packet on its own, ~10 us apiece).
 *
 * Merging moves a row ahead of the statements queued between it and the
 * first row of its group, so it is done only where that cannot change the
 * outcome:
 *  - the template is the form above, one tuple, no comments, no user
 *    variables, no subquery, no '?', no placeholder outside the tuple, and
 *    every function it calls is on a short list of pure ones (so no
 *    LAST_INSERT_ID(), ROW_COUNT() or stored functions);
 *  - the table has no triggers and is on neither side of a foreign key
 *    (information_schema, checked once per connection and table, again
 *    after TABLE_CHECK_MS);
 *  - any other statement (or a template on a table that already has a
 *    group) first sends the open groups, in the order they were opened.
 * Rows of one group keep their order, and a multi-row INSERT ... ON
 * DUPLICATE KEY UPDATE applies its rows one after the other, as the
 * single-row statements would.
 *
 * A merged statement whose rows came from several messages fails as a
 * whole, so its error carries KINBOX__TAG_MERGED: the consumer rolls back
 * and runs the batch again, and the next transaction on this connection
 * does not merge, which pins the error on its message.
 */
#define MERGE_TMPLS 32
#define MERGE_TABLES 32
#define MERGE_GROUPS 16
#define TABLE_CHECK_MS 60000

struct mtmpl {
        char *sql; /* the template (copy); NULL = empty slot */
        bool ok; /* mergeable form */
        char *schema, *table; /* unquoted; schema NULL = current */
        size_t tup_off, tup_len; /* "(...)" of the one tuple */
        char *tuple; /* that tuple, NUL-terminated */
        size_t tail_off; /* after the tuple, trailing ';' cut */
        size_t tail_len;
};

struct mtable {
        char *schema, *table;
        bool ok;
        int64_t checked_ms;
};

struct mgroup {
        struct mtmpl *t;
        kinbox__buf_t text; /* prefix and tuples so far */
        int tag;
        int first; /* the first row's tag */
        size_t rows;
};

struct mergestate {
        struct mtmpl tmpl[MERGE_TMPLS];
        size_t tmpl_next;
        struct mtable tables[MERGE_TABLES];
        size_t table_next;
        struct mgroup groups[MERGE_GROUPS];
        size_t ngroups;
        size_t bytes; /* text in open groups */
        bool off_next; /* the next transaction does not merge */
        bool off; /* this transaction does not merge */
};

static bool
m_ident_char(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '_' || c == '$' || c >= 0x80;
}

static void
m_ws(const char *s, size_t *i)
{
        while (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' ||
               s[*i] == '\r' || s[*i] == '\f' || s[*i] == '\v')
                (*i)++;
}

/* A bare word at *i equal to kw (case-insensitive); advances past it. */
static bool
m_kw(const char *s, size_t *i, const char *kw)
{
        size_t n = strlen(kw);
        if (strncasecmp(s + *i, kw, n) ||
            m_ident_char((unsigned char)s[*i + n]))
                return false;
        *i += n;
        return true;
}

/* An identifier, plain or `quoted`, copied unquoted into out (malloc). */
static bool
m_ident(const char *s, size_t *i, char **out)
{
        size_t b = *i, e;
        if (s[b] == '`') {
                e = b + 1;
                while (s[e] && s[e] != '`')
                        e++;
                if (s[e] != '`' || e == b + 1)
                        return false;
                *out = strndup(s + b + 1, e - b - 1);
                *i = e + 1;
        } else {
                e = b;
                while (m_ident_char((unsigned char)s[e]))
                        e++;
                if (e == b || (s[b] >= '0' && s[b] <= '9'))
                        return false;
                *out = strndup(s + b, e - b);
                *i = e;
        }
        return *out != NULL;
}

static bool
m_pure_fn(const char *w, size_t n)
{
        static const char *const fns[] = {
            "VALUES",        "VALUE",        "NOW",     "CURRENT_TIMESTAMP",
            "UTC_TIMESTAMP", "CURRENT_DATE", "CURDATE", "CURRENT_TIME",
            "CURTIME",       "GREATEST",     "LEAST",   "IF",
            "IFNULL",        "COALESCE",     "NULLIF",  "CONCAT",
            "LOWER",         "UPPER",        "ABS",     "ROUND",
            "FROM_UNIXTIME", "UNHEX",        "HEX",     NULL};
        for (size_t k = 0; fns[k]; k++)
                if (strlen(fns[k]) == n && !strncasecmp(fns[k], w, n))
                        return true;
        return false;
}

/*
 * Scan s[*i..] up to the ')' closing depth 0 (tuple, stop_at_close) or to
 * the end. Rejects what could make a row depend on other statements.
 * allow_params: $N placeholders may appear.
 */
static bool
m_scan(const char *s, size_t *i, bool stop_at_close, bool allow_params)
{
        int depth = 0;
        for (;;) {
                unsigned char c = (unsigned char)s[*i];
                if (!c)
                        return !stop_at_close;
                if (c == '\'' || c == '"') {
                        size_t e = *i + 1;
                        while (s[e] && s[e] != (char)c) {
                                if (s[e] == '\\' && s[e + 1])
                                        e++;
                                e++;
                        }
                        if (!s[e])
                                return false;
                        *i = e + 1;
                        continue;
                }
                if (c == '`') {
                        size_t e = *i + 1;
                        while (s[e] && s[e] != '`')
                                e++;
                        if (!s[e])
                                return false;
                        *i = e + 1;
                        continue;
                }
                if (c == '@' || c == '?' || c == ';' || c == '#' ||
                    (c == '-' && s[*i + 1] == '-') ||
                    (c == '/' && s[*i + 1] == '*'))
                        return false;
                if (c == '$') {
                        if (!allow_params)
                                return false;
                        (*i)++;
                        while (s[*i] >= '0' && s[*i] <= '9')
                                (*i)++;
                        continue;
                }
                if (c == '(') {
                        depth++;
                        (*i)++;
                        continue;
                }
                if (c == ')') {
                        if (--depth < 0)
                                return false;
                        (*i)++;
                        if (depth == 0 && stop_at_close)
                                return true;
                        continue;
                }
                if (m_ident_char(c) && !(c >= '0' && c <= '9')) {
                        size_t b = *i;
                        while (m_ident_char((unsigned char)s[*i]))
                                (*i)++;
                        size_t n = *i - b, j = *i;
                        if (n == 6 && !strncasecmp(s + b, "SELECT", 6))
                                return false;
                        m_ws(s, &j);
                        if (s[j] == '(' && !m_pure_fn(s + b, n))
                                return false;
                        continue;
                }
                (*i)++;
        }
}

/* Fill t->ok and the spans for t->sql. */
static void
m_analyze(struct mtmpl *t)
{
        const char *s = t->sql;
        size_t i = 0;
        t->ok = false;
        m_ws(s, &i);
        if (!m_kw(s, &i, "INSERT"))
                return;
        m_ws(s, &i);
        if (m_kw(s, &i, "IGNORE"))
                m_ws(s, &i);
        if (m_kw(s, &i, "INTO"))
                m_ws(s, &i);
        char *a = NULL, *b = NULL;
        if (!m_ident(s, &i, &a))
                return;
        if (s[i] == '.') {
                i++;
                if (!m_ident(s, &i, &b)) {
                        free(a);
                        return;
                }
                t->schema = a;
                t->table = b;
        } else {
                t->table = a;
        }
        m_ws(s, &i);
        if (s[i] == '(') { /* column list: names only */
                i++;
                for (;;) {
                        char *col = NULL;
                        m_ws(s, &i);
                        if (!m_ident(s, &i, &col))
                                return;
                        free(col);
                        m_ws(s, &i);
                        if (s[i] == ',') {
                                i++;
                                continue;
                        }
                        if (s[i] != ')')
                                return;
                        i++;
                        break;
                }
                m_ws(s, &i);
        }
        if (!m_kw(s, &i, "VALUES") && !m_kw(s, &i, "VALUE"))
                return;
        m_ws(s, &i);
        if (s[i] != '(')
                return;
        t->tup_off = i;
        if (!m_scan(s, &i, true, true))
                return;
        t->tup_len = i - t->tup_off;
        t->tuple = strndup(s + t->tup_off, t->tup_len);
        if (!t->tuple)
                return;
        t->tail_off = i;
        size_t j = i;
        m_ws(s, &j);
        if (s[j] == ',') /* several tuples */
                return;
        if (s[j]) {
                if (!m_kw(s, &j, "ON"))
                        return;
                m_ws(s, &j);
                if (!m_kw(s, &j, "DUPLICATE"))
                        return;
                m_ws(s, &j);
                if (!m_kw(s, &j, "KEY"))
                        return;
                m_ws(s, &j);
                if (!m_kw(s, &j, "UPDATE"))
                        return;
                /* The clause ends the text, maybe with one ';'. */
                size_t end = strlen(s);
                while (end > j && (s[end - 1] == ' ' || s[end - 1] == '\n' ||
                                   s[end - 1] == '\t' || s[end - 1] == '\r'))
                        end--;
                if (end > j && s[end - 1] == ';')
                        end--;
                char *clause = strndup(s + j, end - j);
                size_t k = 0;
                bool fine = clause && m_scan(clause, &k, false, false);
                free(clause);
                if (!fine)
                        return;
                t->tail_len = end - t->tail_off;
        } else {
                t->tail_len = 0;
        }
        t->ok = true;
}

static void
m_tmpl_clear(struct mtmpl *t)
{
        free(t->sql);
        free(t->tuple);
        free(t->schema);
        free(t->table);
        memset(t, 0, sizeof(*t));
}

/* A merged statement failed: the next transaction sends rows as they
 * are, so the error is pinned on its message. */
static void
m_off_next(struct mergestate *ms)
{
        if (ms)
                ms->off_next = true;
}

static void
m_free(struct mergestate *ms)
{
        if (!ms)
                return;
        for (size_t k = 0; k < MERGE_TMPLS; k++)
                m_tmpl_clear(&ms->tmpl[k]);
        for (size_t k = 0; k < MERGE_TABLES; k++) {
                free(ms->tables[k].schema);
                free(ms->tables[k].table);
        }
        for (size_t k = 0; k < MERGE_GROUPS; k++)
                kinbox__buf_free(&ms->groups[k].text);
        free(ms);
}

/* Drop open groups (rollback, reset). */
static void
m_drop(struct mergestate *ms)
{
        if (!ms)
                return;
        for (size_t k = 0; k < ms->ngroups; k++)
                kinbox__buf_reset(&ms->groups[k].text);
        ms->ngroups = 0;
        ms->bytes = 0;
}

static struct mtmpl *
m_tmpl_find(struct mergestate *ms, const char *sql)
{
        for (size_t k = 0; k < MERGE_TMPLS; k++)
                if (ms->tmpl[k].sql && !strcmp(ms->tmpl[k].sql, sql))
                        return &ms->tmpl[k];
        return NULL;
}

/* Only with no open group: the slot recycled may be one a group uses. */
static struct mtmpl *
m_tmpl_add(struct mergestate *ms, const char *sql)
{
        struct mtmpl *t = &ms->tmpl[ms->tmpl_next];
        ms->tmpl_next = (ms->tmpl_next + 1) % MERGE_TMPLS;
        m_tmpl_clear(t);
        t->sql = strdup(sql);
        if (!t->sql)
                return NULL;
        m_analyze(t);
        return t;
}

static bool
m_same(const char *a, const char *b)
{
        return (!a && !b) || (a && b && !strcmp(a, b));
}

/*
 * True when t's table has no triggers and no foreign keys. Runs one query
 * on the connection (outside the queue) the first time; a failure other
 * than a lost connection just means "do not merge". Returns -1 with
 * db->err set when the connection is gone.
 */
static int
m_table_ok(kinbox__db_t *db, struct mergestate *ms, const struct mtmpl *t)
{
        int64_t now = kinbox__now_ms();
        struct mtable *e = NULL;
        for (size_t k = 0; k < MERGE_TABLES; k++)
                if (ms->tables[k].table &&
                    m_same(ms->tables[k].schema, t->schema) &&
                    !strcmp(ms->tables[k].table, t->table)) {
                        e = &ms->tables[k];
                        break;
                }
        if (e && now - e->checked_ms < TABLE_CHECK_MS)
                return e->ok;
        if (!e) {
                e = &ms->tables[ms->table_next];
                ms->table_next = (ms->table_next + 1) % MERGE_TABLES;
                free(e->schema);
                free(e->table);
                e->schema = t->schema ? strdup(t->schema) : NULL;
                e->table = strdup(t->table);
                if (!e->table || (t->schema && !e->schema)) {
                        free(e->schema);
                        free(e->table);
                        e->schema = e->table = NULL;
                        return 0;
                }
        }
        e->ok = false;
        e->checked_ms = now;
        MYSQL *m = db->native;
        kinbox__buf_t q;
        kinbox__buf_init(&q);
        /* (schema column, table column) pairs that name t. */
        static const char *const where[][2] = {
            {"information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA",
             "EVENT_OBJECT_TABLE"},
            {"information_schema.REFERENTIAL_CONSTRAINTS WHERE "
             "CONSTRAINT_SCHEMA",
             "TABLE_NAME"},
            {"information_schema.REFERENTIAL_CONSTRAINTS WHERE "
             "UNIQUE_CONSTRAINT_SCHEMA",
             "REFERENCED_TABLE_NAME"},
        };
        kinbox__buf_adds(&q, "SELECT 0");
        for (size_t k = 0; k < sizeof(where) / sizeof(where[0]); k++) {
                kinbox__buf_adds(&q, " + (SELECT COUNT(*) FROM ");
                kinbox__buf_adds(&q, where[k][0]);
                kinbox__buf_adds(&q, " = ");
                if (t->schema)
                        append_literal(m, &q, t->schema, strlen(t->schema),
                                       false);
                else
                        kinbox__buf_adds(&q, "DATABASE()");
                kinbox__buf_adds(&q, " AND ");
                kinbox__buf_adds(&q, where[k][1]);
                kinbox__buf_adds(&q, " = ");
                append_literal(m, &q, t->table, strlen(t->table), false);
                kinbox__buf_adds(&q, ")");
        }
        if (q.oom) {
                kinbox__buf_free(&q);
                return 0;
        }
        struct kinbox_rows_s *r = NULL;
        int tag = -1;
        int rc = roundtrip(db, q.p, q.len, &tag, 1, &r, false);
        kinbox__buf_free(&q);
        if (rc) {
                kinbox_rows_destroy(r);
                return db->native ? 0 : -1;
        }
        e->ok = r->nrows == 1 && r->ncols == 1 && r->values[0] &&
                !strcmp(r->values[0], "0");
        kinbox_rows_destroy(r);
        return e->ok;
}

/* Send the open groups into the queue, in the order they were opened. */
static int
m_flush(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        struct mergestate *ms = s ? s->merge : NULL;
        if (!ms || !ms->ngroups)
                return KINBOX_OK;
        size_t n = ms->ngroups;
        int rc = KINBOX_OK;
        ms->ngroups = 0;
        ms->bytes = 0;
        for (size_t k = 0; k < n; k++) {
                struct mgroup *g = &ms->groups[k];
                if (!rc) {
                        kinbox__buf_add(&g->text, g->t->sql + g->t->tail_off,
                                        g->t->tail_len);
                        rc = g->text.oom
                                 ? my_oom(db)
                                 : q_append_raw(db, g->text.p, g->text.len,
                                                g->tag, 1);
                }
                if (g->text.oom) /* reset keeps the flag; free clears it */
                        kinbox__buf_free(&g->text);
                kinbox__buf_reset(&g->text);
        }
        return rc;
}

#define M_NOT_MERGED 1000

/*
 * exec() inside a transaction: add the statement to a group, or return
 * M_NOT_MERGED for the caller to queue it as it is (after the open groups).
 */
static int
m_try(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
      int tag)
{
        struct mystate *s = st_get(db);
        int rc;
        if (!s->merge) {
                s->merge = kinbox__calloc(1, sizeof(*s->merge));
                if (!s->merge)
                        return M_NOT_MERGED;
        }
        struct mergestate *ms = s->merge;
        /* A kinbox_tx_exec_unique() statement's violation, a
         * kinbox_tx_exec_claim() statement's row count must name its
         * message: never merged. */
        if (ms->off || !sql || n < 0 || (n > 0 && !p) ||
            (tag >= 0 && (tag & (KINBOX__TAG_UNIQUE | KINBOX__TAG_CLAIM))))
                return M_NOT_MERGED;
        struct mtmpl *t = m_tmpl_find(ms, sql);
        if (!t) {
                if ((rc = m_flush(db)))
                        return rc;
                t = m_tmpl_add(ms, sql);
        }
        if (!t || !t->ok)
                return M_NOT_MERGED;
        int ok = m_table_ok(db, ms, t);
        if (ok < 0)
                return db->err.code;
        if (!ok)
                return M_NOT_MERGED;
        struct mgroup *g = NULL;
        bool clash = false;
        for (size_t k = 0; k < ms->ngroups; k++) {
                struct mgroup *x = &ms->groups[k];
                if (x->t == t)
                        g = x;
                else if (m_same(x->t->schema, t->schema) &&
                         !strcmp(x->t->table, t->table))
                        clash = true;
        }
        if (clash || (!g && ms->ngroups == MERGE_GROUPS)) {
                if ((rc = m_flush(db)))
                        return rc;
                g = NULL;
        }
        size_t mark;
        int old_tag;
        if (!g) {
                g = &ms->groups[ms->ngroups++];
                g->t = t;
                g->tag = tag;
                g->first = tag;
                g->rows = 0;
                kinbox__buf_reset(&g->text);
                kinbox__buf_add(&g->text, t->sql, t->tup_off);
                mark = 0;
                old_tag = tag;
        } else {
                mark = g->text.len;
                old_tag = g->tag;
                kinbox__buf_add(&g->text, ",", 1);
                /* Rows of several messages: name the first one's group
                 * (merged statements never span a savepoint). */
                if (g->tag != tag)
                        g->tag = g->first >= 0 && tag >= 0
                                     ? KINBOX__TAG_MERGED_AT(g->first)
                                     : KINBOX__TAG_MERGED;
        }
        size_t before = g->text.len;
        char err[200];
        int count = 0;
        rc = render(db->native, &g->text, t->tuple, n, p, &count, err,
                    sizeof(err));
        if (!rc && g->text.oom) {
                /* The transaction is lost anyway: drop every group. */
                for (size_t k = 0; k < ms->ngroups; k++)
                        kinbox__buf_free(&ms->groups[k].text);
                m_drop(ms);
                return my_oom(db);
        }
        if (rc) { /* a bad placeholder: take the row back out */
                if (g->rows == 0)
                        ms->ngroups--;
                else {
                        g->text.len = mark;
                        g->tag = old_tag;
                }
                kinbox__db_seterr(db, rc, "", 0, tag, "MySQL: %s", err);
                return rc;
        }
        g->rows++;
        ms->bytes += g->text.len - before + 1;
        if (s->q.len + ms->bytes > s->flush_at) {
                if ((rc = m_flush(db)))
                        return rc;
                return q_send(db, NULL, false);
        }
        return KINBOX_OK;
}

/* ----------------------------------------------------------------- ops */

static void
my_disconnect(kinbox__db_t *db)
{
        my_mark_down(db);
        db->in_tx = false;
}

/* A mysql:// URL's parameters. */
struct myopts {
        unsigned int ct, rt, wt;
        bool returning;
        int ssl_mode; /* SSL_* below */
        char *ssl[5]; /* ca, capath, cert, key, cipher */
};

enum { SSL_DEFAULT, SSL_DISABLED, SSL_PREFERRED, SSL_REQUIRED, SSL_VERIFY_CA,
       SSL_VERIFY_IDENTITY };

static const char *const ssl_keys[5] = {"ssl-ca", "ssl-capath", "ssl-cert",
                                        "ssl-key", "ssl-cipher"};

static void
myopts_free(struct myopts *o)
{
        for (size_t i = 0; i < 5; i++)
                free(o->ssl[i]);
}

/* Parse "k=v&k=v": the timeouts (seconds, 1..86399), inbox_returning,
 * ssl-mode (DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY) and
 * ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-cipher ('_' for '-' too).
 * Anything else is refused, naming it: a misspelt TLS parameter must not
 * leave a plaintext connection. Returns 0, or -1 with errstr set. */
static int
url_options(const char *params, struct myopts *o, char *errstr, size_t sz)
{
        *o = (struct myopts){MY_CONNECT_TIMEOUT, MY_READ_TIMEOUT,
                             MY_WRITE_TIMEOUT, true, SSL_DEFAULT, {NULL}};
        for (const char *p = params ? params : ""; *p;) {
                size_t n = strcspn(p, "&");
                const char *eq = memchr(p, '=', n);
                char key[32] = "", val[1024] = "";
                size_t kl = eq ? (size_t)(eq - p) : n;
                if (kl && kl < sizeof(key)) {
                        memcpy(key, p, kl);
                        for (char *k = key; *k; k++)
                                if (*k == '_' && strncmp(key, "inbox", 5) &&
                                    !strstr(key, "timeout"))
                                        *k = '-';
                }
                size_t vl = eq ? n - kl - 1 : 0;
                if (eq && vl < sizeof(val))
                        memcpy(val, eq + 1, vl);
                char *end = NULL;
                long v = eq ? strtol(val, &end, 10) : 0;
                bool num = eq && vl && end && !*end;
                unsigned int *dst = !strcmp(key, "connect_timeout") ? &o->ct
                                    : !strcmp(key, "read_timeout")  ? &o->rt
                                    : !strcmp(key, "write_timeout") ? &o->wt
                                                                    : NULL;
                int si = -1;
                for (int i = 0; i < 5; i++)
                        if (!strcmp(key, ssl_keys[i]))
                                si = i;
                if (!eq || vl >= sizeof(val)) {
                        kinbox__errstr(errstr, sz,
                                       "database.url: parameter \"%.*s\" "
                                       "needs a value (KEY=VALUE)",
                                       (int)(kl > 40 ? 40 : kl), p);
                        return -1;
                } else if (dst) {
                        if (!num || v <= 0 || v >= 86400) {
                                kinbox__errstr(errstr, sz,
                                               "database.url: %s must be "
                                               "seconds, 1 to 86399",
                                               key);
                                return -1;
                        }
                        *dst = (unsigned int)v;
                } else if (!strcmp(key, "inbox_returning")) {
                        if (!num || (v != 0 && v != 1)) {
                                kinbox__errstr(errstr, sz,
                                               "database.url: "
                                               "inbox_returning must be 0 "
                                               "or 1");
                                return -1;
                        }
                        o->returning = v != 0;
                } else if (!strcmp(key, "ssl-mode")) {
                        static const char *const modes[] = {
                            "DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA",
                            "VERIFY_IDENTITY"};
                        o->ssl_mode = SSL_DEFAULT;
                        for (int i = 0; i < 5; i++)
                                if (!strcasecmp(val, modes[i]))
                                        o->ssl_mode = SSL_DISABLED + i;
                        if (o->ssl_mode == SSL_DEFAULT) {
                                kinbox__errstr(errstr, sz,
                                               "database.url: ssl-mode "
                                               "\"%.32s\" is not one of "
                                               "DISABLED, PREFERRED, "
                                               "REQUIRED, VERIFY_CA, "
                                               "VERIFY_IDENTITY",
                                               val);
                                return -1;
                        }
                } else if (si >= 0 && vl) {
                        free(o->ssl[si]);
                        o->ssl[si] = kinbox__strdup(val);
                } else {
                        kinbox__errstr(errstr, sz,
                                       "database.url: unknown parameter "
                                       "\"%s\" for mysql:// (known: "
                                       "connect_timeout, read_timeout, "
                                       "write_timeout, inbox_returning, "
                                       "ssl-mode, ssl-ca, ssl-capath, "
                                       "ssl-cert, ssl-key, ssl-cipher)",
                                       key[0] ? key : "?");
                        return -1;
                }
                p += n;
                if (*p == '&')
                        p++;
        }
        bool tls_files = o->ssl[0] || o->ssl[1] || o->ssl[2] || o->ssl[3];
        if (o->ssl_mode == SSL_DISABLED && tls_files) {
                kinbox__errstr(errstr, sz,
                               "database.url: ssl-mode=DISABLED with ssl-* "
                               "files: say which one you mean");
                return -1;
        }
        /* Files but no mode: as the mysql client does, REQUIRED, and the
         * server's certificate verified when a CA is given. */
        if (o->ssl_mode == SSL_DEFAULT && tls_files)
                o->ssl_mode = o->ssl[0] || o->ssl[1] ? SSL_VERIFY_IDENTITY
                                                     : SSL_REQUIRED;
        return 0;
}

int
kinbox__mysql_url_check(const char *params, char *errstr, size_t sz)
{
        struct myopts o;
        int rc = url_options(params, &o, errstr, sz);
        myopts_free(&o);
        return rc;
}

/* TLS options of the connector from the URL's ssl-* parameters. */
static void
my_tls_options(MYSQL *m, const struct myopts *o)
{
        my_bool yes = 1, no = 0;
        if (o->ssl_mode == SSL_DEFAULT || o->ssl_mode == SSL_DISABLED)
                return;
        const enum mysql_option opt[5] = {MYSQL_OPT_SSL_CA, MYSQL_OPT_SSL_CAPATH,
                                          MYSQL_OPT_SSL_CERT, MYSQL_OPT_SSL_KEY,
                                          MYSQL_OPT_SSL_CIPHER};
        for (int i = 0; i < 5; i++)
                if (o->ssl[i])
                        mysql_optionsv(m, opt[i], o->ssl[i]);
        if (o->ssl_mode == SSL_PREFERRED) {
                /* TLS when the server offers it (Connector/C 3.3: any TLS
                 * option asks for it); not enforced. */
                mysql_optionsv(m, MYSQL_OPT_SSL_ENFORCE, &no);
                if (!o->ssl[0] && !o->ssl[1] && !o->ssl[4])
                        mysql_optionsv(m, MYSQL_OPT_SSL_CIPHER, "");
                return;
        }
        mysql_optionsv(m, MYSQL_OPT_SSL_ENFORCE, &yes);
        /* Connector/C checks the chain and the host name together:
         * VERIFY_CA is as strict as VERIFY_IDENTITY here. (Connector/C
         * 3.3 enforces TLS only with the verification on: REQUIRED is
         * checked after the connect, my_connect().) */
        mysql_optionsv(m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT,
                       o->ssl_mode >= SSL_VERIFY_CA ? &yes : &no);
}

static int
my_connect(kinbox__db_t *db)
{
        char ebuf[256];
        kinbox__dburl_t u;

        my_disconnect(db);
        pthread_once(&my_once, my_lib_init);
        if (my_lib_rc) {
                kinbox__db_seterr(db, KINBOX_ERR_DB, "", 0, -1,
                                  "MySQL: client library init failed");
                return KINBOX_ERR_DB;
        }
        if (kinbox__dburl_parse(db->url, &u, ebuf, sizeof(ebuf))) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1, "%s",
                                  ebuf);
                return KINBOX_ERR_INVALID;
        }
        if (u.backend != KINBOX_BACKEND_MYSQL) {
                kinbox__dburl_free(&u);
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1,
                                  "MySQL backend given a non-mysql:// URL");
                return KINBOX_ERR_INVALID;
        }
        unsigned int off = 0;
        struct myopts o;
        if (url_options(u.params, &o, ebuf, sizeof(ebuf))) {
                myopts_free(&o);
                kinbox__dburl_free(&u);
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1, "%s",
                                  ebuf);
                return KINBOX_ERR_INVALID;
        }
        unsigned int ct = o.ct, rt = o.rt, wt = o.wt;
        bool returning = o.returning;

        struct mystate *s = kinbox__calloc(1, sizeof(*s));
        MYSQL *m = s ? mysql_init(NULL) : NULL;
        if (!m) {
                free(s);
                myopts_free(&o);
                kinbox__dburl_free(&u);
                return my_oom(db);
        }
        s->next_flags = ST_EFF;
        kinbox__buf_init(&s->q);
        kinbox__buf_init(&s->tmp);
        mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
        mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &ct);
        mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rt);
        mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &wt);
        /* LOAD DATA LOCAL lets a server read client files: never needed. */
        mysql_options(m, MYSQL_OPT_LOCAL_INFILE, &off);
        my_tls_options(m, &o);
        bool need_tls = o.ssl_mode >= SSL_REQUIRED;
        myopts_free(&o);

        const char *pw = db->password ? db->password : u.password;
        MYSQL *ok = mysql_real_connect(m, u.host, u.user, pw, u.dbname,
                                       (unsigned int)u.port, NULL,
                                       CLIENT_MULTI_STATEMENTS);
        kinbox__dburl_free(&u);
        db->native = m;
        db->impl = s;
        if (!ok) {
                unsigned int e = mysql_errno(m);
                /* Refused credentials or a missing database will not heal
                 * by reconnecting; everything else might. */
                int code = (e == 1044 || e == 1045 || e == 1049)
                               ? KINBOX_ERR_DB
                               : KINBOX_ERR_DB_CONN;
                kinbox__db_seterr(db, code, "", (int)e, -1,
                                  "MySQL %u (%s): connect: %s", e,
                                  mysql_sqlstate(m), mysql_error(m));
                my_mark_down(db);
                return code;
        }
        if (need_tls && !mysql_get_ssl_cipher(m)) {
                /* Before any statement: nothing of the application's
                 * went over the plaintext connection. */
                kinbox__db_seterr(db, KINBOX_ERR_DB, "", 2026, -1,
                                  "MySQL: connect: ssl-mode=REQUIRED but the "
                                  "server did not negotiate TLS (is it "
                                  "started with ssl_cert and ssl_key?)");
                my_mark_down(db);
                return KINBOX_ERR_DB;
        }
        static const char setup[] =
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;\n"
            "SET SESSION sql_mode = '" MY_SQL_MODE "';\n"
            /* English error texts: the violated key's name is read from
             * error 1062's text (the code itself decides it is one). */
            "SET SESSION lc_messages = 'en_US';\n"
            "SELECT @@max_allowed_packet";
        static const int setup_tags[4] = {-1, -1, -1, -1};
        struct kinbox_rows_s *r = NULL;
        int rc =
            roundtrip(db, setup, sizeof(setup) - 1, setup_tags, 4, &r, false);
        if (rc) {
                kinbox_rows_destroy(r);
                my_mark_down(db);
                return rc;
        }
        unsigned long long map = 0;
        if (r->nrows == 1 && r->ncols == 1 && r->values[0])
                map = strtoull(r->values[0], NULL, 10);
        kinbox_rows_destroy(r);
        const char *info = mysql_get_server_info(m);
        s->returning = returning && info && strstr(info, "MariaDB") &&
                       mysql_get_server_version(m) >= 100500;
        /* Leave room for one more statement of similar size. */
        s->flush_at = map > 1024 ? (size_t)(map / 2) : 1u << 20;
        if (s->flush_at > MY_FLUSH_CAP)
                s->flush_at = MY_FLUSH_CAP;
        return KINBOX_OK;
}

static int
my_begin(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return my_down_err(db);
        if (db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: begin inside a transaction");
                return KINBOX_ERR_STATE;
        }
        q_reset(s);
        s->nsent = s->nran = 0;
        db->rows_queued = false;
        s->tx_sent = false;
        if (s->merge) {
                s->merge->off = s->merge->off_next;
                s->merge->off_next = false;
        }
        int rc = q_append(db, "START TRANSACTION", 17, -1, 1);
        if (rc)
                return rc;
        s->begin_queued = true;
        db->in_tx = true;
        return KINBOX_OK;
}

/* Render sql into s->tmp; reports INVALID with the statement's tag. */
static int
my_render(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
          int tag, int *count)
{
        struct mystate *s = st_get(db);
        char err[200];
        kinbox__buf_reset(&s->tmp);
        if (!sql) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, tag,
                                  "MySQL: NULL statement");
                return KINBOX_ERR_INVALID;
        }
        if (n < 0 || (n > 0 && !p)) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, tag,
                                  "MySQL: bad parameter list");
                return KINBOX_ERR_INVALID;
        }
        int rc =
            render(db->native, &s->tmp, sql, n, p, count, err, sizeof(err));
        if (rc) {
                kinbox__db_seterr(db, rc, "", 0, tag, "MySQL: %s", err);
                return rc;
        }
        if (s->tmp.oom) {
                kinbox__buf_free(&s->tmp);
                kinbox__buf_init(&s->tmp);
                return my_oom(db);
        }
        return KINBOX_OK;
}

/* Outside a transaction: run the rendered statement(s) in s->tmp now. */
static int
run_tmp(kinbox__db_t *db, int tag, int count, struct kinbox_rows_s **out)
{
        struct mystate *s = st_get(db);
        int small[16] = {0};
        int *tags = count <= 16 ? small : malloc((size_t)count * sizeof(int));
        if (!tags)
                return my_oom(db);
        for (int k = 0; k < count; k++)
                tags[k] = tag;
        int rc = roundtrip(db, s->tmp.p, s->tmp.len, tags, (size_t)count, out,
                           false);
        if (tags != small)
                free(tags);
        return rc;
}

static int
my_flush(kinbox__db_t *db)
{
        if (!db->native || !db->impl)
                return my_down_err(db);
        return q_send(db, NULL, false);
}

static int
my_exec(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
        int tag)
{
        struct mystate *s = st_get(db);
        int count = 0, rc;
        if (!db->native || !s)
                return my_down_err(db);
        if (db->in_tx && db->coalesce &&
            (rc = m_try(db, sql, n, p, tag)) != M_NOT_MERGED)
                return rc;
        if ((rc = my_render(db, sql, n, p, tag, &count)))
                return rc;
        if (!db->in_tx) /* autocommit: nothing to batch with */
                return run_tmp(db, tag, count, NULL);
        /* Keep each packet well under max_allowed_packet. */
        if (s->ntags && s->q.len + s->tmp.len + 2 > s->flush_at &&
            (rc = q_send(db, NULL, false)))
                return rc;
        return q_append(db, s->tmp.p, s->tmp.len, tag, count);
}

/* Render one piece of an exec_values() statement into b: blank pieces
 * are skipped; a piece must not hold a ';'. */
static int
values_piece(kinbox__db_t *db, kinbox__buf_t *b, const char *sql, int n,
             const kinbox__param_t *p, int tag)
{
        if (!sql[strspn(sql, " \t\r\n")])
                return KINBOX_OK;
        char err[200];
        int count = 0;
        int rc = render(db->native, b, sql, n, p, &count, err, sizeof(err));
        if (!rc && count != 1)
                rc = KINBOX_ERR_INVALID,
                kinbox__errstr(err, sizeof(err), "a ';' in a values piece");
        if (rc)
                kinbox__db_seterr(db, rc, "", 0, tag, "MySQL: %s", err);
        return rc;
}

/* Render head, the rows and tail into s->tmp and note where the rows are
 * (rm->rs/rl, head_len, tail_off). */
static int
values_render(kinbox__db_t *db, const kinbox__values_t *v, int tag,
              struct rowmap *rm)
{
        struct mystate *s = st_get(db);
        kinbox__buf_t *b = &s->tmp;
        kinbox__buf_reset(b);
        int rc = values_piece(db, b, v->head, 0, NULL, tag);
        rm->head_len = b->len;
        for (size_t r = 0; !rc && r < v->nrows; r++) {
                if (r)
                        kinbox__buf_add(b, ", ", 2);
                rm->rs[r] = b->len;
                rc = values_piece(db, b, v->tuple, v->nper,
                                  v->p + r * (size_t)v->nper, tag);
                rm->rl[r] = b->len - rm->rs[r];
        }
        rm->tail_off = b->len;
        if (!rc)
                rc = values_piece(db, b, v->tail, 0, NULL, tag);
        if (!rc && b->oom)
                rc = my_oom(db);
        return rc;
}

/* A query that starts with SELECT (after blanks and an opening '('). */
static bool
is_select(const char *sql)
{
        while (*sql == ' ' || *sql == '\t' || *sql == '\n' || *sql == '\r' ||
               *sql == '(')
                sql++;
        return !strncasecmp(sql, "SELECT", 6) &&
               !isalnum((unsigned char)sql[6]) && sql[6] != '_';
}

/* exec_values(): one multi-row INSERT whose rows keep their owners (never
 * merged); see rm_pin() and rm_drop(). */
static int
my_exec_values(kinbox__db_t *db, const kinbox__values_t *v, int tag)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return my_down_err(db);
        struct rowmap rm = {.tag = tag, .n = v->nrows};
        rm.rs = malloc(v->nrows * sizeof(*rm.rs));
        rm.rl = malloc(v->nrows * sizeof(*rm.rl));
        rm.tags = malloc(v->nrows * sizeof(*rm.tags));
        int rc = KINBOX_OK;
        if (!rm.rs || !rm.rl || !rm.tags || !v->nrows) {
                rc = v->nrows ? my_oom(db) : KINBOX_ERR_INVALID;
                if (rc == KINBOX_ERR_INVALID)
                        kinbox__db_seterr(db, rc, "", 0, tag,
                                          "MySQL: a values statement "
                                          "without rows");
                goto out;
        }
        if ((rc = values_render(db, v, tag, &rm)))
                goto out;
        if (!db->in_tx) {
                rc = run_tmp(db, tag, 1, NULL);
                goto out;
        }
        if (s->ntags && s->q.len + s->tmp.len + 2 > s->flush_at &&
            (rc = q_send(db, NULL, false)))
                goto out;
        if (!v->row_tags) { /* no owners to keep: a plain statement */
                rc = q_append(db, s->tmp.p, s->tmp.len, tag, 1);
                goto out;
        }
        if (kinbox__grow(&s->rmaps, &s->caprmaps, s->nrmaps + 1,
                         sizeof(*s->rmaps))) {
                rc = my_oom(db);
                goto out;
        }
        rm.text = malloc(s->tmp.len ? s->tmp.len : 1);
        if (!rm.text) {
                rc = my_oom(db);
                goto out;
        }
        memcpy(rm.text, s->tmp.p, s->tmp.len);
        rm.len = s->tmp.len;
        memcpy(rm.tags, v->row_tags, v->nrows * sizeof(*rm.tags));
        s->next_flags = ST_EFF | ST_VALUES;
        if ((rc = q_append(db, s->tmp.p, s->tmp.len, tag, 1)))
                goto out;
        rm.stmt = s->ntags - 1;
        s->rmaps[s->nrmaps++] = rm;
        db->rows_queued = true;
        return KINBOX_OK;
out:
        rm_free(&rm);
        return rc;
}

static int
my_query(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
         int tag, struct kinbox_rows_s **out)
{
        struct mystate *s = st_get(db);
        struct kinbox_rows_s *r = NULL;
        int count = 0, rc;
        if (out)
                *out = NULL;
        if (!db->native || !s)
                return my_down_err(db);
        if ((rc = my_render(db, sql, n, p, tag, &count)))
                return rc;
        if (!db->in_tx) {
                rc = run_tmp(db, tag, count, out ? &r : NULL);
        } else {
                /* Queued statements and this one share the round trip. */
                if (s->ntags && s->q.len + s->tmp.len + 2 > s->flush_at &&
                    (rc = q_send(db, NULL, false)))
                        return rc;
                /* A SELECT changes nothing a dropped row could need
                 * undone (rm_can_drop()). */
                if (is_select(sql))
                        s->next_flags = 0;
                if ((rc = q_append(db, s->tmp.p, s->tmp.len, tag, count)))
                        return rc;
                rc = q_send(db, out ? &r : NULL, false);
        }
        if (rc) {
                kinbox_rows_destroy(r);
                return rc;
        }
        if (out)
                *out = r;
        else
                kinbox_rows_destroy(r);
        return KINBOX_OK;
}

static int
my_commit(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        if (!db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: commit without a transaction");
                return KINBOX_ERR_STATE;
        }
        if (!db->native || !s) {
                /* The connection died earlier: the server rolled back. */
                db->in_tx = false;
                return my_down_err(db);
        }
        int rc0 = m_flush(db);
        if (rc0)
                return rc0;
        if (s->begin_queued && s->ntags == 1) {
                /* Nothing was ever written: nothing to send. */
                q_reset(s);
                db->in_tx = false;
                return KINBOX_OK;
        }
        int rc = q_append(db, "COMMIT", 6, -1, 1);
        if (rc)
                return rc;
        rc = q_send(db, NULL, true);
        if (rc == KINBOX_OK || !db->native) {
                db->in_tx = false;
                if (db->impl)
                        st_get(db)->tx_sent = false;
        }
        return rc;
}

static void
my_rollback(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        db->in_tx = false;
        if (!db->native || !s)
                return;
        bool sent = s->tx_sent;
        q_reset(s);
        s->nsent = s->nran = 0;
        db->rows_queued = false;
        s->tx_sent = false;
        if (!sent)
                return;
        if (mysql_real_query(db->native, "ROLLBACK", 8)) {
                /* We cannot tell what the session holds now: closing it is
                 * the one sure way to end the transaction. */
                my_mark_down(db);
                return;
        }
        MYSQL_RES *res = mysql_store_result(db->native);
        if (res)
                mysql_free_result(res);
}

static int
my_savepoint(kinbox__db_t *db, const char *name)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return my_down_err(db);
        char sql[96];
        int n = snprintf(sql, sizeof(sql), "SAVEPOINT %s", name);
        int rc = q_append(db, sql, (size_t)n, -1, 1);
        if (!rc) {
                /* Rolling back to it before it was sent is a truncation. */
                s->sp_len = s->q.len;
                s->sp_ntags = s->ntags;
                snprintf(s->sp_name, sizeof(s->sp_name), "%s", name);
        }
        return rc;
}

/*
 * A failed statement ends a multi-statement round trip and rolls back only
 * itself (InnoDB), so the transaction is alive: drop what is queued and
 * roll back on the server. When the savepoint itself is still unsent, the
 * queue is cut right after it instead (nothing to undo on the server).
 */
static int
my_rollback_to(kinbox__db_t *db, const char *name)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return my_down_err(db);
        m_drop(s->merge);
        /* What ran after the savepoint is undone; what ran before it
         * belongs to calls that are over. */
        s->nsent = s->nran = 0;
        if (s->sp_len && s->sp_len <= s->q.len && !strcmp(s->sp_name, name)) {
                s->q.len = s->sp_len;
                s->q.p[s->q.len] = '\0';
                s->ntags = s->sp_ntags;
                rm_cut(s, s->ntags);
                db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
                return KINBOX_OK;
        }
        int rc = KINBOX_OK;
        if (s->ntags)
                (void)q_send(db, NULL, false); /* statements before it */
        if (!db->native)
                return db->err.code ? db->err.code : my_down_err(db);
        char sql[96];
        int n = snprintf(sql, sizeof(sql), "ROLLBACK TO SAVEPOINT %s", name);
        if (mysql_real_query(db->native, sql, (unsigned long)n))
                return my_fail(db, -1, false, "rollback to savepoint");
        MYSQL_RES *res = mysql_store_result(db->native);
        if (res)
                mysql_free_result(res);
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        return rc;
}

static void *
my_native(kinbox__db_t *db)
{
        if (!db->native || !db->impl)
                return NULL;
        if (q_send(db, NULL, false))
                return NULL;
        return db->native;
}

static int
my_script(kinbox__db_t *db, const char *sql)
{
        if (!db->native || !db->impl)
                return my_down_err(db);
        if (db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: script inside a transaction");
                return KINBOX_ERR_STATE;
        }
        MYSQL *m = db->native;
        char what[32];
        int idx = 1;
        if (mysql_real_query(m, sql, (unsigned long)strlen(sql)))
                return my_fail(db, -1, false, "statement 1");
        for (;;) {
                MYSQL_RES *res = mysql_store_result(m);
                if (res) {
                        mysql_free_result(res);
                } else if (mysql_field_count(m) != 0) {
                        snprintf(what, sizeof(what), "statement %d", idx);
                        return my_fail(db, -1, false, what);
                }
                int st = mysql_next_result(m);
                if (st < 0)
                        break;
                idx++;
                if (st > 0) {
                        snprintf(what, sizeof(what), "statement %d", idx);
                        return my_fail(db, -1, false, what);
                }
        }
        return KINBOX_OK;
}

/* 128 random bits as 32 hex digits: the row marker of one inbox_insert. */
static int
make_token(char out[33])
{
        unsigned char r[16];
        size_t got = 0;
        while (got < sizeof(r)) {
                ssize_t k = getrandom(r + got, sizeof(r) - got, 0);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -1;
                }
                got += (size_t)k;
        }
        static const char hx[] = "0123456789abcdef";
        for (size_t i = 0; i < sizeof(r); i++) {
                out[2 * i] = hx[r[i] >> 4];
                out[2 * i + 1] = hx[r[i] & 15];
        }
        out[32] = '\0';
        return 0;
}

/*
 * One round trip for the whole batch:
 *
 *   [queued statements;]
 *   INSERT INTO kinbox_inbox (...) VALUES (...), ... , tx_token = T
 *     ON DUPLICATE KEY UPDATE message_id = message_id;
 *   SELECT message_id FROM kinbox_inbox WHERE consumer = C AND tx_token = T
 *
 * A row that already existed keeps its old token (the no-op update does
 * not touch it), and a second occurrence inside the batch hits the row the
 * first one just inserted, so exactly the ids inserted by this call come
 * back. Each returned id marks its first occurrence in the batch as new.
 * Unlike INSERT IGNORE, any other error (bad data, lock wait, deadlock)
 * still fails the statement.
 *
 * MariaDB 10.5+ has RETURNING, which returns only the rows an INSERT
 * IGNORE really inserted: one statement, no token to write or index.
 * IGNORE would also turn a too-long value into a truncated one, so every
 * value is checked against its column first; the ints and timestamps
 * cannot fail, and lock waits and deadlocks are never ignored.
 */
static int
my_inbox_insert(kinbox__db_t *db, const char *consumer, size_t n,
                const struct kinbox__inbox_row *rows, bool *is_new)
{
        struct mystate *s = st_get(db);
        MYSQL *m = db->native;
        char tok[33];
        int rc;

        for (size_t i = 0; i < n; i++)
                is_new[i] = false;
        if (!m || !s)
                return my_down_err(db);
        if (!db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: inbox insert outside a transaction");
                return KINBOX_ERR_STATE;
        }
        if (n == 0)
                return KINBOX_OK;
        for (size_t i = 0; i < n; i++) {
                size_t l = rows[i].id ? strlen(rows[i].id) : 0;
                if (!rows[i].id || l > MY_ID_MAX) {
                        kinbox__db_seterr(
                            db, KINBOX_ERR_INVALID, "", 0, (int)i,
                            "MySQL: message id %s (%zu bytes) at offset "
                            "%lld: the inbox holds at most %d bytes",
                            rows[i].id ? "too long" : "missing", l,
                            (long long)rows[i].offset, MY_ID_MAX);
                        return KINBOX_ERR_INVALID;
                }
        }
        /* Checked here so that INSERT IGNORE (below) can only ignore
         * duplicates, never truncate a value. */
        if (utf8_chars(consumer) > MY_NAME_MAX) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1,
                                  "MySQL: consumer name longer than %d "
                                  "characters",
                                  MY_NAME_MAX);
                return KINBOX_ERR_INVALID;
        }
        for (size_t i = 0; i < n; i++)
                if (rows[i].topic &&
                    utf8_chars(rows[i].topic) > MY_TOPIC_MAX) {
                        kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0,
                                          (int)i,
                                          "MySQL: topic name longer than "
                                          "%d characters",
                                          MY_TOPIC_MAX);
                        return KINBOX_ERR_INVALID;
                }
        if (!s->returning && make_token(tok)) {
                kinbox__db_seterr(db, KINBOX_ERR_DB, "", 0, -1,
                                  "MySQL: getrandom failed: %s",
                                  strerror(errno));
                return KINBOX_ERR_DB;
        }

        kinbox__idref_t *ix = kinbox__inbox_sorted(rows, n);
        if (!ix)
                return my_oom(db);
        kinbox__buf_t *b = &s->tmp;
        kinbox__buf_reset(b);
        kinbox__buf_adds(b, s->returning
                                ? "INSERT IGNORE INTO kinbox_inbox (consumer, "
                                  "message_id, topic, kafka_partition, "
                                  "kafka_offset, processed_at) VALUES "
                                : "INSERT INTO kinbox_inbox (consumer, "
                                  "message_id, topic, kafka_partition, "
                                  "kafka_offset, tx_token, processed_at) "
                                  "VALUES ");
        for (size_t k = 0; k < n; k++) {
                size_t i = ix[k].idx;
                kinbox__buf_adds(b, k ? ",\n(" : "\n(");
                append_literal(m, b, consumer, strlen(consumer), false);
                kinbox__buf_add(b, ",", 1);
                /* Binary: message_id is VARBINARY and ids are bytes; a
                 * text literal would go through charset validation. */
                append_literal(m, b, rows[i].id, strlen(rows[i].id), true);
                kinbox__buf_add(b, ",", 1);
                append_literal(m, b, rows[i].topic,
                               rows[i].topic ? strlen(rows[i].topic) : 0,
                               false);
                if (s->returning)
                        kinbox__buf_printf(b,
                                           ",%ld,%lld,CURRENT_TIMESTAMP(6))",
                                           (long)rows[i].partition,
                                           (long long)rows[i].offset);
                else
                        kinbox__buf_printf(
                            b, ",%ld,%lld,'%s',CURRENT_TIMESTAMP(6))",
                            (long)rows[i].partition, (long long)rows[i].offset,
                            tok);
        }
        int nstmts = 1;
        if (s->returning) {
                kinbox__buf_adds(b, "\nRETURNING message_id");
        } else {
                kinbox__buf_adds(b, "\nON DUPLICATE KEY UPDATE message_id "
                                    "= message_id;\nSELECT message_id "
                                    "FROM kinbox_inbox WHERE consumer = ");
                append_literal(m, b, consumer, strlen(consumer), false);
                kinbox__buf_printf(b, " AND tx_token = '%s'", tok);
                nstmts = 2;
        }
        struct kinbox_rows_s *r = NULL;
        if (b->oom) {
                kinbox__buf_free(b);
                kinbox__buf_init(b);
                rc = my_oom(db);
                goto out;
        }
        if (s->ntags && s->q.len + b->len + 2 > s->flush_at &&
            (rc = q_send(db, NULL, false)))
                goto out;
        if ((rc = q_append(db, b->p, b->len, -1, nstmts)) ||
            (rc = q_send(db, &r, false)))
                goto out;
        for (size_t k = 0; k < r->nrows; k++) {
                const char *v = r->values[k * (size_t)r->ncols];
                if (v)
                        kinbox__inbox_mark_new(ix, n, v, is_new);
        }
out:
        free(ix);
        kinbox_rows_destroy(r);
        return rc;
}

/*
 * Dialect. outbox_append: MySQL has no RETURNING, so the statement is two
 * statements sent together through query(): the insert, whose affected-
 * row count is 1 for a new row and 0 for a duplicate left untouched by
 * "id = id" (kinbox never sets CLIENT_FOUND_ROWS, which would report 1),
 * then a SELECT that returns LAST_INSERT_ID() only when ROW_COUNT() says a
 * row was inserted. So, as on PostgreSQL: one row (the id) when new, no
 * row for a duplicate. On a caller's own MYSQL * without multi-statements,
 * send the two parts separately in the same session (the SELECT must come
 * directly after the INSERT), or read mysql_affected_rows() == 1 and
 * mysql_insert_id() after the INSERT alone.
 */
static const struct kinbox__sql my_sql = {
    .offsets_upsert =
        "INSERT INTO kinbox_offsets (consumer, topic, kafka_partition, "
        "next_offset, updated_at) VALUES ($1, $2, $3, $4, "
        "CURRENT_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE "
        "next_offset = GREATEST(next_offset, VALUES(next_offset)), "
        "updated_at = CURRENT_TIMESTAMP(6)",
    .dead_letter_insert =
        "INSERT INTO kinbox_dead_letter (consumer, message_id, topic, "
        "kafka_partition, kafka_offset, msg_key, headers, payload, error, "
        "attempts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    .outbox_append =
        "INSERT INTO kinbox_outbox (kind, destination, idem_key, "
        "aggregate_id, payload, headers, max_attempts) VALUES ($1, $2, "
        "$3, $4, $5, $6, $7) ON DUPLICATE KEY UPDATE id = id;\n"
        "SELECT LAST_INSERT_ID() AS id FROM DUAL WHERE ROW_COUNT() = 1",
    .try_lock = "SELECT GET_LOCK($1, 0)",
    .unlock = "SELECT RELEASE_LOCK($1)",
    .migrations_table =
        "CREATE TABLE IF NOT EXISTS kinbox_schema_migrations ("
        " component VARCHAR(200) NOT NULL, version INT NOT NULL,"
        " name VARCHAR(200) NOT NULL,"
        " applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
        " PRIMARY KEY (component, version)) ENGINE = InnoDB",
    .migrations_exists =
        "SELECT COUNT(*) FROM information_schema.tables WHERE "
        "table_schema = DATABASE() AND "
        "table_name = 'kinbox_schema_migrations'",
    .script_begin = "",
    .script_commit = "",
    /* INTERVAL in microseconds keeps sub-second ages exact. */
    .prune_count =
        {"SELECT count(*) FROM kinbox_inbox WHERE processed_at < "
         "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND",
         "SELECT count(*) FROM kinbox_outbox WHERE status = 'sent' AND "
         "sent_at < CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND"},
    .prune_delete =
        {"DELETE FROM kinbox_inbox WHERE processed_at < "
         "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND ORDER "
         "BY processed_at LIMIT %" PRId64,
         "DELETE FROM kinbox_outbox WHERE status = 'sent' AND sent_at < "
         "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND ORDER "
         "BY sent_at LIMIT %" PRId64},
    .prune_age_scale = 1000,
    .dead_letter_lock = "SELECT consumer, message_id, topic, kafka_partition, "
                        "kafka_offset, msg_key, headers, payload, status FROM "
                        "kinbox_dead_letter WHERE id = $1 FOR UPDATE",
    .inbox_insert_one =
        "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
        "kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4, $5)",
    .dead_letter_replayed =
        "UPDATE kinbox_dead_letter SET status = 'replayed' WHERE id = $1",
    .outbox_gauges =
        "SELECT destination, SUM(status = 'pending'),"
        " COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN status ="
        " 'pending' THEN created_at END), CURRENT_TIMESTAMP(6)) /"
        " 1000000, 0), SUM(status = 'dead')"
        " FROM kinbox_outbox WHERE status IN ('pending', 'dead')"
        " GROUP BY destination",
    .outbox_pause =
        "INSERT INTO kinbox_outbox_paused (destination) VALUES ($1) ON "
        "DUPLICATE KEY UPDATE destination = destination",
    .outbox_wake = NULL,
    .outbox_summary =
        "SELECT destination, SUM(status = 'pending'),"
        " COALESCE(TIMESTAMPDIFF(SECOND, MIN(CASE WHEN status ="
        " 'pending' THEN created_at END), CURRENT_TIMESTAMP(6)), 0),"
        " SUM(status = 'dead'),"
        " SUM(status = 'sent' AND sent_at >= CURRENT_TIMESTAMP(6) -"
        "  INTERVAL 1 HOUR),"
        " EXISTS (SELECT 1 FROM kinbox_outbox_paused z"
        "  WHERE z.destination = o.destination)"
        " FROM kinbox_outbox o GROUP BY destination ORDER BY destination",
    .outbox_stuck =
        "SELECT destination, count(*), min(id),"
        " TIMESTAMPDIFF(SECOND, min(created_at), CURRENT_TIMESTAMP(6))"
        " FROM kinbox_outbox WHERE status = 'pending' AND created_at <"
        " CURRENT_TIMESTAMP(6) - INTERVAL ($1 * 1000) MICROSECOND"
        " GROUP BY destination ORDER BY destination",
    .dead_letter_gauges =
        "SELECT consumer, COUNT(*), TIMESTAMPDIFF(MICROSECOND, "
        "MIN(dead_at), CURRENT_TIMESTAMP(6)) / 1000000 FROM "
        "kinbox_dead_letter WHERE status = 'dead' GROUP BY consumer",
    .hold_upsert =
        "INSERT INTO kinbox_hold (consumer, topic, kafka_partition, "
        "hold_key, blocker_id) SELECT $1, $2, $3, $4, MAX(id) FROM "
        "kinbox_dead_letter WHERE consumer = $1 AND topic = $2 AND "
        "kafka_partition = $3 AND kafka_offset = $5 ON DUPLICATE KEY "
        "UPDATE blocker_id = kinbox_hold.blocker_id",
    .parked_delete = "DELETE FROM kinbox_parked WHERE id = $1",
    .hold_gauges =
        "SELECT consumer, SUM(parked), SUM(held), MAX(age) FROM ("
        " SELECT consumer, COUNT(*) AS parked, 0 AS held,"
        "  TIMESTAMPDIFF(MICROSECOND, MIN(parked_at), CURRENT_TIMESTAMP(6))"
        "  / 1000000 AS age FROM kinbox_parked GROUP BY consumer"
        " UNION ALL SELECT consumer, 0, COUNT(*), 0 FROM kinbox_hold"
        "  GROUP BY consumer) x GROUP BY consumer",
};

const struct kinbox__db_ops kinbox__mysql_ops = {
    .name = "mysql",
    .backend = KINBOX_BACKEND_MYSQL,
    .connect = my_connect,
    .disconnect = my_disconnect,
    .begin = my_begin,
    .exec = my_exec,
    .exec_values = my_exec_values,
    .query = my_query,
    .flush = my_flush,
    .commit = my_commit,
    .rollback = my_rollback,
    .savepoint = my_savepoint,
    .rollback_to = my_rollback_to,
    .native = my_native,
    .script = my_script,
    .inbox_insert = my_inbox_insert,
    .sql = &my_sql,
    .outbox = &kinbox__mysql_outbox_ops,
};
