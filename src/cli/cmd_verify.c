/*
 * cmd_verify.c -- `kinbox verify`: watermarks against inbox rows, dead
 * letters and Kafka's committed offsets; the outbox's stuck rows.
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
/* verify */

/* What verify looked at, for its last line (never OK on nothing). */
typedef struct checked {
        int consumers, partitions, committed;
        int destinations; /* outbox destinations with rows */
} checked_t;

static void
start_gaps(ctx_t *x, const char *name, kinbox_conf_t *conf, json_t *jg,
           int *gaps)
{
        char err[512] = "";
        kinbox_offsets_t *o = kb_start_positions(conf, KINBOX_OFFSETS_READ_LOG,
                                                 err, sizeof(err));
        if (!o) {
                if (!x->o.json)
                        printf("note %s: start positions not checked: %s\n",
                               name, err);
                return;
        }
        *gaps +=
            kb_start_refusals(o, jg, x->o.json ? NULL : stdout, "GAP  ", name);
        kinbox_offsets_destroy(o);
}

/* The partition topic/part of l, or NULL. */
static const kinbox_lag_partition_t *
lag_of(const kinbox_lag_t *l, const char *topic, int32_t part)
{
        for (size_t i = 0; l && i < l->npartitions; i++)
                if (l->partitions[i].partition == part &&
                    !strcmp(l->partitions[i].topic, topic))
                        return &l->partitions[i];
        return NULL;
}

static int
verify_consumer(ctx_t *x, const char *name, kinbox_conf_t *conf, json_t *jc,
                int *gaps, checked_t *ck)
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
        /* Where `kinbox run` would start each partition (the consumer's
         * own rule, kinbox_startpos_classify(), and the record at W-1
         * read again): every refusal is a gap, Kafka's committed offset
         * past the DB watermark among them. */
        start_gaps(x, name, conf, jg, gaps);
        kinbox_lag_t *l = NULL;
        char err[1024] = "";
        if (kinbox_admin_lag(x->adm, conf, &l))
                snprintf(err, sizeof(err), "%s", kinbox_admin_errstr(x->adm));
        for (size_t i = 0; i < vr->npartitions; i++) {
                const kinbox_verify_partition_t *p = &vr->partitions[i];
                const char *topic = p->topic;
                int32_t part = p->partition;
                long long wm = p->watermark;
                long long covered = p->rows;
                long long lo = p->lowest >= 0 ? p->lowest : wm;
                long long committed = -1;
                const kinbox_lag_partition_t *tp = lag_of(l, topic, part);
                if (tp) {
                        committed = tp->committed;
                        ck->committed++;
                }
                ck->partitions++;
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
        size_t vr_partitions = vr->npartitions;
        kinbox_verify_result_destroy(vr);
        kinbox_lag_destroy(l);
        ck->consumers++;
        if (!vr_partitions && !x->o.json)
                printf("note %s: no watermark recorded (nothing consumed "
                       "yet): nothing to check\n",
                       name);
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

/* The last line: what was checked and the verdict. Nothing checked (no
 * consumer with a watermark) is not OK: KB_EX_NOTFOUND. Takes jc, jo. */
static int
verify_summary(ctx_t *x, const checked_t *ck, int gaps, json_t *jc, json_t *jo)
{
        bool nothing = !ck->partitions && !ck->destinations && !gaps;
        const char *found =
            x->cfg.nconsumers && x->cfg.consumers[0].discovered
                ? " (found in the database: no [consumer.NAME] configured)"
                : "";
        if (x->o.json) {
                json_out(json_pack(
                    "{s:o,s:o,s:i,s:b,s:{s:i,s:i,s:i,s:i}}", "consumers", jc,
                    "outbox", jo, "gaps", gaps, "ok", !gaps && !nothing,
                    "checked", "consumers", ck->consumers, "partitions",
                    ck->partitions, "committed_offsets", ck->committed,
                    "outbox_destinations", ck->destinations));
        } else {
                json_decref(jc);
                json_decref(jo);
                if (nothing)
                        printf("NOTHING CHECKED: %d consumer(s)%s, no "
                               "partition with a watermark, an empty "
                               "outbox\n",
                               ck->consumers, found);
                else
                        printf("%s: %d gap(s); checked %d consumer(s)%s, %d "
                               "partition(s) (%d against Kafka's committed "
                               "offset), %d outbox destination(s)\n",
                               gaps ? "FAILED" : "OK", gaps, ck->consumers,
                               found, ck->partitions, ck->committed,
                               ck->destinations);
        }
        return gaps ? KB_EX_RUNTIME : nothing ? KB_EX_NOTFOUND : KB_EX_OK;
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
        if (!ex)
                ex = ctx_discover(&x);
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
        checked_t ck = {0};
        json_t *jc = json_array();
        for (int i = 0; i < x.cfg.nconsumers && !ex; i++) {
                if (x.o.consumer &&
                    strcmp(x.o.consumer, x.cfg.consumers[i].name))
                        continue;
                ex = verify_consumer(&x, x.cfg.consumers[i].name,
                                     x.cfg.consumers[i].conf, jc, &gaps, &ck);
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
        if (!(rc = kinbox_admin_outbox_summary(x.adm, &r)))
                ck.destinations = (int)kinbox_rows_count(r);
        kinbox_rows_destroy(r);
        if (rc) {
                json_decref(jc);
                json_decref(jo);
                ex = db_fail(&x, rc);
                goto out;
        }
        ex = verify_summary(&x, &ck, gaps, jc, jo);
out:
        ctx_close(&x);
        return ex;
}
