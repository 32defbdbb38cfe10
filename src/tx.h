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

#endif
