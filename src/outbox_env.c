/*
 * outbox_env.c -- the envelope of a table-less outbox event (the bytes:
 * outbox_env.h, docs/outbox.md): encoded by kinbox_outbox_emit_pg(),
 * decoded by the log relay. A decode never trusts its input: another
 * writer's message under the same prefix, truncated or trailing bytes and
 * an unknown version are refused with the reason, never read past.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "outbox_env.h"
#include "outbox_int.h"
#include "tx.h"
#include "wake.h"

#define NULL_LEN 0xFFFFFFFFu
#define NFIELDS 5

enum { F_DEST, F_AGG, F_IDEM, F_HDRS, F_PAYLOAD };

static void
put_field(kinbox__buf_t *b, const void *p, size_t n)
{
        uint32_t len = p ? (uint32_t)n : NULL_LEN;
        unsigned char l[4] = {(unsigned char)(len >> 24),
                              (unsigned char)(len >> 16),
                              (unsigned char)(len >> 8), (unsigned char)len};
        kinbox__buf_add(b, l, 4);
        if (p && n)
                kinbox__buf_add(b, p, n);
}

int
kinbox__outbox_env_encode(const kinbox_outbox_msg_t *m, kinbox__buf_t *b,
                          char *why, size_t whysz)
{
        kinbox__outbox_prepared_t pr;
        if (kinbox__outbox_prepare(m, &pr, why, whysz))
                return -1;
        if (!strcmp(pr.kind, "action")) {
                kinbox__outbox_prepared_free(&pr);
                kinbox__errstr(why, whysz,
                               "outbox emit: local actions (%s) need the "
                               "table: use kinbox_outbox_append*()",
                               m->destination);
                return -1;
        }
        if (m->payload_size > 0x7FFFFFFFu) {
                kinbox__outbox_prepared_free(&pr);
                kinbox__errstr(why, whysz, "outbox emit: payload too large");
                return -1;
        }
        unsigned char v = KINBOX__ENV_VERSION;
        kinbox__buf_add(b, &v, 1);
        put_field(b, m->destination, strlen(m->destination));
        put_field(b, m->aggregate_id,
                  m->aggregate_id ? strlen(m->aggregate_id) : 0);
        put_field(b, m->idem_key, strlen(m->idem_key));
        put_field(b, pr.has_headers ? pr.headers.p : NULL,
                  pr.has_headers ? pr.headers.len : 0);
        put_field(b, m->payload, m->payload_size);
        kinbox__outbox_prepared_free(&pr);
        if (b->oom) {
                kinbox__errstr(why, whysz, "out of memory");
                return -1;
        }
        return 0;
}

/* Whether a text field is usable: required ones present and non-empty,
 * bounded, no NUL inside. */
static bool
text_ok(const unsigned char *p, uint32_t len, bool required, size_t max)
{
        if (len == NULL_LEN)
                return !required;
        if ((required && !len) || len > max)
                return false;
        return !memchr(p, 0, len);
}

/* The envelope's fields after its version byte: f[i] and len[i] (NULL_LEN:
 * absent), *total the bytes they take NUL-terminated. 0, or -1 with why
 * (truncated, or bytes after the last field). */
static int
split_fields(const unsigned char *p, size_t n, const unsigned char **f,
             uint32_t *len, size_t *total, char *why, size_t whysz)
{
        size_t off = 1;
        for (int i = 0; i < NFIELDS; i++) {
                if (n - off < 4) {
                        kinbox__errstr(why, whysz,
                                       "outbox envelope: truncated (%zu "
                                       "bytes)",
                                       n);
                        return -1;
                }
                len[i] = (uint32_t)p[off] << 24 | (uint32_t)p[off + 1] << 16 |
                         (uint32_t)p[off + 2] << 8 | p[off + 3];
                off += 4;
                f[i] = p + off;
                if (len[i] != NULL_LEN) {
                        if (n - off < len[i]) {
                                kinbox__errstr(why, whysz,
                                               "outbox envelope: truncated "
                                               "(%zu bytes)",
                                               n);
                                return -1;
                        }
                        off += len[i];
                        *total += len[i] + 1;
                }
        }
        if (off != n) {
                kinbox__errstr(why, whysz,
                               "outbox envelope: %zu bytes after its last "
                               "field",
                               n - off);
                return -1;
        }
        return 0;
}

