/*
 * replay.c -- the operator's database handle and dead-letter replay.
 *
 * Replay runs the consumer's handler on the stored copy of a dead letter in
 * one transaction with its inbox row, so the effect is applied once: the
 * dead letter row is locked (FOR UPDATE) and must still be `dead`, the
 * message id's inbox row is taken over (or refused when another delivery
 * applied that id), the handler runs, the dead letter becomes `replayed`.
 */
#include "db.h"
#include "internal.h"
#include "metrics.h"
#include "tx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kinbox_admin_s {
        kinbox__db_t *db;
        char errstr[1024];
};

kinbox_admin_t *
kinbox_admin_new(const kinbox_conf_t *conf, char *errstr, size_t sz)
{
        const char *url = conf ? kinbox_conf_get(conf, "database.url") : NULL;
        if (!url || !*url) {
                kinbox__errstr(errstr, sz, "database.url is required");
                return NULL;
        }
        kinbox_admin_t *adm = kinbox__calloc(1, sizeof(*adm));
        char *pw = NULL;
        if (!adm) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        if (kinbox__conf_password(conf, &pw, errstr, sz)) {
                free(adm);
                return NULL;
        }
        adm->db = kinbox__db_new(url, pw, errstr, sz);
        free(pw);
        if (!adm->db) {
                free(adm);
                return NULL;
        }
        return adm;
}

void
kinbox_admin_destroy(kinbox_admin_t *adm)
{
        if (!adm)
                return;
        kinbox__db_destroy(adm->db);
        free(adm);
}

const char *
kinbox_admin_errstr(const kinbox_admin_t *adm)
{
        return adm ? adm->errstr : "";
}

kinbox_backend_t
kinbox_admin_backend(const kinbox_admin_t *adm)
{
        return adm->db->backend;
}

static kinbox_err_t
fail(kinbox_admin_t *adm, int rc)
{
        snprintf(adm->errstr, sizeof(adm->errstr), "%s",
                 adm->db->err.msg[0] ? adm->db->err.msg
                                     : kinbox_strerror((kinbox_err_t)rc));
        if (adm->db->in_tx)
                adm->db->ops->rollback(adm->db);
        if (rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_COMMIT_UNKNOWN) {
                adm->db->ops->disconnect(adm->db);
                return KINBOX_ERR_DB_CONN;
        }
        return (kinbox_err_t)rc;
}

kinbox_err_t
kinbox_admin_query(kinbox_admin_t *adm, const char *sql, int nparams,
                   const char *const *params, kinbox_rows_t **rowsp)
{
        adm->errstr[0] = '\0';
        if (rowsp)
                *rowsp = NULL;
        int rc = kinbox__db_queryv(adm->db, sql, nparams, params, rowsp);
        return rc ? fail(adm, rc) : KINBOX_OK;
}

static const char collect_pg[] =
    "SELECT destination, count(*) FILTER (WHERE status = 'pending'),"
    " COALESCE(extract(epoch FROM now() - min(created_at) FILTER"
    " (WHERE status = 'pending')), 0),"
    " count(*) FILTER (WHERE status = 'dead')"
    " FROM kinbox_outbox WHERE status IN ('pending', 'dead')"
    " GROUP BY destination";
static const char collect_my[] =
    "SELECT destination, SUM(status = 'pending'),"
    " COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN status = 'pending'"
    " THEN created_at END), CURRENT_TIMESTAMP(6)) / 1000000, 0),"
    " SUM(status = 'dead')"
    " FROM kinbox_outbox WHERE status IN ('pending', 'dead')"
    " GROUP BY destination";

