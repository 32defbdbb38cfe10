/*
 * cmd_status.c -- `kinbox status`: per consumer lag, inbox rows, dedup
 * hits (from a local `kinbox run`), dead letters, parked messages; the
 * outbox per destination; the inbox size. The database's part is one
 * library call (kinbox_admin_status()); Kafka's lag and the local process's
 * counters are asked beside it.
 */
#include "common.h"
#include "relay_log.h"
#include "settings.h"
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

/* A consumer's counter of messages with result in a /metrics text: 0
 * when the process runs the consumer but has not counted one yet (the
 * series appears with its first message), -1 when the text is absent or
 * does not name the consumer. */
static long long
dedup_hits(const char *text, const char *consumer, const char *result)
{
        char series[400];
        snprintf(series, sizeof(series),
                 "\nkinbox_consumer_messages_total{consumer=\"%s\","
                 "result=\"%s\"} ",
                 consumer, result);
        const char *p = text ? strstr(text, series) : NULL;
        if (p)
                return strtoll(p + strlen(series), NULL, 10);
        snprintf(series, sizeof(series), "{consumer=\"%s\"", consumer);
        return text && strstr(text, series) ? 0 : -1;
}

/* Committed offsets, high watermarks and lag of a consumer's group
 * (kinbox_admin_lag()), into jo ("partitions", "lag" or "lag_error"); the
 * lag as text in lagbuf. */
static void
status_lag(ctx_t *x, kinbox_conf_t *conf, const char *name, json_t *jo,
           char *lagbuf, size_t lsz)
{
        kinbox_lag_t *lag = NULL;
        (void)kinbox_admin_lag(x->adm, conf, &lag);
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
        } else {
                const char *err = kinbox_admin_errstr(x->adm);
                snprintf(lagbuf, lsz, "unknown");
                json_object_set_new(jo, "lag_error", json_string(err));
                if (!x->o.json)
                        fprintf(stderr, "kinbox status: %s: lag unknown: %s\n",
                                name, err);
        }
        kinbox_lag_destroy(lag);
}

/* The partitions `kinbox run` refuses to start (kinbox_offsets_list(),
 * the consumer's own rule) into jo ("start_refused"), each on stderr;
 * their number, -1 when unknown. The lag of a refused partition is not
 * the whole story: its committed offset is not where it would start. */
