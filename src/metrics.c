/*
 * metrics.c -- a small process-wide metrics registry rendered as
 * Prometheus text (exposition format 0.0.4).
 *
 * The families are fixed here, so names, types, help texts and buckets
 * live in one place (and the list of metrics in docs/metrics.md can be
 * checked against it). Series are created on first use.
 */
#include "metrics.h"
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum mtype { M_COUNTER, M_GAUGE, M_HIST };

#define NB_MAX 16

typedef struct family {
        const char *name;
        enum mtype type;
        const char *help;
        const double *buckets; /* M_HIST, ascending; +Inf implied */
        int nbuckets;
} family_t;

static const double b_seconds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                   0.025,  0.05,  0.1,    0.25,  0.5,
                                   1,      2.5,   5,      10,    30};
static const double b_size[] = {1,   2,   5,    10,   25,   50,   100,
                                250, 500, 1000, 2500, 5000, 10000};
static const double b_latency[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                   0.25,  0.5,   1,    2.5,   5,    10,
                                   30,    60,    300,  3600};

#define HIST(b) b, (int)(sizeof(b) / sizeof((b)[0]))

static const family_t families[] = {
    {"kinbox_consumer_messages_total", M_COUNTER,
     "Messages by outcome: processed (effect committed), duplicate (already "
     "in the inbox, skipped), dead (dead-lettered), retried (handler RETRY "
     "or failed statement).",
     NULL, 0},
    {"kinbox_consumer_batches_total", M_COUNTER,
     "Committed consumer transactions.", NULL, 0},
    {"kinbox_consumer_rollbacks_total", M_COUNTER,
     "Consumer transactions rolled back (retried without the failing "
     "message, or after a database error).",
     NULL, 0},
    {"kinbox_db_resource_errors_total", M_COUNTER,
     "Consumer transactions rolled back because the database server was "
     "out of disk, memory or connection slots (retried with backoff; the "
     "server needs the operator).",
     NULL, 0},
    {"kinbox_consumer_held_errors_total", M_COUNTER,
     "Statement failures no retry can fix (undefined table, column or "
     "function, syntax error, missing privilege; cause = SQLSTATE or MySQL "
     "errno): each holds its partition, nothing is dead-lettered.",
     NULL, 0},
    {"kinbox_consumer_held_partitions", M_GAUGE,
     "Partitions held by an error no retry can fix (/readyz is not ready "
     "while any is).",
     NULL, 0},
    {"kinbox_consumer_batch_splits_total", M_COUNTER,
     "Set-based statements that failed and made kinbox split their batch "
     "to find the failing message (cause = SQLSTATE or MySQL errno).",
     NULL, 0},
    {"kinbox_consumer_batch_size", M_HIST,
     "Messages per committed consumer transaction.", HIST(b_size)},
    {"kinbox_consumer_transaction_seconds", M_HIST,
     "Duration of a committed consumer transaction, BEGIN to COMMIT.",
     HIST(b_seconds)},
    {"kinbox_handler_seconds", M_HIST,
     "Time spent in handler calls per committed consumer transaction "
     "(all its per-message calls, or its batch handler calls).",
     HIST(b_seconds)},
    {"kinbox_consumer_lag", M_GAUGE,
     "Messages behind the partition's high watermark after the last "
     "committed batch.",
     NULL, 0},
    {"kinbox_consumer_assigned_partitions", M_GAUGE,
     "Partitions assigned to the consumer; -1 before the first assignment.",
     NULL, 0},
    {"kinbox_consumer_partitions_refused", M_GAUGE,
     "Assigned partitions the consumer refuses to start (the database's "
     "watermark and Kafka's state disagree in a way that would skip "
     "records): paused until `kinbox offsets reset` resolves them.",
     NULL, 0},
    {"kinbox_outbox_pending", M_GAUGE,
     "Pending outbox rows per destination (sampled at scrape time; "
     "relay.source = wal or binlog: action rows only, event rows are "
     "published from the log and never marked).",
     NULL, 0},
    {"kinbox_outbox_oldest_pending_seconds", M_GAUGE,
     "Age of the oldest pending outbox row per destination (sampled at "
     "scrape time; action rows only with relay.source = wal or binlog).",
     NULL, 0},
    {"kinbox_outbox_dead", M_GAUGE,
     "Dead outbox rows per destination (sampled at scrape time).", NULL, 0},
    {"kinbox_dead_letters", M_GAUGE,
     "Dead letters with status dead per consumer (sampled at scrape time).",
     NULL, 0},
    {"kinbox_dead_letter_oldest_seconds", M_GAUGE,
     "Age of the oldest dead letter with status dead per consumer (sampled "
     "at scrape time).",
     NULL, 0},
    {"kinbox_parked_messages", M_GAUGE,
     "Messages parked behind a held key per consumer (dead_letter.hold_key; "
     "sampled at scrape time).",
     NULL, 0},
    {"kinbox_held_keys", M_GAUGE,
     "Keys held back by a dead letter per consumer (dead_letter.hold_key; "
     "sampled at scrape time).",
     NULL, 0},
    {"kinbox_parked_oldest_age_seconds", M_GAUGE,
     "Age of the oldest parked message per consumer (sampled at scrape "
     "time).",
     NULL, 0},
    {"kinbox_relay_published_total", M_COUNTER,
     "Outbox rows published to Kafka (or local actions done) and marked "
     "sent.",
     NULL, 0},
    {"kinbox_relay_failed_total", M_COUNTER,
     "Publish or action attempts that failed and were scheduled again.", NULL,
     0},
    {"kinbox_relay_dead_total", M_COUNTER, "Outbox rows moved to dead.", NULL,
     0},
    {"kinbox_relay_lease_reclaims_total", M_COUNTER,
     "Outbox rows claimed after another relay's lease expired.", NULL, 0},
    {"kinbox_relay_cas_conflicts_total", M_COUNTER,
     "Marks whose version check found another owner.", NULL, 0},
    {"kinbox_relay_commit_to_publish_seconds", M_HIST,
     "From the outbox row's commit (created_at) to its publish being "
     "acknowledged and marked.",
     HIST(b_latency)},
    {"kinbox_relay_slot_lag_bytes", M_GAUGE,
     "Log relay (relay.source = wal): WAL the slot keeps for the relay, "
     "pg_current_wal_lsn() - confirmed_flush_lsn (sampled every 10 s).",
     NULL, 0},
    {"kinbox_relay_slot_wal_status", M_GAUGE,
     "Log relay: 1 for the slot's wal_status (reserved, extended, "
     "unreserved, lost), 0 for the others.",
     NULL, 0},
    {"kinbox_relay_inflight_transactions", M_GAUGE,
     "Log relay: transactions read and not yet confirmed (some record not "
     "acknowledged yet).",
     NULL, 0},
    {"kinbox_relay_oldest_unconfirmed_seconds", M_GAUGE,
     "Log relay: age of the oldest unconfirmed transaction's commit (0 when "
     "none).",
     NULL, 0},
    {"kinbox_pruned_rows_total", M_COUNTER,
     "Rows deleted by the pruner (table = inbox or outbox).", NULL, 0},
    {"kinbox_inbox_partitions", M_GAUGE,
     "Range partitions of a partitioned inbox (set by the pruner's run).",
     NULL, 0},
    {"kinbox_inbox_partition_rows", M_GAUGE,
     "Rows of each inbox partition (catalog estimate; partition = its "
     "range label, or catchall: rows whose range has no partition, "
     "counted).",
     NULL, 0},
    {"kinbox_inbox_partition_bytes", M_GAUGE,
     "Bytes (data and indexes) of each inbox partition.", NULL, 0},
    {"kinbox_inbox_partition_covered_until_seconds", M_GAUGE,
     "Unix time up to which inbox partitions exist; messages later than "
     "this land in the catch-all.",
     NULL, 0},
    {"kinbox_db_clock_skew_seconds", M_GAUGE,
     "The host's clock minus the database's, seconds, at the pruner's last "
     "run (ranges are created and dropped by the database's clock).",
     NULL, 0},
    {"kinbox_inbox_partition_next_drop_seconds", M_GAUGE,
     "Unix time at which the oldest inbox partition leaves the retention "
     "and is dropped at the pruner's next run.",
     NULL, 0},
    {"kinbox_inbox_partition_changes_total", M_COUNTER,
     "Inbox partitions created or dropped (op = create, drop).", NULL, 0},
    {"kinbox_inbox_partition_failures_total", M_COUNTER,
     "Failed partition operations (op = create, drop, prune); the pruner "
     "tries again at its next run.",
     NULL, 0},
    {"kinbox_inbox_partition_kept_rows_total", M_COUNTER,
     "Rows of dropped inbox partitions kept in the catch-all because an "
     "unresolved dead letter or a parked message still needs them.",
     NULL, 0},
    {"kinbox_outbox_partitions", M_GAUGE,
     "Day partitions of a partitioned outbox (set by the pruner's run).", NULL,
     0},
    {"kinbox_outbox_partition_changes_total", M_COUNTER,
     "Outbox days created, dropped or kept past the retention because the "
     "database refused the drop (op = create, drop, keep; the reason is "
     "logged).",
     NULL, 0},
    {"kinbox_reconcile_discrepancies", M_GAUGE,
     "Rows the reconciliation check returned in its last run (0: clean).",
     NULL, 0},
    {"kinbox_reconcile_runs_total", M_COUNTER,
     "Reconciliation runs by result (done, skipped: another instance held "
     "the lock, failed).",
     NULL, 0},
    {"kinbox_prune_runs_total", M_COUNTER,
     "Pruner runs by result (done, skipped: another instance held the "
     "lock, failed).",
     NULL, 0},
    {"kinbox_tracing_spans_exported_total", M_COUNTER,
     "Spans the OTLP collector accepted.", NULL, 0},
    {"kinbox_tracing_spans_dropped_total", M_COUNTER,
     "Spans not exported, by reason (queue_full: the export queue was "
     "full; export_failed: the collector did not take the request).",
     NULL, 0},
};

