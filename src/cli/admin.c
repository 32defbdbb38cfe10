/*
 * admin.c -- `kinbox status | dead | outbox | verify | prune`, and the
 * operations side of `kinbox run`: the start-up retention check, the
 * pruner thread and the metrics / health endpoint.
 *
 * Output is a human table by default and JSON with --json (one document on
 * stdout). Exit status: see admin.h (also printed by `kinbox help`).
 */
#include "admin.h"
#include "schema.h"
#include "confval.h"
#include "hdrcodec.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* options */

typedef struct opts {
        const char *cmd; /* "status", "dead", ... for messages */
        const char *config;
        bool json;
        bool dry_run;
        bool wait; /* dead replay/discard: until released */
        const char *consumer;
        const char *status;
        const char *destination;
        const char *older_than;
        long limit;
        int64_t after;
        char *args[4];
        int nargs;
} opts_t;

static int
parse_opts(int argc, char **argv, opts_t *o, const char *allowed)
{
        static const struct option lo[] = {
            {"config", required_argument, NULL, 'c'},
            {"json", no_argument, NULL, 'j'},
            {"dry-run", no_argument, NULL, 'n'},
            {"wait", no_argument, NULL, 'w'},
            {"consumer", required_argument, NULL, 'C'},
            {"status", required_argument, NULL, 's'},
            {"destination", required_argument, NULL, 'd'},
            {"older-than", required_argument, NULL, 'o'},
            {"limit", required_argument, NULL, 'l'},
            {"after", required_argument, NULL, 'a'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0}};
        o->limit = 100;
        optind = 1;
        opterr = 0;
        int ch;
        while ((ch = getopt_long(argc, argv, "c:h", lo, NULL)) != -1) {
                if (ch == 'h') {
                        kb_admin_usage(o->cmd, stdout);
                        exit(KB_EX_OK);
                }
                if (ch == '?' || ch == ':' ||
                    (ch != 'c' && !strchr(allowed, ch))) {
                        const char *bad = argv[optind - 1];
                        fprintf(stderr,
                                "kinbox %s: unknown or misplaced "
                                "option \"%s\"\n\n",
                                o->cmd, bad);
                        kb_admin_usage(o->cmd, stderr);
                        return -1;
                }
                char *end;
                switch (ch) {
                case 'c':
                        o->config = optarg;
                        break;
                case 'j':
                        o->json = true;
                        break;
                case 'n':
                        o->dry_run = true;
                        break;
                case 'w':
                        o->wait = true;
                        break;
                case 'C':
                        o->consumer = optarg;
                        break;
                case 's':
                        o->status = optarg;
                        break;
                case 'd':
                        o->destination = optarg;
                        break;
                case 'o':
                        o->older_than = optarg;
                        break;
                case 'l':
                        o->limit = strtol(optarg, &end, 10);
                        if (*end || o->limit <= 0) {
                                fprintf(stderr,
                                        "kinbox %s: --limit \"%s\": expected "
                                        "a positive number\n",
                                        o->cmd, optarg);
                                return -1;
                        }
                        break;
                case 'a':
                        o->after = strtoll(optarg, &end, 10);
                        if (*end || o->after < 0) {
                                fprintf(stderr,
                                        "kinbox %s: --after \"%s\": expected "
                                        "an id\n",
                                        o->cmd, optarg);
                                return -1;
                        }
                        break;
                }
                /* getopt permutes: positional arguments are collected
                 * after the loop. */
        }
        for (int i = optind; i < argc; i++) {
                if (o->nargs == 4) {
                        fprintf(stderr, "kinbox %s: too many arguments\n",
                                o->cmd);
                        return -1;
                }
                o->args[o->nargs++] = argv[i];
        }
        if (!o->config) {
                fprintf(stderr, "kinbox %s: -c FILE is required\n", o->cmd);
                return -1;
        }
        return 0;
}

static int
parse_id(const opts_t *o, const char *s, int64_t *id)
{
        char *end;
        long long v = s ? strtoll(s, &end, 10) : 0;
        if (!s || *end || v <= 0) {
                fprintf(stderr, "kinbox %s: \"%s\" is not an id\n", o->cmd,
                        s ? s : "");
                return -1;
        }
        *id = v;
        return 0;
}

/* 5m, 30s, 2h, 1d, 500ms; bare numbers are seconds. */
static int
parse_duration_ms(const char *s, int64_t *ms)
{
        return kinbox__confval_duration("duration", s, 0, INT64_MAX, ms, NULL,
                                        0);
}

int
kb_duration_ms(const char *s, int64_t *ms)
{
        return parse_duration_ms(s, ms);
}

/* ------------------------------------------------------------------ */
/* output */

/* A simple column-aligned table. */
typedef struct table {
        int ncols;
        char **cells; /* row-major, malloc'ed */
        size_t n, cap;
} table_t;

static void
tbl_init(table_t *t, int ncols, ...)
{
        memset(t, 0, sizeof(*t));
        t->ncols = ncols;
        va_list ap;
        va_start(ap, ncols);
        for (int i = 0; i < ncols; i++) {
                const char *h = va_arg(ap, const char *);
                if (t->n == t->cap) {
                        t->cap = t->cap ? t->cap * 2 : 64;
                        t->cells = realloc(t->cells, t->cap * sizeof(char *));
                        if (!t->cells)
                                abort();
                }
                t->cells[t->n++] = strdup(h);
        }
        va_end(ap);
}

static void tbl_add(table_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
tbl_add(table_t *t, const char *fmt, ...)
{
        char b[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b, sizeof(b), fmt, ap);
        va_end(ap);
        if (t->n == t->cap) {
                t->cap = t->cap ? t->cap * 2 : 64;
                t->cells = realloc(t->cells, t->cap * sizeof(char *));
                if (!t->cells)
                        abort();
        }
        t->cells[t->n++] = strdup(b);
}

/* Print (fp NULL: only free) and free. */
static void
tbl_print(table_t *t, FILE *fp)
{
        int w[32] = {0};
        if (!fp)
                t->ncols = t->ncols ? t->ncols : 1;
        for (size_t i = 0; i < t->n; i++) {
                int c = (int)(i % (size_t)t->ncols);
                int l = (int)strlen(t->cells[i]);
                if (l > w[c])
                        w[c] = l;
        }
        for (size_t i = 0; i < t->n; i++) {
                int c = (int)(i % (size_t)t->ncols);
                bool last = c == t->ncols - 1;
                if (!fp)
                        continue;
                if (last)
                        fprintf(fp, "%s\n", t->cells[i]);
                else
                        fprintf(fp, "%-*s  ", w[c], t->cells[i]);
        }
        for (size_t i = 0; i < t->n; i++)
                free(t->cells[i]);
        free(t->cells);
        memset(t, 0, sizeof(*t));
}

/* Bytes as text when printable UTF-8-ish, else with \xNN escapes. */
static char *
escape_bytes(const char *p, size_t n)
{
        char *o = malloc(n * 4 + 1), *q = o;
        if (!o)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)p[i];
                if (c == '\\') {
                        *q++ = '\\';
                        *q++ = '\\';
                } else if (c >= 0x20 && c != 0x7f) {
                        *q++ = (char)c;
                } else {
                        snprintf(q, 5, "\\x%02x", c);
                        q += 4;
                }
        }
        *q = '\0';
        return o;
}

static void
json_out(json_t *j)
{
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (s) {
                puts(s);
                free(s);
        }
        json_decref(j);
}

/* A listing: the JSON array (--json) or the table; frees both. */
static void
rows_out(bool json, table_t *t, json_t *ja)
{
        tbl_print(t, json ? NULL : stdout);
        if (json)
                json_out(ja);
        else
                json_decref(ja);
}

/* A value as JSON: integer when it looks like one, else string. */
static json_t *
jval(const char *v)
{
        if (!v)
                return json_null();
        char *end;
        long long n = strtoll(v, &end, 10);
        if (*v && !*end && end != v)
                return json_integer(n);
        return json_string(v);
}

/* ------------------------------------------------------------------ */
/* common: config + database */

typedef struct ctx {
        opts_t o;
        kb_config_t cfg;
        bool loaded;
        kinbox_admin_t *adm;
} ctx_t;

static int
ctx_open(ctx_t *x)
{
        char err[2048];
        if (kb_config_load(x->o.config, &x->cfg, err, sizeof(err))) {
                fprintf(stderr, "kinbox %s: %s\n", x->o.cmd, err);
                return KB_EX_USAGE;
        }
        x->loaded = true;
        x->adm = kinbox_admin_new(x->cfg.base, err, sizeof(err));
        if (!x->adm) {
                fprintf(stderr, "kinbox %s: %s\n", x->o.cmd, err);
                return KB_EX_USAGE;
        }
        /* Reachability up front: one clear error instead of several. */
        if (kinbox_admin_ping(x->adm)) {
                fprintf(stderr, "kinbox %s: database unreachable: %s\n",
                        x->o.cmd, kinbox_admin_errstr(x->adm));
                return KB_EX_DB;
        }
        /* A schema this binary does not know (older or newer) is refused
         * before any command reads or changes it. */
        return kb_schema_check_config(&x->cfg, x->o.cmd);
}

