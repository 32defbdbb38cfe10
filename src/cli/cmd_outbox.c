/*
 * cmd_outbox.c -- `kinbox outbox list|requeue|cancel|pause|resume|resend`.
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
outbox_fail(ctx_t *x, kinbox_err_t rc, const char *what)
{
        if (rc == KINBOX_ERR_NOT_FOUND) {
                fprintf(stderr, "kinbox outbox: %s\n", what);
                return KB_EX_NOTFOUND;
        }
        fprintf(stderr, "kinbox outbox: %s\n", kinbox_admin_errstr(x->adm));
        return kb_exit_of(rc);
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
outbox_list(ctx_t *x, kinbox_outbox_status_t st)
{
        list_ctx_t l = {.json = x->o.json, .ja = json_array()};
        tbl_init(&l.t, 8, "ID", "STATUS", "DESTINATION", "IDEM KEY",
                 "AGGREGATE", "ATTEMPTS", "CREATED", "LAST ERROR");
        kinbox_err_t rc =
            kinbox_outbox_list(x->adm, st, x->o.destination, x->o.after,
                               (size_t)x->o.limit, on_row, &l);
        if (rc) {
                tbl_print(&l.t, NULL);
                json_decref(l.ja);
                return outbox_fail(x, rc, "");
        }
        rows_out(x->o.json, &l.t, l.ja);
        return KB_EX_OK;
}

/* kinbox outbox requeue|cancel --destination DEST (kind 2|3) */
static int
outbox_destination(ctx_t *x, int kind)
{
        uint64_t n = 0;
        const char *dest = x->o.destination;
        kinbox_err_t rc =
            kind == 2 ? kinbox_outbox_requeue_destination(x->adm, dest, &n)
                      : kinbox_outbox_cancel_destination(x->adm, dest, &n);
        /* Nothing changed: a destination without any row is a mistake
         * (typo) the operator must see, not "0 rows". */
        int any = 0;
        if (!rc && !n &&
            !(rc = kinbox_outbox_list(x->adm, KINBOX_OUTBOX_ANY, dest, 0, 1,
                                      count_row, &any)) &&
            !any)
                rc = KINBOX_ERR_NOT_FOUND;
        if (rc == KINBOX_ERR_NOT_FOUND) {
                char what[300];
                snprintf(what, sizeof(what),
                         "no outbox row has destination \"%.200s\"", dest);
                return outbox_fail(x, rc, what);
        }
        if (rc)
                return outbox_fail(x, rc, "");
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
outbox_row(ctx_t *x, int kind, int64_t id)
{
        kinbox_err_t rc = kind == 2 ? kinbox_outbox_requeue(x->adm, id)
                                    : kinbox_outbox_cancel(x->adm, id);
        char what[160];
        snprintf(what, sizeof(what), "no %s outbox row with id %" PRId64,
                 kind == 2 ? "dead or canceled" : "pending", id);
        if (rc)
                return outbox_fail(x, rc, what);
        if (x->o.json)
                json_out(json_pack("{s:I,s:s}", "id", (json_int_t)id, "status",
                                   kind == 2 ? "pending" : "canceled"));
        else
                printf("outbox row %" PRId64 ": %s\n", id,
                       kind == 2 ? "requeued" : "canceled");
        return KB_EX_OK;
}

/* --since: "YYYY-MM-DD[T ]HH:MM:SS[Z]" (UTC) or a duration back from
 * now ("2h"). 0 or -1. */
static int
since_ms(const char *s, int64_t *ms)
{
        struct tm tm;
        memset(&tm, 0, sizeof(tm));
        const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
        if (!end)
                end = strptime(s, "%Y-%m-%d %H:%M:%S", &tm);
        if (end && (!*end || !strcmp(end, "Z"))) {
                *ms = (int64_t)timegm(&tm) * 1000;
                return 0;
        }
        int64_t back;
        if (kb_duration_ms(s, &back))
                return -1;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        *ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 - back;
        return 0;
}

/* kinbox outbox resend --since TIME */
static int
outbox_resend(ctx_t *x)
{
        int64_t since = 0, n = 0;
        if (!x->o.since || since_ms(x->o.since, &since)) {
                fprintf(stderr, "usage: kinbox outbox resend --since TIME "
                                "-c FILE (TIME: 2026-12-06T05:00:00 in UTC, "
                                "or a duration back from now: 2h)\n");
                return KB_EX_USAGE;
        }
        char err[1024] = "";
        kinbox_conf_t *conf = x->cfg.relay ? x->cfg.relay : x->cfg.base;
        kinbox_err_t rc =
            kinbox_outbox_resend(conf, since, &n, err, sizeof(err));
        if (rc) {
                fprintf(stderr,
                        "kinbox outbox resend: %s (%" PRId64
                        " rows published first)\n",
                        err, n);
                return rc == KINBOX_ERR_CONFIG || rc == KINBOX_ERR_STATE
                           ? KB_EX_USAGE
                           : KB_EX_RUNTIME;
        }
        if (x->o.json)
                json_out(json_pack("{s:I}", "published", (json_int_t)n));
        else
                printf("%" PRId64 " rows published again\n", n);
        return KB_EX_OK;
}

int
kb_cmd_outbox(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "outbox"}};
        static const char *const subs[] = {
            "list", "requeue", "cancel", "pause", "resume", "resend", NULL};
        int ex, kind = subcommand("outbox", argc, argv, subs, &ex);
        if (!kind)
                return ex;
        const char *sub = argv[1];
        if (parse_opts(argc - 1, argv + 1, &x.o,
                       kind == 1   ? "jsdla"
                       : kind <= 3 ? "jd"
                       : kind == 6 ? "jS"
                                   : "j"))
                return KB_EX_USAGE;
        if (kind == 6) {
                ex = ctx_open(&x);
                if (!ex)
                        ex = outbox_resend(&x);
                ctx_close(&x);
                return ex;
        }
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
        if (kind == 1)
                ex = outbox_list(&x, st);
        else if (x.o.destination)
                ex = outbox_destination(&x, kind);
        else
                ex = outbox_row(&x, kind, id);
        ctx_close(&x);
        return ex;
}
