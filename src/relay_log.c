/*
 * relay_log.c -- the log relay (relay.source = wal | binlog): reads the
 * database's log through a source (relay_log.h), publishes every event
 * row and kinbox message with the polling relay's record building
 * (kinbox__relay_produce_on(): key, headers, timestamp), and confirms to
 * the source only the end of the longest prefix of transactions whose
 * every record Kafka acknowledged. It never updates an outbox row, except
 * to record one that can never be published as written (dead()).
 *
 * Transactions are kept in commit order (a FIFO). A record's delivery
 * report marks it; the head transaction is confirmed once it is committed
 * and every record of it is acknowledged, then freed. With nothing in
 * flight, a keepalive's position is confirmed too (an idle outbox on a
 * busy database pins no WAL).
 *
 * Failures: a record that can never be published (larger than the topic's
 * max.message.bytes without compression, malformed headers, a bad
 * envelope) is dead-lettered through the source and counts as done; any
 * other failure (a delivery error, a purge at the delivery deadline, a
 * fatal producer, the stream lost) restarts: wait for what is in flight,
 * close the stream, open it again from the confirmed position. Records
 * after the confirmed position are published again (at least once; the
 * consumers' inboxes absorb the copies), in their order.
 *
 * Per-aggregate order: the log gives transactions in commit order and
 * rows in their order within; the idempotent producer with the gapless
 * guarantee keeps each partition's records in produce order.
 */
#include <inttypes.h>
#include <pthread.h>

#include "outbox_env.h"
#include "relay_int.h"
#include "relay_log.h"
#include "rkdestroy.h"

#define LOG_INFLIGHT_MAX 10000 /* records in flight before reading waits */
#define LOG_BURST 2000 /* events read before serving delivery reports */
#define LOG_WAIT_MS 100 /* a read's wait while nothing is in flight */
#define LOG_DR_WAIT_MS 2 /* ... while records are in flight */
#define LAG_EVERY_MS 10000 /* the slot's figures, this often */

typedef struct wtx wtx_t;

/* One record in flight: the polling relay's item, and copies of what it
 * points to. */
typedef struct wrec {
        item_t it;
        char *mem;
} wrec_t;

struct wtx {
        kinbox__logpos_t end;
        int64_t commit_ms;
        wrec_t **recs;
        size_t n, cap;
        size_t done; /* recs[0 .. done) acknowledged or dead */
        bool committed;
        wtx_t *next;
};

typedef struct lrelay {
        kinbox_relay_t *r;
        kinbox__logsrc_t src;
        rd_kafka_t *rk;
        wtx_t *head, *tail;
        size_t inflight; /* records produced, not yet acknowledged */
        int64_t progress_ms; /* the last acknowledgement (or the first
                              * record in flight after none), monotonic */
        int ntx;
        bool failed; /* restart from the confirmed position */
        bool opened, started;
        bool waiting; /* the slot is another reader's: said once */
        pthread_t thr;
        int rc; /* why the thread stopped the relay (0: it did not) */
        char labels[300]; /* relay="NAME" */
        uint64_t acked, dead; /* not yet added to the metrics */
        kinbox__logpos_t confirmed; /* the last position confirmed */
        int64_t lag_at; /* the slot's figures sampled at (monotonic) */
} lrelay_t;

static void
tx_free(wtx_t *t)
{
        for (size_t i = 0; i < t->n; i++) {
                free(t->recs[i]->mem);
                free(t->recs[i]);
        }
        free(t->recs);
        free(t);
}

static void
drop_all(lrelay_t *L)
{
        while (L->head) {
                wtx_t *t = L->head;
                L->head = t->next;
                tx_free(t);
        }
        L->tail = NULL;
        L->ntx = 0;
        L->inflight = 0;
}