static void
ctx_close(ctx_t *x)
{
        kinbox_admin_destroy(x->adm);
        if (x->loaded)
                kb_config_free(&x->cfg);
}

static int
db_fail(ctx_t *x, kinbox_err_t rc)
{
        fprintf(stderr, "kinbox %s: %s\n", x->o.cmd,
                kinbox_admin_errstr(x->adm));
        return rc == KINBOX_ERR_DB_CONN ? KB_EX_DB : KB_EX_RUNTIME;
}

static const char *
rv(kinbox_rows_t *r, size_t i, int c)
{
        return kinbox_rows_value(r, i, c, NULL);
}

static const char *
group_of(kinbox_conf_t *conf)
{
        const char *g = kinbox_conf_get(conf, "group.id");
        return g ? g : kinbox_conf_get(conf, "name");
}

/* A librdkafka consumer handle of the group (nothing joins, nothing is
 * committed: it only reads committed offsets and watermarks). */
/* A client in the consumer's group (never joining it) with all of its
 * kafka.* settings, logging through its logger. */
static kinbox_kafka_t *
group_handle(kinbox_conf_t *conf, char *err, size_t sz)
{
        const char *const extra[] = {"group.id", group_of(conf),
                                     "enable.auto.commit", "false",
                                     "log_level", "0", NULL};
        return kinbox_kafka_new(conf, extra, err, sz);
}

/* Per partition of a consumer's topics: committed offset and high
 * watermark from the broker. Returns NULL (err set) when the broker does
 * not answer. */
static rd_kafka_topic_partition_list_t *
broker_offsets(kinbox_conf_t *conf, int64_t **highs, char *err, size_t sz)
{
        kinbox_kafka_t *kk = group_handle(conf, err, sz);
        if (!kk)
                return NULL;
        rd_kafka_t *rk = kinbox_kafka_handle(kk);
        const char *topics = kinbox_conf_get(conf, "topics");
        char list[1024];
        snprintf(list, sizeof(list), "%s", topics ? topics : "");
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(16);
        for (char *save = NULL, *t = strtok_r(list, ", ", &save); t;
             t = strtok_r(NULL, ", ", &save)) {
                rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t, NULL);
                const struct rd_kafka_metadata *md = NULL;
                rd_kafka_resp_err_t e =
                    rd_kafka_metadata(rk, 0, rkt, &md, 5000);
                rd_kafka_topic_destroy(rkt);
                if (e) {
                        snprintf(err, sz, "broker metadata for %s: %s", t,
                                 rd_kafka_err2str(e));
                        rd_kafka_topic_partition_list_destroy(l);
                        kinbox_kafka_destroy(kk);
                        return NULL;
                }
                for (int i = 0; i < md->topic_cnt; i++)
                        for (int p = 0; p < md->topics[i].partition_cnt; p++)
                                rd_kafka_topic_partition_list_add(
                                    l, t, md->topics[i].partitions[p].id);
                rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_partition_list_sort(l, NULL, NULL);
        rd_kafka_resp_err_t e = rd_kafka_committed(rk, l, 5000);
        if (e) {
                snprintf(err, sz, "committed offsets: %s",
                         rd_kafka_err2str(e));
                rd_kafka_topic_partition_list_destroy(l);
                kinbox_kafka_destroy(kk);
                return NULL;
        }
        *highs = calloc((size_t)l->cnt + 1, sizeof(int64_t));
        for (int i = 0; i < l->cnt && *highs; i++) {
                int64_t lo = 0, hi = 0;
                if (rd_kafka_query_watermark_offsets(rk, l->elems[i].topic,
                                                     l->elems[i].partition,
                                                     &lo, &hi, 5000))
                        hi = -1;
                (*highs)[i] = hi;
        }
        kinbox_kafka_destroy(kk);
        return l;
}

/* ------------------------------------------------------------------ */
/* status */

/* /metrics of a `kinbox run` listening on [metrics] listen on this host
 * (IPv4), or NULL. One second at most. */
static char *
local_metrics(const char *listen)
{
        char host[64];
        const char *colon = listen ? strrchr(listen, ':') : NULL;
        if (!colon || (size_t)(colon - listen) >= sizeof(host))
                return NULL;
        memcpy(host, listen, (size_t)(colon - listen));
        host[colon - listen] = '\0';
        long port = strtol(colon + 1, NULL, 10);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port)};
        if (port <= 0 || port > 65535 ||
            inet_pton(AF_INET, host[0] ? host : "127.0.0.1", &a.sin_addr) != 1)
                return NULL;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
                return NULL;
        struct timeval tv = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
            write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
                close(fd);
                return NULL;
        }
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap);
        for (ssize_t r; buf && (r = read(fd, buf + n, cap - n - 1)) > 0;) {
                n += (size_t)r;
                if (n + 1 == cap) {
                        char *nb = realloc(buf, cap *= 2);
                        if (!nb) {
                                free(buf);
                                buf = NULL;
                        }
                        buf = nb;
                }
        }
        close(fd);
        if (buf)
                buf[n] = '\0';
        return buf;
}

/* A consumer's counter of messages with result in a /metrics text, -1
 * when absent. */
static long long
dedup_hits(const char *text, const char *consumer, const char *result)
{
        char series[400];
        snprintf(series, sizeof(series),
                 "\nkinbox_consumer_messages_total{consumer=\"%s\","
                 "result=\"%s\"} ",
                 consumer, result);
        const char *p = text ? strstr(text, series) : NULL;
        return p ? strtoll(p + strlen(series), NULL, 10) : -1;
}

/* Committed offsets, high watermarks and lag of a consumer's group, into
 * jo ("partitions", "lag" or "lag_error"); the lag as text in lagbuf. */
static void
status_lag(ctx_t *x, kinbox_conf_t *conf, const char *name, json_t *jo,
           char *lagbuf, size_t lsz)
{
        char err[512] = "";
        int64_t *highs = NULL;
        rd_kafka_topic_partition_list_t *l =
            broker_offsets(conf, &highs, err, sizeof(err));
        json_t *parts = json_array();
        long long lag = 0;
        for (int k = 0; l && k < l->cnt; k++) {
                int64_t c = l->elems[k].offset < 0 ? 0 : l->elems[k].offset;
                int64_t pl = highs[k] >= 0 && highs[k] > c ? highs[k] - c : 0;
                lag += pl;
                json_array_append_new(
                    parts,
                    json_pack("{s:s,s:i,s:I,s:I,s:I}", "topic",
                              l->elems[k].topic, "partition",
                              (int)l->elems[k].partition, "committed",
                              (json_int_t)l->elems[k].offset, "high",
                              (json_int_t)highs[k], "lag", (json_int_t)pl));
        }
        json_object_set_new(jo, "partitions", parts);
        if (l) {
                snprintf(lagbuf, lsz, "%lld", lag);
                json_object_set_new(jo, "lag", json_integer(lag));
                rd_kafka_topic_partition_list_destroy(l);
        } else {
                snprintf(lagbuf, lsz, "unknown");
                json_object_set_new(jo, "lag_error", json_string(err));
                if (!x->o.json)
                        fprintf(stderr, "kinbox status: %s: lag unknown: %s\n",
                                name, err);
        }
        free(highs);
}

