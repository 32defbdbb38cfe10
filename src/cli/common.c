/*
 * common.c -- what the operator commands share: options, table / JSON
 * output, the configuration-and-database context, the broker's view of a
 * consumer group. Output is a human table by default and JSON with --json
 * (one document on stdout).
 */
#include "common.h"
#include "schema.h"
#include "confval.h"
#include "hdrcodec.h"
#include "internal.h"

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

int
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
                        kb_usage_of(o->cmd, stdout);
                        exit(KB_EX_OK);
                }
                if (ch == '?' || ch == ':' ||
                    (ch != 'c' && !strchr(allowed, ch))) {
                        const char *bad = argv[optind - 1];
                        fprintf(stderr,
                                "kinbox %s: unknown or misplaced "
                                "option \"%s\"\n\n",
                                o->cmd, bad);
                        kb_usage_of(o->cmd, stderr);
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

int
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
int
parse_duration_ms(const char *s, int64_t *ms)
{
        return kinbox__confval_duration("duration", s, 0, INT64_MAX, ms, NULL,
                                        0);
}

bool
kb_nap(pthread_mutex_t *lock, pthread_cond_t *cond, const volatile int *stop,
       int64_t ms)
{
        struct timespec ts;
        kinbox__deadline(ms, &ts);
        pthread_mutex_lock(lock);
        while (!*stop && pthread_cond_timedwait(cond, lock, &ts) == 0)
                ;
        bool stopped = *stop;
        pthread_mutex_unlock(lock);
        return stopped;
}

int
kb_duration_ms(const char *s, int64_t *ms)
{
        return parse_duration_ms(s, ms);
}

/* ------------------------------------------------------------------ */
/* output */

void
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

void
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
void
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
char *
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

void
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
void
rows_out(bool json, table_t *t, json_t *ja)
{
        tbl_print(t, json ? NULL : stdout);
        if (json)
                json_out(ja);
        else
                json_decref(ja);
}

/* A value as JSON: integer when it looks like one, else string. */
json_t *
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

int
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

void
ctx_close(ctx_t *x)
{
        kinbox_admin_destroy(x->adm);
        if (x->loaded)
                kb_config_free(&x->cfg);
}

int
db_fail(ctx_t *x, kinbox_err_t rc)
{
        fprintf(stderr, "kinbox %s: %s\n", x->o.cmd,
                kinbox_admin_errstr(x->adm));
        return rc == KINBOX_ERR_DB_CONN ? KB_EX_DB : KB_EX_RUNTIME;
}

const char *
rv(kinbox_rows_t *r, size_t i, int c)
{
        return kinbox_rows_value(r, i, c, NULL);
}

const char *
group_of(kinbox_conf_t *conf)
{
        const char *g = kinbox_conf_get(conf, "group.id");
        return g ? g : kinbox_conf_get(conf, "name");
}

/* A librdkafka consumer handle of the group (nothing joins, nothing is
 * committed: it only reads committed offsets and watermarks). */
/* A client in the consumer's group (never joining it) with all of its
 * kafka.* settings, logging through its logger. */
kinbox_kafka_t *
group_handle(kinbox_conf_t *conf, char *err, size_t sz)
{
        const char *const extra[] = {
            "group.id", group_of(conf), "enable.auto.commit",
            "false",    "log_level",    "0",
            NULL};
        return kinbox_kafka_new(conf, extra, err, sz);
}

/* Per partition of a consumer's topics: committed offset and high
 * watermark from the broker. Returns NULL (err set) when the broker does
 * not answer. */
rd_kafka_topic_partition_list_t *
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

const char *
consumer_section(ctx_t *x, const char *name, kinbox_conf_t **conf)
{
        for (int i = 0; i < x->cfg.nconsumers; i++)
                if (!strcmp(x->cfg.consumers[i].name, name)) {
                        *conf = x->cfg.consumers[i].conf;
                        return x->cfg.consumers[i].name;
                }
        return NULL;
}

/*
 * The subcommand of `kinbox CMD SUB ...`: its 1-based index in subs
 * (NULL-terminated), or 0 with *exitp set: help shown, or a usage error
 * naming what was expected.
 */
int
subcommand(const char *cmd, int argc, char **argv, const char *const *subs,
           int *exitp)
{
        if (argc >= 2 &&
            (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
                kb_usage_of(cmd, stdout);
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
        kb_usage_of(cmd, stderr);
        *exitp = KB_EX_USAGE;
        return 0;
}
