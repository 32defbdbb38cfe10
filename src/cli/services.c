/*
 * ops.c -- the operations side of `kinbox run` (and `kinbox prune`'s
 * retention check): the start-up retention check, the pruner thread and
 * the metrics / health endpoint.
 */
#include "common.h"
#include "schema.h"
#include "confval.h"
#include "hdrcodec.h"
#include "admin_int.h"
#include "http.h"
#include "metrics.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "ops.h"

/* ------------------------------------------------------------------ */
/* kinbox run: retention check, pruner thread, metrics endpoint */

int
kb_retention_check(kb_config_t *cfg, const char *cmd)
{
        /* Every consumer (its topics' window from the broker when it can
         * answer), then the shared settings the pruner deletes by. */
        for (int i = 0; i <= cfg->nconsumers; i++) {
                kinbox_conf_t *c =
                    i < cfg->nconsumers ? cfg->consumers[i].conf : cfg->base;
                char err[1024];
                int64_t window = 0;
                const char *src = NULL;
                if (!c || !kinbox_retention_check(c, &window, &src, err,
                                                  sizeof(err)))
                        continue;
                if (i < cfg->nconsumers)
                        fprintf(stderr, "kinbox %s: consumer.%s: %s\n", cmd,
                                cfg->consumers[i].name, err);
                else
                        fprintf(stderr, "kinbox %s: %s\n", cmd, err);
                return KB_EX_USAGE;
        }
        return KB_EX_OK;
}

struct kb_ops {
        kinbox_conf_t *conf; /* base: database, [prune] */
        pthread_t pruner;
        bool pruner_started;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        volatile int stop;
        kinbox__http_t *http;
        kinbox_admin_t *adm; /* the HTTP server's probe thread only */
        kinbox_kafka_t *kafka; /* broker reachability: the consumers'
                                  [kafka] settings */
        char kafka_err[512]; /* why there is no kafka client */
        char **consumers;
        int nconsumers;
        kb_reconciler_t *reconciler;
};

static void *
pruner_main(void *arg)
{
        kb_ops_t *ops = arg;
        int64_t interval = 600000;
        const char *iv = kinbox_conf_get(ops->conf, "prune.interval");
        if (iv)
                parse_duration_ms(iv, &interval);
        while (!kb_nap(&ops->lock, &ops->cond, &ops->stop, interval)) {
                char err[1024];
                kinbox_prune_result_t res;
                if (kinbox_prune(ops->conf, 0, &ops->stop, &res, err,
                                 sizeof(err)))
                        fprintf(stderr, "kinbox run: pruner: %s\n", err);
                else if (res.inbox_rows || res.outbox_rows)
                        fprintf(stderr,
                                "kinbox run: pruner: deleted %" PRIu64
                                " inbox and %" PRIu64 " outbox rows\n",
                                res.inbox_rows, res.outbox_rows);
        }
        return NULL;
}

static int
ready_cb(char *why, size_t sz, void *opaque)
{
        kb_ops_t *ops = opaque;
        if (kinbox_admin_ping(ops->adm)) {
                snprintf(why, sz, "database: %s",
                         kinbox_admin_errstr(ops->adm));
                return 1;
        }
        char kw[512];
        if (!ops->kafka && ops->kafka_err[0]) {
                snprintf(why, sz, "broker: %s", ops->kafka_err);
                return 1;
        }
        if (ops->kafka &&
            kinbox_kafka_ready(ops->kafka, 2000, kw, sizeof(kw))) {
                snprintf(why, sz, "broker: %s", kw);
                return 1;
        }
        for (int i = 0; i < ops->nconsumers; i++) {
                char l[300];
                snprintf(l, sizeof(l), "consumer=\"%s\"", ops->consumers[i]);
                double v = kinbox__metrics_value(
                    "kinbox_consumer_assigned_partitions", l);
                if (isnan(v) || v < 0) {
                        snprintf(why, sz,
                                 "consumer %s: no partition assignment yet",
                                 ops->consumers[i]);
                        return 1;
                }
        }
        return 0;
}

static void
collect_cb(void *opaque)
{
        kb_ops_t *ops = opaque;
        /* A database outage shows in /readyz; the gauges keep their last
         * values meanwhile. */
        kinbox__admin_collect_metrics(ops->adm);
}

kb_ops_t *
kb_ops_start(kb_config_t *cfg, char *err, size_t sz)
{
        kb_ops_t *ops = calloc(1, sizeof(*ops));
        if (!ops) {
                snprintf(err, sz, "out of memory");
                return NULL;
        }
        pthread_mutex_init(&ops->lock, NULL);
        pthread_cond_init(&ops->cond, NULL);
        ops->conf = kinbox_conf_dup(cfg->base);
        if (!ops->conf) {
                snprintf(err, sz, "out of memory");
                kb_ops_stop(ops);
                return NULL;
        }
        if (pthread_create(&ops->pruner, NULL, pruner_main, ops)) {
                snprintf(err, sz, "cannot start the pruner thread");
                kb_ops_stop(ops);
                return NULL;
        }
        ops->pruner_started = true;
        ops->reconciler = kb_reconciler_start(cfg, err, sz);
        if (!ops->reconciler && err[0]) {
                kb_ops_stop(ops);
                return NULL;
        }
        if (!cfg->metrics_listen)
                return ops;
        ops->adm = kinbox_admin_new(cfg->base, err, sz);
        if (!ops->adm) {
                kb_ops_stop(ops);
                return NULL;
        }
        ops->consumers = calloc((size_t)cfg->nconsumers + 1, sizeof(char *));
        for (int i = 0; ops->consumers && i < cfg->nconsumers; i++)
                ops->consumers[ops->nconsumers++] =
                    strdup(cfg->consumers[i].name);
        const char *bs = kinbox_conf_get(cfg->base, "kafka.bootstrap.servers");
        if (bs) {
                /* Every [kafka] setting, as the consumers connect (TLS,
                 * SASL); its connection errors show in /readyz, not in
                 * the log. */
                static const char *const quiet[] = {"log_level", "0", NULL};
                ops->kafka = kinbox_kafka_new(cfg->base, quiet, ops->kafka_err,
                                              sizeof(ops->kafka_err));
        }
        ops->http = kinbox__http_start(cfg->metrics_listen, cfg->base,
                                       ready_cb, collect_cb, ops, err, sz);
        if (!ops->http) {
                kb_ops_stop(ops);
                return NULL;
        }
        fprintf(stderr,
                "kinbox run: metrics on http://%s (port %d): "
                "/metrics /healthz /readyz\n",
                cfg->metrics_listen, kinbox__http_port(ops->http));
        return ops;
}

void
kb_ops_stop(kb_ops_t *ops)
{
        if (!ops)
                return;
        kinbox__http_stop(ops->http);
        pthread_mutex_lock(&ops->lock);
        ops->stop = 1;
        pthread_cond_broadcast(&ops->cond);
        pthread_mutex_unlock(&ops->lock);
        if (ops->pruner_started)
                pthread_join(ops->pruner, NULL);
        kb_reconciler_stop(ops->reconciler);
        kinbox_kafka_destroy(ops->kafka);
        kinbox_admin_destroy(ops->adm);
        for (int i = 0; i < ops->nconsumers; i++)
                free(ops->consumers[i]);
        free(ops->consumers);
        kinbox_conf_destroy(ops->conf);
        pthread_mutex_destroy(&ops->lock);
        pthread_cond_destroy(&ops->cond);
        free(ops);
}
