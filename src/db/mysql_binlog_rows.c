/*
 * mysql_binlog_rows.c -- row images of a ROW-format binlog, decoded from
 * the table map's column types and metadata (the layout is the server's:
 * sql/log_event.cc, sql/field.cc; fixed-width integers little-endian,
 * temporal types big-endian).
 *
 * Not mariadb_rpl_extract_rows(): Debian 12's Connector/C 3.3.20 decodes
 * kinbox_outbox right (tests/binlog_test.c, connector_api_probe), but
 * earlier 3.3 sources take a TIMESTAMP2's metadata (its precision, 6) as
 * its fraction's byte count (3), which shifts every later column, and it
 * copies every column of every row into the event's memory. Here the
 * row image is read in place, and only skipping needs every type; the
 * values kinbox reads are integers, strings, blobs and TIMESTAMP(n).
 */
#include "mysql_binlog_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysql.h>

#include "internal.h"

static uint64_t
le(const unsigned char *p, int n)
{
        uint64_t v = 0;
        for (int i = n - 1; i >= 0; i--)
                v = (v << 8) | p[i];
        return v;
}

static uint64_t
be(const unsigned char *p, int n)
{
        uint64_t v = 0;
        for (int i = 0; i < n; i++)
                v = (v << 8) | p[i];
        return v;
}

/* Metadata bytes a column type carries in the table map. */
static int
meta_len(unsigned char type)
{
        switch (type) {
        case MYSQL_TYPE_FLOAT:
        case MYSQL_TYPE_DOUBLE:
        case MYSQL_TYPE_BLOB:
        case MYSQL_TYPE_TINY_BLOB:
        case MYSQL_TYPE_MEDIUM_BLOB:
        case MYSQL_TYPE_LONG_BLOB:
        case MYSQL_TYPE_GEOMETRY:
        case MYSQL_TYPE_JSON:
        case MYSQL_TYPE_TIMESTAMP2:
        case MYSQL_TYPE_DATETIME2:
        case MYSQL_TYPE_TIME2:
                return 1;
        case MYSQL_TYPE_VARCHAR:
        case MYSQL_TYPE_VAR_STRING:
        case MYSQL_TYPE_STRING:
        case MYSQL_TYPE_ENUM:
        case MYSQL_TYPE_SET:
        case MYSQL_TYPE_NEWDECIMAL:
        case MYSQL_TYPE_BIT:
                return 2;
        case MYSQL_TYPE_TINY:
        case MYSQL_TYPE_SHORT:
        case MYSQL_TYPE_INT24:
        case MYSQL_TYPE_LONG:
        case MYSQL_TYPE_LONGLONG:
        case MYSQL_TYPE_DATE:
        case MYSQL_TYPE_NEWDATE:
        case MYSQL_TYPE_TIME:
        case MYSQL_TYPE_DATETIME:
        case MYSQL_TYPE_TIMESTAMP:
        case MYSQL_TYPE_YEAR:
                return 0;
        default:
                return -1;
        }
}

void
kinbox__bl_tmap_free(kinbox__bl_tmap_t *t)
{
        free(t->types);
        free(t->meta);
        memset(t, 0, sizeof(*t));
}

