/*
 * mysql_binlog_src.c -- relay.source = binlog: MariaDB's ROW binlog as a
 * source of the log relay (db/logsrc_ops.h; kinbox__db_logsrc() of the MySQL
 * backend), over the reader of mysql_binlog.h.
 *
 * open(): a SQL session of its own that lives as long as the source: it
 * checks the server (log_bin, binlog_format = ROW, binlog_row_image =
 * FULL: KINBOX_ERR_CONFIG naming the setting), tries the named lock of
 * the relays of its name (relay.slot, else name): one reads; another
 * opens, and its start() fails (the loop waits and tries again) until the
 * reader's session ends (a kill -9 included), then takes over. With the
 * lock it reads the stored position
 * (kinbox_relay_position; none: the binlog's end now, stored at once)
 * and refuses a position whose binlog was purged (KINBOX_ERR_CONFIG: the
 * message names the position and `kinbox outbox resend --since TIME`).
 * start(): a binlog dump from the confirmed position. next(): each
 * committed transaction with outbox rows as BEGIN, ROW..., COMMIT (pos:
 * the GTID state after it); a heartbeat after transactions on other
 * tables as KEEPALIVE (pos: the state now). confirm(): the position is
 * written to kinbox_relay_position at most once a second (and at close):
 * a restart may publish again up to a second of acknowledged rows, never
 * skip one. A position moved only by these writes is not written again
 * (kinbox__binlog_take_foreign()), so the stored position never covers
 * the last of them; when a purge took exactly that write, open() proves
 * it and reads on (bl_own_write_purged()).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "internal.h"
#include "mysql_binlog.h"

#define STORE_EVERY_MS 1000
#define LOCK_WAIT_S 0 /* start(): the loop retries every second */
#define HEARTBEAT_MS 500

typedef struct blsrc {
        const char *name; /* the readers' name (kinbox__binlog_name) */
        kinbox__db_t *db; /* the position and the lock */
        kinbox__binlog_t *rd;
        char *url, *password;
        uint32_t server_id;
        bool locked; /* holds the readers' lock (the position is read) */
        char *confirmed; /* the state start() reads after */
        char *stored; /* as kinbox_relay_position holds it */
        int64_t store_due; /* monotonic ms; 0: nothing to store */
        uint64_t lsn;
        const kinbox__binlog_tx_t *tx; /* being delivered */
        size_t row; /* next row of tx to deliver */
        int phase; /* 0: none, 1: BEGIN given, 2: rows given */
} blsrc_t;

/* The reader's options: from the relay's confirmed position. */
static kinbox__binlog_opts_t
bl_opts(const blsrc_t *b)
{
        return (kinbox__binlog_opts_t){.url = b->url,
                                       .password = b->password,
                                       .start = b->confirmed,
                                       .server_id = b->server_id,
                                       .name = b->name,
                                       .heartbeat_ms = HEARTBEAT_MS};
}

const char *
kinbox__binlog_name(const kinbox_conf_t *conf)
{
        const kinbox__settings_t *st = kinbox__settings_of(conf);
        return st->relay_slot && *st->relay_slot ? st->relay_slot : st->name;
}

int
kinbox__binlog_hold(kinbox__db_t *db, const char *name, char **pos, char *err,
                    size_t sz)
{
        *pos = NULL;
        int rc = kinbox__binlog_lock(db, name, 0, err, sz);
        if (rc == 0) {
                kinbox__errstr(err, sz,
                               "a relay named %s reads the binlog: stop it "
                               "before outbox resend",
                               name);
                return KINBOX_ERR_STATE;
        }
        if (rc < 0)
                return rc;
        rc = kinbox__binlog_pos_now(db, pos);
        if (rc)
                kinbox__errstr(err, sz, "reading @@gtid_binlog_pos: %s",
                               db->err.msg);
        return rc;
}

int
kinbox__binlog_set(kinbox__db_t *db, const char *name, const char *pos,
                   char *err, size_t sz)
{
        int rc = kinbox__binlog_pos_store(db, name, pos);
        if (rc)
                kinbox__errstr(err, sz, "storing the position %s: %s", pos,
                               db->err.msg);
        return rc;
}

