/*
 * console_data.c -- the console's JSON answers and actions. Every library
 * call the console makes is here, on the console's own operator handle
 * (kinbox_admin_new(): its own database connection, never a consumer's
 * or the relay's), each request's statements under a 5 s statement time
 * limit (the dialect table's console_timeout). The actions are the calls
 * `kinbox dead` and `kinbox outbox` make (cmd_dead.c, cmd_outbox.c).
 *
 * The process's own figures (messages/s, batch size, lag per partition,
 * assigned partitions, the relay's counters) come from the metrics
 * registry, the rest from the database. The overview is computed at most
 * once per 2 s whatever the number of pages open (then served again).
 */
#include "admin_int.h"
#include "console.h"
#include "hdrcodec.h"
#include "internal.h"
#include "metrics.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OVERVIEW_EVERY_MS 2000
#define PAGE_MAX 100 /* dead letters or outbox rows per page */
#define SELECT_MAX 100 /* dead letters one selection acts on */
#define TEXT_CAP 65536 /* payload bytes shown as text / JSON */
#define HEX_CAP 4096 /* payload bytes shown as hex */

/* A consumer and its previous sample (messages/s, mean batch size). */
typedef struct cons {
        char *name, *group, *topics;
        int hold_key;
        int64_t batch_max;
        double prev_msgs, prev_bsum, prev_bcount;
        int64_t prev_ms;
        double rate, batch_mean;
} cons_t;

struct kinbox__console_data {
        kinbox_admin_t *adm;
        cons_t *cons;
        size_t ncons;
        char relay_source[16]; /* "": no relay */
        kinbox__console_handler_fn handler;
        void *opaque;
        char *overview; /* the last one, and when */
        int64_t overview_ms;
};

kinbox__console_data_t *
kinbox__console_data_new(const kinbox_conf_t *conf,
                         const kinbox__console_consumer_t *consumers, size_t n,
                         const char *relay_source,
                         kinbox__console_handler_fn handler, void *opaque,
                         char *errstr, size_t errstr_size)
{
        kinbox__console_data_t *d = kinbox__calloc(1, sizeof(*d));
        if (d)
                d->cons = kinbox__calloc(n + 1, sizeof(cons_t));
        if (!d || !d->cons) {
                free(d);
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return NULL;
        }
        d->adm = kinbox_admin_new(conf, errstr, errstr_size);
        if (!d->adm) {
                free(d->cons);
                free(d);
                return NULL;
        }
        for (size_t i = 0; i < n; i++) {
                cons_t *c = &d->cons[d->ncons++];
                c->name = kinbox__strdup(consumers[i].name);
                c->group =
                    kinbox__strdup(consumers[i].group ? consumers[i].group
                                                      : consumers[i].name);
                c->topics = kinbox__strdup(
                    consumers[i].topics ? consumers[i].topics : "");
                c->hold_key = consumers[i].hold_key;
                c->batch_max = consumers[i].batch_max;
                c->rate = c->batch_mean = NAN;
        }
        snprintf(d->relay_source, sizeof(d->relay_source), "%s",
                 relay_source ? relay_source : "");
        d->handler = handler;
        d->opaque = opaque;
        return d;
}

void
kinbox__console_data_destroy(kinbox__console_data_t *d)
{
        if (!d)
                return;
        for (size_t i = 0; i < d->ncons; i++) {
                free(d->cons[i].name);
                free(d->cons[i].group);
                free(d->cons[i].topics);
        }
        free(d->cons);
        free(d->overview);
        kinbox_admin_destroy(d->adm);
        free(d);
}

/* ------------------------------------------------------------------ */
/* Helpers */

static json_t *
jnum(double v)
{
        return isnan(v) ? json_null() : json_real(v);
}

/* A database text value as a JSON integer (or null). */
static json_t *
jint(const char *v)
{
        return v ? json_integer(kinbox__i64_or(v, 0)) : json_null();
}

/* Bytes as a JSON string when they are UTF-8 (NUL included), else null. */
static json_t *
jtext(const char *v, size_t n)
{
        json_t *s = v ? json_stringn(v, n) : NULL;
        return s ? s : json_null();
}

static const char *
rowv(kinbox_rows_t *r, size_t i, size_t c)
{
        return kinbox_rows_value(r, i, c, NULL);
}

