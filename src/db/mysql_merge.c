/*
 * mysql_merge.c -- single-row INSERTs merged into multi-row ones (see
 * below for when that is safe).
 */
#include "mysql_merge.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/*
 * Inside a consumer worker's transaction (db->coalesce), single-row
 *
 *   INSERT [IGNORE] [INTO] tbl [(cols)] VALUES (tuple)
 *       [ON DUPLICATE KEY UPDATE clause]
 *
 * statements that come from the same SQL text are merged into one
 * multi-row INSERT: a per-message handler's inserts cost one statement per
 * batch instead of one per message (the server parses and executes each
 * statement of a multi-statement packet on its own; docs/mysql.md).
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
/* [schema.]table after INSERT [IGNORE] [INTO], then an optional column
 * list (names only): false when the text is not of that form. */
static bool
m_target(struct mtmpl *t, const char *s, size_t *i)
{
        char *a = NULL, *b = NULL;
        if (!m_ident(s, i, &a))
                return false;
        if (s[*i] == '.') {
                (*i)++;
                if (!m_ident(s, i, &b)) {
                        free(a);
                        return false;
                }
                t->schema = a;
                t->table = b;
        } else {
                t->table = a;
        }
        m_ws(s, i);
        if (s[*i] != '(')
                return true;
        (*i)++;
        for (;;) {
                char *col = NULL;
                m_ws(s, i);
                if (!m_ident(s, i, &col))
                        return false;
                free(col);
                m_ws(s, i);
                if (s[*i] == ',') {
                        (*i)++;
                        continue;
                }
                if (s[*i] != ')')
                        return false;
                (*i)++;
                m_ws(s, i);
                return true;
        }
}

/* What follows the tuple, from j: nothing, or ON DUPLICATE KEY UPDATE and
 * a clause that ends the text (maybe with one ';'). */
static bool
m_tail(struct mtmpl *t, const char *s, size_t j)
{
        if (!s[j]) {
                t->tail_len = 0;
                return true;
        }
        static const char *const kws[] = {"ON", "DUPLICATE", "KEY", "UPDATE"};
        for (size_t k = 0; k < 4; k++) {
                if (k)
                        m_ws(s, &j);
                if (!m_kw(s, &j, kws[k]))
                        return false;
        }
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
        if (fine)
                t->tail_len = end - t->tail_off;
        return fine;
}

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
        if (!m_target(t, s, &i))
                return;
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
        t->ok = m_tail(t, s, j);
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
        kinbox__my_m_tmpl_clear(t);
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
                        kinbox__my_append_literal(m, &q, t->schema,
                                                  strlen(t->schema), false);
                else
                        kinbox__buf_adds(&q, "DATABASE()");
                kinbox__buf_adds(&q, " AND ");
                kinbox__buf_adds(&q, where[k][1]);
                kinbox__buf_adds(&q, " = ");
                kinbox__my_append_literal(m, &q, t->table, strlen(t->table),
                                          false);
                kinbox__buf_adds(&q, ")");
        }
        if (q.oom) {
                kinbox__buf_free(&q);
                return 0;
        }
        struct kinbox_rows_s *r = NULL;
        int tag = -1;
        int rc = kinbox__my_roundtrip(db, q.p, q.len, &tag, 1, &r, false);
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
int
kinbox__my_m_flush(kinbox__db_t *db)
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
                                 ? kinbox__my_oom(db)
                                 : kinbox__my_q_append_raw(
                                       db, g->text.p, g->text.len, g->tag, 1);
                }
                if (g->text.oom) /* reset keeps the flag; free clears it */
                        kinbox__buf_free(&g->text);
                kinbox__buf_reset(&g->text);
        }
        return rc;
}

/*
 * exec() inside a transaction: add the statement to a group, or return
 * M_NOT_MERGED for the caller to queue it as it is (after the open groups).
 */
/* The open group for template t, or a new one (NULL: the groups were
 * sent first and *rc says how that went). */
static struct mgroup *
m_group_for(kinbox__db_t *db, struct mergestate *ms, struct mtmpl *t, int tag,
            int *rc)
{
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
                if ((*rc = kinbox__my_m_flush(db)))
                        return NULL;
                g = NULL;
        }
        if (g)
                return g;
        g = &ms->groups[ms->ngroups++];
        g->t = t;
        g->tag = tag;
        g->first = tag;
        g->rows = 0;
        kinbox__buf_reset(&g->text);
        kinbox__buf_add(&g->text, t->sql, t->tup_off);
        return g;
}

/* Render one row into group g (tag: its message's). */
static int
m_add_row(kinbox__db_t *db, struct mergestate *ms, struct mgroup *g, int n,
          const kinbox__param_t *p, int tag)
{
        size_t mark = 0;
        int old_tag = tag;
        if (g->rows) {
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
        int rc = kinbox__my_render(db->native, &g->text, g->t->tuple, n, p,
                                   &count, err, sizeof(err));
        if (!rc && g->text.oom) {
                /* The transaction is lost anyway: drop every group. */
                for (size_t k = 0; k < ms->ngroups; k++)
                        kinbox__buf_free(&ms->groups[k].text);
                kinbox__my_m_drop(ms);
                return kinbox__my_oom(db);
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
        return KINBOX_OK;
}

int
kinbox__my_m_try(kinbox__db_t *db, const char *sql, int n,
                 const kinbox__param_t *p, int tag)
{
        struct mystate *s = st_get(db);
        int rc = KINBOX_OK;
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
                if ((rc = kinbox__my_m_flush(db)))
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
        struct mgroup *g = m_group_for(db, ms, t, tag, &rc);
        if (!g)
                return rc;
        if ((rc = m_add_row(db, ms, g, n, p, tag)))
                return rc;
        if (s->q.len + ms->bytes > s->flush_at)
                return (rc = kinbox__my_m_flush(db)) ? rc : M_SEND_NOW;
        return KINBOX_OK;
}
