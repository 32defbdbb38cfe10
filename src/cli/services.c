/*
 * services.c -- the operations side of `kinbox run` (and `kinbox prune`'s
 * retention check): the start-up retention check, the pruner thread and
 * the metrics / health endpoint.
 */
#include "common.h"
#include "schema.h"
#include "confval.h"
#include "hdrcodec.h"
#include "admin_int.h"
#include "http.h"
#include "console.h"
#include "settings.h"
#include "metrics.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "services.h"

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

struct kb_services {
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
        kinbox__console_t *console; /* [console] enabled */
        kb_config_t *cfg; /* the console's handlers (lives past stop) */
};

static void *
pruner_main(void *arg)
{
        kb_services_t *svc = arg;
        int64_t interval = kinbox__settings_of(svc->conf)->prune_interval;
        while (!kb_nap(&svc->lock, &svc->cond, &svc->stop, interval)) {
                char err[1024];
                kinbox_prune_result_t res;
                if (kinbox_prune(svc->conf, 0, &svc->stop, &res, err,
                                 sizeof(err)))
                        fprintf(stderr, "kinbox run: pruner: %s\n", err);
                else if (res.inbox_rows || res.outbox_rows ||
                         res.outbox_log_rows)
                        fprintf(stderr,
                                "kinbox run: pruner: deleted %" PRIu64
                                " inbox and %" PRIu64 " outbox rows\n",
                                res.inbox_rows,
                                res.outbox_rows + res.outbox_log_rows);
        }
        return NULL;
}

static int
ready_cb(char *why, size_t sz, void *opaque)
{
        kb_services_t *svc = opaque;
        if (kinbox_admin_ping(svc->adm)) {
                snprintf(why, sz, "database: %s",
                         kinbox_admin_errstr(svc->adm));
                return 1;
        }
        char kw[512];
        if (!svc->kafka && svc->kafka_err[0]) {
                snprintf(why, sz, "broker: %s", svc->kafka_err);
                return 1;
        }
        if (svc->kafka &&
            kinbox_kafka_ready(svc->kafka, 2000, kw, sizeof(kw))) {
                snprintf(why, sz, "broker: %s", kw);
                return 1;
        }
        for (int i = 0; i < svc->nconsumers; i++) {
                char l[300];
                snprintf(l, sizeof(l), "consumer=\"%s\"", svc->consumers[i]);
                double v = kinbox__metrics_value(
                    "kinbox_consumer_assigned_partitions", l);
                if (isnan(v) || v < 0) {
                        snprintf(why, sz,
                                 "consumer %s: no partition assignment yet",
                                 svc->consumers[i]);
                        return 1;
                }
                v = kinbox__metrics_value("kinbox_consumer_partitions_refused",
                                          l);
                if (!isnan(v) && v > 0) {
                        snprintf(why, sz,
                                 "consumer %s: %.0f partition(s) refused "
                                 "(the DB watermark and Kafka disagree; see "
                                 "the error log and `kinbox offsets list`)",
                                 svc->consumers[i], v);
                        return 1;
                }
                v = kinbox__metrics_value("kinbox_consumer_held_partitions",
                                          l);
                if (!isnan(v) && v > 0) {
                        snprintf(why, sz,
                                 "consumer %s: %.0f partition(s) held by an "
                                 "error no retry can fix (an undefined "
                                 "table, column or function, a syntax "
                                 "error, a missing privilege; see the log)",
                                 svc->consumers[i], v);
                        return 1;
                }
        }
        return 0;
}

static void
collect_cb(void *opaque)
{
        kb_services_t *svc = opaque;
        /* A database outage shows in /readyz; the gauges keep their last
         * values meanwhile. */
        kinbox__admin_collect_metrics(svc->adm);
}

/* The console's replay handler of consumer (as `kinbox dead replay`). */
static const kinbox_module_t *
console_handler(const char *consumer, const kinbox_conf_t **conf, char *err,
                size_t sz, void *opaque)
{
        kb_services_t *svc = opaque;
        for (int i = 0; i < svc->cfg->nconsumers; i++) {
                const kinbox_conf_t *c = svc->cfg->consumers[i].settings
                                             ? svc->cfg->consumers[i].settings
                                             : svc->cfg->consumers[i].conf;
                if (strcmp(svc->cfg->consumers[i].name, consumer) || !c)
                        continue;
                *conf = c;
                return find_module(c, err, sz);
        }
        snprintf(err, sz, "this process does not run consumer %s", consumer);
        return NULL;
}

