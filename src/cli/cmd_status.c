/*
 * cmd_status.c -- `kinbox status`: per consumer lag, start refusals, inbox
 * rows, duplicates counted by the running `kinbox run` processes, dead
 * letters, parked messages; the outbox per destination; the inbox size;
 * the log relay's slot. One library call (kinbox_admin_report()).
 */
#include "common.h"
#include "settings.h"
#include "schema.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A consumer's lag (kinbox_admin_lag() in the report) into jo
 * ("partitions", "lag" or "lag_error"); the lag as text in lagbuf. */
static void
status_lag(ctx_t *x, const kinbox_consumer_report_t *c, json_t *jo,
           char *lagbuf, size_t lsz)
{
        const kinbox_lag_t *lag = c->lag;
        json_t *parts = json_array();
        for (size_t k = 0; lag && k < lag->npartitions; k++) {
                const kinbox_lag_partition_t *p = &lag->partitions[k];
                json_array_append_new(
                    parts,
                    json_pack("{s:s,s:i,s:I,s:I,s:I}", "topic", p->topic,
                              "partition", (int)p->partition, "committed",
                              (json_int_t)p->committed, "high",
                              (json_int_t)p->high, "lag", (json_int_t)p->lag));
        }
        json_object_set_new(jo, "partitions", parts);
        if (lag) {
                snprintf(lagbuf, lsz, "%lld", (long long)lag->total);
                json_object_set_new(jo, "lag", json_integer(lag->total));
                return;
        }
        snprintf(lagbuf, lsz, "unknown");
        json_object_set_new(jo, "lag_error", json_string(c->lag_error));
        if (!x->o.json)
                fprintf(stderr, "kinbox status: %s: lag unknown: %s\n",
                        c->name, c->lag_error);
}

/* The partitions `kinbox run` refuses to start (the consumer's own rule)
 * into jo ("start_refused" or "start_error"), each on stderr. The lag of
 * a refused partition is not the whole story: its committed offset is not
 * where it would start. */
static void
status_refused(ctx_t *x, const kinbox_consumer_report_t *c, json_t *jo)
{
        if (!c->start) {
                json_object_set_new(jo, "start_error",
                                    json_string(c->start_error));
                return;
        }
        json_t *ja = json_array();
        (void)kb_start_refusals(c->start, ja, x->o.json ? NULL : stderr,
                                "kinbox status: ", c->name);
        json_object_set_new(jo, "start_refused", ja);
}

/* A partitioned inbox's ranges (nothing for the plain table). */
static void
status_partitions(const kinbox_status_t *st)
{
        if (!st->npartitions)
                return;
        char from[32], until[32];
        time_t f = (time_t)st->partitions_from;
        time_t u = (time_t)st->partitions_until;
        struct tm tm;
        strftime(from, sizeof(from), "%Y-%m-%d %H:%M", gmtime_r(&f, &tm));
        strftime(until, sizeof(until), "%Y-%m-%d %H:%M", gmtime_r(&u, &tm));
        printf("Inbox partitions: %zu of %lld s, %s to %s UTC; %lld rows in "
               "the catch-all\n",
               st->npartitions, (long long)st->partition_width_s, from, until,
               (long long)st->catchall_rows);
        /* Ranges follow the database's clock: a far host's is news. */
        long long sk = (long long)(st->db_clock_skew_ms / 1000);
        if (sk > 60 || sk < -60)
                printf("This host's clock is %lld s %s the database's "
                       "(ranges follow the database's)\n",
                       sk > 0 ? sk : -sk, sk > 0 ? "ahead of" : "behind");
}

/* A count of the running processes as JSON: null when none runs. */
static json_t *
jcount(int64_t n)
{
        return n >= 0 ? json_integer((json_int_t)n) : json_null();
}

/* One consumer's object of `kinbox status --json`. */
static json_t *
consumer_json(ctx_t *x, int i, const kinbox_consumer_status_t *st,
              const kinbox_consumer_report_t *c)
{
        json_t *jo = json_pack(
            "{s:s,s:s,s:I,s:I,s:I,s:I,s:s}", "consumer", st->name, "group",
            c->group, "inbox_rows", (json_int_t)st->inbox_rows, "dead_letters",
            (json_int_t)st->dead, "replayed", (json_int_t)st->replayed,
            "discarded", (json_int_t)st->discarded, "dedup_hits_note",
            "duplicates are not stored: counted by the running `kinbox "
            "run` processes since their start, recorded in the database "
            "as they change (kinbox_consumer_counters); null when none "
            "runs");
        json_object_set_new(jo, "discovered",
                            json_boolean(x->cfg.consumers[i].discovered));
        json_object_set_new(jo, "parked", json_integer(st->parked));
        json_object_set_new(jo, "held_keys", json_integer(st->held_keys));
        json_object_set_new(jo, "oldest_parked_at",
                            st->parked ? json_string(st->oldest_parked_at)
                                       : json_null());
        return jo;
}

