/*
 * db/pg_repl.c -- the log relay's PostgreSQL source (relay.source = wal):
 * a logical replication slot read with pgoutput (proto_version 1: only
 * committed transactions, whole, in commit order; messages on), over a
 * replication=database connection. The contract: db/logsrc_ops.h.
 *
 * open(): on a plain connection, the prerequisites (wal_level = logical,
 * a role with REPLICATION, a free slot and walsender, the publication
 * kinbox_outbox_pub of migration 0010, the slot not lost); then the
 * replication connection, and the slot when missing (pgoutput; a failover
 * slot with relay.slot_failover, PostgreSQL 17 and later).
 * start(): START_REPLICATION ... LOGICAL 0/0: from the slot's
 * confirmed_flush_lsn. next(): CopyData: 'w' XLogData carrying one
 * pgoutput message (B begin, C commit, R relation, I insert, M message;
 * the rest skipped), 'k' keepalive (answered at once when the server asks).
 * Feedback ('r'): write = flush = apply = the confirmed position, so the
 * server keeps sending keepalives while it is ahead of it.
 *
 * Values come in text form: the session runs with DateStyle ISO, TimeZone
 * UTC and bytea_output hex (startup options), so created_at and payload
 * parse without the catalog. Columns are found by name in the Relation
 * message (re-sent after a reconnect and after DDL).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "../db.h"
#include "../internal.h"

#define PUBLICATION "kinbox_outbox_pub"
#define MSG_PREFIX "kinbox."
#define FEEDBACK_MS 1000 /* feedback at least this often when changed */
#define IDLE_FEEDBACK_MS 10000
#define PG_EPOCH_US 946684800000000LL /* 2000-01-01 in Unix microseconds */

/* Outbox columns the relay reads, in this order. */
enum {
        C_ID,
        C_KIND,
        C_DEST,
        C_IDEM,
        C_AGG,
        C_PAYLOAD,
        C_HEADERS,
        C_CREATED,
        C_STATUS,
        C_N
};
static const char *const col_names[C_N] = {
    "id",      "kind",    "destination", "idem_key", "aggregate_id",
    "payload", "headers", "created_at",  "status"};

typedef struct rel {
        uint32_t id;
        bool outbox;
        int natts;
        int col[C_N]; /* attribute index of each column, -1 absent */
} rel_t;

typedef struct repl {
        PGconn *conn;
        PGconn *plain; /* dead(): a plain connection, made on first need */
        char *copybuf; /* the last PQgetCopyData() buffer */
        rel_t *rels;
        size_t nrels, caprels;
        bool in_tx;
        int64_t commit_ms;
        uint64_t confirmed; /* flush position reported */
        bool dirty; /* confirmed changed since the last feedback */
        int64_t fed_at; /* last feedback (monotonic ms) */
        kinbox__buf_t val[C_N]; /* a row's values, NUL-terminated */
        bool null[C_N];
        kinbox__buf_t payload; /* decoded bytea */
        kinbox__buf_t prefix;
} repl_t;

/* ---- byte reading */

typedef struct rd {
        const unsigned char *p;
        size_t n;
        bool bad;
} rd_t;

static uint64_t
rd_u(rd_t *r, int bytes)
{
        if (r->bad || r->n < (size_t)bytes) {
                r->bad = true;
                return 0;
        }
        uint64_t v = 0;
        for (int i = 0; i < bytes; i++)
                v = (v << 8) | r->p[i];
        r->p += bytes;
        r->n -= (size_t)bytes;
        return v;
}

/* A NUL-terminated string in place (NULL when malformed). */
static const char *
rd_str(rd_t *r)
{
        const unsigned char *z = r->bad ? NULL : memchr(r->p, 0, r->n);
        if (!z) {
                r->bad = true;
                return NULL;
        }
        const char *s = (const char *)r->p;
        r->n -= (size_t)(z - r->p) + 1;
        r->p = z + 1;
        return s;
}

static const unsigned char *
rd_bytes(rd_t *r, size_t len)
{
        if (r->bad || r->n < len) {
                r->bad = true;
                return NULL;
        }
        const unsigned char *s = r->p;
        r->p += len;
        r->n -= len;
        return s;
}

static void
put_u64(unsigned char *p, uint64_t v)
{
        for (int i = 7; i >= 0; i--) {
                p[i] = (unsigned char)(v & 0xff);
                v >>= 8;
        }
}

static int64_t
pg_now_us(void)
{
        return kinbox__wall_ms() * 1000 - PG_EPOCH_US;
}

static void seterr(kinbox__logsrc_t *s, const char *fmt, ...)
    KINBOX_PRINTF(2, 3);

