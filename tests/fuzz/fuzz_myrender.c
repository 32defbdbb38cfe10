/*
 * Fuzz the MySQL backend's $N -> literal renderer (src/db/mysql_render.c)
 * against a model of the server's lexer (MariaDB, the session's sql_mode:
 * backslash escapes on, '"' quotes strings).
 *
 * Input: byte 0, the number of parameters (low 3 bits, mod 5) and whether
 * the buffer already holds text (bit 3); byte 1, per parameter k, binary
 * (bit k) and NULL (bit k + 4); then the template up to a NUL byte; then
 * each parameter as one length byte and its bytes. A parameter value is
 * MARK k followed by its bytes (so that its literal can be found in the
 * output), except a value of digits only (the bare LIMIT/OFFSET form).
 *
 * Checked, when the template renders:
 *  - no sanitizer report, and the text before the render is untouched;
 *  - no $N placeholder is left in code the server runs;
 *  - a parameter's bytes appear only inside a string literal of code the
 *    server runs, whose decoded value is exactly that parameter (the
 *    literal cannot end early or merge with its neighbours, and nothing
 *    of it lands in a comment), once per placeholder the server sees;
 *  - quotes and comments are balanced when the template's are.
 * When it does not: the buffer is back to its length before the call.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/mysql_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MARK "\x01~K"
#define MARKLEN 3
#define NP 4

struct model {
        const kinbox__param_t *p; /* the parameters */
        int np;
        bool out; /* scanning the output (else the template) */
        int placeholders; /* template: $N in code, parameter with MARK */
        int marked; /* output: string literals in code with MARK */
        bool left; /* output: a $N word in code */
        bool bad; /* output: MARK outside such a literal, or off */
        bool open; /* ends inside a string, identifier or comment */
        bool forged; /* template: a literal that decodes to MARK (escapes
                      * such as \x01\~K): not a parameter's, skipped */
};

static bool
ident(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '_' || c == '$' || c >= 0x80;
}

static bool
has_mark(const char *s, size_t n)
{
        for (size_t i = 0; i + MARKLEN <= n; i++)
                if (!memcmp(s + i, MARK, MARKLEN))
                        return true;
        return false;
}

static bool
marked(const kinbox__param_t *q)
{
        return q->v && q->len >= MARKLEN && !memcmp(q->v, MARK, MARKLEN);
}

/* The server's decoding of the character after a backslash. */
static char
unescape(char c)
{
        switch (c) {
        case '0':
                return '\0';
        case 'b':
                return '\b';
        case 'n':
                return '\n';
        case 'r':
                return '\r';
        case 't':
                return '\t';
        case 'Z':
                return '\032';
        default:
                return c;
        }
}

/* The quoted token at s[*i], its value decoded into out (backslash
 * escapes but in `identifiers`, doubled quotes); false when not closed. */
static bool
quoted_at(const char *s, size_t n, size_t *i, char *out, size_t *outl)
{
        char q = s[*i];
        size_t k = 0;
        for (size_t e = *i + 1; e < n; e++) {
                if (s[e] == '\\' && q != '`' && e + 1 < n) {
                        out[k++] = unescape(s[++e]);
                } else if (s[e] == q && e + 1 < n && s[e + 1] == q) {
                        out[k++] = q;
                        e++;
                } else if (s[e] == q) {
                        *i = e + 1;
                        *outl = k;
                        return true;
                } else {
                        out[k++] = s[e];
                }
        }
        *i = n;
        *outl = k;
        return false;
}

/* A string literal in code, decoded: is it exactly a parameter? */
static void
literal(struct model *md, const char *v, size_t vl)
{
        if (!has_mark(v, vl))
                return;
        md->marked++;
        int k = vl > MARKLEN ? v[MARKLEN] - '0' : -1;
        if (k < 0 || k >= md->np || !marked(&md->p[k]) || md->p[k].len != vl ||
            memcmp(md->p[k].v, v, vl))
                md->bad = true;
}

/* The end of a comment the server skips at s[i], or i when none starts
 * there: '#'; '--' then a blank or a control character; slash-star but
 * for the executable slash-star-bang. (MariaDB before 12 takes an
 * optimizer hint, slash-star-plus, for a comment; MySQL takes MariaDB's
 * slash-star-M-bang for one.) */
static size_t
comment_end(struct model *md, const char *s, size_t n, size_t i)
{
        unsigned char c2 = i + 2 < n ? (unsigned char)s[i + 2] : 0;
        if (s[i] == '#' || (s[i] == '-' && i + 1 < n && s[i + 1] == '-' &&
                            (c2 <= ' ' || c2 == 0x7f))) {
                const char *e = memchr(s + i, '\n', n - i);
                return e ? (size_t)(e - s) + 1 : n;
        }
        if (s[i] == '/' && i + 1 < n && s[i + 1] == '*' && c2 != '!') {
                for (size_t e = i + 2; e + 1 < n; e++)
                        if (s[e] == '*' && s[e + 1] == '/')
                                return e + 2;
                md->open = true;
                return n;
        }
        return i;
}

/* A word at s[b..e): a $N placeholder, or a parameter's bytes outside a
 * literal. */
