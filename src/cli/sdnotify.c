/*
 * sdnotify.c -- `kinbox run` under systemd (Type=notify, WatchdogSec=) and
 * SIGHUP handling; see sdnotify.h.
 *
 * One thread does everything that is not async-signal-safe: sd_notify()
 * and re-reading the configuration. The signal handlers only set flags,
 * and the thread looks at them every SD_TICK_MS.
 *
 * The watchdog ping proves that the process is scheduled and its service
 * thread is not wedged; a consumer stuck on its database is reported by
 * /readyz and the metrics, not by the watchdog (restarting a process
 * because its database is slow would not help).
 */
#include "sdnotify.h"
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <kinbox/kinbox.h>

#include "config.h"

#ifdef KINBOX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#define NOTIFY(s) sd_notify(0, (s))
#else
#define NOTIFY(s) ((void)(s))
#endif

#define SD_TICK_MS 200

static volatile sig_atomic_t g_hup, g_stopping, g_quit;
static const char *g_path;
static pthread_t g_thr;
static bool g_started;

static void
on_hup(int sig)
{
        (void)sig;
        g_hup = 1;
}

void
kb_sd_stopping(void)
{
        g_stopping = 1;
}

/* SIGHUP: read the file again; apply what can change while running (the
 * log level). A file that no longer loads changes nothing. */
static void
reload(void)
{
        NOTIFY("RELOADING=1");
        kb_config_t cfg;
        char err[2048];
        if (kb_config_load(g_path, &cfg, err, sizeof(err))) {
                fprintf(stderr,
                        "kinbox run: SIGHUP: %s; keeping the running "
                        "settings\n",
                        err);
        } else {
                kinbox__log_t lg;
                kinbox__conf_logger(cfg.base, &lg);
                kinbox_log_set_level(lg.level);
                char l[16];
                kinbox__conf_enum_text(
                    "log.level", (int)kinbox__settings_of(cfg.base)->log_level,
                    l, sizeof(l));
                fprintf(stderr,
                        "kinbox run: SIGHUP: reloaded %s: log.level = %s "
                        "(other settings take effect at the next start)\n",
                        g_path, l);
                kb_config_free(&cfg);
        }
        NOTIFY("READY=1");
}

static void *
sd_main(void *arg)
{
        (void)arg;
        uint64_t every_ms = 0; /* watchdog ping interval; 0 = none */
#ifdef KINBOX_HAVE_SYSTEMD
        uint64_t usec = 0;
        if (sd_watchdog_enabled(0, &usec) > 0 && usec)
                every_ms = usec / 2000; /* twice per WatchdogSec */
#endif
        uint64_t since_ping = 0;
        bool told_stopping = false;
        while (!g_quit) {
                struct timespec ts = {0, SD_TICK_MS * 1000000L};
                nanosleep(&ts, NULL);
                since_ping += SD_TICK_MS;
                if (g_stopping) {
                        if (!told_stopping)
                                NOTIFY("STOPPING=1");
                        told_stopping = true;
                        continue;
                }
                if (g_hup) {
                        g_hup = 0;
                        reload();
                }
                if (every_ms && since_ping >= every_ms) {
                        NOTIFY("WATCHDOG=1");
                        since_ping = 0;
                }
        }
        return NULL;
}

int
kb_sd_start(const char *config_path)
{
        g_path = config_path;
        g_quit = 0;
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_hup;
        sigaction(SIGHUP, &sa, NULL);
        if (pthread_create(&g_thr, NULL, sd_main, NULL)) {
                sa.sa_handler = SIG_DFL;
                sigaction(SIGHUP, &sa, NULL);
                return -1;
        }
        g_started = true;
        NOTIFY("READY=1\nSTATUS=consumers and relay started");
        return 0;
}

void
kb_sd_stop(void)
{
        if (!g_started)
                return;
        g_quit = 1;
        pthread_join(g_thr, NULL);
        g_started = false;
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = SIG_DFL;
        sigaction(SIGHUP, &sa, NULL);
}
