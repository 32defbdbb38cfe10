/*
 * prune.c -- retention: batched deletes of old inbox rows and sent outbox
 * rows (every event row past outbox.retention when relay.source = wal |
 * binlog) under a single-instance lock (a partitioned inbox drops whole
 * ranges instead: partition.c; a partitioned outbox whole days:
 * partition_outbox.c), and the start-up check that the inbox
 * outlives the broker's redelivery window.
 *
 * Why batches: one DELETE of a day's inbox rows holds its locks and its
 * undo for as long as it runs and stalls replication; prune.batch rows per
 * statement (autocommit), with a pause between, keeps every transaction
 * short. The selection uses the processed_at / sent_at indexes.
 */
#include "db.h"
#include "internal.h"
#include "metrics.h"
#include "outbox_int.h"
#include "partition.h"
#include "partition_outbox.h"

#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRUNE_PAUSE_MS 20

/* Which of the dialect's prune statements (db.h). */
enum { T_INBOX = 0, T_OUTBOX = 1, T_OUTBOX_LOG = 2 };
static const char *const table_name[3] = {"inbox", "outbox", "outbox"};

/* The formats are the dialect's constant tables (db/pg.c, db/mysql.c). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static int
prune_table(kinbox__db_t *db, int t, int64_t age_ms, int64_t batch, bool dry,
            const volatile int *stop, uint64_t *total)
{
        const struct kinbox__sql *q = db->ops->sql;
        int64_t age = age_ms * q->prune_age_scale;
        char sql[512];
        *total = 0;
        if (dry) {
                snprintf(sql, sizeof(sql), q->prune_count[t], age);
                struct kinbox_rows_s *rows = NULL;
                int rc = kinbox__db_query(db, sql, 0, NULL, &rows);
                if (!rc && rows && rows->nrows && rows->values[0])
                        *total = strtoull(rows->values[0], NULL, 10);
                kinbox_rows_destroy(rows);
                return rc;
        }
        snprintf(sql, sizeof(sql), q->prune_delete[t], age, batch);
        char lab[64];
        kinbox__m_labels(lab, sizeof(lab), "table", table_name[t],
                         (char *)NULL);
        for (;;) {
                uint64_t n = 0;
                int rc = kinbox__outbox_affected(db, sql, 0, NULL, &n);
                if (rc)
                        return rc;
                *total += n;
                kinbox__m_add("kinbox_pruned_rows_total", lab, (double)n);
                if (n < (uint64_t)batch || (stop && *stop))
                        return KINBOX_OK;
                kinbox__sleep_ms(PRUNE_PAUSE_MS);
        }
}
#pragma GCC diagnostic pop

kinbox_err_t
kinbox_prune(const kinbox_conf_t *conf, int dry_run, const volatile int *stop,
             kinbox_prune_result_t *out, char *errstr, size_t sz)
{
        kinbox_prune_result_t res = {0};
        char lab[64];
        if (out)
                *out = res;
        kinbox__db_t *db = kinbox__db_new_conf(conf, errstr, sz);
        if (!db)
                return KINBOX_ERR_CONFIG;
        int rc = kinbox__db_connect(db);
        bool locked = false;
        if (rc)
                goto fail;
        if (!dry_run) {
                if ((rc = kinbox__prune_lock(db, 1, &locked)))
                        goto fail;
                if (!locked) {
                        res.skipped = 1;
                        kinbox__m_add("kinbox_prune_runs_total",
                                      kinbox__m_labels(lab, sizeof(lab),
                                                       "result", "skipped",
                                                       (char *)NULL),
                                      1);
                        goto done;
                }
        }
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        kinbox__log_t lg;
        kinbox__conf_logger(conf, &lg);
        bool parted = false;
        rc = kinbox__partition_prune(db, s, &lg, dry_run, stop, &res, &parted);
        if (!rc && !parted)
                rc = prune_table(db, T_INBOX, s->inbox_retention,
                                 s->prune_batch, dry_run, stop,
                                 &res.inbox_rows);
        /* outbox.layout = partitioned: whole days (partition_outbox.c). */
        bool oparted = false;
        if (!rc && !(stop && *stop))
                rc = kinbox__outbox_partition_prune(db, conf, &lg, dry_run,
                                                    stop, &res, &oparted);
        if (!rc && !(stop && *stop) && (!oparted || dry_run))
                rc = prune_table(db, T_OUTBOX, s->outbox_retention,
                                 s->prune_batch, dry_run, stop,
                                 &res.outbox_rows);
        /*
         * relay.source = wal | binlog: the log relay never marks an event
         * row, so its rows stay pending and the statement above never
         * sees them; they go by created_at instead, whatever their status
         * (dead ones aside: they wait for an operator, as in poll mode).
         * Safe because the relay reads the log, not the table: the log
         * holds the whole row as inserted (PostgreSQL's WAL INSERT record,
         * TOASTed values included in the toast inserts of the same
         * transaction, decoded from the WAL; MariaDB's ROW binlog event
         * carries the row's image), so deleting the heap row can never lose
         * an event the relay has not read yet. The table is kept only for
         * `kinbox outbox resend --since`, a lost slot's recovery and
         * audits: hence outbox.retention. Action rows (polled and marked
         * in every mode) are left to the statement above.
         */
        if (!rc && !(stop && *stop) &&
            s->relay_source != KINBOX__SOURCE_POLL && (!oparted || dry_run))
                rc = prune_table(db, T_OUTBOX_LOG, s->outbox_retention,
                                 s->prune_batch, dry_run, stop,
                                 &res.outbox_log_rows);
        if (rc)
                goto fail;
        if (!dry_run)
                kinbox__m_add("kinbox_prune_runs_total",
                              kinbox__m_labels(lab, sizeof(lab), "result",
                                               "done", (char *)NULL),
                              1);
