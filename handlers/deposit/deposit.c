/*
 * deposit -- the deposit service's module: its schema and the
 * `payment.initiate` local action the relay runs for `action:payment.initiate`
 * outbox rows (appended by examples/deposit when a deposit is created).
 *
 * The action asks a payment channel to collect the deposit. The channel
 * here is a SIMULATION of an external system: its orders live in the table
 * payment_channel_orders (committed on their own, outside any of our
 * transactions) and it misbehaves on purpose:
 *   - a call may time out before doing anything;
 *   - a pay call may time out AFTER the payment went through (the reply
 *     was lost): the money moved but we were not told.
 * Paying twice charges twice (merchant_ref is not unique on the channel's
 * side), so the action owns idempotency towards the channel: every attempt
 * first QUERIES the channel by the row's idempotency key and pays only when
 * the channel has no order for it. Attempts of one deposit never overlap
 * (a session lock per key, for callbacks abandoned past the action timeout).
 *
 * On success, one local transaction: the deposit goes PAYMENT_PENDING →
 * PAYMENT_SUCCEEDED (conditional update) and `deposit.paid` is appended to
 * the outbox (idempotency key "deposit-<id>-paid"); the relay publishes it
 * and the ledger consumer (handlers/ledger) posts it. The topic is the
 * action payload's "paid_topic" (set by the service), else deposit.paid.
 *
 * Faults of the simulated channel, in percent of calls, from the
 * environment: DEPOSIT_CHANNEL_TIMEOUT_AFTER_PCT (default 20) and
 * DEPOSIT_CHANNEL_TIMEOUT_BEFORE_PCT (default 10); 0 turns them off.
 *
 * The action needs the database: `kinbox run` registers module actions
 * with the relay's configuration (`const kinbox_conf_t *`) as opaque;
 * library users pass theirs to kinbox_relay_register_action().
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kinbox/kinbox.h>

#include "deposit.h"
#include "sqlconn.h"

/* ---------------------------------------------------------- connections */

/* Idle connections kept between actions (keyed by URL, so two relays on
 * two databases in one process do not mix). */
#define POOL_MAX 8
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static sqlconn_t *pool[POOL_MAX];
static int npool;

static char *
read_password(const char *path)
{
        if (!path)
                return NULL;
        FILE *fp = fopen(path, "r");
        if (!fp)
                return NULL;
        char line[512];
        char *p = fgets(line, sizeof(line), fp) ? strdup(line) : NULL;
        fclose(fp);
        if (p)
                p[strcspn(p, "\r\n")] = '\0';
        return p;
}

static sqlconn_t *
conn_get(const kinbox_conf_t *conf, char *err, size_t sz)
{
        const char *url = kinbox_conf_get(conf, "database.url");
        if (!url) {
                snprintf(err, sz, "database.url is not set");
                return NULL;
        }
        pthread_mutex_lock(&pool_lock);
        for (int i = 0; i < npool; i++)
                if (!strcmp(pool[i]->url, url)) {
                        sqlconn_t *c = pool[i];
                        pool[i] = pool[--npool];
                        pthread_mutex_unlock(&pool_lock);
                        return c;
                }
        pthread_mutex_unlock(&pool_lock);
        sqlconn_t *c = calloc(1, sizeof(*c));
        if (!c) {
                snprintf(err, sz, "out of memory");
                return NULL;
        }
        char *pw =
            read_password(kinbox_conf_get(conf, "database.password_file"));
        int rc = sqlconn_open(c, url, pw);
        free(pw);
        if (rc) {
                snprintf(err, sz, "%s", c->err);
                free(c);
                return NULL;
        }
        return c;
}

/* Give a healthy connection back; a broken one is closed. */
static void
conn_put(sqlconn_t *c, int healthy)
{
        pthread_mutex_lock(&pool_lock);
        if (healthy && npool < POOL_MAX) {
                pool[npool++] = c;
                c = NULL;
        }
        pthread_mutex_unlock(&pool_lock);
        if (c) {
                sqlconn_close(c);
                free(c);
        }
}

/* ------------------------------------------- the simulated payment channel */

static pthread_mutex_t rnd_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long rnd_state;