static void
word(struct model *md, const char *s, size_t b, size_t e)
{
        if (md->out && has_mark(s + b, e - b))
                md->bad = true;
        /* "$1$2" is two placeholders; "$1a$2" one. */
        while (b + 1 < e && s[b] == '$' && s[b + 1] >= '0' &&
               s[b + 1] <= '9') {
                long k = 0;
                for (b++; b < e && s[b] >= '0' && s[b] <= '9'; b++)
                        if (k < 100000)
                                k = k * 10 + (s[b] - '0');
                if (md->out)
                        md->left = true;
                else if (k >= 1 && k <= md->np && marked(&md->p[k - 1]))
                        md->placeholders++;
        }
}

static void
scan(struct model *md, const char *s, size_t n, char *dec)
{
        size_t i = 0, e, dl;
        while (i < n) {
                unsigned char c = (unsigned char)s[i];
                if ((e = comment_end(md, s, n, i)) != i) {
                        if (md->out && has_mark(s + i, e - i))
                                md->bad = true; /* a value in a comment */
                        i = e;
                } else if (c == '/' && i + 2 < n && s[i + 1] == '*') {
                        i += 3; /* executable comment: code */
                } else if (c == '\'' || c == '"' || c == '`') {
                        size_t b = i;
                        if (!quoted_at(s, n, &i, dec, &dl))
                                md->open = true;
                        if (!md->out) {
                                md->forged |= c != '`' && has_mark(dec, dl);
                                continue;
                        }
                        if (c != '`')
                                literal(md, dec, dl);
                        else if (has_mark(s + b, i - b))
                                md->bad = true;
                } else if (ident(c)) {
                        size_t b = i;
                        while (i < n && ident((unsigned char)s[i]))
                                i++;
                        word(md, s, b, i);
                } else {
                        if (md->out && i + MARKLEN <= n &&
                            !memcmp(s + i, MARK, MARKLEN))
                                md->bad = true;
                        i++;
                }
        }
}

/* Parameter k from the input: MARK k then its bytes, or its bytes when
 * they are all digits (text). */
static void
param(kinbox__param_t *q, char *buf, int k, const uint8_t *b, size_t n,
      uint8_t flags)
{
        bool digits = n > 0 && !(flags & (1u << k));
        for (size_t i = 0; i < n && digits; i++)
                digits = b[i] >= '0' && b[i] <= '9';
        size_t at = 0;
        if (!digits) {
                memcpy(buf, MARK, MARKLEN);
                buf[MARKLEN] = (char)('0' + k);
                at = MARKLEN + 1;
        }
        memcpy(buf + at, b, n);
        buf[at + n] = '\0';
        q->v = flags & (0x10u << k) ? NULL : buf;
        q->len = at + n;
        q->binary = (flags >> k) & 1;
}

static void
fail(const char *why, const char *sql, const kinbox__buf_t *b)
{
        fprintf(stderr, "fuzz_myrender: %s\ntemplate: %s\noutput: %.*s\n", why,
                sql, b ? (int)b->len : 0, b && b->p ? b->p : "");
        abort();
}

static MYSQL *
handle(void)
{
        static MYSQL *m;
        if (!m && !(m = mysql_init(NULL)))
                abort();
        return m;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (size < 2)
                return 0;
        int np = (data[0] & 7) % (NP + 1);
        const uint8_t *p = data + 2, *end = data + size;
        const uint8_t *z = memchr(p, 0, (size_t)(end - p));
        size_t sl = (size_t)((z ? z : end) - p);
        char *sql = malloc(sl + 1);
        static char vals[NP][256 + MARKLEN + 2];
        kinbox__param_t ps[NP];
        if (!sql)
                abort();
        memcpy(sql, p, sl);
        sql[sl] = '\0';
        p = z ? z + 1 : end;
        for (int k = 0; k < np; k++) {
                size_t n = p < end ? *p++ : 0;
                if (n > (size_t)(end - p))
                        n = (size_t)(end - p);
                param(&ps[k], vals[k], k, p, n, data[1]);
                p += n;
        }
        if (has_mark(sql, sl)) {
                free(sql);
                return 0;
        }
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        static const char pre[] = "SELECT 1 LIMIT ";
        size_t start = data[0] & 8 ? sizeof(pre) - 1 : 0;
        kinbox__buf_add(&b, pre, start);
        int nst = 0;
        char err[200] = "";
        int rc = kinbox__my_render(handle(), &b, sql, np, ps, &nst, err,
                                   sizeof(err));
        if (b.oom || b.len < start || memcmp(b.p ? b.p : "", pre, start))
                fail("the text before the render changed", sql, &b);
        if (rc) {
                if (rc != KINBOX_ERR_INVALID || b.len != start || !err[0])
                        fail("an error left output or no message", sql, &b);
        } else {
                char *dec = malloc(b.len + sl + 1);
                if (!dec)
                        abort();
                if (nst < 1)
                        fail("no statement counted", sql, &b);
                struct model in = {.p = ps, .np = np};
                struct model out = {.p = ps, .np = np, .out = true};
                scan(&in, sql, sl, dec);
                if (in.forged) { /* the oracle could not tell it apart */
                        free(dec);
                        kinbox__buf_free(&b);
                        free(sql);
                        return 0;
                }
                scan(&out, b.p + start, b.len - start, dec);
                if (out.left)
                        fail("a $N the server runs was not replaced", sql, &b);
                if (out.bad)
                        fail("a value is outside its literal, or its literal "
                             "is not exactly it",
                             sql, &b);
                if (out.marked != in.placeholders)
                        fail("not one literal per placeholder", sql, &b);
                if (out.open && !in.open)
                        fail("quotes or comments left open", sql, &b);
                free(dec);
        }
        kinbox__buf_free(&b);
        free(sql);
        return 0;
}
