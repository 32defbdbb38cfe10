/*
 * cmd_run.c -- `kinbox run`: the configured consumers, the relay, and the
 * operations services (pruner, metrics endpoint, reconciler) until
 * SIGTERM/SIGINT; systemd readiness and a bounded shutdown.
 */
#include <dlfcn.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <kinbox/kinbox.h>
#include "common.h"
#include "internal.h"
#include "services.h"
#include "counters.h"
#include "watchdog.h"
#include "config.h"
#include "sdnotify.h"
#include "schema.h"
#include "tracing.h"

static const char *
config_arg(int argc, char **argv, const char *cmd)
{
        static const struct option opts[] = {
            {"config", required_argument, NULL, 'c'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0}};
        const char *path = NULL;
        int ch;
        optind = 1;
        while ((ch = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
                switch (ch) {
                case 'c':
                        path = optarg;
                        break;
                case 'h':
                        kb_usage_cmd(cmd, stdout);
                        exit(0);
                default:
                        kb_usage_cmd(cmd, stderr);
                        exit(KB_EX_USAGE);
                }
        }
        if (optind < argc) {
                fprintf(stderr, "kinbox %s: unexpected argument \"%s\"\n", cmd,
                        argv[optind]);
                exit(KB_EX_USAGE);
        }
        if (!path) {
                fprintf(stderr, "kinbox %s: -c FILE is required\n", cmd);
                exit(KB_EX_USAGE);
        }
        return path;
}

typedef struct runner {
        kinbox_consumer_t *c;
        const kinbox_module_t *mod;
        void *opaque;
        pthread_t thr;
        kinbox_err_t rc;
} runner_t;

static runner_t *g_runners;
static int g_nrunners;
/* SIGTERM/SIGINT came: also before anything runs (cmd_run checks it once
 * the consumers and the relay exist, so a stop during start-up is a clean
 * exit, not the default action of the signal). */
static volatile sig_atomic_t g_stop_asked;
static kinbox_relay_t *g_relay;

static void
on_signal(int sig)
{
        (void)sig;
        g_stop_asked = 1;
        kb_watchdog_arm(); /* the shutdown is bounded from here */
        kb_sd_stopping();
        for (int i = 0; i < g_nrunners; i++)
                kinbox_consumer_stop(g_runners[i].c);
        if (g_relay)
                kinbox_relay_stop(g_relay);
}

static kinbox_err_t g_relay_rc;

static void *
relay_thread(void *arg)
{
        g_relay_rc = kinbox_relay_run(arg);
        if (g_relay_rc)
                on_signal(0);
        return NULL;
}

/* The relay of `kinbox run`: base settings + [relay], actions of the
 * modules named in relay.modules. */
static kinbox_relay_t *
relay_create(kb_config_t *cfg, char *err, size_t sz)
{
        const char *mods = kinbox__settings_of(cfg->relay)->relay_modules;
        char list[512];
        snprintf(list, sizeof(list), "%s", mods ? mods : "");
        const kinbox_module_t *found[16];
        int nfound = 0;
        for (char *save = NULL, *tok = strtok_r(list, ", ", &save); tok;
             tok = strtok_r(NULL, ", ", &save)) {
                const kinbox_module_t *m =
                    find_module_named(cfg->relay, tok, err, sz);
                if (!m)
                        return NULL;
                if (nfound < 16)
                        found[nfound++] = m;
        }
        kinbox_conf_t *rc = kinbox_conf_dup(cfg->relay);
        if (!rc) {
                snprintf(err, sz, "out of memory");
                return NULL;
        }
        kinbox_relay_t *r = kinbox_relay_new(rc, err, sz);
        if (!r) {
                kinbox_conf_destroy(rc);
                return NULL;
        }
        for (int i = 0; i < nfound; i++)
                for (const kinbox_module_action_t *a = found[i]->actions;
                     a && a->name; a++)
                        /* Actions get the relay's configuration (for
                         * database.url); cfg outlives the relay. */
                        if (kinbox_relay_register_action(r, a->name, a->fn,
                                                         (void *)cfg->relay)) {
                                snprintf(err, sz,
                                         "relay: cannot register action %s",
                                         a->name);
                                kinbox_relay_destroy(r);
                                return NULL;
                        }
        return r;
}

static void *
run_thread(void *arg)
{
        runner_t *r = arg;
        r->rc = kinbox_consumer_run(r->c);
        /* One consumer failing stops the process: the supervisor decides. */
        if (r->rc)
                on_signal(0);
        return NULL;
}

/* A consumer per [consumer.NAME] with its handler module; *n counts the
 * created ones (to be destroyed). Returns 0 or KB_EX_USAGE. */
static int
runners_create(kb_config_t *cfg, runner_t *rs, int *np)
{
        char err[2048];
        int n = 0, status = 0;
        for (; n < cfg->nconsumers; n++) {
                runner_t *r = &rs[n];
                kinbox_conf_t *conf = cfg->consumers[n].conf;
                r->mod = find_module(conf, err, sizeof(err));
                if (!r->mod) {
                        fprintf(stderr, "kinbox run: %s\n", err);
                        status = KB_EX_USAGE;
                        break;
                }
                if (r->mod->init &&
                    r->mod->init(conf, &r->opaque, err, sizeof(err))) {
                        fprintf(stderr, "kinbox run: handler %s: %s\n",
                                r->mod->name, err);
                        status = KB_EX_USAGE;
                        break;
                }
                r->c = kinbox_consumer_new(conf, err, sizeof(err));
                if (!r->c) {
                        fprintf(stderr, "kinbox run: consumer.%s: %s\n",
                                cfg->consumers[n].name, err);
                        status = KB_EX_USAGE;
                        if (r->mod->fini)
                                r->mod->fini(r->opaque);
                        break;
                }
                cfg->consumers[n].conf = NULL; /* owned by the consumer */
                if (r->mod->handle_batch)
                        kinbox_consumer_set_batch_handler(
                            r->c, r->mod->handle_batch, r->opaque);
                else
                        kinbox_consumer_set_handler(r->c, r->mod->handle,
                                                    r->opaque);
        }
        *np = n;
        return status;
}

/* Wait for the consumers (and the relay) to finish and print what each
 * did; returns the exit status (the first failure's). */
static int
runners_join(runner_t *rs, int n, int started, kinbox_relay_t *relay,
             pthread_t *relay_thr, int status)
{
        bool relay_started = relay_thr != NULL;
        for (int i = 0; i < started; i++) {
                kb_watchdog_step("waiting for a consumer's last "
                                 "batch and offset commit");
                pthread_join(rs[i].thr, NULL);
                if (rs[i].rc) {
                        fprintf(stderr, "kinbox run: consumer %s: %s: %s\n",
                                kinbox_consumer_name(rs[i].c),
                                kinbox_err_name(rs[i].rc),
                                kinbox_consumer_errstr(rs[i].c));
                        if (!status)
                                status = kb_exit_of(rs[i].rc);
                }
        }
        if (relay_started) {
                kb_watchdog_step("waiting for the relay's last "
                                 "round");
                pthread_join(*relay_thr, NULL);
                kinbox_relay_stats_t rst;
                kinbox_relay_stats(relay, &rst);
                if (g_relay_rc) {
                        fprintf(stderr, "kinbox run: relay: %s: %s\n",
                                kinbox_err_name(g_relay_rc),
                                kinbox_relay_errstr(relay));
                        if (!status)
                                status = kb_exit_of(g_relay_rc);
                }
                fprintf(stderr,
                        "kinbox run: relay: published %llu, actions "
                        "%llu, retried %llu, dead %llu, conflicts "
                        "%llu\n",
                        (unsigned long long)rst.published,
                        (unsigned long long)rst.actions_ok,
                        (unsigned long long)rst.retried,
                        (unsigned long long)rst.dead,
                        (unsigned long long)rst.conflicts);
        }
        for (int i = 0; i < n; i++) {
                kinbox_consumer_stats_t st;
                kinbox_consumer_stats(rs[i].c, &st);
                fprintf(stderr,
                        "kinbox run: %s: processed %llu, duplicates "
                        "%llu (redelivered) + %llu (business), dead "
                        "%llu, retried %llu, batches %llu\n",
                        kinbox_consumer_name(rs[i].c),
                        (unsigned long long)st.processed,
                        (unsigned long long)st.duplicates,
                        (unsigned long long)st.business_duplicates,
                        (unsigned long long)st.dead,
                        (unsigned long long)st.retried,
                        (unsigned long long)st.batches);
        }
        return status;
}

/* Another reference to the process's trace exporter, which the consumers
 * and the relay started (tracing.endpoint): released last, so that its
 * final export is a shutdown step of its own (bounded by
 * KINBOX__TRACING_STOP_MS, named to the watchdog). True when held. */
static bool
tracing_hold(kb_config_t *cfg)
{
        char err[512];
        bool on = false;
        for (int i = 0; i <= cfg->nconsumers && !on; i++) {
                kinbox_conf_t *c = i < cfg->nconsumers
                                       ? cfg->consumers[i].settings
                                   : cfg->relay_enabled ? cfg->relay
                                                        : cfg->base;
                if (c && kinbox__tracing_acquire(c, &on, err, sizeof(err)))
                        on = false;
        }
        return on;
}

/* The record of the n consumers' counters in their databases (NULL, a
 * note printed, when it cannot start: status then shows n/a). */
static kb_counters_t *
counters_start(const kb_config_t *cfg, const runner_t *rs, int n)
{
        kinbox_consumer_t *cs[KB_MAX_CONSUMERS];
        const kinbox_conf_t *confs[KB_MAX_CONSUMERS];
        if (!n)
                return NULL;
        for (int i = 0; i < n; i++) {
                cs[i] = rs[i].c;
                confs[i] = cfg->consumers[i].settings;
        }
        kb_counters_t *k = kb_counters_start(cs, confs, n);
        if (!k)
                fprintf(stderr, "kinbox run: cannot start recording the "
                                "consumers' counters\n");
        return k;
}

/* Load and check the configuration `run` starts from: 0 with *cfg
 * loaded, or the exit status (cfg freed). */
static int
run_config(const char *path, kb_config_t *cfg)
{
        char err[2048];
        if (kb_config_load(path, cfg, err, sizeof(err))) {
                fprintf(stderr, "kinbox run: %s\n", err);
                return KB_EX_USAGE;
        }
        int rc = 0;
        if (!cfg->nconsumers && !cfg->relay_enabled) {
                fprintf(stderr,
                        "kinbox run: %s has no [consumer.NAME] section and "
                        "no enabled [relay]\n",
                        path);
                rc = KB_EX_USAGE;
        } else if (kb_retention_check(cfg, "run")) {
                /* inbox.retention vs the redelivery window */
                rc = KB_EX_USAGE;
        } else {
                /* Every schema the configuration names, as this binary
                 * knows it: an older one would fail batch after batch, a
                 * newer one could break what a newer kinbox keeps (held
                 * keys' order). */
                rc = kb_schema_check_config(cfg, "run", true);
        }
        if (rc)
                kb_config_free(cfg);
        return rc;
}

/* Start the relay and the consumers, each on a thread, and wait for them
 * to end (a signal, or one failing); the exit status. */
static int
run_threads(const char *path, runner_t *rs, int n, kinbox_relay_t *relay)
{
        g_runners = rs;
        g_nrunners = n;
        g_relay = relay;
        if (kb_watchdog_start())
                fprintf(stderr, "kinbox run: cannot start the "
                                "shutdown watchdog\n");
        if (g_stop_asked)
                on_signal(0); /* asked during start-up */
        int status = 0;
        pthread_t relay_thr;
        bool relay_started = false;
        if (relay) {
                if (pthread_create(&relay_thr, NULL, relay_thread, relay))
                        status = KB_EX_RUNTIME;
                else
                        relay_started = true;
        }
        int started = 0;
        for (; started < n && !status; started++)
                if (pthread_create(&rs[started].thr, NULL, run_thread,
                                   &rs[started])) {
                        on_signal(0);
                        status = KB_EX_RUNTIME;
                        break;
                }
        /* READY=1, watchdog, SIGHUP (a failure only loses those). */
        if (!status && kb_sd_start(path))
                fprintf(stderr, "kinbox run: cannot start the "
                                "service manager thread\n");
        return runners_join(rs, n, started, relay,
                            relay_started ? &relay_thr : NULL, status);
}

/* What kb_cmd_run() started, stopped and freed in order, each step named
 * to the shutdown watchdog. */
static void
run_teardown(runner_t *rs, int n, kb_counters_t *counters, kb_services_t *svc,
             kinbox_relay_t *relay, bool tracing)
{
        kb_watchdog_step("deleting the consumers' counters records");
        kb_counters_stop(counters);
        for (int i = 0; i < n; i++) {
                kb_watchdog_step("closing a consumer (leaving its group)");
                kinbox_consumer_destroy(rs[i].c);
                if (rs[i].mod && rs[i].mod->fini)
                        rs[i].mod->fini(rs[i].opaque);
        }
        kb_sd_stop();
        g_nrunners = 0;
        g_relay = NULL;
        kb_watchdog_step("stopping the pruner and the metrics listener");
        kb_services_stop(svc);
        kb_watchdog_step("closing the relay (flushing its producer)");
        kinbox_relay_destroy(relay);
        kb_watchdog_step("sending the last spans to the trace collector "
                         "(tracing.endpoint)");
        kinbox__tracing_release(tracing);
        kb_watchdog_done();
}

int
kb_cmd_run(int argc, char **argv)
{
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        const char *path = config_arg(argc, argv, "run");
        kb_config_t cfg;
        char err[2048];
        int sx = run_config(path, &cfg);
        if (sx)
                return sx;
        runner_t *rs = calloc((size_t)cfg.nconsumers + 1, sizeof(*rs));
        if (!rs) {
                kb_config_free(&cfg);
                return KB_EX_RUNTIME;
        }
        int n = 0;
        int status = runners_create(&cfg, rs, &n);
        kinbox_relay_t *relay = NULL;
        if (!status && cfg.relay_enabled) {
                relay = relay_create(&cfg, err, sizeof(err));
                if (!relay) {
                        fprintf(stderr, "kinbox run: [relay]: %s\n", err);
                        status = KB_EX_USAGE;
                }
        }
        bool tracing = !status && tracing_hold(&cfg);
        /* Recorded before /readyz answers: a running consumer shows 0. */
        kb_counters_t *counters = status ? NULL : counters_start(&cfg, rs, n);
        kb_services_t *svc = NULL; /* pruner thread, [metrics] listen */
        if (!status && !(svc = kb_services_start(&cfg, err, sizeof(err)))) {
                fprintf(stderr, "kinbox run: %s\n", err);
                status = KB_EX_USAGE;
        }
        if (!status)
                status = run_threads(path, rs, n, relay);
        run_teardown(rs, n, counters, svc, relay, tracing);
        free(rs);
        kb_config_free(&cfg);
        return status;
}
