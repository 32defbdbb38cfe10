/*
 * db.c -- backend-neutral parts of the database layer: URLs, rows, errors.
 */
#include "../db.h"
#include "../internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
kinbox__dburl_free(kinbox__dburl_t *u)
{
        free(u->user);
        free(u->password);
        free(u->host);
        free(u->dbname);
        free(u->params);
        memset(u, 0, sizeof(*u));
}

/* Decode %XX escapes in place-copied substring. */
static char *
pct_dup(const char *s, size_t n)
{
        char *o = malloc(n + 1), *q = o;
        if (!o)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                if (s[i] == '%' && i + 2 < n) {
                        char hex[3] = {s[i + 1], s[i + 2], 0};
                        char *end;
                        long v = strtol(hex, &end, 16);
                        if (end == hex + 2) {
                                *q++ = (char)v;
                                i += 2;
                                continue;
                        }
                }
                *q++ = s[i];
        }
        *q = '\0';
        return o;
}

/* The scheme: sets u->backend and returns what follows "://", or NULL
 * with errstr. */
static const char *
url_scheme(const char *url, kinbox__dburl_t *u, char *errstr, size_t sz)
{
        if (!strncmp(url, "postgresql://", 13)) {
                u->backend = KINBOX_BACKEND_POSTGRESQL;
                return url + 13;
        }
        if (!strncmp(url, "postgres://", 11)) {
                u->backend = KINBOX_BACKEND_POSTGRESQL;
                return url + 11;
        }
        if (!strncmp(url, "mysql://", 8)) {
                u->backend = KINBOX_BACKEND_MYSQL;
                return url + 8;
        }
        /* Never echo the value: it can be libpq's keyword form
         * ("host=... password=..."), or a URL with a password. Only a
         * scheme-shaped prefix is named. */
        size_t n = strspn(url, "abcdefghijklmnopqrstuvwxyz"
                               "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               "0123456789+.-");
        if (n && n <= 32 && !strncmp(url + n, "://", 3))
                kinbox__errstr(errstr, sz,
                               "database.url: unsupported scheme "
                               "\"%.*s://\" (use postgresql:// or "
                               "mysql://)",
                               (int)n, url);
        else
                kinbox__errstr(errstr, sz,
                               "database.url is not a postgresql:// "
                               "or mysql:// URL (libpq's "
                               "\"key=value\" form is not supported; "
                               "the value is not shown as it may "
                               "hold a password)");
        return NULL;
}

/* The host and port of p .. hostend into u; -1 when malformed. A
 * PostgreSQL list of hosts (host1:port1,host2:port2, which libpq tries in
 * turn, see target_session_attrs) is kept whole in u->host. */
static int
host_port(kinbox__dburl_t *u, const char *p, const char *hostend)
{
        const char *colon = NULL;
        if (u->backend == KINBOX_BACKEND_POSTGRESQL &&
            memchr(p, ',', (size_t)(hostend - p))) {
                u->host = kinbox__strndup(p, (size_t)(hostend - p));
                return 0;
        }
        if (*p == '[') {
                const char *rb = memchr(p, ']', (size_t)(hostend - p));
                if (!rb)
                        return -1;
                u->host = kinbox__strndup(p + 1, (size_t)(rb - p - 1));
                if (rb + 1 < hostend && rb[1] == ':')
                        colon = rb + 1;
        } else {
                colon = memchr(p, ':', (size_t)(hostend - p));
                size_t hl = (size_t)((colon ? colon : hostend) - p);
                if (hl)
                        u->host = kinbox__strndup(p, hl);
        }
        if (colon) {
                char *end;
                long port = strtol(colon + 1, &end, 10);
                if (end != hostend || port <= 0 || port > 65535)
                        return -1;
                u->port = (int)port;
        }
        return 0;
}

int
kinbox__dburl_split(const char *url, kinbox__dburl_t *u, char *errstr,
                    size_t sz)
{
        memset(u, 0, sizeof(*u));
        if (!url || !*url) {
                kinbox__errstr(errstr, sz, "database.url is not set");
                return -1;
        }
        const char *p = url_scheme(url, u, errstr, sz);
        if (!p)
                return -1;
        const char *slash = strchr(p, '/');
        const char *auth_end = slash ? slash : p + strlen(p);
        const char *at = NULL;
        for (const char *q = p; q < auth_end; q++)
                if (*q == '@')
                        at = q;
        if (at) {
                const char *colon = memchr(p, ':', (size_t)(at - p));
                if (colon) {
                        u->user = pct_dup(p, (size_t)(colon - p));
                        u->password =
                            pct_dup(colon + 1, (size_t)(at - colon - 1));
                } else {
                        u->user = pct_dup(p, (size_t)(at - p));
                }
                p = at + 1;
        }
        if (host_port(u, p, auth_end))
                goto bad;
        if (slash) {
                const char *q = strchr(slash + 1, '?');
                size_t dl = q ? (size_t)(q - slash - 1) : strlen(slash + 1);
                if (dl)
                        u->dbname = pct_dup(slash + 1, dl);
                if (q)
                        u->params = kinbox__strdup(q + 1);
        }
        return 0;
bad:
        kinbox__dburl_free(u);
        kinbox__errstr(errstr, sz, "database.url: cannot parse host/port");
        return -1;
}

kinbox__db_t *
kinbox__db_new_ops(const struct kinbox__db_ops *ops, const char *url,
                   const char *password, char *errstr, size_t sz)
{
        kinbox__dburl_t u;
        if (kinbox__dburl_split(url, &u, errstr, sz))
                return NULL;
        bool same = u.backend == ops->backend;
        kinbox__dburl_free(&u);
        if (!same) {
                kinbox__errstr(errstr, sz, "database.url: not a %s URL",
                               ops->name);
                return NULL;
        }
        kinbox__db_t *db = kinbox__calloc(1, sizeof(*db));
        if (!db) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        db->backend = ops->backend;
        db->ops = ops;
        db->url = kinbox__strdup(url);
        db->password = kinbox__strdup(password);
        db->err.tag = db->err.stmt_tag = -1;
        return db;
}

void
kinbox__db_destroy(kinbox__db_t *db)
{
        if (!db)
                return;
        db->ops->disconnect(db);
        if (db->ops->release)
                db->ops->release(db);
        free(db->url);
        free(db->password);
        free(db);
}

int
kinbox__db_connect(kinbox__db_t *db)
{
        return db->ops->connect(db);
}

int
kinbox__db_query(kinbox__db_t *db, const char *sql, int n,
                 const kinbox__param_t *p, struct kinbox_rows_s **out)
{
        if (out)
                *out = NULL;
        if (!db->native) {
                int rc = db->ops->connect(db);
                if (rc)
                        return rc;
        }
        return db->ops->query(db, sql, n, p, -1, out);
}

int
kinbox__db_peek(kinbox__db_t *db, size_t ahead)
{
        return db->ops->peek ? db->ops->peek(db, ahead) : 0;
}

void
kinbox__db_abandon(kinbox__db_t *db)
{
        if (db->in_tx)
                db->ops->rollback(db);
}

int
kinbox__db_end(kinbox__db_t *db, int rc)
{
        if (!rc)
                rc = db->ops->commit(db);
        if (rc)
                kinbox__db_abandon(db);
        return rc;
}

int
kinbox__db_queryv(kinbox__db_t *db, const char *sql, int n,
                  const char *const *vals, struct kinbox_rows_s **out)
{
        kinbox__param_t ps[32];
        if (n > (int)KINBOX__ARRAY_SIZE(ps)) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1,
                                  "too many parameters (%d)", n);
                return KINBOX_ERR_INVALID;
        }
        for (int i = 0; i < n; i++)
                ps[i] = (kinbox__param_t){vals[i], 0, 0};
        return kinbox__db_query(db, sql, n, ps, out);
}

