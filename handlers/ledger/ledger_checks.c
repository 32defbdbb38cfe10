/*
 * ledger_checks.c -- reconciliation checks of the ledger module:
 *   ledger.unbalanced_postings  a posting whose lines do not sum to zero,
 *                               is not exactly one debit and one credit,
 *                               or whose debit is not the posting's amount;
 *   ledger.account_balances     ledger_account.balance differs from the
 *                               sum of the account's lines (a posting or a
 *                               line changed or deleted behind the
 *                               handler's back).
 *
 * $1 = reconcile.grace in seconds: only rows older than it count.
 */
#include <kinbox/kinbox.h>

#include "ledger.h"

#define UNBALANCED_HAVING                                                     \
        " GROUP BY p.deposit_id, p.amount HAVING "                            \
        "COALESCE(SUM(l.amount), 0) <> 0 OR COUNT(l.id) <> 2 OR "             \
        "COALESCE(SUM(CASE WHEN l.side = 'D' THEN l.amount END), 0) <> "      \
        "p.amount ORDER BY p.deposit_id LIMIT 1000"

#define BALANCES_HAVING                                                       \
        " GROUP BY a.account_id, a.balance HAVING a.balance <> "              \
        "COALESCE(SUM(l.amount), 0) ORDER BY a.account_id LIMIT 1000"

const kinbox_check_t kinbox_ledger_checks[] = {
    {"ledger.unbalanced_postings",
     "postings whose lines do not sum to zero (or are not one debit of the "
     "posting's amount and one credit)",
     "SELECT p.deposit_id, p.amount, COUNT(l.id) AS lines, "
     "COALESCE(SUM(l.amount), 0) AS line_sum FROM ledger_posting p "
     "LEFT JOIN ledger_line l ON l.deposit_id = p.deposit_id "
     "WHERE p.posted_at < now() - $1::bigint * interval '1 "
     "second'" UNBALANCED_HAVING,
     "SELECT p.deposit_id, p.amount, COUNT(l.id) AS `lines`, "
     "COALESCE(SUM(l.amount), 0) AS line_sum FROM ledger_posting p "
     "LEFT JOIN ledger_line l ON l.deposit_id = p.deposit_id "
     "WHERE p.posted_at < CURRENT_TIMESTAMP(6) - INTERVAL $1 "
     "SECOND" UNBALANCED_HAVING},
    {"ledger.account_balances",
     "ledger_account.balance differs from the sum of the account's lines",
     "SELECT a.account_id, a.balance, COALESCE(SUM(l.amount), 0) AS "
     "line_sum FROM ledger_account a LEFT JOIN ledger_line l ON "
     "l.account_id = a.account_id WHERE a.updated_at < now() - "
     "$1::bigint * interval '1 second'" BALANCES_HAVING,
     "SELECT a.account_id, a.balance, COALESCE(SUM(l.amount), 0) AS "
     "line_sum FROM ledger_account a LEFT JOIN ledger_line l ON "
     "l.account_id = a.account_id WHERE a.updated_at < "
     "CURRENT_TIMESTAMP(6) - INTERVAL $1 SECOND" BALANCES_HAVING},
    {NULL, NULL, NULL, NULL},
};