int
kinbox__bl_tmap_set(kinbox__bl_tmap_t *t, uint64_t table_id,
                    const unsigned char *types, uint32_t ncols,
                    const unsigned char *meta, size_t metalen, char *err,
                    size_t sz)
{
        kinbox__bl_tmap_free(t);
        t->types = malloc(ncols ? ncols : 1);
        t->meta =
            kinbox__calloc(2 * (size_t)(ncols ? ncols : 1), sizeof(uint16_t));
        if (!t->types || !t->meta) {
                kinbox__errstr(err, sz, "out of memory");
                return -1;
        }
        t->table_id = table_id;
        t->ncols = ncols;
        memcpy(t->types, types, ncols);
        size_t at = 0;
        for (uint32_t c = 0; c < ncols; c++) {
                int n = meta_len(types[c]);
                if (n < 0 || at + (size_t)n > metalen) {
                        kinbox__errstr(err, sz,
                                       "binlog: column %u has type %u, "
                                       "which kinbox cannot read",
                                       c + 1, types[c]);
                        return -1;
                }
                if (n == 1)
                        t->meta[2 * c] = meta[at];
                else if (n == 2 && (types[c] == MYSQL_TYPE_VARCHAR ||
                                    types[c] == MYSQL_TYPE_VAR_STRING))
                        t->meta[2 * c] = (uint16_t)le(meta + at, 2);
                else if (n == 2) {
                        t->meta[2 * c] = meta[at];
                        t->meta[2 * c + 1] = meta[at + 1];
                }
                at += (size_t)n;
        }
        return 0;
}

