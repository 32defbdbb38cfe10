/*
 * ktgood -- a handler module loaded from handler.path by `kinbox run`
 * (tests/e2e_test.c): records every message id in ktgood_seen.
 */
#include <kinbox/kinbox.h>

static kinbox_result_t
handle(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        const char *v[1] = {kinbox_msg_id(msg)};
        if (kinbox_tx_exec(tx,
                           "INSERT INTO ktgood_seen (message_id) VALUES "
                           "($1)",
                           1, v))
                return KINBOX_RESULT_RETRY;
        return KINBOX_RESULT_OK;
}

KINBOX_API const kinbox_module_t kinbox_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "ktgood",
    .schema_version = 1,
    .schema_postgresql = "CREATE TABLE IF NOT EXISTS ktgood_seen ("
                         " message_id text PRIMARY KEY);",
    .schema_mysql = "CREATE TABLE IF NOT EXISTS ktgood_seen ("
                    " message_id VARBINARY(255) PRIMARY KEY) ENGINE = InnoDB;",
    .handle = handle,
};
