/* ledger handler: the descriptor `kinbox run` knows as a built-in. */
#ifndef KINBOX_HANDLER_LEDGER_H
#define KINBOX_HANDLER_LEDGER_H
#include <kinbox/module.h>

/** Topic of the event the ledger appends for every posting. */
#define LEDGER_APPLIED_TOPIC "ledger.applied"

extern const kinbox_module_t kinbox_ledger_module;
/* Reconciliation checks (ledger_checks.c), NULL-name terminated. */
extern const kinbox_check_t kinbox_ledger_checks[];
#endif
