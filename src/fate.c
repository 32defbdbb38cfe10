/*
 * fate.c -- the fate of a statement failure for the message it names
 * (KINBOX__FATE_RETRY, KINBOX__FATE_DEAD, KINBOX__FATE_BIZDUP; consumer_int.h): used by the batch
 * (batch.c) and by the release of parked messages (hold.c). See fate.h.
 */
#include "fate.h"

#include <string.h>

/* A unique violation on the statement of tag t means "already applied"
 * when t is a kinbox_tx_exec_unique() statement whose key matches. */
static bool
ukey_matches(const kinbox_tx_t *tx, int t, const char *constraint)
{
        if (t < 0 || !(t & KINBOX__TAG_UNIQUE))
                return false;
        for (size_t i = tx->nukeys; i-- > 0;)
                if (tx->ukeys[i].tag == t &&
                    (!tx->ukeys[i].key || !*constraint ||
                     !strcmp(tx->ukeys[i].key, constraint)))
                        return true;
        return false;
}

kinbox__fate_t
kinbox__fate_of_statement(const kinbox_tx_t *tx, const kinbox__dberr_t *e)
{
        if (e->deploy)
                return KINBOX__FATE_HOLD;
        if (e->code == KINBOX_ERR_DUPLICATE)
                return ukey_matches(tx, e->stmt_tag, e->constraint)
                           ? KINBOX__FATE_BIZDUP
                           : KINBOX__FATE_DEAD;
        return e->permanent ? KINBOX__FATE_DEAD : KINBOX__FATE_RETRY;
}

bool
kinbox__fate_own_failure(const kinbox__dberr_t *e)
{
        return (e->code == KINBOX_ERR_DB || e->code == KINBOX_ERR_DUPLICATE) &&
               e->tag >= 0;
}

bool
kinbox__fate_classify(const kinbox_tx_t *tx, const kinbox__dberr_t *e,
                      kinbox__fate_t *fate)
{
        if (!kinbox__fate_own_failure(e))
                return false;
        *fate = kinbox__fate_of_statement(tx, e);
        return true;
}