/* Bytes of a DECIMAL(prec, scale) (decimal_bin_size). */
static size_t
decimal_size(int prec, int scale)
{
        static const int dig2bytes[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
        int intg = prec - scale;
        return (size_t)(intg / 9 * 4 + dig2bytes[intg % 9] + scale / 9 * 4 +
                        dig2bytes[scale % 9]);
}

/* A TIMESTAMP2 of precision dec at p: µs since the epoch. */
static int64_t
timestamp2_us(const unsigned char *p, int dec)
{
        int64_t us = (int64_t)be(p, 4) * 1000000;
        switch (dec) {
        case 1:
        case 2:
                us += (int64_t)p[4] * 10000;
                break;
        case 3:
        case 4:
                us += (int64_t)be(p + 4, 2) * 100;
                break;
        case 5:
        case 6:
                us += (int64_t)be(p + 4, 3);
                break;
        default:
                break;
        }
        return us;
}

/* A string type's (CHAR, ENUM, SET) real type and length from (m0, m1). */
static void
string_meta(uint16_t m0, uint16_t m1, unsigned *real, unsigned *len)
{
        if ((m0 & 0x30) != 0x30) {
                *real = m0 | 0x30;
                *len = (unsigned)((((m0 & 0x30) ^ 0x30) << 4) | m1);
        } else {
                *real = m0;
                *len = m1;
        }
}

/* Width of a length-prefixed or fixed value; *pre the prefix bytes.
 * Returns -1 for a type it does not know. */
static long
fixed_width(unsigned type, uint16_t m0, uint16_t m1, int *pre)
{
        *pre = 0;
        switch (type) {
        case MYSQL_TYPE_TINY:
        case MYSQL_TYPE_YEAR:
                return 1;
        case MYSQL_TYPE_SHORT:
                return 2;
        case MYSQL_TYPE_INT24:
        case MYSQL_TYPE_DATE:
        case MYSQL_TYPE_NEWDATE:
        case MYSQL_TYPE_TIME:
                return 3;
        case MYSQL_TYPE_LONG:
        case MYSQL_TYPE_TIMESTAMP:
                return 4;
        case MYSQL_TYPE_LONGLONG:
        case MYSQL_TYPE_DATETIME:
                return 8;
        case MYSQL_TYPE_FLOAT:
        case MYSQL_TYPE_DOUBLE:
                return m0;
        case MYSQL_TYPE_TIMESTAMP2:
                return 4 + (m0 + 1) / 2;
        case MYSQL_TYPE_DATETIME2:
                return 5 + (m0 + 1) / 2;
        case MYSQL_TYPE_TIME2:
                return 3 + (m0 + 1) / 2;
        case MYSQL_TYPE_NEWDECIMAL:
                return (long)decimal_size(m0, m1);
        case MYSQL_TYPE_BIT:
                return (long)(m1 + (m0 ? 1 : 0));
        case MYSQL_TYPE_BLOB:
        case MYSQL_TYPE_TINY_BLOB:
        case MYSQL_TYPE_MEDIUM_BLOB:
        case MYSQL_TYPE_LONG_BLOB:
        case MYSQL_TYPE_GEOMETRY:
        case MYSQL_TYPE_JSON:
                *pre = m0;
                return 0;
        case MYSQL_TYPE_VARCHAR:
        case MYSQL_TYPE_VAR_STRING:
                *pre = m0 < 256 ? 1 : 2;
                return 0;
        default:
                return -1;
        }
}

/* One present, non-NULL column at *pos. */
static int
col_decode(unsigned type, uint16_t m0, uint16_t m1, const unsigned char **pos,
           const unsigned char *end, kinbox__bl_col_t *c)
{
        const unsigned char *p = *pos;
        int pre = 0;
        long w;
        if (type == MYSQL_TYPE_STRING) {
                unsigned real, len;
                string_meta(m0, m1, &real, &len);
                if (real == MYSQL_TYPE_ENUM || real == MYSQL_TYPE_SET) {
                        w = (long)(len & 0xff);
                        type = real;
                } else {
                        w = 0;
                        pre = len > 255 ? 2 : 1;
                }
        } else if ((w = fixed_width(type, m0, m1, &pre)) < 0)
                return -1;
        if (pre) {
                if (end - p < pre || pre > 4)
                        return -1;
                w = (long)le(p, pre);
                p += pre;
        }
        if (w < 0 || end - p < w)
                return -1;
        c->p = p;
        c->n = (size_t)w;
        if (type == MYSQL_TYPE_TINY || type == MYSQL_TYPE_SHORT ||
            type == MYSQL_TYPE_INT24 || type == MYSQL_TYPE_LONG ||
            type == MYSQL_TYPE_LONGLONG) {
                uint64_t v = le(p, (int)w);
                if (w < 8 && (v >> (8 * w - 1)) & 1) /* sign-extend */
                        v |= ~(uint64_t)0 << (8 * w);
                c->i = (int64_t)v;
                c->is_int = true;
        } else if (type == MYSQL_TYPE_TIMESTAMP2) {
                c->us = timestamp2_us(p, m0);
                c->is_time = true;
        } else if (type == MYSQL_TYPE_TIMESTAMP) {
                c->us = (int64_t)le(p, 4) * 1000000;
                c->is_time = true;
        }
        *pos = p + w;
        return 0;
}

int
kinbox__bl_row_decode(const kinbox__bl_tmap_t *t, const unsigned char *present,
                      const unsigned char **pos, const unsigned char *end,
                      kinbox__bl_col_t *cols, char *err, size_t sz)
{
        uint32_t npresent = 0;
        for (uint32_t c = 0; c < t->ncols; c++)
                npresent += (present[c / 8] >> (c % 8)) & 1;
        const unsigned char *p = *pos;
        size_t nb = (npresent + 7) / 8;
        if ((size_t)(end - p) < nb) {
                kinbox__errstr(err, sz, "binlog: truncated row image");
                return -1;
        }
        const unsigned char *nulls = p;
        p += nb;
        uint32_t k = 0; /* index among the present columns */
        for (uint32_t c = 0; c < t->ncols; c++) {
                kinbox__bl_col_t *col = &cols[c];
                memset(col, 0, sizeof(*col));
                col->null = true;
                if (!((present[c / 8] >> (c % 8)) & 1))
                        continue;
                bool isnull = (nulls[k / 8] >> (k % 8)) & 1;
                k++;
                if (isnull)
                        continue;
                col->null = false;
                if (col_decode(t->types[c], t->meta[2 * c], t->meta[2 * c + 1],
                               &p, end, col)) {
                        kinbox__errstr(err, sz,
                                       "binlog: column %u (type %u) of a "
                                       "row image cannot be read",
                                       c + 1, t->types[c]);
                        return -1;
                }
        }
        *pos = p;
        return 0;
}