/* {"error": ...} for the handle's last failure, code for rc. */
static unsigned
fail(kinbox__console_data_t *d, kinbox_err_t rc, char **json)
{
        json_t *j = json_pack("{s:s,s:s}", "error",
                              kinbox_admin_errstr(d->adm)[0]
                                  ? kinbox_admin_errstr(d->adm)
                                  : kinbox_strerror(rc),
                              "code", kinbox_strerror(rc));
        *json = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return rc == KINBOX_ERR_NOT_FOUND   ? 404
               : rc == KINBOX_ERR_STATE     ? 409
               : rc == KINBOX_ERR_DUPLICATE ? 409
               : rc == KINBOX_ERR_INVALID   ? 400
               : rc == KINBOX_ERR_DB_CONN   ? 503
                                            : 500;
}

static unsigned
bad(const char *msg, char **json)
{
        json_t *j = json_pack("{s:s}", "error", msg);
        *json = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return 400;
}

static unsigned
done(json_t *j, char **json)
{
        *json = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return *json ? 200 : 500;
}

/* The session's statement time limit (again after a reconnect). */
static void
session_limit(kinbox__console_data_t *d)
{
        (void)kinbox__admin_query(
            d->adm, d->adm->db->ops->sql->console_timeout, 0, NULL, NULL);
}

/* A query argument as a positive id; 0 when absent or not one. */
static int64_t
arg_id(const char *v)
{
        char *end;
        long long n = v ? strtoll(v, &end, 10) : 0;
        return v && *v && !*end && n > 0 ? (int64_t)n : 0;
}

/* The id at the start of a path ("12/replay"); 0 when none. */
static int64_t
lead_id(const char *p)
{
        char *end;
        long long n = strtoll(p, &end, 10);
        return end != p && (*end == '/' || !*end) && n > 0 ? (int64_t)n : 0;
}

static const char *
arg(const kinbox__http_req_t *r, const char *name)
{
        const char *v = kinbox__http_req_get(r, 1, name);
        return v && *v ? v : NULL;
}

/* ------------------------------------------------------------------ */
/* The process's figures from the metrics registry */

/* One series of a Prometheus text line: its family (before '{' or ' '),
 * a label's value, its value. */
static bool
series(const char *line, const char *family, size_t flen)
{
        return !strncmp(line, family, flen) &&
               (line[flen] == '{' || line[flen] == ' ');
}

/* Label name's value in line (unescaped into out); false when absent. */
static bool
label(const char *line, const char *name, char *out, size_t sz)
{
        char pat[64];
        snprintf(pat, sizeof(pat), "%s=\"", name);
        const char *end = strchr(line, '}');
        const char *p = strstr(line, pat);
        if (!p || !end || p > end || (p[-1] != '{' && p[-1] != ','))
                return false;
        p += strlen(pat);
        size_t k = 0;
        for (; *p && *p != '"' && k + 1 < sz; p++) {
                if (*p == '\\' && p[1])
                        p++;
                out[k++] = *p == 'n' && p[-1] == '\\' ? '\n' : *p;
        }
        out[k] = '\0';
        return true;
}

static double
line_value(const char *line)
{
        /* The last space of this line (line points into the whole text:
         * strrchr() found the last line's, every series read as the
         * text's last value). */
        const char *sp = NULL;
        for (const char *p = line; *p && *p != '\n'; p++)
                if (*p == ' ')
                        sp = p;
        return sp ? strtod(sp + 1, NULL) : NAN;
}

/* Sum of family's series whose label lname is lval (NULL: all); NAN when
 * there is none. */
static double
msum(const char *text, const char *family, const char *lname, const char *lval)
{
        double sum = NAN;
        size_t flen = strlen(family);
        for (const char *l = text; l && *l; l = strchr(l, '\n'), l += !!l) {
                char v[256];
                if (*l == '#' || !series(l, family, flen))
                        continue;
                if (lname &&
                    (!label(l, lname, v, sizeof(v)) || strcmp(v, lval)))
                        continue;
                sum = (isnan(sum) ? 0 : sum) + line_value(l);
        }
        return sum;
}