static int
status_refused(ctx_t *x, kinbox_conf_t *conf, const char *name, json_t *jo)
{
        char err[512] = "";
        kinbox_offsets_t *o = kb_start_positions(conf, 0, err, sizeof(err));
        if (!o) {
                json_object_set_new(jo, "start_error", json_string(err));
                return -1;
        }
        json_t *ja = json_array();
        int n = kb_start_refusals(o, ja, x->o.json ? NULL : stderr,
                                  "kinbox status: ", name);
        json_object_set_new(jo, "start_refused", ja);
        kinbox_offsets_destroy(o);
        return n;
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

/* One consumer's line of `kinbox status`. */
static void
status_consumer(ctx_t *x, int i, const kinbox_consumer_status_t *st,
                const char *live, json_t *jc, table_t *tc)
{
        kinbox_conf_t *conf = x->cfg.consumers[i].conf;
        const char *name = st->name;
        json_t *jo = json_pack(
            "{s:s,s:s,s:I,s:I,s:I,s:I,s:s}", "consumer", name, "group",
            group_of(conf), "inbox_rows", (json_int_t)st->inbox_rows,
            "dead_letters", (json_int_t)st->dead, "replayed",
            (json_int_t)st->replayed, "discarded", (json_int_t)st->discarded,
            "dedup_hits_note",
            "duplicates are not stored: counted by the running process "
            "since its start (kinbox_consumer_messages_total{result="
            "\"duplicate\"} and {result=\"business_duplicate\"} on "
            "/metrics)");
        json_object_set_new(jo, "discovered",
                            json_boolean(x->cfg.consumers[i].discovered));
        json_object_set_new(jo, "parked", json_integer(st->parked));
        json_object_set_new(jo, "held_keys", json_integer(st->held_keys));
        json_object_set_new(jo, "oldest_parked_at",
                            st->parked ? json_string(st->oldest_parked_at)
                                       : json_null());
        char lagbuf[64];
        status_lag(x, conf, name, jo, lagbuf, sizeof(lagbuf));
        int refused = status_refused(x, conf, name, jo);
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
        if (refused >= 0)
                tbl_add(tc, "%d", refused);
        else
                tbl_add(tc, "?");
        tbl_add(tc, "%lld", (long long)st->inbox_rows);
        for (int k = 0; k < 2; k++) {
                long long n = k ? biz : hits;
                if (n >= 0)
                        tbl_add(tc, "%lld", n);
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

/* The database's part of `kinbox status`, in one library call. */
static kinbox_err_t
status_read(ctx_t *x, kinbox_status_t **stp)
{
        const char **names =
            calloc((size_t)x->cfg.nconsumers + 1, sizeof(*names));
        if (!names)
                return KINBOX_ERR_NOMEM;
        for (int i = 0; i < x->cfg.nconsumers; i++)
                names[i] = x->cfg.consumers[i].name;
        kinbox_err_t rc =
            kinbox_admin_status(x->adm, names, (size_t)x->cfg.nconsumers, stp);
        free(names);
        return rc;
}

/* relay.source = wal | binlog: the log relay's slot (reader) and the log
 * it keeps; into j (JSON) or printed. */
static void
status_log_relay(const ctx_t *x, json_t *j)
{
        if (!x->cfg.relay_enabled ||
            kinbox__settings_of(x->cfg.relay)->relay_source ==
                KINBOX__SOURCE_POLL)
                return;
        char slot[128] = "", err[600];
        kinbox__loglag_t lag;
        int rc = kinbox__relay_log_lag(x->cfg.relay, slot, sizeof(slot), &lag,
                                       err, sizeof(err));
        if (j) {
                json_object_set_new(
                    j, "log_relay",
                    rc ? json_pack("{s:s,s:s}", "slot", slot, "error", err)
                       : json_pack("{s:s,s:I,s:s}", "slot", slot,
                                   "retained_bytes",
                                   (json_int_t)lag.retained_bytes,
                                   "wal_status", lag.state));
                return;
        }
        if (rc)
                printf("\nLog relay: slot %s: %s\n", slot, err);
        else
                printf(
                    "\nLog relay: slot %s, wal_status %s, %lld bytes of log "
                    "kept for it\n",
                    slot, lag.state[0] ? lag.state : "unknown",
                    (long long)lag.retained_bytes);
}

/* Print what was read (and the broker's lag, the local process's dedup
 * counters beside it). */
static void
status_print(ctx_t *x, const kinbox_status_t *st, const char *live)
{
        json_t *jc = json_array(), *jd = json_array();
        table_t tc, td;
        tbl_init(&tc, 13, "CONSUMER", "GROUP", "LAG", "REFUSED", "INBOX ROWS",
                 "DEDUP HITS", "BUSINESS DUPS", "DEAD", "REPLAYED",
                 "DISCARDED", "PARKED", "HELD KEYS", "OLDEST PARKED");
        tbl_init(&td, 6, "DESTINATION", "PENDING", "OLDEST PENDING", "DEAD",
                 "SENT 1H", "PAUSED");
        for (size_t i = 0; i < st->nconsumers; i++)
                status_consumer(x, (int)i, &st->consumers[i], live, jc, &tc);
        for (size_t i = 0; i < st->ndestinations; i++)
                status_destination(x, &st->destinations[i], jd, &td);
        if (x->o.json) {
                json_t *j =
                    json_pack("{s:o,s:o,s:I}", "consumers", jc, "outbox", jd,
                              "inbox_rows", (json_int_t)st->inbox_rows);
                if (st->npartitions)
                        json_object_set_new(
                            j, "inbox_partitions",
                            json_pack(
                                "{s:I,s:I,s:I,s:I,s:I,s:I}", "width_s",
                                (json_int_t)st->partition_width_s, "count",
                                (json_int_t)st->npartitions, "from",
                                (json_int_t)st->partitions_from, "until",
                                (json_int_t)st->partitions_until,
                                "catchall_rows", (json_int_t)st->catchall_rows,
                                "db_clock_skew_ms",
                                (json_int_t)st->db_clock_skew_ms));
                status_log_relay(x, j);
                json_out(j);
                tbl_print(&tc, NULL);
                tbl_print(&td, NULL);
                return;
        }
        json_decref(jc);
        json_decref(jd);
        printf("Consumers (dedup hits and business duplicates: "
               "counted by the local `kinbox run` since its start, "
               "from [metrics] listen; n/a when not reachable)\n");
        tbl_print(&tc, stdout);
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
        tbl_print(&td, stdout);
        if (kinbox__settings_of(x->cfg.base)->relay_source !=
            KINBOX__SOURCE_POLL)
                printf("(relay.source = %s: Kafka destinations are "
                       "published from the log and their rows never marked: "
                       "\"in the log\"; their backlog is the log relay's "
                       "lag, not rows)\n",
                       kinbox_conf_get(x->cfg.base, "relay.source"));
        printf("\nInbox size: %lld rows\n", (long long)st->inbox_rows);
        status_partitions(st);
        status_log_relay(x, NULL);
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
        kinbox_status_t *st = NULL;
        kinbox_err_t rc = status_read(&x, &st);
        if (rc) {
                ex = db_fail(&x, rc);
        } else {
                /* listen = HOST:0: the port `kinbox run` bound */
                char listen[300];
                const char *l = x.cfg.metrics_listen;
                const char *colon = l ? strrchr(l, ':') : NULL;
                int bound =
                    colon && !strcmp(colon, ":0") ? kb_port_read(&x.cfg) : 0;
                if (bound) {
                        snprintf(listen, sizeof(listen), "%.*s:%d",
                                 (int)(colon - l), l, bound);
                        l = listen;
                }
                char *live = local_metrics(l);
                status_print(&x, st, live);
                free(live);
        }
        kinbox_status_destroy(st);
        ctx_close(&x);
        return ex;
}