static void
bl_free(blsrc_t *b)
{
        if (!b)
                return;
        kinbox__binlog_close(b->rd);
        kinbox__db_destroy(b->db);
        free(b->url);
        free(b->password);
        free(b->confirmed);
        free(b->stored);
        free(b);
}

static void
set_str(char **dst, const char *v)
{
        free(*dst);
        *dst = kinbox__strdup(v ? v : "");
}

/* kinbox__binlog_pos_prove() of the stored position pos, for the relay's
 * open() and for the operator's figures alike (bl_lag(): status says
 * "purged" only where the relay refuses): 1 with *start (malloc'ed) the
 * position the relay reads after, 0 not proven, <0 an error (logged). */
static int
bl_prove(kinbox__logsrc_t *s, kinbox__db_t *db, const char *url,
         const char *password, uint32_t server_id, const char *pos,
         char **start)
{
        kinbox__binlog_opts_t o = {.url = url,
                                   .password = password,
                                   .start = pos,
                                   .server_id = server_id,
                                   .name = kinbox__binlog_name(s->conf),
                                   .heartbeat_ms = HEARTBEAT_MS};
        char e[600] = "";
        *start = NULL;
        int rc = kinbox__binlog_pos_prove(db, &o, start, e, sizeof(e));
        if (rc < 0)
                kinbox__log(s->log, KINBOX_LOG_WARNING, "relay",
                            "binlog: proving what was purged after %s: %s",
                            pos, e);
        return rc;
}

/* The stored position was refused as purged. A stored position is always
 * at least one transaction behind the server: the relay's own write of it
 * (kinbox_relay_position) is a binlogged transaction after the state it
 * stores, and the relay does not store again only to cover that write
 * (that write would need covering in turn: a write every second for
 * ever). While it runs, the next position a transaction of another table
 * moves covers it (the stream's state); after a rotation and a purge of
 * an idle relay's binlog it is the one transaction purged. Nothing is
 * skipped on a guess: kinbox__binlog_pos_prove() reads from the oldest
 * binlog on only when that one purged transaction is proven to be the
 * position write; otherwise the refusal stands (KINBOX_ERR_NOT_FOUND,
 * s->err as the check set it). Not sql_log_bin = 0 for the write: it
 * needs a privilege (SUPER; BINLOG ADMIN since MariaDB 10.5.2) the
 * relay's user should not have, and a replica promoted after a failover
 * would not have the position. */
static int
bl_own_write_purged(kinbox__logsrc_t *s, blsrc_t *b)
{
        char *start = NULL;
        int rc = bl_prove(s, b->db, b->url, b->password, b->server_id,
                          b->confirmed, &start);
        if (rc != 1 || !start) {
                free(start);
                return rc == 1 ? KINBOX_ERR_NOMEM : KINBOX_ERR_NOT_FOUND;
        }
        kinbox__log(s->log, KINBOX_LOG_NOTICE, "relay",
                    "binlog: the one transaction purged after the stored "
                    "position %s is the relay's own write of it (it "
                    "publishes nothing): reading after %s",
                    b->confirmed, start);
        free(b->confirmed);
        b->confirmed = start;
        if ((rc = kinbox__binlog_pos_store(b->db, b->name, start))) {
                kinbox__errstr(s->err, sizeof(s->err),
                               "binlog: storing the position %s: %s", start,
                               b->db->err.msg);
                return rc;
        }
        set_str(&b->stored, start);
        s->err[0] = '\0';
        return KINBOX_OK;
}