int
kinbox__outbox_env_decode(const char *prefix, const unsigned char *p, size_t n,
                          kinbox__outbox_env_t *out, char *why, size_t whysz)
{
        memset(out, 0, sizeof(*out));
        if (!prefix || strcmp(prefix, KINBOX__ENV_PREFIX)) {
                kinbox__errstr(why, whysz,
                               "logical message with prefix %.64s: not a "
                               "kinbox outbox envelope (" KINBOX__ENV_PREFIX
                               ")",
                               prefix ? prefix : "(none)");
                return -1;
        }
        if (n < 1 || p[0] != KINBOX__ENV_VERSION) {
                kinbox__errstr(why, whysz,
                               "outbox envelope: unknown version %d (this "
                               "kinbox reads %d)",
                               n ? p[0] : -1, KINBOX__ENV_VERSION);
                return -1;
        }
        const unsigned char *f[NFIELDS];
        uint32_t len[NFIELDS];
        size_t total = 0;
        if (split_fields(p, n, f, len, &total, why, whysz))
                return -1;
        size_t am = strlen(KINBOX_OUTBOX_ACTION_PREFIX);
        if (!text_ok(f[F_DEST], len[F_DEST], true, KINBOX_OUTBOX_NAME_MAX) ||
            !text_ok(f[F_AGG], len[F_AGG], false, KINBOX_OUTBOX_NAME_MAX) ||
            !text_ok(f[F_IDEM], len[F_IDEM], true, KINBOX_OUTBOX_NAME_MAX) ||
            !text_ok(f[F_HDRS], len[F_HDRS], false, SIZE_MAX) ||
            (len[F_DEST] >= am &&
             !memcmp(f[F_DEST], KINBOX_OUTBOX_ACTION_PREFIX, am))) {
                kinbox__errstr(why, whysz,
                               "outbox envelope: destination, aggregate_id, "
                               "idem_key or headers out of bounds");
                return -1;
        }
        out->mem = malloc(total + 1);
        if (!out->mem) {
                kinbox__errstr(why, whysz, "out of memory");
                return -1;
        }
        char *m = out->mem;
        const char **dst[NFIELDS] = {&out->destination, &out->aggregate_id,
                                     &out->idem_key, &out->headers_json,
                                     &out->payload};
        for (int i = 0; i < NFIELDS; i++) {
                if (len[i] == NULL_LEN)
                        continue;
                memcpy(m, f[i], len[i]);
                m[len[i]] = '\0';
                *dst[i] = m;
                m += len[i] + 1;
        }
        out->payload_size = len[F_PAYLOAD] == NULL_LEN ? 0 : len[F_PAYLOAD];
        return 0;
}

void
kinbox__outbox_env_free(kinbox__outbox_env_t *e)
{
        free(e->mem);
        e->mem = NULL;
}

/* ------------------------------------------------------- the writers */

kinbox_err_t
kinbox_outbox_emit_pg(struct pg_conn *conn, const kinbox_outbox_msg_t *m,
                      char *errstr, size_t errstr_size)
{
        if (!conn) {
                kinbox__errstr(errstr, errstr_size, "no connection");
                return KINBOX_ERR_INVALID;
        }
        kinbox__outbox_trace_t ot;
        m = kinbox__outbox_trace_begin(&ot, m, NULL);
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox_err_t rc = KINBOX_ERR_INVALID;
        if (!kinbox__outbox_env_encode(m, &b, errstr, errstr_size))
                rc = kinbox__pg_outbox_emit(conn, b.p, b.len, errstr,
                                            errstr_size);
        kinbox__buf_free(&b);
        kinbox__outbox_trace_end(&ot, rc, 0);
        return rc;
}

kinbox_err_t
kinbox_outbox_emit(kinbox_tx_t *tx, const kinbox_outbox_msg_t *m)
{
        if (!tx)
                return KINBOX_ERR_INVALID;
        kinbox__db_t *db = kinbox__tx_db(tx);
        int tag = kinbox__tx_tag(tx);
        char err[256];
        if (!db->ops->outbox->emit) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, tag,
                                  "outbox emit: needs PostgreSQL (%s has no "
                                  "logical messages): use "
                                  "kinbox_outbox_append()",
                                  db->ops->name);
                return KINBOX_ERR_INVALID;
        }
        kinbox__outbox_trace_t ot;
        m = kinbox__outbox_trace_begin(&ot, m, kinbox__tx_msg(tx));
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox_err_t rc = KINBOX_ERR_INVALID;
        if (kinbox__outbox_env_encode(m, &b, err, sizeof(err))) {
                kinbox__db_seterr(db, rc, "", 0, tag, "%s", err);
        } else {
                kinbox__param_t p[1] = {{b.p, b.len, 1}};
                rc = (kinbox_err_t)db->ops->exec(db, db->ops->outbox->emit, 1,
                                                 p, tag);
        }
        kinbox__buf_free(&b);
        kinbox__outbox_trace_end(&ot, rc, 0);
        return rc;
}
