/*
 * relay_kafka.c -- the relay's Kafka side: the producer (its settings,
 * callbacks, warm-up), publishing a row with its headers (CloudEvents
 * too), and the topics' settings asked of the broker (max.message.bytes
 * for the size verdicts, a durability check once per topic).
 */
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "confval.h"
#include "kafka.h"
#include "relay_int.h"

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        KINBOX__UNUSED(rk);
        KINBOX__UNUSED(opaque);
        item_t *it = m->_private;
        if (!it)
                return;
        it->dr_done = true;
        it->dr_err = m->err;
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
        kinbox_relay_t *r = opaque;
        char buf[256];
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
                rd_kafka_fatal_error(rk, buf, sizeof(buf));
                atomic_store(&r->rk_fatal, true);
                rlog(r, KINBOX_LOG_ERR, "fatal producer error: %s", buf);
                return;
        }
        rlog(r, KINBOX_LOG_WARNING, "producer: %s: %s",
             rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

static void
rk_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        kinbox_relay_t *r = rd_kafka_opaque(rk);
        /* The relay sets enable.gapless.guarantee on purpose (per-aggregate
         * order, see kinbox__relay_producer_conf()): librdkafka's
         * "experimental" warning about it at every start says nothing to
         * the operator. */
        if (level == KINBOX_LOG_WARNING && !strcmp(fac, "CONFWARN") &&
            strstr(buf, "enable.gapless.guarantee is experimental"))
                level = KINBOX_LOG_DEBUG;
        if (r)
                kinbox__log(&r->log, level, "rdkafka", "%s: %s", fac, buf);
}

rd_kafka_t *
kinbox__relay_producer_new(kinbox_relay_t *r)
{
        char e[512];
        rd_kafka_conf_t *c = rd_kafka_conf_dup(r->rkconf);
        rd_kafka_conf_set_opaque(c, r);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof(e));
        if (!rk) {
                rd_kafka_conf_destroy(c);
                snprintf(r->errstr, sizeof(r->errstr),
                         "cannot create producer: %s", e);
                return NULL;
        }
        atomic_store(&r->rk_fatal, false);
        return rk;
}

static bool
hdrs_has(const hdrs_t *h, const char *name)
{
        for (size_t i = 0; i < h->n; i++)
                if (!strcmp(h->v[i].name, name))
                        return true;
        return false;
}

/* CloudEvents binary mode (Kafka protocol binding, relay.cloudevents.
 * source set): the required attributes and the time, each unless the row's
 * stored headers carry it. ce_id is the message id. */
static void
add_cloudevents(const kinbox_relay_t *r, const item_t *it, const hdrs_t *h,
                const char *id, size_t idn, rd_kafka_headers_t *kh)
{
        if (!hdrs_has(h, "ce_specversion"))
                rd_kafka_header_add(kh, "ce_specversion", -1, "1.0", 3);
        if (!hdrs_has(h, "ce_id"))
                rd_kafka_header_add(kh, "ce_id", -1, id, (ssize_t)idn);
        if (!hdrs_has(h, "ce_source"))
                rd_kafka_header_add(kh, "ce_source", -1, r->ce_source, -1);
        if (!hdrs_has(h, "ce_type"))
                rd_kafka_header_add(kh, "ce_type", -1,
                                    r->ce_type ? r->ce_type : it->destination,
                                    -1);
        if (!hdrs_has(h, "ce_time")) {
                char t[40];
                /* created_at on the database's clock: the record's
                 * timestamp, the same at every re-publish and from either
                 * relay (poll or log). */
                time_t sec = (time_t)(it->created_at_ms / 1000);
                struct tm tm;
                gmtime_r(&sec, &tm);
                size_t n = strftime(t, sizeof(t), "%Y-%m-%dT%H:%M:%S", &tm);
                snprintf(t + n, sizeof(t) - n, ".%03dZ",
                         (int)(it->created_at_ms % 1000));
                rd_kafka_header_add(kh, "ce_time", -1, t, -1);
        }
        if (r->ce_content_type && !hdrs_has(h, "content-type"))
                rd_kafka_header_add(kh, "content-type", -1, r->ce_content_type,
                                    -1);
}

/* Build the producer headers: the stored headers in order, then
 * message_id unless the row set one, then (CloudEvents) the ce_ attributes
 * the row did not set. */