/* The position to start from: the stored one, or now (stored at once). */
static int
bl_position(kinbox__logsrc_t *s, blsrc_t *b)
{
        char *pos = NULL;
        int rc = kinbox__binlog_pos_load(b->db, b->name, &pos);
        if (!rc && !pos) {
                if (!(rc = kinbox__binlog_pos_now(b->db, &pos)))
                        rc = kinbox__binlog_pos_store(b->db, b->name, pos);
                if (!rc)
                        kinbox__log(s->log, KINBOX_LOG_NOTICE, "relay",
                                    "binlog: no position stored for relay "
                                    "%s: reading from the binlog's end, %s",
                                    b->name, pos);
        }
        if (rc) {
                free(pos);
                kinbox__errstr(s->err, sizeof(s->err),
                               "binlog: the relay's position: %s",
                               b->db->err.msg);
                return rc;
        }
        b->confirmed = pos;
        b->stored = kinbox__strdup(pos);
        rc = kinbox__binlog_pos_check(b->db, pos, s->err, sizeof(s->err));
        if (rc == KINBOX_ERR_NOT_FOUND)
                rc = bl_own_write_purged(s, b);
        return rc == KINBOX_ERR_NOT_FOUND ? KINBOX_ERR_CONFIG : rc;
}

/* The readers' lock, waiting up to wait_s, then (taken) the position:
 * 1 taken, 0 another relay holds it (s->err says so), <0 an error
 * (KINBOX_ERR_CONFIG: the position was purged). */
static int
bl_take(kinbox__logsrc_t *s, blsrc_t *b, int wait_s)
{
        if (b->locked)
                return 1;
        int rc = kinbox__binlog_lock(b->db, b->name, wait_s, s->err,
                                     sizeof(s->err));
        if (rc <= 0)
                return rc;
        b->locked = true;
        free(b->confirmed);
        free(b->stored);
        b->confirmed = b->stored = NULL;
        rc = bl_position(s, b);
        return rc ? rc : 1;
}

static int
bl_open(kinbox__logsrc_t *s)
{
        if (s->impl) /* open already (the loop's first open() is kept) */
                return KINBOX_OK;
        const kinbox__settings_t *st = kinbox__settings_of(s->conf);
        blsrc_t *b = kinbox__calloc(1, sizeof(*b));
        if (!b)
                return KINBOX_ERR_NOMEM;
        char e[512] = "";
        b->password = s->password ? kinbox__strdup(s->password) : NULL;
        b->name = kinbox__binlog_name(s->conf);
        b->url = kinbox__strdup(s->url ? s->url : st->database_url);
        b->server_id = (uint32_t)st->relay_server_id;
        b->db = kinbox__db_new_ops(&kinbox__mysql_ops, b->url, b->password, e,
                                   sizeof(e));
        int rc = b->db ? kinbox__db_connect(b->db) : KINBOX_ERR_CONFIG;
        if (rc) {
                kinbox__errstr(s->err, sizeof(s->err), "binlog: %s",
                               b->db ? b->db->err.msg : e);
                bl_free(b);
                return rc;
        }
        rc = kinbox__binlog_check(b->db, s->err, sizeof(s->err));
        if (!rc)
                rc = bl_take(s, b, 0);
        if (rc < 0) {
                bl_free(b);
                return rc;
        }
        if (!rc)
                kinbox__log(s->log, KINBOX_LOG_NOTICE, "relay", "%s", s->err);
        s->impl = b;
        return KINBOX_OK;
}

static int
bl_start(kinbox__logsrc_t *s)
{
        blsrc_t *b = s->impl;
        /* Another relay of the name reads (KINBOX_ERR_STATE): the loop
         * closes, waits a second and tries again; the lock is free once
         * the reader's session ends. */
        int rc = bl_take(s, b, LOCK_WAIT_S);
        if (rc <= 0)
                return rc < 0 ? rc : KINBOX_ERR_STATE;
        kinbox__binlog_close(b->rd);
        b->rd = NULL;
        b->tx = NULL;
        b->phase = 0;
        kinbox__binlog_opts_t o = bl_opts(b);
        int code = 0;
        b->rd = kinbox__binlog_open(&o, &code, s->err, sizeof(s->err));
        return b->rd ? KINBOX_OK : code;
}

