/*
 * wake.h -- the in-process wake-up of sleeping relays (internal).
 *
 * A writer that appended an outbox row (outbox.c) pokes; every relay of
 * this process that registered its pipe and sleeps for want of work gets
 * a byte on that pipe, wakes up and polls closely for a short while (the
 * row may not be committed yet when the poke comes). The registry knows
 * file descriptors and flags only, no relay: it sits below both the
 * writers and the relay.
 */
#ifndef KINBOX_WAKE_H
#define KINBOX_WAKE_H

#include <stdatomic.h>
#include <stdbool.h>

/* Register the write end fd of a non-blocking pipe; *sleeping tells when
 * its owner waits on the read end (only then is a byte written). At most
 * 16 at a time (more are silently not woken; they poll). */
void kinbox__wake_register(int fd, const atomic_bool *sleeping);
/* Forget fd (before it is closed). */
void kinbox__wake_unregister(int fd);

/* Wake every registered sleeper. Async-signal-unsafe; thread-safe; never
 * blocks. */
void kinbox__wake_poke(void);

#endif
