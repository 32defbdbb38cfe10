/*
 * ledger -- the double-entry ledger handler: one source file, both backends.
 *
 * Consumes `deposit.paid` events:
 *   {"deposit_id": "d-1", "user_id": 42, "amount": 1250, "currency": "EUR"}
 * (amount in integer minor units). In the inbox transaction it writes one
 * posting for the deposit and its two lines:
 *   debit  clearing:payment-channel:<CUR>   +amount
 *   credit wallet:<user_id>:<CUR>           -amount
 * Lines carry signed amounts (debit > 0, credit < 0), so every posting and
 * the whole ledger sum to zero; ledger_account.balance is debits minus
 * credits (a wallet's credit balance is therefore negative). Finally it
 * appends `ledger.applied` to the outbox in the same transaction
 * (idempotency key "deposit-<id>-applied", aggregate = the wallet account,
 * so a wallet's events keep their order). The topic follows the consumed
 * one: "<prefix>deposit.paid" gives "<prefix>ledger.applied" (so isolated
 * environments sharing a broker can use prefixed topics); any other topic
 * name gives "ledger.applied".
 *
 * Exactly once: the inbox drops redeliveries of the same message id; the
 * posting's primary key (deposit_id) stops a re-produced event that carries
 * a new message id. Such a business duplicate is already applied: the
 * handler returns KINBOX_RESULT_DUPLICATE (counted apart from redeliveries
 * in kinbox_consumer_messages_total{result="business_duplicate"}, so an
 * operator still sees an upstream that re-publishes) and writes nothing.
 * Malformed JSON or a missing/ill-typed field is a REJECT naming the field.
 *
 * Lock order: the posting row, then the clearing account, then the wallet.
 * The clearing account is a hot row shared by every posting; taking it
 * before any wallet means two workers' transactions serialize on it
 * instead of deadlocking on wallets.
 *
 * Uses only the public API.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#include "ledger.h"

#define AMOUNT_MAX 1000000000000000LL /* 10^15 minor units */

typedef struct deposit {
        char deposit_id[201];
        long long user_id;
        long long amount;
        char currency[4];
} deposit_t;

static int
valid_currency(const char *s, size_t n)
{
        if (n != 3)
                return 0;
        for (size_t i = 0; i < 3; i++)
                if (s[i] < 'A' || s[i] > 'Z')
                        return 0;
        return 1;
}

/* Parse and validate; on failure fill why naming the field. */
static int
parse(const kinbox_msg_t *msg, deposit_t *d, char *why, size_t wsz)
{
        size_t len;
        const char *p = kinbox_msg_payload(msg, &len);
        json_error_t jerr;
        json_t *root = p ? json_loadb(p, len, 0, &jerr) : NULL;
        if (!root) {
                snprintf(why, wsz, "payload is not valid JSON: %s",
                         p ? jerr.text : "empty payload");
                return -1;
        }
        int rc = -1;
        json_t *id = json_object_get(root, "deposit_id");
        json_t *u = json_object_get(root, "user_id");
        json_t *a = json_object_get(root, "amount");
        json_t *c = json_object_get(root, "currency");
        if (!json_is_object(root))
                snprintf(why, wsz, "payload is not a JSON object");
        else if (!json_is_string(id) || !json_string_length(id) ||
                 json_string_length(id) >= sizeof(d->deposit_id) ||
                 memchr(json_string_value(id), '\0', json_string_length(id)))
                snprintf(why, wsz,
                         "field deposit_id: missing or not a non-empty string "
                         "(at most 200 bytes)");
        else if (!json_is_integer(u) || json_integer_value(u) <= 0)
                snprintf(why, wsz,
                         "field user_id: missing or not a positive integer");
        else if (!json_is_integer(a) || json_integer_value(a) <= 0 ||
                 json_integer_value(a) > AMOUNT_MAX)
                snprintf(why, wsz,
                         "field amount: missing or not an integer number of "
                         "minor units in [1, 10^15]");
        else if (!json_is_string(c) ||
                 !valid_currency(json_string_value(c), json_string_length(c)))
                snprintf(why, wsz,
                         "field currency: missing or not a 3-letter ISO 4217 "
                         "code in capitals");
        else {
                snprintf(d->deposit_id, sizeof(d->deposit_id), "%s",
                         json_string_value(id));
                d->user_id = (long long)json_integer_value(u);
                d->amount = (long long)json_integer_value(a);
                snprintf(d->currency, sizeof(d->currency), "%s",
                         json_string_value(c));
                rc = 0;
        }
        json_decref(root);
        return rc;
}