/* The consumer's lag per partition (kinbox_consumer_lag). */
static json_t *
lag_parts(const char *text, const char *consumer, double *total)
{
        json_t *a = json_array();
        static const char fam[] = "kinbox_consumer_lag";
        *total = NAN;
        for (const char *l = text; l && *l; l = strchr(l, '\n'), l += !!l) {
                char c[256], t[256], p[32];
                if (*l == '#' || !series(l, fam, sizeof(fam) - 1) ||
                    !label(l, "consumer", c, sizeof(c)) ||
                    strcmp(c, consumer) || !label(l, "topic", t, sizeof(t)) ||
                    !label(l, "partition", p, sizeof(p)))
                        continue;
                double v = line_value(l);
                *total = (isnan(*total) ? 0 : *total) + v;
                json_array_append_new(a, json_pack("{s:s,s:i,s:o}", "topic", t,
                                                   "partition", atoi(p), "lag",
                                                   jnum(v)));
        }
        return a;
}

/* Messages/s and the mean batch size since the previous sample (at least
 * 1 s apart; else the previous figures). Messages: processed, duplicates,
 * business duplicates, dead-lettered and parked. */
static void
sample(cons_t *c, const char *text, int64_t now)
{
        static const char *const res[] = {
            "processed", "duplicate", "business_duplicate", "dead", "parked"};
        double msgs = 0;
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(res); i++) {
                char lv[400];
                snprintf(lv, sizeof(lv), "consumer=\"%s\",result=\"%s\"",
                         c->name, res[i]);
                double v = kinbox__metrics_value(
                    "kinbox_consumer_messages_total", lv);
                msgs += isnan(v) ? 0 : v;
        }
        double bs =
            msum(text, "kinbox_consumer_batch_size_sum", "consumer", c->name);
        double bc = msum(text, "kinbox_consumer_batch_size_count", "consumer",
                         c->name);
        bs = isnan(bs) ? 0 : bs;
        bc = isnan(bc) ? 0 : bc;
        if (c->prev_ms && now - c->prev_ms < 1000)
                return;
        if (c->prev_ms)
                c->rate = (msgs - c->prev_msgs) * 1000.0 /
                          (double)(now - c->prev_ms);
        if (c->prev_ms && bc > c->prev_bcount)
                c->batch_mean = (bs - c->prev_bsum) / (bc - c->prev_bcount);
        else if (bc > 0)
                c->batch_mean = bs / bc;
        c->prev_ms = now;
        c->prev_msgs = msgs;
        c->prev_bsum = bs;
        c->prev_bcount = bc;
}

/* ------------------------------------------------------------------ */
/* GET overview: consumers, outbox, relay */

/* The newest dead letter's error and time of consumer (null: none). */
static json_t *
last_error(kinbox__console_data_t *d, const char *consumer)
{
        char sql[2048];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(sql, sizeof(sql), d->adm->db->ops->sql->console_dead_page,
                 1L);
#pragma GCC diagnostic pop
        const char *v[4] = {consumer, NULL, NULL, "9223372036854775807"};
        kinbox_rows_t *r = NULL;
        json_t *e = json_null();
        if (!kinbox__admin_query(d->adm, sql, 4, v, &r) &&
            kinbox_rows_count(r)) {
                size_t n = 0;
                const char *t = kinbox_rows_value(r, 0, 10, &n);
                json_decref(e);
                e = json_pack("{s:o,s:s?,s:o}", "error", jtext(t, n), "at",
                              rowv(r, 0, 9), "dead_letter",
                              jint(rowv(r, 0, 0)));
        }
        kinbox_rows_destroy(r);
        return e;
}

/* A consumer: the process's figures, and the database's counts as the
 * sampled gauges hold them (kinbox__admin_collect_metrics(), just run). */