const char *
kinbox__db_pick(const kinbox__db_t *db, const char *postgresql,
                const char *mysql)
{
        return db->ops->backend == KINBOX_BACKEND_MYSQL ? mysql : postgresql;
}

int
kinbox__db_exists(kinbox__db_t *db, const char *sql, bool *yes)
{
        struct kinbox_rows_s *rows = NULL;
        int rc = db->ops->query(db, sql, 0, NULL, -1, &rows);
        *yes = !rc && rows && rows->nrows > 0;
        kinbox_rows_destroy(rows);
        return rc;
}

int
kinbox__db_begin(kinbox__db_t *db, kinbox__attr_t *attr)
{
        db->attr = attr;
        return db->ops->begin(db);
}

void
kinbox__attr_free(kinbox__attr_t *a)
{
        free(a->none_tags);
        free(a->drops);
        a->none_tags = NULL;
        a->drops = NULL;
        a->nnone = a->capnone = a->ndrops = a->capdrops = 0;
}

void
kinbox__db_note_none(kinbox__db_t *db, int tag)
{
        kinbox__attr_t *a = db->attr;
        if (!a)
                return;
        if (a->nnone == a->capnone) {
                size_t cap = a->capnone ? a->capnone * 2 : 64;
                int *t = realloc(a->none_tags, cap * sizeof(*t));
                if (!t)
                        return; /* counted as processed, not as duplicate */
                a->none_tags = t;
                a->capnone = cap;
        }
        a->none_tags[a->nnone++] = tag;
}

