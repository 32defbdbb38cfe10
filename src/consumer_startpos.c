/*
 * consumer_startpos.c -- where each assigned partition starts, and the
 * partitions refused because the database's record and Kafka's state
 * disagree in a way that would skip records (docs/failures.md, "Start
 * positions"). The rule is kinbox_startpos_classify() (startpos.c), the
 * same one `kinbox offsets`, `verify` and `status` report.
 *
 * A watermark carries the identity of the record at W-1 (batch.c writes
 * it). When it is known and W-1 is still in the log, the partition starts
 * at W-1: the first message must be that record, which is then dropped
 * (never handed to a handler, never counted); another record means another
 * incarnation of the topic, and the partition is refused.
 */
#include "consumer_int.h"
#include "internal.h"
#include "kafka.h"
#include "metrics.h"
#include "settings.h"
#include "startpos.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
kinbox__startpos_gauge(kinbox_consumer_t *c)
{
        int n = 0;
        for (kinbox__part_t *p = c->parts; p; p = p->next)
                n += p->refused && !p->revoked;
        char lb[300];
        kinbox__m_set("kinbox_consumer_partitions_refused",
                      kinbox__m_labels(lb, sizeof(lb), "consumer", c->name,
                                       (char *)NULL),
                      n);
}

/* How long the log's range of an assignment's partitions may take to
 * come back (all of them: one pass). */
#define RANGE_WAIT_MS 5000

static const char *
num(char *b, size_t sz, int64_t v)
{
        if (v < 0)
                snprintf(b, sz, "none");
        else
                snprintf(b, sz, "%" PRId64, v);
        return b;
}

/* The error line of a refused partition: what was found, what resolves
 * it. */
static void
log_refused(kinbox_consumer_t *c, const kinbox__part_t *p, kinbox_startpos_t v)
{
        char w[24], cm[24], l[24], h[24];
        const char *g = kinbox__settings_of(c->conf)->group_id;
        kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer",
                    "%s (group %s): %s [%" PRId32 "] refused (%s): %s; DB "
                    "watermark %s, Kafka committed %s, log %s..%s; nothing "
                    "of this partition is consumed until resolved: stop "
                    "the group's consumers, `kinbox offsets list -c FILE "
                    "--consumer %s`, then `kinbox offsets reset -c FILE "
                    "--consumer %s --topic %s --partition %" PRId32
                    " %s` (docs/failures.md)",
                    c->name, g, p->topic, p->partition,
                    kinbox_startpos_name(v), kinbox_startpos_reason(v),
                    num(w, sizeof(w), p->sp_w), num(cm, sizeof(cm), p->sp_c),
                    num(l, sizeof(l), p->sp_l), num(h, sizeof(h), p->sp_h),
                    c->name, c->name, p->topic, p->partition,
                    kinbox__startpos_fix(v));
}

/* Where a partition that is not refused starts (pl's tp->offset). */
static void
start_at_watermark(kinbox_consumer_t *c, kinbox__part_t *p,
                   const kinbox__wm_t *wm, rd_kafka_topic_partition_t *tp,
                   kinbox_startpos_t v, rd_kafka_topic_partition_list_t *ahead)
{
        int64_t w = wm->next_offset;
        if (v == KINBOX_STARTPOS_BEHIND)
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "%s [%" PRId32 "]: Kafka committed offset %" PRId64
                            " is behind the DB watermark %" PRId64
                            " (a crash between the database's commit and "
                            "the offset commit, or an offset reset to an "
                            "earlier position): records %" PRId64 "..%" PRId64
                            " were applied here, starting at %" PRId64,
                            p->topic, p->partition, p->sp_c, w, p->sp_c, w - 1,
                            w);
        bool store = p->sp_c != w;
        if (wm->has_identity && p->sp_l >= 0 && w - 1 >= p->sp_l) {
                tp->offset = w - 1;
                p->verify = true;
                p->verify_off = w - 1;
                p->verify_ts = wm->last_ts;
                p->verify_hash = wm->last_hash;
                p->store_w = store;
                return;
        }
        if (wm->has_identity && w > 0)
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "consumer",
                            "%s [%" PRId32 "]: the record at %" PRId64
                            " is no longer in the log (log starts at %s): "
                            "its incarnation is not checked",
                            p->topic, p->partition, w - 1,
                            p->sp_l >= 0 ? "a later offset" : "unknown");
        tp->offset = w;
        if (store)
                rd_kafka_topic_partition_list_add(ahead, p->topic,
                                                  p->partition)
                    ->offset = w;
}

/* The log's range [L, H) of each partition of pl into its p->sp_l/sp_h
 * (-1 each when the broker does not answer), all asked in one pass. */