done:
        if (locked)
                kinbox__prune_unlock(db);
        kinbox__db_destroy(db);
        if (out)
                *out = res;
        return KINBOX_OK;
fail:
        kinbox__errstr(errstr, sz, "prune: %s", db->err.msg);
        if (!dry_run)
                kinbox__m_add("kinbox_prune_runs_total",
                              kinbox__m_labels(lab, sizeof(lab), "result",
                                               "failed", (char *)NULL),
                              1);
        /* Closing the connection releases a session lock too. */
        kinbox__db_destroy(db);
        if (out)
                *out = res;
        return rc == KINBOX_ERR_DB_CONN ? KINBOX_ERR_DB_CONN : KINBOX_ERR_DB;
}

/* ------------------------------------------------------------------ */
/* the redelivery window */

#define DESCRIBE_TIMEOUT_MS 2000

/* Largest retention.ms of topics from the broker: 0 when it could not
 * answer, -1 for an infinite retention. */
static int64_t
broker_window(const kinbox_conf_t *conf, const char *topics, char *note,
              size_t note_sz)
{
        static const char *const quiet[] = {"log_level", "0", NULL};
        char e[256];
        kinbox_kafka_t *kk = kinbox_kafka_new(conf, quiet, e, sizeof(e));
        if (!kk) {
                snprintf(note, note_sz, "%s", e);
                return 0;
        }
        rd_kafka_t *rk = kinbox_kafka_handle(kk);
        char list[1024];
        snprintf(list, sizeof(list), "%s", topics);
        rd_kafka_ConfigResource_t *res[64];
        size_t n = 0;
        for (char *save = NULL, *t = strtok_r(list, ", ", &save); t && n < 64;
             t = strtok_r(NULL, ", ", &save))
                res[n++] =
                    rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, t);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AdminOptions_t *o =
            rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
        rd_kafka_AdminOptions_set_request_timeout(o, DESCRIBE_TIMEOUT_MS, e,
                                                  sizeof(e));
        rd_kafka_DescribeConfigs(rk, res, n, o, q);
        int64_t window = 0;
        rd_kafka_event_t *ev =
            rd_kafka_queue_poll(q, DESCRIBE_TIMEOUT_MS + 500);
        if (!ev) {
                snprintf(note, note_sz, "no answer in %d ms",
                         DESCRIBE_TIMEOUT_MS);
        } else if (rd_kafka_event_error(ev)) {
                snprintf(note, note_sz, "%s", rd_kafka_event_error_string(ev));
        } else {
                const rd_kafka_DescribeConfigs_result_t *r =
                    rd_kafka_event_DescribeConfigs_result(ev);
                size_t nr = 0;
                const rd_kafka_ConfigResource_t **rr =
                    r ? rd_kafka_DescribeConfigs_result_resources(r, &nr)
                      : NULL;
                bool all = nr == n;
                for (size_t i = 0; i < nr && all; i++) {
                        if (rd_kafka_ConfigResource_error(rr[i])) {
                                snprintf(note, note_sz, "%s: %s",
                                         rd_kafka_ConfigResource_name(rr[i]),
                                         rd_kafka_ConfigResource_error_string(
                                             rr[i]));
                                all = false;
                                break;
                        }
                        size_t ne = 0;
                        const rd_kafka_ConfigEntry_t **ce =
                            rd_kafka_ConfigResource_configs(rr[i], &ne);
                        bool found = false;
                        for (size_t j = 0; j < ne; j++) {
                                if (strcmp(rd_kafka_ConfigEntry_name(ce[j]),
                                           "retention.ms"))
                                        continue;
                                const char *v =
                                    rd_kafka_ConfigEntry_value(ce[j]);
                                int64_t ms = v ? strtoll(v, NULL, 10) : 0;
                                found = v != NULL;
                                if (ms < 0)
                                        window = -1;
                                else if (window >= 0 && ms > window)
                                        window = ms;
                        }
                        if (!found)
                                all = false;
                }
                if (!all && window >= 0)
                        window = 0;
                if (!all && !note[0])
                        snprintf(note, note_sz, "retention.ms not reported");
        }
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(o);
        rd_kafka_ConfigResource_destroy_array(res, n);
        rd_kafka_queue_destroy(q);
        kinbox_kafka_destroy(kk);
        return window;
}

