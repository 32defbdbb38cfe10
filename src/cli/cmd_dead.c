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
        kinbox_dead_list_t *l = NULL;
        kinbox_err_t rc = kinbox_dead_list(x->adm, x->o.consumer, x->o.status,
                                           x->o.limit, &l);
        if (rc)
                return db_fail(x, rc);
        json_t *ja = json_array();
        table_t t;
        tbl_init(&t, 9, "ID", "CONSUMER", "TOPIC [PART] OFFSET", "MESSAGE ID",
                 "STATUS", "ATTEMPTS", "DEAD AT", "HOLDS BACK", "ERROR");
        for (size_t i = 0; i < l->count; i++) {
                const kinbox_dead_letter_t *d = &l->letters[i];
                char *mid = d->message_id ? escape_bytes(d->message_id,
                                                         d->message_id_len)
                                          : NULL;
                const char *error = d->error ? d->error : "";
                json_array_append_new(
                    ja, json_pack("{s:I,s:s,s:s,s:i,s:I,s:o,s:s,s:i,s:s,s:s,"
                                  "s:I}",
                                  "id", (json_int_t)d->id, "consumer",
                                  d->consumer, "topic", d->topic, "partition",
                                  (int)d->partition, "offset",
                                  (json_int_t)d->offset, "message_id",
                                  mid ? json_string(mid) : json_null(),
                                  "status", d->status, "attempts", d->attempts,
                                  "dead_at", d->dead_at, "error", error,
                                  "holds_back", (json_int_t)d->holds_back));
                char err[61];
                snprintf(err, sizeof(err), "%s", error);
                tbl_add(&t, "%" PRId64, d->id);
                tbl_add(&t, "%s", d->consumer);
                tbl_add(&t, "%s [%d] %" PRId64, d->topic, (int)d->partition,
                        d->offset);
                tbl_add(&t, "%s", mid ? mid : "(none)");
                tbl_add(&t, "%s", d->status);
                tbl_add(&t, "%d", d->attempts);
                tbl_add(&t, "%s", d->dead_at);
                tbl_add(&t, "%" PRId64, d->holds_back);
                tbl_add(&t, "%s", err);
                free(mid);
        }
        kinbox_dead_list_destroy(l);
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

/* One field of `kinbox dead show`: its name, its text (a number
 * formatted into num) or bytes, and how JSON shows it. */
typedef struct field {
        const char *name;
        const char *val;
        size_t len;
        bool number; /* JSON number */
        bool headers; /* decoded for people */
        const char *size_key; /* JSON: also the byte count */
        char num[24];
} field_t;

static void
show_field(bool json, json_t *jo, const field_t *f)
{
        char *e = f->headers && f->val ? show_headers(f->val, f->len)
                  : f->val             ? escape_bytes(f->val, f->len)
                                       : NULL;
        if (!json)
                printf("%-16s %s\n", f->name, e ? e : "(null)");
        else if (f->number)
                json_object_set_new(jo, f->name, jval(f->val));
        else
                json_object_set_new(jo, f->name,
                                    e ? json_string(e) : json_null());
        if (json && f->size_key && f->val)
                json_object_set_new(jo, f->size_key,
                                    json_integer((json_int_t)f->len));
        free(e);
}

#define FIELD_TEXT(n, v)                                                      \
        {                                                                     \
                .name = n, .val = v, .len = (v) ? strlen(v) : 0               \
        }
#define FIELD_BYTES(n, v, l)                                                  \
        {                                                                     \
                .name = n, .val = v, .len = l                                 \
        }