/* One consumer's line of `kinbox status`. */
static void
status_consumer(ctx_t *x, int i, const kinbox_consumer_status_t *st,
                const kinbox_consumer_report_t *c, json_t *jc, table_t *tc)
{
        json_t *jo = consumer_json(x, i, st, c);
        char lagbuf[64];
        status_lag(x, c, jo, lagbuf, sizeof(lagbuf));
        status_refused(x, c, jo);
        json_object_set_new(jo, "dedup_hits", jcount(st->duplicates));
        json_object_set_new(jo, "business_duplicates",
                            jcount(st->business_duplicates));
        json_array_append_new(jc, jo);
        tbl_add(tc, "%s", st->name);
        tbl_add(tc, "%s", c->group);
        tbl_add(tc, "%s", lagbuf);
        if (c->refused >= 0)
                tbl_add(tc, "%d", c->refused);
        else
                tbl_add(tc, "?");
        tbl_add(tc, "%lld", (long long)st->inbox_rows);
        for (int k = 0; k < 2; k++) {
                int64_t n = k ? st->business_duplicates : st->duplicates;
                if (n >= 0)
                        tbl_add(tc, "%lld", (long long)n);
                else
                        tbl_add(tc, "n/a");
        }
        tbl_add(tc, "%lld", (long long)st->dead);
        tbl_add(tc, "%lld", (long long)st->replayed);
        tbl_add(tc, "%lld", (long long)st->discarded);
        tbl_add(tc, "%lld", (long long)st->parked);
        tbl_add(tc, "%lld", (long long)st->held_keys);
        tbl_add(tc, "%s", st->oldest_parked_at);
}

/* relay.source = wal | binlog and d is not an action: its rows are
 * published from the log and never marked (no backlog in the table). */
static bool
from_log(const ctx_t *x, const kinbox_destination_status_t *d)
{
        return kinbox__settings_of(x->cfg.base)->relay_source !=
                   KINBOX__SOURCE_POLL &&
               strncmp(d->destination, KINBOX_OUTBOX_ACTION_PREFIX,
                       strlen(KINBOX_OUTBOX_ACTION_PREFIX));
}

/* One destination's line of the outbox part of `kinbox status`. */
static void
status_destination(const ctx_t *x, const kinbox_destination_status_t *d,
                   json_t *jd, table_t *td)
{
        bool log = from_log(x, d);
        json_t *j = json_pack(
            "{s:s,s:I,s:I,s:I,s:I,s:b}", "destination", d->destination,
            "pending", (json_int_t)d->pending, "oldest_pending_age_s",
            (json_int_t)d->oldest_pending_age_s, "dead", (json_int_t)d->dead,
            "sent_last_hour", (json_int_t)d->sent_last_hour, "paused",
            d->paused);
        json_object_set_new(j, "from_log", json_boolean(log));
        json_array_append_new(jd, j);
        tbl_add(td, "%s", d->destination);
        if (log) {
                tbl_add(td, "in the log");
                tbl_add(td, "-");
        } else {
                tbl_add(td, "%lld", (long long)d->pending);
                tbl_add(td, "%llds", (long long)d->oldest_pending_age_s);
        }
        tbl_add(td, "%lld", (long long)d->dead);
        tbl_add(td, "%lld", (long long)d->sent_last_hour);
        tbl_add(td, "%s", d->paused ? "yes" : "no");
}

/* Everything `kinbox status` shows, in one library call. */
static kinbox_err_t
status_read(ctx_t *x, kinbox_report_t **rp)
{
        const kinbox_conf_t **confs =
            calloc((size_t)x->cfg.nconsumers + 1, sizeof(*confs));
        if (!confs)
                return KINBOX_ERR_NOMEM;
        for (int i = 0; i < x->cfg.nconsumers; i++)
                confs[i] = x->cfg.consumers[i].conf;
        kinbox_err_t rc =
            kinbox_admin_report(x->adm, confs, (size_t)x->cfg.nconsumers,
                                x->cfg.relay_enabled ? x->cfg.relay : NULL,
                                KINBOX_REPORT_KAFKA, rp);
        free(confs);
        return rc;
}

/* relay.source = wal | binlog: the log relay's slot (reader) and the log
 * it keeps; into j (JSON) or printed. */
static void
status_log_relay(const kinbox_report_t *r, json_t *j)
{
        if (!r->log_relay)
                return;
        if (j) {
                json_object_set_new(
                    j, "log_relay",
                    r->log_error[0]
                        ? json_pack("{s:s,s:s}", "slot", r->log_slot, "error",
                                    r->log_error)
                        : json_pack("{s:s,s:I,s:s}", "slot", r->log_slot,
                                    "retained_bytes",
                                    (json_int_t)r->log_retained_bytes,
                                    "wal_status", r->log_state));
                return;
        }
        if (r->log_error[0])
                printf("\nLog relay: slot %s: %s\n", r->log_slot,
                       r->log_error);
        else
                printf(
                    "\nLog relay: slot %s, wal_status %s, %lld bytes of log "
                    "kept for it\n",
                    r->log_slot, r->log_state[0] ? r->log_state : "unknown",
                    (long long)r->log_retained_bytes);
}