/* One consumer's line of `kinbox status`. */
static kinbox_err_t
status_consumer(ctx_t *x, int i, const char *live, json_t *jc, table_t *tc)
{
        kinbox_conf_t *conf = x->cfg.consumers[i].conf;
        const char *name = x->cfg.consumers[i].name;
        kinbox_consumer_status_t st;
        kinbox_err_t rc = kinbox_admin_consumer_status(x->adm, name, &st);
        if (rc)
                return rc;
        long long inbox = st.inbox_rows;
        long long dl[3] = {st.dead, st.replayed, st.discarded};
        long long parked = st.parked;
        long long held = st.held_keys;
        const char *oldest = st.oldest_parked_at;
        json_t *jo = json_pack(
            "{s:s,s:s,s:I,s:I,s:I,s:I,s:s}", "consumer", name, "group",
            group_of(conf), "inbox_rows", (json_int_t)inbox, "dead_letters",
            (json_int_t)dl[0], "replayed", (json_int_t)dl[1], "discarded",
            (json_int_t)dl[2], "dedup_hits_note",
            "duplicates are not stored: counted by the running process "
            "since its start (kinbox_consumer_messages_total{result="
            "\"duplicate\"} and {result=\"business_duplicate\"} on "
            "/metrics)");
        json_object_set_new(jo, "parked", json_integer(parked));
        json_object_set_new(jo, "held_keys", json_integer(held));
        json_object_set_new(jo, "oldest_parked_at",
                            parked ? json_string(oldest) : json_null());
        char lagbuf[64];
        status_lag(x, conf, name, jo, lagbuf, sizeof(lagbuf));
        long long hits = dedup_hits(live, name, "duplicate");
        long long biz = dedup_hits(live, name, "business_duplicate");
        json_object_set_new(jo, "dedup_hits",
                            hits >= 0 ? json_integer(hits) : json_null());
        json_object_set_new(jo, "business_duplicates",
                            biz >= 0 ? json_integer(biz) : json_null());
        json_array_append_new(jc, jo);
        tbl_add(tc, "%s", name);
        tbl_add(tc, "%s", group_of(conf));
        tbl_add(tc, "%s", lagbuf);
        tbl_add(tc, "%lld", inbox);
        for (int k = 0; k < 2; k++) {
                long long n = k ? biz : hits;
                if (n >= 0)
                        tbl_add(tc, "%lld", n);
                else
                        tbl_add(tc, "n/a");
        }
        tbl_add(tc, "%lld", dl[0]);
        tbl_add(tc, "%lld", dl[1]);
        tbl_add(tc, "%lld", dl[2]);
        tbl_add(tc, "%lld", parked);
        tbl_add(tc, "%lld", held);
        tbl_add(tc, "%s", oldest);
        return KINBOX_OK;
}

/* The outbox part of `kinbox status`; *inbox_total the inbox's size. */
static kinbox_err_t
status_outbox(ctx_t *x, json_t *jd, table_t *td, long long *inbox_total)
{
        kinbox_rows_t *r = NULL;
        int64_t total = 0;
        kinbox_err_t rc = kinbox_admin_outbox_summary(x->adm, &r);
        if (!rc)
                rc = kinbox_admin_inbox_rows(x->adm, &total);
        for (size_t i = 0; !rc && i < kinbox_rows_count(r); i++) {
                bool paused =
                    !strcmp(rv(r, i, 5), "t") || !strcmp(rv(r, i, 5), "1");
                json_array_append_new(
                    jd, json_pack("{s:s,s:o,s:o,s:o,s:o,s:b}", "destination",
                                  rv(r, i, 0), "pending", jval(rv(r, i, 1)),
                                  "oldest_pending_age_s", jval(rv(r, i, 2)),
                                  "dead", jval(rv(r, i, 3)), "sent_last_hour",
                                  jval(rv(r, i, 4)), "paused", paused));
                tbl_add(td, "%s", rv(r, i, 0));
                tbl_add(td, "%s", rv(r, i, 1));
                tbl_add(td, "%ss", rv(r, i, 2));
                tbl_add(td, "%s", rv(r, i, 3));
                tbl_add(td, "%s", rv(r, i, 4));
                tbl_add(td, "%s", paused ? "yes" : "no");
        }
        if (!rc)
                *inbox_total = total;
        kinbox_rows_destroy(r);
        return rc;
}

int
kb_cmd_status(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "status"}};
        char *live = NULL;
        if (parse_opts(argc, argv, &x.o, "j"))
                return KB_EX_USAGE;
        if (x.o.nargs) {
                fprintf(stderr, "kinbox status: unexpected argument \"%s\"\n",
                        x.o.args[0]);
                return KB_EX_USAGE;
        }
        int ex = ctx_open(&x);
        if (ex)
                goto out;
        json_t *jc = json_array(), *jd = json_array();
        table_t tc, td;
        tbl_init(&tc, 12, "CONSUMER", "GROUP", "LAG", "INBOX ROWS",
                 "DEDUP HITS", "BUSINESS DUPS", "DEAD", "REPLAYED",
                 "DISCARDED", "PARKED", "HELD KEYS", "OLDEST PARKED");
        tbl_init(&td, 6, "DESTINATION", "PENDING", "OLDEST PENDING", "DEAD",
                 "SENT 1H", "PAUSED");
        live = local_metrics(x.cfg.metrics_listen);
        kinbox_err_t rc = KINBOX_OK;
        for (int i = 0; i < x.cfg.nconsumers && !rc; i++)
                rc = status_consumer(&x, i, live, jc, &tc);
        long long inbox_total = 0;
        if (!rc)
                rc = status_outbox(&x, jd, &td, &inbox_total);
        if (rc) {
                json_decref(jc);
                json_decref(jd);
                tbl_print(&tc, NULL);
                tbl_print(&td, NULL);
                ex = db_fail(&x, rc);
                goto out;
        }
        if (x.o.json) {
                json_out(json_pack("{s:o,s:o,s:I}", "consumers", jc, "outbox",
                                   jd, "inbox_rows", (json_int_t)inbox_total));
                tbl_print(&tc, NULL);
                tbl_print(&td, NULL);
        } else {
                json_decref(jc);
                json_decref(jd);
                printf("Consumers (dedup hits and business duplicates: "
                       "counted by the local `kinbox run` since its start, "
                       "from [metrics] listen; n/a when not reachable)\n");
                tbl_print(&tc, stdout);
                printf("\nOutbox\n");
                tbl_print(&td, stdout);
                printf("\nInbox size: %lld rows\n", inbox_total);
        }
out:
        free(live);
        ctx_close(&x);
        return ex;
}

/* ------------------------------------------------------------------ */
/* dead */

static const char *
consumer_section(ctx_t *x, const char *name, kinbox_conf_t **conf)
{
        for (int i = 0; i < x->cfg.nconsumers; i++)
                if (!strcmp(x->cfg.consumers[i].name, name)) {
                        *conf = x->cfg.consumers[i].conf;
                        return x->cfg.consumers[i].name;
                }
        return NULL;
}

static int
dead_list(ctx_t *x)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_dead_list(x->adm, x->o.consumer, x->o.status,
                                           x->o.limit, &r);
        if (rc)
                return db_fail(x, rc);
        json_t *ja = json_array();
        table_t t;
        tbl_init(&t, 9, "ID", "CONSUMER", "TOPIC [PART] OFFSET", "MESSAGE ID",
                 "STATUS", "ATTEMPTS", "DEAD AT", "HOLDS BACK", "ERROR");
        for (size_t i = 0; i < kinbox_rows_count(r); i++) {
                size_t idl = 0;
                const char *idv = kinbox_rows_value(r, i, 5, &idl);
                char *mid = idv ? escape_bytes(idv, idl) : NULL;
                json_array_append_new(
                    ja,
                    json_pack("{s:o,s:s,s:s,s:o,s:o,s:o,s:s,s:o,s:s,s:s}",
                              "id", jval(rv(r, i, 0)), "consumer", rv(r, i, 1),
                              "topic", rv(r, i, 2), "partition",
                              jval(rv(r, i, 3)), "offset", jval(rv(r, i, 4)),
                              "message_id",
                              mid ? json_string(mid) : json_null(), "status",
                              rv(r, i, 6), "attempts", jval(rv(r, i, 7)),
                              "dead_at", rv(r, i, 8), "error", rv(r, i, 9)));
                json_object_set_new(json_array_get(ja, i), "holds_back",
                                    jval(rv(r, i, 10)));
                char err[61];
                snprintf(err, sizeof(err), "%s", rv(r, i, 9));
                tbl_add(&t, "%s", rv(r, i, 0));
                tbl_add(&t, "%s", rv(r, i, 1));
                tbl_add(&t, "%s [%s] %s", rv(r, i, 2), rv(r, i, 3),
                        rv(r, i, 4));
                tbl_add(&t, "%s", mid ? mid : "(none)");
                tbl_add(&t, "%s", rv(r, i, 6));
                tbl_add(&t, "%s", rv(r, i, 7));
                tbl_add(&t, "%s", rv(r, i, 8));
                tbl_add(&t, "%s", rv(r, i, 10));
                tbl_add(&t, "%s", err);
                free(mid);
        }
        kinbox_rows_destroy(r);
        rows_out(x->o.json, &t, ja);
        return KB_EX_OK;
}

/* Stored headers for people: "name: value; ..." with \xNN for bytes that
 * are not printable UTF-8 (docs/operations.md, Stored headers); the raw
 * column when it does not decode. */
