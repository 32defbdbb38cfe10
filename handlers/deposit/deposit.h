/* deposit module: schema + the payment.initiate local action (a built-in
 * of `kinbox run`, listed in `[relay] modules`). */
#ifndef KINBOX_HANDLER_DEPOSIT_H
#define KINBOX_HANDLER_DEPOSIT_H
#include <kinbox/module.h>

/** Topic of the event appended when a deposit's payment succeeded. */
#define DEPOSIT_PAID_TOPIC "deposit.paid"
/** Local action appended with every new deposit. */
#define DEPOSIT_PAY_ACTION "payment.initiate"

extern const kinbox_module_t kinbox_deposit_module;
/* Reconciliation checks (deposit_checks.c), NULL-name terminated. */
extern const kinbox_check_t kinbox_deposit_checks[];
#endif
