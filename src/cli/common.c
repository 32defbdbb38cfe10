/*
 * common.c -- what the operator commands share beyond options (opts.c)
 * and output (out.c): the configuration-and-database context, the
 * broker's view of a consumer group, the interval wait of the services.
 */
#include "common.h"
#include "schema.h"
#include "internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool
kb_nap(pthread_mutex_t *lock, pthread_cond_t *cond, const volatile int *stop,
       int64_t ms)
{
        struct timespec ts;
        kinbox__deadline(ms, &ts);
        pthread_mutex_lock(lock);
        while (!*stop && pthread_cond_timedwait(cond, lock, &ts) == 0)
                ;
        bool stopped = *stop;
        pthread_mutex_unlock(lock);
        return stopped;
}

int
ctx_open(ctx_t *x)
{
        char err[2048];
        if (kb_config_load(x->o.config, &x->cfg, err, sizeof(err))) {
                fprintf(stderr, "kinbox %s: %s\n", x->o.cmd, err);
                return KB_EX_USAGE;
        }
        x->loaded = true;
        x->adm = kinbox_admin_new(x->cfg.base, err, sizeof(err));
        if (!x->adm) {
                fprintf(stderr, "kinbox %s: %s\n", x->o.cmd, err);
                return KB_EX_USAGE;
        }
        /* Reachability up front: one clear error instead of several. */
        if (kinbox_admin_ping(x->adm)) {
                fprintf(stderr, "kinbox %s: database unreachable: %s\n",
                        x->o.cmd, kinbox_admin_errstr(x->adm));
                return KB_EX_DB;
        }
        /* A schema this binary does not know (older or newer) is refused
         * before any command reads or changes it. */
        return kb_schema_check_config(&x->cfg, x->o.cmd);
}

void
ctx_close(ctx_t *x)
{
        kinbox_admin_destroy(x->adm);
        if (x->loaded)
                kb_config_free(&x->cfg);
}

int
db_fail(ctx_t *x, kinbox_err_t rc)
{
        fprintf(stderr, "kinbox %s: %s\n", x->o.cmd,
                kinbox_admin_errstr(x->adm));
        return rc == KINBOX_ERR_DB_CONN ? KB_EX_DB : KB_EX_RUNTIME;
}

const char *
rv(kinbox_rows_t *r, size_t i, int c)
{
        return kinbox_rows_value(r, i, c, NULL);
}

const char *
group_of(kinbox_conf_t *conf)
{
        const char *g = kinbox_conf_get(conf, "group.id");
        return g ? g : kinbox_conf_get(conf, "name");
}

/* A librdkafka consumer handle of the group (nothing joins, nothing is
 * committed: it only reads committed offsets and watermarks). */
/* A client in the consumer's group (never joining it) with all of its
 * kafka.* settings, logging through its logger. */
kinbox_kafka_t *
group_handle(kinbox_conf_t *conf, char *err, size_t sz)
{
        const char *const extra[] = {
            "group.id", group_of(conf), "enable.auto.commit",
            "false",    "log_level",    "0",
            NULL};
        return kinbox_kafka_new(conf, extra, err, sz);
}

/* Per partition of a consumer's topics: committed offset and high
 * watermark from the broker. Returns NULL (err set) when the broker does
 * not answer. */
rd_kafka_topic_partition_list_t *
broker_offsets(kinbox_conf_t *conf, int64_t **highs, char *err, size_t sz)
{
        kinbox_kafka_t *kk = group_handle(conf, err, sz);
        if (!kk)
                return NULL;
        rd_kafka_t *rk = kinbox_kafka_handle(kk);
        const char *topics = kinbox_conf_get(conf, "topics");
        char list[1024];
        snprintf(list, sizeof(list), "%s", topics ? topics : "");
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(16);
        for (char *save = NULL, *t = strtok_r(list, ", ", &save); t;
             t = strtok_r(NULL, ", ", &save)) {
                rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t, NULL);
                const struct rd_kafka_metadata *md = NULL;
                rd_kafka_resp_err_t e =
                    rd_kafka_metadata(rk, 0, rkt, &md, 5000);
                rd_kafka_topic_destroy(rkt);
                if (e) {
                        snprintf(err, sz, "broker metadata for %s: %s", t,
                                 rd_kafka_err2str(e));
                        rd_kafka_topic_partition_list_destroy(l);
                        kinbox_kafka_destroy(kk);
                        return NULL;
                }
                for (int i = 0; i < md->topic_cnt; i++)
                        for (int p = 0; p < md->topics[i].partition_cnt; p++)
                                rd_kafka_topic_partition_list_add(
                                    l, t, md->topics[i].partitions[p].id);
                rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_partition_list_sort(l, NULL, NULL);
        rd_kafka_resp_err_t e = rd_kafka_committed(rk, l, 5000);
        if (e) {
                snprintf(err, sz, "committed offsets: %s",
                         rd_kafka_err2str(e));
                rd_kafka_topic_partition_list_destroy(l);
                kinbox_kafka_destroy(kk);
                return NULL;
        }
        *highs = calloc((size_t)l->cnt + 1, sizeof(int64_t));
        for (int i = 0; i < l->cnt && *highs; i++) {
                int64_t lo = 0, hi = 0;
                if (rd_kafka_query_watermark_offsets(rk, l->elems[i].topic,
                                                     l->elems[i].partition,
                                                     &lo, &hi, 5000))
                        hi = -1;
                (*highs)[i] = hi;
        }
        kinbox_kafka_destroy(kk);
        return l;
}

const char *
consumer_section(ctx_t *x, const char *name, kinbox_conf_t **conf)
{
        for (int i = 0; i < x->cfg.nconsumers; i++)
                if (!strcmp(x->cfg.consumers[i].name, name)) {
                        *conf = x->cfg.consumers[i].conf;
                        return x->cfg.consumers[i].name;
                }
        return NULL;
}

kinbox_offsets_t *
kb_start_positions(kinbox_conf_t *conf, int flags, char *err, size_t sz)
{
        kinbox_admin_t *adm = kinbox_admin_new(conf, err, sz);
        if (!adm)
                return NULL;
        kinbox_offsets_t *o = NULL;
        if (kinbox_offsets_list(adm, conf, NULL, -1, flags, &o))
                snprintf(err, sz, "%s", kinbox_admin_errstr(adm));
        kinbox_admin_destroy(adm);
        return o;
}

static const char *
pos(char *b, size_t sz, int64_t v)
{
        if (v < 0)
                snprintf(b, sz, "none");
        else
                snprintf(b, sz, "%" PRId64, v);
        return b;
}

void
kb_start_refusal(const kinbox_offsets_partition_t *p, char *buf, size_t sz)
{
        char w[24], c[24], l[24], h[24];
        snprintf(buf, sz,
                 "%s [%d]: start refused (%s): %s; DB watermark %s, Kafka "
                 "committed %s, log %s..%s (kinbox offsets list / reset)",
                 p->topic, (int)p->partition, kinbox_startpos_name(p->verdict),
                 kinbox_startpos_reason(p->verdict),
                 pos(w, sizeof(w), p->watermark),
                 pos(c, sizeof(c), p->committed), pos(l, sizeof(l), p->low),
                 pos(h, sizeof(h), p->high));
}
