/*
 * relay.c -- the outbox relay: claim due rows, publish them with the
 * idempotent producer (or run their local action), mark them with a
 * version check; failures back off with full jitter and go dead after
 * max attempts. PostgreSQL LISTEN/NOTIFY wake-up, polling as fallback.
 *
 * One cycle:
 *   1. claim (committed before any side effect): due pending rows that are
 *      the oldest pending row of their aggregate, FOR UPDATE SKIP LOCKED;
 *      next_attempt_at := now + lease, version := version + 1. Rows stay
 *      'pending', so a relay that dies just lets its lease expire.
 *   2. produce every event (key = aggregate id, header message_id =
 *      "<destination>:<idem_key>", user headers kept); run the actions one
 *      at a time on a worker thread with a timeout, while the producer works.
 *   3. wait for every delivery report (message.timeout.ms < lease).
 *   4. mark sent / record failures / hand back, each with
 *      WHERE id = ? AND version = ?: zero rows means another relay owns the
 *      row now — counted, never overwritten.
 * A cycle that finished rows starts the next one at once (so an aggregate's
 * next row follows right away); an empty claim waits for a NOTIFY or
 * relay.poll.ms.
 *
 * relay.claim = lock (lock-held claims, pipeline 1): step 1 writes nothing
 * and keeps its transaction open, the rows held by its row locks (FOR
 * UPDATE SKIP LOCKED, each aggregate's run cut at the first row it could
 * not lock); step 4 runs in that transaction and commits: one write per
 * row. A batch whose reports are not all in within relay.lock.ms of its
 * BEGIN, or that holds actions, degrades: the leases of step 1 are written
 * in its transaction, which commits, and it goes on as above. A database
 * failure while the locks are held ends the transaction: nothing is
 * marked, the rows are pending again at once and published again.
 *
 * Per-aggregate order holds because a row is only claimable while no older
 * row of its aggregate is pending, and that older row stays pending until
 * it was acknowledged by the broker (or went dead / was canceled). Rows of
 * one aggregate are ordered by id, i.e. by append order; writers of one
 * aggregate serialize on the aggregate's own row lock in practice.
 *
 * This file: the API and the cycle (step(): claim, publish, reap, mark).
 * The rest of the relay, along its parts, is in relay_kafka.c,
 * relay_action.c, relay_claim.c, relay_mark.c and relay_wake.c (what they
 * share: relay_int.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "confval.h"
#include "migrate.h"
#include "relay_int.h"
#include "relay_log.h"
#include "rkdestroy.h"
#include "wake.h"

/* Finish every batch whose reports are all in (or whose deadline passed).
 * Returns <0 on a database error, else the rows finished. */
static int
reap(kinbox_relay_t *r)
{
        int finished = 0;
        for (int i = 0; i < PIPE_MAX; i++) {
                batch_t *b = &r->pipe[i];
                if (!b->n)
                        continue;
                if (b->locked && !kinbox__relay_reported(b) &&
                    kinbox__now_ms() >= b->tx0 + r->lock_ms) {
                        /* The broker is slow: no transaction stays open
                         * past relay.lock.ms. */
                        int rc = kinbox__relay_degrade(
                            r, b, "delivery reports late");
                        if (rc < 0)
                                return rc;
                }
                if (!kinbox__relay_reported(b)) {
                        if (kinbox__now_ms() <
                            b->t0 + r->msg_timeout_ms + MARGIN_MS)
                                continue;
                        kinbox__relay_expire(r, b);
                }
                int rc = kinbox__relay_finish(r, b);
                r->inflight--;
                if (rc < 0)
                        return rc;
                finished += rc;
        }
        return finished;
}

/* Batch size follows the backlog: it starts at relay.batch.size, is
 * halved after a claim that filled less than half of it and doubled after
 * a full one, within [BATCH_MIN, batch]. A small claim keeps the window
 * of the next one (and the MariaDB candidate read) short. */
