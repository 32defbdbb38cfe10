/*
 * tx.h -- what other modules may know of a consumer transaction.
 */
#ifndef KINBOX_TX_H
#define KINBOX_TX_H

#include "db.h"

/* The database connection of a handler transaction (flushing nothing). */
kinbox__db_t *kinbox__tx_db(kinbox_tx_t *tx);
/* The tag for statements queued now: the current message's batch index. */
int kinbox__tx_tag(const kinbox_tx_t *tx);
/* The message of the running per-message handler call (or of a batch
 * handler call with one message); NULL otherwise (a batch of several,
 * a replay). */
const kinbox_msg_t *kinbox__tx_msg(const kinbox_tx_t *tx);
/* A statement issued for the handler outside txapi.c (an outbox append)
 * with its result rc: the call is touched (a REJECT or RETRY undoes it)
 * and, on error, failed as kinbox_tx_exec() would be. Returns rc as
 * kinbox_tx_exec() would. */
kinbox_err_t kinbox__tx_issued(kinbox_tx_t *tx, int rc);

/*
 * A message rebuilt from stored parts (a dead letter being replayed), as
 * handlers see it. Every pointer is borrowed and must outlive the message.
 */
typedef struct kinbox__msg_parts {
        const char *id;
        const char *topic;
        int32_t partition;
        int64_t offset;
        int64_t timestamp; /* ms, -1 unknown */
        const void *key;
        size_t key_len;
        const void *payload;
        size_t len;
        const kinbox_header_t *headers;
        size_t nheaders;
} kinbox__msg_parts_t;

kinbox_msg_t *kinbox__msg_from_parts(const kinbox__msg_parts_t *parts);
void kinbox__msg_destroy(kinbox_msg_t *m);
/* Reason set with kinbox_tx_set_msg_error(), or NULL. */
const char *kinbox__msg_reason(const kinbox_msg_t *m);

/* A handler transaction outside a consumer (replay): db's transaction is
 * the caller's (BEGIN/COMMIT); consumer names the inbox consumer. */
kinbox_tx_t *kinbox__tx_new(kinbox__db_t *db, const char *consumer);
void kinbox__tx_destroy(kinbox_tx_t *tx);
/* Prepare for one handler call (tag 0); after it: failed / reason. */
void kinbox__tx_reset(kinbox_tx_t *tx);
bool kinbox__tx_failed(const kinbox_tx_t *tx);
const char *kinbox__tx_reason(const kinbox_tx_t *tx);

#endif