static int
roll(const char *env, int dflt)
{
        const char *s = getenv(env);
        long pct = s && *s ? strtol(s, NULL, 10) : dflt;
        if (pct <= 0)
                return 0;
        pthread_mutex_lock(&rnd_lock);
        if (!rnd_state)
                rnd_state = (unsigned long long)time(NULL) ^
                            ((unsigned long long)getpid() << 20) ^
                            0x9e3779b97f4a7c15ULL;
        rnd_state ^= rnd_state << 13;
        rnd_state ^= rnd_state >> 7;
        rnd_state ^= rnd_state << 17;
        unsigned long long r = rnd_state % 100;
        pthread_mutex_unlock(&rnd_lock);
        return (long)r < pct;
}

typedef enum { CH_OK, CH_NOT_FOUND, CH_TIMEOUT, CH_ERROR } ch_status_t;

/* Does the channel have an order for ref? */
static ch_status_t
channel_query(sqlconn_t *c, const char *ref, char *order_id)
{
        const char *v[1] = {ref};
        char row[1][256];
        int n = sqlconn_row(c,
                            "SELECT channel_order_id FROM "
                            "payment_channel_orders WHERE merchant_ref = $1 "
                            "AND status = 'SUCCEEDED' ORDER BY "
                            "channel_order_id LIMIT 1",
                            1, v, 1, row);
        if (n < 0)
                return CH_ERROR;
        if (n == 0)
                return CH_NOT_FOUND;
        snprintf(order_id, 256, "%s", row[0]);
        return CH_OK;
}

/* Pay: not idempotent, like many real channels. */
static ch_status_t
channel_pay(sqlconn_t *c, const char *ref, const char *amount,
            const char *currency, char *order_id)
{
        if (roll("DEPOSIT_CHANNEL_TIMEOUT_BEFORE_PCT", 10))
                return CH_TIMEOUT; /* nothing happened */
        const char *v[3] = {ref, amount, currency};
        if (sqlconn_exec(c,
                         "INSERT INTO payment_channel_orders (merchant_ref, "
                         "amount, currency, status) VALUES ($1, $2, $3, "
                         "'SUCCEEDED')",
                         3, v) != 1)
                return CH_ERROR;
        if (roll("DEPOSIT_CHANNEL_TIMEOUT_AFTER_PCT", 20))
                return CH_TIMEOUT; /* paid, but the reply was lost */
        return channel_query(c, ref, order_id) == CH_OK ? CH_OK : CH_ERROR;
}

/* ------------------------------------------------------------ the action */

/* One attempt of a deposit at a time (see the file comment). */
static int
lock_key(sqlconn_t *c, const char *key, int lock)
{
        const char *v[1] = {key};
        char row[1][256];
        const char *sql =
            c->pg ? (lock ? "SELECT pg_try_advisory_lock(hashtextextended("
                            "'kinbox-pay:' || $1::text, 0))::int"
                          : "SELECT pg_advisory_unlock(hashtextextended("
                            "'kinbox-pay:' || $1::text, 0))::int")
                  : (lock ? "SELECT GET_LOCK(MD5(CONCAT('kinbox-pay:', $1)), "
                            "0)"
                          : "SELECT RELEASE_LOCK(MD5(CONCAT('kinbox-pay:', "
                            "$1)))");
        int n = sqlconn_row(c, sql, 1, v, 1, row);
        if (n < 0)
                return -1;
        return n == 1 && !strcmp(row[0], "1") ? 1 : 0;
}

/* PAYMENT_PENDING → PAYMENT_SUCCEEDED + deposit.paid, one transaction.
 * Returns 0 done (also when it was done before), -1 database error. */