kinbox_err_t
kinbox_admin_collect_metrics(kinbox_admin_t *adm)
{
        kinbox_rows_t *rows = NULL;
        bool pg = adm->db->backend == KINBOX_BACKEND_POSTGRESQL;
        kinbox_err_t rc =
            kinbox_admin_query(adm, pg ? collect_pg : collect_my, 0, NULL,
                               &rows);
        if (rc)
                return rc;
        /* Destinations that drained must read 0, not their last value. */
        kinbox__m_drop("kinbox_outbox_pending", "");
        kinbox__m_drop("kinbox_outbox_oldest_pending_seconds", "");
        kinbox__m_drop("kinbox_outbox_dead", "");
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                char l[600];
                const char *d = kinbox_rows_value(rows, i, 0, NULL);
                kinbox__m_labels(l, sizeof(l), "destination", d ? d : "",
                                 (char *)NULL);
                const char *v1 = kinbox_rows_value(rows, i, 1, NULL);
                const char *v2 = kinbox_rows_value(rows, i, 2, NULL);
                const char *v3 = kinbox_rows_value(rows, i, 3, NULL);
                kinbox__m_set("kinbox_outbox_pending", l,
                              v1 ? strtod(v1, NULL) : 0);
                kinbox__m_set("kinbox_outbox_oldest_pending_seconds", l,
                              v2 ? strtod(v2, NULL) : 0);
                kinbox__m_set("kinbox_outbox_dead", l,
                              v3 ? strtod(v3, NULL) : 0);
        }
        kinbox_rows_destroy(rows);
        rows = NULL;
        rc = kinbox_admin_query(
            adm,
            pg ? "SELECT consumer, count(*), extract(epoch FROM now() - "
                 "min(dead_at)) FROM kinbox_dead_letter WHERE status = "
                 "'dead' GROUP BY consumer"
               : "SELECT consumer, COUNT(*), TIMESTAMPDIFF(MICROSECOND, "
                 "MIN(dead_at), CURRENT_TIMESTAMP(6)) / 1000000 FROM "
                 "kinbox_dead_letter WHERE status = 'dead' GROUP BY "
                 "consumer",
            0, NULL, &rows);
        if (rc)
                return rc;
        kinbox__m_drop("kinbox_dead_letters", "");
        kinbox__m_drop("kinbox_dead_letter_oldest_seconds", "");
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                char l[300];
                const char *cn = kinbox_rows_value(rows, i, 0, NULL);
                const char *n = kinbox_rows_value(rows, i, 1, NULL);
                const char *age = kinbox_rows_value(rows, i, 2, NULL);
                kinbox__m_labels(l, sizeof(l), "consumer", cn ? cn : "",
                                 (char *)NULL);
                kinbox__m_set("kinbox_dead_letters", l,
                              n ? strtod(n, NULL) : 0);
                kinbox__m_set("kinbox_dead_letter_oldest_seconds", l,
                              age ? strtod(age, NULL) : 0);
        }
        kinbox_rows_destroy(rows);
        return KINBOX_OK;
}

/* ------------------------------------------------------------------ */
/* headers: the JSON kinbox__buf_json_str() wrote, decoded byte-exact
 * (\u00XX stands for the byte XX there, not for U+00XX). */

typedef struct hlist {
        kinbox_header_t *v;
        char **owned;
        size_t n, cap;
} hlist_t;

static const char *
skip_ws(const char *p)
{
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
                p++;
        return p;
}

static int
hexval(const char *p)
{
        int v = 0;
        for (int i = 0; i < 4; i++) {
                char c = p[i];
                v <<= 4;
                if (c >= '0' && c <= '9')
                        v |= c - '0';
                else if (c >= 'a' && c <= 'f')
                        v |= c - 'a' + 10;
                else if (c >= 'A' && c <= 'F')
                        v |= c - 'A' + 10;
                else
                        return -1;
        }
        return v;
}

