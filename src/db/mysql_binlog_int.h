/*
 * mysql_binlog_int.h -- what mysql_binlog.c (the replication connection,
 * transactions) and mysql_binlog_rows.c (row images) share.
 */
#ifndef KINBOX_DB_MYSQL_BINLOG_INT_H
#define KINBOX_DB_MYSQL_BINLOG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A table map: one column type and its metadata per column. */
typedef struct kinbox__bl_tmap {
        uint64_t table_id;
        uint32_t ncols;
        unsigned char *types; /* ncols */
        uint16_t *meta; /* 2 per column: (m0, m1) as the type reads them */
} kinbox__bl_tmap_t;

/* One decoded column of a row image. */
typedef struct kinbox__bl_col {
        bool null; /* SQL NULL, or absent from the image */
        bool is_int; /* i is the value */
        bool is_time; /* us is the value (µs since the epoch, UTC) */
        const unsigned char *p; /* bytes of a string or blob */
        size_t n;
        int64_t i, us;
} kinbox__bl_col_t;

/* Fill t from a TABLE_MAP event's column types and metadata block.
 * Returns 0, or -1 with err set (a type this decoder does not know). */
int kinbox__bl_tmap_set(kinbox__bl_tmap_t *t, uint64_t table_id,
                        const unsigned char *types, uint32_t ncols,
                        const unsigned char *meta, size_t metalen, char *err,
                        size_t sz);
void kinbox__bl_tmap_free(kinbox__bl_tmap_t *t);

/* Decode the row image at *pos (before end) of a rows event whose column
 * bitmap is present (ncols bits); cols has t->ncols entries (pointing into
 * the image). Advances *pos past the image. Returns 0, or -1 with err
 * set (truncated or unknown data). */
int kinbox__bl_row_decode(const kinbox__bl_tmap_t *t,
                          const unsigned char *present,
                          const unsigned char **pos, const unsigned char *end,
                          kinbox__bl_col_t *cols, char *err, size_t sz);

#endif
