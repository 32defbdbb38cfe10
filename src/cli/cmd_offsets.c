/*
 * cmd_offsets.c -- `kinbox offsets list|reset`: a consumer's start
 * positions (the database's watermark, Kafka's committed offset, the
 * log's range, the verdict `kinbox run` applies) and the reset that moves
 * both sides to the same position (kinbox_offsets_list(),
 * kinbox_offsets_reset(); docs/failures.md, "Start positions").
 */
#include "common.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *
pos(char *b, size_t sz, int64_t v)
{
        if (v < 0)
                snprintf(b, sz, "-");
        else
                snprintf(b, sz, "%" PRId64, v);
        return b;
}

static json_t *
jpos(int64_t v)
{
        return v < 0 ? json_null() : json_integer(v);
}

/* One partition into the table and the JSON array. */
static void
add_part(const kinbox_offsets_t *o, const kinbox_offsets_partition_t *p,
         bool reset, table_t *t, json_t *ja)
{
        char b[5][24];
        json_t *j = json_pack(
            "{s:s,s:s,s:s,s:i,s:o,s:o,s:o,s:o,s:s,s:b,s:s}", "consumer",
            o->consumer, "group", o->group, "topic", p->topic, "partition",
            (int)p->partition, "watermark", jpos(p->watermark), "committed",
            jpos(p->committed), "log_start", jpos(p->low), "log_end",
            jpos(p->high), "verdict", kinbox_startpos_name(p->verdict),
            "refused", kinbox_startpos_refused(p->verdict) != 0, "reason",
            kinbox_startpos_reason(p->verdict));
        if (p->identity_checked >= 0)
                json_object_set_new(j, "identity_matches",
                                    json_boolean(p->identity_checked));
        if (reset)
                json_object_set_new(j, "new_position", jpos(p->target));
        json_array_append_new(ja, j);
        tbl_add(t, "%s", o->consumer);
        tbl_add(t, "%s", p->topic);
        tbl_add(t, "%d", (int)p->partition);
        tbl_add(t, "%s", pos(b[0], sizeof(b[0]), p->watermark));
        tbl_add(t, "%s", pos(b[1], sizeof(b[1]), p->committed));
        tbl_add(t, "%s", pos(b[2], sizeof(b[2]), p->low));
        tbl_add(t, "%s", pos(b[3], sizeof(b[3]), p->high));
        tbl_add(t, "%s%s", kinbox_startpos_name(p->verdict),
                kinbox_startpos_refused(p->verdict) ? " (REFUSED)" : "");
        if (reset)
                tbl_add(t, "%s", pos(b[4], sizeof(b[4]), p->target));
}

static void
tbl_head(table_t *t, bool reset)
{
        if (reset)
                tbl_init(t, 9, "CONSUMER", "TOPIC", "PARTITION", "WATERMARK",
                         "COMMITTED", "LOG START", "LOG END", "VERDICT",
                         "NEW POSITION");
        else
                tbl_init(t, 8, "CONSUMER", "TOPIC", "PARTITION", "WATERMARK",
                         "COMMITTED", "LOG START", "LOG END", "VERDICT");
}

/* The reasons of the refused partitions, after the table. */
static void
print_refusals(const kinbox_offsets_t *o)
{
        for (size_t i = 0; i < o->npartitions; i++) {
                const kinbox_offsets_partition_t *p = &o->partitions[i];
                if (!kinbox_startpos_refused(p->verdict))
                        continue;
                printf("%s (group %s) %s [%d]: %s\n", o->consumer, o->group,
                       p->topic, (int)p->partition,
                       kinbox_startpos_reason(p->verdict));
        }
}