static const char *
account_upsert_sql(kinbox_backend_t b)
{
        return b == KINBOX_BACKEND_MYSQL
                   ? "INSERT INTO ledger_account (account_id, kind, currency, "
                     "balance) VALUES ($1, $2, $3, $4) ON DUPLICATE KEY "
                     "UPDATE balance = balance + VALUES(balance), "
                     "updated_at = CURRENT_TIMESTAMP(6)"
                   : "INSERT INTO ledger_account (account_id, kind, currency, "
                     "balance) VALUES ($1, $2, $3, $4::bigint) ON CONFLICT "
                     "(account_id) DO UPDATE SET balance = "
                     "ledger_account.balance + EXCLUDED.balance, updated_at = "
                     "now()";
}

/*
 * Insert the posting. Returns 1 when inserted, 0 when the deposit already
 * has one (prev gets that posting's message id), -1 on a database error.
 */
static int
insert_posting(kinbox_tx_t *tx, const kinbox_msg_t *msg, const deposit_t *d,
               const char *uid, const char *amt, char *prev, size_t prevsz)
{
        kinbox_rows_t *rows = NULL;
        const char *v[5] = {d->deposit_id, uid, d->currency, amt,
                            kinbox_msg_id(msg)};
        const char *sel[1] = {d->deposit_id};
        if (kinbox_tx_backend(tx) == KINBOX_BACKEND_POSTGRESQL) {
                /* One round trip; a conflict leaves the transaction
                 * usable. */
                if (kinbox_tx_query(tx,
                                    "INSERT INTO ledger_posting (deposit_id, "
                                    "user_id, currency, amount, message_id) "
                                    "VALUES ($1, $2::bigint, $3, $4::bigint, "
                                    "$5) ON CONFLICT (deposit_id) DO NOTHING "
                                    "RETURNING deposit_id",
                                    5, v, &rows))
                        return -1;
                size_t n = kinbox_rows_count(rows);
                kinbox_rows_destroy(rows);
                if (n)
                        return 1;
        } else {
                /* MySQL has no RETURNING: look first. A concurrent insert
                 * of the same deposit (a duplicate on another partition)
                 * then fails on the primary key at the flush; the retry
                 * finds the posting and rejects. */
                if (kinbox_tx_query(tx,
                                    "SELECT deposit_id FROM ledger_posting "
                                    "WHERE deposit_id = $1",
                                    1, sel, &rows))
                        return -1;
                size_t n = kinbox_rows_count(rows);
                kinbox_rows_destroy(rows);
                if (!n) {
                        /* A concurrent twin's row makes this a business
                         * duplicate too: kinbox undoes this message. */
                        if (kinbox_tx_exec_unique(
                                tx, "PRIMARY",
                                "INSERT INTO ledger_posting "
                                "(deposit_id, user_id, currency, "
                                "amount, message_id) VALUES ($1, "
                                "$2, $3, $4, $5)",
                                5, v))
                                return -1;
                        return 1;
                }
        }
        rows = NULL;
        snprintf(prev, prevsz, "?");
        if (kinbox_tx_query(tx,
                            "SELECT message_id FROM ledger_posting WHERE "
                            "deposit_id = $1",
                            1, sel, &rows))
                return -1;
        const char *m = kinbox_rows_count(rows)
                            ? kinbox_rows_value(rows, 0, 0, NULL)
                            : NULL;
        if (m)
                snprintf(prev, prevsz, "%s", m);
        kinbox_rows_destroy(rows);
        return 0;
}

