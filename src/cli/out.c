/*
 * out.c -- the operator commands' output: a human table by default, one
 * JSON document on stdout with --json.
 */
#include "common.h"
#include "internal.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
tbl_init(table_t *t, int ncols, ...)
{
        memset(t, 0, sizeof(*t));
        t->ncols = ncols;
        va_list ap;
        va_start(ap, ncols);
        for (int i = 0; i < ncols; i++) {
                const char *h = va_arg(ap, const char *);
                if (t->n == t->cap) {
                        t->cap = t->cap ? t->cap * 2 : 64;
                        t->cells = realloc(t->cells, t->cap * sizeof(char *));
                        if (!t->cells)
                                abort();
                }
                t->cells[t->n++] = strdup(h);
        }
        va_end(ap);
}

void
tbl_add(table_t *t, const char *fmt, ...)
{
        char b[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b, sizeof(b), fmt, ap);
        va_end(ap);
        if (t->n == t->cap) {
                t->cap = t->cap ? t->cap * 2 : 64;
                t->cells = realloc(t->cells, t->cap * sizeof(char *));
                if (!t->cells)
                        abort();
        }
        t->cells[t->n++] = strdup(b);
}

/* Print (fp NULL: only free) and free. */
void
tbl_print(table_t *t, FILE *fp)
{
        int w[32] = {0};
        if (!fp)
                t->ncols = t->ncols ? t->ncols : 1;
        for (size_t i = 0; i < t->n; i++) {
                int c = (int)(i % (size_t)t->ncols);
                int l = (int)strlen(t->cells[i]);
                if (l > w[c])
                        w[c] = l;
        }
        for (size_t i = 0; i < t->n; i++) {
                int c = (int)(i % (size_t)t->ncols);
                bool last = c == t->ncols - 1;
                if (!fp)
                        continue;
                if (last)
                        fprintf(fp, "%s\n", t->cells[i]);
                else
                        fprintf(fp, "%-*s  ", w[c], t->cells[i]);
        }
        for (size_t i = 0; i < t->n; i++)
                free(t->cells[i]);
        free(t->cells);
        memset(t, 0, sizeof(*t));
}

/* Bytes as text when printable UTF-8-ish, else with \xNN escapes. */
char *
escape_bytes(const char *p, size_t n)
{
        char *o = malloc(n * 4 + 1), *q = o;
        if (!o)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)p[i];
                if (c == '\\') {
                        *q++ = '\\';
                        *q++ = '\\';
                } else if (c >= 0x20 && c != 0x7f) {
                        *q++ = (char)c;
                } else {
                        snprintf(q, 5, "\\x%02x", c);
                        q += 4;
                }
        }
        *q = '\0';
        return o;
}

void
json_out(json_t *j)
{
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (s) {
                puts(s);
                free(s);
        }
        json_decref(j);
}

/* A listing: the JSON array (--json) or the table; frees both. */
void
rows_out(bool json, table_t *t, json_t *ja)
{
        tbl_print(t, json ? NULL : stdout);
        if (json)
                json_out(ja);
        else
                json_decref(ja);
}

/* A value as JSON: integer when it looks like one, else string. */
json_t *
jval(const char *v)
{
        if (!v)
                return json_null();
        int64_t n = 0;
        if (!kinbox__parse_i64_all(v, &n))
                return json_integer((json_int_t)n);
        return json_string(v);
}