static void
resize(kinbox_relay_t *r, int64_t claimed)
{
        if (claimed >= r->cur_batch)
                r->cur_batch *= 2;
        else if (claimed < r->cur_batch / 2)
                r->cur_batch /= 2;
        if (r->cur_batch > r->batch)
                r->cur_batch = r->batch;
        if (r->cur_batch < BATCH_MIN)
                r->cur_batch = r->batch < BATCH_MIN ? r->batch : BATCH_MIN;
}

/* The producer's rd_kafka_destroy() within its bound; past it, the
 * handle is left to librdkafka's threads, and the relay's memory with it
 * (kinbox_relay_destroy() keeps it). Nothing is lost: a row is marked sent
 * only on its delivery report. */
static void
producer_destroy(kinbox_relay_t *r)
{
        if (!kinbox__rk_destroy_bounded(r->rk, 0, "relay_destroy_stall")) {
                rlog(r, KINBOX_LOG_ERR,
                     "relay %s: Kafka producer did not shut down within %d s "
                     "(a librdkafka termination hang); leaving it behind: "
                     "rows without a delivery report stay pending",
                     r->owner, KINBOX__RK_DESTROY_MS / 1000);
                r->rk_left = true;
        }
        r->rk = NULL;
}

static bool
producer_fatal(kinbox_relay_t *r)
{
        return atomic_load(&r->rk_fatal) ||
               rd_kafka_fatal_error(r->rk, NULL, 0) !=
                   RD_KAFKA_RESP_ERR_NO_ERROR;
}

/*
 * Whether another batch may be produced now. Not on a producer that
 * failed fatally (its rows would fail at once). Not while a batch in flight
 * has waited half its delivery deadline: that batch's deadline purges
 * everything in the producer, in flight included, and a request in flight
 * may already be written; a younger batch produced just before that purge
 * would see its rows fail although they are on the topic, and publish them
 * again after themselves (an aggregate's run "0..7, 0..7"). So a purge only
 * ever meets messages that have had kafka.message.timeout.ms / 2 to be
 * acknowledged, as with one batch in flight.
 */
static bool
may_produce(kinbox_relay_t *r)
{
        if (producer_fatal(r))
                return false;
        int64_t now = kinbox__now_ms();
        for (int i = 0; i < PIPE_MAX; i++) {
                const batch_t *b = &r->pipe[i];
                if (b->n && now - b->t0 >= r->msg_timeout_ms / 2 &&
                    !kinbox__relay_reported(b))
                        return false;
        }
        return true;
}

/*
 * One step of the pipeline: claim another batch while fewer than
 * relay.pipeline batches are in flight and rows may be waiting, serve
 * delivery reports, mark finished batches. Returns <0 on error, else 1
 * when more work may be waiting (go again at once), 0 when idle.
 */
static int
step(kinbox_relay_t *r, bool *more)
{
        bool go = *more && r->inflight < r->depth && !atomic_load(&r->stop) &&
                  may_produce(r);
        if (go) {
                batch_t *slot = NULL;
                for (int i = 0; i < PIPE_MAX && !slot; i++)
                        if (!r->pipe[i].n)
                                slot = &r->pipe[i];
                int64_t limit = r->cur_batch;
                int claimed = kinbox__relay_claim(r, slot);
                if (claimed < 0)
                        return claimed;
                resize(r, claimed);
                if (claimed > 0 && slot->locked &&
                    kinbox__relay_has_action(slot)) {
                        /* An action may run up to relay.action.timeout.ms:
                         * leases before anything runs, not row locks. */
                        int rc =
                            kinbox__relay_degrade(r, slot, "local actions");
                        if (rc < 0) {
                                /* Nothing was produced: drop the batch. */
                                free(slot->v);
                                kinbox_rows_destroy(slot->rows);
                                memset(slot, 0, sizeof(*slot));
                                return rc;
                        }
                }
                if (claimed > 0) {
                        r->inflight++;
                        kinbox__relay_start(r, slot);
                }
                /* A full claim: more rows are waiting. A partial one took
                 * every claimable row; the next ones become claimable when
                 * these are marked. */
                *more = claimed >= limit;
                go = *more && r->inflight < r->depth;
        }
        if (r->inflight) {
                /* Claiming again at once when the last claim was full;
                 * otherwise wait a little for delivery reports. */
                rd_kafka_poll(r->rk, go ? 0 : 1);
                int fin = reap(r);
                if (fin < 0)
                        return fin;
                if (fin > 0)
                        *more = true; /* next rows of those aggregates */
        }
        if (!r->inflight && producer_fatal(r)) {
                /* The idempotent producer cannot continue: new one. */
                rd_kafka_flush(r->rk, 1000);
                producer_destroy(r);
                r->rk = kinbox__relay_producer_new(r);
                if (!r->rk)
                        return KINBOX_ERR_KAFKA;
                kinbox__relay_producer_warm(r);
        }
        return *more || r->inflight ? 1 : 0;
}