/* Copy a row (or a decoded envelope) into a record owned by the relay. */
static wrec_t *
rec_new(const kinbox__logrow_t *row)
{
        const char *s[4] = {row->destination, row->idem_key, row->aggregate_id,
                            row->headers_json};
        size_t len[4], total = row->payload_size + 1;
        for (int i = 0; i < 4; i++)
                total += len[i] = s[i] ? strlen(s[i]) + 1 : 0;
        wrec_t *w = kinbox__calloc(1, sizeof(*w));
        char *m = w ? malloc(total) : NULL;
        if (!m) {
                free(w);
                return NULL;
        }
        w->mem = m;
        const char **dst[4] = {&w->it.destination, &w->it.idem_key,
                               &w->it.aggregate_id, &w->it.headers_json};
        for (int i = 0; i < 4; i++) {
                *dst[i] = s[i] ? memcpy(m, s[i], len[i]) : NULL;
                m += len[i];
        }
        if (row->payload) {
                memcpy(m, row->payload, row->payload_size);
                w->it.payload = m;
                w->it.payload_size = row->payload_size;
        }
        w->it.id = row->id;
        w->it.created_at_ms = row->created_at_ms;
        w->it.created_ms = row->created_at_ms;
        return w;
}

/* A record that cannot ever be published as written: dead through the
 * source (row_id 0: raw bytes of a message). <0 when that failed. */
static int
rec_dead(lrelay_t *L, int64_t row_id, const char *why,
         const kinbox__logpos_t *pos, const void *bytes, size_t size)
{
        if (row_id)
                rlog(L->r, KINBOX_LOG_WARNING,
                     "relay (%s): outbox row %" PRId64 " dead: %s",
                     L->src.ops->name, row_id, why);
        else
                rlog(L->r, KINBOX_LOG_WARNING,
                     "relay (%s): message at %X/%X dead: %s", L->src.ops->name,
                     (unsigned)(pos->lsn >> 32), (unsigned)pos->lsn, why);
        int rc = L->src.ops->dead(&L->src, row_id, why, pos, bytes, size);
        if (rc) {
                rlog(L->r, KINBOX_LOG_WARNING, "relay: %s", L->src.err);
                return rc;
        }
        STAT_ADD(L->r, dead, 1);
        L->dead++;
        return 0;
}

/* Whether the record is larger than its topic takes (uncompressed): the
 * reason into err. */
static bool
too_large(lrelay_t *L, const item_t *it, char *err, size_t errsz)
{
        if (L->r->compressed)
                return false;
        size_t sz = it->payload_size +
                    (it->aggregate_id ? strlen(it->aggregate_id) : 0);
        if (sz < 1000000 / 2)
                return false; /* below any broker's default limit */
        int64_t limit = kinbox__relay_topic_max_bytes(L->r, it->destination);
        if (limit <= 0 || (int64_t)sz <= limit)
                return false;
        snprintf(err, errsz,
                 "MSG_SIZE_TOO_LARGE: the record (%zu bytes of key and "
                 "value) is larger than "
                 "topic %s's max.message.bytes (%" PRId64
                 "): it cannot be published as written",
                 sz, it->destination, limit);
        return true;
}

/* Publish one record of the open transaction t. <0: a restart is due. */
static int
publish(lrelay_t *L, wtx_t *t, wrec_t *w, const kinbox__logpos_t *pos)
{
        if (kinbox__grow(&t->recs, &t->cap, t->n + 1, sizeof(*t->recs))) {
                free(w->mem);
                free(w);
                return KINBOX_ERR_NOMEM;
        }
        t->recs[t->n++] = w;
        char err[ERR_MAX + 1];
        if (too_large(L, &w->it, err, sizeof(err))) {
                w->it.out = OUT_DEAD;
                set_err(w->it.err, err);
        } else {
                kinbox__relay_produce_on(L->r, L->rk, &w->it);
        }
        if (w->it.produced) {
                if (!L->inflight++)
                        L->progress_ms = kinbox__now_ms();
                return 0;
        }
        if (w->it.out == OUT_DEAD) {
                w->it.dr_done = true; /* done: dead, not published */
                return rec_dead(L, w->it.id, w->it.err, pos, NULL, 0);
        }
        rlog(L->r, KINBOX_LOG_WARNING,
             "relay (%s): outbox row %" PRId64
             ": %s; starting again from the confirmed position",
             L->src.ops->name, w->it.id, w->it.err[0] ? w->it.err : "produce");
        return KINBOX_ERR_KAFKA;
}