static char *
show_headers(const char *val, size_t n)
{
        kinbox__hdrs_t h;
        char why[200];
        char *e = NULL;
        if (!kinbox__hdrcodec_decode(val, n, &h, why, sizeof(why))) {
                e = kinbox__hdrcodec_display(&h, "; ");
        } else {
                char *raw = escape_bytes(val, n);
                size_t l = (raw ? strlen(raw) : 0) + strlen(why) + 8;
                if (raw && (e = malloc(l)))
                        snprintf(e, l, "%s (%s)", raw, why);
                free(raw);
        }
        kinbox__hdrs_free(&h);
        return e;
}

static int
dead_show(ctx_t *x, int64_t id)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_dead_show(x->adm, id, &r);
        if (rc == KINBOX_ERR_NOT_FOUND) {
                fprintf(stderr, "kinbox dead show: %s\n",
                        kinbox_admin_errstr(x->adm));
                return KB_EX_NOTFOUND;
        }
        if (rc)
                return db_fail(x, rc);
        static const char *const names[] = {
            "id",        "consumer", "message_id", "topic",
            "partition", "offset",   "key",        "headers",
            "payload",   "error",    "attempts",   "first_failed_at",
            "dead_at",   "status"};
        json_t *jo = json_object();
        for (int c = 0; c < 14; c++) {
                size_t n = 0;
                const char *val = kinbox_rows_value(r, 0, c, &n);
                char *e = c == 7 && val ? show_headers(val, n)
                          : val         ? escape_bytes(val, n)
                                        : NULL;
                if (x->o.json)
                        json_object_set_new(
                            jo, names[c],
                            c == 0 || c == 4 || c == 5 || c == 10 ? jval(val)
                            : e ? json_string(e)
                                : json_null());
                else
                        printf("%-16s %s\n", names[c], e ? e : "(null)");
                if ((c == 6 || c == 8) && x->o.json && val)
                        json_object_set_new(
                            jo, c == 6 ? "key_size" : "payload_size",
                            json_integer((json_int_t)n));
                free(e);
        }
        kinbox_rows_destroy(r);
        if (x->o.json)
                json_out(jo);
        else
                json_decref(jo);
        return KB_EX_OK;
}

/*
 * --wait: until the running consumer applied the followers up to the
 * parked row last (it is gone), or a new dead letter holds the key again
 * (printed), or 10 minutes. Returns an exit status.
 */
static int
wait_released(ctx_t *x, int64_t id, const kinbox_dead_follower_t *last)
{
        int64_t blocker = 0;
        kinbox_err_t rc = kinbox_dead_wait(x->adm, id, last, 600000, &blocker);
        if (rc == KINBOX_ERR_STATE) {
                fprintf(stderr,
                        "kinbox dead: a released message failed: dead "
                        "letter %" PRId64 " holds its key again\n",
                        blocker);
                return KB_EX_RUNTIME;
        }
        if (rc == KINBOX_ERR_TIMEOUT) {
                fprintf(stderr,
                        "kinbox dead: --wait: parked messages still waiting "
                        "after 10 minutes (is the consumer running?)\n");
                return KB_EX_RUNTIME;
        }
        if (rc)
                return db_fail(x, rc);
        if (!x->o.json)
                printf("released messages applied\n");
        return KB_EX_OK;
}

/* "; N parked message(s) ... released" after a replay or discard. */
static void
print_released(long long n)
{
        if (n > 0)
                printf("%lld parked message(s) of its key released: the "
                       "running consumer applies them in order\n",
                       n);
}

/* `kinbox dead parked`: messages held back behind a dead letter. */
static int
dead_parked(ctx_t *x)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_dead_parked(x->adm, x->o.consumer, x->o.limit,
                                             &r);
        if (rc)
                return db_fail(x, rc);
        json_t *ja = json_array();
        table_t t;
        tbl_init(&t, 7, "ID", "CONSUMER", "TOPIC [PART] OFFSET", "KEY",
                 "MESSAGE ID", "BLOCKER", "PARKED AT");
        for (size_t i = 0; i < kinbox_rows_count(r); i++) {
                size_t kl = 0, il = 0;
                const char *kv = kinbox_rows_value(r, i, 6, &kl);
                const char *iv = kinbox_rows_value(r, i, 5, &il);
                char *key = escape_bytes(kv ? kv : "", kv ? kl : 0);
                char *mid = escape_bytes(iv ? iv : "", iv ? il : 0);
                json_array_append_new(
                    ja,
                    json_pack("{s:o,s:s,s:s,s:o,s:o,s:s,s:s,s:o,s:s}", "id",
                              jval(rv(r, i, 0)), "consumer", rv(r, i, 1),
                              "topic", rv(r, i, 2), "partition",
                              jval(rv(r, i, 3)), "offset", jval(rv(r, i, 4)),
                              "message_id", mid ? mid : "", "key",
                              key ? key : "", "blocker", jval(rv(r, i, 7)),
                              "parked_at", rv(r, i, 8)));
                tbl_add(&t, "%s", rv(r, i, 0));
                tbl_add(&t, "%s", rv(r, i, 1));
                tbl_add(&t, "%s [%s] %s", rv(r, i, 2), rv(r, i, 3),
                        rv(r, i, 4));
                tbl_add(&t, "%s", key ? key : "");
                tbl_add(&t, "%s", mid ? mid : "");
                tbl_add(&t, "%s", rv(r, i, 7));
                tbl_add(&t, "%s", rv(r, i, 8));
                free(key);
                free(mid);
        }
        kinbox_rows_destroy(r);
        rows_out(x->o.json, &t, ja);
        return KB_EX_OK;
}

static int
dead_discard(ctx_t *x, int64_t id)
{
        /* Counted first: the running consumer starts releasing them. */
        int64_t rel = -1;
        kinbox_dead_follower_t last;
        (void)kinbox_dead_followers(x->adm, id, &rel, &last);
        kinbox_err_t rc = kinbox_dead_discard(x->adm, id);
        if (rc == KINBOX_ERR_NOT_FOUND || rc == KINBOX_ERR_STATE) {
                fprintf(stderr, "kinbox dead discard: %s\n",
                        kinbox_admin_errstr(x->adm));
                return rc == KINBOX_ERR_STATE ? KB_EX_RUNTIME
                                              : KB_EX_NOTFOUND;
        }
        if (rc)
                return db_fail(x, rc);
        if (x->o.json) {
                json_out(json_pack("{s:I,s:s,s:I}", "id", (json_int_t)id,
                                   "status", "discarded", "released",
                                   (json_int_t)(rel > 0 ? rel : 0)));
        } else {
                printf("dead letter %" PRId64 ": discarded\n", id);
                print_released(rel);
        }
        return x->o.wait && last.parked_id ? wait_released(x, id, &last)
                                           : KB_EX_OK;
}

static int
dead_replay(ctx_t *x, int64_t id)
{
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_dead_show(x->adm, id, &r);
        if (rc == KINBOX_ERR_NOT_FOUND) {
                fprintf(stderr, "kinbox dead replay: %s\n",
                        kinbox_admin_errstr(x->adm));
                return KB_EX_NOTFOUND;
        }
        if (rc)
                return db_fail(x, rc);
        char consumer[256];
        snprintf(consumer, sizeof(consumer), "%s", rv(r, 0, 1));
        kinbox_rows_destroy(r);
        kinbox_conf_t *conf = NULL;
        if (!consumer_section(x, consumer, &conf)) {
                fprintf(stderr,
                        "kinbox dead replay: dead letter %" PRId64
                        " belongs to consumer \"%s\", which %s does not "
                        "configure ([consumer.%s] names its handler)\n",
                        id, consumer, x->o.config, consumer);
                return KB_EX_USAGE;
        }
        char err[1024];
        const kinbox_module_t *m = find_module(conf, err, sizeof(err));
        if (!m) {
                fprintf(stderr, "kinbox dead replay: %s\n", err);
                return KB_EX_USAGE;
        }
        void *opaque = NULL;
        if (m->init && m->init(conf, &opaque, err, sizeof(err))) {
                fprintf(stderr, "kinbox dead replay: handler %s: %s\n",
                        m->name, err);
                return KB_EX_USAGE;
        }
        kinbox_result_t res = KINBOX_RESULT_OK;
        int64_t rel = -1;
        kinbox_dead_follower_t last;
        (void)kinbox_dead_followers(x->adm, id, &rel, &last);
        rc = kinbox_dead_replay(x->adm, id, m->handle_batch ? NULL : m->handle,
                                m->handle_batch, opaque, &res);
        if (m->fini)
                m->fini(opaque);
        if (rc) {
                fprintf(stderr, "kinbox dead replay: %s\n",
                        kinbox_admin_errstr(x->adm));
                return rc == KINBOX_ERR_NOT_FOUND ? KB_EX_NOTFOUND
                       : rc == KINBOX_ERR_DB_CONN ? KB_EX_DB
                                                  : KB_EX_RUNTIME;
        }
        if (x->o.json) {
                json_out(json_pack(
                    "{s:I,s:s,s:s,s:s,s:I}", "id", (json_int_t)id, "consumer",
                    consumer, "handler", m->name, "status", "replayed",
                    "released", (json_int_t)(rel > 0 ? rel : 0)));
        } else {
                printf("dead letter %" PRId64 ": replayed by consumer %s "
                       "(handler %s), committed with its inbox row\n",
                       id, consumer, m->name);
                print_released(rel);
        }
        return x->o.wait && last.parked_id ? wait_released(x, id, &last)
                                           : KB_EX_OK;
}