static void *
native_of(kinbox__db_t *db, kinbox_backend_t b, bool *down)
{
        void *n = db->ops->backend == b ? db->ops->native(db) : NULL;
        *down = db->ops->backend == b && !n;
        return n;
}

struct pg_conn *
kinbox__db_pgconn(kinbox__db_t *db, bool *down)
{
        return native_of(db, KINBOX_BACKEND_POSTGRESQL, down);
}

struct st_mysql *
kinbox__db_mysql(kinbox__db_t *db, bool *down)
{
        return native_of(db, KINBOX_BACKEND_MYSQL, down);
}

bool
kinbox__db_resource_error(const kinbox__dberr_t *e)
{
        static const int my[] = {3, 5, 1021, 1037, 1038, 1040, 1041, 1114};
        if (!strncmp(e->sqlstate, "53", 2))
                return true;
        for (size_t i = 0; i < sizeof(my) / sizeof(my[0]); i++)
                if (e->vendor == my[i])
                        return true;
        return false;
}

const kinbox__migration_t *
kinbox__db_migration(const kinbox__db_t *db, const kinbox__migration_t *all,
                     const kinbox__migration_t *m)
{
        for (m = m ? m + 1 : all; m->name; m++)
                if (m->backend == (int)db->ops->backend)
                        return m;
        return NULL;
}

void
kinbox__db_seterr(kinbox__db_t *db, int code, const char *sqlstate, int vendor,
                  int tag, const char *fmt, ...)
{
        db->err.code = code;
        snprintf(db->err.sqlstate, sizeof(db->err.sqlstate), "%s",
                 sqlstate ? sqlstate : "");
        db->err.vendor = vendor;
        db->err.tag = tag;
        db->err.stmt_tag = tag;
        db->err.suspect = 0;
        db->err.permanent = false;
        db->err.deploy = false;
        db->err.stmt[0] = '\0';
        db->err.constraint[0] = '\0';
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(db->err.msg, sizeof(db->err.msg), fmt, ap);
        va_end(ap);
        /* One line: libpq's and the servers' line breaks and the tabs
         * after them become one space; no trailing space. */
        char *w = db->err.msg;
        for (const char *c = db->err.msg; *c; c++) {
                bool ws = *c == '\n' || *c == '\r' || *c == '\t' || *c == ' ';
                if (ws && (w == db->err.msg || w[-1] == ' '))
                        continue;
                *w++ = ws ? ' ' : *c;
        }
        while (w > db->err.msg && w[-1] == ' ')
                w--;
        *w = '\0';
}