/* A kinbox logical message: its envelope decoded and published, or dead
 * with its bytes. */
static int
on_message(lrelay_t *L, wtx_t *t, const kinbox__logev_t *ev)
{
        kinbox__outbox_env_t env;
        char why[200];
        if (kinbox__outbox_env_decode(ev->prefix, ev->data, ev->size, &env,
                                      why, sizeof(why)))
                return rec_dead(L, 0, why, &ev->pos, ev->data, ev->size);
        kinbox__logrow_t row = {0,
                                false,
                                env.destination,
                                env.idem_key,
                                env.aggregate_id,
                                env.headers_json,
                                env.payload,
                                env.payload_size,
                                t->commit_ms};
        wrec_t *w = rec_new(&row);
        kinbox__outbox_env_free(&env);
        if (!w)
                return KINBOX_ERR_NOMEM;
        return publish(L, t, w, &ev->pos);
}

/* One event from the source. <0: restart. */
static int
on_event(lrelay_t *L, const kinbox__logev_t *ev)
{
        wtx_t *t = L->tail;
        switch (ev->kind) {
        case KINBOX__LOGEV_BEGIN:
                t = kinbox__calloc(1, sizeof(*t));
                if (!t)
                        return KINBOX_ERR_NOMEM;
                t->commit_ms = ev->commit_ms;
                if (L->tail)
                        L->tail->next = t;
                else
                        L->head = t;
                L->tail = t;
                L->ntx++;
                return 0;
        case KINBOX__LOGEV_ROW:
        case KINBOX__LOGEV_MESSAGE:
                if (!t || t->committed)
                        return KINBOX_ERR_DB; /* outside a transaction */
                if (ev->kind == KINBOX__LOGEV_MESSAGE)
                        return on_message(L, t, ev);
                if (ev->row.action)
                        return 0; /* the polling relay runs it */
                wrec_t *w = rec_new(&ev->row);
                return w ? publish(L, t, w, &ev->pos) : KINBOX_ERR_NOMEM;
        case KINBOX__LOGEV_COMMIT:
                if (!t || t->committed)
                        return KINBOX_ERR_DB;
                t->committed = true;
                t->end = ev->pos;
                return 0;
        case KINBOX__LOGEV_KEEPALIVE:
                if (L->head)
                        return 0;
                L->confirmed = ev->pos;
                return L->src.ops->confirm(&L->src, &ev->pos);
        }
        return 0;
}

/* Delivery reports into progress: confirm every finished transaction at
 * the head. A failed record: restart (<0). */
static int
advance(lrelay_t *L)
{
        while (L->head) {
                wtx_t *t = L->head;
                while (t->done < t->n) {
                        item_t *it = &t->recs[t->done]->it;
                        if (!it->dr_done)
                                return 0;
                        if (it->produced) {
                                L->inflight--;
                                if (it->dr_err) {
                                        rlog(L->r, KINBOX_LOG_WARNING,
                                             "relay (%s): outbox row %" PRId64
                                             ": delivery: %s; starting again "
                                             "from the confirmed position",
                                             L->src.ops->name, it->id,
                                             rd_kafka_err2name(it->dr_err));
                                        it->produced = false;
                                        return KINBOX_ERR_KAFKA;
                                }
                                L->acked++;
                                L->progress_ms = kinbox__now_ms();
                                kinbox__m_observe(
                                    "kinbox_relay_commit_to_publish_seconds",
                                    L->labels,
                                    (double)(kinbox__wall_ms() -
                                             it->created_at_ms) /
                                        1000.0);
                        }
                        t->done++;
                }
                if (!t->committed)
                        return 0;
                int rc = L->src.ops->confirm(&L->src, &t->end);
                if (rc)
                        return rc;
                L->confirmed = t->end;
                L->head = t->next;
                if (!L->head)
                        L->tail = NULL;
                L->ntx--;
                tx_free(t);
        }
        return 0;
}

