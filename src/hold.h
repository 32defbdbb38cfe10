/*
 * hold.h -- per-key holds (dead_letter.hold_key), internal.
 *
 * A dead-lettered message with a key holds back the later messages of
 * that key on its partition: they are parked (kinbox_parked, with their
 * inbox row, in the batch transaction that moves the offset past them)
 * instead of given to the handler. When the blocker leaves 'dead'
 * (replayed, discarded), the worker owning the partition applies the
 * parked messages in offset order, one transaction each (the release).
 *
 * Each partition keeps the keys held on it in memory (loaded at
 * assignment, updated by its worker's commits), so a clean stream pays
 * one test of an empty set per message. Everything here runs on the
 * partition's worker thread, except kinbox__hold_load() (the rebalance
 * callback, before the partition is visible to its worker).
 */
#ifndef KINBOX_HOLD_H
#define KINBOX_HOLD_H

#include "consumer_int.h"

#define KINBOX__HOLD_KEY_MAX 1024 /* bytes; the hold_key columns */

/* Parse the consumer's dead_letter.* settings. */
void kinbox__hold_conf(kinbox_consumer_t *c, const kinbox_conf_t *conf);

/* Rebalance callback: the holds of a newly assigned partition, read on
 * db (the consumer's control connection). False when they could not be
 * read (logged): the caller sets p->hold_unknown, and the partition's
 * worker reads them before it runs a batch of the partition. */
bool kinbox__hold_load(kinbox_consumer_t *c, kinbox__db_t *db,
                       kinbox__part_t *p);
/* The partition's set of held keys (on part_free). */
void kinbox__hold_free(kinbox__part_t *p);

/* Batch hooks (batch.c), inside the batch transaction:
 *  park():    message i (KINBOX__MSG_RUN) is to be parked: its key is held, or an
 *             earlier message of its partition in this batch is dead with
 *             the same key. Zero cost when nothing is held.
 *  queue_park(): queue the parked row (and the hold row's lock) for m.
 *  block():   m's dead letter was just queued: queue its hold row.
 *  followers(): a batch handler call rejected a message and also ran a
 *             later message of the same key (the call must be undone).
 *  committed(): the batch committed: its dead keys are held now. */
/* True when m's held key is ambiguous (dead_letter.hold_key.source a
 * header m carries more than once), with the reason in why: m is
 * dead-lettered like a message whose id is ambiguous, and holds nothing. */
bool kinbox__hold_ambiguous(const kinbox_consumer_t *c, kinbox_msg_t *m,
                            char *why, size_t why_size);
bool kinbox__hold_park(kinbox__batch_t *b, size_t i);
int kinbox__hold_queue_park(kinbox__batch_t *b, kinbox_msg_t *m);
int kinbox__hold_block(kinbox__batch_t *b, kinbox_msg_t *m);
bool kinbox__hold_followers(kinbox__batch_t *b, const size_t *idx, size_t n);
void kinbox__hold_committed(kinbox__batch_t *b);

/* Worker thread, between batches, with w->lock held (released while it
 * works): release the parked messages of holds whose blocker left
 * 'dead', at most once per dead_letter.release.poll.ms and only while
 * the worker holds a key. */
void kinbox__hold_tick(kinbox_consumer_t *c, kinbox__worker_t *w);

#endif