static int
dead_show(ctx_t *x, int64_t id)
{
        kinbox_dead_letter_t *d = NULL;
        kinbox_err_t rc = kinbox_dead_show(x->adm, id, &d);
        if (rc == KINBOX_ERR_NOT_FOUND) {
                fprintf(stderr, "kinbox dead show: %s\n",
                        kinbox_admin_errstr(x->adm));
                return KB_EX_NOTFOUND;
        }
        if (rc)
                return db_fail(x, rc);
        field_t f[14] = {
            {.name = "id", .number = true},
            FIELD_TEXT("consumer", d->consumer),
            FIELD_BYTES("message_id", d->message_id, d->message_id_len),
            FIELD_TEXT("topic", d->topic),
            {.name = "partition", .number = true},
            {.name = "offset", .number = true},
            FIELD_BYTES("key", d->key, d->key_len),
            FIELD_BYTES("headers", d->headers, d->headers_len),
            FIELD_BYTES("payload", d->payload, d->payload_len),
            FIELD_TEXT("error", d->error),
            {.name = "attempts", .number = true},
            FIELD_TEXT("first_failed_at", d->first_failed_at),
            FIELD_TEXT("dead_at", d->dead_at),
            FIELD_TEXT("status", d->status)};
        f[6].size_key = "key_size";
        f[7].headers = true;
        f[8].size_key = "payload_size";
        const int64_t nums[4] = {d->id, d->partition, d->offset, d->attempts};
        const int at[4] = {0, 4, 5, 10};
        for (int k = 0; k < 4; k++) {
                field_t *n = &f[at[k]];
                snprintf(n->num, sizeof(n->num), "%" PRId64, nums[k]);
                n->val = n->num;
                n->len = strlen(n->num);
        }
        json_t *jo = json_object();
        for (int c = 0; c < 14; c++)
                show_field(x->o.json, jo, &f[c]);
        kinbox_dead_letter_destroy(d);
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
        kinbox_parked_list_t *l = NULL;
        kinbox_err_t rc =
            kinbox_dead_parked(x->adm, x->o.consumer, x->o.limit, &l);
        if (rc)
                return db_fail(x, rc);
        json_t *ja = json_array();
        table_t t;
        tbl_init(&t, 7, "ID", "CONSUMER", "TOPIC [PART] OFFSET", "KEY",
                 "MESSAGE ID", "BLOCKER", "PARKED AT");
        for (size_t i = 0; i < l->count; i++) {
                const kinbox_parked_t *p = &l->parked[i];
                char *key = escape_bytes(p->key ? p->key : "", p->key_len);
                char *mid = escape_bytes(p->message_id ? p->message_id : "",
                                         p->message_id_len);
                /* No blocker: the key is being released right now. */
                char blocker[24] = "(null)";
                if (p->blocker_id)
                        snprintf(blocker, sizeof(blocker), "%" PRId64,
                                 p->blocker_id);
                json_array_append_new(
                    ja,
                    json_pack(
                        "{s:I,s:s,s:s,s:i,s:I,s:s,s:s,s:o,s:s}", "id",
                        (json_int_t)p->id, "consumer", p->consumer, "topic",
                        p->topic, "partition", (int)p->partition, "offset",
                        (json_int_t)p->offset, "message_id", mid ? mid : "",
                        "key", key ? key : "", "blocker",
                        p->blocker_id ? json_integer((json_int_t)p->blocker_id)
                                      : json_null(),
                        "parked_at", p->parked_at));
                tbl_add(&t, "%" PRId64, p->id);
                tbl_add(&t, "%s", p->consumer);
                tbl_add(&t, "%s [%d] %" PRId64, p->topic, (int)p->partition,
                        p->offset);
                tbl_add(&t, "%s", key ? key : "");
                tbl_add(&t, "%s", mid ? mid : "");
                tbl_add(&t, "%s", blocker);
                tbl_add(&t, "%s", p->parked_at);
                free(key);
                free(mid);
        }
        kinbox_parked_list_destroy(l);
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
                return kb_exit_of(rc);
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
        kinbox_dead_letter_t *d = NULL;
        kinbox_err_t rc = kinbox_dead_show(x->adm, id, &d);
        if (rc == KINBOX_ERR_NOT_FOUND) {
                fprintf(stderr, "kinbox dead replay: %s\n",
                        kinbox_admin_errstr(x->adm));
                return KB_EX_NOTFOUND;
        }
        if (rc)
                return db_fail(x, rc);
        char consumer[256];
        snprintf(consumer, sizeof(consumer), "%s", d->consumer);
        kinbox_dead_letter_destroy(d);
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
                /* INVALID: the handler did not apply it (rolled back),
                 * a runtime outcome, not a usage error. */
                return rc == KINBOX_ERR_INVALID ? KB_EX_RUNTIME
                                                : kb_exit_of(rc);
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