static int
finish(sqlconn_t *c, const char *topic, const char *deposit_id,
       const char *user_id, const char *amount, const char *currency,
       const char *order_id, char *err, size_t sz)
{
        if (sqlconn_exec(c, c->pg ? "BEGIN" : "START TRANSACTION", 0, NULL) <
            0)
                goto fail;
        const char *v[2] = {deposit_id, order_id};
        long long k = sqlconn_exec(
            c,
            c->pg ? "UPDATE deposits SET status = 'PAYMENT_SUCCEEDED', "
                    "channel_order_id = $2, updated_at = now() WHERE "
                    "deposit_id = $1 AND status = 'PAYMENT_PENDING'"
                  : "UPDATE deposits SET status = 'PAYMENT_SUCCEEDED', "
                    "channel_order_id = $2, updated_at = CURRENT_TIMESTAMP(6) "
                    "WHERE deposit_id = $1 AND status = 'PAYMENT_PENDING'",
            2, v);
        if (k < 0)
                goto fail;
        if (k == 1) {
                char payload[1024], idem[300];
                int n = snprintf(payload, sizeof(payload),
                                 "{\"deposit_id\":\"%s\",\"user_id\":%s,"
                                 "\"amount\":%s,\"currency\":\"%s\"}",
                                 deposit_id, user_id, amount, currency);
                snprintf(idem, sizeof(idem), "deposit-%s-paid", deposit_id);
                kinbox_header_t hdr = {"event_type", DEPOSIT_PAID_TOPIC,
                                       strlen(DEPOSIT_PAID_TOPIC)};
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = idem,
                                         .aggregate_id = deposit_id,
                                         .payload = payload,
                                         .payload_size = (size_t)n,
                                         .headers = &hdr,
                                         .header_count = 1};
                kinbox_err_t rc =
                    c->pg ? kinbox_outbox_append_pg(c->pg, &m, NULL, c->err,
                                                    sizeof(c->err))
                          : kinbox_outbox_append_mysql(c->my, &m, NULL, c->err,
                                                       sizeof(c->err));
                if (rc != KINBOX_OK && rc != KINBOX_ERR_DUPLICATE)
                        goto fail;
        }
        if (sqlconn_exec(c, "COMMIT", 0, NULL) < 0)
                goto fail;
        return 0;
fail:
        snprintf(err, sz, "%s", c->err);
        sqlconn_exec(c, "ROLLBACK", 0, NULL);
        return -1;
}

static kinbox_result_t
payment_initiate(kinbox_action_t *a, void *opaque)
{
        const kinbox_conf_t *conf = opaque;
        if (!conf) {
                kinbox_action_set_error(a, "payment.initiate registered "
                                           "without a configuration");
                return KINBOX_RESULT_RETRY;
        }
        /* The payload names the deposit; the deposit row is the truth. */
        size_t len;
        const char *p = kinbox_action_payload(a, &len);
        json_error_t jerr;
        json_t *root = p ? json_loadb(p, len, 0, &jerr) : NULL;
        json_t *jid = json_object_get(root, "deposit_id");
        char deposit_id[256], topic[256];
        json_t *jt = json_object_get(root, "paid_topic");
        snprintf(topic, sizeof(topic), "%s",
                 json_is_string(jt) && json_string_length(jt) &&
                         json_string_length(jt) < sizeof(topic)
                     ? json_string_value(jt)
                     : DEPOSIT_PAID_TOPIC);
        if (!json_is_string(jid) || !json_string_length(jid) ||
            json_string_length(jid) > 200) {
                json_decref(root);
                kinbox_action_set_error(a, "payload: field deposit_id missing "
                                           "or not a string");
                return KINBOX_RESULT_REJECT;
        }
        snprintf(deposit_id, sizeof(deposit_id), "%s", json_string_value(jid));
        json_decref(root);

        char err[512];
        sqlconn_t *c = conn_get(conf, err, sizeof(err));
        if (!c) {
                kinbox_action_set_error(a, "database: %s", err);
                return KINBOX_RESULT_RETRY;
        }
        const char *ref = kinbox_action_idem_key(a);
        kinbox_result_t res = KINBOX_RESULT_RETRY;
        int healthy = 1, locked = 0;
        char dep[4][256], order_id[256];
        const char *v[1] = {deposit_id};
        int n = sqlconn_row(c,
                            "SELECT user_id, amount, currency, status FROM "
                            "deposits WHERE deposit_id = $1",
                            1, v, 4, dep);
        if (n < 0)
                goto dberr;
        if (n == 0) {
                kinbox_action_set_error(a, "deposit %s does not exist",
                                        deposit_id);
                res = KINBOX_RESULT_REJECT;
                goto out;
        }
        if (!strcmp(dep[3], "PAYMENT_SUCCEEDED")) {
                res = KINBOX_RESULT_OK; /* done by an earlier attempt */
                goto out;
        }
        if (strcmp(dep[3], "PAYMENT_PENDING")) {
                kinbox_action_set_error(a, "deposit %s is %s", deposit_id,
                                        dep[3]);
                res = KINBOX_RESULT_REJECT;
                goto out;
        }
        locked = lock_key(c, ref, 1);
        if (locked < 0)
                goto dberr;
        if (!locked) {
                kinbox_action_set_error(a,
                                        "another attempt of %s is still "
                                        "running",
                                        ref);
                goto out;
        }
        /* Query before paying: an earlier attempt may have paid and timed
         * out afterwards. */
        ch_status_t st = channel_query(c, ref, order_id);
        if (st == CH_NOT_FOUND)
                st = channel_pay(c, ref, dep[1], dep[2], order_id);
        if (st == CH_TIMEOUT) {
                kinbox_action_set_error(a, "payment channel timed out (the "
                                           "next attempt queries it first)");
                goto out;
        }
        if (st != CH_OK)
                goto dberr;
        if (finish(c, topic, deposit_id, dep[0], dep[1], dep[2], order_id, err,
                   sizeof(err))) {
                kinbox_action_set_error(a, "deposit %s: %s", deposit_id, err);
                healthy = 0;
                goto out;
        }
        res = KINBOX_RESULT_OK;
        goto out;
dberr:
        kinbox_action_set_error(a, "%s", c->err);
        healthy = 0;
out:
        if (locked > 0 && healthy && lock_key(c, ref, 0) < 0)
                healthy = 0;
        conn_put(c, healthy); /* closing a broken one drops its lock too */
        return res;
}