/* Store the confirmed position when due (force: now). */
static int
bl_store(kinbox__logsrc_t *s, blsrc_t *b, bool force)
{
        if (!b->store_due || (!force && kinbox__now_ms() < b->store_due))
                return 0;
        if (!strcmp(b->confirmed, b->stored)) {
                b->store_due = 0;
                return 0;
        }
        int rc = kinbox__binlog_pos_store(b->db, b->name, b->confirmed);
        if (rc) {
                kinbox__errstr(s->err, sizeof(s->err),
                               "binlog: storing the position %s: %s",
                               b->confirmed, b->db->err.msg);
                return rc;
        }
        set_str(&b->stored, b->confirmed);
        b->store_due = 0;
        return 0;
}

static void
row_event(const kinbox__binlog_row_t *r, kinbox__logev_t *ev)
{
        ev->kind = KINBOX__LOGEV_ROW;
        ev->row.id = r->id;
        ev->row.action = r->kind && !strcmp(r->kind, "action");
        ev->row.destination = r->destination;
        ev->row.idem_key = r->idem_key;
        ev->row.aggregate_id = r->aggregate_id;
        ev->row.headers_json = r->headers;
        ev->row.payload = r->payload;
        ev->row.payload_size = r->payload_size;
        ev->row.created_at_ms = r->created_at_us / 1000;
}

/* The next event of the transaction being delivered; false: none left. */
static bool
tx_event(blsrc_t *b, kinbox__logev_t *ev)
{
        const kinbox__binlog_tx_t *tx = b->tx;
        if (!tx)
                return false;
        ev->commit_ms = (int64_t)tx->commit_time * 1000;
        if (b->phase == 0) {
                ev->kind = KINBOX__LOGEV_BEGIN;
                b->phase = 1;
                b->row = 0;
                return true;
        }
        /* Rows inserted other than pending (dead already) are not
         * delivered (db/logsrc_ops.h). */
        while (b->row < tx->nrows && tx->rows[b->row].status &&
               strcmp(tx->rows[b->row].status, "pending") != 0)
                b->row++;
        if (b->row < tx->nrows) {
                row_event(&tx->rows[b->row++], ev);
                return true;
        }
        ev->kind = KINBOX__LOGEV_COMMIT;
        ev->pos.lsn = ++b->lsn;
        snprintf(ev->pos.text, sizeof(ev->pos.text), "%s", tx->state);
        b->tx = NULL;
        b->phase = 0;
        return true;
}

static int
bl_next(kinbox__logsrc_t *s, kinbox__logev_t *ev, int timeout_ms)
{
        blsrc_t *b = s->impl;
        memset(ev, 0, sizeof(*ev));
        int rc = bl_store(s, b, false);
        if (rc)
                return rc;
        if (tx_event(b, ev))
                return 1;
        int64_t until = kinbox__now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
        do {
                const kinbox__binlog_tx_t *tx = NULL;
                rc = kinbox__binlog_next(b->rd, &tx);
                if (rc < 0) {
                        kinbox__errstr(s->err, sizeof(s->err), "%s",
                                       kinbox__binlog_error(b->rd));
                        return rc;
                }
                if (rc == KINBOX__BL_TX) {
                        b->tx = tx;
                        return tx_event(b, ev) ? 1 : 0;
                }
                if (kinbox__binlog_take_foreign(b->rd)) {
                        ev->kind = KINBOX__LOGEV_KEEPALIVE;
                        ev->pos.lsn = ++b->lsn;
                        snprintf(ev->pos.text, sizeof(ev->pos.text), "%s",
                                 kinbox__binlog_state(b->rd));
                        return 1;
                }
        } while (kinbox__now_ms() < until);
        return 0;
}

static int
bl_confirm(kinbox__logsrc_t *s, const kinbox__logpos_t *pos)
{
        blsrc_t *b = s->impl;
        if (!strcmp(pos->text, b->confirmed))
                return 0;
        set_str(&b->confirmed, pos->text);
        if (!b->store_due)
                b->store_due = kinbox__now_ms() + STORE_EVERY_MS;
        return bl_store(s, b, false);
}

/* A record that can never be published as written: its row goes dead
 * (MariaDB has no logical messages: row_id is always a row). */