struct kinbox_rows_s *
kinbox__rows_new(size_t nrows, int ncols)
{
        struct kinbox_rows_s *r = kinbox__calloc(1, sizeof(*r));
        if (!r)
                return NULL;
        r->nrows = nrows;
        r->ncols = ncols;
        size_t cells = nrows * (size_t)(ncols > 0 ? ncols : 0);
        r->values = kinbox__calloc(cells ? cells : 1, sizeof(char *));
        r->lens = kinbox__calloc(cells ? cells : 1, sizeof(size_t));
        r->names =
            kinbox__calloc(ncols > 0 ? (size_t)ncols : 1, sizeof(char *));
        if (!r->values || !r->lens || !r->names) {
                kinbox_rows_destroy(r);
                return NULL;
        }
        return r;
}

int
kinbox__rows_set(struct kinbox_rows_s *r, size_t row, int col, const char *v,
                 size_t len)
{
        size_t i = row * (size_t)r->ncols + (size_t)col;
        if (!v)
                return 0;
        r->values[i] = kinbox__strndup(v, len);
        r->lens[i] = len;
        return r->values[i] ? 0 : -1;
}

int
kinbox__rows_set_name(struct kinbox_rows_s *r, int col, const char *n)
{
        r->names[col] = kinbox__strdup(n);
        return r->names[col] ? 0 : -1;
}

size_t
kinbox_rows_count(const kinbox_rows_t *rows)
{
        return rows ? rows->nrows : 0;
}

int
kinbox_rows_columns(const kinbox_rows_t *rows)
{
        return rows ? rows->ncols : 0;
}

const char *
kinbox_rows_column_name(const kinbox_rows_t *rows, int col)
{
        if (!rows || col < 0 || col >= rows->ncols || !rows->names)
                return NULL;
        return rows->names[col];
}

const char *
kinbox_rows_value(const kinbox_rows_t *rows, size_t row, int col,
                  size_t *sizep)
{
        if (sizep)
                *sizep = 0;
        if (!rows || row >= rows->nrows || col < 0 || col >= rows->ncols)
                return NULL;
        size_t i = row * (size_t)rows->ncols + (size_t)col;
        if (sizep)
                *sizep = rows->lens[i];
        return rows->values[i];
}

void
kinbox_rows_destroy(kinbox_rows_t *rows)
{
        if (!rows)
                return;
        size_t cells =
            rows->nrows * (size_t)(rows->ncols > 0 ? rows->ncols : 0);
        if (rows->values)
                for (size_t i = 0; i < cells; i++)
                        free(rows->values[i]);
        if (rows->names)
                for (int i = 0; i < rows->ncols; i++)
                        free(rows->names[i]);
        free(rows->values);
        free(rows->lens);
        free(rows->names);
        free(rows);
}

static int
idref_cmp(const void *a, const void *b)
{
        const kinbox__idref_t *x = a, *y = b;
        int c = strcmp(x->id, y->id);
        if (c)
                return c;
        return x->idx < y->idx ? -1 : x->idx > y->idx;
}

kinbox__idref_t *
kinbox__inbox_sorted(const struct kinbox__inbox_row *rows, size_t n)
{
        kinbox__idref_t *ix = malloc((n ? n : 1) * sizeof(*ix));
        if (!ix)
                return NULL;
        for (size_t i = 0; i < n; i++)
                ix[i] = (kinbox__idref_t){rows[i].id, i};
        qsort(ix, n, sizeof(*ix), idref_cmp);
        return ix;
}

void
kinbox__inbox_mark_new(const kinbox__idref_t *sorted, size_t n, const char *id,
                       bool *is_new)
{
        size_t lo = 0, hi = n;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (strcmp(sorted[mid].id, id) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo < n && strcmp(sorted[lo].id, id) == 0)
                is_new[sorted[lo].idx] = true;
}

