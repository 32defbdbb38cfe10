/*
 * mysql_binlog.c -- a replication connection to MariaDB that returns the
 * committed transactions inserting into kinbox_outbox (mysql_binlog.h).
 *
 * The session is opened like every MySQL session of kinbox (the URL, TLS,
 * timeouts: mysql_conn.c); the server's settings and the table's columns
 * are read on it, then it becomes a binlog dump (COM_BINLOG_DUMP) started
 * from a GTID state: MariaDB's @slave_connect_state with
 * @mariadb_slave_capability = 4 (the GTID-aware protocol), the file name
 * empty. A heartbeat every heartbeat_ms keeps the read from blocking
 * longer.
 *
 * A transaction is GTID ... TABLE_MAP, WRITE_ROWS ... XID (or a COMMIT
 * query; a standalone GTID, DDL, ends with its one query). Rows are
 * decoded by mysql_binlog_rows.c and copied (one block per row) so that
 * they outlive the event they came in.
 */
#include "mysql_binlog.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mysql.h>
#include <mariadb_rpl.h>

#include "db.h"
#include "mysql_binlog_int.h"
#include "internal.h"

enum {
        F_ID,
        F_KIND,
        F_DEST,
        F_IDEM,
        F_AGG,
        F_PAYLOAD,
        F_HEADERS,
        F_STATUS,
        F_MAXATT,
        F_CREATED,
        NF
};

static const char *const field_names[NF] = {
    "id",      "kind",    "destination", "idem_key",     "aggregate_id",
    "payload", "headers", "status",      "max_attempts", "created_at"};

typedef struct gtid {
        uint32_t d, s;
        uint64_t n;
} gtid_t;

struct kinbox__binlog {
        kinbox__db_t *db;
        MYSQL *m;
        MARIADB_RPL *rpl;
        MARIADB_RPL_EVENT *ev;
        char *schema, *table;
        uint32_t ncols; /* cols: the table's columns at open, or more */
        int ix[NF]; /* column index of each field, -1: none */
        kinbox__bl_tmap_t tmap;
        bool have_tmap;
        kinbox__bl_col_t *cols;
        gtid_t *dom; /* the GTID state, one per domain */
        size_t ndom;
        kinbox__buf_t state;
        bool in_tx, standalone, got_event;
        /* The transaction read wrote a table other than the position
         * table (kinbox_relay_position); foreign: one did since
         * kinbox__binlog_take_foreign(). */
        bool tx_foreign, foreign;
        /* The transaction read wrote kinbox_relay_position (any schema);
         * pos_writes: how many committed did (kinbox__binlog_pos_prove). */
        bool tx_pos;
        uint64_t pos_writes;
        gtid_t cur;
        kinbox__binlog_row_t *rows;
        size_t nrows, caprows;
        kinbox__binlog_tx_t tx;
        char err[600];
};

/* ---- the GTID state */

static int
state_parse(kinbox__binlog_t *b, const char *s)
{
        while (s && *s) {
                gtid_t g;
                int used = 0;
                if (sscanf(s, "%" SCNu32 "-%" SCNu32 "-%" SCNu64 "%n", &g.d,
                           &g.s, &g.n, &used) != 3)
                        return -1;
                gtid_t *v = realloc(b->dom, (b->ndom + 1) * sizeof(*v));
                if (!v)
                        return -1;
                b->dom = v;
                b->dom[b->ndom++] = g;
                s += used;
                while (*s == ',' || *s == ' ' || *s == '\n')
                        s++;
        }
        return 0;
}

static void
state_render(kinbox__binlog_t *b)
{
        kinbox__buf_reset(&b->state);
        for (size_t i = 0; i < b->ndom; i++)
                kinbox__buf_printf(
                    &b->state, "%s%" PRIu32 "-%" PRIu32 "-%" PRIu64,
                    i ? "," : "", b->dom[i].d, b->dom[i].s, b->dom[i].n);
        kinbox__buf_add(&b->state, "", 1);
        b->state.len--;
}