static void
fmt_ms(char *b, size_t sz, int64_t ms)
{
        if (ms % 86400000 == 0)
                snprintf(b, sz, "%" PRId64 "d", ms / 86400000);
        else if (ms % 3600000 == 0)
                snprintf(b, sz, "%" PRId64 "h", ms / 3600000);
        else if (ms % 60000 == 0)
                snprintf(b, sz, "%" PRId64 "m", ms / 60000);
        else if (ms % 1000 == 0)
                snprintf(b, sz, "%" PRId64 "s", ms / 1000);
        else
                snprintf(b, sz, "%" PRId64 "ms", ms);
}

kinbox_err_t
kinbox_retention_check(const kinbox_conf_t *conf, int64_t *window_ms,
                       const char **source, char *errstr, size_t sz)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        const char *topics = s->topics;
        int64_t retention = s->inbox_retention;
        int64_t window = 0;
        const char *src = "broker";
        char note[256] = "";
        if (topics && *topics &&
            kinbox_conf_get(conf, "kafka.bootstrap.servers"))
                window = broker_window(conf, topics, note, sizeof(note));
        if (window == 0) {
                window = s->kafka_redelivery_window;
                src = "kafka.redelivery.window";
        }
        if (window_ms)
                *window_ms = window;
        if (source)
                *source = src;
        char r[32], w[32];
        fmt_ms(r, sizeof(r), retention);
        if (window < 0) {
                kinbox__errstr(errstr, sz,
                               "inbox.retention (%s = %" PRId64
                               " ms) cannot cover topics %s: the broker keeps "
                               "them forever (retention.ms = -1)",
                               r, retention, topics);
                return KINBOX_ERR_CONFIG;
        }
        fmt_ms(w, sizeof(w), window);
        if (retention <= window) {
                kinbox__errstr(
                    errstr, sz,
                    "inbox.retention (%s = %" PRId64
                    " ms) must exceed the redelivery window (%s = %" PRId64
                    " ms, from %s%s%s%s): a message redelivered after its "
                    "inbox row was pruned would be applied again",
                    r, retention, w, window, src,
                    note[0] ? "; the broker did not answer DescribeConfigs: "
                            : "",
                    note, "");
                return KINBOX_ERR_CONFIG;
        }
        return KINBOX_OK;
}