/* Drop whatever is in flight (stop, error): wait for the reports, mark. */
static void
drain(kinbox_relay_t *r)
{
        int64_t until = kinbox__now_ms() + r->msg_timeout_ms + MARGIN_MS;
        while (r->inflight && kinbox__now_ms() < until) {
                rd_kafka_poll(r->rk, 10);
                if (reap(r) < 0)
                        break;
        }
        for (int i = 0; i < PIPE_MAX; i++) {
                batch_t *b = &r->pipe[i];
                if (!b->n)
                        continue;
                kinbox__relay_expire(r, b);
                if (kinbox__relay_finish(r, b) < 0) {
                        /* Marks failed: leases expire, rows are retried. */
                }
                r->inflight--;
        }
}

/* The relay.* settings (and the delivery deadline) into r; false with
 * errstr set when the lease leaves no margin. */
static bool
relay_settings(kinbox_relay_t *r, const kinbox_conf_t *conf, char *errstr,
               size_t errstr_size)
{
        /* Values are in the table's ranges (kinbox_conf_set). */
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        r->batch = s->relay_batch_size;
        r->depth = (int)s->relay_pipeline;
        r->run_max = s->relay_run_max;
        r->ce_source = s->relay_cloudevents_source;
        r->ce_type = s->relay_cloudevents_type;
        r->ce_content_type = s->relay_cloudevents_content_type;
        _Static_assert(PIPE_MAX >= 4, "relay.pipeline goes up to 4");
        r->lease_ms = s->relay_lease_ms;
        r->lock_ms = s->relay_lock_ms;
        /* Row locks only with one batch in flight: a second batch's claim
         * would need its own transaction on the one connection. */
        r->lock_mode = s->relay_claim == KINBOX__CLAIM_LOCK && r->depth == 1;
        r->poll_ms = s->relay_poll_ms;
        r->base_ms = s->relay_backoff_base_ms;
        r->cap_ms = s->relay_backoff_max_ms;
        r->max_attempts = (int)s->relay_max_attempts;
        r->action_ms = s->relay_action_timeout_ms;
        r->notify = s->relay_notify;
        if (r->cap_ms < r->base_ms)
                r->cap_ms = r->base_ms;

        const char *mt = kinbox_conf_get(conf, "kafka.message.timeout.ms");
        r->msg_timeout_ms = mt ? to_i64(mt) : r->lease_ms / 2;
        if (r->lease_ms < 2 * MARGIN_MS ||
            r->action_ms + MARGIN_MS >= r->lease_ms ||
            r->msg_timeout_ms <= 0 ||
            r->msg_timeout_ms + MARGIN_MS >= r->lease_ms) {
                kinbox__errstr(
                    errstr, errstr_size,
                    "relay.lease.ms (%" PRId64 ") must exceed "
                    "relay.action.timeout.ms (%" PRId64 ") and "
                    "kafka.message.timeout.ms (%" PRId64 ") by at least %d ms",
                    r->lease_ms, r->action_ms, r->msg_timeout_ms, MARGIN_MS);
                return false;
        }
        /* A lock-held batch degrades before half its delivery deadline,
         * so the deadline's purge only ever meets leased batches. */
        if (r->lock_ms > r->msg_timeout_ms / 2)
                r->lock_ms =
                    r->msg_timeout_ms / 2 > 0 ? r->msg_timeout_ms / 2 : 1;
        return true;
}