/* Parse a JSON string at p (at the opening quote). */
static const char *
json_str(const char *p, kinbox__buf_t *out)
{
        if (*p != '"')
                return NULL;
        for (p++; *p && *p != '"'; p++) {
                if (*p != '\\') {
                        kinbox__buf_add(out, p, 1);
                        continue;
                }
                p++;
                char c = 0;
                switch (*p) {
                case '"': c = '"'; break;
                case '\\': c = '\\'; break;
                case '/': c = '/'; break;
                case 'b': c = '\b'; break;
                case 'f': c = '\f'; break;
                case 'n': c = '\n'; break;
                case 'r': c = '\r'; break;
                case 't': c = '\t'; break;
                case 'u': {
                        int v = hexval(p + 1);
                        if (v < 0)
                                return NULL;
                        p += 4;
                        if (v <= 0xff) {
                                c = (char)v;
                                break;
                        }
                        char u[3];
                        if (v < 0x800) {
                                u[0] = (char)(0xc0 | (v >> 6));
                                u[1] = (char)(0x80 | (v & 0x3f));
                                kinbox__buf_add(out, u, 2);
                        } else {
                                u[0] = (char)(0xe0 | (v >> 12));
                                u[1] = (char)(0x80 | ((v >> 6) & 0x3f));
                                u[2] = (char)(0x80 | (v & 0x3f));
                                kinbox__buf_add(out, u, 3);
                        }
                        continue;
                }
                default:
                        return NULL;
                }
                kinbox__buf_add(out, &c, 1);
        }
        return *p == '"' ? p + 1 : NULL;
}

static void
hlist_free(hlist_t *h)
{
        for (size_t i = 0; i < h->n * 2; i++)
                free(h->owned[i]);
        free(h->owned);
        free(h->v);
}

/* [{"name":"..","value":".."|null}, ...] */
static int
headers_parse(const char *s, hlist_t *h)
{
        memset(h, 0, sizeof(*h));
        if (!s)
                return 0;
        const char *p = skip_ws(s);
        if (*p++ != '[')
                return -1;
        p = skip_ws(p);
        if (*p == ']')
                return 0;
        for (;;) {
                if (*p++ != '{')
                        return -1;
                kinbox__buf_t name, value;
                kinbox__buf_init(&name);
                kinbox__buf_init(&value);
                bool has_value = false;
                for (;;) {
                        kinbox__buf_t k;
                        kinbox__buf_init(&k);
                        p = json_str(skip_ws(p), &k);
                        bool isname = p && k.p && !strcmp(k.p, "name");
                        bool isvalue = p && k.p && !strcmp(k.p, "value");
                        kinbox__buf_free(&k);
                        if (!p)
                                goto bad;
                        p = skip_ws(p);
                        if (*p++ != ':')
                                goto bad;
                        p = skip_ws(p);
                        if (!strncmp(p, "null", 4)) {
                                p += 4;
                        } else {
                                kinbox__buf_t *dst =
                                    isname ? &name : isvalue ? &value : NULL;
                                kinbox__buf_t junk;
                                kinbox__buf_init(&junk);
                                p = json_str(p, dst ? dst : &junk);
                                kinbox__buf_free(&junk);
                                if (!p)
                                        goto bad;
                                if (isvalue)
                                        has_value = true;
                        }
                        p = skip_ws(p);
                        if (*p == ',') {
                                p++;
                                continue;
                        }
                        if (*p++ == '}')
                                break;
                        goto bad;
                }
                if (h->n == h->cap) {
                        size_t cap = h->cap ? h->cap * 2 : 8;
                        kinbox_header_t *v =
                            realloc(h->v, cap * sizeof(*v));
                        char **o = v ? realloc(h->owned,
                                               cap * 2 * sizeof(*o))
                                     : NULL;
                        if (v)
                                h->v = v;
                        if (!v || !o)
                                goto bad;
                        h->owned = o;
                        h->cap = cap;
                }
                kinbox__buf_add(&name, "", 1);
                char *nm = kinbox__memdup(name.p, name.len);
                char *vl = has_value ? kinbox__memdup(value.p ? value.p : "",
                                                      value.len + 1)
                                     : NULL;
                if (has_value && vl)
                        vl[value.len] = '\0';
                h->owned[h->n * 2] = nm;
                h->owned[h->n * 2 + 1] = vl;
                h->v[h->n] = (kinbox_header_t){nm ? nm : "", vl,
                                               has_value ? value.len : 0};
                h->n++;
                kinbox__buf_free(&name);
                kinbox__buf_free(&value);
                p = skip_ws(p);
                if (*p == ',') {
                        p = skip_ws(p + 1);
                        continue;
                }
                return *p == ']' ? 0 : -1;
        bad:
                kinbox__buf_free(&name);
                kinbox__buf_free(&value);
                return -1;
        }
}