static int
state_apply(kinbox__binlog_t *b, gtid_t g)
{
        for (size_t i = 0; i < b->ndom; i++)
                if (b->dom[i].d == g.d) {
                        b->dom[i] = g;
                        state_render(b);
                        return 0;
                }
        gtid_t *v = realloc(b->dom, (b->ndom + 1) * sizeof(*v));
        if (!v)
                return -1;
        b->dom = v;
        b->dom[b->ndom++] = g;
        state_render(b);
        return 0;
}

const char *
kinbox__binlog_state(const kinbox__binlog_t *b)
{
        return b->state.p ? b->state.p : "";
}

bool
kinbox__binlog_take_foreign(kinbox__binlog_t *b)
{
        bool f = b->foreign;
        b->foreign = false;
        return f;
}

const char *
kinbox__binlog_error(const kinbox__binlog_t *b)
{
        return b->err;
}

/* ---- opening */

/* One row of one column (text) of a query on db; NULL for none. */
static char *
query_one(kinbox__db_t *db, const char *sql, int *rc)
{
        struct kinbox_rows_s *r = NULL;
        *rc = kinbox__db_query(db, sql, 0, NULL, &r);
        char *v = NULL;
        if (!*rc && r && r->nrows >= 1 && r->ncols >= 1 && r->values[0])
                v = kinbox__strdup(r->values[0]);
        kinbox_rows_destroy(r);
        return v;
}

int
kinbox__binlog_check(kinbox__db_t *db, char *errstr, size_t sz)
{
        if (db->backend != KINBOX_BACKEND_MYSQL) {
                kinbox__errstr(errstr, sz,
                               "relay.source = binlog needs MariaDB "
                               "(PostgreSQL: relay.source = wal)");
                return KINBOX_ERR_CONFIG;
        }
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db,
                                  "SELECT @@log_bin, @@binlog_format, "
                                  "@@binlog_row_image",
                                  0, NULL, &r);
        if (rc) {
                kinbox__errstr(errstr, sz, "reading the binlog settings: %s",
                               db->err.msg);
                kinbox_rows_destroy(r);
                return rc;
        }
        const char *on = r->nrows ? r->values[0] : NULL;
        const char *fmt = r->nrows ? r->values[1] : NULL;
        const char *img = r->nrows ? r->values[2] : NULL;
        rc = KINBOX_ERR_CONFIG;
        if (!on || strcmp(on, "1") != 0)
                kinbox__errstr(errstr, sz,
                               "relay.source = binlog: the server's log_bin "
                               "is OFF (start MariaDB with --log-bin "
                               "--binlog-format=ROW)");
        else if (!fmt || strcmp(fmt, "ROW") != 0)
                kinbox__errstr(errstr, sz,
                               "relay.source = binlog: the server's "
                               "binlog_format is %s, not ROW (SET GLOBAL "
                               "binlog_format = 'ROW' and in the server's "
                               "configuration)",
                               fmt ? fmt : "unknown");
        else if (!img || strcmp(img, "FULL") != 0)
                kinbox__errstr(errstr, sz,
                               "relay.source = binlog: the server's "
                               "binlog_row_image is %s, not FULL",
                               img ? img : "unknown");
        else
                rc = KINBOX_OK;
        kinbox_rows_destroy(r);
        return rc;
}

/* The table's columns in order: which is each field. */
static int
read_columns(kinbox__binlog_t *b)
{
        kinbox__param_t p = {.v = b->table};
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(
            b->db,
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE "
            "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = $1 ORDER BY "
            "ORDINAL_POSITION",
            1, &p, &r);
        if (rc || !r->nrows) {
                kinbox__errstr(b->err, sizeof(b->err),
                               "binlog: reading the columns of %s: %s",
                               b->table,
                               rc ? b->db->err.msg
                                  : "no such table (run "
                                    "kinbox migrate)");
                kinbox_rows_destroy(r);
                return rc ? rc : KINBOX_ERR_SCHEMA;
        }
        for (int f = 0; f < NF; f++)
                b->ix[f] = -1;
        for (size_t i = 0; i < r->nrows; i++)
                for (int f = 0; f < NF; f++)
                        if (r->values[i] &&
                            !strcmp(r->values[i], field_names[f]))
                                b->ix[f] = (int)i;
        b->ncols = (uint32_t)r->nrows;
        kinbox_rows_destroy(r);
        b->cols = kinbox__calloc(b->ncols, sizeof(*b->cols));
        for (int f = 0; f < NF; f++)
                if (b->ix[f] < 0 && f != F_MAXATT && f != F_STATUS) {
                        kinbox__errstr(b->err, sizeof(b->err),
                                       "binlog: %s has no column %s", b->table,
                                       field_names[f]);
                        return KINBOX_ERR_SCHEMA;
                }
        return b->cols ? KINBOX_OK : KINBOX_ERR_NOMEM;
}