static rd_kafka_headers_t *
build_headers(const kinbox_relay_t *r, const item_t *it, char *err,
              size_t errsz)
{
        hdrs_t h;
        if (headers_parse(it->headers_json, &h)) {
                snprintf(err, errsz,
                         "outbox row %" PRId64 ": malformed headers column",
                         it->id);
                return NULL;
        }
        rd_kafka_headers_t *kh = rd_kafka_headers_new(h.n + 7);
        const char *id = NULL;
        size_t idn = 0;
        for (size_t i = 0; i < h.n; i++) {
                rd_kafka_header_add(kh, h.v[i].name, -1, h.v[i].value,
                                    h.v[i].value ? (ssize_t)h.v[i].size : 0);
                if (!id && !strcmp(h.v[i].name, MSGID_HEADER) &&
                    h.v[i].value) {
                        id = h.v[i].value;
                        idn = h.v[i].size;
                }
        }
        char own[2 * KINBOX_OUTBOX_NAME_MAX + 2];
        if (!hdrs_has(&h, MSGID_HEADER)) {
                int n = snprintf(own, sizeof(own), "%s:%s", it->destination,
                                 it->idem_key);
                rd_kafka_header_add(kh, MSGID_HEADER, -1, own, n);
                id = own;
                idn = (size_t)n;
        }
        if (r->ce_source) {
                if (!id) { /* a null message_id header: the row's own id */
                        int n = snprintf(own, sizeof(own), "%s:%s",
                                         it->destination, it->idem_key);
                        id = own;
                        idn = (size_t)n;
                }
                add_cloudevents(r, it, &h, id, idn, kh);
        }
        hdrs_free(&h);
        return kh;
}

static void topic_durability(kinbox_relay_t *r, const char *topic);

const char *
kinbox__relay_kafka_err(const char *what, rd_kafka_resp_err_t e,
                        const char *topic, char *buf, size_t sz)
{
        const char *why = NULL;
        switch (e) {
        case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
        case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
                why = "the topic does not exist on the broker (kinbox does "
                      "not create topics): create it; the row is retried "
                      "with backoff";
                break;
        case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
        case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
                why = "not delivered when the relay's run ended (the broker "
                      "had not acknowledged it: a missing topic or an "
                      "unreachable broker); the row is retried with backoff";
                break;
        case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
                why = "not acknowledged within kafka.message.timeout.ms (a "
                      "missing topic or an unreachable broker); the row is "
                      "retried with backoff";
                break;
        default:
                break;
        }
        snprintf(buf, sz, "%s to %s: %s: %s%s%s", what, topic,
                 rd_kafka_err2name(e), rd_kafka_err2str(e), why ? ": " : "",
                 why ? why : "");
        return buf;
}

void
kinbox__relay_produce(kinbox_relay_t *r, item_t *it)
{
        kinbox__relay_produce_on(r, r->rk, it);
}

void
kinbox__relay_produce_on(kinbox_relay_t *r, rd_kafka_t *rk, item_t *it)
{
        char err[256];
        topic_durability(r, it->destination);
        rd_kafka_headers_t *kh = build_headers(r, it, err, sizeof(err));
        if (!kh) {
                set_err(it->err, err);
                it->out = OUT_DEAD; /* cannot ever be published as written */
                return;
        }
        if (r->tracing) {
                const void *tp = NULL;
                size_t tpn = 0;
                const void *tp2;
                size_t tpn2;
                /* One context, or none: W3C ignores several. */
                if (!rd_kafka_header_get(kh, 0, KINBOX_TRACEPARENT_HEADER, &tp,
                                         &tpn) &&
                    rd_kafka_header_get(kh, 1, KINBOX_TRACEPARENT_HEADER, &tp2,
                                        &tpn2))
                        kinbox__relay_trace_begin(r, it, tp, tpn);
        }
        for (int tries = 0;; tries++) {
                rd_kafka_resp_err_t e = rd_kafka_producev(
                    rk, RD_KAFKA_V_TOPIC(it->destination),
                    RD_KAFKA_V_KEY(it->aggregate_id,
                                   it->aggregate_id ? strlen(it->aggregate_id)
                                                    : 0),
                    RD_KAFKA_V_VALUE((void *)it->payload, it->payload_size),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_TIMESTAMP(it->created_at_ms),
                    RD_KAFKA_V_HEADERS(kh), RD_KAFKA_V_OPAQUE(it),
                    RD_KAFKA_V_END);
                if (!e) {
                        it->produced = true;
                        return;
                }
                if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL && tries < 50) {
                        rd_kafka_poll(rk, 100);
                        continue;
                }
                rd_kafka_headers_destroy(kh);
                if (e == RD_KAFKA_RESP_ERR__FATAL) {
                        /* The producer, not the row: back untouched; the
                         * relay makes a new producer before claiming. */
                        it->out = OUT_RELEASE;
                        return;
                }
                set_err(it->err,
                        kinbox__relay_kafka_err("produce", e, it->destination,
                                                err, sizeof(err)));
                /* Larger than kafka.message.max.bytes: no attempt can
                 * ever publish this row as written. */
                it->out = e == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE
                              ? OUT_DEAD
                              : OUT_RETRY;
                return;
        }
}