/* The JSON document of `kinbox status --json` (takes jc, jd). */
static void
status_json(const kinbox_report_t *r, json_t *jc, json_t *jd)
{
        const kinbox_status_t *st = r->status;
        json_t *j = json_pack("{s:o,s:o,s:I}", "consumers", jc, "outbox", jd,
                              "inbox_rows", (json_int_t)st->inbox_rows);
        if (st->npartitions)
                json_object_set_new(
                    j, "inbox_partitions",
                    json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "width_s",
                              (json_int_t)st->partition_width_s, "count",
                              (json_int_t)st->npartitions, "from",
                              (json_int_t)st->partitions_from, "until",
                              (json_int_t)st->partitions_until,
                              "catchall_rows", (json_int_t)st->catchall_rows,
                              "db_clock_skew_ms",
                              (json_int_t)st->db_clock_skew_ms));
        status_log_relay(r, j);
        json_out(j);
}

/* The text of `kinbox status` (the tables printed and freed). */
static void
status_text(ctx_t *x, const kinbox_report_t *r, table_t *tc, table_t *td)
{
        printf("Consumers (dedup hits and business duplicates: counted by "
               "the running `kinbox run` processes since their start; n/a "
               "when none runs)\n");
        tbl_print(tc, stdout);
        if (x->cfg.nconsumers && x->cfg.consumers[0].discovered)
                printf("(no [consumer.NAME] in %s: these consumers were "
                       "found in the database, their group taken to be "
                       "their name)\n",
                       x->o.config);
        else if (!x->cfg.nconsumers)
                printf("(none: %s configures no consumer and the database "
                       "records none)\n",
                       x->o.config);
        printf("\nOutbox\n");
        tbl_print(td, stdout);
        kinbox__source_t src = kinbox__settings_of(x->cfg.base)->relay_source;
        if (src != KINBOX__SOURCE_POLL)
                printf("(relay.source = %s: Kafka destinations are "
                       "published from the log and their rows never marked: "
                       "\"in the log\"; their backlog is the log relay's "
                       "lag, not rows)\n",
                       src == KINBOX__SOURCE_WAL ? "wal" : "binlog");
        printf("\nInbox size: %lld rows\n", (long long)r->status->inbox_rows);
        status_partitions(r->status);
        status_log_relay(r, NULL);
}

/* Print what was read. */
static void
status_print(ctx_t *x, const kinbox_report_t *r)
{
        const kinbox_status_t *st = r->status;
        json_t *jc = json_array(), *jd = json_array();
        table_t tc, td;
        tbl_init(&tc, 13, "CONSUMER", "GROUP", "LAG", "REFUSED", "INBOX ROWS",
                 "DEDUP HITS", "BUSINESS DUPS", "DEAD", "REPLAYED",
                 "DISCARDED", "PARKED", "HELD KEYS", "OLDEST PARKED");
        tbl_init(&td, 6, "DESTINATION", "PENDING", "OLDEST PENDING", "DEAD",
                 "SENT 1H", "PAUSED");
        for (size_t i = 0; i < st->nconsumers; i++)
                status_consumer(x, (int)i, &st->consumers[i], &r->consumers[i],
                                jc, &tc);
        for (size_t i = 0; i < st->ndestinations; i++)
                status_destination(x, &st->destinations[i], jd, &td);
        if (x->o.json) {
                status_json(r, jc, jd);
                tbl_print(&tc, NULL);
                tbl_print(&td, NULL);
                return;
        }
        json_decref(jc);
        json_decref(jd);
        status_text(x, r, &tc, &td);
}

int
kb_cmd_status(int argc, char **argv)
{
        ctx_t x = {.o = {.cmd = "status"}};
        if (parse_opts(argc, argv, &x.o, "j"))
                return KB_EX_USAGE;
        if (x.o.nargs) {
                fprintf(stderr, "kinbox status: unexpected argument \"%s\"\n",
                        x.o.args[0]);
                return KB_EX_USAGE;
        }
        int ex = ctx_open(&x);
        if (!ex)
                ex = ctx_discover(&x);
        if (ex) {
                ctx_close(&x);
                return ex;
        }
        kinbox_report_t *r = NULL;
        kinbox_err_t rc = status_read(&x, &r);
        if (rc)
                ex = db_fail(&x, rc);
        else
                status_print(&x, r);
        kinbox_report_destroy(r);
        ctx_close(&x);
        return ex;
}
