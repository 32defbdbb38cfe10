/*
 * mysql_binlog.h -- reading kinbox_outbox's inserts from MariaDB's binlog
 * (internal; [relay] source = binlog, issue 38).
 *
 * A reader is one replication connection (Connector/C's mariadb_rpl_*
 * API) registered under its own server id. It returns whole committed
 * transactions, in commit order, holding the rows their WRITE_ROWS events
 * inserted into kinbox_outbox (every other table and every UPDATE or
 * DELETE is skipped), each with the GTID state after it. Rows are decoded
 * here from the table map's column types (mysql_binlog_rows.c), not with
 * mariadb_rpl_extract_rows(), whose TIMESTAMP(n) decoding differs between
 * Connector/C 3.3 releases (see that file).
 *
 * Nothing outside src/db/ sees a MariaDB type: the reader is opaque, the
 * rows are plain bytes. Not thread-safe: one thread uses a reader.
 */
#ifndef KINBOX_DB_MYSQL_BINLOG_H
#define KINBOX_DB_MYSQL_BINLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kinbox__binlog kinbox__binlog_t;

/* One inserted outbox row. Byte strings are not NUL-terminated unless
 * said; NULL is SQL NULL. Valid until the next kinbox__binlog_next() or
 * kinbox__binlog_close(). */
typedef struct kinbox__binlog_row {
        int64_t id;
        const char *kind; /* NUL-terminated */
        const char *destination; /* NUL-terminated */
        const char *idem_key; /* NUL-terminated */
        const char *aggregate_id; /* NUL-terminated, may be NULL */
        const char *payload; /* may be NULL */
        size_t payload_size;
        const char *headers; /* NUL-terminated JSON, may be NULL */
        const char *status; /* NUL-terminated */
        int max_attempts;
        int64_t created_at_us; /* µs since the epoch (UTC) */
} kinbox__binlog_row_t;

/* A committed transaction that inserted outbox rows. */
typedef struct kinbox__binlog_tx {
        char gtid[64]; /* its own GTID, "domain-server-seq" */
        const char *state; /* the GTID state after it (NUL-terminated) */
        uint32_t commit_time; /* the binlog event's time, s since epoch */
        const kinbox__binlog_row_t *rows;
        size_t nrows;
} kinbox__binlog_tx_t;

typedef struct kinbox__binlog_opts {
        const char *url; /* mysql://... (database.url) */
        const char *password; /* NULL: the URL's */
        const char *table; /* NULL: "kinbox_outbox" */
        /* GTID state to read after ("0-1-42" or a comma list); NULL or
         * "": from the binlog's current end (@@gtid_binlog_pos). */
        const char *start;
        uint32_t server_id; /* 0: derived from name */
        const char *name; /* the relay's name, for the server id */
        int heartbeat_ms; /* 0: 1000 */
} kinbox__binlog_opts_t;

/* kinbox__binlog_next() results. */
#define KINBOX__BL_TX 1 /* *tx is a transaction with outbox rows */
#define KINBOX__BL_IDLE                                                       \
        2 /* a heartbeat or a transaction without
                           * outbox rows: kinbox__binlog_state() moved */

/* The server id a relay named name registers with when none is set:
 * 0x4b42xxxx (xxxx: a hash of the name), never 0 or 1. */
uint32_t kinbox__binlog_server_id(const char *name);

/* Whether the server can be read (log_bin ON, binlog_format ROW,
 * binlog_row_image FULL) on an open SQL connection (the caller's db).
 * Returns KINBOX_OK, KINBOX_ERR_CONFIG with errstr naming the setting,
 * or a database error code (errstr set). */
struct kinbox__db;
int kinbox__binlog_check(struct kinbox__db *db, char *errstr, size_t sz);

/* Open a reader at o->start. Returns NULL with *code and errstr set:
 * KINBOX_ERR_CONFIG (a server setting, named), KINBOX_ERR_NOT_FOUND (the
 * binlog holding start was purged: the message names the position and
 * `kinbox outbox resend --since TIME`), KINBOX_ERR_DB_CONN, KINBOX_ERR_DB.
 * The purge of start is only known at the first kinbox__binlog_next(),
 * which then fails the same way. */
kinbox__binlog_t *kinbox__binlog_open(const kinbox__binlog_opts_t *o,
                                      int *code, char *errstr, size_t sz);