/*
 * The subcommand of `kinbox CMD SUB ...`: its 1-based index in subs
 * (NULL-terminated), or 0 with *exitp set: help shown, or a usage error
 * naming what was expected.
 */
static int
subcommand(const char *cmd, int argc, char **argv, const char *const *subs,
           int *exitp)
{
        if (argc >= 2 &&
            (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
                kb_admin_usage(cmd, stdout);
                *exitp = KB_EX_OK;
                return 0;
        }
        if (argc >= 2 && argv[1][0] != '-') {
                for (int i = 0; subs[i]; i++)
                        if (!strcmp(argv[1], subs[i]))
                                return i + 1;
                fprintf(stderr, "kinbox %s: unknown subcommand \"%s\"\n\n",
                        cmd, argv[1]);
        } else {
                fprintf(stderr, "kinbox %s: expected", cmd);
                for (int i = 0; subs[i]; i++)
                        fprintf(stderr, "%s %s",
                                !i            ? ""
                                : subs[i + 1] ? ","
                                              : " or",
                                subs[i]);
                fprintf(stderr, "\n\n");
        }
        kb_admin_usage(cmd, stderr);
        *exitp = KB_EX_USAGE;
        return 0;
}

int
kb_cmd_dead(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "dead"}};
        static const char *const subs[] = {"list",    "show",   "replay",
                                           "discard", "parked", NULL};
        int ex, kind = subcommand("dead", argc, argv, subs, &ex);
        if (!kind)
                return ex;
        const char *sub = argv[1];
        bool list = kind == 1 || kind == 5;
        if (parse_opts(argc - 1, argv + 1, &x.o,
                       list                   ? "jCsl"
                       : !strcmp(sub, "show") ? "j"
                                              : "jw"))
                return KB_EX_USAGE;
        int64_t id = 0;
        if (list ? x.o.nargs != 0
                 : (x.o.nargs != 1 || parse_id(&x.o, x.o.args[0], &id))) {
                fprintf(stderr,
                        list ? "usage: kinbox dead list|parked [options]\n"
                             : "usage: kinbox dead %s ID -c FILE\n",
                        sub);
                return KB_EX_USAGE;
        }
        if (x.o.status && strcmp(x.o.status, "dead") &&
            strcmp(x.o.status, "replayed") &&
            strcmp(x.o.status, "discarded")) {
                fprintf(stderr, "kinbox dead list: --status must be dead, "
                                "replayed or discarded\n");
                return KB_EX_USAGE;
        }
        ex = ctx_open(&x);
        if (!ex) {
                if (kind == 5)
                        ex = dead_parked(&x);
                else if (list)
                        ex = dead_list(&x);
                else if (!strcmp(sub, "show"))
                        ex = dead_show(&x, id);
                else if (!strcmp(sub, "replay"))
                        ex = dead_replay(&x, id);
                else
                        ex = dead_discard(&x, id);
        }
        ctx_close(&x);
        return ex;
}

/* ------------------------------------------------------------------ */
/* outbox */

static const char *const st_names[] = {"any", "pending", "sent", "dead",
                                       "canceled"};

typedef struct list_ctx {
        bool json;
        json_t *ja;
        table_t t;
} list_ctx_t;

static int
on_row(const kinbox_outbox_row_t *row, void *opaque)
{
        list_ctx_t *l = opaque;
        const char *st = st_names[row->status <= 4 ? row->status : 0];
        if (l->json) {
                json_array_append_new(
                    l->ja,
                    json_pack("{s:I,s:s,s:s,s:s,s:s?,s:i,s:i,s:s?,s:s,s:s?,"
                              "s:I,s:s?,s:I}",
                              "id", (json_int_t)row->id, "status", st,
                              "destination", row->destination, "idem_key",
                              row->idem_key, "aggregate_id", row->aggregate_id,
                              "attempts", row->attempts, "max_attempts",
                              row->max_attempts, "last_error", row->last_error,
                              "created_at", row->created_at, "next_attempt_at",
                              row->next_attempt_at, "payload_size",
                              (json_int_t)row->payload_size, "sent_at",
                              row->sent_at, "version",
                              (json_int_t)row->version));
                return 0;
        }
        char e[61];
        snprintf(e, sizeof(e), "%s", row->last_error ? row->last_error : "");
        tbl_add(&l->t, "%" PRId64, row->id);
        tbl_add(&l->t, "%s", st);
        tbl_add(&l->t, "%s", row->destination);
        tbl_add(&l->t, "%s", row->idem_key);
        tbl_add(&l->t, "%s", row->aggregate_id ? row->aggregate_id : "-");
        tbl_add(&l->t, "%d", row->attempts);
        tbl_add(&l->t, "%s", row->created_at);
        tbl_add(&l->t, "%s", e);
        return 0;
}

static int
outbox_fail(ctx_t *x, kinbox_outbox_admin_t *oa, kinbox_err_t rc,
            const char *what)
{
        if (rc == KINBOX_ERR_NOT_FOUND) {
                fprintf(stderr, "kinbox outbox: %s\n", what);
                return KB_EX_NOTFOUND;
        }
        fprintf(stderr, "kinbox outbox: %s\n", kinbox_outbox_admin_errstr(oa));
        (void)x;
        return rc == KINBOX_ERR_DB_CONN ? KB_EX_DB : KB_EX_RUNTIME;
}

static int
count_row(const kinbox_outbox_row_t *row, void *opaque)
{
        (void)row;
        ++*(int *)opaque;
        return 1;
}

static int
outbox_pause(ctx_t *x, const char *dest, bool pause)
{
        int paused = 0;
        kinbox_err_t rc =
            kinbox_admin_outbox_pause(x->adm, dest, pause, &paused);
        if (rc)
                return db_fail(x, rc);
        if (!pause && !paused) {
                fprintf(stderr,
                        "kinbox outbox resume: destination \"%s\" is not "
                        "paused\n",
                        dest);
                return KB_EX_NOTFOUND;
        }
        if (x->o.json)
                json_out(json_pack("{s:s,s:b}", "destination", dest, "paused",
                                   pause));
        else
                printf("destination %s: %s\n", dest,
                       pause ? (paused ? "already paused" : "paused")
                             : "resumed");
        return KB_EX_OK;
}

/* Check `kinbox outbox SUB`'s options and arguments; KB_EX_OK or usage. */
static int
outbox_args(ctx_t *x, int kind, const char *sub, kinbox_outbox_status_t *st,
            int64_t *id)
{
        *st = KINBOX_OUTBOX_ANY;
        if (x->o.status) {
                int k = 0;
                for (int i = 1; i <= 4; i++)
                        if (!strcmp(x->o.status, st_names[i]))
                                k = i;
                if (!k) {
                        fprintf(stderr, "kinbox outbox list: --status must be "
                                        "pending, sent, dead or canceled\n");
                        return KB_EX_USAGE;
                }
                *st = (kinbox_outbox_status_t)k;
        }
        if (kind == 1 && x->o.nargs) {
                fprintf(stderr,
                        "kinbox outbox list: unexpected argument "
                        "\"%s\"\n",
                        x->o.args[0]);
                return KB_EX_USAGE;
        }
        if ((kind == 2 || kind == 3) &&
            !((x->o.nargs == 1 && !x->o.destination &&
               !parse_id(&x->o, x->o.args[0], id)) ||
              (x->o.nargs == 0 && x->o.destination))) {
                fprintf(stderr,
                        "usage: kinbox outbox %s (ID | --destination "
                        "DEST) -c FILE\n",
                        sub);
                return KB_EX_USAGE;
        }
        if ((kind == 4 || kind == 5) && x->o.nargs != 1) {
                fprintf(stderr,
                        "usage: kinbox outbox %s DESTINATION -c "
                        "FILE\n",
                        sub);
                return KB_EX_USAGE;
        }
        return KB_EX_OK;
}

