/*
 * counters.h -- `kinbox run` records its consumers' counters in the
 * database (kinbox_admin_counters_record()), where `kinbox status` reads
 * them (counters.c).
 */
#ifndef KINBOX_CLI_COUNTERS_H
#define KINBOX_CLI_COUNTERS_H

#include <kinbox/kinbox.h>

typedef struct kb_counters kb_counters_t;

/* Record the n consumers' counters now (a consumer that has not counted
 * yet shows 0, not "no process"), then within 50 ms of a change, at most
 * once a second, and otherwise (nothing changed) only every 60 s (status
 * takes a record of the last 150 s for a running process), on a thread of
 * its own until kb_counters_stop(). cs is
 * copied (the consumers must outlive the recorder); confs[i] is cs[i]'s
 * configuration (its database), read now. NULL only when out of memory or
 * the thread cannot start; a database that does not answer is tried again
 * at the next check. */
kb_counters_t *kb_counters_start(kinbox_consumer_t *const *cs,
                                 const kinbox_conf_t *const *confs, int n);

/* Stop the thread and delete this process's records (a clean stop); the
 * consumers must still exist. NULL is a no-op. */
void kb_counters_stop(kb_counters_t *k);

#endif