/* The topic's max.message.bytes (the broker's effective value, its
 * default included), from a DescribeConfigs on the producer, remembered
 * for a minute; -1 when the broker does not answer within 5 s. */
static rd_kafka_t *admin_handle(kinbox_relay_t *r);

static int topic_configs(rd_kafka_t *rk, const char *topic, const char *n1,
                         int64_t *v1, const char *n2, int64_t *v2);

int64_t
kinbox__relay_topic_max_bytes(kinbox_relay_t *r, const char *topic)
{
        int64_t now = kinbox__now_ms();
        struct topic_limit *slot = NULL;
        for (int i = 0; i < r->nlimits; i++)
                if (!strcmp(r->limits[i].topic, topic)) {
                        if (now - r->limits[i].at < LIMIT_TTL_MS)
                                return r->limits[i].bytes;
                        slot = &r->limits[i];
                }
        if (!slot) {
                if (r->nlimits == LIMITS_MAX) {
                        free(r->limits[0].topic);
                        memmove(&r->limits[0], &r->limits[1],
                                sizeof(r->limits[0]) * (LIMITS_MAX - 1));
                        r->nlimits--;
                }
                slot = &r->limits[r->nlimits];
                slot->topic = kinbox__strdup(topic);
                if (!slot->topic)
                        return -1;
                r->nlimits++;
        }
        slot->at = now;
        slot->bytes = -1;
        rd_kafka_t *rk = admin_handle(r);
        if (!rk)
                return -1;
        int64_t v = -1;
        topic_configs(rk, topic, "max.message.bytes", &v, NULL, NULL);
        slot->bytes = v;
        return slot->bytes;
}

/* The relay's admin client, made on first need (pthread_once-like under
 * checks_mu: the checker thread and the relay thread share it). */
static rd_kafka_t *
admin_handle(kinbox_relay_t *r)
{
        pthread_mutex_lock(&r->checks_mu);
        if (!r->admin_rk) {
                /* Not the producer: after a refused request it is failed
                 * (the gapless guarantee). The user's settings (security,
                 * bootstrap) without the producer's callbacks' work. */
                rd_kafka_conf_t *c = rd_kafka_conf_dup(r->rkconf);
                rd_kafka_conf_set(c, "enable.idempotence", "false", NULL, 0);
                rd_kafka_conf_set(c, "enable.gapless.guarantee", "false", NULL,
                                  0);
                rd_kafka_conf_set_dr_msg_cb(c, NULL);
                /* Its log lines into the relay's logger (rk_log_cb()). */
                rd_kafka_conf_set_opaque(c, r);
                r->admin_rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, NULL, 0);
                if (!r->admin_rk)
                        rd_kafka_conf_destroy(c);
        }
        rd_kafka_t *rk = r->admin_rk;
        pthread_mutex_unlock(&r->checks_mu);
        return rk;
}

/* Integer values of up to three topic configs (NULL names are skipped;
 * -1 where the broker did not say; booleans as 0/1). Returns 0 when the
 * broker answered. */