kinbox_relay_t *
kinbox_relay_new(kinbox_conf_t *conf, char *errstr, size_t errstr_size)
{
        if (!conf) {
                kinbox__errstr(errstr, errstr_size, "no configuration");
                return NULL;
        }
        kinbox_relay_t *r = kinbox__calloc(1, sizeof(*r));
        if (!r) {
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return NULL;
        }
        r->pipefd[0] = r->pipefd[1] = -1;
        pthread_mutex_init(&r->lock, NULL);
        pthread_cond_init(&r->jobs_cv, NULL);
        pthread_mutex_init(&r->checks_mu, NULL);
        pthread_cond_init(&r->checks_cv, NULL);
        if (!relay_settings(r, conf, errstr, errstr_size))
                goto fail;
        if (!kinbox_conf_get(conf, "kafka.bootstrap.servers")) {
                kinbox__errstr(errstr, errstr_size,
                               "kafka.bootstrap.servers is required");
                goto fail;
        }

        /* Producer configuration, validated now. */
        r->rkconf = rd_kafka_conf_new();
        if (!kinbox__relay_producer_conf(r, conf, errstr, errstr_size))
                goto fail;

        kinbox__conf_logger(conf, &r->log);
        r->db = kinbox__db_new_conf(conf, errstr, errstr_size);
        if (!r->db)
                goto fail;

        char host[128] = "localhost";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        const char *name = kinbox__settings_of(conf)->name;
        kinbox__buf_t o;
        kinbox__buf_init(&o);
        kinbox__buf_printf(&o, "%.100s@%.100s:%ld",
                           name && *name ? name : "kinbox", host,
                           (long)getpid());
        r->owner = o.oom ? NULL : o.p;
        if (!r->owner) {
                kinbox__buf_free(&o);
                kinbox__errstr(errstr, errstr_size, "out of memory");
                goto fail;
        }
        if (pipe(r->pipefd)) {
                kinbox__errstr(errstr, errstr_size, "pipe: %s",
                               strerror(errno));
                goto fail;
        }
        for (int i = 0; i < 2; i++) {
                fcntl(r->pipefd[i], F_SETFL,
                      fcntl(r->pipefd[i], F_GETFL) | O_NONBLOCK);
                fcntl(r->pipefd[i], F_SETFD, FD_CLOEXEC);
        }
        if (kinbox__tracing_acquire(conf, &r->tracing, errstr, errstr_size))
                goto fail;
        r->conf = conf;
        return r;
fail:
        r->conf = NULL; /* still the caller's */
        kinbox_relay_destroy(r);
        return NULL;
}

kinbox_err_t
kinbox_relay_register_action(kinbox_relay_t *r, const char *name,
                             kinbox_action_fn fn, void *opaque)
{
        if (!r || !name || !*name || !fn ||
            strlen(name) + strlen(KINBOX_OUTBOX_ACTION_PREFIX) >
                KINBOX_OUTBOX_NAME_MAX)
                return KINBOX_ERR_INVALID;
        if (atomic_load(&r->running))
                return KINBOX_ERR_STATE;
        for (size_t i = 0; i < r->nactions; i++) {
                if (!strcmp(r->actions[i].name, name)) {
                        r->actions[i].fn = fn;
                        r->actions[i].opaque = opaque;
                        return KINBOX_OK;
                }
        }
        action_reg_t *nv =
            realloc(r->actions, (r->nactions + 1) * sizeof(*nv));
        if (!nv)
                return KINBOX_ERR_NOMEM;
        r->actions = nv;
        char *dup = kinbox__strdup(name);
        if (!dup)
                return KINBOX_ERR_NOMEM;
        r->actions[r->nactions++] = (action_reg_t){dup, fn, opaque};
        return KINBOX_OK;
}