static int
bl_dead(kinbox__logsrc_t *s, int64_t row_id, const char *reason,
        const kinbox__logpos_t *pos, const void *bytes, size_t size)
{
        (void)pos;
        (void)bytes;
        (void)size;
        blsrc_t *b = s->impl;
        if (row_id <= 0)
                return KINBOX_OK;
        char id[24];
        snprintf(id, sizeof(id), "%" PRId64, row_id);
        kinbox__param_t p[2] = {{.v = id}, {.v = reason}};
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__db_query(b->db,
                                  "UPDATE kinbox_outbox SET status = 'dead', "
                                  "last_error = LEFT($2, 1024) WHERE id = $1 "
                                  "AND status = 'pending'",
                                  2, p, &r);
        kinbox_rows_destroy(r);
        if (rc)
                kinbox__errstr(s->err, sizeof(s->err),
                               "relay.source = binlog: recording a dead "
                               "record: %s",
                               b->db->err.msg);
        return rc;
}

/* kinbox status, on a stored position refused as purged: whether the
 * relay would read on (its own position write is the one transaction
 * purged: bl_prove(), as open() does). The dump registers a server id of
 * its own, not the relay's: a second dump with the relay's id would end
 * the running relay's. */
static bool
bl_status_proof(kinbox__logsrc_t *s, kinbox__db_t *db, const char *pos)
{
        char id[300], *start = NULL;
        snprintf(id, sizeof(id), "%s:status", kinbox__binlog_name(s->conf));
        int rc = bl_prove(s, db, s->url ? s->url : db->url, s->password,
                          kinbox__binlog_server_id(id), pos, &start);
        free(start);
        return rc == 1;
}

/* The operator's figures: the binlog bytes after the stored position
 * (the files from the one holding it), state "ok", "purged" or "none"
 * (no position stored yet); "ok" too when the one transaction purged is
 * the relay's own write of the position (bl_status_proof(): where the
 * relay reads on). Works on an open source or not (kinbox status). */
static int
bl_lag(kinbox__logsrc_t *s, kinbox__loglag_t *out)
{
        blsrc_t *b = s->impl;
        kinbox__db_t *db = b ? b->db : NULL;
        char e[512] = "";
        if (!db) {
                db = kinbox__db_new_ops(&kinbox__mysql_ops, s->url,
                                        s->password, e, sizeof(e));
                if (!db || kinbox__db_connect(db)) {
                        kinbox__errstr(s->err, sizeof(s->err), "binlog: %s",
                                       db ? db->err.msg : e);
                        kinbox__db_destroy(db);
                        return KINBOX_ERR_DB_CONN;
                }
        }
        char *pos = NULL;
        bool purged = false;
        out->retained_bytes = -1;
        int rc =
            kinbox__binlog_pos_load(db, kinbox__binlog_name(s->conf), &pos);
        if (!rc && pos)
                rc = kinbox__binlog_pos_retained(db, pos, &out->retained_bytes,
                                                 &purged);
        if (!rc && purged && !b)
                purged = !bl_status_proof(s, db, pos);
        if (rc)
                kinbox__errstr(s->err, sizeof(s->err), "binlog: %s",
                               db->err.msg);
        snprintf(out->state, sizeof(out->state), "%s",
                 !pos     ? "none"
                 : purged ? "purged"
                          : "ok");
        free(pos);
        if (db != (b ? b->db : NULL))
                kinbox__db_destroy(db);
        return rc;
}

static void
bl_close(kinbox__logsrc_t *s)
{
        blsrc_t *b = s->impl;
        if (!b)
                return;
        if (b->db && b->locked && bl_store(s, b, true))
                kinbox__log(s->log, KINBOX_LOG_WARNING, "relay", "%s", s->err);
        bl_free(b);
        s->impl = NULL;
}

const kinbox__logsrc_ops_t kinbox__binlog_src_ops = {
    .name = "binlog",
    .open = bl_open,
    .start = bl_start,
    .next = bl_next,
    .confirm = bl_confirm,
    .dead = bl_dead,
    .lag = bl_lag,
    .close = bl_close,
};