/* [console] enabled: the console on the metrics endpoint. */
static int
console_start(kb_services_t *svc, kb_config_t *cfg, char *err, size_t sz)
{
        kinbox__console_consumer_t cs[KB_MAX_CONSUMERS];
        int n = 0;
        for (int i = 0; i < cfg->nconsumers; i++) {
                const kinbox_conf_t *c = cfg->consumers[i].settings
                                             ? cfg->consumers[i].settings
                                             : cfg->consumers[i].conf;
                if (!c)
                        continue;
                const kinbox__settings_t *st = kinbox__settings_of(c);
                cs[n++] = (kinbox__console_consumer_t){
                    .name = cfg->consumers[i].name,
                    .group = st->group_id,
                    .topics = st->topics,
                    .hold_key = st->dead_letter_hold_key,
                    .batch_max = st->batch_max};
        }
        static const char *const src[] = {"poll", "wal", "binlog"};
        const char *rs = NULL;
        if (cfg->relay_enabled && cfg->relay)
                rs = src[kinbox__settings_of(cfg->relay)->relay_source % 3];
        svc->cfg = cfg;
        svc->console = kinbox__console_new(cfg->base, cs, (size_t)n, rs,
                                           console_handler, svc, err, sz);
        if (!svc->console)
                return -1;
        kinbox__http_route(svc->http, "/console", kinbox__console_serve,
                           svc->console);
        return 0;
}

kb_services_t *
kb_services_start(kb_config_t *cfg, char *err, size_t sz)
{
        kb_services_t *svc = calloc(1, sizeof(*svc));
        if (!svc) {
                snprintf(err, sz, "out of memory");
                return NULL;
        }
        pthread_mutex_init(&svc->lock, NULL);
        pthread_cond_init(&svc->cond, NULL);
        svc->conf = kinbox_conf_dup(cfg->base);
        if (!svc->conf) {
                snprintf(err, sz, "out of memory");
                kb_services_stop(svc);
                return NULL;
        }
        if (pthread_create(&svc->pruner, NULL, pruner_main, svc)) {
                snprintf(err, sz, "cannot start the pruner thread");
                kb_services_stop(svc);
                return NULL;
        }
        svc->pruner_started = true;
        svc->reconciler = kb_reconciler_start(cfg, err, sz);
        if (!svc->reconciler && err[0]) {
                kb_services_stop(svc);
                return NULL;
        }
        bool console = kinbox__settings_of(cfg->base)->console_enabled;
        if (!cfg->metrics_listen && console) {
                snprintf(err, sz,
                         "[console] enabled = true needs [metrics] "
                         "listen (the console is served there)");
                kb_services_stop(svc);
                return NULL;
        }
        if (!cfg->metrics_listen)
                return svc;
        svc->adm = kinbox_admin_new(cfg->base, err, sz);
        if (!svc->adm) {
                kb_services_stop(svc);
                return NULL;
        }
        svc->consumers = calloc((size_t)cfg->nconsumers + 1, sizeof(char *));
        for (int i = 0; svc->consumers && i < cfg->nconsumers; i++)
                svc->consumers[svc->nconsumers++] =
                    strdup(cfg->consumers[i].name);
        const char *bs = kinbox_conf_get(cfg->base, "kafka.bootstrap.servers");
        if (bs) {
                /* Every [kafka] setting, as the consumers connect (TLS,
                 * SASL); its connection errors show in /readyz, not in
                 * the log. */
                static const char *const quiet[] = {"log_level", "0", NULL};
                svc->kafka = kinbox_kafka_new(cfg->base, quiet, svc->kafka_err,
                                              sizeof(svc->kafka_err));
        }
        svc->http = kinbox__http_start(cfg->metrics_listen, cfg->base,
                                       ready_cb, collect_cb, svc, err, sz);
        if (!svc->http) {
                kb_services_stop(svc);
                return NULL;
        }
        if (console && console_start(svc, cfg, err, sz)) {
                kb_services_stop(svc);
                return NULL;
        }
        int port = kinbox__http_port(svc->http);
        const char *colon = strrchr(cfg->metrics_listen, ':');
        int hl = colon ? (int)(colon - cfg->metrics_listen) : 0;
        fprintf(stderr,
                "kinbox run: metrics on http://%.*s:%d (port %d): /metrics "
                "/healthz /readyz%s\n",
                hl, cfg->metrics_listen, port, port,
                console ? " /console" : "");
        return svc;
}

void
kb_services_stop(kb_services_t *svc)
{
        if (!svc)
                return;
        kinbox__http_stop(svc->http);
        kinbox__console_destroy(svc->console);
        pthread_mutex_lock(&svc->lock);
        svc->stop = 1;
        pthread_cond_broadcast(&svc->cond);
        pthread_mutex_unlock(&svc->lock);
        if (svc->pruner_started)
                pthread_join(svc->pruner, NULL);
        kb_reconciler_stop(svc->reconciler);
        kinbox_kafka_destroy(svc->kafka);
        kinbox_admin_destroy(svc->adm);
        for (int i = 0; i < svc->nconsumers; i++)
                free(svc->consumers[i]);
        free(svc->consumers);
        kinbox_conf_destroy(svc->conf);
        pthread_mutex_destroy(&svc->lock);
        pthread_cond_destroy(&svc->cond);
        free(svc);
}
