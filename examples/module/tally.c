/*
 * tally -- an example handler module for `kinbox run` (docs/modules.md):
 * a batch handler, both backends, built outside kinbox's tree from an
 * installed kinbox (tests/module_test.sh builds and loads it).
 *
 * A message's payload is "ACCOUNT AMOUNT" (e.g. "alice 5"). Each message
 * records one tally_entry row, adds AMOUNT to tally_account, and appends
 * one outbox row (destination tally.applied, idem_key = the message id)
 * telling what it applied. A payload that does not parse is rejected (a
 * dead letter), and its outbox row goes with it.
 *
 *     handler = tally
 *     handler.path = /where/tally.so/is
 */
#include <kinbox/kinbox.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The payload is bytes, not a string: copy it before parsing. */
static int
parse(const kinbox_msg_t *m, char *account, size_t asz, char *amount,
      size_t nsz)
{
        size_t n;
        const char *p = kinbox_msg_payload(m, &n);
        char buf[128];
        if (!p || n >= sizeof(buf))
                return -1;
        memcpy(buf, p, n);
        buf[n] = '\0';
        char a[64];
        long long v;
        char extra;
        if (sscanf(buf, "%63s %lld %c", a, &v, &extra) != 2 || v <= 0)
                return -1;
        snprintf(account, asz, "%s", a);
        snprintf(amount, nsz, "%lld", v);
        return 0;
}

/* The account totals, summed per account in SQL. PostgreSQL refuses to
 * update one row twice in one INSERT ... ON CONFLICT DO UPDATE (SQLSTATE
 * 21000), so its rows are summed per account first; MySQL and MariaDB
 * apply ON DUPLICATE KEY UPDATE row after row. */
static const char *const credit_pg[3] = {
    "INSERT INTO tally_account (account, total) SELECT a, sum(n) FROM "
    "(VALUES ",
    "($1, CAST($2 AS bigint))",
    ") AS v (a, n) GROUP BY a ON CONFLICT (account) DO UPDATE SET total = "
    "tally_account.total + EXCLUDED.total"};
static const char *const credit_my[3] = {
    "INSERT INTO tally_account (account, total) VALUES ", "($1, $2)",
    " ON DUPLICATE KEY UPDATE total = total + VALUES(total)"};

static kinbox_result_t
handle_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, size_t n,
             kinbox_result_t *results, void *opaque)
{
        (void)opaque;
        const char **entry = calloc(n * 3 + 1, sizeof(*entry));
        const char **credit = calloc(n * 2 + 1, sizeof(*credit));
        const kinbox_msg_t **owners = calloc(n + 1, sizeof(*owners));
        char(*acc)[64] = calloc(n + 1, sizeof(*acc));
        char(*amt)[24] = calloc(n + 1, sizeof(*amt));
        kinbox_result_t ret = KINBOX_RESULT_RETRY;
        if (!entry || !credit || !owners || !acc || !amt)
                goto out;
        size_t rows = 0;
        for (size_t i = 0; i < n; i++) {
                if (parse(msgs[i], acc[rows], sizeof(acc[0]), amt[rows],
                          sizeof(amt[0]))) {
                        kinbox_tx_set_msg_error(tx, msgs[i],
                                                "payload is not \"ACCOUNT "
                                                "AMOUNT\"");
                        results[i] = KINBOX_RESULT_REJECT;
                        continue;
                }
                entry[rows * 3] = kinbox_msg_id(msgs[i]);
                entry[rows * 3 + 1] = acc[rows];
                entry[rows * 3 + 2] = amt[rows];
                credit[rows * 2] = acc[rows];
                credit[rows * 2 + 1] = amt[rows];
                owners[rows] = msgs[i];
                /* The outbox row of this message: in a call of several
                 * messages it belongs to the call (docs/handlers.md), so
                 * its idem_key names the message. */
                char body[128];
                int len = snprintf(body, sizeof(body), "%s +%s", acc[rows],
                                   amt[rows]);
                kinbox_outbox_msg_t ob = {.destination = "tally.applied",
                                          .idem_key = kinbox_msg_id(msgs[i]),
                                          .aggregate_id = acc[rows],
                                          .payload = body,
                                          .payload_size = (size_t)len};
                if (kinbox_outbox_append(tx, &ob, NULL))
                        goto out;
                rows++;
        }
        ret = KINBOX_RESULT_OK;
        if (!rows)
                goto out;
        const char *const *cr =
            kinbox_tx_backend(tx) == KINBOX_BACKEND_POSTGRESQL ? credit_pg
                                                               : credit_my;
        if (kinbox_tx_exec_values(tx,
                                  "INSERT INTO tally_entry (message_id, "
                                  "account, amount) VALUES ",
                                  "($1, $2, $3)", "", 3, entry, owners,
                                  rows) ||
            kinbox_tx_exec_values(tx, cr[0], cr[1], cr[2], 2, credit, owners,
                                  rows))
                ret = KINBOX_RESULT_RETRY; /* kinbox charges the failure */
out:
        free(entry);
        free(credit);
        free(owners);
        free(acc);
        free(amt);
        return ret;
}

KINBOX_MODULE_EXPORT const kinbox_module_t kinbox_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "tally",
    .schema_version = 1,
    .schema_postgresql =
        "CREATE TABLE IF NOT EXISTS tally_entry (message_id text PRIMARY KEY,"
        " account text NOT NULL, amount bigint NOT NULL);"
        "CREATE TABLE IF NOT EXISTS tally_account (account text PRIMARY KEY,"
        " total bigint NOT NULL);",
    .schema_mysql =
        "CREATE TABLE IF NOT EXISTS tally_entry (message_id VARCHAR(255) "
        "PRIMARY KEY, account VARCHAR(64) NOT NULL, amount BIGINT NOT NULL) "
        "ENGINE = InnoDB;"
        "CREATE TABLE IF NOT EXISTS tally_account (account VARCHAR(64) "
        "PRIMARY KEY, total BIGINT NOT NULL) ENGINE = InnoDB;",
    .handle_batch = handle_batch,
};