/* The ledger.applied topic for a message of topic in (see above). */
static void
applied_topic(const char *in, char *out, size_t sz)
{
        static const char suffix[] = "deposit.paid";
        size_t n = strlen(in), k = sizeof(suffix) - 1;
        if (n >= k && !strcmp(in + n - k, suffix))
                snprintf(out, sz, "%.*s%s", (int)(n - k), in,
                         LEDGER_APPLIED_TOPIC);
        else
                snprintf(out, sz, "%s", LEDGER_APPLIED_TOPIC);
}

static kinbox_result_t
ledger_handle(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        deposit_t d;
        char why[256];
        if (parse(msg, &d, why, sizeof(why))) {
                kinbox_tx_set_error(tx, "%s", why);
                return KINBOX_RESULT_REJECT;
        }
        char uid[24], amt[24], neg[24], clearing[64], wallet[64], prev[256];
        snprintf(uid, sizeof(uid), "%lld", d.user_id);
        snprintf(amt, sizeof(amt), "%lld", d.amount);
        snprintf(neg, sizeof(neg), "%lld", -d.amount);
        snprintf(clearing, sizeof(clearing), "clearing:payment-channel:%s",
                 d.currency);
        snprintf(wallet, sizeof(wallet), "wallet:%lld:%s", d.user_id,
                 d.currency);

        int ins = insert_posting(tx, msg, &d, uid, amt, prev, sizeof(prev));
        if (ins < 0) {
                kinbox_tx_set_error(tx, "ledger_posting: %s",
                                    kinbox_tx_errstr(tx));
                return KINBOX_RESULT_RETRY;
        }
        if (ins == 0) /* already posted (by message prev) */
                return KINBOX_RESULT_DUPLICATE;

        kinbox_backend_t b = kinbox_tx_backend(tx);
        const char *debit[4] = {clearing, "clearing", d.currency, amt};
        const char *credit[4] = {wallet, "wallet", d.currency, neg};
        const char *lines[5] = {d.deposit_id, clearing, amt, wallet, neg};
        if (kinbox_tx_exec(tx, account_upsert_sql(b), 4, debit) ||
            kinbox_tx_exec(tx, account_upsert_sql(b), 4, credit) ||
            kinbox_tx_exec(tx,
                           b == KINBOX_BACKEND_MYSQL
                               ? "INSERT INTO ledger_line (deposit_id, "
                                 "account_id, side, amount) VALUES ($1, $2, "
                                 "'D', $3), ($1, $4, 'C', $5)"
                               : "INSERT INTO ledger_line (deposit_id, "
                                 "account_id, side, amount) VALUES ($1, $2, "
                                 "'D', $3::bigint), ($1, $4, 'C', "
                                 "$5::bigint)",
                           5, lines))
                return KINBOX_RESULT_RETRY;

        /* The next hop, in the same transaction. */
        json_t *ev = json_pack(
            "{s:s, s:I, s:I, s:s, s:s, s:s}", "deposit_id", d.deposit_id,
            "user_id", (json_int_t)d.user_id, "amount", (json_int_t)d.amount,
            "currency", d.currency, "debit", clearing, "credit", wallet);
        char *payload = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
        json_decref(ev);
        if (!payload) {
                kinbox_tx_set_error(tx, "out of memory");
                return KINBOX_RESULT_RETRY;
        }
        char idem[256], topic[256];
        snprintf(idem, sizeof(idem), "deposit-%s-applied", d.deposit_id);
        applied_topic(kinbox_msg_topic(msg), topic, sizeof(topic));
        kinbox_header_t hdr = {"event_type", LEDGER_APPLIED_TOPIC,
                               strlen(LEDGER_APPLIED_TOPIC)};
        kinbox_outbox_msg_t m = {.destination = topic,
                                 .idem_key = idem,
                                 .aggregate_id = wallet,
                                 .payload = payload,
                                 .payload_size = strlen(payload),
                                 .headers = &hdr,
                                 .header_count = 1};
        kinbox_err_t rc = kinbox_outbox_append(tx, &m, NULL);
        free(payload);
        if (rc) {
                kinbox_tx_set_error(tx, "outbox append: %s: %s",
                                    kinbox_err_name(rc), kinbox_tx_errstr(tx));
                return KINBOX_RESULT_RETRY;
        }
        return KINBOX_RESULT_OK;
}

