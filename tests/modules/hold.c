/*
 * kthold -- per-key ordered state for tests/hold_test.c (loaded from
 * handler.path by `kinbox run`, and compiled into the test itself).
 *
 * Payload "KEY SEQ [P]": key KEY's state (kthold_state, one row per key,
 * created by the test) must see SEQ = last_seq + 1 (a seq listed in
 * kthold_skip, a discarded message, is stepped over); any other SEQ
 * counts one in out_of_order instead of being trusted. "P" marks poison:
 * it violates a CHECK until kthold_fix has a row for KEY (the cause was
 * fixed), so it is dead-lettered at once, and a replay after the fix
 * succeeds. KTHOLD_SLOW_US (environment) sleeps in each call.
 */
#include <kinbox/kinbox.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int
kthold_parse(const kinbox_msg_t *msg, char *k, size_t ksz, char *seq,
             size_t ssz, int *poison)
{
        size_t n;
        const char *p = kinbox_msg_payload(msg, &n);
        char body[128], kb[64], sb[32], fb[8] = "";
        snprintf(body, sizeof(body), "%.*s", (int)(p ? n : 0), p ? p : "");
        if (sscanf(body, "%63s %31s %7s", kb, sb, fb) < 2)
                return -1;
        snprintf(k, ksz, "%s", kb);
        snprintf(seq, ssz, "%s", sb);
        *poison = fb[0] == 'P';
        return 0;
}

static kinbox_result_t
kthold_handle(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        char k[64], seq[32];
        int poison;
        const char *slow = getenv("KTHOLD_SLOW_US");
        if (slow && *slow)
                usleep((useconds_t)atoi(slow));
        if (kthold_parse(msg, k, sizeof(k), seq, sizeof(seq), &poison)) {
                kinbox_tx_set_error(tx, "payload: expected \"KEY SEQ [P]\"");
                return KINBOX_RESULT_REJECT;
        }
        const char *v[2] = {k, seq};
        if (poison &&
            kinbox_tx_exec(tx,
                           "INSERT INTO kthold_poison (k, seq, ok) SELECT "
                           "$1, $2, COUNT(*) FROM kthold_fix WHERE k = $1",
                           2, v))
                return KINBOX_RESULT_RETRY;
        if (kinbox_tx_exec(
                tx,
                "UPDATE kthold_state SET out_of_order = out_of_order + "
                "CASE WHEN $2 = last_seq + 1 + (SELECT COUNT(*) FROM "
                "kthold_skip s WHERE s.k = $1 AND s.seq = "
                "kthold_state.last_seq + 1) THEN 0 ELSE 1 END, last_seq = "
                "$2, applied = applied + 1 WHERE k = $1",
                2, v))
                return KINBOX_RESULT_RETRY;
        return KINBOX_RESULT_OK;
}

KINBOX_API const kinbox_module_t kinbox_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "kthold",
    .schema_version = 1,
    .schema_postgresql =
        "CREATE TABLE IF NOT EXISTS kthold_state (k text PRIMARY KEY,"
        " last_seq integer NOT NULL DEFAULT 0,"
        " applied integer NOT NULL DEFAULT 0,"
        " out_of_order integer NOT NULL DEFAULT 0);"
        "CREATE TABLE IF NOT EXISTS kthold_fix (k text PRIMARY KEY);"
        "CREATE TABLE IF NOT EXISTS kthold_skip (k text, seq integer,"
        " PRIMARY KEY (k, seq));"
        "CREATE TABLE IF NOT EXISTS kthold_poison (k text, seq integer,"
        " ok integer CHECK (ok > 0));",
    .schema_mysql =
        "CREATE TABLE IF NOT EXISTS kthold_state (k VARCHAR(64) PRIMARY KEY,"
        " last_seq INT NOT NULL DEFAULT 0, applied INT NOT NULL DEFAULT 0,"
        " out_of_order INT NOT NULL DEFAULT 0) ENGINE = InnoDB;"
        "CREATE TABLE IF NOT EXISTS kthold_fix (k VARCHAR(64) PRIMARY KEY)"
        " ENGINE = InnoDB;"
        "CREATE TABLE IF NOT EXISTS kthold_skip (k VARCHAR(64), seq INT,"
        " PRIMARY KEY (k, seq)) ENGINE = InnoDB;"
        "CREATE TABLE IF NOT EXISTS kthold_poison (k VARCHAR(64), seq INT,"
        " ok INT, CONSTRAINT kthold_poison_ok CHECK (ok > 0))"
        " ENGINE = InnoDB;",
    .handle = kthold_handle,
};