static void
log_ranges(kinbox_consumer_t *c, rd_kafka_topic_partition_list_t *pl)
{
        size_t n = (size_t)pl->cnt + 1;
        int64_t *lo = kinbox__calloc(n, sizeof(*lo));
        int64_t *hi = kinbox__calloc(n, sizeof(*hi));
        rd_kafka_resp_err_t *e = kinbox__calloc(n, sizeof(*e));
        if (lo && hi && e)
                kinbox__log_ranges(c->rk, pl, lo, hi, e, RANGE_WAIT_MS);
        for (int i = 0; i < pl->cnt; i++) {
                rd_kafka_topic_partition_t *tp = &pl->elems[i];
                kinbox__part_t *p =
                    kinbox__part_find(c, tp->topic, tp->partition);
                if (!p)
                        continue;
                rd_kafka_resp_err_t pe =
                    lo && hi && e ? e[i] : RD_KAFKA_RESP_ERR__FAIL;
                if (pe)
                        kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                                    "%s [%" PRId32 "]: the log's range is "
                                    "unknown (%s): the watermark is not "
                                    "checked against it",
                                    p->topic, p->partition,
                                    rd_kafka_err2str(pe));
                p->sp_l = pe ? -1 : lo[i];
                p->sp_h = pe ? -1 : hi[i];
        }
        free(lo);
        free(hi);
        free(e);
}

void
kinbox__startpos_assign(kinbox_consumer_t *c,
                        rd_kafka_topic_partition_list_t *pl,
                        rd_kafka_topic_partition_list_t *ahead,
                        rd_kafka_topic_partition_list_t *refuse)
{
        rd_kafka_resp_err_t e = rd_kafka_committed(c->rk, pl, 10000);
        if (e)
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "%s: committed offsets unavailable: %s (Kafka's "
                            "side is not checked)",
                            c->name, rd_kafka_err2str(e));
        kinbox__wm_t *wms = NULL;
        size_t nwm = 0;
        int rc = kinbox__wms_read(c->grp.ctl, c->name, &wms, &nwm);
        if (rc)
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "%s: reading offset watermarks: %s (starting "
                            "from Kafka's committed offsets; the inbox "
                            "still deduplicates)",
                            c->name, c->grp.ctl->err.msg);
        if (!rc)
                log_ranges(c, pl);
        for (int i = 0; !rc && i < pl->cnt; i++) {
                rd_kafka_topic_partition_t *tp = &pl->elems[i];
                kinbox__part_t *p =
                    kinbox__part_find(c, tp->topic, tp->partition);
                if (!p)
                        continue;
                const kinbox__wm_t *wm =
                    kinbox__wms_find(wms, nwm, tp->topic, tp->partition);
                p->sp_w = wm ? wm->next_offset : -1;
                p->sp_c = !e && tp->offset >= 0 ? tp->offset : -1;
                kinbox_startpos_t v = kinbox_startpos_classify(
                    p->sp_w, p->sp_c, p->sp_l, p->sp_h);
                if (kinbox_startpos_refused(v)) {
                        p->refused = true;
                        rd_kafka_topic_partition_list_add(refuse, p->topic,
                                                          p->partition);
                        log_refused(c, p, v);
                } else if (wm) {
                        start_at_watermark(c, p, wm, tp, v, ahead);
                }
        }
        kinbox__wms_free(wms, nwm);
}

static void
refuse_now(kinbox_consumer_t *c, kinbox__part_t *p, kinbox_startpos_t v)
{
        p->refused = true;
        p->paused = true;
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition);
        rd_kafka_pause_partitions(c->rk, l);
        rd_kafka_topic_partition_list_destroy(l);
        log_refused(c, p, v);
        kinbox__startpos_gauge(c);
}

/* The start position is confirmed: store W when Kafka's differs. */
static void
store_w(kinbox_consumer_t *c, kinbox__part_t *p)
{
        if (!p->store_w)
                return;
        p->store_w = false;
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset =
            p->verify_off + 1;
        rd_kafka_resp_err_t e = rd_kafka_offsets_store(c->rk, l);
        if (e)
                kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                            "storing the start offset: %s",
                            rd_kafka_err2str(e));
        rd_kafka_topic_partition_list_destroy(l);
}

bool
kinbox__startpos_take(kinbox_consumer_t *c, kinbox__part_t *p,
                      rd_kafka_message_t *rkm)
{
        if (p->refused) {
                rd_kafka_message_destroy(rkm);
                return true;
        }
        if (!p->verify)
                return false;
        p->verify = false;
        if (rkm->offset > p->verify_off) {
                kinbox__log(&c->lg, KINBOX_LOG_WARNING, "consumer",
                            "%s [%" PRId32 "]: the record at %" PRId64
                            " was compacted away: the log's incarnation "
                            "could not be verified; continuing at %" PRId64,
                            p->topic, p->partition, p->verify_off,
                            rkm->offset);
                store_w(c, p);
                return false;
        }
        rd_kafka_timestamp_type_t tt;
        int64_t ts = rd_kafka_message_timestamp(rkm, &tt);
        uint64_t h = kinbox__record_hash(rkm->key, rkm->key_len, rkm->payload,
                                         rkm->len);
        bool same = rkm->offset == p->verify_off && ts == p->verify_ts &&
                    h == p->verify_hash;
        rd_kafka_message_destroy(rkm);
        if (!same) {
                refuse_now(c, p, KINBOX_STARTPOS_INCARNATION);
                return true;
        }
        kinbox__log(&c->lg, KINBOX_LOG_DEBUG, "consumer",
                    "%s [%" PRId32 "]: the record at %" PRId64
                    " is the one applied here: starting at %" PRId64,
                    p->topic, p->partition, p->verify_off, p->verify_off + 1);
        store_w(c, p);
        return true;
}