#define NFAM (sizeof(families) / sizeof(families[0]))

typedef struct series {
        int fam;
        char *labels;
        double value; /* counter/gauge; histogram sum */
        uint64_t count;
        uint64_t bucket[NB_MAX + 1]; /* non-cumulative; last = +Inf */
        struct series *next;
} series_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static series_t *head, *tail;

static int
fam_find(const char *name)
{
        for (size_t i = 0; i < NFAM; i++)
                if (!strcmp(families[i].name, name))
                        return (int)i;
        return -1;
}

/* Under lock. */
static series_t *
series_get(int fam, const char *labels)
{
        for (series_t *s = head; s; s = s->next)
                if (s->fam == fam && !strcmp(s->labels, labels))
                        return s;
        series_t *s = kinbox__calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        s->labels = kinbox__strdup(labels);
        if (!s->labels) {
                free(s);
                return NULL;
        }
        s->fam = fam;
        if (tail)
                tail->next = s;
        else
                head = s;
        tail = s;
        return s;
}

char *
kinbox__m_labels(char *buf, size_t size, ...)
{
        va_list ap;
        size_t len = 0;
        buf[0] = '\0';
        va_start(ap, size);
        for (const char *k; (k = va_arg(ap, const char *));) {
                const char *v = va_arg(ap, const char *);
                if (!v)
                        v = "";
                int n = snprintf(buf + len, size - len, "%s%s=\"",
                                 len ? "," : "", k);
                if (n < 0 || (size_t)n >= size - len)
                        break;
                len += (size_t)n;
                for (; *v && len + 3 < size; v++) {
                        if (*v == '\\' || *v == '"') {
                                buf[len++] = '\\';
                                buf[len++] = *v;
                        } else if (*v == '\n') {
                                buf[len++] = '\\';
                                buf[len++] = 'n';
                        } else {
                                buf[len++] = *v;
                        }
                }
                if (len + 2 > size)
                        break;
                buf[len++] = '"';
                buf[len] = '\0';
        }
        va_end(ap);
        return buf;
}