/* Records are in flight and none was acknowledged within the delivery
 * deadline (kafka.message.timeout.ms): librdkafka never times a record
 * out (the producer template), the log relay does, as a whole. */
static bool
overdue(const lrelay_t *L)
{
        return L->inflight && kinbox__now_ms() - L->progress_ms >
                                  L->r->msg_timeout_ms + MARGIN_MS;
}

/* Records produced whose delivery report has not come. */
static size_t
unreported(const lrelay_t *L)
{
        size_t n = 0;
        for (const wtx_t *t = L->head; t; t = t->next)
                for (size_t i = t->done; i < t->n; i++)
                        n +=
                            t->recs[i]->it.produced && !t->recs[i]->it.dr_done;
        return n;
}

/* The counters of the last round, and every LAG_EVERY_MS the slot's
 * figures (a query on the source's own connection). */
static void
log_metrics(lrelay_t *L)
{
        if (L->acked) {
                STAT_ADD(L->r, published, L->acked);
                kinbox__m_add("kinbox_relay_published_total", L->labels,
                              (double)L->acked);
                L->acked = 0;
        }
        if (L->dead) {
                kinbox__m_add("kinbox_relay_dead_total", L->labels,
                              (double)L->dead);
                L->dead = 0;
        }
        int64_t now = kinbox__now_ms();
        if (now - L->lag_at < LAG_EVERY_MS)
                return;
        L->lag_at = now;
        kinbox__m_set("kinbox_relay_inflight_transactions", L->labels, L->ntx);
        kinbox__m_set("kinbox_relay_oldest_unconfirmed_seconds", L->labels,
                      L->head && L->head->commit_ms
                          ? (double)(kinbox__wall_ms() - L->head->commit_ms) /
                                1000.0
                          : 0);
        kinbox__loglag_t lag;
        if (!L->src.ops->lag || L->src.ops->lag(&L->src, &lag))
                return;
        char sl[400];
        snprintf(sl, sizeof(sl), "%s,slot=\"%s\"", L->labels, L->src.slot);
        if (lag.retained_bytes >= 0)
                kinbox__m_set("kinbox_relay_slot_lag_bytes", sl,
                              (double)lag.retained_bytes);
        static const char *const states[] = {"reserved", "extended",
                                             "unreserved", "lost"};
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(states) && lag.state[0];
             i++) {
                char st[500];
                snprintf(st, sizeof(st), "%s,status=\"%s\"", sl, states[i]);
                kinbox__m_set("kinbox_relay_slot_wal_status", st,
                              !strcmp(lag.state, states[i]));
        }
}

/* Read a burst of events, serve delivery reports, confirm what is done.
 * <0: restart from the confirmed position. */