static int
topic_configs(rd_kafka_t *rk, const char *topic, const char *n1, int64_t *v1,
              const char *n2, int64_t *v2)
{
        rd_kafka_ConfigResource_t *res =
            rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AdminOptions_t *o =
            rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
        rd_kafka_AdminOptions_set_request_timeout(o, 5000, NULL, 0);
        rd_kafka_DescribeConfigs(rk, &res, 1, o, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 6000);
        const rd_kafka_DescribeConfigs_result_t *dr =
            ev ? rd_kafka_event_DescribeConfigs_result(ev) : NULL;
        size_t nres = 0, ncf = 0;
        const rd_kafka_ConfigResource_t **rs =
            dr && !rd_kafka_event_error(ev)
                ? rd_kafka_DescribeConfigs_result_resources(dr, &nres)
                : NULL;
        const rd_kafka_ConfigEntry_t **cf =
            nres == 1 && !rd_kafka_ConfigResource_error(rs[0])
                ? rd_kafka_ConfigResource_configs(rs[0], &ncf)
                : NULL;
        for (size_t i = 0; i < ncf; i++) {
                const char *v = rd_kafka_ConfigEntry_value(cf[i]);
                const char *n = rd_kafka_ConfigEntry_name(cf[i]);
                int64_t x = !v                    ? -1
                            : !strcmp(v, "true")  ? 1
                            : !strcmp(v, "false") ? 0
                                                  : strtoll(v, NULL, 10);
                if (n1 && !strcmp(n, n1))
                        *v1 = x;
                if (n2 && !strcmp(n, n2))
                        *v2 = x;
        }
        int rc = cf ? 0 : -1;
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(o);
        rd_kafka_queue_destroy(q);
        rd_kafka_ConfigResource_destroy(res);
        return rc;
}

/* A topic's replication factor (its first partition's replicas), -1 when
 * unknown. */
static int
topic_replication(rd_kafka_t *rk, const char *topic)
{
        rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
        const struct rd_kafka_metadata *md = NULL;
        int rf = -1;
        if (t && rd_kafka_metadata(rk, 0, t, &md, 5000) == 0 &&
            md->topic_cnt == 1 && !md->topics[0].err &&
            md->topics[0].partition_cnt > 0)
                rf = md->topics[0].partitions[0].replica_cnt;
        if (md)
                rd_kafka_metadata_destroy(md);
        if (t)
                rd_kafka_topic_destroy(t);
        return rf;
}

/* Once per topic: are its settings the ones the relay's guarantee needs?
 * An acknowledged row (acks=all) survives a broker's loss only with a
 * replication factor of 3 (or more) and min.insync.replicas of 2 (or
 * more), and only when no out-of-sync replica may become leader. kinbox
 * publishes anyway (the user's cluster, the user's choice) and says so. */
static void
durability_check(kinbox_relay_t *r, const char *topic)
{
        rd_kafka_t *rk = admin_handle(r);
        if (!rk)
                return;
        int64_t isr = -1, unclean = -1;
        if (topic_configs(rk, topic, "min.insync.replicas", &isr,
                          "unclean.leader.election.enable", &unclean))
                return; /* no answer (or not a real broker): nothing said */
        int rf = topic_replication(rk, topic);
        if ((rf >= 0 && rf < 3) || (isr >= 0 && isr < 2))
                rlog(r, KINBOX_LOG_WARNING,
                     "topic %s: replication factor %d, min.insync.replicas "
                     "%" PRId64 ": a published row can be lost with one "
                     "broker; the relay's guarantee needs replication factor "
                     ">= 3 and min.insync.replicas >= 2 (docs/kafka.md)",
                     topic, rf, isr);
        if (unclean == 1)
                rlog(r, KINBOX_LOG_WARNING,
                     "topic %s: unclean.leader.election.enable = true: an "
                     "out-of-sync replica may become leader and drop "
                     "published rows; set it to false (docs/kafka.md)",
                     topic);
}

static void *
checker_main(void *arg)
{
        kinbox_relay_t *r = arg;
        pthread_mutex_lock(&r->checks_mu);
        for (;;) {
                while (!r->checker_stop && !r->nto_check)
                        pthread_cond_wait(&r->checks_cv, &r->checks_mu);
                if (r->checker_stop)
                        break;
                char *topic = r->to_check[--r->nto_check];
                pthread_mutex_unlock(&r->checks_mu);
                durability_check(r, topic);
                free(topic);
                pthread_mutex_lock(&r->checks_mu);
        }
        pthread_mutex_unlock(&r->checks_mu);
        return NULL;
}

/* The first row for a topic asks the checker thread to look at it; never
 * waits. */
static void
topic_durability(kinbox_relay_t *r, const char *topic)
{
        pthread_mutex_lock(&r->checks_mu);
        for (int i = 0; i < r->nchecked; i++)
                if (!strcmp(r->checked[i], topic)) {
                        pthread_mutex_unlock(&r->checks_mu);
                        return;
                }
        if (r->nchecked == (int)KINBOX__ARRAY_SIZE(r->checked) ||
            r->nto_check == (int)KINBOX__ARRAY_SIZE(r->to_check)) {
                pthread_mutex_unlock(&r->checks_mu);
                return; /* many topics: the first ones were checked */
        }
        char *a = kinbox__strdup(topic), *b = kinbox__strdup(topic);
        if (!a || !b) {
                free(a);
                free(b);
                pthread_mutex_unlock(&r->checks_mu);
                return;
        }
        r->checked[r->nchecked++] = a;
        r->to_check[r->nto_check++] = b;
        if (!r->checker_started &&
            pthread_create(&r->checker, NULL, checker_main, r) == 0)
                r->checker_started = true;
        pthread_cond_signal(&r->checks_cv);
        pthread_mutex_unlock(&r->checks_mu);
}

