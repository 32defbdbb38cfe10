/*
 * held.h -- partitions held by an error no retry can fix (internal).
 *
 * A statement that cannot run as the database is deployed (an undefined
 * table, column or function, a syntax error, a missing privilege:
 * kinbox__dberr_t.deploy) says nothing about the message: every message
 * would fail the same way, and dead-lettering them would empty the topic
 * into kinbox_dead_letter. Its partition is held instead: the message and
 * the rest of its partition wait a backoff (retry.backoff.*) and run
 * again, uncharged, until the database is fixed; meanwhile an error line
 * (at most one a minute per partition), a counter with the cause and a
 * gauge of held partitions (which makes /readyz not ready). Everything
 * here runs on the partition's worker thread, except
 * kinbox__held_forget() (the partition's release, its worker idle).
 */
#ifndef KINBOX_HELD_H
#define KINBOX_HELD_H

#include "consumer_int.h"

/* Message m's statement failed with e (e->deploy): hold its partition.
 * The caller cuts m and the rest of the partition from the batch. */
void kinbox__held_hold(kinbox_consumer_t *c, kinbox_msg_t *m,
                       const kinbox__dberr_t *e);

/* Messages of p committed: p is no longer held (a notice when it was). */
void kinbox__held_release(kinbox_consumer_t *c, kinbox__part_t *p);

/* p goes away (revoked, consumer destroyed): it is held no longer. */
void kinbox__held_forget(kinbox_consumer_t *c, kinbox__part_t *p);

/* The gauge kinbox_consumer_held_partitions, 0 at the consumer's start. */
void kinbox__held_gauge(kinbox_consumer_t *c);

#endif
