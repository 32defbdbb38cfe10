/*
 * deposit -- the deposit service on the transactional outbox.
 *
 * Creating a deposit is ONE local transaction on the service's own
 * connection:
 *   1. the deposit row, status PAYMENT_PENDING (a retried request for the
 *      same deposit id is a no-op: the deposit exists already);
 *   2. the local action `action:payment.initiate` appended to the outbox
 *      (idempotency key "deposit-<id>-pay", aggregate = the deposit id).
 * A kinbox relay with `[relay] modules = deposit` then runs the action
 * (handlers/deposit): it collects the money through the payment channel
 * and, in one transaction, moves the deposit to PAYMENT_SUCCEEDED and
 * appends `deposit.paid`, which the ledger consumer (handlers/ledger)
 * posts exactly once.
 *
 *   deposit URL create DEPOSIT_ID USER_ID AMOUNT [CURRENCY [TOPIC]]
 *   deposit URL show DEPOSIT_ID
 *
 * AMOUNT is in integer minor units (cents); CURRENCY defaults to EUR;
 * TOPIC (where `deposit.paid` goes once paid) defaults to deposit.paid.
 * URL: postgresql://user@host:port/db or mysql://user:pass@host:port/db.
 * Exit status: 0 created (or already there) / shown, 1 error, 2 usage,
 * 3 not found (show).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#include "../../handlers/deposit/deposit.h"
#include "../../handlers/deposit/sqlconn.h"

static int
create(sqlconn_t *c, const char *id, const char *user, const char *amount,
       const char *currency, const char *topic)
{
        if (sqlconn_exec(c, c->pg ? "BEGIN" : "START TRANSACTION", 0, NULL) <
            0)
                goto fail;
        const char *v[4] = {id, user, amount, currency};
        long long k = sqlconn_exec(
            c,
            c->pg ? "INSERT INTO deposits (deposit_id, user_id, amount, "
                    "currency, status) VALUES ($1, $2, $3, $4, "
                    "'PAYMENT_PENDING') ON CONFLICT (deposit_id) DO NOTHING"
                  : "INSERT INTO deposits (deposit_id, user_id, amount, "
                    "currency, status) VALUES ($1, $2, $3, $4, "
                    "'PAYMENT_PENDING') ON DUPLICATE KEY UPDATE deposit_id = "
                    "deposit_id",
            4, v);
        if (k < 0)
                goto fail;
        if (k == 0) { /* a retried request: the deposit exists */
                sqlconn_exec(c, "ROLLBACK", 0, NULL);
                return 0;
        }
        char payload[1024], idem[300];
        int n = snprintf(payload, sizeof(payload),
                         "{\"deposit_id\":\"%s\",\"user_id\":%s,"
                         "\"amount\":%s,\"currency\":\"%s\","
                         "\"paid_topic\":\"%s\"}",
                         id, user, amount, currency, topic);
        snprintf(idem, sizeof(idem), "deposit-%s-pay", id);
        kinbox_outbox_msg_t m = {
            .destination = KINBOX_OUTBOX_ACTION_PREFIX DEPOSIT_PAY_ACTION,
            .idem_key = idem,
            .aggregate_id = id,
            .payload = payload,
            .payload_size = (size_t)n};
        kinbox_err_t rc = c->pg ? kinbox_outbox_append_pg(
                                      c->pg, &m, NULL, c->err, sizeof(c->err))
                                : kinbox_outbox_append_mysql(
                                      c->my, &m, NULL, c->err, sizeof(c->err));
        if (rc != KINBOX_OK && rc != KINBOX_ERR_DUPLICATE)
                goto fail;
        if (sqlconn_exec(c, "COMMIT", 0, NULL) < 0)
                goto fail; /* outcome unknown: retrying with the same id
                              is safe */
        return 0;
fail:
        fprintf(stderr, "deposit %s: %s\n", id, c->err);
        sqlconn_exec(c, "ROLLBACK", 0, NULL);
        return 1;
}

static int
show(sqlconn_t *c, const char *id)
{
        const char *v[1] = {id};
        char row[5][256];
        int n = sqlconn_row(c,
                            "SELECT user_id, amount, currency, status, "
                            "channel_order_id FROM deposits WHERE deposit_id "
                            "= $1",
                            1, v, 5, row);
        if (n < 0) {
                fprintf(stderr, "%s\n", c->err);
                return 1;
        }
        if (n == 0) {
                fprintf(stderr, "deposit %s: not found\n", id);
                return 3;
        }
        printf("%s user=%s amount=%s %s status=%s channel_order=%s\n", id,
               row[0], row[1], row[2], row[3], *row[4] ? row[4] : "-");
        return 0;
}

static int
plain_id(const char *s)
{
        /* Ids go into JSON strings and idempotency keys as they are. */
        return *s && strlen(s) <= 200 && !strpbrk(s, "\"\\\n\r\t");
}

static int
positive(const char *s)
{
        char *end;
        long long v = strtoll(s, &end, 10);
        return *s && !*end && v > 0 && v <= 1000000000000000LL;
}

static void
usage(void)
{
        fprintf(stderr, "usage: deposit URL create DEPOSIT_ID USER_ID AMOUNT "
                        "[CURRENCY [TOPIC]]\n"
                        "       deposit URL show DEPOSIT_ID\n");
}

int
main(int argc, char **argv)
{
        if (argc < 4) {
                usage();
                return 2;
        }
        int is_create = !strcmp(argv[2], "create");
        if (is_create &&
            (argc < 6 || argc > 8 || !plain_id(argv[3]) ||
             !positive(argv[4]) || !positive(argv[5]) ||
             (argc >= 7 && strlen(argv[6]) != 3) ||
             (argc == 8 && (!plain_id(argv[7]) || strlen(argv[7]) > 200)))) {
                usage();
                return 2;
        }
        if (!is_create && (strcmp(argv[2], "show") || argc != 4)) {
                usage();
                return 2;
        }
        sqlconn_t c;
        if (sqlconn_open(&c, argv[1], NULL)) {
                fprintf(stderr, "deposit: %s\n", c.err);
                return 1;
        }
        int rc = is_create ? create(&c, argv[3], argv[4], argv[5],
                                    argc >= 7 ? argv[6] : "EUR",
                                    argc == 8 ? argv[7] : DEPOSIT_PAID_TOPIC)
                           : show(&c, argv[3]);
        sqlconn_close(&c);
        return rc;
}
