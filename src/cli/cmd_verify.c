/*
 * cmd_verify.c -- `kinbox verify`: watermarks against inbox rows, dead
 * letters, the start positions and Kafka's committed offsets; the outbox's
 * stuck rows. One library call (kinbox_admin_verify()).
 */
#include "common.h"
#include "schema.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What verify looked at, for its last line (never OK on nothing). */
typedef struct checked {
        int consumers, partitions, committed;
        int destinations; /* outbox destinations with rows */
} checked_t;

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

/* Rows at or past a partition's watermark: each a gap. */
static void
ahead_gaps(ctx_t *x, const kinbox_verify_consumer_t *c, json_t *jg, int *gaps)
{
        for (size_t i = 0; i < c->rows->nahead; i++) {
                const kinbox_verify_ahead_t *a = &c->rows->ahead[i];
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
                        printf("GAP  %s: %s\n", c->name, msg);
                (*gaps)++;
        }
}

/* Where `kinbox run` would start each partition (the consumer's own rule,
 * kinbox_startpos_classify(), and the record at W-1 read again): every
 * refusal is a gap, Kafka's committed offset past the DB watermark among
 * them. */
static void
start_gaps(ctx_t *x, const kinbox_verify_consumer_t *c, json_t *jg, int *gaps)
{
        if (!c->start) {
                if (!x->o.json)
                        printf("note %s: start positions not checked: %s\n",
                               c->name, c->start_error);
                return;
        }
        *gaps += kb_start_refusals(c->start, jg, x->o.json ? NULL : stdout,
                                   "GAP  ", c->name);
}

/* Per partition: the watermark, Kafka's committed offset and the offsets
 * below the watermark with and without a row. */
static json_t *
partitions_checked(ctx_t *x, const kinbox_verify_consumer_t *c, checked_t *ck)
{
        json_t *jp = json_array();
        for (size_t i = 0; i < c->rows->npartitions; i++) {
                const kinbox_verify_partition_t *p = &c->rows->partitions[i];
                long long wm = p->watermark, covered = p->rows;
                long long lo = p->lowest >= 0 ? p->lowest : wm;
                long long committed = -1;
                const kinbox_lag_partition_t *tp =
                    lag_of(c->lag, p->topic, p->partition);
                if (tp) {
                        committed = tp->committed;
                        ck->committed++;
                }
                ck->partitions++;
                /* Offsets below the watermark without a row: duplicates
                 * of an earlier id, pruned rows, or missing. Not a gap by
                 * itself (the inbox cannot tell which). */
                long long none = wm - lo - covered;
                none = none > 0 ? none : 0;
                json_array_append_new(
                    jp, json_pack("{s:s,s:i,s:I,s:I,s:I,s:I}", "topic",
                                  p->topic, "partition", (int)p->partition,
                                  "watermark", (json_int_t)wm, "committed",
                                  (json_int_t)committed, "rows",
                                  (json_int_t)covered, "offsets_without_row",
                                  (json_int_t)none));
                if (!x->o.json)
                        printf("ok   %s: %s [%d] watermark %lld, Kafka "
                               "committed %lld, %lld offset(s) with a row, "
                               "%lld without (duplicates or pruned)\n",
                               c->name, p->topic, (int)p->partition, wm,
                               committed, covered, none);
        }
        return jp;
}

static void
verify_consumer(ctx_t *x, const kinbox_verify_consumer_t *c, json_t *jc,
                int *gaps, checked_t *ck)
{
        json_t *jg = json_array();
        ahead_gaps(x, c, jg, gaps);
        start_gaps(x, c, jg, gaps);
        json_t *jp = partitions_checked(x, c, ck);
        ck->consumers++;
        if (!c->rows->npartitions && !x->o.json)
                printf("note %s: no watermark recorded (nothing consumed "
                       "yet): nothing to check\n",
                       c->name);
        if (!c->lag && !x->o.json)
                printf("note %s: Kafka committed offsets not checked: %s\n",
                       c->name, c->lag_error);
        json_t *jo = json_pack("{s:s,s:o,s:o}", "consumer", c->name, "gaps",
                               jg, "partitions", jp);
        if (!c->lag)
                json_object_set_new(jo, "broker_error",
                                    json_string(c->lag_error));
        json_array_append_new(jc, jo);
}

/* The outbox: rows pending longer than the threshold, each a gap. */
static json_t *
outbox_gaps(ctx_t *x, const kinbox_verify_report_t *r, int *gaps)
{
        json_t *jo = json_array();
        for (size_t i = 0; i < r->nstuck; i++) {
                const kinbox_verify_stuck_t *s = &r->stuck[i];
                char msg[512];
                snprintf(msg, sizeof(msg),
                         "outbox %s: %" PRId64 " row(s) pending longer than "
                         "%s (oldest id %" PRId64 ", %" PRId64 "s old)",
                         s->destination, s->rows,
                         x->o.older_than ? x->o.older_than : "5m",
                         s->oldest_id, s->oldest_age_s);
                json_array_append_new(jo, json_string(msg));
                if (!x->o.json)
                        printf("GAP  %s\n", msg);
                (*gaps)++;
        }
        return jo;
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

/* Everything verify checks, in one library call: the consumers (all, or
 * only x->o.consumer) and the outbox. */
static int
verify_run(ctx_t *x, int64_t older)
{
        const kinbox_conf_t **confs =
            calloc((size_t)x->cfg.nconsumers + 1, sizeof(*confs));
        size_t n = 0;
        for (int i = 0; confs && i < x->cfg.nconsumers; i++)
                if (!x->o.consumer ||
                    !strcmp(x->o.consumer, x->cfg.consumers[i].name))
                        confs[n++] = x->cfg.consumers[i].conf;
        kinbox_verify_report_t *r = NULL;
        kinbox_err_t rc =
            confs ? kinbox_admin_verify(x->adm, confs, n, older, &r)
                  : KINBOX_ERR_NOMEM;
        free(confs);
        if (rc)
                return db_fail(x, rc);
        int gaps = 0;
        checked_t ck = {0};
        json_t *jc = json_array();
        for (size_t i = 0; i < r->nconsumers; i++)
                verify_consumer(x, &r->consumers[i], jc, &gaps, &ck);
        json_t *jo = outbox_gaps(x, r, &gaps);
        ck.destinations = (int)r->ndestinations;
        kinbox_verify_report_destroy(r);
        return verify_summary(x, &ck, gaps, jc, jo);
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
        kinbox_conf_t *only = NULL;
        if (!ex && x.o.consumer &&
            !consumer_section(&x, x.o.consumer, &only)) {
                fprintf(stderr, "kinbox verify: %s has no [consumer.%s]\n",
                        x.o.config, x.o.consumer);
                ex = KB_EX_NOTFOUND;
        }
        if (!ex)
                ex = verify_run(&x, older);
        ctx_close(&x);
        return ex;
}