static const kinbox_module_action_t actions[] = {
    {"payment.initiate", payment_initiate},
    {NULL, NULL},
};

static const char schema_pg[] =
    "CREATE TABLE IF NOT EXISTS deposits ("
    " deposit_id text PRIMARY KEY,"
    " user_id bigint NOT NULL,"
    " amount bigint NOT NULL CHECK (amount > 0),"
    " currency text NOT NULL,"
    " status text NOT NULL," /* PAYMENT_PENDING | PAYMENT_SUCCEEDED */
    " channel_order_id bigint,"
    " created_at timestamptz NOT NULL DEFAULT now(),"
    " updated_at timestamptz NOT NULL DEFAULT now());"
    /* The simulated channel (an external system in real life). */
    "CREATE TABLE IF NOT EXISTS payment_channel_orders ("
    " channel_order_id bigserial PRIMARY KEY,"
    " merchant_ref text NOT NULL," /* not unique: paying twice charges twice */
    " amount bigint NOT NULL,"
    " currency text NOT NULL,"
    " status text NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now());"
    "CREATE INDEX IF NOT EXISTS payment_channel_orders_ref ON "
    "payment_channel_orders (merchant_ref);";

static const char schema_mysql[] =
    "CREATE TABLE IF NOT EXISTS deposits ("
    " deposit_id VARBINARY(200)"
    "  PRIMARY KEY,"
    " user_id BIGINT NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " currency CHAR(3) NOT NULL,"
    " status VARCHAR(32) NOT NULL,"
    " channel_order_id BIGINT NULL,"
    " created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
    " updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
    ") ENGINE = InnoDB;"
    "CREATE TABLE IF NOT EXISTS payment_channel_orders ("
    " channel_order_id BIGINT AUTO_INCREMENT PRIMARY KEY,"
    " merchant_ref VARBINARY(255)"
    "  NOT NULL,"
    " amount BIGINT NOT NULL,"
    " currency CHAR(3) NOT NULL,"
    " status VARCHAR(16) NOT NULL,"
    " created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
    " KEY payment_channel_orders_ref (merchant_ref)"
    ") ENGINE = InnoDB;"
    /* Schema 2: business keys compare byte for byte (no PAD SPACE). */
    "ALTER TABLE deposits MODIFY deposit_id VARBINARY(200) NOT NULL; ALTER "
    "TABLE payment_channel_orders MODIFY merchant_ref VARBINARY(255) NOT "
    "NULL;";

const kinbox_module_t kinbox_deposit_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "deposit",
    .schema_version = 2,
    .schema_postgresql = schema_pg,
    .schema_mysql = schema_mysql,
    .actions = actions,
    .checks = kinbox_deposit_checks,
};
