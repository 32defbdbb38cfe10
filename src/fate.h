/*
 * fate.h -- what a statement failure means for the message it names
 * (internal): the one classification batch.c and hold.c both use, below
 * both of them.
 */
#ifndef KINBOX_FATE_H
#define KINBOX_FATE_H

#include "consumer_int.h"

#include <stdbool.h>

/* Whether e is a statement's own failure, one a message can be charged
 * with; not a lost connection, a deadlock, out of memory, or a failure of
 * kinbox's own statement (or of an unknown merge). */
bool kinbox__fate_own_failure(const kinbox__dberr_t *e);

/* The fate of a statement failure e for the message it names: a unique
 * violation of a matching kinbox_tx_exec_unique() statement is a business
 * duplicate, any other one dead; otherwise hold when the deployment is
 * broken (e->deploy), dead when permanent, else retry. */
kinbox__fate_t kinbox__fate_of_statement(const kinbox_tx_t *tx,
                                         const kinbox__dberr_t *e);

/* Whether e is a statement's own failure (kinbox__fate_own_failure()); if
 * so, *fate is its fate for the message it names. */
bool kinbox__fate_classify(const kinbox_tx_t *tx, const kinbox__dberr_t *e,
                           kinbox__fate_t *fate);

#endif