static void
seterr(kinbox__logsrc_t *s, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->err, sizeof(s->err), fmt, ap);
        va_end(ap);
        for (char *c = s->err; *c; c++)
                if (*c == '\n' || *c == '\r')
                        *c = ' ';
}

/* ---- connections */

static PGconn *
connect_pg(kinbox__logsrc_t *s, bool replication)
{
        const char *keys[8], *vals[8];
        int n = 0;
        keys[n] = "dbname";
        vals[n++] = s->url;
        if (s->password) {
                keys[n] = "password";
                vals[n++] = s->password;
        }
        keys[n] = "connect_timeout";
        vals[n++] = "10";
        keys[n] = "application_name";
        vals[n++] = "kinbox-wal";
        keys[n] = "options";
        vals[n++] = "-c datestyle=ISO,YMD -c timezone=UTC "
                    "-c bytea_output=hex";
        if (replication) {
                keys[n] = "replication";
                vals[n++] = "database";
        }
        keys[n] = NULL;
        vals[n] = NULL;
        return PQconnectdbParams(keys, vals, 1);
}

/* What a failed connection means: the role without REPLICATION is the
 * operator's to fix (KINBOX_ERR_CONFIG), the rest is transient. */
static int
conn_failed(kinbox__logsrc_t *s, PGconn *c, const char *what)
{
        const char *m = c ? PQerrorMessage(c) : "out of memory";
        int rc = KINBOX_ERR_DB_CONN;
        if (strstr(m, "replication") &&
            (strstr(m, "permission") || strstr(m, "must be")))
                rc = KINBOX_ERR_CONFIG;
        else if (strstr(m, "wal_level") || strstr(m, "max_wal_senders") ||
                 strstr(m, "remaining connection slots"))
                rc = strstr(m, "remaining") ? KINBOX_ERR_DB_CONN
                                            : KINBOX_ERR_CONFIG;
        seterr(s, "relay.source = wal: %s: %s", what, m);
        if (c)
                PQfinish(c);
        return rc;
}

static const char check_sql[] =
    "SELECT current_setting('wal_level'),"
    " (SELECT rolreplication OR rolsuper FROM pg_roles"
    "  WHERE rolname = current_user),"
    " current_setting('max_replication_slots')::int"
    "  - (SELECT count(*) FROM pg_replication_slots),"
    " current_setting('max_wal_senders')::int"
    "  - (SELECT count(*) FROM pg_stat_replication),"
    " (SELECT plugin || ' ' || coalesce(wal_status, '') || ' ' ||"
    "   (database = current_database())::text"
    "  FROM pg_replication_slots WHERE slot_name = $1),"
    " EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '" PUBLICATION "')";