static void
update(const char *family, const char *labels, double v, int how)
{
        int f = fam_find(family);
        if (f < 0)
                return;
        pthread_mutex_lock(&lock);
        series_t *s = series_get(f, labels ? labels : "");
        if (s) {
                if (how == 0) {
                        s->value += v;
                } else if (how == 1) {
                        s->value = v;
                } else {
                        const family_t *fm = &families[f];
                        int b = 0;
                        while (b < fm->nbuckets && v > fm->buckets[b])
                                b++;
                        s->bucket[b]++;
                        s->count++;
                        s->value += v;
                }
        }
        pthread_mutex_unlock(&lock);
}

void
kinbox__m_add(const char *family, const char *labels, double v)
{
        update(family, labels, v, 0);
}

void
kinbox__m_set(const char *family, const char *labels, double v)
{
        update(family, labels, v, 1);
}

void
kinbox__m_observe(const char *family, const char *labels, double v)
{
        update(family, labels, v, 2);
}

void
kinbox__m_drop(const char *family, const char *prefix)
{
        int f = fam_find(family);
        if (f < 0)
                return;
        size_t n = strlen(prefix);
        pthread_mutex_lock(&lock);
        series_t **pp = &head, *prev = NULL;
        while (*pp) {
                series_t *s = *pp;
                if (s->fam == f && !strncmp(s->labels, prefix, n)) {
                        *pp = s->next;
                        if (tail == s)
                                tail = prev;
                        free(s->labels);
                        free(s);
                        continue;
                }
                prev = s;
                pp = &s->next;
        }
        pthread_mutex_unlock(&lock);
}

