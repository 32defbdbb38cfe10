/*
 * db/pg_repl_decode.c -- pgoutput (proto_version 1) messages into the log
 * relay's events, for db/pg_repl.c: Begin, Commit, Relation (the outbox's
 * columns found by name), Insert (an outbox row's values in text form:
 * DateStyle ISO, TimeZone UTC, bytea_output hex) and logical Message.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg_repl_int.h"

static const char *const col_names[C_N] = {
    "id",      "kind",    "destination", "idem_key", "aggregate_id",
    "payload", "headers", "created_at",  "status"};

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
                kinbox__pgr_seterr(
                    s, "relay.source = wal: malformed Relation message");
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
                kinbox__pgr_seterr(
                    s, "relay.source = wal: malformed Insert message");
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
                kinbox__pgr_seterr(
                    s,
                    "relay.source = wal: outbox row %" PRId64
                    ": a required column is missing or unreadable",
                    row->id);
                return KINBOX_ERR_DB;
        }
        if (V(C_PAYLOAD)) {
                if (!unhex(V(C_PAYLOAD), x->val[C_PAYLOAD].len - 1,
                           &x->payload)) {
                        kinbox__pgr_seterr(
                            s,
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
int
kinbox__pgr_pgoutput(kinbox__logsrc_t *s, repl_t *x, uint64_t start, rd_t *r,
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
                        kinbox__pgr_seterr(
                            s, "relay.source = wal: malformed Insert");
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
                        kinbox__pgr_seterr(
                            s, "relay.source = wal: malformed Message");
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