/* Append piece to b with its $N placeholders moved up by base (quoted
 * text, quoted names and comments are copied as they are). */
static void
renumber(kinbox__buf_t *b, const char *piece, int base)
{
        for (const char *c = piece; *c;) {
                if (*c == '\'' || *c == '"') {
                        const char *e = c + 1;
                        while (*e && (*e != *c || e[1] == *c))
                                e += *e == *c ? 2 : 1;
                        if (*e)
                                e++;
                        kinbox__buf_add(b, c, (size_t)(e - c));
                        c = e;
                } else if (c[0] == '-' && c[1] == '-') {
                        size_t n = strcspn(c, "\n");
                        kinbox__buf_add(b, c, n);
                        c += n;
                } else if (c[0] == '/' && c[1] == '*') {
                        const char *e = strstr(c + 2, "*/");
                        size_t n = e ? (size_t)(e + 2 - c) : strlen(c);
                        kinbox__buf_add(b, c, n);
                        c += n;
                } else if (*c == '$' && c[1] >= '0' && c[1] <= '9') {
                        char *e;
                        long k = strtol(c + 1, &e, 10);
                        char num[24];
                        int n =
                            snprintf(num, sizeof(num), "$%ld", k + (long)base);
                        kinbox__buf_add(b, num, (size_t)n);
                        c = e;
                } else {
                        kinbox__buf_add(b, c++, 1);
                }
        }
}

/* head, tuple once per row ($N of row r moved up by r * nper), tail. */
static char *
values_sql(const char *head, const char *tuple, const char *tail, int nper,
           size_t nrows)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_add(&b, head, strlen(head));
        for (size_t r = 0; r < nrows; r++) {
                if (r)
                        kinbox__buf_add(&b, ", ", 2);
                renumber(&b, tuple, (int)r * nper);
        }
        kinbox__buf_add(&b, tail, strlen(tail));
        kinbox__buf_add(&b, "", 1);
        if (b.oom) {
                kinbox__buf_free(&b);
                return NULL;
        }
        return b.p;
}

int
kinbox__db_query_hinted(kinbox__db_t *db, const char *sql, int n,
                        const kinbox__param_t *p, int tag,
                        const char *const *keys, const int *tags, size_t nrows,
                        struct kinbox_rows_s **out)
{
        kinbox__attr_t *a = db->attr;
        if (keys && a) {
                a->hint_keys = keys;
                a->hint_tags = tags;
                a->hint_n = nrows;
        }
        int rc = db->ops->query(db, sql, n, p, tag, out);
        if (a) {
                a->hint_keys = NULL;
                a->hint_tags = NULL;
                a->hint_n = 0;
        }
        return rc;
}

/* 1 + tags[r] of the first row r with an owner whose key is a whole field
 * of row; 0 when none matches. */
static int
keys_suspect(const char *const *keys, const int *tags, size_t n,
             const char *row)
{
        if (!row || row[0] != '(')
                return 0;
        for (size_t r = 0; r < n; r++) {
                const char *k = keys[r];
                size_t kl = k ? strlen(k) : 0;
                /* A row without an owner (the call's own tag) names no
                 * one. */
                if (!kl || tags[r] < 0 || (tags[r] & KINBOX__TAG_GROUP))
                        continue;
                /* k as a field: after "(" or ", ", before ", " or ")".
                 * A value that merely looks like k (another column, a
                 * field with ", " inside) only makes a wrong hint. */
                for (const char *f = row + 1; (f = strstr(f, k)); f++) {
                        bool open =
                            f == row + 1 ||
                            (f >= row + 3 && f[-2] == ',' && f[-1] == ' ');
                        const char *e = f + kl;
                        bool close =
                            e[0] == ')' || (e[0] == ',' && e[1] == ' ');
                        if (open && close)
                                return 1 + tags[r];
                }
        }
        return 0;
}