/* The next event that matters, blocking up to about a heartbeat. Returns
 * KINBOX__BL_TX with *tx set (valid until the next call), KINBOX__BL_IDLE,
 * or a KINBOX_ERR_* code (<0) with kinbox__binlog_error() (the reader is dead:
 * close it, open another). */
int kinbox__binlog_next(kinbox__binlog_t *b, const kinbox__binlog_tx_t **tx);

/* The GTID state after the last committed transaction read (or the
 * start), NUL-terminated; valid until the next call. */
const char *kinbox__binlog_state(const kinbox__binlog_t *b);

/* The last error's text ("" when none). */
const char *kinbox__binlog_error(const kinbox__binlog_t *b);

/* Whether a transaction writing some table other than
 * kinbox_relay_position (or DDL) was read since the last call. The relay
 * stores a position advanced only by its own position writes nowhere
 * (that would write again, for ever). */
bool kinbox__binlog_take_foreign(kinbox__binlog_t *b);

/* The SQL side, on an open MariaDB session db (not the reader's):
 *
 * kinbox__binlog_lock(): GET_LOCK of the readers named name, waiting up
 * to wait_s; held while db's session lives. 1 taken, 0 another session
 * holds it (err says so), <0 a database error (err).
 * kinbox__binlog_pos_load(): the stored GTID state of relay name (*out
 * malloc'ed, NULL when none). kinbox__binlog_pos_store(): store it.
 * kinbox__binlog_pos_now(): @@gtid_binlog_pos (*out malloc'ed).
 * kinbox__binlog_pos_check(): KINBOX_OK when the binlog still holds every
 * transaction after state, KINBOX_ERR_NOT_FOUND when some were purged
 * (err names state, the oldest binlog and the recovery), <0 otherwise.
 * Return database error codes otherwise (db->err). */
int kinbox__binlog_lock(struct kinbox__db *db, const char *name, int wait_s,
                        char *err, size_t sz);
/* The name of that lock (for IS_USED_LOCK()), into buf (65 bytes). */
void kinbox__binlog_lock_name(const char *name, char buf[65]);
int kinbox__binlog_pos_load(struct kinbox__db *db, const char *name,
                            char **out);
int kinbox__binlog_pos_store(struct kinbox__db *db, const char *name,
                             const char *state);
int kinbox__binlog_pos_now(struct kinbox__db *db, char **out);
int kinbox__binlog_pos_check(struct kinbox__db *db, const char *state,
                             char *err, size_t sz);
/* After kinbox__binlog_pos_check() refused o->start (the position stored
 * in kinbox_relay_position): whether the one transaction purged after it
 * is provably the write that stored it, which publishes nothing. That
 * write is the one transaction a stored position can never cover (every
 * write of it is a binlogged transaction after the state it stores). It
 * is proven when the oldest binlog starts exactly one transaction after
 * o->start, and a dump from there to @@gtid_binlog_pos now (o's
 * connection settings, up to a minute) shows no write to any
 * kinbox_relay_position table: the write that stored o->start came after
 * o->start, before now, and is not in the binlog left, so it is that one
 * purged transaction. Returns 1 with *start the oldest binlog's start
 * position to read after (malloc'ed), 0 not proven, <0 an error (err).
 * Not thread-safe on db. */
int kinbox__binlog_pos_prove(struct kinbox__db *db,
                             const kinbox__binlog_opts_t *o, char **start,
                             char *err, size_t sz);
/* The binlog bytes a relay at state still has to read, at most (the
 * files from the one holding state on: the binlog a restart reads), and
 * whether the binlog after state was purged (then every file's bytes). */
int kinbox__binlog_pos_retained(struct kinbox__db *db, const char *state,
                                int64_t *bytes, bool *purged);

/* mysql_binlog_src.c, for outbox resend: the readers' name of conf
 * (relay.slot, else name); kinbox__binlog_hold(): take the readers' lock
 * on db (KINBOX_ERR_STATE: a relay holds it) and give the binlog's
 * position now (*pos malloc'ed); kinbox__binlog_set(): store pos as the
 * readers' position. err set on failure. */
struct kinbox_conf_s;
const char *kinbox__binlog_name(const struct kinbox_conf_s *conf);
int kinbox__binlog_hold(struct kinbox__db *db, const char *name, char **pos,
                        char *err, size_t sz);
int kinbox__binlog_set(struct kinbox__db *db, const char *name,
                       const char *pos, char *err, size_t sz);

/* Close the connection and free everything; NULL is a no-op. */
void kinbox__binlog_close(kinbox__binlog_t *b);

#endif