/* ------------------------------------------------------------------ */
/* replay */

static const char dl_select_pg[] =
    "SELECT consumer, message_id, topic, kafka_partition, kafka_offset,"
    " msg_key, headers, payload, status FROM kinbox_dead_letter"
    " WHERE id = $1::bigint FOR UPDATE";
static const char dl_select_my[] =
    "SELECT consumer, message_id, topic, kafka_partition, kafka_offset,"
    " msg_key, headers, payload, status FROM kinbox_dead_letter"
    " WHERE id = $1 FOR UPDATE";

kinbox_err_t
kinbox_dead_replay(kinbox_admin_t *adm, int64_t id, kinbox_handler_fn fn,
                   kinbox_batch_handler_fn bfn, void *opaque,
                   kinbox_result_t *resultp)
{
        kinbox__db_t *db = adm->db;
        struct kinbox_rows_s *dl = NULL, *ib = NULL;
        kinbox_tx_t *tx = NULL;
        kinbox_msg_t *msg = NULL;
        hlist_t hl = {0};
        kinbox_err_t ret = KINBOX_OK;
        char ids[24];
        int rc;
        adm->errstr[0] = '\0';
        if (resultp)
                *resultp = KINBOX_RESULT_RETRY;
        if (!fn && !bfn) {
                snprintf(adm->errstr, sizeof(adm->errstr), "no handler");
                return KINBOX_ERR_INVALID;
        }
        snprintf(ids, sizeof(ids), "%" PRId64, id);
        if (!db->native && (rc = kinbox__db_connect(db)))
                return fail(adm, rc);
        if ((rc = db->ops->begin(db)))
                return fail(adm, rc);
        kinbox__param_t p1[1] = {{ids, 0, 0}};
        bool pg = db->backend == KINBOX_BACKEND_POSTGRESQL;
        rc = db->ops->query(db, pg ? dl_select_pg : dl_select_my, 1, p1, -1,
                            &dl);
        if (rc)
                goto dberr;
        if (!dl || !dl->nrows) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no dead letter with id %" PRId64, id);
                ret = KINBOX_ERR_NOT_FOUND;
                goto out;
        }
        char **v = dl->values;
        size_t *len = dl->lens;
        if (strcmp(v[8], "dead")) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 " is %s, not dead: nothing "
                         "to replay",
                         id, v[8]);
                ret = KINBOX_ERR_STATE;
                goto out;
        }
        if (!v[1]) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 " has no message id (it "
                         "could not be extracted), so replay could not "
                         "deduplicate it: discard it instead",
                         id);
                ret = KINBOX_ERR_STATE;
                goto out;
        }
        if (headers_parse(v[6], &hl)) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "dead letter %" PRId64 ": stored headers do not "
                         "parse",
                         id);
                ret = KINBOX_ERR_INVALID;
                goto out;
        }
        /* The id's inbox row: the dead letter's own, or another delivery's
         * (then that one applied the id: replaying would apply it twice). */
        kinbox__param_t p2[2] = {{v[0], 0, 0}, {v[1], len[1], 0}};
        rc = db->ops->query(db,
                            "SELECT topic, kafka_partition, kafka_offset "
                            "FROM kinbox_inbox WHERE consumer = $1 AND "
                            "message_id = $2 FOR UPDATE",
                            2, p2, -1, &ib);
        if (rc)
                goto dberr;
        if (ib && ib->nrows) {
                if (strcmp(ib->values[0], v[2]) ||
                    strcmp(ib->values[1], v[3]) ||
                    strcmp(ib->values[2], v[4])) {
                        snprintf(adm->errstr, sizeof(adm->errstr),
                                 "message id of dead letter %" PRId64
                                 " was applied by another delivery (%s [%s] "
                                 "offset %s): not replayed",
                                 id, ib->values[0], ib->values[1],
                                 ib->values[2]);
                        ret = KINBOX_ERR_DUPLICATE;
                        goto out;
                }
                rc = db->ops->exec(db,
                                   "DELETE FROM kinbox_inbox WHERE consumer "
                                   "= $1 AND message_id = $2",
                                   2, p2, -1);
                if (rc)
                        goto dberr;
        }
        kinbox__param_t p5[5] = {{v[0], 0, 0},
                                 {v[1], len[1], 0},
                                 {v[2], 0, 0},
                                 {v[3], 0, 0},
                                 {v[4], 0, 0}};
        rc = db->ops->exec(db,
                           pg ? "INSERT INTO kinbox_inbox (consumer, "
                                "message_id, topic, kafka_partition, "
                                "kafka_offset) VALUES ($1, $2, $3, "
                                "$4::integer, $5::bigint)"
                              : "INSERT INTO kinbox_inbox (consumer, "
                                "message_id, topic, kafka_partition, "
                                "kafka_offset) VALUES ($1, $2, $3, $4, $5)",
                           5, p5, -1);
        if (rc)
                goto dberr;
        kinbox__msg_parts_t parts = {
            .id = v[1],
            .topic = v[2],
            .partition = (int32_t)strtol(v[3], NULL, 10),
            .offset = strtoll(v[4], NULL, 10),
            .timestamp = -1,
            .key = v[5],
            .key_len = v[5] ? len[5] : 0,
            .payload = v[7],
            .len = v[7] ? len[7] : 0,
            .headers = hl.v,
            .nheaders = hl.n,
        };
        msg = kinbox__msg_from_parts(&parts);
        tx = kinbox__tx_new(db, v[0]);
        if (!msg || !tx) {
                ret = KINBOX_ERR_NOMEM;
                goto out;
        }
        kinbox__tx_reset(tx);
        kinbox_result_t r;
        if (bfn) {
                const kinbox_msg_t *one[1] = {msg};
                kinbox_result_t res1 = KINBOX_RESULT_OK;
                r = bfn(tx, one, 1, &res1, opaque);
                if (r == KINBOX_RESULT_OK)
                        r = res1;
        } else {
                r = fn(tx, msg, opaque);
        }
        if (r == KINBOX_RESULT_OK && kinbox__tx_failed(tx))
                r = KINBOX_RESULT_RETRY;
        /* The handler's queued statements: their errors are its own. */
        if (r == KINBOX_RESULT_OK && (rc = db->ops->flush(db))) {
                if (rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_TRANSIENT)
                        goto dberr;
                r = KINBOX_RESULT_RETRY;
        }
        if (resultp)
                *resultp = r;
        if (r != KINBOX_RESULT_OK) {
                const char *why = kinbox__tx_reason(tx)[0]
                                      ? kinbox__tx_reason(tx)
                                  : kinbox__msg_reason(msg)
                                      ? kinbox__msg_reason(msg)
                                  : db->err.code ? db->err.msg
                                                 : "no reason given";
                if (db->err.code && !kinbox__tx_reason(tx)[0])
                        why = db->err.msg;
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "handler returned %s: %s; rolled back, dead letter "
                         "%" PRId64 " unchanged",
                         r == KINBOX_RESULT_REJECT ? "REJECT" : "RETRY", why,
                         id);
                ret = KINBOX_ERR_INVALID;
                goto out;
        }
        rc = db->ops->exec(db,
                           pg ? "UPDATE kinbox_dead_letter SET status = "
                                "'replayed' WHERE id = $1::bigint"
                              : "UPDATE kinbox_dead_letter SET status = "
                                "'replayed' WHERE id = $1",
                           1, p1, -1);
        if (!rc)
                rc = db->ops->commit(db);
        if (rc)
                goto dberr;
        goto done;
dberr:
        ret = fail(adm, rc);
        goto done;
out:
        if (db->in_tx)
                db->ops->rollback(db);
done:
        kinbox__msg_destroy(msg);
        kinbox__tx_destroy(tx);
        hlist_free(&hl);
        kinbox_rows_destroy(dl);
        kinbox_rows_destroy(ib);
        return ret;
}