int
kinbox__db_row_suspect(const kinbox__db_t *db, const char *row)
{
        const kinbox__attr_t *a = db->attr;
        return a ? keys_suspect(a->hint_keys, a->hint_tags, a->hint_n, row)
                 : 0;
}

kinbox__claims_t *
kinbox__claims_new(const char *const *keys, const int *tags, size_t n)
{
        size_t bytes =
            sizeof(kinbox__claims_t) + n * (sizeof(int) + sizeof(char *));
        for (size_t r = 0; r < n; r++)
                bytes += (keys[r] ? strlen(keys[r]) : 0) + 1;
        kinbox__claims_t *c = malloc(bytes);
        if (!c)
                return NULL;
        c->n = n;
        c->keys = (char **)(c + 1);
        c->tags = (int *)(c->keys + n);
        char *o = (char *)(c->tags + n);
        for (size_t r = 0; r < n; r++) {
                size_t l = keys[r] ? strlen(keys[r]) : 0;
                c->tags[r] = tags[r];
                c->keys[r] = o;
                memcpy(o, keys[r] ? keys[r] : "", l + 1);
                o += l + 1;
        }
        return c;
}

void
kinbox__claims_free(kinbox__claims_t *c)
{
        free(c);
}

int
kinbox__claims_suspect(const kinbox__claims_t *c, const char *row)
{
        return keys_suspect((const char *const *)c->keys, c->tags, c->n, row);
}

/* A returned key, and whether a row took it already. */
typedef struct gotkey {
        const char *k;
        bool taken;
} gotkey_t;

static int
gotkey_cmp(const void *a, const void *b)
{
        return strcmp(((const gotkey_t *)a)->k, ((const gotkey_t *)b)->k);
}

/* A row's owner, and whether the row got a key. */
typedef struct owned {
        int tag;
        size_t r;
        bool got;
} owned_t;

static int
owned_cmp(const void *a, const void *b)
{
        const owned_t *x = a, *y = b;
        if (x->tag != y->tag)
                return x->tag < y->tag ? -1 : 1;
        return x->r < y->r ? -1 : x->r > y->r;
}

void
kinbox__claims_resolve(kinbox__db_t *db, const kinbox__claims_t *c,
                       const char *const *got, size_t ngot)
{
        gotkey_t *g = malloc((ngot ? ngot : 1) * sizeof(*g));
        owned_t *o = malloc((c->n ? c->n : 1) * sizeof(*o));
        if (!g || !o)
                goto out; /* counted as processed, not as duplicates */
        size_t k = 0;
        for (size_t j = 0; j < ngot; j++)
                if (got[j])
                        g[k++] = (gotkey_t){got[j], false};
        ngot = k;
        qsort(g, ngot, sizeof(*g), gotkey_cmp);
        size_t no = 0;
        for (size_t r = 0; r < c->n; r++) {
                int t = c->tags[r];
                if (t < 0 || (t & KINBOX__TAG_GROUP))
                        continue;
                /* The first row (in the statement's order) carrying a
                 * returned key takes it. */
                bool hit = false;
                size_t a = 0, b = ngot;
                while (a < b) {
                        size_t m = a + (b - a) / 2;
                        if (strcmp(g[m].k, c->keys[r]) < 0)
                                a = m + 1;
                        else
                                b = m;
                }
                for (; a < ngot && !strcmp(g[a].k, c->keys[r]) && !hit; a++)
                        if (!g[a].taken)
                                hit = g[a].taken = true;
                o[no++] = (owned_t){t, r, hit};
        }
        qsort(o, no, sizeof(*o), owned_cmp);
        for (size_t a = 0; a < no;) {
                size_t b = a;
                bool any = false;
                for (; b < no && o[b].tag == o[a].tag; b++)
                        any = any || o[b].got;
                if (!any)
                        kinbox__db_note_none(db, o[a].tag);
                a = b;
        }
out:
        free(g);
        free(o);
}

