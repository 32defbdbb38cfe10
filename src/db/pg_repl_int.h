/*
 * db/pg_repl_int.h -- what pg_repl.c (the connections, the slot, the
 * replication stream, progress) and pg_repl_decode.c (pgoutput messages
 * into events) share.
 */
#ifndef KINBOX_DB_PG_REPL_INT_H
#define KINBOX_DB_PG_REPL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <libpq-fe.h>

#include "../db.h"
#include "../internal.h"

#define MSG_PREFIX "kinbox."
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

static inline uint64_t
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
static inline const char *
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

static inline const unsigned char *
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

/* s->err = the message (line breaks folded). */
void kinbox__pgr_seterr(kinbox__logsrc_t *s, const char *fmt, ...)
    KINBOX_PRINTF(2, 3);

/* One pgoutput message (after XLogData's header, at start): 1 an event in
 * *ev, 0 nothing to deliver, <0 an error with s->err. Relation messages
 * update x's relations; ev's strings point into x until the next call. */
int kinbox__pgr_pgoutput(kinbox__logsrc_t *s, repl_t *x, uint64_t start,
                         rd_t *r, kinbox__logev_t *ev);

#endif
