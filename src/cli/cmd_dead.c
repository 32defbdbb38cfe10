/*
 * cmd_dead.c -- `kinbox dead list|show|replay|discard|parked`.
 */
#include "common.h"
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
/* dead */

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
        kinbox_err_t rc =
            kinbox_dead_parked(x->adm, x->o.consumer, x->o.limit, &r);
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
                return rc == KINBOX_ERR_STATE ? KB_EX_RUNTIME : KB_EX_NOTFOUND;
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
                fprintf(stderr,
                        "kinbox dead replay: replay runs consumer %s's "
                        "handler, which this command cannot load: %s (a "
                        "handler inside your own program replays with "
                        "kinbox_dead_replay(); list, show and discard need "
                        "no handler)\n",
                        consumer, err);
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
