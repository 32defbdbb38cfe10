/*
 * points_checks.c -- reconciliation checks of the points module: every
 * account balance equals the sum of its flow rows (both are written in the
 * same inbox transaction, so a difference means a write behind the
 * handler's back, a lost row or a double-applied grant).
 *
 * $1 = reconcile.grace in seconds: only rows last touched before it count.
 */
#include <kinbox/kinbox.h>

#include "points.h"

#define FLOWS                                                                 \
        "(SELECT user_id, SUM(points_delta) AS total, MAX(created_at) AS "    \
        "last FROM user_points_flow GROUP BY user_id)"

const kinbox_check_t kinbox_points_checks[] = {
    {"points.balance_vs_flows",
     "user_account.points differs from the sum of the user's "
     "user_points_flow rows",
     "SELECT COALESCE(a.user_id, f.user_id) AS user_id, a.points AS balance, "
     "f.total AS flow_total FROM user_account a FULL JOIN " FLOWS
     " f ON f.user_id = a.user_id "
     "WHERE a.points IS DISTINCT FROM f.total "
     "AND NOT (a.points = 0 AND f.total IS NULL) "
     "AND GREATEST(a.updated_at, f.last) < now() - $1::bigint * "
     "interval '1 second' ORDER BY 1 LIMIT 1000",
     "SELECT a.user_id, a.points AS balance, f.total AS flow_total "
     "FROM user_account a LEFT JOIN " FLOWS " f ON f.user_id = a.user_id "
     "WHERE NOT (a.points <=> f.total) "
     "AND NOT (a.points = 0 AND f.total IS NULL) "
     "AND GREATEST(a.updated_at, COALESCE(f.last, a.updated_at)) < "
     "CURRENT_TIMESTAMP(6) - INTERVAL $1 SECOND "
     "UNION ALL SELECT f.user_id, NULL, f.total FROM " FLOWS
     " f LEFT JOIN user_account a ON a.user_id = f.user_id "
     "WHERE a.user_id IS NULL AND f.last < CURRENT_TIMESTAMP(6) - "
     "INTERVAL $1 SECOND ORDER BY 1 LIMIT 1000"},
    {NULL, NULL, NULL, NULL},
};
