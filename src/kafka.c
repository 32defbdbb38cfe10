/*
 * kafka.c -- the librdkafka client of health checks and operator commands
 * (kinbox_kafka_*): built from every `kafka.*` setting, as the consumers
 * pass them, with librdkafka's log lines in kinbox's logger.
 */
#include "internal.h"
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
        char *errstr;
        size_t sz;
        bool failed;
};

static void
set_one(const char *k, const char *v, void *arg)
{
        struct set_ctx *x = arg;
        char e[256];
        /* Never join (or, with static membership, fence) a consumer's
         * group: this client only asks the cluster. */
        if (x->failed || !strcmp(k, "group.id") ||
            !strcmp(k, "group.instance.id"))
                return;
        if (rd_kafka_conf_set(x->kc, k, v, e, sizeof(e)) != RD_KAFKA_CONF_OK) {
                kinbox__errstr(x->errstr, x->sz, "kafka.%s: %s", k, e);
                x->failed = true;
        }
}

kinbox_kafka_t *
kinbox_kafka_new(const kinbox_conf_t *conf, const char *const *extra,
                 char *errstr, size_t sz)
{
        kinbox_kafka_t *k = kinbox__calloc(1, sizeof(*k));
        rd_kafka_conf_t *kc = k ? rd_kafka_conf_new() : NULL;
        if (!kc) {
                free(k);
                kinbox__errstr(errstr, sz, "out of memory");
                return NULL;
        }
        kinbox__conf_logger(conf, &k->lg);
        struct set_ctx x = {kc, errstr, sz, false};
        kinbox__conf_kafka_each(conf, set_one, &x);
        char e[512];
        for (; !x.failed && extra && extra[0] && extra[1]; extra += 2) {
                if (rd_kafka_conf_set(kc, extra[0], extra[1], e, sizeof(e))) {
                        kinbox__errstr(errstr, sz, "%s: %s", extra[0], e);
                        x.failed = true;
                }
        }
        if (!x.failed) {
                rd_kafka_conf_set_opaque(kc, k);
                rd_kafka_conf_set_log_cb(kc, kafka_log);
                k->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof(e));
                if (!k->rk)
                        kinbox__errstr(errstr, sz, "Kafka configuration: %s",
                                       e);
        }
        if (!k->rk) {
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