static int
pump(lrelay_t *L)
{
        int n = 0, rc = 0;
        kinbox__logev_t ev;
        while (L->inflight < LOG_INFLIGHT_MAX && n < LOG_BURST &&
               !atomic_load(&L->r->stop)) {
                /* While records are in flight the wait is short: their
                 * delivery reports are served after it (the log's next
                 * event is read as soon as it comes, never behind them). */
                rc = L->src.ops->next(&L->src, &ev,
                                      n             ? 0
                                      : L->inflight ? LOG_DR_WAIT_MS
                                                    : LOG_WAIT_MS);
                if (rc <= 0)
                        break;
                if ((rc = on_event(L, &ev)) < 0)
                        break;
                n++;
        }
        if (rc >= 0 && L->inflight >= LOG_INFLIGHT_MAX)
                rc = L->src.ops->confirm(&L->src, &L->confirmed);
        if (rc < 0 && L->src.err[0] && rc != KINBOX_ERR_KAFKA)
                rlog(L->r, KINBOX_LOG_WARNING, "relay: %s", L->src.err);
        rd_kafka_poll(L->rk, 0);
        int arc = advance(L);
        if (rc >= 0)
                rc = arc;
        if (rc >= 0 && overdue(L)) {
                rlog(L->r, KINBOX_LOG_WARNING,
                     "relay (%s): delivery reports later than "
                     "kafka.message.timeout.ms: starting again from the "
                     "confirmed position",
                     L->src.ops->name);
                rc = KINBOX_ERR_KAFKA;
        }
        if (rc >= 0 && rd_kafka_fatal_error(L->rk, NULL, 0))
                rc = KINBOX_ERR_KAFKA;
        log_metrics(L);
        return rc;
}

/* Stop reading; every delivery report in (purging past the deadline),
 * the finished prefix confirmed, the stream closed, the producer gone:
 * false when the producer did not shut down (its records stay). */
static bool
wind_down(lrelay_t *L)
{
        int64_t until = kinbox__now_ms() + L->r->msg_timeout_ms + MARGIN_MS;
        while (L->rk && unreported(L) && kinbox__now_ms() < until) {
                rd_kafka_poll(L->rk, 10);
                if (!L->failed && advance(L) < 0)
                        L->failed = true;
        }
        if (L->started && !L->failed)
                advance(L);
        if (L->opened)
                L->src.ops->close(&L->src);
        L->opened = L->started = false;
        if (L->rk) {
                rd_kafka_purge(L->rk, RD_KAFKA_PURGE_F_QUEUE |
                                          RD_KAFKA_PURGE_F_INFLIGHT);
                bool ok = kinbox__rk_destroy_bounded(L->rk, 0,
                                                     "relay_destroy_stall");
                L->rk = NULL;
                if (!ok) {
                        L->r->rk_left = true;
                        return false;
                }
        }
        drop_all(L);
        L->failed = false;
        return true;
}

/* A new producer knows the brokers and the topics before the first
 * record: librdkafka 2.0 skips the leader query of a topic first produced
 * to while its start-up request is in transit, and the topic's records
 * then wait for its one-second scan (every row of the relay's first
 * second, measured). A full metadata request fills its cache. */
static void
producer_warm(lrelay_t *L)
{
        const struct rd_kafka_metadata *md = NULL;
        if (rd_kafka_metadata(L->rk, 1, NULL, &md, 2000) ==
            RD_KAFKA_RESP_ERR_NO_ERROR)
                rd_kafka_metadata_destroy(md);
        else
                rlog(L->r, KINBOX_LOG_WARNING,
                     "relay (%s): no broker metadata yet (publishing will "
                     "wait)",
                     L->src.ops->name);
}

/* Open the source and start streaming, with a new producer. */
static int
open_start(lrelay_t *L)
{
        L->src.err[0] = '\0';
        int rc;
        if (!L->opened) { /* kinbox__relay_log_start() opened it first */
                if ((rc = L->src.ops->open(&L->src)))
                        return rc;
                L->opened = true;
        }
        if ((rc = L->src.ops->start(&L->src)))
                return rc;
        if (!L->rk) {
                L->rk = kinbox__relay_producer_new(L->r);
                if (!L->rk)
                        return KINBOX_ERR_KAFKA;
                producer_warm(L);
        }
        if (L->waiting)
                rlog(L->r, KINBOX_LOG_NOTICE,
                     "relay (%s): slot %s is ours now", L->src.ops->name,
                     L->src.slot);
        L->waiting = false;
        L->started = true;
        return KINBOX_OK;
}

/* Sleep up to ms, or until the relay stops (the relay's pipe belongs to
 * the polling relay's thread). */