static json_t *
consumer_json(kinbox__console_data_t *d, cons_t *c, const char *text)
{
        double lag = NAN;
        json_t *parts = lag_parts(text, c->name, &lag);
        char l[300];
        snprintf(l, sizeof(l), "consumer=\"%s\"", c->name);
        double assigned =
            kinbox__metrics_value("kinbox_consumer_assigned_partitions", l);
        double held =
            kinbox__metrics_value("kinbox_consumer_held_partitions", l);
        double refused =
            kinbox__metrics_value("kinbox_consumer_partitions_refused", l);
        json_t *j = json_pack(
            "{s:s,s:s,s:s,s:b,s:I,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "name",
            c->name, "group", c->group, "topics", c->topics, "hold_key",
            c->hold_key, "batch_max", (json_int_t)c->batch_max,
            "assigned_partitions", jnum(assigned), "partitions", parts, "lag",
            jnum(lag), "msgs_per_s", jnum(c->rate), "batch_size_mean",
            jnum(c->batch_mean), "held_partitions", jnum(held),
            "refused_partitions", jnum(refused));
        static const char *const res[][2] = {
            {"duplicate", "dedup_hits"},
            {"business_duplicate", "business_duplicates"},
            {"processed", "processed"},
            {"retried", "retried"}};
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(res); i++) {
                char lv[400];
                snprintf(lv, sizeof(lv), "consumer=\"%s\",result=\"%s\"",
                         c->name, res[i][0]);
                json_object_set_new(
                    j, res[i][1],
                    jnum(kinbox__metrics_value(
                        "kinbox_consumer_messages_total", lv)));
        }
        static const char *const db[][2] = {
            {"kinbox_dead_letters", "dead"},
            {"kinbox_parked_messages", "parked"},
            {"kinbox_held_keys", "held_keys"},
            {"kinbox_parked_oldest_age_seconds", "parked_oldest_age_s"}};
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(db); i++) {
                double v = kinbox__metrics_value(db[i][0], l);
                json_object_set_new(
                    j, db[i][1], json_integer(isnan(v) ? 0 : (json_int_t)v));
        }
        json_object_set_new(j, "last_error", last_error(d, c->name));
        return j;
}

/* kinbox_admin_outbox_summary()'s rows. */
static json_t *
outbox_json(kinbox_rows_t *r)
{
        json_t *a = json_array();
        for (size_t i = 0; i < kinbox_rows_count(r); i++)
                json_array_append_new(
                    a,
                    json_pack("{s:s,s:o,s:o,s:o,s:o,s:b}", "destination",
                              rowv(r, i, 0) ? rowv(r, i, 0) : "", "pending",
                              jint(rowv(r, i, 1)), "oldest_pending_age_s",
                              jint(rowv(r, i, 2)), "dead", jint(rowv(r, i, 3)),
                              "sent_last_hour", jint(rowv(r, i, 4)), "paused",
                              rowv(r, i, 5) && atoi(rowv(r, i, 5)) != 0));
        return a;
}

/* The relay of this process: its counters, the log relay's slot. */
static json_t *
relay_json(kinbox__console_data_t *d, const char *text)
{
        if (!d->relay_source[0])
                return json_pack("{s:b}", "enabled", 0);
        json_t *j = json_pack(
            "{s:b,s:s,s:o,s:o,s:o,s:o}", "enabled", 1, "source",
            d->relay_source, "published",
            jnum(msum(text, "kinbox_relay_published_total", NULL, NULL)),
            "failed",
            jnum(msum(text, "kinbox_relay_failed_total", NULL, NULL)), "dead",
            jnum(msum(text, "kinbox_relay_dead_total", NULL, NULL)),
            "slot_lag_bytes",
            jnum(msum(text, "kinbox_relay_slot_lag_bytes", NULL, NULL)));
        static const char *const states[] = {"reserved", "extended",
                                             "unreserved", "lost"};
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(states); i++)
                if (msum(text, "kinbox_relay_slot_wal_status", "state",
                         states[i]) > 0)
                        json_object_set_new(j, "wal_status",
                                            json_string(states[i]));
        return j;
}

static unsigned
get_overview(kinbox__console_data_t *d, char **json)
{
        int64_t now = kinbox__now_ms();
        if (d->overview && now - d->overview_ms < OVERVIEW_EVERY_MS) {
                *json = kinbox__strdup(d->overview);
                return *json ? 200 : 500;
        }
        /* The counts /metrics samples (small tables, GROUP BY consumer;
         * never a count of the inbox), and the outbox per destination. */
        kinbox_rows_t *ob = NULL;
        kinbox_err_t rc = kinbox__admin_collect_metrics(d->adm);
        if (!rc)
                rc = kinbox_admin_outbox_summary(d->adm, &ob);
        if (rc)
                return fail(d, rc, json);
        char *text = kinbox__metrics_render();
        json_t *cs = json_array();
        for (size_t i = 0; i < d->ncons; i++) {
                sample(&d->cons[i], text ? text : "", now);
                json_array_append_new(
                    cs, consumer_json(d, &d->cons[i], text ? text : ""));
        }
        json_t *j = json_pack("{s:o,s:o,s:o,s:I}", "consumers", cs, "outbox",
                              outbox_json(ob), "relay",
                              relay_json(d, text ? text : ""), "at_ms",
                              (json_int_t)kinbox__wall_ms());
        free(text);
        kinbox_rows_destroy(ob);
        unsigned code = done(j, json);
        if (code == 200) {
                free(d->overview);
                d->overview = kinbox__strdup(*json);
                d->overview_ms = now;
        }
        return code;
}

