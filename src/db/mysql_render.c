/*
 * mysql_render.c -- $N placeholders rendered into escaped literals.
 *
 * The text protocol has no parameters and prepared statements cannot be
 * sent in one multi-statement packet, so $1..$n are rewritten to
 * literals. String literals, quoted identifiers and comments are skipped,
 * so a '$1' inside quotes stays as it is. The session's sql_mode
 * (mysql_conn.c) has no NO_BACKSLASH_ESCAPES and no ANSI_QUOTES, which
 * this lexing assumes. tests/fuzz/fuzz_myrender.c checks it.
 */
#include "mysql_int.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
void
kinbox__my_append_literal(MYSQL *m, kinbox__buf_t *b, const char *v, size_t n,
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

static bool
is_blank(unsigned char c)
{
        return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
               c == '\v';
}

/* A comment the server does not run, at sql[i]: copied verbatim (a line
 * comment with its newline, so a ';' joined after it is not swallowed).
 * Returns the index after it, or i when none starts there. Executable
 * comments (slash-star-bang) are code the server runs, so they are not
 * comments here: their contents are rendered too; optimizer hints
 * (slash-star-plus) are copy_hint()'s. */
static size_t
copy_comment(kinbox__buf_t *b, const char *sql, size_t len, size_t i)
{
        char c = sql[i];
        /* "--" starts one before a blank or a control character, as
         * on the server: before any other it is two minus signs. */
        unsigned char c2 = i + 2 < len ? (unsigned char)sql[i + 2] : 0;
        if (c == '#' || (c == '-' && i + 1 < len && sql[i + 1] == '-' &&
                         (c2 <= ' ' || c2 == 0x7f))) {
                size_t e = i;
                while (e < len && sql[e] != '\n')
                        e++;
                kinbox__buf_add(b, sql + i, e - i);
                kinbox__buf_add(b, "\n", 1);
                return e < len ? e + 1 : e;
        }
        if (c == '/' && i + 1 < len && sql[i + 1] == '*' &&
            !(i + 2 < len && (sql[i + 2] == '!' || sql[i + 2] == '+'))) {
                const char *e = strstr(sql + i + 2, "*/");
                size_t end = e ? (size_t)(e - sql) + 2 : len;
                kinbox__buf_add(b, sql + i, end - i);
                return end;
        }
        return i;
}

/*
 * An optimizer hint (slash-star-plus) at sql[*i], up to its first star-slash:
 * MySQL parses it, MariaDB before 12 skips it as a comment, so a literal
 * there could end the comment early. Its placeholders take integers only,
 * written bare; anything else is refused. Moves *i past it; returns 0, or
 * KINBOX_ERR_INVALID with a message in err.
 */
static int
copy_hint(kinbox__buf_t *b, const char *sql, size_t len, size_t *i, int n,
          const kinbox__param_t *p, char *err, size_t errsz)
{
        const char *e = strstr(sql + *i + 3, "*/");
        size_t end = e ? (size_t)(e - sql) + 2 : len;
        for (size_t k = *i; k < end;) {
                if (sql[k] != '$' || k + 1 >= end || sql[k + 1] < '0' ||
                    sql[k + 1] > '9' || is_ident((unsigned char)sql[k - 1])) {
                        kinbox__buf_add(b, sql + k++, 1);
                        continue;
                }
                long idx = 0;
                for (k++; k < end && sql[k] >= '0' && sql[k] <= '9'; k++)
                        if (idx < 100000)
                                idx = idx * 10 + (sql[k] - '0');
                const kinbox__param_t *q =
                    idx >= 1 && idx <= n ? &p[idx - 1] : NULL;
                size_t vl = q && q->v && !q->binary && q->len == 0
                                ? strlen(q->v)
                            : q ? q->len
                                : 0;
                if (!q || !q->v || q->binary || !is_integer(q->v, vl)) {
                        kinbox__errstr(err, errsz,
                                       "placeholder $%ld in an optimizer "
                                       "hint: only an integer parameter "
                                       "goes there",
                                       idx);
                        return KINBOX_ERR_INVALID;
                }
                kinbox__buf_add(b, q->v, vl);
        }
        *i = end;
        return 0;
}

/* The end of the string literal or quoted identifier opening at sql[i]
 * (after its closing quote; len when it is not closed). */
static size_t
quoted_end(const char *sql, size_t len, size_t i)
{
        char q = sql[i];
        size_t e = i + 1;
        while (e < len) {
                if (sql[e] == '\\' && q != '`' && e + 1 < len) {
                        e += 2;
                        continue;
                }
                if (sql[e] == q) {
                        if (e + 1 < len && sql[e + 1] == q) {
                                e += 2;
                                continue;
                        }
                        break;
                }
                e++;
        }
        return e < len ? e + 1 : len;
}

/* Whether a placeholder ($ then a digit, not inside a word) is at i;
 * after: one ended at i ("$1$2" is two). */
static bool
is_placeholder(const char *sql, size_t len, size_t i, bool after)
{
        return sql[i] == '$' && i + 1 < len && sql[i + 1] >= '0' &&
               sql[i + 1] <= '9' &&
               (i == 0 || after || !is_ident((unsigned char)sql[i - 1]));
}

/*
 * Render the placeholder at sql[*i] into b (whose rendered statement text
 * starts at start) and move *i past it. Returns 0, or KINBOX_ERR_INVALID
 * with a message in err when it names no parameter.
 */
static int
placeholder(MYSQL *m, kinbox__buf_t *b, size_t start, const char *sql,
            size_t len, size_t *i, int n, const kinbox__param_t *p, char *err,
            size_t errsz)
{
        size_t e = *i + 1;
        long idx = 0;
        while (e < len && sql[e] >= '0' && sql[e] <= '9') {
                if (idx < 100000)
                        idx = idx * 10 + (sql[e] - '0');
                e++;
        }
        if (idx < 1 || idx > n) {
                kinbox__errstr(err, errsz,
                               "placeholder $%ld but %d parameter%s given",
                               idx, n, n == 1 ? "" : "s");
                return KINBOX_ERR_INVALID;
        }
        const kinbox__param_t *q = &p[idx - 1];
        size_t vl = q->v && !q->binary && q->len == 0 ? strlen(q->v) : q->len;
        if (q->v && !q->binary && is_integer(q->v, vl) &&
            (ends_with_kw(b, start, "LIMIT") ||
             ends_with_kw(b, start, "OFFSET"))) {
                kinbox__buf_add(b, q->v, vl);
        } else if (q->v) {
                /* A quote right before or after the literal would join
                 * it to a neighbouring string ('a''x' is one string). */
                if (b->len > start && b->p[b->len - 1] == '\'')
                        kinbox__buf_add(b, " ", 1);
                kinbox__my_append_literal(m, b, q->v, vl, q->binary != 0);
                if (e < len && sql[e] == '\'')
                        kinbox__buf_add(b, " ", 1);
        } else {
                kinbox__my_append_literal(m, b, NULL, 0, false);
        }
        *i = e;
        return 0;
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
int
kinbox__my_render(MYSQL *m, kinbox__buf_t *b, const char *sql, int n,
                  const kinbox__param_t *p, int *nstmts, char *err,
                  size_t errsz)
{
        const size_t start = b->len;
        size_t i = 0, e, len = strlen(sql), ph_end = 0;
        bool seen = false, sep = false;
        int count = 0, rc;

        while (i < len) {
                unsigned char c = (unsigned char)sql[i];
                bool after = i > 0 && ph_end == i;
                /* Whitespace: copied, does not make a statement. */
                if (is_blank(c)) {
                        kinbox__buf_add(b, sql + i, 1);
                        i++;
                        continue;
                }
                /* Comments: copied verbatim, never rewritten. */
                if ((e = copy_comment(b, sql, len, i)) != i) {
                        i = e;
                        continue;
                }
                /* Anything else is part of a statement. */
                if (c == ';') {
                        /* "--;" is no SQL, and blanks copied before the
                         * ';' would make "--" a comment start. */
                        if (i >= 2 && sql[i - 1] == '-' && sql[i - 2] == '-') {
                                kinbox__errstr(err, errsz,
                                               "\"--\" right before ';'");
                                b->len = start;
                                return KINBOX_ERR_INVALID;
                        }
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
                if (c == '/' && i + 2 < len && sql[i + 1] == '*' &&
                    sql[i + 2] == '+') {
                        if ((rc = copy_hint(b, sql, len, &i, n, p, err,
                                            errsz))) {
                                b->len = start;
                                return rc;
                        }
                        continue;
                }
                if (c == '\'' || c == '"' || c == '`') {
                        e = quoted_end(sql, len, i);
                        kinbox__buf_add(b, sql + i, e - i);
                        i = e;
                        continue;
                }
                if (is_placeholder(sql, len, i, after)) {
                        if ((rc = placeholder(m, b, start, sql, len, &i, n, p,
                                              err, errsz))) {
                                b->len = start;
                                return rc;
                        }
                        ph_end = i;
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