/* kinbox outbox list */
static int
outbox_list(ctx_t *x, kinbox_outbox_admin_t *oa, kinbox_outbox_status_t st)
{
        list_ctx_t l = {.json = x->o.json, .ja = json_array()};
        tbl_init(&l.t, 8, "ID", "STATUS", "DESTINATION", "IDEM KEY",
                 "AGGREGATE", "ATTEMPTS", "CREATED", "LAST ERROR");
        kinbox_err_t rc =
            kinbox_outbox_list(oa, st, x->o.destination, x->o.after,
                               (size_t)x->o.limit, on_row, &l);
        if (rc) {
                tbl_print(&l.t, NULL);
                json_decref(l.ja);
                return outbox_fail(x, oa, rc, "");
        }
        rows_out(x->o.json, &l.t, l.ja);
        return KB_EX_OK;
}

/* kinbox outbox requeue|cancel --destination DEST (kind 2|3) */
static int
outbox_destination(ctx_t *x, kinbox_outbox_admin_t *oa, int kind)
{
        uint64_t n = 0;
        const char *dest = x->o.destination;
        kinbox_err_t rc = kind == 2
                              ? kinbox_outbox_requeue_destination(oa, dest, &n)
                              : kinbox_outbox_cancel_destination(oa, dest, &n);
        /* Nothing changed: a destination without any row is a mistake
         * (typo) the operator must see, not "0 rows". */
        int any = 0;
        if (!rc && !n &&
            !(rc = kinbox_outbox_list(oa, KINBOX_OUTBOX_ANY, dest, 0, 1,
                                      count_row, &any)) &&
            !any)
                rc = KINBOX_ERR_NOT_FOUND;
        if (rc == KINBOX_ERR_NOT_FOUND) {
                char what[300];
                snprintf(what, sizeof(what),
                         "no outbox row has destination \"%.200s\"", dest);
                return outbox_fail(x, oa, rc, what);
        }
        if (rc)
                return outbox_fail(x, oa, rc, "");
        if (x->o.json)
                json_out(json_pack("{s:s,s:s,s:I}", "destination", dest,
                                   "action",
                                   kind == 2 ? "requeued" : "canceled",
                                   "count", (json_int_t)n));
        else
                printf("destination %s: %" PRIu64 " rows %s\n", dest, n,
                       kind == 2 ? "requeued" : "canceled");
        return KB_EX_OK;
}

/* kinbox outbox requeue|cancel ID (kind 2|3) */
static int
outbox_row(ctx_t *x, kinbox_outbox_admin_t *oa, int kind, int64_t id)
{
        kinbox_err_t rc = kind == 2 ? kinbox_outbox_requeue(oa, id)
                                    : kinbox_outbox_cancel(oa, id);
        char what[160];
        snprintf(what, sizeof(what), "no %s outbox row with id %" PRId64,
                 kind == 2 ? "dead or canceled" : "pending", id);
        if (rc)
                return outbox_fail(x, oa, rc, what);
        if (x->o.json)
                json_out(json_pack("{s:I,s:s}", "id", (json_int_t)id, "status",
                                   kind == 2 ? "pending" : "canceled"));
        else
                printf("outbox row %" PRId64 ": %s\n", id,
                       kind == 2 ? "requeued" : "canceled");
        return KB_EX_OK;
}

int
kb_cmd_outbox(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "outbox"}};
        static const char *const subs[] = {"list",  "requeue", "cancel",
                                           "pause", "resume",  NULL};
        int ex, kind = subcommand("outbox", argc, argv, subs, &ex);
        if (!kind)
                return ex;
        const char *sub = argv[1];
        if (parse_opts(argc - 1, argv + 1, &x.o,
                       kind == 1   ? "jsdla"
                       : kind <= 3 ? "jd"
                                   : "j"))
                return KB_EX_USAGE;
        kinbox_outbox_status_t st;
        int64_t id = 0;
        if ((ex = outbox_args(&x, kind, sub, &st, &id)))
                return ex;
        ex = ctx_open(&x);
        if (ex || kind >= 4) {
                if (!ex)
                        ex = outbox_pause(&x, x.o.args[0], kind == 4);
                ctx_close(&x);
                return ex;
        }
        char err[1024];
        kinbox_outbox_admin_t *oa =
            kinbox_outbox_admin_new(x.cfg.base, err, sizeof(err));
        if (!oa) {
                fprintf(stderr, "kinbox outbox: %s\n", err);
                ctx_close(&x);
                return KB_EX_USAGE;
        }
        if (kind == 1)
                ex = outbox_list(&x, oa, st);
        else if (x.o.destination)
                ex = outbox_destination(&x, oa, kind);
        else
                ex = outbox_row(&x, oa, kind, id);
        kinbox_outbox_admin_destroy(oa);
        ctx_close(&x);
        return ex;
}

/* ------------------------------------------------------------------ */
/* verify */

static int
verify_consumer(ctx_t *x, const char *name, kinbox_conf_t *conf, json_t *jc,
                int *gaps)
{
        kinbox_verify_result_t *vr = NULL;
        kinbox_err_t rc = kinbox_verify(x->adm, name, &vr);
        if (rc)
                return db_fail(x, rc);
        json_t *jg = json_array(), *jp = json_array();
        for (size_t i = 0; i < vr->nahead; i++) {
                const kinbox_verify_ahead_t *a = &vr->ahead[i];
                char msg[512], wm[24];
                snprintf(wm, sizeof(wm), "%" PRId64, a->watermark);
                snprintf(msg, sizeof(msg),
                         "%s [%d]: %" PRId64 " %s row(s) at offsets %" PRId64
                         "..%" PRId64 " but the DB watermark is %s",
                         a->topic, (int)a->partition, a->rows, a->source,
                         a->lowest, a->highest,
                         a->watermark >= 0 ? wm : "missing");
                json_array_append_new(jg, json_string(msg));
                if (!x->o.json)
                        printf("GAP  %s: %s\n", name, msg);
                (*gaps)++;
        }
        /* Kafka's committed offsets must not pass the DB watermark: the
         * offsets in between were committed without their effect. */
        char err[512] = "";
        int64_t *highs = NULL;
        rd_kafka_topic_partition_list_t *l =
            broker_offsets(conf, &highs, err, sizeof(err));
        for (size_t i = 0; i < vr->npartitions; i++) {
                const kinbox_verify_partition_t *p = &vr->partitions[i];
                const char *topic = p->topic;
                int32_t part = p->partition;
                long long wm = p->watermark;
                long long covered = p->rows;
                long long lo = p->lowest >= 0 ? p->lowest : wm;
                long long committed = -1;
                rd_kafka_topic_partition_t *tp =
                    l ? rd_kafka_topic_partition_list_find(l, topic, part)
                      : NULL;
                if (tp)
                        committed = tp->offset;
                if (committed > wm) {
                        char msg[512];
                        snprintf(msg, sizeof(msg),
                                 "%s [%d]: Kafka committed offset %lld is "
                                 "past the DB watermark %lld: offsets "
                                 "%lld..%lld were committed to Kafka "
                                 "without their effect being recorded",
                                 topic, (int)part, committed, wm, wm,
                                 committed - 1);
                        json_array_append_new(jg, json_string(msg));
                        if (!x->o.json)
                                printf("GAP  %s: %s\n", name, msg);
                        (*gaps)++;
                }
                /* Offsets below the watermark without a row: duplicates
                 * of an earlier id, pruned rows, or missing. Not a gap by
                 * itself (the inbox cannot tell which). */
                long long unaccounted = wm - lo - covered;
                json_array_append_new(
                    jp, json_pack(
                            "{s:s,s:i,s:I,s:I,s:I,s:I}", "topic", topic,
                            "partition", (int)part, "watermark",
                            (json_int_t)wm, "committed", (json_int_t)committed,
                            "rows", (json_int_t)covered, "offsets_without_row",
                            (json_int_t)(unaccounted > 0 ? unaccounted : 0)));
                if (!x->o.json)
                        printf("ok   %s: %s [%d] watermark %lld, Kafka "
                               "committed %lld, %lld offset(s) with a row, "
                               "%lld without (duplicates or pruned)\n",
                               name, topic, (int)part, wm, committed, covered,
                               unaccounted > 0 ? unaccounted : 0);
        }
        kinbox_verify_result_destroy(vr);
        if (l)
                rd_kafka_topic_partition_list_destroy(l);
        free(highs);
        if (!l && !x->o.json)
                printf("note %s: Kafka committed offsets not checked: %s\n",
                       name, err);
        json_t *jo = json_pack("{s:s,s:o,s:o}", "consumer", name, "gaps", jg,
                               "partitions", jp);
        if (!l)
                json_object_set_new(jo, "broker_error", json_string(err));
        json_array_append_new(jc, jo);
        return KB_EX_OK;
}

