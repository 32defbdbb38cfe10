/*
 * batch.h -- the consumer's unit of work (internal).
 *
 * A batch is the head runs of a worker's partitions, up to batch.max
 * messages, applied in one transaction (docs/architecture.md, "A consumed
 * message"): its messages, their run's results, the isolation state the
 * worker carries from batch to batch, the hold flag and the attribution
 * record the backend writes while the batch's transaction runs. A worker
 * owns one batch (consumer_int.h) and hands it from the poll loop's
 * queues to batch.c and back; everything here is the worker's thread
 * only, except collecting it (under the worker's lock).
 */
#ifndef KINBOX_BATCH_H
#define KINBOX_BATCH_H

#include "db.h"
#include "kinbox/consumer.h"
#include "kinbox/handler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kinbox__worker;

/* How a batch handler's last one-message call went; zero (a calloc'ed
 * worker) is not seen yet. */
typedef enum kinbox__one_call {
        KINBOX__ONE_CALL_UNSEEN,
        /* Without a round trip of its own: narrowing a failed group one
         * message at a time costs statements, not waits. */
        KINBOX__ONE_CALL_NO_WAIT,
        /* It waited for the server: bisect instead. */
        KINBOX__ONE_CALL_WAITED
} kinbox__one_call_t;

/* What a batch run does with a message. */
typedef enum kinbox__msg_state {
        KINBOX__MSG_RUN, /* run the handler */
        KINBOX__MSG_DUP, /* the inbox has its id (redelivery) */
        KINBOX__MSG_DEAD, /* dead-letter it */
        KINBOX__MSG_CUT, /* not in this transaction (retried later) */
        /* A business duplicate: inbox row only, the handler's effect
         * undone. */
        KINBOX__MSG_BIZDUP,
        /* Its key is held (hold.c): inbox row and parked row. */
        KINBOX__MSG_PARK
} kinbox__msg_state_t;

/* A message's part in its batch's run (b->run[i] for b->msgs[i]). */
typedef struct kinbox__run {
        kinbox__msg_state_t state;
        bool inserted; /* this transaction inserted its inbox row */
        bool dup_ok; /* the handler said KINBOX_RESULT_DUPLICATE */
} kinbox__run_t;

/* Groups of a walk after bisections and cuts, at most (the arrays). */
#define KINBOX__WALK_MAX_GROUPS 64

/* One walk over the batch's groups, inside the open transaction. Group g
 * is the messages [lo[g], lo[g + 1]). */
typedef struct kinbox__walk {
        size_t ngroups;
        size_t lo[KINBOX__WALK_MAX_GROUPS + 1];
        /* Batch handler: call the group's handler one message at a time. */
        bool single[KINBOX__WALK_MAX_GROUPS];
        /* The second half of a failed group: when the first half ran
         * clean, the failure lies here, so it is cut before it runs. */
        bool suspect[KINBOX__WALK_MAX_GROUPS];
        bool iso;
        size_t g; /* the group running now */
        bool sp_done; /* group g's savepoint is already defined */
        bool no_merge; /* MySQL: group g runs without merged INSERTs */
} kinbox__walk_t;

typedef struct kinbox__batch {
        kinbox_consumer_t *c;
        struct kinbox__worker *w;
        kinbox__db_t *db; /* the worker's connection */
        size_t limit; /* batch size cap */
        /* The messages, in partition-queue order: msgs[0..nmsgs); a
         * message's index here is its statement tag (db/tags.h). */
        kinbox_msg_t **msgs;
        size_t nmsgs, capmsgs;
        /* Per message, for the run (capmsgs each): its state, the inbox
         * rows of the insert, which came back new, a batch handler's
         * verdicts. */
        kinbox__run_t *run;
        kinbox__inbox_row_t *rows;
        bool *is_new;
        kinbox_result_t *results;
        /* Isolation (batch.c, ISO_GROUPS): batches left in isolation
         * mode, whether this one had a failure; a batch handler's
         * failures all pinned on their messages this spell (few groups),
         * and how its last one-message call went. */
        int iso_left;
        bool iso_hit;
        bool iso_exact;
        kinbox__one_call_t one_call;
        int64_t handler_us; /* in handler calls, this transaction */
        bool hold_dead; /* hold.c: this batch has a dead message */
        /* The attempt running now (batch.c): the walk over its groups,
         * the transaction its handlers write through. */
        kinbox__walk_t wk;
        kinbox_tx_t *tx;
        /* What the backend tells of this batch's statements (db/tags.h),
         * handed to it by kinbox__db_begin(). */
        kinbox__attr_t attr;
} kinbox__batch_t;

/* Make room for n messages (the arrays above): 0, or KINBOX_ERR_NOMEM
 * with the batch as it was. */
int kinbox__batch_reserve(kinbox__batch_t *b, size_t n);
/* Free the batch's arrays (not its messages: the partitions own them). */
void kinbox__batch_free(kinbox__batch_t *b);

/* Run the batch (b->msgs[0..nmsgs)) until it committed or was abandoned;
 * pops the committed messages from their partitions. The worker's thread,
 * without its lock. */
void kinbox__batch_process(kinbox__batch_t *b);

#endif