int
kinbox__claims_no_rows(kinbox__db_t *db, int tag)
{
        kinbox__db_seterr(db, KINBOX_ERR_DB, "", 0, tag,
                          "kinbox_tx_exec_claims: the statement returned no "
                          "column (it must return the keys it claimed, e.g. "
                          "RETURNING order_id)");
        db->err.permanent = true;
        return KINBOX_ERR_DB;
}

int
kinbox__db_exec_claims(kinbox__db_t *db, const char *sql, int n,
                       const kinbox__param_t *p, int tag,
                       const char *const *keys, const int *tags, size_t nrows,
                       bool *waited)
{
        *waited = false;
        if (tag < 0 || !tags || !keys)
                return db->ops->exec(db, sql, n, p, tag);
        if (db->ops->exec_claims) {
                kinbox__claims_t *c = kinbox__claims_new(keys, tags, nrows);
                if (!c) {
                        kinbox__db_seterr(db, KINBOX_ERR_NOMEM, "", 0, tag,
                                          "out of memory");
                        return KINBOX_ERR_NOMEM;
                }
                return db->ops->exec_claims(db, sql, n, p, tag, c);
        }
        *waited = true;
        struct kinbox_rows_s *rows = NULL;
        int rc = kinbox__db_query_hinted(db, sql, n, p, tag, keys, tags, nrows,
                                         &rows);
        if (rc)
                return rc;
        if (!rows || rows->ncols < 1) {
                kinbox_rows_destroy(rows);
                return kinbox__claims_no_rows(db, tag);
        }
        kinbox__claims_t c = {nrows, (int *)tags, (char **)keys};
        const char **got =
            malloc((rows->nrows ? rows->nrows : 1) * sizeof(*got));
        if (got) {
                for (size_t j = 0; j < rows->nrows; j++)
                        got[j] = rows->values[j * (size_t)rows->ncols];
                kinbox__claims_resolve(db, &c, got, rows->nrows);
        }
        free(got);
        kinbox_rows_destroy(rows);
        return KINBOX_OK;
}

int
kinbox__db_exec_values_text(kinbox__db_t *db, const kinbox__values_t *v,
                            int tag)
{
        char *sql = values_sql(v->head, v->tuple, v->tail, v->nper, v->nrows);
        if (!sql) {
                kinbox__db_seterr(db, KINBOX_ERR_NOMEM, "", 0, tag,
                                  "out of memory");
                return KINBOX_ERR_NOMEM;
        }
        int rc = db->ops->exec(db, sql, (int)v->nrows * v->nper, v->p, tag);
        free(sql);
        return rc;
}

void
kinbox__db_err_stmt(kinbox__db_t *db, const char *sql, size_t len)
{
        char *o = db->err.stmt;
        size_t n = 0, cap = 100;
        bool space = false, cut = false;
        for (size_t i = 0; sql && i < len && sql[i]; i++) {
                char ch = sql[i];
                if (ch == '\'' || n >= cap) {
                        cut = true;
                        break;
                }
                if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r') {
                        space = n > 0;
                        continue;
                }
                if (space)
                        o[n++] = ' ';
                space = false;
                o[n++] = ch;
        }
        /* A literal's prefix (_binary, X, N) goes with the literal. */
        while (cut && n &&
               ((o[n - 1] >= 'a' && o[n - 1] <= 'z') ||
                (o[n - 1] >= 'A' && o[n - 1] <= 'Z') || o[n - 1] == '_'))
                n--;
        if (cut)
                n += (size_t)snprintf(o + n, sizeof(db->err.stmt) - n, "%s...",
                                      n && o[n - 1] != ' ' ? " " : "");
        o[n] = '\0';
}

const char *
kinbox__db_err_cause(const kinbox__dberr_t *e, char *buf, size_t sz)
{
        if (e->sqlstate[0])
                snprintf(buf, sz, "%s", e->sqlstate);
        else if (e->vendor)
                snprintf(buf, sz, "%d", e->vendor);
        else
                snprintf(buf, sz, "unknown");
        return buf;
}
