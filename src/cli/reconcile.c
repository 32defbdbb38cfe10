/*
 * reconcile.c -- the reconciliation checks a configuration names, and the
 * periodic reconciliation thread of `kinbox run` (`kinbox reconcile` is
 * cmd_reconcile.c).
 *
 * The checks are those of the handler modules the file configures: each
 * [consumer.NAME]'s handler and each module of [relay] modules, once each.
 */
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kinbox/kinbox.h>

#include "common.h"
#include "internal.h"
#include "services.h"
#include "config.h"

#define MAX_CHECKS 64

static void
add_module(const kinbox_module_t *m, const kinbox_module_t **seen, int *nseen,
           const kinbox_check_t **out, size_t *n)
{
        for (int i = 0; i < *nseen; i++)
                if (seen[i] == m)
                        return;
        if (*nseen < 64)
                seen[(*nseen)++] = m;
        if (m->abi_version < 2 || !m->checks)
                return;
        for (const kinbox_check_t *c = m->checks; c->name && *n < MAX_CHECKS;
             c++)
                out[(*n)++] = c;
}

int
kb_reconcile_checks(kb_config_t *cfg, const kinbox_check_t **out, size_t max,
                    char *err, size_t sz)
{
        (void)max; /* out has MAX_CHECKS entries */
        const kinbox_module_t *seen[64];
        int nseen = 0;
        size_t n = 0;
        for (int i = 0; i < cfg->nconsumers; i++) {
                const kinbox_module_t *m =
                    find_module(cfg->consumers[i].settings, err, sz);
                if (!m)
                        return -1;
                add_module(m, seen, &nseen, out, &n);
        }
        const char *mods =
            cfg->relay ? kinbox__settings_of(cfg->relay)->relay_modules : NULL;
        char list[512];
        snprintf(list, sizeof(list), "%s", mods ? mods : "");
        for (char *save = NULL, *tok = strtok_r(list, ", ", &save); tok;
             tok = strtok_r(NULL, ", ", &save)) {
                const kinbox_module_t *m =
                    find_module_named(cfg->relay, tok, err, sz);
                if (!m)
                        return -1;
                add_module(m, seen, &nseen, out, &n);
        }
        return (int)n;
}

/* ------------------------------------------------------------------ */
/* kinbox run: every reconcile.interval, on the replica holding the lock */

struct kb_reconciler {
        kinbox_conf_t *conf;
        const kinbox_check_t *checks[MAX_CHECKS];
        size_t n;
        int64_t interval_ms;
        pthread_t thr;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        volatile int stop;
};

static void
log_check(const kinbox_check_t *c, const kinbox_rows_t *rows, void *opaque)
{
        (void)opaque;
        size_t n = kinbox_rows_count(rows);
        if (n)
                fprintf(stderr,
                        "kinbox run: reconcile: %s: %zu discrepancy row(s) "
                        "(kinbox reconcile -c FILE lists them)\n",
                        c->name, n);
}

static void *
reconciler_main(void *arg)
{
        kb_reconciler_t *r = arg;
        /* The first run comes within a minute of the start, so that a
         * restarted process exports the gauge (and the alert can fire)
         * without waiting a whole interval. */
        int64_t wait_ms = r->interval_ms < 60000 ? r->interval_ms : 60000;
        for (; !kb_nap(&r->lock, &r->cond, &r->stop, wait_ms);
             wait_ms = r->interval_ms) {
                char err[1024];
                if (kinbox_reconcile(r->conf, r->checks, r->n, 1, log_check,
                                     NULL, NULL, err, sizeof(err)))
                        fprintf(stderr, "kinbox run: %s\n", err);
        }
        return NULL;
}

kb_reconciler_t *
kb_reconciler_start(kb_config_t *cfg, char *err, size_t sz)
{
        kb_reconciler_t *r = calloc(1, sizeof(*r));
        if (!r) {
                snprintf(err, sz, "out of memory");
                return NULL;
        }
        int n = kb_reconcile_checks(cfg, r->checks, MAX_CHECKS, err, sz);
        if (n < 0) {
                free(r);
                return NULL;
        }
        r->n = (size_t)n;
        r->interval_ms = kinbox__settings_of(cfg->base)->reconcile_interval;
        if (n == 0 || r->interval_ms <= 0) { /* nothing to run */
                free(r);
                err[0] = '\0';
                return NULL;
        }
        r->conf = kinbox_conf_dup(cfg->base);
        pthread_mutex_init(&r->lock, NULL);
        pthread_cond_init(&r->cond, NULL);
        if (!r->conf || pthread_create(&r->thr, NULL, reconciler_main, r)) {
                kinbox_conf_destroy(r->conf);
                pthread_mutex_destroy(&r->lock);
                pthread_cond_destroy(&r->cond);
                free(r);
                snprintf(err, sz, "cannot start the reconciliation thread");
                return NULL;
        }
        return r;
}

void
kb_reconciler_stop(kb_reconciler_t *r)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        r->stop = 1;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
        pthread_join(r->thr, NULL);
        kinbox_conf_destroy(r->conf);
        pthread_mutex_destroy(&r->lock);
        pthread_cond_destroy(&r->cond);
        free(r);
}
