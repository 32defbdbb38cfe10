/*
 * kafka.c -- kinbox and librdkafka: the one builder of a handle's
 * configuration (kinbox__rkconf_new(): the consumer's, the relay's
 * producers', the operator client's), the log's range of many partitions
 * in one pass, and the librdkafka client of health checks and operator
 * commands (kinbox_kafka_*) with librdkafka's log lines in kinbox's
 * logger.
 */
#include "internal.h"
#include "kafka.h"
#include "kinbox/admin.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kinbox_kafka_s {
        rd_kafka_t *rk;
        kinbox__log_t lg;
};

static void
kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        const kinbox_kafka_t *k = rd_kafka_opaque(rk);
        if (k)
                kinbox__log(&k->lg, level, "rdkafka", "%s: %s", fac, buf);
}

struct set_ctx {
        rd_kafka_conf_t *kc;
        const char *const *skip;
        char *errstr;
        size_t sz;
        bool failed;
};

static void
set_one(const char *k, const char *v, void *arg)
{
        struct set_ctx *x = arg;
        char e[256];
        if (x->failed)
                return;
        for (const char *const *s = x->skip; s && *s; s++)
                if (!strcmp(k, *s))
                        return;
        if (rd_kafka_conf_set(x->kc, k, v, e, sizeof(e)) != RD_KAFKA_CONF_OK) {
                kinbox__errstr(x->errstr, x->sz, "kafka.%s: %s", k, e);
                x->failed = true;
        }
}

static bool
set_pairs(rd_kafka_conf_t *kc, const char *const *kv, char *errstr, size_t sz)
{
        char e[512];
        for (; kv && kv[0]; kv += 2)
                if (rd_kafka_conf_set(kc, kv[0], kv[1], e, sizeof(e)) !=
                    RD_KAFKA_CONF_OK) {
                        kinbox__errstr(errstr, sz, "%s: %s", kv[0], e);
                        return false;
                }
        return true;
}

rd_kafka_conf_t *
kinbox__rkconf_new(const kinbox_conf_t *conf,
                   const kinbox__rkconf_spec_t *spec, char *errstr, size_t sz)
{
        rd_kafka_conf_t *kc = rd_kafka_conf_new();
        if (!kc) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        struct set_ctx x = {kc, spec->skip, errstr, sz, false};
        if (!set_pairs(kc, spec->defaults, errstr, sz))
                x.failed = true;
        else
                kinbox__conf_kafka_each(conf, set_one, &x);
        if (x.failed || !set_pairs(kc, spec->forced, errstr, sz)) {
                rd_kafka_conf_destroy(kc);
                return NULL;
        }
        return kc;
}

kinbox_kafka_t *
kinbox_kafka_new(const kinbox_conf_t *conf, const char *const *extra,
                 char *errstr, size_t sz)
{
        kinbox_kafka_t *k = kinbox__calloc(1, sizeof(*k));
        if (!k) {
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        /* Never join (or, with static membership, fence) a consumer's
         * group: this client only asks the cluster. The caller's extra
         * settings go over the user's. */
        static const char *const skip[] = {"group.id", "group.instance.id",
                                           NULL};
        const kinbox__rkconf_spec_t spec = {NULL, skip, extra};
        rd_kafka_conf_t *kc = kinbox__rkconf_new(conf, &spec, errstr, sz);
        if (!kc) {
                free(k);
                return NULL;
        }
        kinbox__conf_logger(conf, &k->lg);
        rd_kafka_conf_set_opaque(kc, k);
        rd_kafka_conf_set_log_cb(kc, kafka_log);
        char e[512];
        k->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof(e));
        if (!k->rk) {
                kinbox__errstr(errstr, sz, "Kafka configuration: %s", e);
                rd_kafka_conf_destroy(kc);
                free(k);
                return NULL;
        }
        return k;
}

void *
kinbox__kafka_handle(kinbox_kafka_t *k)
{
        return k ? k->rk : NULL;
}

int
kinbox_kafka_ready(kinbox_kafka_t *k, int timeout_ms, char *why,
                   size_t why_size)
{
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t e =
            rd_kafka_metadata(k->rk, 0, NULL, &md, timeout_ms);
        if (e) {
                kinbox__errstr(why, why_size, "%s", rd_kafka_err2str(e));
                return -1;
        }
        rd_kafka_metadata_destroy(md);
        return 0;
}

void
kinbox_kafka_destroy(kinbox_kafka_t *k)
{
        if (!k)
                return;
        rd_kafka_destroy(k->rk);
        free(k);
}

/* One ListOffsets pass over pl: each partition's offset at `which`
 * (RD_KAFKA_OFFSET_BEGINNING or _END) into out[i], one request per
 * leader. An error of the whole pass is returned and nothing written;
 * else out[i] is -1 where err[i] says why (or the broker sent none). */
static rd_kafka_resp_err_t
list_offsets(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *pl,
             int64_t which, int64_t *out, rd_kafka_resp_err_t *err,
             int timeout_ms)
{
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_copy(pl);
        if (!l)
                return RD_KAFKA_RESP_ERR__FAIL;
        for (int i = 0; i < l->cnt; i++) {
                l->elems[i].offset = which;
                l->elems[i].err = RD_KAFKA_RESP_ERR_NO_ERROR;
        }
        rd_kafka_resp_err_t e =
            rd_kafka_offsets_for_times(rk, l, timeout_ms > 0 ? timeout_ms : 1);
        for (int i = 0; !e && i < l->cnt; i++) {
                /* (the offset of one the broker left out is still which) */
                bool ok = !l->elems[i].err && l->elems[i].offset >= 0;
                out[i] = ok ? l->elems[i].offset : -1;
                if (l->elems[i].err && !err[i])
                        err[i] = l->elems[i].err;
        }
        rd_kafka_topic_partition_list_destroy(l);
        return e;
}

void
kinbox__log_ranges(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *pl,
                   int64_t *lo, int64_t *hi, rd_kafka_resp_err_t *err,
                   int timeout_ms)
{
        int64_t end = kinbox__now_ms() + timeout_ms;
        for (int i = 0; i < pl->cnt; i++) {
                lo[i] = hi[i] = -1;
                err[i] = RD_KAFKA_RESP_ERR_NO_ERROR;
        }
        if (!pl->cnt)
                return;
        rd_kafka_resp_err_t e = list_offsets(rk, pl, RD_KAFKA_OFFSET_BEGINNING,
                                             lo, err, timeout_ms);
        if (!e)
                e = list_offsets(rk, pl, RD_KAFKA_OFFSET_END, hi, err,
                                 (int)(end - kinbox__now_ms()));
        for (int i = 0; !e && i < pl->cnt; i++) {
                if (err[i] || hi[i] < 0) {
                        lo[i] = hi[i] = -1;
                        if (!err[i])
                                err[i] = RD_KAFKA_RESP_ERR__BAD_MSG;
                } else if (lo[i] < 0) {
                        lo[i] = hi[i]; /* an empty partition */
                }
        }
        if (!e)
                return;
        /* A pass failed as a whole (one partition's error fails its
         * leader's request): ask each partition on its own, within what
         * is left. */
        for (int i = 0; i < pl->cnt; i++) {
                int64_t left = end - kinbox__now_ms();
                const rd_kafka_topic_partition_t *tp = &pl->elems[i];
                err[i] = left <= 0 ? RD_KAFKA_RESP_ERR__TIMED_OUT
                                   : rd_kafka_query_watermark_offsets(
                                         rk, tp->topic, tp->partition, &lo[i],
                                         &hi[i], (int)left);
                if (err[i])
                        lo[i] = hi[i] = -1;
        }
}