/* The log relay (relay.source = wal | binlog: its prerequisites first, a
 * refusal is KINBOX_ERR_CONFIG), then the polling relay's producer. */
static int
producers_start(kinbox_relay_t *r)
{
        int rc;
        if (kinbox__settings_of(r->conf)->relay_source !=
                KINBOX__SOURCE_POLL &&
            (rc = kinbox__relay_log_start(r)))
                return rc;
        r->rk = kinbox__relay_producer_new(r);
        if (!r->rk)
                return KINBOX_ERR_KAFKA;
        kinbox__relay_producer_warm(r);
        return 0;
}

/* The log relay stopped with the relay; its failure (a refusal met
 * while running) is the run's unless the run failed first. */
static kinbox_err_t
log_join(kinbox_relay_t *r, kinbox_err_t ret)
{
        if (!kinbox__relay_log_active(r))
                return ret;
        kinbox_relay_stop(r);
        int rc = kinbox__relay_log_join(r);
        return rc && ret == KINBOX_OK ? (kinbox_err_t)rc : ret;
}

/* The run's start: the database, its schema, the producers (and the log
 * relay), LISTEN, the wake-up pipe. KINBOX_OK, or the error (r->errstr). */
static kinbox_err_t
run_begin(kinbox_relay_t *r)
{
        int rc = kinbox__db_connect(r->db);
        if (rc) {
                snprintf(r->errstr, sizeof(r->errstr),
                         "database unreachable: %s", r->db->err.msg);
                return KINBOX_ERR_DB_CONN;
        }
        if ((rc = kinbox__schema_check_db(r->db, NULL, r->errstr,
                                          sizeof(r->errstr))))
                return (kinbox_err_t)rc;
        if ((rc = producers_start(r)))
                return (kinbox_err_t)rc;
        kinbox__relay_listen_open(r);
        kinbox__wake_register(r->pipefd[1], &r->sleeping);
        r->cur_batch = r->batch;
        r->idle_ms = POLL_MIN_MS;
        rlog(r, KINBOX_LOG_INFO,
             "relay %s started (%s, batch %" PRId64 ", lease %" PRId64
             " ms, claims %s, %s)",
             r->owner, r->db->ops->name, r->batch, r->lease_ms,
             r->lock_mode ? "lock-held" : "leased",
             r->listen ? "LISTEN/NOTIFY" : "polling");
        return KINBOX_OK;
}

/* Claim and publish until stopped: KINBOX_OK, or KINBOX_ERR_KAFKA (a
 * fatal producer). */
static kinbox_err_t
run_loop(kinbox_relay_t *r)
{
        int rc, failures = 0;
        bool connected = true, more = true;
        /* The log relay publishes the events; with no local action to
         * run there is nothing to claim. */
        while (kinbox__relay_log_active(r) && !r->nactions &&
               !atomic_load(&r->stop))
                kinbox__relay_wait(r, 1000);
        while (!atomic_load(&r->stop)) {
                if (!connected) {
                        rc = kinbox__db_connect(r->db);
                        if (rc) {
                                STAT_ADD(r, db_errors, 1);
                                kinbox__relay_wait(
                                    r, kinbox__backoff_ms(
                                           failures++, r->base_ms, r->cap_ms));
                                continue;
                        }
                        connected = true;
                }
                bool asked = more;
                rc = step(r, &more);
                if (rc < 0) {
                        STAT_ADD(r, db_errors, 1);
                        rlog(r, KINBOX_LOG_WARNING, "relay: %s: %s",
                             kinbox_err_name((kinbox_err_t)rc),
                             r->db->err.msg);
                        if (rc == KINBOX_ERR_KAFKA)
                                return KINBOX_ERR_KAFKA;
                        if (rc == KINBOX_ERR_DB_CONN ||
                            rc == KINBOX_ERR_COMMIT_UNKNOWN)
                                connected = false;
                        kinbox__relay_wait(r, kinbox__backoff_ms(failures++,
                                                                 r->base_ms,
                                                                 r->cap_ms));
                        more = true;
                        continue;
                }
                failures = 0;
                if (rc > 0) {
                        if (more)
                                r->idle_ms = POLL_MIN_MS;
                        continue;
                }
                kinbox__relay_idle(r, &more, asked);
        }
        return KINBOX_OK;
}