static const char schema_pg[] =
    "CREATE TABLE IF NOT EXISTS ledger_account ("
    " account_id text PRIMARY KEY,"
    " kind text NOT NULL,"
    " currency text NOT NULL,"
    " balance bigint NOT NULL DEFAULT 0," /* debits minus credits */
    " updated_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE IF NOT EXISTS ledger_posting ("
    " deposit_id text PRIMARY KEY," /* one posting per deposit */
    " user_id bigint NOT NULL,"
    " currency text NOT NULL,"
    " amount bigint NOT NULL CHECK (amount > 0),"
    " message_id text NOT NULL,"
    " posted_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE IF NOT EXISTS ledger_line ("
    " id bigserial PRIMARY KEY,"
    " deposit_id text NOT NULL REFERENCES ledger_posting (deposit_id),"
    " account_id text NOT NULL REFERENCES ledger_account (account_id),"
    " side char(1) NOT NULL,"
    " amount bigint NOT NULL,"
    " UNIQUE (deposit_id, side),"
    " CHECK ((side = 'D' AND amount > 0) OR (side = 'C' AND amount < 0)));"
    "CREATE INDEX IF NOT EXISTS ledger_line_account ON ledger_line "
    "(account_id);";

static const char schema_mysql[] =
    "CREATE TABLE IF NOT EXISTS ledger_account ("
    " account_id VARBINARY(255)"
    "  PRIMARY KEY,"
    " kind VARCHAR(16) NOT NULL,"
    " currency CHAR(3) NOT NULL,"
    " balance BIGINT NOT NULL DEFAULT 0,"
    " updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
    ") ENGINE = InnoDB;"
    "CREATE TABLE IF NOT EXISTS ledger_posting ("
    " deposit_id VARBINARY(200)"
    "  PRIMARY KEY,"
    " user_id BIGINT NOT NULL,"
    " currency CHAR(3) NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " message_id VARBINARY(255) NOT NULL,"
    " posted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
    ") ENGINE = InnoDB;"
    "CREATE TABLE IF NOT EXISTS ledger_line ("
    " id BIGINT AUTO_INCREMENT PRIMARY KEY,"
    " deposit_id VARBINARY(200)"
    "  NOT NULL,"
    " account_id VARBINARY(255)"
    "  NOT NULL,"
    " side CHAR(1) NOT NULL,"
    " amount BIGINT NOT NULL,"
    " UNIQUE KEY ledger_line_posting_side (deposit_id, side),"
    " KEY ledger_line_account (account_id),"
    " CONSTRAINT ledger_line_posting FOREIGN KEY (deposit_id)"
    "  REFERENCES ledger_posting (deposit_id),"
    " CONSTRAINT ledger_line_acct FOREIGN KEY (account_id)"
    "  REFERENCES ledger_account (account_id),"
    " CHECK ((side = 'D' AND amount > 0) OR (side = 'C' AND amount < 0))"
    ") ENGINE = InnoDB;"
    /* Schema 2: business keys compare byte for byte (no PAD SPACE). */
    "SET SESSION foreign_key_checks = 0; ALTER TABLE ledger_account MODIFY "
    "account_id VARBINARY(255) NOT NULL; ALTER TABLE ledger_posting MODIFY "
    "deposit_id VARBINARY(200) NOT NULL; ALTER TABLE ledger_line MODIFY "
    "deposit_id VARBINARY(200) NOT NULL, MODIFY account_id VARBINARY(255) NOT "
    "NULL; SET SESSION foreign_key_checks = 1;";

const kinbox_module_t kinbox_ledger_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "ledger",
    .schema_version = 2,
    .schema_postgresql = schema_pg,
    .schema_mysql = schema_mysql,
    .handle = ledger_handle,
    .checks = kinbox_ledger_checks,
};
