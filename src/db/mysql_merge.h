/*
 * mysql_merge.h -- the merged INSERTs' state (internal to the MySQL
 * backend): mysql_merge.c fills it, mysql_err.c frees it.
 */
#ifndef KINBOX_DB_MYSQL_MERGE_H
#define KINBOX_DB_MYSQL_MERGE_H

#include "mysql_int.h"

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

void kinbox__my_m_tmpl_clear(struct mtmpl *t);

#endif