/* The prerequisites, on a plain connection; *exists: the slot is there. */
static int
check(kinbox__logsrc_t *s, bool *exists)
{
        PGconn *c = connect_pg(s, false);
        if (!c || PQstatus(c) != CONNECTION_OK)
                return conn_failed(s, c, "cannot connect");
        const char *p[1] = {s->slot};
        PGresult *res = PQexecParams(c, check_sql, 1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
                seterr(s, "relay.source = wal: checking the server: %s",
                       PQerrorMessage(c));
                PQclear(res);
                PQfinish(c);
                return KINBOX_ERR_DB;
        }
        const char *wl = PQgetvalue(res, 0, 0);
        const char *slot =
            PQgetisnull(res, 0, 4) ? NULL : PQgetvalue(res, 0, 4);
        *exists = slot != NULL;
        int rc = KINBOX_OK;
        if (strcmp(wl, "logical")) {
                seterr(s,
                       "relay.source = wal needs wal_level = logical on "
                       "the server (it is %s; set it in postgresql.conf "
                       "and restart PostgreSQL)",
                       wl);
                rc = KINBOX_ERR_CONFIG;
        } else if (strcmp(PQgetvalue(res, 0, 1), "t")) {
                seterr(s,
                       "relay.source = wal needs a role with REPLICATION "
                       "(ALTER ROLE %s REPLICATION)",
                       PQuser(c));
                rc = KINBOX_ERR_CONFIG;
        } else if (!slot && atoi(PQgetvalue(res, 0, 2)) <= 0) {
                seterr(s,
                       "relay.source = wal: no free replication slot for "
                       "%s: raise max_replication_slots (every slot is "
                       "in use)",
                       s->slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (atoi(PQgetvalue(res, 0, 3)) <= 0) {
                seterr(s, "relay.source = wal: no free WAL sender: raise "
                          "max_wal_senders (every one is in use)");
                rc = KINBOX_ERR_CONFIG;
        } else if (slot && strncmp(slot, "pgoutput ", 9)) {
                seterr(s,
                       "relay.source = wal: slot %s (relay.slot) exists "
                       "with another output plugin (%s): name another "
                       "slot",
                       s->slot, slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (slot && strstr(slot, " false")) {
                seterr(s,
                       "relay.source = wal: slot %s (relay.slot) belongs "
                       "to another database: name another slot",
                       s->slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (slot && strstr(slot, " lost ")) {
                seterr(s,
                       "relay.source = wal: slot %s (relay.slot) is lost "
                       "(max_slot_wal_keep_size removed WAL it needed): "
                       "events after its position may be unpublished; "
                       "see docs/outbox.md (a lost slot) to recover",
                       s->slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (strcmp(PQgetvalue(res, 0, 5), "t")) {
                seterr(s, "relay.source = wal: publication " PUBLICATION
                          " is missing: run kinbox migrate");
                rc = KINBOX_ERR_SCHEMA;
        }
        PQclear(res);
        PQfinish(c);
        return rc;
}

/*
 * The slot: made when missing (pgoutput, no snapshot). relay.slot_failover
 * (PostgreSQL 17 and later, refused below): made with FAILOVER, or an
 * existing slot without it altered (ALTER_REPLICATION_SLOT), so that the
 * standbys' slot synchronization keeps a copy the relay goes on from after
 * a promotion.
 */
static int
create_slot(kinbox__logsrc_t *s, repl_t *x, bool exists)
{
        bool fo = kinbox__settings_of(s->conf)->relay_slot_failover;
        if (fo && PQserverVersion(x->conn) < 170000) {
                seterr(s,
                       "relay.slot_failover needs PostgreSQL 17 or later "
                       "(the server is %d): before 17 a logical slot does "
                       "not survive a failover; see docs/outbox.md (failover)",
                       PQserverVersion(x->conn));
                return KINBOX_ERR_CONFIG;
        }
        if (exists && !fo)
                return KINBOX_OK;
        char *id = PQescapeIdentifier(x->conn, s->slot, strlen(s->slot));
        char *lit = PQescapeLiteral(x->conn, s->slot, strlen(s->slot));
        char sql[600];
        PGresult *res = NULL;
        if (id && lit && exists) {
                snprintf(sql, sizeof(sql),
                         "SELECT 1 FROM pg_replication_slots WHERE "
                         "slot_name = %s AND NOT failover",
                         lit);
                res = PQexec(x->conn, sql);
                exists = PQresultStatus(res) == PGRES_TUPLES_OK &&
                         PQntuples(res) == 0; /* failover already */
                PQclear(res);
                snprintf(sql, sizeof(sql),
                         "ALTER_REPLICATION_SLOT %s (FAILOVER true)", id);
        } else if (id && lit) {
                snprintf(sql, sizeof(sql),
                         fo ? "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput "
                              "(SNAPSHOT 'nothing', FAILOVER true)"
                            : "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput "
                              "NOEXPORT_SNAPSHOT",
                         id);
        }
        PQfreemem(id);
        PQfreemem(lit);
        if (!id || !lit) {
                seterr(s, "relay.source = wal: %s", PQerrorMessage(x->conn));
                return KINBOX_ERR_DB;
        }
        if (exists) /* a failover slot already */
                return KINBOX_OK;
        res = PQexec(x->conn, sql);
        int rc = KINBOX_OK;
        ExecStatusType ok = sql[0] == 'A' ? PGRES_COMMAND_OK : PGRES_TUPLES_OK;
        if (PQresultStatus(res) != ok) {
                const char *st = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                /* 42710: made meanwhile by another relay: use it. 55006:
                 * altered by the reader that holds it (it is altered when
                 * this relay takes the slot over). */
                if (!st || (strcmp(st, "42710") && strcmp(st, "55006"))) {
                        seterr(s, "relay.source = wal: %s slot %s: %s",
                               sql[0] == 'A' ? "altering" : "creating",
                               s->slot, PQerrorMessage(x->conn));
                        rc = st && !strcmp(st, "53400") ? KINBOX_ERR_CONFIG
                                                        : KINBOX_ERR_DB;
                }
        } else {
                kinbox__log(s->log, KINBOX_LOG_NOTICE, "relay",
                            "replication slot %s %s%s", s->slot,
                            sql[0] == 'A' ? "altered to failover"
                                          : "created at ",
                            sql[0] == 'A' ? "" : PQgetvalue(res, 0, 1));
        }
        PQclear(res);
        return rc;
}

static void
repl_free(repl_t *x)
{
        if (!x)
                return;
        if (x->copybuf)
                PQfreemem(x->copybuf);
        if (x->conn)
                PQfinish(x->conn);
        if (x->plain)
                PQfinish(x->plain);
        free(x->rels);
        for (int i = 0; i < C_N; i++)
                kinbox__buf_free(&x->val[i]);
        kinbox__buf_free(&x->payload);
        kinbox__buf_free(&x->prefix);
        free(x);
}

static int
repl_open(kinbox__logsrc_t *s)
{
        bool exists = false;
        int rc = check(s, &exists);
        if (rc)
                return rc;
        repl_t *x = kinbox__calloc(1, sizeof(*x));
        if (!x)
                return KINBOX_ERR_NOMEM;
        for (int i = 0; i < C_N; i++)
                kinbox__buf_init(&x->val[i]);
        kinbox__buf_init(&x->payload);
        kinbox__buf_init(&x->prefix);
        x->conn = connect_pg(s, true);
        if (!x->conn || PQstatus(x->conn) != CONNECTION_OK) {
                rc = conn_failed(s, x->conn, "replication connection");
                x->conn = NULL;
                repl_free(x);
                return rc;
        }
        if ((rc = create_slot(s, x, exists))) {
                repl_free(x);
                return rc;
        }
        s->impl = x;
        return KINBOX_OK;
}

static int
repl_start(kinbox__logsrc_t *s)
{
        repl_t *x = s->impl;
        char *id = PQescapeIdentifier(x->conn, s->slot, strlen(s->slot));
        if (!id)
                return KINBOX_ERR_NOMEM;
        char sql[600];
        snprintf(sql, sizeof(sql),
                 "START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '1', "
                 "publication_names '" PUBLICATION "', messages 'true')",
                 id);
        PQfreemem(id);
        PGresult *res = PQexec(x->conn, sql);
        if (PQresultStatus(res) != PGRES_COPY_BOTH) {
                const char *st = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                /* 55006: the slot is active for another relay (its lease):
                 * wait and try again. */
                bool busy = st && !strcmp(st, "55006");
                seterr(s,
                       "relay.source = wal: START_REPLICATION on slot %s: "
                       "SQLSTATE %s: %s",
                       s->slot, st ? st : "?????", PQerrorMessage(x->conn));
                PQclear(res);
                return busy ? KINBOX_ERR_STATE : KINBOX_ERR_DB_CONN;
        }
        PQclear(res);
        x->in_tx = false;
        x->nrels = 0;
        x->fed_at = kinbox__now_ms();
        return KINBOX_OK;
}

/* Standby status update: write = flush = apply = confirmed. */
static int
feedback(kinbox__logsrc_t *s, repl_t *x, bool reply)
{
        unsigned char m[1 + 8 + 8 + 8 + 8 + 1];
        m[0] = 'r';
        put_u64(m + 1, x->confirmed);
        put_u64(m + 9, x->confirmed);
        put_u64(m + 17, x->confirmed);
        put_u64(m + 25, (uint64_t)pg_now_us());
        m[33] = reply ? 1 : 0;
        if (PQputCopyData(x->conn, (const char *)m, sizeof(m)) <= 0 ||
            PQflush(x->conn)) {
                seterr(s, "relay.source = wal: sending feedback: %s",
                       PQerrorMessage(x->conn));
                return KINBOX_ERR_DB_CONN;
        }
        x->dirty = false;
        x->fed_at = kinbox__now_ms();
        return KINBOX_OK;
}

static int
repl_confirm(kinbox__logsrc_t *s, const kinbox__logpos_t *pos)
{
        repl_t *x = s->impl;
        if (!x)
                return KINBOX_OK;
        if (pos->lsn <= x->confirmed) /* the loop is not reading: alive */
                return kinbox__now_ms() - x->fed_at >= IDLE_FEEDBACK_MS
                           ? feedback(s, x, false)
                           : KINBOX_OK;
        x->confirmed = pos->lsn;
        x->dirty = true;
        if (kinbox__now_ms() - x->fed_at >= FEEDBACK_MS / 10)
                return feedback(s, x, false);
        return KINBOX_OK;
}

/* ---- pgoutput */

static rel_t *
rel_find(repl_t *x, uint32_t id)
{
        for (size_t i = 0; i < x->nrels; i++)
                if (x->rels[i].id == id)
                        return &x->rels[i];
        return NULL;
}

static int
on_relation(kinbox__logsrc_t *s, repl_t *x, rd_t *r)
{
        uint32_t id = (uint32_t)rd_u(r, 4);
        const char *ns = rd_str(r), *name = rd_str(r);
        rd_u(r, 1); /* replica identity */
        int natts = (int)rd_u(r, 2);
        rel_t *rel = rel_find(x, id);
        if (!rel) {
                if (kinbox__grow(&x->rels, &x->caprels, x->nrels + 1,
                                 sizeof(*x->rels)))
                        return KINBOX_ERR_NOMEM;
                rel = &x->rels[x->nrels++];
        }
        rel->id = id;
        rel->natts = natts;
        rel->outbox = name && !strcmp(name, "kinbox_outbox");
        for (int c = 0; c < C_N; c++)
                rel->col[c] = -1;
        for (int i = 0; i < natts && !r->bad; i++) {
                rd_u(r, 1); /* flags */
                const char *att = rd_str(r);
                rd_u(r, 4); /* type */
                rd_u(r, 4); /* typmod */
                for (int c = 0; c < C_N && att; c++)
                        if (!strcmp(att, col_names[c]))
                                rel->col[c] = i;
        }
        if (r->bad) {
                seterr(s, "relay.source = wal: malformed Relation message");
                return KINBOX_ERR_DB;
        }
        kinbox__log(s->log, KINBOX_LOG_DEBUG, "relay",
                    "relation %s.%s (%u): %d columns", ns ? ns : "?",
                    name ? name : "?", id, natts);
        return KINBOX_OK;
}

static int
hexval(int c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* bytea's hex text form ("\x...") into out. */
static bool
unhex(const char *s, size_t n, kinbox__buf_t *out)
{
        kinbox__buf_reset(out);
        if (n < 2 || s[0] != '\\' || s[1] != 'x' || n % 2)
                return false;
        for (size_t i = 2; i < n; i += 2) {
                int hi = hexval((unsigned char)s[i]),
                    lo = hexval((unsigned char)s[i + 1]);
                if (hi < 0 || lo < 0)
                        return false;
                unsigned char b = (unsigned char)(hi << 4 | lo);
                kinbox__buf_add(out, &b, 1);
        }
        kinbox__buf_add(out, "", 1);
        return !out->oom;
}

static int64_t
days_from_civil(int64_t y, int m, int d)
{
        y -= m <= 2;
        int64_t era = (y >= 0 ? y : y - 399) / 400;
        int64_t yoe = y - era * 400;
        int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
        int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + doe - 719468;
}

/* An ISO timestamptz ("2026-12-06 05:55:42.123456+00[:MM]") into ms
 * since the epoch, floored; false when it does not parse. */
static bool
parse_ts(const char *s, int64_t *ms)
{
        int y, mo, d, h, mi, sec, n = 0;
        if (sscanf(s, "%d-%d-%d %d:%d:%d%n", &y, &mo, &d, &h, &mi, &sec, &n) !=
            6)
                return false;
        const char *p = s + n;
        int64_t us = 0;
        if (*p == '.') {
                int digits = 0;
                for (p++; *p >= '0' && *p <= '9'; p++, digits++)
                        if (digits < 6)
                                us = us * 10 + (*p - '0');
                for (; digits < 6; digits++)
                        us *= 10;
        }
        int64_t off = 0;
        if (*p == '+' || *p == '-') {
                int sign = *p == '+' ? 1 : -1, oh = 0, om = 0, os = 0;
                if (sscanf(p + 1, "%d:%d:%d", &oh, &om, &os) < 1)
                        return false;
                off = sign * (oh * 3600 + om * 60 + os);
        }
        int64_t t =
            days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - off;
        int64_t tus = t * 1000000 + us;
        *ms = tus >= 0 ? tus / 1000 : -((-tus + 999) / 1000);
        return true;
}

/* TupleData of an INSERT into the outbox, into ev->row. */
static int
decode_row(kinbox__logsrc_t *s, repl_t *x, const rel_t *rel, rd_t *r,
           kinbox__logev_t *ev)
{
        int ncols = (int)rd_u(r, 2);
        for (int c = 0; c < C_N; c++)
                x->null[c] = true;
        for (int i = 0; i < ncols && !r->bad; i++) {
                int kind = (int)rd_u(r, 1);
                size_t len = 0;
                const unsigned char *v = NULL;
                if (kind == 't' || kind == 'b') {
                        len = (size_t)rd_u(r, 4);
                        v = rd_bytes(r, len);
                }
                for (int c = 0; c < C_N; c++) {
                        if (rel->col[c] != i || !v)
                                continue;
                        kinbox__buf_reset(&x->val[c]);
                        kinbox__buf_add(&x->val[c], v, len);
                        kinbox__buf_add(&x->val[c], "", 1);
                        x->null[c] = x->val[c].oom;
                }
        }
        if (r->bad) {
                seterr(s, "relay.source = wal: malformed Insert message");
                return KINBOX_ERR_DB;
        }
        kinbox__logrow_t *row = &ev->row;
        memset(row, 0, sizeof(*row));
        const char *v[C_N];
        for (int c = 0; c < C_N; c++)
                v[c] = x->null[c] ? NULL : x->val[c].p;
#define V(c) v[c]
        /* Inserted already dead (dead() of a bad message, an operator's
         * copy): not an event to publish. */
        if (V(C_STATUS) && strcmp(V(C_STATUS), "pending"))
                return 0;
        row->id = V(C_ID) ? strtoll(V(C_ID), NULL, 10) : 0;
        row->action = V(C_KIND) && !strcmp(V(C_KIND), "action");
        row->destination = V(C_DEST);
        row->idem_key = V(C_IDEM);
        row->aggregate_id = V(C_AGG);
        row->headers_json = V(C_HEADERS);
        if (!row->destination || !row->idem_key || !V(C_CREATED) ||
            !parse_ts(V(C_CREATED), &row->created_at_ms)) {
                seterr(s,
                       "relay.source = wal: outbox row %" PRId64
                       ": a required column is missing or unreadable",
                       row->id);
                return KINBOX_ERR_DB;
        }
        if (V(C_PAYLOAD)) {
                if (!unhex(V(C_PAYLOAD), x->val[C_PAYLOAD].len - 1,
                           &x->payload)) {
                        seterr(s,
                               "relay.source = wal: outbox row %" PRId64
                               ": payload is not bytea hex",
                               row->id);
                        return KINBOX_ERR_DB;
                }
                row->payload = x->payload.p;
                row->payload_size = x->payload.len - 1;
        }
#undef V
        ev->kind = KINBOX__LOGEV_ROW;
        return 1;
}

/* One pgoutput message: 1 an event in *ev, 0 nothing to deliver, <0 an
 * error. */
static int
on_pgoutput(kinbox__logsrc_t *s, repl_t *x, uint64_t start, rd_t *r,
            kinbox__logev_t *ev)
{
        int type = (int)rd_u(r, 1);
        ev->pos.lsn = start;
        ev->pos.text[0] = '\0';
        switch (type) {
        case 'B':
                rd_u(r, 8); /* final LSN */
                x->commit_ms = (int64_t)(rd_u(r, 8) + PG_EPOCH_US) / 1000;
                rd_u(r, 4); /* xid */
                x->in_tx = true;
                ev->kind = KINBOX__LOGEV_BEGIN;
                ev->commit_ms = x->commit_ms;
                return r->bad ? KINBOX_ERR_DB : 1;
        case 'C':
                rd_u(r, 1); /* flags */
                rd_u(r, 8); /* commit LSN */
                ev->pos.lsn = rd_u(r, 8); /* end LSN */
                ev->commit_ms = (int64_t)(rd_u(r, 8) + PG_EPOCH_US) / 1000;
                x->in_tx = false;
                ev->kind = KINBOX__LOGEV_COMMIT;
                return r->bad ? KINBOX_ERR_DB : 1;
        case 'R':
                return on_relation(s, x, r);
        case 'I': {
                const rel_t *rel = rel_find(x, (uint32_t)rd_u(r, 4));
                if (rd_u(r, 1) != 'N' || r->bad) {
                        seterr(s, "relay.source = wal: malformed Insert");
                        return KINBOX_ERR_DB;
                }
                if (!rel || !rel->outbox)
                        return 0;
                return decode_row(s, x, rel, r, ev);
        }
        case 'M': {
                int flags = (int)rd_u(r, 1);
                rd_u(r, 8); /* the message's LSN */
                const char *prefix = rd_str(r);
                size_t len = (size_t)rd_u(r, 4);
                const unsigned char *data = rd_bytes(r, len);
                if (r->bad) {
                        seterr(s, "relay.source = wal: malformed Message");
                        return KINBOX_ERR_DB;
                }
                if (strncmp(prefix, MSG_PREFIX, strlen(MSG_PREFIX)))
                        return 0;
                if (!(flags & 1) || !x->in_tx) {
                        kinbox__log(s->log, KINBOX_LOG_WARNING, "relay",
                                    "non-transactional logical message "
                                    "with prefix %s skipped (kinbox reads "
                                    "transactional ones only)",
                                    prefix);
                        return 0;
                }
                kinbox__buf_reset(&x->prefix);
                kinbox__buf_adds(&x->prefix, prefix);
                kinbox__buf_add(&x->prefix, "", 1);
                ev->kind = KINBOX__LOGEV_MESSAGE;
                ev->prefix = x->prefix.p;
                ev->data = data;
                ev->size = len;
                return x->prefix.oom ? KINBOX_ERR_NOMEM : 1;
        }
        default: /* Y type, O origin, T truncate, U/D: not delivered */
                return 0;
        }
}

/* One CopyData message: 1 an event, 0 none, <0 an error. */
static int
on_copydata(kinbox__logsrc_t *s, repl_t *x, const char *buf, int len,
            kinbox__logev_t *ev)
{
        rd_t r = {(const unsigned char *)buf, (size_t)len, false};
        int kind = (int)rd_u(&r, 1);
        if (kind == 'k') {
                uint64_t end = rd_u(&r, 8);
                rd_u(&r, 8); /* send time */
                int reply = (int)rd_u(&r, 1);
                if (r.bad) {
                        seterr(s, "relay.source = wal: malformed keepalive");
                        return KINBOX_ERR_DB;
                }
                if (reply) {
                        int rc = feedback(s, x, false);
                        if (rc)
                                return rc;
                }
                if (x->in_tx)
                        return 0;
                ev->kind = KINBOX__LOGEV_KEEPALIVE;
                ev->pos.lsn = end;
                ev->pos.text[0] = '\0';
                return 1;
        }
        if (kind != 'w') {
                seterr(s, "relay.source = wal: unknown CopyData message %c",
                       kind);
                return KINBOX_ERR_DB;
        }
        uint64_t start = rd_u(&r, 8);
        rd_u(&r, 8); /* walEnd */
        rd_u(&r, 8); /* send time */
        if (r.bad) {
                seterr(s, "relay.source = wal: malformed XLogData");
                return KINBOX_ERR_DB;
        }
        return on_pgoutput(s, x, start, &r, ev);
}

static int
repl_next(kinbox__logsrc_t *s, kinbox__logev_t *ev, int timeout_ms)
{
        repl_t *x = s->impl;
        int64_t until = kinbox__now_ms() + timeout_ms;
        bool drained = false;
        for (;;) {
                int64_t now = kinbox__now_ms();
                if ((x->dirty && now - x->fed_at >= FEEDBACK_MS) ||
                    now - x->fed_at >= IDLE_FEEDBACK_MS) {
                        int rc = feedback(s, x, false);
                        if (rc)
                                return rc;
                }
                if (x->copybuf) {
                        PQfreemem(x->copybuf);
                        x->copybuf = NULL;
                }
                int n = PQgetCopyData(x->conn, &x->copybuf, 1);
                if (n > 0) {
                        drained = false;
                        int rc = on_copydata(s, x, x->copybuf, n, ev);
                        if (rc)
                                return rc;
                        continue;
                }
                if (n == 0) {
                        /* What the socket holds already, without waiting
                         * (also with timeout 0). */
                        if (!drained) {
                                drained = true;
                                if (!PQconsumeInput(x->conn))
                                        break;
                                continue;
                        }
                        int64_t left = until - kinbox__now_ms();
                        if (left <= 0)
                                return 0;
                        struct pollfd pfd = {PQsocket(x->conn), POLLIN, 0};
                        int w = left < FEEDBACK_MS ? (int)left : FEEDBACK_MS;
                        if (poll(&pfd, 1, w) < 0 && errno != EINTR) {
                                seterr(s, "relay.source = wal: poll: %s",
                                       strerror(errno));
                                return KINBOX_ERR_DB_CONN;
                        }
                        if (!PQconsumeInput(x->conn))
                                break;
                        continue;
                }
                break; /* -1: the stream ended; -2: an error */
        }
        PGresult *res = PQgetResult(x->conn);
        seterr(s, "relay.source = wal: the replication stream ended: %s",
               res && PQresultErrorMessage(res)[0] ? PQresultErrorMessage(res)
                                                   : PQerrorMessage(x->conn));
        PQclear(res);
        return KINBOX_ERR_DB_CONN;
}

static PGconn *plain(kinbox__logsrc_t *s, repl_t *x, int *rc);

static int
repl_dead(kinbox__logsrc_t *s, int64_t row_id, const char *reason,
          const kinbox__logpos_t *pos, const void *bytes, size_t size)
{
        repl_t *x = s->impl;
        int rc = KINBOX_ERR_DB;
        if (!plain(s, x, &rc))
                return rc;
        char id[24], key[160];
        PGresult *res;
        if (row_id > 0) {
                snprintf(id, sizeof(id), "%" PRId64, row_id);
                const char *p[2] = {id, reason};
                res = PQexecParams(x->plain,
                                   "UPDATE kinbox_outbox SET status = 'dead',"
                                   " last_error = $2 WHERE id = $1"
                                   " AND status = 'pending'",
                                   2, NULL, p, NULL, NULL, 0);
        } else {
                /* The position names it: the same message read again
                 * after a restart is the same dead row. */
                snprintf(key, sizeof(key), "wal:%X/%X",
                         (unsigned)(pos->lsn >> 32), (unsigned)pos->lsn);
                const char *p[3] = {key, bytes, reason};
                int len[3] = {0, (int)size, 0}, fmt[3] = {0, 1, 0};
                res = PQexecParams(
                    x->plain,
                    "INSERT INTO kinbox_outbox (destination, idem_key,"
                    " payload, status, last_error)"
                    " VALUES ('kinbox.invalid', $1, $2, 'dead', $3)"
                    " ON CONFLICT DO NOTHING",
                    3, NULL, p, len, fmt, 0);
        }
        rc = KINBOX_OK;
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                seterr(s, "relay.source = wal: recording a dead record: %s",
                       PQerrorMessage(x->plain));
                rc = PQstatus(x->plain) == CONNECTION_OK ? KINBOX_ERR_DB
                                                         : KINBOX_ERR_DB_CONN;
        }
        PQclear(res);
        return rc;
}

/* The source's plain connection (dead records, the slot's figures),
 * made on first need and again after it was lost; NULL with s->err. */
static PGconn *
plain(kinbox__logsrc_t *s, repl_t *x, int *rc)
{
        if (x->plain && PQstatus(x->plain) != CONNECTION_OK) {
                PQfinish(x->plain);
                x->plain = NULL;
        }
        if (!x->plain) {
                x->plain = connect_pg(s, false);
                if (!x->plain || PQstatus(x->plain) != CONNECTION_OK) {
                        *rc = conn_failed(s, x->plain, "cannot connect");
                        x->plain = NULL;
                }
        }
        return x->plain;
}

static int
repl_lag(kinbox__logsrc_t *s, kinbox__loglag_t *out)
{
        out->retained_bytes = -1;
        out->state[0] = '\0';
        repl_t *x = s->impl, tmp;
        int rc = KINBOX_ERR_DB;
        if (!x) { /* not opened (kinbox status): a connection for this */
                memset(&tmp, 0, sizeof(tmp));
                x = &tmp;
        }
        PGconn *c = plain(s, x, &rc);
        if (!c)
                return rc;
        const char *p[1] = {s->slot};
        PGresult *res = PQexecParams(
            c,
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(),"
            " coalesce(confirmed_flush_lsn, restart_lsn))::bigint,"
            " coalesce(wal_status, '') FROM pg_replication_slots"
            " WHERE slot_name = $1",
            1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
                out->retained_bytes =
                    PQgetisnull(res, 0, 0)
                        ? -1
                        : strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                snprintf(out->state, sizeof(out->state), "%s",
                         PQgetvalue(res, 0, 1));
                rc = KINBOX_OK;
        } else {
                seterr(s, "relay.source = wal: reading slot %s: %s", s->slot,
                       PQntuples(res) ? PQerrorMessage(c) : "no such slot");
        }
        PQclear(res);
        if (x == &tmp)
                PQfinish(tmp.plain);
        return rc;
}

static void
repl_close(kinbox__logsrc_t *s)
{
        repl_t *x = s->impl;
        if (!x)
                return;
        if (x->conn && PQstatus(x->conn) == CONNECTION_OK && x->dirty)
                feedback(s, x, false);
        repl_free(x);
        s->impl = NULL;
}

kinbox_err_t
kinbox__pg_outbox_emit(struct pg_conn *conn, const void *env, size_t n,
                       char *errstr, size_t errstr_size)
{
        const char *v[1] = {env};
        int len[1] = {(int)n}, fmt[1] = {1};
        PGresult *res =
            PQexecParams(conn, KINBOX__PG_EMIT_SQL, 1, NULL, v, len, fmt, 0);
        if (res && PQresultStatus(res) == PGRES_TUPLES_OK) {
                PQclear(res);
                return KINBOX_OK;
        }
        const char *st =
            res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
        kinbox__errstr(errstr, errstr_size, "outbox emit: SQLSTATE %s: %s",
                       st ? st : "?????",
                       res ? PQresultErrorMessage(res) : PQerrorMessage(conn));
        kinbox_err_t rc = KINBOX_ERR_DB;
        if (PQstatus(conn) != CONNECTION_OK)
                rc = KINBOX_ERR_DB_CONN;
        else if (st && (!strcmp(st, "40P01") || !strcmp(st, "40001") ||
                        !strcmp(st, "55P03")))
                rc = KINBOX_ERR_TRANSIENT;
        PQclear(res);
        return rc;
}

const kinbox__logsrc_ops_t kinbox__pg_repl_ops = {
    .name = "wal",
    .open = repl_open,
    .start = repl_start,
    .next = repl_next,
    .confirm = repl_confirm,
    .dead = repl_dead,
    .lag = repl_lag,
    .close = repl_close,
};
