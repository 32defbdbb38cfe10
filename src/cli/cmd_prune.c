/*
 * cmd_prune.c -- `kinbox prune [--dry-run]`.
 */
#include "common.h"
#include "schema.h"
#include "confval.h"
#include "settings.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "services.h"

/* What a pruning run deleted (or would): JSON, or a line per table. */
static void
prune_print(const ctx_t *x, const kinbox_prune_result_t *res)
{
        const kinbox__settings_t *s = kinbox__settings_of(x->cfg.base);
        char in[32], out[32], src[16];
        kinbox__confval_duration_text(s->inbox_retention, in, sizeof(in));
        kinbox__confval_duration_text(s->outbox_retention, out, sizeof(out));
        kinbox__conf_enum_text("relay.source", (int)s->relay_source, src,
                               sizeof(src));
        const char *verb = x->o.dry_run ? "would delete" : "deleted";
        if (x->o.json)
                json_out(json_pack(
                    "{s:b,s:b,s:I,s:I,s:I,s:s,s:s,s:I,s:I,s:I}", "dry_run",
                    x->o.dry_run, "skipped", res->skipped, "inbox_rows",
                    (json_int_t)res->inbox_rows, "outbox_rows",
                    (json_int_t)res->outbox_rows, "outbox_log_rows",
                    (json_int_t)res->outbox_log_rows, "inbox_retention", in,
                    "outbox_retention", out, "partitions_dropped",
                    (json_int_t)res->partitions_dropped, "partitions_created",
                    (json_int_t)res->partitions_created, "rows_kept",
                    (json_int_t)res->rows_kept));
        else if (res->skipped)
                printf("another instance is pruning (lock held): nothing "
                       "done\n");
        if (x->o.json || res->skipped)
                return;
        printf("inbox:  %s %s%" PRIu64 " rows older than %s\n", verb,
               res->partitions_dropped ? "about " : "", res->inbox_rows, in);
        if (res->partitions_dropped || res->partitions_created)
                printf("inbox:  %s %" PRIu64 " partitions (%" PRIu64
                       " rows kept for dead letters and parked messages), "
                       "created %" PRIu64 " ahead\n",
                       x->o.dry_run ? "would drop" : "dropped",
                       res->partitions_dropped, res->rows_kept,
                       res->partitions_created);
        printf("outbox: %s %" PRIu64 " sent rows older than %s (dead rows "
               "and dead letters are kept)\n",
               verb, res->outbox_rows, out);
        if (s->relay_source != KINBOX__SOURCE_POLL)
                printf("outbox: %s %" PRIu64 " event rows created more than "
                       "%s ago (relay.source = %s: published from the log, "
                       "never marked)\n",
                       verb, res->outbox_log_rows, out, src);
}

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
        /* The schema first: a DELETE on a schema this binary does not
         * know could remove what a newer kinbox keeps. */
        int ex = kb_schema_load(x.o.config, &x.cfg, "prune", false);
        if (ex)
                return ex;
        x.loaded = true;
        char err[2048];
        /* The same refusal as `kinbox run`: pruning inside the redelivery
         * window would forget ids the broker can still redeliver. */
        int refused = kb_retention_check(&x.cfg, "prune");
        if (refused) {
                ctx_close(&x);
                return refused;
        }
        int down = kb_db_reachable(x.cfg.base, "prune", "[database]");
        if (down) {
                ctx_close(&x);
                return down;
        }
        kinbox_prune_result_t res;
        kinbox_err_t rc = kinbox_prune(x.cfg.base, x.o.dry_run, NULL, &res,
                                       err, sizeof(err));
        if (rc) {
                fprintf(stderr, "kinbox prune: %s\n", err);
                ex = kb_exit_of(rc);
        } else {
                prune_print(&x, &res);
        }
        ctx_close(&x);
        return ex;
}
