/*
 * batch_int.h -- what the batch's files share (internal): batch.c (one
 * attempt: BEGIN, inbox insert, walk, epilogue, COMMIT, offsets) calls
 * down into batch_walk.c (the groups, savepoints, recovery), which calls
 * down into batch_run.c (handlers, verdicts, where a failure is charged).
 * Everything runs on the batch's worker thread.
 */
#ifndef KINBOX_BATCH_INT_H
#define KINBOX_BATCH_INT_H

#include "consumer_int.h"

/* How an attempt (or the walk inside it) ends. */
enum run_rc {
        RUN_DONE, /* committed, or nothing to do */
        RUN_AGAIN, /* states changed: run the batch again (or walk on) */
        RUN_DB_DOWN, /* the connection is gone: reconnect, run again */
        RUN_BACKOFF /* the whole batch failed: back off, run again */
};

typedef kinbox__walk_t walk_t;

/* Where a failure is charged. */
typedef enum { FL_MSG, FL_GROUP, FL_MERGED, FL_BATCH } fkind_t;

typedef struct failure {
        fkind_t kind;
        size_t idx; /* FL_MSG: message; FL_GROUP/FL_MERGED: group */
        kinbox__fate_t fate;
        bool by_result; /* the handler's own result, no statement failed */
        /* FL_GROUP: 1 + the message the server's detail seems to name
         * (db->err.suspect), 0 none: where to cut, never whom to charge */
        size_t suspect;
} failure_t;

/* ---- batch_walk.c */
/* The groups of b's walk for this attempt: one, or in isolation mode
 * (b->iso_left) several behind savepoints; the walk starts at group 0. */
void kinbox__batch_walk_init(kinbox__batch_t *b);
/* Walk every group from b->wk.g on, inside the open transaction;
 * RUN_DONE when all ran, else how the attempt ends. */
enum run_rc kinbox__batch_walk(kinbox__batch_t *b);
/* Charge failure f (b->db->err) and make the transaction usable again:
 * RUN_AGAIN when the walk resumes at b->wk.g, or how the attempt ends. */
enum run_rc kinbox__batch_recover(kinbox__batch_t *b, failure_t *f);
/* True when a partition of the batch was revoked or the worker stops. */
bool kinbox__batch_abandoned(kinbox__batch_t *b);

/* ---- batch_run.c */
/* Group b->wk.g: dead letters of its decided messages, parked messages,
 * then its handlers. False with *f when the walk must stop. */
bool kinbox__batch_run_group(kinbox__batch_t *b, failure_t *f);
/* Message i failed (its own statement or result): decide its fate and
 * cut the rest of its partition when it is to be retried. */
void kinbox__batch_fail(kinbox__batch_t *b, size_t i, kinbox__fate_t f,
                        const char *reason);
/* Queue m's dead letter (and its hold row, dead_letter.hold_key). */
int kinbox__batch_dead_letter(kinbox__batch_t *b, kinbox_msg_t *m);
/* Charge e to a message, a group or the whole batch. */
failure_t kinbox__batch_failure_of(const kinbox__batch_t *b,
                                   const kinbox__dberr_t *e);
/* The group of b's walk holding message i. */
size_t kinbox__batch_group_of(const walk_t *wk, size_t i);

#endif