static void
num(kinbox__buf_t *b, double v)
{
        if (isinf(v))
                kinbox__buf_adds(b, v > 0 ? "+Inf" : "-Inf");
        else if (v == (double)(int64_t)v && fabs(v) < 1e15)
                kinbox__buf_printf(b, "%lld", (long long)v);
        else
                kinbox__buf_printf(b, "%.9g", v);
}

static void
label_block(kinbox__buf_t *b, const char *labels, const char *extra)
{
        bool l = labels && *labels;
        if (!l && !extra)
                return;
        kinbox__buf_adds(b, "{");
        if (l)
                kinbox__buf_adds(b, labels);
        if (extra) {
                if (l)
                        kinbox__buf_adds(b, ",");
                kinbox__buf_adds(b, extra);
        }
        kinbox__buf_adds(b, "}");
}

char *
kinbox__metrics_render(void)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        pthread_mutex_lock(&lock);
        for (size_t f = 0; f < NFAM; f++) {
                const family_t *fm = &families[f];
                kinbox__buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n",
                                   fm->name, fm->help, fm->name,
                                   fm->type == M_COUNTER ? "counter"
                                   : fm->type == M_GAUGE ? "gauge"
                                                         : "histogram");
                for (series_t *s = head; s; s = s->next) {
                        if (s->fam != (int)f)
                                continue;
                        if (fm->type != M_HIST) {
                                kinbox__buf_adds(&b, fm->name);
                                label_block(&b, s->labels, NULL);
                                kinbox__buf_adds(&b, " ");
                                num(&b, s->value);
                                kinbox__buf_adds(&b, "\n");
                                continue;
                        }
                        uint64_t cum = 0;
                        for (int i = 0; i <= fm->nbuckets; i++) {
                                char le[48];
                                cum += s->bucket[i];
                                if (i < fm->nbuckets)
                                        snprintf(le, sizeof(le), "le=\"%g\"",
                                                 fm->buckets[i]);
                                else
                                        snprintf(le, sizeof(le),
                                                 "le=\"+Inf\"");
                                kinbox__buf_printf(&b, "%s_bucket", fm->name);
                                label_block(&b, s->labels, le);
                                kinbox__buf_printf(&b, " %llu\n",
                                                   (unsigned long long)cum);
                        }
                        kinbox__buf_printf(&b, "%s_sum", fm->name);
                        label_block(&b, s->labels, NULL);
                        kinbox__buf_adds(&b, " ");
                        num(&b, s->value);
                        kinbox__buf_printf(&b, "\n%s_count", fm->name);
                        label_block(&b, s->labels, NULL);
                        kinbox__buf_printf(&b, " %llu\n",
                                           (unsigned long long)s->count);
                }
        }
        pthread_mutex_unlock(&lock);
        if (b.oom) {
                kinbox__buf_free(&b);
                return NULL;
        }
        return b.p;
}

double
kinbox__metrics_value(const char *family, const char *labels)
{
        int f = fam_find(family);
        double v = NAN;
        if (f < 0)
                return v;
        pthread_mutex_lock(&lock);
        for (series_t *s = head; s; s = s->next)
                if (s->fam == f && !strcmp(s->labels, labels ? labels : "")) {
                        v = families[f].type == M_HIST ? (double)s->count
                                                       : s->value;
                        break;
                }
        pthread_mutex_unlock(&lock);
        return v;
}