/* ------------------------------------------------------------------ */
/* GET dead, dead/ID, parked, outbox */

/* Dead letters newest first by filter, ids below before (0: any). */
static kinbox_err_t
dead_page(kinbox__console_data_t *d, const char *consumer, const char *status,
          const char *topic, int64_t before, long limit, kinbox_rows_t **r)
{
        char sql[2048], b[24];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(sql, sizeof(sql), d->adm->db->ops->sql->console_dead_page,
                 limit);
#pragma GCC diagnostic pop
        snprintf(b, sizeof(b), "%" PRId64, before > 0 ? before : INT64_MAX);
        const char *v[4] = {consumer, status, topic, b};
        return kinbox__admin_query(d->adm, sql, 4, v, r);
}

static json_t *
dead_row(kinbox_rows_t *r, size_t i)
{
        size_t idl = 0, el = 0;
        const char *id = kinbox_rows_value(r, i, 5, &idl);
        const char *err = kinbox_rows_value(r, i, 10, &el);
        return json_pack("{s:o,s:s,s:s,s:o,s:o,s:o,s:s,s:o,s:s?,s:s?,s:o,s:o}",
                         "id", jint(rowv(r, i, 0)), "consumer", rowv(r, i, 1),
                         "topic", rowv(r, i, 2), "partition",
                         jint(rowv(r, i, 3)), "offset", jint(rowv(r, i, 4)),
                         "message_id", jtext(id, idl), "status", rowv(r, i, 6),
                         "attempts", jint(rowv(r, i, 7)), "first_failed_at",
                         rowv(r, i, 8), "dead_at", rowv(r, i, 9), "error",
                         jtext(err, el), "holds_back", jint(rowv(r, i, 11)));
}

static unsigned
get_dead(kinbox__console_data_t *d, const kinbox__http_req_t *req, char **json)
{
        const char *st = arg(req, "status");
        if (st && strcmp(st, "dead") && strcmp(st, "replayed") &&
            strcmp(st, "discarded") && strcmp(st, "any"))
                return bad("status must be dead, replayed, discarded or any",
                           json);
        long limit = arg(req, "limit") ? atol(arg(req, "limit")) : 50;
        if (limit < 1 || limit > PAGE_MAX)
                limit = PAGE_MAX;
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = dead_page(
            d, arg(req, "consumer"), st && !strcmp(st, "any") ? NULL : st,
            arg(req, "topic"), arg_id(arg(req, "before")), limit + 1, &r);
        if (rc)
                return fail(d, rc, json);
        size_t n = kinbox_rows_count(r);
        json_t *a = json_array();
        for (size_t i = 0; i < n && i < (size_t)limit; i++)
                json_array_append_new(a, dead_row(r, i));
        json_t *next = n > (size_t)limit ? jint(rowv(r, (size_t)limit - 1, 0))
                                         : json_null();
        kinbox_rows_destroy(r);
        return done(json_pack("{s:o,s:o}", "rows", a, "next_before", next),
                    json);
}

/* Bytes for people: text (UTF-8, at most TEXT_CAP bytes), pretty JSON
 * when the whole of it parses, hex of the first HEX_CAP bytes. */
static json_t *
bytes_json(const char *v, size_t n)
{
        if (!v)
                return json_null();
        size_t tn = n < TEXT_CAP ? n : TEXT_CAP;
        while (tn < n && tn && ((unsigned char)v[tn] & 0xC0) == 0x80)
                tn--; /* not inside a character */
        json_t *text = json_stringn(v, tn);
        json_t *pretty = json_null();
        json_t *parsed = n <= TEXT_CAP && text
                             ? json_loadb(v, n, JSON_DECODE_ANY, NULL)
                             : NULL;
        if (parsed) {
                char *p = json_dumps(parsed, JSON_INDENT(2) | JSON_ENCODE_ANY);
                json_decref(pretty);
                pretty = p ? json_string(p) : json_null();
                free(p);
                json_decref(parsed);
        }
        size_t hn = n < HEX_CAP ? n : HEX_CAP;
        char *hex = kinbox__calloc(1, hn * 2 + 1);
        for (size_t i = 0; hex && i < hn; i++)
                snprintf(hex + 2 * i, 3, "%02x", (unsigned char)v[i]);
        json_t *j = json_pack(
            "{s:I,s:s,s:o,s:o,s:s?,s:b}", "size", (json_int_t)n, "kind",
            parsed ? "json"
            : text ? "text"
                   : "binary",
            "text", text ? text : json_null(), "json", pretty, "hex", hex,
            "truncated", n > tn || (!text && n > hn));
        free(hex);
        return j;
}