kinbox_err_t
kinbox_relay_run(kinbox_relay_t *r)
{
        if (!r)
                return KINBOX_ERR_INVALID;
        bool expected = false;
        if (!atomic_compare_exchange_strong(&r->running, &expected, true))
                return KINBOX_ERR_STATE;
        r->errstr[0] = '\0';
        kinbox_err_t ret = run_begin(r);
        if (ret == KINBOX_OK) {
                ret = run_loop(r);
                drain(r);
        }
        ret = log_join(r, ret);
        kinbox__wake_unregister(r->pipefd[1]);
        kinbox__relay_listen_close(r);
        if (r->rk) {
                rd_kafka_flush(r->rk, 5000);
                producer_destroy(r);
                r->rk = NULL;
        }
        if (r->db)
                r->db->ops->disconnect(r->db);
        kinbox__relay_faillog_flush(r);
        rlog(r, KINBOX_LOG_INFO, "relay %s stopped", r->owner);
        atomic_store(&r->running, false);
        return ret;
}

void
kinbox_relay_stop(kinbox_relay_t *r)
{
        if (r)
                kinbox__relay_halt(r);
}

void
kinbox_relay_stats(const kinbox_relay_t *r, kinbox_relay_stats_t *out)
{
        if (!r || !out)
                return;
        kinbox_relay_t *m = (kinbox_relay_t *)r;
        pthread_mutex_lock(&m->lock);
        *out = r->stats;
        pthread_mutex_unlock(&m->lock);
}

const char *
kinbox_relay_errstr(const kinbox_relay_t *r)
{
        return r ? r->errstr : "";
}

void
kinbox_relay_destroy(kinbox_relay_t *r)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        while (r->live_jobs > 0)
                pthread_cond_wait(&r->jobs_cv, &r->lock);
        pthread_mutex_unlock(&r->lock);
        kinbox__relay_listen_close(r);
        if (r->checker_started) {
                pthread_mutex_lock(&r->checks_mu);
                r->checker_stop = true;
                pthread_cond_signal(&r->checks_cv);
                pthread_mutex_unlock(&r->checks_mu);
                pthread_join(r->checker, NULL);
                r->checker_started = false;
        }
        if (r->rk)
                producer_destroy(r);
        if (r->admin_rk &&
            !kinbox__rk_destroy_bounded(r->admin_rk, 0, "relay_destroy_stall"))
                r->rk_left = true;
        if (r->rk_left) {
                /* Its librdkafka threads may still call back with r (the
                 * handles' opaque): r stays theirs. */
                rlog(r, KINBOX_LOG_ERR,
                     "relay %s: leaving its memory behind: a Kafka client "
                     "did not shut down",
                     r->owner);
                kinbox__rk_abandon(r);
                return;
        }
        if (r->rkconf)
                rd_kafka_conf_destroy(r->rkconf);
        if (r->db)
                kinbox__db_destroy(r->db);
        for (size_t i = 0; i < r->nactions; i++)
                free(r->actions[i].name);
        free(r->actions);
        free(r->owner);
        for (int i = 0; i < 2; i++)
                if (r->pipefd[i] >= 0)
                        close(r->pipefd[i]);
        pthread_mutex_destroy(&r->lock);
        pthread_cond_destroy(&r->jobs_cv);
        kinbox_conf_destroy(r->conf);
        for (int i = 0; i < r->nlimits; i++)
                free(r->limits[i].topic);
        for (int i = 0; i < r->nchecked; i++)
                free(r->checked[i]);
        for (int i = 0; i < r->nto_check; i++)
                free(r->to_check[i]);
        pthread_mutex_destroy(&r->checks_mu);
        pthread_cond_destroy(&r->checks_cv);
        kinbox__tracing_release(r->tracing);
        free(r);
}
