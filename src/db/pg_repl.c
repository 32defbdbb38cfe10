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

#include "pg_repl_int.h"

#define PUBLICATION "kinbox_outbox_pub"
#define FEEDBACK_MS 1000 /* feedback at least this often when changed */
#define IDLE_FEEDBACK_MS 10000

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

void
kinbox__pgr_seterr(kinbox__logsrc_t *s, const char *fmt, ...)
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
        kinbox__pgr_seterr(s, "relay.source = wal: %s: %s", what, m);
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
                kinbox__pgr_seterr(
                    s, "relay.source = wal: checking the server: %s",
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
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal needs wal_level = logical on "
                    "the server (it is %s; set it in postgresql.conf "
                    "and restart PostgreSQL)",
                    wl);
                rc = KINBOX_ERR_CONFIG;
        } else if (strcmp(PQgetvalue(res, 0, 1), "t")) {
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal needs a role with REPLICATION "
                    "(ALTER ROLE %s REPLICATION)",
                    PQuser(c));
                rc = KINBOX_ERR_CONFIG;
        } else if (!slot && atoi(PQgetvalue(res, 0, 2)) <= 0) {
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal: no free replication slot for "
                    "%s: raise max_replication_slots (every slot is "
                    "in use)",
                    s->slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (atoi(PQgetvalue(res, 0, 3)) <= 0) {
                kinbox__pgr_seterr(
                    s, "relay.source = wal: no free WAL sender: raise "
                       "max_wal_senders (every one is in use)");
                rc = KINBOX_ERR_CONFIG;
        } else if (slot && strncmp(slot, "pgoutput ", 9)) {
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal: slot %s (relay.slot) exists "
                    "with another output plugin (%s): name another "
                    "slot",
                    s->slot, slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (slot && strstr(slot, " false")) {
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal: slot %s (relay.slot) belongs "
                    "to another database: name another slot",
                    s->slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (slot && strstr(slot, " lost ")) {
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal: slot %s (relay.slot) is lost "
                    "(max_slot_wal_keep_size removed WAL it needed): "
                    "events after its position may be unpublished; "
                    "see docs/outbox.md (a lost slot) to recover",
                    s->slot);
                rc = KINBOX_ERR_CONFIG;
        } else if (strcmp(PQgetvalue(res, 0, 5), "t")) {
                kinbox__pgr_seterr(
                    s, "relay.source = wal: publication " PUBLICATION
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
                kinbox__pgr_seterr(
                    s,
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
                kinbox__pgr_seterr(s, "relay.source = wal: %s",
                                   PQerrorMessage(x->conn));
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
                        kinbox__pgr_seterr(
                            s, "relay.source = wal: %s slot %s: %s",
                            sql[0] == 'A' ? "altering" : "creating", s->slot,
                            PQerrorMessage(x->conn));
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
                kinbox__pgr_seterr(
                    s,
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
                kinbox__pgr_seterr(s,
                                   "relay.source = wal: sending feedback: %s",
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
                        kinbox__pgr_seterr(
                            s, "relay.source = wal: malformed keepalive");
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
                kinbox__pgr_seterr(
                    s, "relay.source = wal: unknown CopyData message %c",
                    kind);
                return KINBOX_ERR_DB;
        }
        uint64_t start = rd_u(&r, 8);
        rd_u(&r, 8); /* walEnd */
        rd_u(&r, 8); /* send time */
        if (r.bad) {
                kinbox__pgr_seterr(s,
                                   "relay.source = wal: malformed XLogData");
                return KINBOX_ERR_DB;
        }
        return kinbox__pgr_pgoutput(s, x, start, &r, ev);
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
                                kinbox__pgr_seterr(
                                    s, "relay.source = wal: poll: %s",
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
        kinbox__pgr_seterr(
            s, "relay.source = wal: the replication stream ended: %s",
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
                kinbox__pgr_seterr(
                    s, "relay.source = wal: recording a dead record: %s",
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
                kinbox__pgr_seterr(
                    s, "relay.source = wal: reading slot %s: %s", s->slot,
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

char *
kinbox__wal_slot_name(const kinbox_conf_t *conf)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        if (s->relay_slot && *s->relay_slot)
                return kinbox__strdup(s->relay_slot);
        const char *name = s->name && *s->name ? s->name : "relay";
        char buf[64] = "kinbox_";
        size_t o = strlen(buf);
        for (const char *p = name; *p && o < sizeof(buf) - 1; p++) {
                char c = *p;
                if (c >= 'A' && c <= 'Z')
                        c = (char)(c - 'A' + 'a');
                buf[o++] =
                    (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ? c : '_';
        }
        buf[o] = '\0';
        return kinbox__strdup(buf);
}