static int
offsets_list(ctx_t *x)
{
        table_t t;
        tbl_head(&t, false);
        json_t *ja = json_array();
        kinbox_offsets_t **all =
            calloc((size_t)x->cfg.nconsumers + 1, sizeof(*all));
        int ex = all ? KB_EX_OK : KB_EX_RUNTIME, found = 0;
        for (int i = 0; all && i < x->cfg.nconsumers && !ex; i++) {
                kinbox_conf_t *conf = x->cfg.consumers[i].conf;
                if (x->o.consumer &&
                    strcmp(x->o.consumer, x->cfg.consumers[i].name))
                        continue;
                found++;
                kinbox_admin_t *adm = kinbox_admin_new(conf, NULL, 0);
                kinbox_err_t rc =
                    adm ? kinbox_offsets_list(adm, conf, x->o.topic,
                                              x->o.partition,
                                              KINBOX_OFFSETS_READ_LOG, &all[i])
                        : KINBOX_ERR_CONFIG;
                if (rc) {
                        fprintf(stderr, "kinbox offsets list: %s: %s\n",
                                x->cfg.consumers[i].name,
                                adm ? kinbox_admin_errstr(adm) : "");
                        ex = kb_exit_of(rc);
                }
                kinbox_admin_destroy(adm);
                for (size_t k = 0; all[i] && k < all[i]->npartitions; k++)
                        add_part(all[i], &all[i]->partitions[k], false, &t,
                                 ja);
        }
        if (!found && x->o.consumer) {
                fprintf(stderr, "kinbox offsets: %s has no [consumer.%s]\n",
                        x->o.config, x->o.consumer);
                ex = KB_EX_NOTFOUND;
        }
        if (!ex) {
                rows_out(x->o.json, &t, ja);
                for (int i = 0; !x->o.json && i < x->cfg.nconsumers; i++)
                        if (all[i])
                                print_refusals(all[i]);
        } else {
                tbl_print(&t, NULL);
                json_decref(ja);
        }
        for (int i = 0; all && i < x->cfg.nconsumers; i++)
                kinbox_offsets_destroy(all[i]);
        free(all);
        return ex;
}

static int
offsets_reset(ctx_t *x)
{
        kinbox_conf_t *conf = NULL;
        if (!consumer_section(x, x->o.consumer, &conf)) {
                fprintf(stderr, "kinbox offsets: %s has no [consumer.%s]\n",
                        x->o.config, x->o.consumer);
                return KB_EX_NOTFOUND;
        }
        char err[512] = "";
        kinbox_admin_t *adm = kinbox_admin_new(conf, err, sizeof(err));
        if (!adm) {
                fprintf(stderr, "kinbox offsets reset: %s\n", err);
                return KB_EX_USAGE;
        }
        kinbox_offsets_t *o = NULL;
        kinbox_err_t rc = kinbox_offsets_reset(
            adm, conf, x->o.topic, x->o.partition, x->o.to, x->o.dry_run, &o);
        int ex = KB_EX_OK;
        if (rc) {
                fprintf(stderr, "kinbox offsets reset: %s\n",
                        kinbox_admin_errstr(adm));
                ex = kb_exit_of(rc);
        } else {
                table_t t;
                tbl_head(&t, true);
                json_t *ja = json_array();
                for (size_t k = 0; k < o->npartitions; k++)
                        add_part(o, &o->partitions[k], true, &t, ja);
                if (x->o.json) {
                        tbl_print(&t, NULL);
                        json_out(json_pack("{s:s,s:s,s:b,s:o}", "consumer",
                                           o->consumer, "group", o->group,
                                           "dry_run", x->o.dry_run,
                                           "partitions", ja));
                } else {
                        json_decref(ja);
                        tbl_print(&t, stdout);
                        printf(x->o.dry_run
                                   ? "dry run: nothing changed (run without "
                                     "--dry-run to move both sides)\n"
                                   : "reset: group %s committed and "
                                     "consumer %s's watermarks set to the "
                                     "new positions\n",
                               o->group, o->consumer);
                }
        }
        kinbox_offsets_destroy(o);
        kinbox_admin_destroy(adm);
        return ex;
}

int
kb_cmd_offsets(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "offsets"}};
        static const char *const subs[] = {"list", "reset", NULL};
        int ex, kind = subcommand("offsets", argc, argv, subs, &ex);
        if (!kind)
                return ex;
        if (parse_opts(argc - 1, argv + 1, &x.o,
                       kind == 1 ? "jCTP" : "jCTPtn"))
                return KB_EX_USAGE;
        if (x.o.nargs) {
                fprintf(stderr, "kinbox offsets: unexpected argument \"%s\"\n",
                        x.o.args[0]);
                return KB_EX_USAGE;
        }
        if (x.o.partition >= 0 && !x.o.topic) {
                fprintf(stderr, "kinbox offsets: --partition needs --topic\n");
                return KB_EX_USAGE;
        }
        if (kind == 2 && (!x.o.consumer || !x.o.to)) {
                fprintf(stderr, "kinbox offsets reset: --consumer NAME and "
                                "--to earliest|latest|committed|watermark|"
                                "OFFSET are required\n");
                return KB_EX_USAGE;
        }
        ex = ctx_open(&x);
        if (!ex)
                ex = kind == 1 ? offsets_list(&x) : offsets_reset(&x);
        ctx_close(&x);
        return ex;
}
