/*
 * lag.c -- kinbox_admin_lag(): a consumer group's committed offsets, the
 * log end offsets and the lag per partition of its topics, asked of the
 * broker by a client that joins no group (`kinbox status`, `verify`).
 */
#include "admin_int.h"
#include "internal.h"
#include "settings.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long each broker request may take. */
#define ASK_MS 5000

static kinbox_err_t
fail(kinbox_admin_t *adm, kinbox_err_t rc, const char *what,
     rd_kafka_resp_err_t e)
{
        snprintf(adm->errstr, sizeof(adm->errstr), "%s: %s", what,
                 rd_kafka_err2str(e));
        return rc;
}

/* Every partition of the topics in the comma list topics, sorted. */
static kinbox_err_t
partitions(kinbox_admin_t *adm, rd_kafka_t *rk, const char *topics,
           rd_kafka_topic_partition_list_t *l)
{
        char list[1024];
        snprintf(list, sizeof(list), "%s", topics ? topics : "");
        for (char *save = NULL, *t = strtok_r(list, ", ", &save); t;
             t = strtok_r(NULL, ", ", &save)) {
                rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t, NULL);
                const struct rd_kafka_metadata *md = NULL;
                rd_kafka_resp_err_t e =
                    rd_kafka_metadata(rk, 0, rkt, &md, ASK_MS);
                rd_kafka_topic_destroy(rkt);
                if (e) {
                        char what[400];
                        snprintf(what, sizeof(what), "broker metadata for %s",
                                 t);
                        return fail(adm, KINBOX_ERR_KAFKA, what, e);
                }
                for (int i = 0; i < md->topic_cnt; i++)
                        for (int p = 0; p < md->topics[i].partition_cnt; p++)
                                rd_kafka_topic_partition_list_add(
                                    l, t, md->topics[i].partitions[p].id);
                rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_partition_list_sort(l, NULL, NULL);
        return KINBOX_OK;
}

/* The committed offsets of l's partitions, their end offsets and lag. */
static kinbox_err_t
offsets(kinbox_admin_t *adm, rd_kafka_t *rk,
        rd_kafka_topic_partition_list_t *l, kinbox_lag_t *lag)
{
        rd_kafka_resp_err_t e = rd_kafka_committed(rk, l, ASK_MS);
        if (e)
                return fail(adm, KINBOX_ERR_KAFKA, "committed offsets", e);
        lag->partitions =
            kinbox__calloc((size_t)l->cnt + 1, sizeof(*lag->partitions));
        if (!lag->partitions)
                return KINBOX_ERR_NOMEM;
        for (int i = 0; i < l->cnt; i++) {
                kinbox_lag_partition_t *p = &lag->partitions[i];
                int64_t lo = 0, hi = 0;
                if (rd_kafka_query_watermark_offsets(rk, l->elems[i].topic,
                                                     l->elems[i].partition,
                                                     &lo, &hi, ASK_MS))
                        hi = -1;
                snprintf(p->topic, sizeof(p->topic), "%s", l->elems[i].topic);
                p->partition = l->elems[i].partition;
                p->committed = l->elems[i].offset;
                p->high = hi;
                int64_t c = p->committed < 0 ? 0 : p->committed;
                p->lag = hi >= 0 && hi > c ? hi - c : 0;
                lag->total += p->lag;
                lag->npartitions++;
        }
        return KINBOX_OK;
}

kinbox_err_t
kinbox_admin_lag(kinbox_admin_t *adm, const kinbox_conf_t *conf,
                 kinbox_lag_t **lagp)
{
        if (!adm || !conf || !lagp)
                return KINBOX_ERR_INVALID;
        *lagp = NULL;
        adm->errstr[0] = '\0';
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        if (!kinbox_conf_get(conf, "kafka.bootstrap.servers")) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no [kafka] bootstrap.servers configured");
                return KINBOX_ERR_CONFIG;
        }
        kinbox_lag_t *lag = kinbox__calloc(1, sizeof(*lag));
        if (!lag)
                return KINBOX_ERR_NOMEM;
        snprintf(lag->group, sizeof(lag->group), "%s",
                 s->group_id ? s->group_id
                 : s->name   ? s->name
                             : "");
        const char *const extra[] = {
            "group.id", lag->group, "enable.auto.commit", "false", "log_level",
            "0",        NULL};
        kinbox_kafka_t *kk =
            kinbox_kafka_new(conf, extra, adm->errstr, sizeof(adm->errstr));
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(16);
        kinbox_err_t rc = kk ? KINBOX_OK : KINBOX_ERR_CONFIG;
        if (!rc)
                rc = partitions(adm, kinbox__kafka_handle(kk), s->topics, l);
        if (!rc)
                rc = offsets(adm, kinbox__kafka_handle(kk), l, lag);
        rd_kafka_topic_partition_list_destroy(l);
        kinbox_kafka_destroy(kk);
        if (rc) {
                if (rc == KINBOX_ERR_NOMEM)
                        snprintf(adm->errstr, sizeof(adm->errstr),
                                 "out of memory");
                kinbox_lag_destroy(lag);
                return rc;
        }
        *lagp = lag;
        return KINBOX_OK;
}

void
kinbox_lag_destroy(kinbox_lag_t *l)
{
        if (!l)
                return;
        free(l->partitions);
        free(l);
}