/* Stored headers as [{name, value}] (value: bytes_json()). */
static json_t *
headers_json(const char *v, size_t n)
{
        json_t *a = json_array();
        kinbox__hdrs_t h = {0};
        char why[200];
        if (v && !kinbox__hdrcodec_decode(v, n, &h, why, sizeof(why)))
                for (size_t i = 0; i < h.n && i < 256; i++)
                        json_array_append_new(
                            a,
                            json_pack("{s:o,s:o}", "name",
                                      jtext(h.v[i].name, strlen(h.v[i].name)),
                                      "value",
                                      bytes_json(h.v[i].value, h.v[i].size)));
        kinbox__hdrs_free(&h);
        return a;
}

static unsigned
get_dead_one(kinbox__console_data_t *d, int64_t id, char **json)
{
        kinbox_dead_letter_t *dl = NULL;
        kinbox_err_t rc = kinbox_dead_show(d->adm, id, &dl);
        if (rc)
                return fail(d, rc, json);
        json_t *j = json_pack(
            "{s:I,s:s?,s:o,s:s?,s:i,s:I,s:o,s:o,s:o,s:o,s:i,s:s?,s:s?,s:s?}",
            "id", (json_int_t)dl->id, "consumer", dl->consumer, "message_id",
            bytes_json(dl->message_id, dl->message_id_len), "topic", dl->topic,
            "partition", (int)dl->partition, "offset", (json_int_t)dl->offset,
            "key", bytes_json(dl->key, dl->key_len), "headers",
            headers_json(dl->headers, dl->headers_len), "payload",
            bytes_json(dl->payload, dl->payload_len), "error",
            jtext(dl->error, dl->error ? strlen(dl->error) : 0), "attempts",
            dl->attempts, "first_failed_at", dl->first_failed_at, "dead_at",
            dl->dead_at, "status", dl->status);
        kinbox_dead_letter_destroy(dl);
        return done(j, json);
}

static unsigned
get_parked(kinbox__console_data_t *d, const kinbox__http_req_t *req,
           char **json)
{
        kinbox_parked_list_t *l = NULL;
        kinbox_err_t rc =
            kinbox_dead_parked(d->adm, arg(req, "consumer"), 200, &l);
        if (rc)
                return fail(d, rc, json);
        json_t *a = json_array();
        for (size_t i = 0; i < l->count; i++) {
                const kinbox_parked_t *p = &l->parked[i];
                json_array_append_new(
                    a,
                    json_pack(
                        "{s:I,s:s,s:s,s:i,s:I,s:o,s:o,s:o,s:s?}", "id",
                        (json_int_t)p->id, "consumer", p->consumer, "topic",
                        p->topic, "partition", (int)p->partition, "offset",
                        (json_int_t)p->offset, "message_id",
                        bytes_json(p->message_id, p->message_id_len), "key",
                        bytes_json(p->key, p->key_len), "blocker",
                        p->blocker_id ? json_integer((json_int_t)p->blocker_id)
                                      : json_null(),
                        "parked_at", p->parked_at));
        }
        kinbox_parked_list_destroy(l);
        return done(json_pack("{s:o}", "rows", a), json);
}

static int
outbox_row(const kinbox_outbox_row_t *x, void *opaque)
{
        static const char *const st[] = {"any", "pending", "sent", "dead",
                                         "canceled"};
        json_array_append_new(
            opaque,
            json_pack("{s:I,s:s,s:s,s:o,s:s?,s:i,s:s?,s:s?,s:s?,s:I}", "id",
                      (json_int_t)x->id, "status",
                      x->status <= KINBOX_OUTBOX_CANCELED ? st[x->status]
                                                          : "?",
                      "destination", x->destination, "idem_key",
                      jtext(x->idem_key, strlen(x->idem_key)), "aggregate_id",
                      x->aggregate_id, "attempts", x->attempts, "last_error",
                      x->last_error, "created_at", x->created_at,
                      "next_attempt_at", x->next_attempt_at, "payload_size",
                      (json_int_t)x->payload_size));
        return 0;
}