static void
log_sleep(kinbox_relay_t *r, int64_t ms)
{
        for (int64_t t = 0; t < ms && !atomic_load(&r->stop); t += 50)
                kinbox__sleep_ms(ms - t < 50 ? ms - t : 50);
}

static void *
log_main(void *arg)
{
        lrelay_t *L = arg;
        kinbox_relay_t *r = L->r;
        int failures = 0;
        while (!atomic_load(&r->stop)) {
                int rc = L->started ? pump(L) : open_start(L);
                if (rc >= 0) {
                        failures = 0;
                        continue;
                }
                if (rc == KINBOX_ERR_CONFIG || rc == KINBOX_ERR_SCHEMA) {
                        /* Changed under a running relay (the slot lost): the
                         * operator's to fix. */
                        snprintf(r->errstr, sizeof(r->errstr), "%s",
                                 L->src.err);
                        rlog(r, KINBOX_LOG_ERR, "relay: %s", L->src.err);
                        L->rc = rc;
                        kinbox__relay_halt(r);
                        break;
                }
                /* The slot is another reader's (its lease): take it over
                 * within a second of its end. */
                bool busy = rc == KINBOX_ERR_STATE;
                if (busy && !L->waiting)
                        rlog(r, KINBOX_LOG_NOTICE,
                             "relay (%s): slot %s is in use by another "
                             "reader; waiting for it",
                             L->src.ops->name, L->src.slot);
                else if (!busy && !L->started && L->src.err[0])
                        rlog(r, KINBOX_LOG_WARNING, "relay: %s", L->src.err);
                L->waiting = busy;
                L->failed = true;
                if (!wind_down(L)) {
                        L->rc = KINBOX_ERR_KAFKA;
                        kinbox__relay_halt(r);
                        break;
                }
                if (!busy)
                        STAT_ADD(r, db_errors, 1);
                log_sleep(r, busy ? 1000
                                  : kinbox__backoff_ms(failures++, r->base_ms,
                                                       r->cap_ms));
        }
        wind_down(L);
        return NULL;
}

/* The source relay.source names, when the backend has it; NULL with
 * errstr. */
static const kinbox__logsrc_ops_t *
pick_source(const kinbox_conf_t *conf, const kinbox__db_t *db, char *errstr,
            size_t sz)
{
        static const char *const names[] = {"poll", "wal", "binlog"};
        kinbox__source_t src = kinbox__settings_of(conf)->relay_source;
        const kinbox__logsrc_ops_t *ops = kinbox__db_logsrc(db);
        if (ops && !strcmp(ops->name, names[src]))
                return ops;
        kinbox__errstr(errstr, sz,
                       "relay.source = %s: not available on %s (wal: "
                       "PostgreSQL; binlog: MariaDB%s)",
                       names[src], db->ops->name,
                       ops ? "" : "; not built yet");
        return NULL;
}

static void
log_free(lrelay_t *L)
{
        if (!L)
                return;
        free((char *)L->src.slot);
        free(L);
}

static lrelay_t *
log_new(kinbox_relay_t *r, const kinbox_conf_t *conf, kinbox__db_t *db,
        int *rc)
{
        lrelay_t *L = kinbox__calloc(1, sizeof(*L));
        if (!L) {
                *rc = KINBOX_ERR_NOMEM;
                return NULL;
        }
        L->r = r;
        L->src.ops = pick_source(conf, db, r->errstr, sizeof(r->errstr));
        L->src.conf = conf;
        L->src.log = &r->log;
        L->src.url = db->url;
        L->src.password = db->password;
        L->src.slot = kinbox__wal_slot_name(conf);
        const char *name = kinbox__settings_of(conf)->name;
        kinbox__m_labels(L->labels, sizeof(L->labels), "relay",
                         name ? name : "", (char *)NULL);
        *rc = !L->src.ops    ? KINBOX_ERR_CONFIG
              : !L->src.slot ? KINBOX_ERR_NOMEM
                             : KINBOX_OK;
        if (*rc) {
                log_free(L);
                return NULL;
        }
        return L;
}

