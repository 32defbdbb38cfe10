/*
 * sdnotify.h -- `kinbox run` under a service manager: readiness, the
 * watchdog and STOPPING through sd_notify (when built with libsystemd and
 * started with NOTIFY_SOCKET set), and SIGHUP (re-read the log level).
 *
 * Three calls from cmd_run (main.c): kb_sd_start() once everything runs,
 * kb_sd_stopping() from the SIGTERM/SIGINT handler, kb_sd_stop() before
 * the process cleans up.
 */
#ifndef KINBOX_CLI_SDNOTIFY_H
#define KINBOX_CLI_SDNOTIFY_H

/* Sends READY=1 (with a STATUS line), installs the SIGHUP handler and
 * starts the thread that pings the watchdog (WatchdogSec=) and handles
 * SIGHUP: config_path is read again and its log.level applied to every
 * logger (kinbox_log_set_level()). config_path must outlive kb_sd_stop().
 * Returns 0, or -1 when the thread cannot start (nothing is left
 * running then). Main thread only. */
int kb_sd_start(const char *config_path);

/* Shutdown began: the thread sends STOPPING=1 and stops pinging the
 * watchdog (systemd disarms it while stopping; a shutdown that hangs is
 * bounded by TimeoutStopSec=). Async-signal-safe: only sets a flag. */
void kb_sd_stopping(void);

/* Stop and join the thread; restore SIGHUP's default. No-op when
 * kb_sd_start() was not called or failed. Main thread only. */
void kb_sd_stop(void);

#endif
