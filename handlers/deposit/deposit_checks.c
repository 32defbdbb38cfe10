/*
 * deposit_checks.c -- reconciliation checks of the deposit module (the
 * three-way match of the payment design: channel orders, deposits, ledger
 * postings). They read the ledger's tables, so the deposit and ledger
 * schemas must share the database (as in scripts/demo):
 *   deposit.paid_without_posting     a deposit marked paid whose ledger
 *                                    posting is missing;
 *   deposit.channel_orders_unmatched a succeeded channel order that no
 *                                    deposit points at (a charge the
 *                                    service does not know: paid twice);
 *   deposit.posting_amount_mismatch  a posting whose amount or currency
 *                                    differs from its deposit's.
 *
 * $1 = reconcile.grace in seconds: a deposit paid a moment ago whose
 * deposit.paid event is still on its way is not a discrepancy.
 */
#include <kinbox/kinbox.h>

#include "deposit.h"

#define PG_AGE(col) col " < now() - $1::bigint * interval '1 second'"
#define MY_AGE(col) col " < CURRENT_TIMESTAMP(6) - INTERVAL $1 SECOND"

#define PAID_WITHOUT_POSTING(age)                                             \
        "SELECT d.deposit_id, d.user_id, d.amount, d.currency, "              \
        "d.channel_order_id FROM deposits d LEFT JOIN ledger_posting p ON "   \
        "p.deposit_id = d.deposit_id WHERE d.status = 'PAYMENT_SUCCEEDED' "   \
        "AND p.deposit_id IS NULL AND " age                                   \
        " ORDER BY d.deposit_id LIMIT 1000"
#define UNMATCHED(age)                                                        \
        "SELECT o.channel_order_id, o.merchant_ref, o.amount, o.currency "    \
        "FROM payment_channel_orders o LEFT JOIN deposits d ON "              \
        "d.channel_order_id = o.channel_order_id WHERE o.status = "           \
        "'SUCCEEDED' AND d.deposit_id IS NULL AND " age                       \
        " ORDER BY o.channel_order_id LIMIT 1000"
#define AMOUNT_MISMATCH(age)                                                  \
        "SELECT d.deposit_id, d.amount AS deposit_amount, p.amount AS "       \
        "posting_amount, d.currency AS deposit_currency, p.currency AS "      \
        "posting_currency FROM deposits d JOIN ledger_posting p ON "          \
        "p.deposit_id = d.deposit_id WHERE (d.amount <> p.amount OR "         \
        "d.currency <> p.currency) AND " age                                  \
        " ORDER BY d.deposit_id LIMIT 1000"

const kinbox_check_t kinbox_deposit_checks[] = {
    {"deposit.paid_without_posting",
     "deposits marked paid with no ledger posting",
     PAID_WITHOUT_POSTING(PG_AGE("d.updated_at")),
     PAID_WITHOUT_POSTING(MY_AGE("d.updated_at"))},
    {"deposit.channel_orders_unmatched",
     "succeeded payment channel orders no deposit points at (charged twice?)",
     UNMATCHED(PG_AGE("o.created_at")), UNMATCHED(MY_AGE("o.created_at"))},
    {"deposit.posting_amount_mismatch",
     "ledger postings whose amount or currency differs from the deposit's",
     AMOUNT_MISMATCH(PG_AGE("p.posted_at")),
     AMOUNT_MISMATCH(MY_AGE("p.posted_at"))},
    {NULL, NULL, NULL, NULL},
};