/* The session variables of a GTID dump from b->state, then the dump. */
static int
start_dump(kinbox__binlog_t *b, const kinbox__binlog_opts_t *o)
{
        kinbox__buf_t q;
        kinbox__buf_init(&q);
        int hb = o->heartbeat_ms > 0 ? o->heartbeat_ms : 1000;
        kinbox__buf_printf(&q,
                           "SET @mariadb_slave_capability = 4, "
                           "@master_binlog_checksum = "
                           "@@global.binlog_checksum, "
                           "@slave_gtid_strict_mode = 0, "
                           "@slave_gtid_ignore_duplicates = 0, "
                           "@master_heartbeat_period = %lld, "
                           "@slave_connect_state = '%s'",
                           (long long)hb * 1000000LL, kinbox__binlog_state(b));
        int e = mysql_real_query(b->m, q.p, q.len);
        kinbox__buf_free(&q);
        if (e) {
                kinbox__errstr(b->err, sizeof(b->err),
                               "binlog: setting up the dump: MySQL %u: %s",
                               mysql_errno(b->m), mysql_error(b->m));
                return KINBOX_ERR_DB;
        }
        b->rpl = mariadb_rpl_init(b->m);
        uint32_t sid =
            o->server_id ? o->server_id : kinbox__binlog_server_id(o->name);
        if (!b->rpl ||
            mariadb_rpl_optionsv(b->rpl, MARIADB_RPL_SERVER_ID, sid) ||
            mariadb_rpl_optionsv(b->rpl, MARIADB_RPL_FILENAME, "", 0) ||
            mariadb_rpl_optionsv(b->rpl, MARIADB_RPL_START, 4UL) ||
            mariadb_rpl_optionsv(b->rpl, MARIADB_RPL_FLAGS, 0) ||
            mariadb_rpl_open(b->rpl)) {
                kinbox__errstr(
                    b->err, sizeof(b->err),
                    "binlog: opening the dump (server id %" PRIu32 "): %s",
                    sid,
                    b->rpl ? mariadb_rpl_error(b->rpl) : mysql_error(b->m));
                return KINBOX_ERR_DB_CONN;
        }
        return KINBOX_OK;
}

static int
open_session(kinbox__binlog_t *b, const kinbox__binlog_opts_t *o)
{
        char ebuf[256];
        b->db = kinbox__db_new_ops(&kinbox__mysql_ops, o->url, o->password,
                                   ebuf, sizeof(ebuf));
        if (!b->db) {
                kinbox__errstr(b->err, sizeof(b->err), "binlog: %s", ebuf);
                return KINBOX_ERR_INVALID;
        }
        int rc = kinbox__db_connect(b->db);
        if (rc) {
                kinbox__errstr(b->err, sizeof(b->err), "binlog: %s",
                               b->db->err.msg);
                return rc;
        }
        if ((rc = kinbox__binlog_check(b->db, b->err, sizeof(b->err))))
                return rc;
        char *schema = query_one(b->db, "SELECT DATABASE()", &rc);
        b->schema = schema;
        if (rc || !schema) {
                kinbox__errstr(b->err, sizeof(b->err),
                               "binlog: the URL names no database");
                return rc ? rc : KINBOX_ERR_CONFIG;
        }
        if ((rc = read_columns(b)))
                return rc;
        if (o->start && *o->start) {
                if (state_parse(b, o->start)) {
                        kinbox__errstr(b->err, sizeof(b->err),
                                       "binlog: bad GTID position '%s'",
                                       o->start);
                        return KINBOX_ERR_INVALID;
                }
        } else {
                char *pos = query_one(b->db, "SELECT @@gtid_binlog_pos", &rc);
                int bad = rc || state_parse(b, pos);
                free(pos);
                if (bad) {
                        kinbox__errstr(b->err, sizeof(b->err),
                                       "binlog: reading @@gtid_binlog_pos");
                        return rc ? rc : KINBOX_ERR_DB;
                }
        }
        state_render(b);
        bool down;
        b->m = kinbox__db_mysql(b->db, &down);
        return start_dump(b, o);
}