int
kb_cmd_verify(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "verify"}};
        if (parse_opts(argc, argv, &x.o, "jCo"))
                return KB_EX_USAGE;
        int64_t older = 5 * 60000;
        if (x.o.older_than && parse_duration_ms(x.o.older_than, &older)) {
                fprintf(stderr,
                        "kinbox verify: --older-than \"%s\": expected "
                        "a duration (30s, 5m, 2h, 1d)\n",
                        x.o.older_than);
                return KB_EX_USAGE;
        }
        if (x.o.nargs) {
                fprintf(stderr, "kinbox verify: unexpected argument \"%s\"\n",
                        x.o.args[0]);
                return KB_EX_USAGE;
        }
        int ex = ctx_open(&x);
        if (ex)
                goto out;
        kinbox_conf_t *only = NULL;
        if (x.o.consumer && !consumer_section(&x, x.o.consumer, &only)) {
                fprintf(stderr, "kinbox verify: %s has no [consumer.%s]\n",
                        x.o.config, x.o.consumer);
                ex = KB_EX_NOTFOUND;
                goto out;
        }
        int gaps = 0;
        json_t *jc = json_array();
        for (int i = 0; i < x.cfg.nconsumers && !ex; i++) {
                if (x.o.consumer &&
                    strcmp(x.o.consumer, x.cfg.consumers[i].name))
                        continue;
                ex = verify_consumer(&x, x.cfg.consumers[i].name,
                                     x.cfg.consumers[i].conf, jc, &gaps);
        }
        if (ex) {
                json_decref(jc);
                goto out;
        }
        /* The outbox: rows pending longer than the threshold. */
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_admin_outbox_stuck(x.adm, older, &r);
        if (rc) {
                json_decref(jc);
                ex = db_fail(&x, rc);
                goto out;
        }
        json_t *jo = json_array();
        for (size_t i = 0; i < kinbox_rows_count(r); i++) {
                char msg[512];
                snprintf(msg, sizeof(msg),
                         "outbox %s: %s row(s) pending longer than %s "
                         "(oldest id %s, %ss old)",
                         rv(r, i, 0), rv(r, i, 1),
                         x.o.older_than ? x.o.older_than : "5m", rv(r, i, 2),
                         rv(r, i, 3));
                json_array_append_new(jo, json_string(msg));
                if (!x.o.json)
                        printf("GAP  %s\n", msg);
                gaps++;
        }
        kinbox_rows_destroy(r);
        if (x.o.json)
                json_out(json_pack("{s:o,s:o,s:i,s:b}", "consumers", jc,
                                   "outbox", jo, "gaps", gaps, "ok",
                                   gaps == 0));
        else {
                json_decref(jc);
                json_decref(jo);
                printf("%s: %d gap(s)\n", gaps ? "FAILED" : "OK", gaps);
        }
        ex = gaps ? KB_EX_RUNTIME : KB_EX_OK;
out:
        ctx_close(&x);
        return ex;
}

/* ------------------------------------------------------------------ */
/* prune */

int
kb_cmd_prune(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "prune"}};
        if (parse_opts(argc, argv, &x.o, "jn"))
                return KB_EX_USAGE;
        if (x.o.nargs) {
                fprintf(stderr, "kinbox prune: unexpected argument \"%s\"\n",
                        x.o.args[0]);
                return KB_EX_USAGE;
        }
        char err[2048];
        if (kb_config_load(x.o.config, &x.cfg, err, sizeof(err))) {
                fprintf(stderr, "kinbox prune: %s\n", err);
                return KB_EX_USAGE;
        }
        x.loaded = true;
        /* The same refusal as `kinbox run`: pruning inside the redelivery
         * window would forget ids the broker can still redeliver. */
        int refused = kb_retention_check(&x.cfg, "prune");
        if (refused) {
                ctx_close(&x);
                return refused;
        }
        kinbox_prune_result_t res;
        kinbox_err_t rc = kinbox_prune(x.cfg.base, x.o.dry_run, NULL, &res,
                                       err, sizeof(err));
        int ex = KB_EX_OK;
        if (rc) {
                fprintf(stderr, "kinbox prune: %s\n", err);
                ex = rc == KINBOX_ERR_DB_CONN  ? KB_EX_DB
                     : rc == KINBOX_ERR_CONFIG ? KB_EX_USAGE
                                               : KB_EX_RUNTIME;
        } else if (x.o.json) {
                json_out(json_pack(
                    "{s:b,s:b,s:I,s:I,s:s,s:s}", "dry_run", x.o.dry_run,
                    "skipped", res.skipped, "inbox_rows",
                    (json_int_t)res.inbox_rows, "outbox_rows",
                    (json_int_t)res.outbox_rows, "inbox_retention",
                    kinbox_conf_get(x.cfg.base, "inbox.retention"),
                    "outbox_retention",
                    kinbox_conf_get(x.cfg.base, "outbox.retention")));
        } else if (res.skipped) {
                printf("another instance is pruning (lock held): nothing "
                       "done\n");
        } else {
                const char *verb = x.o.dry_run ? "would delete" : "deleted";
                printf("inbox:  %s %" PRIu64 " rows older than %s\n", verb,
                       res.inbox_rows,
                       kinbox_conf_get(x.cfg.base, "inbox.retention"));
                printf("outbox: %s %" PRIu64 " sent rows older than %s "
                       "(dead rows and dead letters are kept)\n",
                       verb, res.outbox_rows,
                       kinbox_conf_get(x.cfg.base, "outbox.retention"));
        }
        ctx_close(&x);
        return ex;
}

/* ------------------------------------------------------------------ */
/* help */

int
kb_admin_usage(const char *cmd, FILE *fp)
{
        if (!strcmp(cmd, "status"))
                fprintf(fp,
                        "usage: kinbox status -c FILE [--json]\n\n"
                        "Per configured consumer: lag (committed offsets vs "
                        "high watermarks, asked of\nthe broker), inbox rows, "
                        "dead letters by status. Per outbox destination:\n"
                        "pending, age of the oldest pending row, dead, sent "
                        "in the last hour, paused.\nInbox size. Dedup hits "
                        "are not stored: a running `kinbox run` exports them\n"
                        "as kinbox_consumer_messages_total{result=\"duplicate"
                        "\"} on /metrics.\n");
        else if (!strcmp(cmd, "dead"))
                fprintf(fp,
                        "usage: kinbox dead list [--consumer NAME] [--status "
                        "dead|replayed|discarded]\n"
                        "                        [--limit N] -c FILE "
                        "[--json]\n"
                        "       kinbox dead parked [--consumer NAME] "
                        "[--limit N] -c FILE [--json]\n"
                        "       kinbox dead show ID -c FILE [--json]\n"
                        "       kinbox dead replay ID -c FILE [--wait] "
                        "[--json]\n"
                        "       kinbox dead discard ID -c FILE [--wait] "
                        "[--json]\n\n"
                        "show prints the original key, headers and payload "
                        "(text, non-printable bytes\nas \\xNN). replay runs "
                        "the consumer's configured handler on the stored "
                        "copy in\none transaction with its inbox row, as if "
                        "it arrived again, and marks the\ndead letter "
                        "replayed; a dead letter is replayed at most once. "
                        "discard marks it\ndiscarded (the row is kept).\n"
                        "With dead_letter.hold_key, list shows how many "
                        "parked messages each dead\nletter holds back "
                        "(HOLDS BACK), parked lists them, and replay and "
                        "discard\nreport how many they release: the running "
                        "consumer applies them in offset\norder. --wait "
                        "waits until it did (exit 0), or one of them failed "
                        "and\nholds the key again (exit 1).\n");
        else if (!strcmp(cmd, "outbox"))
                fprintf(fp,
                        "usage: kinbox outbox list [--status "
                        "pending|sent|dead|canceled] [--destination D]\n"
                        "                          [--after ID] [--limit N] "
                        "-c FILE [--json]\n"
                        "       kinbox outbox requeue (ID | --destination D) "
                        "-c FILE   dead/canceled -> pending\n"
                        "       kinbox outbox cancel (ID | --destination D) "
                        "-c FILE    pending -> canceled\n"
                        "       kinbox outbox pause DESTINATION -c FILE      "
                        "      relays stop claiming it\n"
                        "       kinbox outbox resume DESTINATION -c FILE\n");
        else if (!strcmp(cmd, "verify"))
                fprintf(fp,
                        "usage: kinbox verify -c FILE [--consumer NAME] "
                        "[--older-than 5m] [--json]\n\n"
                        "Audits each consumer: every inbox row and dead "
                        "letter lies below its partition's\nDB watermark; "
                        "Kafka's committed offset is not past the DB "
                        "watermark (offsets\ncommitted without an effect); "
                        "per partition, how many offsets have a row\n(the "
                        "rest are duplicates or pruned rows: reported, not "
                        "a gap). And the outbox:\nrows pending longer than "
                        "--older-than. Exit status 1 when a gap is found.\n");
        else if (!strcmp(cmd, "prune"))
                fprintf(fp,
                        "usage: kinbox prune -c FILE [--dry-run] [--json]\n\n"
                        "Deletes inbox rows older than inbox.retention and "
                        "sent outbox rows older than\noutbox.retention "
                        "([prune] section), prune.batch rows per statement. "
                        "Only one\ninstance prunes at a time (a database "
                        "lock); dead rows and dead letters are\nnever "
                        "deleted. --dry-run counts what would go.\n");
        else if (!strcmp(cmd, "reconcile"))
                fprintf(fp,
                        "usage: kinbox reconcile -c FILE [--json]\n\n"
                        "Runs the reconciliation checks of the configured "
                        "handler modules (consumers'\nhandlers and [relay] "
                        "modules): one query per check that returns the "
                        "business\ndiscrepancies older than "
                        "reconcile.grace (e.g. a paid deposit without its "
                        "ledger\nposting). Prints every discrepancy row; "
                        "exit status 1 when there is one.\n");
        else
                return 0;
        fprintf(fp, "\nExit status: 0 ok, 1 runtime failure (verify: gap "
                    "found; reconcile: discrepancy), 2 usage or "
                    "configuration\nerror, 3 database "
                    "unreachable, 4 not found.\n");
        return 1;
}