int
kinbox__relay_log_start(kinbox_relay_t *r)
{
        int rc;
        lrelay_t *L = log_new(r, r->conf, r->db, &rc);
        if (!L)
                return rc;
        /* The prerequisites before anything runs: a refusal is exit 2. */
        if ((rc = L->src.ops->open(&L->src))) {
                snprintf(r->errstr, sizeof(r->errstr), "%s", L->src.err);
                log_free(L);
                return rc == KINBOX_ERR_DB_CONN || rc == KINBOX_ERR_STATE
                           ? KINBOX_ERR_DB_CONN
                           : rc;
        }
        L->opened = true;
        rlog(r, KINBOX_LOG_INFO, "relay %s: source %s, slot %s", r->owner,
             L->src.ops->name, L->src.slot);
        if (pthread_create(&L->thr, NULL, log_main, L)) {
                L->src.ops->close(&L->src);
                log_free(L);
                return KINBOX_ERR_NOMEM;
        }
        r->logr = L;
        return KINBOX_OK;
}

int
kinbox__relay_log_join(kinbox_relay_t *r)
{
        lrelay_t *L = r->logr;
        if (!L)
                return KINBOX_OK;
        pthread_join(L->thr, NULL);
        int rc = L->rc;
        if (r->rk_left)
                return rc; /* its records stay with the producer */
        log_free(L);
        r->logr = NULL;
        return rc;
}

bool
kinbox__relay_log_active(const kinbox_relay_t *r)
{
        return r->logr != NULL;
}

/* A log relay of conf made on a connection of its own (no relay running)
 * and handed to fn; its error (or the refusal to make it) in errstr.
 * Returns fn's result, or the error that stopped making it. */
static int
log_probe(const kinbox_conf_t *conf, int (*fn)(lrelay_t *L, void *arg),
          void *arg, char *errstr, size_t sz)
{
        kinbox__db_t *db = kinbox__db_new_conf(conf, errstr, sz);
        if (!db)
                return KINBOX_ERR_CONFIG;
        kinbox_relay_t fake;
        memset(&fake, 0, sizeof(fake));
        kinbox__conf_logger(conf, &fake.log);
        int rc;
        lrelay_t *L = log_new(&fake, conf, db, &rc);
        if (L) {
                rc = fn(L, arg);
                kinbox__errstr(errstr, sz, "%s", L->src.err);
                log_free(L);
        } else {
                kinbox__errstr(errstr, sz, "%s", fake.errstr);
        }
        kinbox__db_destroy(db);
        return rc;
}

static int
probe_open(lrelay_t *L, void *arg)
{
        (void)arg;
        int rc = L->src.ops->open(&L->src);
        if (!rc)
                L->src.ops->close(&L->src);
        return rc;
}

int
kinbox__relay_log_check(const kinbox_conf_t *conf, char *errstr, size_t sz)
{
        return log_probe(conf, probe_open, NULL, errstr, sz);
}

typedef struct lag_arg {
        char *slot;
        size_t slotsz;
        kinbox__loglag_t *out;
} lag_arg_t;

static int
probe_lag(lrelay_t *L, void *arg)
{
        lag_arg_t *a = arg;
        snprintf(a->slot, a->slotsz, "%s", L->src.slot);
        return L->src.ops->lag ? L->src.ops->lag(&L->src, a->out)
                               : KINBOX_ERR_INVALID;
}

int
kinbox__relay_log_lag(const kinbox_conf_t *conf, char *slot, size_t slotsz,
                      kinbox__loglag_t *out, char *errstr, size_t sz)
{
        lag_arg_t a = {slot, slotsz, out};
        return log_probe(conf, probe_lag, &a, errstr, sz);
}