/* The producer is ready before the first claim: brokers connected,
 * metadata known, the idempotent producer id requested. */
void
kinbox__relay_producer_warm(kinbox_relay_t *r)
{
        const struct rd_kafka_metadata *md = NULL;
        int64_t t0 = kinbox__now_ms();
        if (rd_kafka_metadata(r->rk, 1, NULL, &md, 5000) ==
            RD_KAFKA_RESP_ERR_NO_ERROR)
                rd_kafka_metadata_destroy(md);
        else
                rlog(r, KINBOX_LOG_WARNING,
                     "no broker metadata yet (publishing will wait)");
        /* The idempotent producer id is requested as soon as a broker is
         * up (one round trip), while the relay opens its LISTEN connection
         * and runs its first claim: rows produced before it arrives wait
         * inside the producer, no longer than that. */
        rd_kafka_poll(r->rk, 0);
        rlog(r, KINBOX_LOG_DEBUG, "producer ready in %" PRId64 " ms",
             kinbox__now_ms() - t0);
}

/* The producer template: the relay's defaults, the kafka.* settings over
 * them, then the settings the relay's order depends on. */
bool
kinbox__relay_producer_conf(kinbox_relay_t *r, const kinbox_conf_t *conf,
                            char *errstr, size_t errstr_size)
{
        /* A claim is a batch already: librdkafka's default linger (5 ms)
         * only adds latency to every cycle (kafka.linger.ms or its alias
         * kafka.queue.buffering.max.ms wins).
         * Keys on the partitions the Java producer (and so Spring, Kafka
         * Streams, Connect) puts them: murmur2 of the key, random for a
         * row without one. librdkafka's own default (consistent_random,
         * CRC32) would put most keys elsewhere, and a key written by a
         * Java service and by the relay would lose its order. The user's
         * kafka.partitioner wins (e.g. consistent_random to keep the
         * mapping of topics an older kinbox wrote; docs/outbox.md).
         * Partitions added to a topic: the new count within 10 s, not
         * librdkafka's 5 minutes (a topic of rows keyed by aggregate
         * still needs draining first: docs/operations.md). */
        static const char *const defaults[] = {
            "linger.ms",
            RELAY_LINGER_MS,
            "partitioner",
            RELAY_PARTITIONER,
            "topic.metadata.refresh.interval.ms",
            RELAY_METADATA_REFRESH_MS,
            NULL};
        /* Runs of one aggregate are in flight together: a row must never
         * be written after an earlier row of its partition failed.
         *  - The gapless guarantee turns a failed batch that would leave a
         *    gap into a fatal error (all outstanding messages fail, the
         *    relay makes a new producer) instead of writing later rows.
         *  - It does not cover message timeouts, which librdkafka applies
         *    message by message (an earlier row can time out while a later
         *    one is still sent). So librdkafka never times messages out
         *    (message.timeout.ms = 0); the relay enforces
         *    kafka.message.timeout.ms itself, per batch, by purging
         *    everything queued and in flight at one instant. */
        static const char *const forced[] = {"enable.idempotence",
                                             "true",
                                             "enable.gapless.guarantee",
                                             "true",
                                             "message.timeout.ms",
                                             "0",
                                             NULL};
        const kinbox__rkconf_spec_t spec = {defaults, NULL, forced};
        r->rkconf = kinbox__rkconf_new(conf, &spec, errstr, errstr_size);
        if (!r->rkconf)
                return false;
        const char *ct = kinbox_conf_get(conf, "kafka.compression.type");
        if (!ct)
                ct = kinbox_conf_get(conf, "kafka.compression.codec");
        r->compressed = ct && strcmp(ct, "none");
        rd_kafka_conf_set_dr_msg_cb(r->rkconf, dr_cb);
        rd_kafka_conf_set_error_cb(r->rkconf, error_cb);
        rd_kafka_conf_set_log_cb(r->rkconf, rk_log_cb);
        return true;
}