static unsigned
get_outbox_rows(kinbox__console_data_t *d, const kinbox__http_req_t *req,
                char **json)
{
        static const char *const st[] = {"any", "pending", "sent", "dead",
                                         "canceled"};
        const char *s = arg(req, "status");
        int k = 0;
        while (s && k < 5 && strcmp(st[k], s))
                k++;
        if (k == 5)
                return bad("status must be any, pending, sent, dead or "
                           "canceled",
                           json);
        json_t *a = json_array();
        kinbox_err_t rc = kinbox_outbox_list(
            d->adm, (kinbox_outbox_status_t)k, arg(req, "destination"),
            arg_id(arg(req, "after")), PAGE_MAX, outbox_row, a);
        if (rc) {
                json_decref(a);
                return fail(d, rc, json);
        }
        return done(json_pack("{s:o}", "rows", a), json);
}

unsigned
kinbox__console_get(kinbox__console_data_t *d, const kinbox__http_req_t *req,
                    const char *path, char **json)
{
        *json = NULL;
        session_limit(d);
        if (!strcmp(path, "overview"))
                return get_overview(d, json);
        if (!strcmp(path, "dead"))
                return get_dead(d, req, json);
        if (!strncmp(path, "dead/", 5) && arg_id(path + 5))
                return get_dead_one(d, arg_id(path + 5), json);
        if (!strcmp(path, "parked"))
                return get_parked(d, req, json);
        if (!strcmp(path, "outbox"))
                return get_outbox_rows(d, req, json);
        *json = kinbox__strdup("{\"error\":\"no such endpoint\"}");
        return 404;
}

/* ------------------------------------------------------------------ */
/* POST: the actions */

/* Replay dead letter id with its consumer's handler, as `kinbox dead
 * replay`; *released: the parked messages it held back. */
static kinbox_err_t
replay_one(kinbox__console_data_t *d, int64_t id, int64_t *released)
{
        kinbox_dead_letter_t *dl = NULL;
        kinbox_err_t rc = kinbox_dead_show(d->adm, id, &dl);
        if (rc)
                return rc;
        char consumer[256], err[1024] = "";
        snprintf(consumer, sizeof(consumer), "%s",
                 dl->consumer ? dl->consumer : "");
        kinbox_dead_letter_destroy(dl);
        const kinbox_conf_t *conf = NULL;
        const kinbox_module_t *m =
            d->handler
                ? d->handler(consumer, &conf, err, sizeof(err), d->opaque)
                : NULL;
        void *op = NULL;
        if (!m || (m->init && m->init(conf, &op, err, sizeof(err)))) {
                kinbox__errstr(d->adm->errstr, sizeof(d->adm->errstr),
                               "consumer %s's handler: %s", consumer,
                               err[0] ? err : "not available in this process");
                return KINBOX_ERR_INVALID;
        }
        kinbox_dead_follower_t last;
        *released = -1;
        (void)kinbox_dead_followers(d->adm, id, released, &last);
        kinbox_result_t res = KINBOX_RESULT_OK;
        rc = kinbox_dead_replay(d->adm, id, m->handle_batch ? NULL : m->handle,
                                m->handle_batch, op, &res);
        if (m->fini)
                m->fini(op);
        return rc;
}

static kinbox_err_t
discard_one(kinbox__console_data_t *d, int64_t id, int64_t *released)
{
        kinbox_dead_follower_t last;
        *released = -1;
        (void)kinbox_dead_followers(d->adm, id, released, &last);
        return kinbox_dead_discard(d->adm, id);
}

static unsigned
post_dead_one(kinbox__console_data_t *d, int64_t id, bool replay, char **json)
{
        int64_t rel = 0;
        kinbox_err_t rc =
            replay ? replay_one(d, id, &rel) : discard_one(d, id, &rel);
        if (rc)
                return fail(d, rc, json);
        return done(json_pack("{s:I,s:s,s:I}", "id", (json_int_t)id, "status",
                              replay ? "replayed" : "discarded", "released",
                              (json_int_t)(rel > 0 ? rel : 0)),
                    json);
}

/* A bounded selection: the oldest `max` (1..100, required) dead letters
 * of the filter (consumer, topic), each replayed or discarded. */