kinbox__binlog_t *
kinbox__binlog_open(const kinbox__binlog_opts_t *o, int *code, char *errstr,
                    size_t sz)
{
        kinbox__binlog_t *b = kinbox__calloc(1, sizeof(*b));
        if (!b) {
                *code = KINBOX_ERR_NOMEM;
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        kinbox__buf_init(&b->state);
        b->table = kinbox__strdup(o->table ? o->table : "kinbox_outbox");
        int rc = open_session(b, o);
        if (rc) {
                *code = rc;
                kinbox__errstr(errstr, sz, "%s", b->err);
                kinbox__binlog_close(b);
                return NULL;
        }
        *code = KINBOX_OK;
        return b;
}

static void
rows_clear(kinbox__binlog_t *b)
{
        for (size_t i = 0; i < b->nrows; i++)
                free((void *)b->rows[i].kind); /* the row's one block */
        b->nrows = 0;
}

void
kinbox__binlog_close(kinbox__binlog_t *b)
{
        if (!b)
                return;
        if (b->ev)
                mariadb_free_rpl_event(b->ev);
        if (b->rpl)
                mariadb_rpl_close(b->rpl); /* not b->m */
        kinbox__db_destroy(b->db); /* NULL-safe; closes b->m */
        rows_clear(b);
        free(b->rows);
        free(b->cols);
        free(b->dom);
        free(b->schema);
        free(b->table);
        kinbox__bl_tmap_free(&b->tmap);
        kinbox__buf_free(&b->state);
        free(b);
}

/* ---- reading */

/* Field f of the row decoded: a NULL column when the table map has no
 * such column (an event written before a column was added at the end). */
static const kinbox__bl_col_t *
fcol(const kinbox__binlog_t *b, int f)
{
        static const kinbox__bl_col_t none = {.null = true};
        int k = b->ix[f];
        return k < 0 || (uint32_t)k >= b->tmap.ncols ? &none : &b->cols[k];
}

/* Copy the decoded fields of one row into a block of its own. */
static int
row_keep(kinbox__binlog_t *b)
{
        static const int strs[] = {F_KIND, F_DEST,    F_IDEM,
                                   F_AGG,  F_HEADERS, F_STATUS};
        size_t need = 0;
        for (size_t i = 0; i < sizeof(strs) / sizeof(*strs); i++)
                need += fcol(b, strs[i])->n + 1;
        need += fcol(b, F_PAYLOAD)->n + 1;
        if (b->nrows == b->caprows) {
                size_t cap = b->caprows ? 2 * b->caprows : 64;
                kinbox__binlog_row_t *v = realloc(b->rows, cap * sizeof(*v));
                if (!v)
                        return -1;
                b->rows = v;
                b->caprows = cap;
        }
        char *blk = malloc(need + 1);
        if (!blk)
                return -1;
        kinbox__binlog_row_t *r = &b->rows[b->nrows];
        memset(r, 0, sizeof(*r));
        const char **dst[] = {&r->kind,         &r->destination, &r->idem_key,
                              &r->aggregate_id, &r->headers,     &r->status};
        char *at = blk;
        /* kind first: rows_clear() frees the block through it. */
        for (size_t i = 0; i < sizeof(strs) / sizeof(*strs); i++) {
                const kinbox__bl_col_t *c = fcol(b, strs[i]);
                if (c->null && i != 0)
                        continue;
                if (c->n)
                        memcpy(at, c->p, c->n);
                at[c->n] = '\0';
                *dst[i] = at;
                at += c->n + 1;
        }
        const kinbox__bl_col_t *pl = fcol(b, F_PAYLOAD);
        if (!pl->null) {
                memcpy(at, pl->p, pl->n);
                r->payload = at;
                r->payload_size = pl->n;
        }
        r->id = fcol(b, F_ID)->i;
        r->max_attempts = (int)fcol(b, F_MAXATT)->i;
        r->created_at_us = fcol(b, F_CREATED)->us;
        b->nrows++;
        return 0;
}

/* The rows of a WRITE_ROWS event on the outbox. */
static int
on_rows(kinbox__binlog_t *b, MARIADB_RPL_EVENT *ev)
{
        struct st_mariadb_rpl_rows_event *re = &ev->event.rows;
        if (!b->have_tmap || re->table_id != b->tmap.table_id ||
            re->type != WRITE_ROWS)
                return 0;
        if (ev->event_type == WRITE_ROWS_COMPRESSED_EVENT) {
                kinbox__errstr(b->err, sizeof(b->err),
                               "binlog: a compressed ROWS v2 event "
                               "(Connector/C does not decode it)");
                return KINBOX_ERR_DB;
        }
        /* Columns added since the relay started (or removed since the
         * event was written): fields are mapped by position, columns
         * added at the end leave them in place. */
        if (re->column_count != b->tmap.ncols) {
                kinbox__errstr(b->err, sizeof(b->err),
                               "binlog: a row event of %u columns for a "
                               "table map of %u",
                               re->column_count, b->tmap.ncols);
                return KINBOX_ERR_DB;
        }
        if (b->tmap.ncols > b->ncols) {
                kinbox__bl_col_t *v =
                    realloc(b->cols, b->tmap.ncols * sizeof(*v));
                if (!v)
                        return KINBOX_ERR_NOMEM;
                b->cols = v;
                b->ncols = b->tmap.ncols;
        }
        const unsigned char *p = re->row_data;
        const unsigned char *end = p + re->row_data_size;
        while (p < end) {
                if (kinbox__bl_row_decode(&b->tmap, re->column_bitmap, &p, end,
                                          b->cols, b->err, sizeof(b->err)))
                        return KINBOX_ERR_DB;
                if (b->in_tx && row_keep(b)) {
                        kinbox__errstr(b->err, sizeof(b->err),
                                       "binlog: out of memory");
                        return KINBOX_ERR_NOMEM;
                }
        }
        return 0;
}

/* A table map: the outbox's is kept, every other one forgotten. */
static int
on_table_map(kinbox__binlog_t *b, MARIADB_RPL_EVENT *ev)
{
        struct st_mariadb_rpl_table_map_event *tm = &ev->event.table_map;
        bool ours =
            tm->database.length == strlen(b->schema) &&
            !memcmp(tm->database.str, b->schema, tm->database.length) &&
            tm->table.length == strlen(b->table) &&
            !memcmp(tm->table.str, b->table, tm->table.length);
        if (!ours) {
                if (tm->table.length == 21 &&
                    !memcmp(tm->table.str, "kinbox_relay_position", 21))
                        b->tx_pos = true;
                else
                        b->tx_foreign = true;
                return 0;
        }
        b->tx_foreign = true;
        if (b->have_tmap && b->tmap.table_id == tm->table_id &&
            b->tmap.ncols == tm->column_count)
                return 0;
        b->have_tmap = false;
        if (kinbox__bl_tmap_set(&b->tmap, tm->table_id,
                                (const unsigned char *)tm->column_types.str,
                                tm->column_count,
                                (const unsigned char *)tm->metadata.str,
                                tm->metadata.length, b->err, sizeof(b->err)))
                return KINBOX_ERR_DB;
        b->have_tmap = true;
        return 0;
}

/* The end of the transaction read: the state moves past its GTID. */
static int
on_commit(kinbox__binlog_t *b, uint32_t when, bool rolled_back)
{
        b->in_tx = false;
        if (b->tx_pos) /* rolled back too: counted, to be safe */
                b->pos_writes++;
        if (state_apply(b, b->cur)) {
                kinbox__errstr(b->err, sizeof(b->err), "out of memory");
                return KINBOX_ERR_NOMEM;
        }
        if (b->tx_foreign || b->standalone)
                b->foreign = true;
        if (rolled_back || !b->nrows)
                return b->tx_foreign || b->standalone ? KINBOX__BL_IDLE : 0;
        snprintf(b->tx.gtid, sizeof(b->tx.gtid),
                 "%" PRIu32 "-%" PRIu32 "-%" PRIu64, b->cur.d, b->cur.s,
                 b->cur.n);
        b->tx.state = kinbox__binlog_state(b);
        b->tx.commit_time = when;
        b->tx.rows = b->rows;
        b->tx.nrows = b->nrows;
        return KINBOX__BL_TX;
}

static int
on_query(kinbox__binlog_t *b, MARIADB_RPL_EVENT *ev)
{
        const MARIADB_STRING *st = &ev->event.query.statement;
        if (!b->in_tx)
                return 0;
        if (b->standalone)
                return on_commit(b, ev->timestamp, false);
        if (st->length == 6 && !strncmp(st->str, "COMMIT", 6))
                return on_commit(b, ev->timestamp, false);
        if (st->length == 8 && !strncmp(st->str, "ROLLBACK", 8))
                return on_commit(b, ev->timestamp, true);
        return 0;
}

/* The server ended the dump or the connection failed. */
static int
fetch_failed(kinbox__binlog_t *b)
{
        unsigned int e = mysql_errno(b->m);
        if (e == 1236) {
                kinbox__errstr(b->err, sizeof(b->err),
                               "binlog: the server no longer has the binlog "
                               "after GTID position %s (purged: %s); the "
                               "outbox rows committed since are only in "
                               "the table: publish them again with "
                               "`kinbox outbox resend --since TIME` (a time "
                               "before the relay stopped), then clear the "
                               "position (`kinbox outbox resend` does)",
                               kinbox__binlog_state(b), mysql_error(b->m));
                return KINBOX_ERR_NOT_FOUND;
        }
        kinbox__errstr(b->err, sizeof(b->err),
                       "binlog: reading the dump: MySQL %u: %s", e,
                       e ? mysql_error(b->m) : mariadb_rpl_error(b->rpl));
        return e && e < 2000 ? KINBOX_ERR_DB : KINBOX_ERR_DB_CONN;
}

static int
on_event(kinbox__binlog_t *b, MARIADB_RPL_EVENT *ev)
{
        switch (ev->event_type) {
        case GTID_EVENT:
                rows_clear(b);
                b->in_tx = true;
                b->tx_foreign = b->tx_pos = false;
                b->standalone = ev->event.gtid.flags & FL_STANDALONE;
                b->cur.d = ev->event.gtid.domain_id;
                b->cur.s = ev->server_id;
                b->cur.n = ev->event.gtid.sequence_nr;
                return 0;
        case TABLE_MAP_EVENT:
                return on_table_map(b, ev);
        case WRITE_ROWS_EVENT_V1:
        case WRITE_ROWS_EVENT:
        case WRITE_ROWS_COMPRESSED_EVENT_V1:
        case WRITE_ROWS_COMPRESSED_EVENT:
                return on_rows(b, ev);
        case XID_EVENT:
                return b->in_tx ? on_commit(b, ev->timestamp, false) : 0;
        case QUERY_EVENT:
                return on_query(b, ev);
        case HEARTBEAT_LOG_EVENT:
                return b->in_tx ? 0 : KINBOX__BL_IDLE;
        default:
                return 0;
        }
}

int
kinbox__binlog_next(kinbox__binlog_t *b, const kinbox__binlog_tx_t **tx)
{
        *tx = NULL;
        if (!b->in_tx)
                rows_clear(b);
        for (;;) {
                MARIADB_RPL_EVENT *ev = mariadb_rpl_fetch(b->rpl, b->ev);
                if (!ev) {
                        b->ev = NULL; /* freed by the library */
                        return fetch_failed(b);
                }
                b->ev = ev;
                b->got_event = true;
                int rc = on_event(b, ev);
                if (rc == KINBOX__BL_TX)
                        *tx = &b->tx;
                if (rc)
                        return rc;
        }
}

/* ---- the purge check (the position table, the lock: mysql_binlog_pos.c) */

/* The oldest binlog's name (first) and start position (*oldest: the GTID
 * state after every purged transaction, its Gtid_list). */
static int
oldest_start(kinbox__db_t *db, char *first, size_t fsz,
             kinbox__binlog_t *oldest, char *err, size_t sz)
{
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(db, "SHOW BINARY LOGS", 0, NULL, &r);
        if (rc || !r->nrows) {
                kinbox__errstr(err, sz, "binlog: SHOW BINARY LOGS: %s",
                               rc ? db->err.msg : "no binlog");
                kinbox_rows_destroy(r);
                return rc ? rc : KINBOX_ERR_CONFIG;
        }
        kinbox__param_t p = {.v = r->values[0]};
        snprintf(first, fsz, "%s", r->values[0]);
        struct kinbox_rows_s *g = NULL;
        rc = kinbox__db_query(db, "SELECT BINLOG_GTID_POS($1, 4)", 1, &p, &g);
        kinbox_rows_destroy(r);
        int bad = rc || state_parse(oldest, g->nrows ? g->values[0] : NULL);
        kinbox_rows_destroy(g);
        if (bad)
                kinbox__errstr(err, sz,
                               "binlog: reading the oldest binlog's "
                               "position: %s",
                               rc ? db->err.msg : "bad GTID state");
        return bad ? (rc ? rc : KINBOX_ERR_INVALID) : KINBOX_OK;
}

int
kinbox__binlog_pos_check(kinbox__db_t *db, const char *state, char *err,
                         size_t sz)
{
        char first[256];
        kinbox__binlog_t have = {0}, oldest = {0};
        int out = oldest_start(db, first, sizeof(first), &oldest, err, sz);
        if (!out && state_parse(&have, state)) {
                kinbox__errstr(err, sz, "binlog: bad GTID state '%s'", state);
                out = KINBOX_ERR_INVALID;
        }
        for (size_t i = 0; !out && i < oldest.ndom; i++)
                for (size_t j = 0; j < have.ndom; j++)
                        if (have.dom[j].d == oldest.dom[i].d &&
                            have.dom[j].n < oldest.dom[i].n)
                                out = KINBOX_ERR_NOT_FOUND;
        if (out == KINBOX_ERR_NOT_FOUND)
                kinbox__errstr(
                    err, sz,
                    "binlog: the relay's position %s was purged (the oldest "
                    "binlog, %s, starts after it): the outbox rows committed "
                    "since are only in the table; publish them again with "
                    "`kinbox outbox resend --since TIME` (a time before the "
                    "relay stopped), which also moves the position to now",
                    state, first);
        free(have.dom);
        free(oldest.dom);
        return out;
}

/* The sequence number of domain d in g (0: g has none). */
static uint64_t
dom_seq(const kinbox__binlog_t *g, uint32_t d)
{
        for (size_t i = 0; i < g->ndom; i++)
                if (g->dom[i].d == d)
                        return g->dom[i].n;
        return 0;
}

/* Whether the binlog purged exactly one transaction after have: the
 * oldest binlog starts one sequence number after have in one domain and
 * at or before have in every other. */
static bool
one_purged(const kinbox__binlog_t *have, const kinbox__binlog_t *oldest)
{
        int after = 0;
        for (size_t i = 0; i < oldest->ndom; i++) {
                uint64_t h = dom_seq(have, oldest->dom[i].d);
                if (oldest->dom[i].n <= h)
                        continue;
                if (oldest->dom[i].n != h + 1)
                        return false;
                after++;
        }
        return after == 1;
}

/* Whether the reader's state is at or after every domain of now. */
static bool
reached(const kinbox__binlog_t *b, const kinbox__binlog_t *now)
{
        for (size_t i = 0; i < now->ndom; i++) {
                bool seen = false;
                for (size_t j = 0; j < b->ndom; j++)
                        if (b->dom[j].d == now->dom[i].d)
                                seen = b->dom[j].n >= now->dom[i].n;
                if (!seen)
                        return false;
        }
        return true;
}

/* Read the binlog from o->start to the state now (up to PROVE_SCAN_MS):
 * 1 no transaction in it wrote kinbox_relay_position, 0 one did or the
 * end was not reached in time, <0 an error (err). */
#define PROVE_SCAN_MS 60000
static int
no_pos_write_after(const kinbox__binlog_opts_t *o, const kinbox__binlog_t *now,
                   char *err, size_t sz)
{
        int code = 0;
        kinbox__binlog_t *rd = kinbox__binlog_open(o, &code, err, sz);
        if (!rd)
                return code;
        int64_t until = kinbox__now_ms() + PROVE_SCAN_MS;
        int out = 0;
        while (!reached(rd, now) && !rd->pos_writes &&
               kinbox__now_ms() < until) {
                const kinbox__binlog_tx_t *tx = NULL;
                int rc = kinbox__binlog_next(rd, &tx);
                if (rc < 0) {
                        kinbox__errstr(err, sz, "%s", rd->err);
                        out = rc;
                        break;
                }
        }
        if (!out)
                out = reached(rd, now) && !rd->pos_writes;
        kinbox__binlog_close(rd);
        return out;
}

int
kinbox__binlog_pos_prove(kinbox__db_t *db, const kinbox__binlog_opts_t *o,
                         char **start, char *err, size_t sz)
{
        char first[256];
        char *pos = NULL;
        *start = NULL;
        kinbox__binlog_t have = {0}, oldest = {0}, now = {0};
        kinbox__buf_init(&oldest.state);
        int rc = oldest_start(db, first, sizeof(first), &oldest, err, sz);
        if (!rc && (rc = kinbox__binlog_pos_now(db, &pos)))
                kinbox__errstr(err, sz, "binlog: @@gtid_binlog_pos: %s",
                               db->err.msg);
        if (!rc && (state_parse(&have, o->start) || state_parse(&now, pos))) {
                kinbox__errstr(err, sz, "binlog: bad GTID state");
                rc = KINBOX_ERR_INVALID;
        }
        free(pos);
        if (!rc && one_purged(&have, &oldest)) {
                state_render(&oldest);
                kinbox__binlog_opts_t scan = *o;
                scan.start = oldest.state.p;
                rc = no_pos_write_after(&scan, &now, err, sz);
                if (rc == 1)
                        *start = kinbox__strdup(oldest.state.p);
        }
        free(have.dom);
        free(now.dom);
        free(oldest.dom);
        kinbox__buf_free(&oldest.state);
        return rc;
}

/* Whether every domain of g is at or before the same domain of have. */
static bool
state_le(const kinbox__binlog_t *g, const kinbox__binlog_t *have)
{
        for (size_t i = 0; i < g->ndom; i++)
                for (size_t j = 0; j < have->ndom; j++)
                        if (have->dom[j].d == g->dom[i].d &&
                            have->dom[j].n < g->dom[i].n)
                                return false;
        return true;
}

int
kinbox__binlog_pos_retained(kinbox__db_t *db, const char *state,
                            int64_t *bytes, bool *purged)
{
        struct kinbox_rows_s *r = NULL;
        *bytes = 0;
        *purged = false;
        int rc = kinbox__db_query(db, "SHOW BINARY LOGS", 0, NULL, &r);
        kinbox__binlog_t have = {0};
        if (!rc && state_parse(&have, state))
                rc = KINBOX_ERR_INVALID;
        size_t from = 0; /* the file the position is in */
        for (size_t i = 0; !rc && i < r->nrows; i++) {
                char **c = r->values + i * (size_t)r->ncols;
                kinbox__param_t p = {.v = c[0]};
                struct kinbox_rows_s *g = NULL;
                rc = kinbox__db_query(db, "SELECT BINLOG_GTID_POS($1, 4)", 1,
                                      &p, &g);
                kinbox__binlog_t start = {0};
                if (!rc &&
                    !state_parse(&start, g->nrows ? g->values[0] : NULL)) {
                        if (state_le(&start, &have))
                                from = i;
                        else if (i == 0)
                                *purged = true;
                }
                free(start.dom);
                kinbox_rows_destroy(g);
        }
        for (size_t i = from; !rc && i < r->nrows; i++)
                *bytes +=
                    strtoll(r->values[i * (size_t)r->ncols + 1], NULL, 10);
        free(have.dom);
        kinbox_rows_destroy(r);
        return rc;
}
