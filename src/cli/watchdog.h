/*
 * watchdog.h -- bounded shutdown of `kinbox run`.
 *
 * A thread started with the process waits for the shutdown to begin
 * (kb_watchdog_arm(), async-signal-safe, called from the SIGTERM handler);
 * from then on the shutdown has KB_SHUTDOWN_BOUND_S seconds. If it has not
 * finished (kb_watchdog_done()) by then, the watchdog writes one line
 * naming the step that hung (the last kb_watchdog_step()) and ends the
 * process with _exit(KB_SHUTDOWN_EXIT) -- whatever the broker or the
 * database are doing. Offsets are only committed after COMMIT, so an exit
 * at any point loses nothing: the next start redelivers and the inbox
 * absorbs.
 */
#ifndef KINBOX_CLI_WATCHDOG_H
#define KINBOX_CLI_WATCHDOG_H

#define KB_SHUTDOWN_BOUND_S 30
#define KB_SHUTDOWN_EXIT 1

/* Start the watchdog thread (once). Returns 0, -1 when it cannot start
 * (the shutdown is then unbounded; the caller reports it). */
int kb_watchdog_start(void);
/* The shutdown began: start counting. Async-signal-safe, idempotent. */
void kb_watchdog_arm(void);
/* Name the shutdown step in progress (a string literal: kept by pointer).
 * Thread-safe. */
void kb_watchdog_step(const char *step);
/* The shutdown finished: the watchdog stands down. */
void kb_watchdog_done(void);

#endif