static unsigned
post_dead_select(kinbox__console_data_t *d, const kinbox__http_req_t *req,
                 bool replay, char **json)
{
        long max = arg(req, "max") ? atol(arg(req, "max")) : 0;
        if (max < 1 || max > SELECT_MAX)
                return bad("max (1 to 100) is required: how many dead "
                           "letters of the selection to act on",
                           json);
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = dead_page(d, arg(req, "consumer"), "dead",
                                    arg(req, "topic"), 0, SELECT_MAX, &r);
        if (rc)
                return fail(d, rc, json);
        size_t n = kinbox_rows_count(r), from = n > (size_t)max ? n - max : 0;
        json_t *a = json_array();
        int ok = 0;
        for (size_t i = n; i-- > from;) { /* oldest first */
                int64_t id = strtoll(rowv(r, i, 0), NULL, 10), rel = 0;
                rc = replay ? replay_one(d, id, &rel)
                            : discard_one(d, id, &rel);
                ok += !rc;
                json_array_append_new(
                    a, json_pack("{s:I,s:b,s:s}", "id", (json_int_t)id, "ok",
                                 !rc, "result",
                                 rc       ? kinbox_admin_errstr(d->adm)
                                 : replay ? "replayed"
                                          : "discarded"));
        }
        kinbox_rows_destroy(r);
        return done(json_pack("{s:o,s:i}", "results", a, "done", ok), json);
}

static unsigned
post_outbox(kinbox__console_data_t *d, const kinbox__http_req_t *req,
            const char *path, char *what, size_t wsz, char **json)
{
        const char *dst = arg(req, "destination");
        bool pause = !strcmp(path, "pause");
        if (pause || !strcmp(path, "resume")) {
                if (!dst)
                        return bad("destination is required", json);
                snprintf(what, wsz, "outbox %s %.200s", path, dst);
                int was = 0;
                kinbox_err_t rc =
                    kinbox_admin_outbox_pause(d->adm, dst, pause, &was);
                if (rc)
                        return fail(d, rc, json);
                return done(json_pack("{s:s,s:b,s:b}", "destination", dst,
                                      "paused", pause, "was_paused", was),
                            json);
        }
        int64_t id = lead_id(path);
        const char *slash = strchr(path, '/');
        if (!id || !slash ||
            (strcmp(slash, "/requeue") && strcmp(slash, "/cancel")))
                return bad("no such outbox action", json);
        bool requeue = !strcmp(slash, "/requeue");
        snprintf(what, wsz, "outbox %s %" PRId64, slash + 1, id);
        kinbox_err_t rc = requeue ? kinbox_outbox_requeue(d->adm, id)
                                  : kinbox_outbox_cancel(d->adm, id);
        if (rc)
                return fail(d, rc, json);
        return done(json_pack("{s:I,s:s}", "id", (json_int_t)id, "status",
                              requeue ? "pending" : "canceled"),
                    json);
}

unsigned
kinbox__console_post(kinbox__console_data_t *d, const kinbox__http_req_t *req,
                     const char *path, char **json, char *what, size_t wsz)
{
        *json = NULL;
        d->overview_ms = 0; /* the next overview is fresh */
        session_limit(d);
        if (!strncmp(path, "outbox/", 7))
                return post_outbox(d, req, path + 7, what, wsz, json);
        if (!strcmp(path, "dead/replay") || !strcmp(path, "dead/discard")) {
                bool replay = !strcmp(path, "dead/replay");
                snprintf(what, wsz,
                         "dead %s selection consumer=%.60s topic=%.60s "
                         "max=%.8s",
                         replay ? "replay" : "discard",
                         arg(req, "consumer") ? arg(req, "consumer") : "*",
                         arg(req, "topic") ? arg(req, "topic") : "*",
                         arg(req, "max") ? arg(req, "max") : "-");
                return post_dead_select(d, req, replay, json);
        }
        int64_t id = !strncmp(path, "dead/", 5) ? lead_id(path + 5) : 0;
        const char *slash = id ? strchr(path + 5, '/') : NULL;
        if (slash &&
            (!strcmp(slash, "/replay") || !strcmp(slash, "/discard"))) {
                snprintf(what, wsz, "dead %s %" PRId64, slash + 1, id);
                return post_dead_one(d, id, !strcmp(slash, "/replay"), json);
        }
        *json = kinbox__strdup("{\"error\":\"no such action\"}");
        return 404;
}