/* ------------------------------------------------------------------ */
/* kinbox run: retention check, pruner thread, metrics endpoint */

int
kb_retention_check(kb_config_t *cfg, const char *cmd)
{
        /* Every consumer (its topics' window from the broker when it can
         * answer), then the shared settings the pruner deletes by. */
        for (int i = 0; i <= cfg->nconsumers; i++) {
                kinbox_conf_t *c =
                    i < cfg->nconsumers ? cfg->consumers[i].conf : cfg->base;
                char err[1024];
                int64_t window = 0;
                const char *src = NULL;
                if (!c || !kinbox_retention_check(c, &window, &src, err,
                                                  sizeof(err)))
                        continue;
                if (i < cfg->nconsumers)
                        fprintf(stderr, "kinbox %s: consumer.%s: %s\n", cmd,
                                cfg->consumers[i].name, err);
                else
                        fprintf(stderr, "kinbox %s: %s\n", cmd, err);
                return KB_EX_USAGE;
        }
        return KB_EX_OK;
}

struct kb_ops {
        kinbox_conf_t *conf; /* base: database, [prune] */
        pthread_t pruner;
        bool pruner_started;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        volatile int stop;
        kinbox_http_t *http;
        kinbox_admin_t *adm; /* the HTTP server's probe thread only */
        kinbox_kafka_t *kafka; /* broker reachability: the consumers'
                                  [kafka] settings */
        char kafka_err[512]; /* why there is no kafka client */
        char **consumers;
        int nconsumers;
        kb_reconciler_t *reconciler;
};

static void *
pruner_main(void *arg)
{
        kb_ops_t *ops = arg;
        int64_t interval = 600000;
        const char *iv = kinbox_conf_get(ops->conf, "prune.interval");
        if (iv)
                parse_duration_ms(iv, &interval);
        for (;;) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += interval / 1000;
                ts.tv_nsec += (interval % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_mutex_lock(&ops->lock);
                while (!ops->stop && pthread_cond_timedwait(
                                         &ops->cond, &ops->lock, &ts) == 0)
                        ;
                int stop = ops->stop;
                pthread_mutex_unlock(&ops->lock);
                if (stop)
                        return NULL;
                char err[1024];
                kinbox_prune_result_t res;
                if (kinbox_prune(ops->conf, 0, &ops->stop, &res, err,
                                 sizeof(err)))
                        fprintf(stderr, "kinbox run: pruner: %s\n", err);
                else if (res.inbox_rows || res.outbox_rows)
                        fprintf(stderr,
                                "kinbox run: pruner: deleted %" PRIu64
                                " inbox and %" PRIu64 " outbox rows\n",
                                res.inbox_rows, res.outbox_rows);
        }
}

static int
ready_cb(char *why, size_t sz, void *opaque)
{
        kb_ops_t *ops = opaque;
        if (kinbox_admin_ping(ops->adm)) {
                snprintf(why, sz, "database: %s",
                         kinbox_admin_errstr(ops->adm));
                return 1;
        }
        char kw[512];
        if (!ops->kafka && ops->kafka_err[0]) {
                snprintf(why, sz, "broker: %s", ops->kafka_err);
                return 1;
        }
        if (ops->kafka &&
            kinbox_kafka_ready(ops->kafka, 2000, kw, sizeof(kw))) {
                snprintf(why, sz, "broker: %s", kw);
                return 1;
        }
        for (int i = 0; i < ops->nconsumers; i++) {
                char l[300];
                snprintf(l, sizeof(l), "consumer=\"%s\"", ops->consumers[i]);
                double v = kinbox_metrics_value(
                    "kinbox_consumer_assigned_partitions", l);
                if (isnan(v) || v < 0) {
                        snprintf(why, sz,
                                 "consumer %s: no partition assignment yet",
                                 ops->consumers[i]);
                        return 1;
                }
        }
        return 0;
}

static void
collect_cb(void *opaque)
{
        kb_ops_t *ops = opaque;
        /* A database outage shows in /readyz; the gauges keep their last
         * values meanwhile. */
        kinbox_admin_collect_metrics(ops->adm);
}

kb_ops_t *
kb_ops_start(kb_config_t *cfg, char *err, size_t sz)
{
        kb_ops_t *ops = calloc(1, sizeof(*ops));
        if (!ops) {
                snprintf(err, sz, "out of memory");
                return NULL;
        }
        pthread_mutex_init(&ops->lock, NULL);
        pthread_cond_init(&ops->cond, NULL);
        ops->conf = kinbox_conf_dup(cfg->base);
        if (!ops->conf) {
                snprintf(err, sz, "out of memory");
                kb_ops_stop(ops);
                return NULL;
        }
        if (pthread_create(&ops->pruner, NULL, pruner_main, ops)) {
                snprintf(err, sz, "cannot start the pruner thread");
                kb_ops_stop(ops);
                return NULL;
        }
        ops->pruner_started = true;
        ops->reconciler = kb_reconciler_start(cfg, err, sz);
        if (!ops->reconciler && err[0]) {
                kb_ops_stop(ops);
                return NULL;
        }
        if (!cfg->metrics_listen)
                return ops;
        ops->adm = kinbox_admin_new(cfg->base, err, sz);
        if (!ops->adm) {
                kb_ops_stop(ops);
                return NULL;
        }
        ops->consumers = calloc((size_t)cfg->nconsumers + 1, sizeof(char *));
        for (int i = 0; ops->consumers && i < cfg->nconsumers; i++)
                ops->consumers[ops->nconsumers++] =
                    strdup(cfg->consumers[i].name);
        const char *bs = kinbox_conf_get(cfg->base, "kafka.bootstrap.servers");
        if (bs) {
                /* Every [kafka] setting, as the consumers connect (TLS,
                 * SASL); its connection errors show in /readyz, not in
                 * the log. */
                static const char *const quiet[] = {"log_level", "0", NULL};
                ops->kafka = kinbox_kafka_new(cfg->base, quiet, ops->kafka_err,
                                              sizeof(ops->kafka_err));
        }
        ops->http =
            kinbox_http_start_logged(cfg->metrics_listen, cfg->base, ready_cb,
                                     collect_cb, ops, err, sz);
        if (!ops->http) {
                kb_ops_stop(ops);
                return NULL;
        }
        fprintf(stderr,
                "kinbox run: metrics on http://%s (port %d): "
                "/metrics /healthz /readyz\n",
                cfg->metrics_listen, kinbox_http_port(ops->http));
        return ops;
}

void
kb_ops_stop(kb_ops_t *ops)
{
        if (!ops)
                return;
        kinbox_http_stop(ops->http);
        pthread_mutex_lock(&ops->lock);
        ops->stop = 1;
        pthread_cond_broadcast(&ops->cond);
        pthread_mutex_unlock(&ops->lock);
        if (ops->pruner_started)
                pthread_join(ops->pruner, NULL);
        kb_reconciler_stop(ops->reconciler);
        kinbox_kafka_destroy(ops->kafka);
        kinbox_admin_destroy(ops->adm);
        for (int i = 0; i < ops->nconsumers; i++)
                free(ops->consumers[i]);
        free(ops->consumers);
        kinbox_conf_destroy(ops->conf);
        pthread_mutex_destroy(&ops->lock);
        pthread_cond_destroy(&ops->cond);
        free(ops);
}
