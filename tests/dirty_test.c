/*
 * dirty_test.c -- the streams users really have, on both backends:
 * re-sends, business duplicates (a new message id for an event already
 * applied), poison that fails in SQL, several partitions and batches.
 *
 * What must hold: every failure is charged to the message whose statement
 * or result caused it, and to no other (no innocent message is retried,
 * delayed to a later attempt or dead-lettered); business duplicates are
 * counted, never dead letters; poison is dead-lettered at its first attempt
 * with its own reason.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../handlers/points/points.h"

/* Payload "KEY V": insert (KEY, V, attempt) into kt_attr after adding V to
 * the one kt_total row. A taken KEY is a business duplicate (the key is
 * marked with kinbox_tx_exec_unique()), so its UPDATE must be undone; a
 * negative V violates a CHECK. */
static int
parse_kv(const kinbox_msg_t *m, char *key, size_t ksz, char *v, size_t vsz)
{
        size_t n;
        const char *p = kinbox_msg_payload(m, &n);
        char body[160];
        snprintf(body, sizeof(body), "%.*s", (int)(p ? n : 0), p ? p : "");
        char k[64], x[32];
        if (sscanf(body, "%63s %31s", k, x) != 2)
                return -1;
        snprintf(key, ksz, "%s", k);
        snprintf(v, vsz, "%s", x);
        return 0;
}

/* How attr_batch() writes: plain statements, exec_values() rows after a
 * plain UPDATE, exec_values() rows only, or kt_part rows in a query with
 * owners (then the kt_attr INSERT) whose keys are the rows' own message
 * ids (the server's detail of a failing row names its owner) or
 * misleading (each row carries the next row's id: the detail names the
 * poison's innocent neighbour). */
enum {
        ATTR_PLAIN,
        ATTR_VALUES_AFTER_UPDATE,
        ATTR_VALUES_ONLY,
        ATTR_OWNED,
        ATTR_OWNED_MISLEADING,
        ATTR_FRESH_SQL /* attr_handler() */
};

/* opaque (an int): ATTR_FRESH_SQL gives each message's INSERT a text of
 * its own (its key in a comment), so each is parsed afresh: a Parse the
 * server skipped after a neighbour's failure must be sent again. */
static kinbox_result_t
attr_handler(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        bool fresh = opaque && *(const int *)opaque == ATTR_FRESH_SQL;
        char key[64], v[32], att[16], sql[160];
        if (parse_kv(msg, key, sizeof(key), v, sizeof(v))) {
                kinbox_tx_set_error(tx, "payload: expected \"KEY V\"");
                return KINBOX_RESULT_REJECT;
        }
        snprintf(att, sizeof(att), "%d", kinbox_msg_attempt(msg));
        const char *up[1] = {v};
        const char *ins[4] = {key, v, kinbox_msg_id(msg), att};
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kt_attr (k, v, msg, attempt) VALUES ($1, $2, "
                 "$3, $4)%s%s%s",
                 fresh ? " /* " : "", fresh ? key : "", fresh ? " */" : "");
        if (kinbox_tx_exec(tx, "UPDATE kt_total SET n = n + $1", 1, up) ||
            kinbox_tx_exec_unique(tx, NULL, sql, 4, ins))
                return KINBOX_RESULT_RETRY;
        return KINBOX_RESULT_OK;
}

/* Wait (at most timeout_s) until the consumer's stored offsets add up to
 * msgs, every message of the test's topic consumed, then stop the run
 * and take its counters. */
static void
drain_stop(const char *url, kt_run_t *r, long long msgs, int timeout_s,
           kinbox_consumer_stats_t *st)
{
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT SUM(next_offset) FROM "
                                  "kinbox_offsets",
                                  msgs, timeout_s),
                     msgs));
        kt_run_stop_stats(r, st);
}

/* Dead letters: exactly the poison messages (ids p-...), each at its
 * first attempt, with the CHECK violation (SQLSTATE 23514 / MariaDB
 * 4025) as its reason. */
static void
assert_dead_are_poison(const char *url, long long poison)
{
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_dead_letter"),
                     poison));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_dead_letter WHERE message_id "
                                  "LIKE 'p-%' AND attempts = 1 AND (error "
                                  "LIKE '%23514%' OR error LIKE '%4025%')"),
                     poison));
}

/* Batch handler calls with one message (kinbox narrowing a failure
 * down), and messages handed to the batch handler in all, counted by
 * attr_batch(). */
static int one_msg_calls, msgs_handed;

/* The same effect, set-based: one INSERT for the batch and one UPDATE of
 * the total (opaque NULL), the INSERT as exec_values() rows after the
 * UPDATE, or exec_values() rows only: each message's value goes to
 * kt_part as a row of its own instead of into the UPDATE. */
static kinbox_result_t
attr_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, size_t count,
           kinbox_result_t *results, void *opaque)
{
        int shape = opaque ? *(const int *)opaque : ATTR_PLAIN;
        if (count == 1)
                __atomic_fetch_add(&one_msg_calls, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&msgs_handed, (int)count, __ATOMIC_RELAXED);
        size_t cap = 64 + count * 48;
        char *sql = malloc(cap);
        const char **p = calloc(4 * count + 1, sizeof(*p));
        const char **pp = calloc(2 * count + 1, sizeof(*pp));
        const kinbox_msg_t **owner = calloc(count, sizeof(*owner));
        const char **hint = calloc(count + 1, sizeof(*hint));
        char(*keys)[64] = calloc(count, 64);
        char(*vs)[32] = calloc(count, 32);
        char(*atts)[16] = calloc(count, 16);
        char sum[32];
        long long total = 0;
        size_t np = 0, len = 0, nrows = 0;
        kinbox_result_t rc = KINBOX_RESULT_RETRY;
        if (!sql || !p || !pp || !keys || !vs || !atts || !owner || !hint)
                goto out;
        len = (size_t)snprintf(sql, cap,
                               "INSERT INTO kt_attr (k, v, msg, "
                               "attempt) VALUES ");
        for (size_t i = 0; i < count; i++) {
                if (parse_kv(msgs[i], keys[i], 64, vs[i], 32)) {
                        results[i] = KINBOX_RESULT_REJECT;
                        kinbox_tx_set_msg_error(tx, msgs[i], "payload");
                        continue;
                }
                snprintf(atts[i], 16, "%d", kinbox_msg_attempt(msgs[i]));
                total += atoll(vs[i]);
                len += (size_t)snprintf(
                    sql + len, cap - len, "%s($%zu, $%zu, $%zu, $%zu)",
                    np ? ", " : "", np + 1, np + 2, np + 3, np + 4);
                p[np++] = keys[i];
                p[np++] = vs[i];
                p[np++] = kinbox_msg_id(msgs[i]);
                p[np++] = atts[i];
                pp[2 * nrows] = kinbox_msg_id(msgs[i]);
                pp[2 * nrows + 1] = vs[i];
                hint[nrows] = kinbox_msg_id(msgs[i]);
                owner[nrows++] = msgs[i];
        }
        if (shape == ATTR_OWNED_MISLEADING) {
                /* Row r carries row r + 1's key; the last row none. */
                for (size_t r = 0; r + 1 < nrows; r++)
                        hint[r] = hint[r + 1];
                if (nrows)
                        hint[nrows - 1] = "";
        }
        rc = KINBOX_RESULT_OK;
        if (!np)
                goto out;
        snprintf(sum, sizeof(sum), "%lld", total);
        const char *up[1] = {sum};
        static const char head[] = "INSERT INTO kt_attr (k, v, msg, attempt) "
                                   "VALUES ";
        bool failed;
        if (shape == ATTR_PLAIN)
                failed = kinbox_tx_exec(tx, "UPDATE kt_total SET n = n + $1",
                                        1, up) ||
                         kinbox_tx_exec_unique(tx, NULL, sql, (int)np, p);
        else if (shape == ATTR_VALUES_AFTER_UPDATE)
                failed = kinbox_tx_exec(tx, "UPDATE kt_total SET n = n + $1",
                                        1, up) ||
                         kinbox_tx_exec_values_unique(tx, NULL, head,
                                                      "($1, $2, $3, $4)", "",
                                                      4, p, owner, nrows);
        else if (shape == ATTR_OWNED || shape == ATTR_OWNED_MISLEADING) {
                /* kt_part's CHECK rejects the poison's row first, in the
                 * query with owners; a business duplicate fails on its
                 * kt_attr key after it. */
                char *q = malloc(64 + nrows * 24);
                size_t ql = 0;
                failed = !q;
                if (q) {
                        ql = (size_t)sprintf(q, "INSERT INTO kt_part (msg, v) "
                                                "VALUES ");
                        for (size_t r = 0; r < nrows; r++)
                                ql += (size_t)sprintf(q + ql, "%s($%zu, $%zu)",
                                                      r ? ", " : "", 2 * r + 1,
                                                      2 * r + 2);
                        failed =
                            kinbox_tx_query_owned(tx, q, (int)(2 * nrows), pp,
                                                  owner, hint, nrows, NULL) ||
                            kinbox_tx_exec_unique(tx, NULL, sql, (int)np, p);
                }
                free(q);
        } else
                failed =
                    kinbox_tx_exec_values_unique(tx, NULL, head,
                                                 "($1, $2, $3, $4)", "", 4, p,
                                                 owner, nrows) ||
                    kinbox_tx_exec_values(tx,
                                          "INSERT INTO kt_part (msg, v) "
                                          "VALUES ",
                                          "($1, $2)", "", 2, pp, owner, nrows);
        if (failed)
                rc = KINBOX_RESULT_RETRY;
out:
        free(owner);
        free(hint);
        free(sql);
        free(p);
        free(pp);
        free(keys);
        free(vs);
        free(atts);
        return rc;
}

/* A stream of "KEY V" events of four kinds: a CHECK poison (V -1, id
 * p-N), a poison of the handler's second table (V 777, id d-N), a business
 * duplicate (id b-N) of an earlier good event's key (at most bizdup_back
 * back, on the original's partition, behind it) with V bizdup_v, or good
 * (id g-N, V N % 100); some are sent twice with their id (a redelivery).
 * With seed 0 the kinds come in a fixed pattern (every poison_every-th,
 * second_every-th, bizdup_every-th, resend_every-th; 0: none); with a seed
 * each event draws its kind (per mille: pm_poison, pm_second, pm_bizdup,
 * pm_resend), the same for the same seed. The counts and the good events'
 * sum come back in s. */
typedef struct kvstream {
        int n, parts, poison_every, second_every, bizdup_every, bizdup_back;
        int bizdup_v, resend_every;
        unsigned seed;
        int pm_poison, pm_second, pm_bizdup, pm_resend;
        int good, poison, second, bizdup, resent;
        long long sum;
} kvstream_t;

enum { KV_GOOD, KV_POISON, KV_SECOND, KV_BIZDUP };

static bool
kv_every(int i, int every)
{
        return every && i % every == every - 1;
}

/* A number in [0, 1000) for event i of seed s (salt: which draw). */
static int
kv_draw(unsigned s, int i, unsigned salt)
{
        uint64_t x = (uint64_t)s * 0x9E3779B97F4A7C15ull ^
                     ((uint64_t)(unsigned)i << 20) ^ salt;
        x ^= x >> 30;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 27;
        x *= 0x94D049BB133111EBull;
        x ^= x >> 31;
        return (int)(x % 1000);
}

static int
kv_kind(const kvstream_t *s, int i)
{
        if (!s->seed) {
                if (kv_every(i, s->poison_every))
                        return KV_POISON;
                if (kv_every(i, s->second_every))
                        return KV_SECOND;
                return kv_every(i, s->bizdup_every) ? KV_BIZDUP : KV_GOOD;
        }
        int r = kv_draw(s->seed, i, 1);
        if ((r -= s->pm_poison) < 0)
                return KV_POISON;
        if ((r -= s->pm_second) < 0)
                return KV_SECOND;
        return r < s->pm_bizdup && i > 0 ? KV_BIZDUP : KV_GOOD;
}

static void
produce_kv_stream(const char *topic, kvstream_t *s)
{
        kt_topic(topic, s->parts);
        kt_producer_t *pr = kt_producer_new();
        char id[32], payload[96];
        for (int i = 0; i < s->n; i++) {
                int part = i % s->parts, kind = kv_kind(s, i), j = -1;
                if (kind == KV_BIZDUP) {
                        /* the key of an earlier good event, maybe in the
                         * same batch */
                        j = i - 1 -
                            (s->seed ? kv_draw(s->seed, i, 3) : i) %
                                s->bizdup_back;
                        while (j >= 0 && kv_kind(s, j) != KV_GOOD)
                                j--;
                        if (j < 0)
                                kind = KV_GOOD;
                }
                if (kind == KV_POISON) {
                        snprintf(id, sizeof(id), "p-%d", i);
                        snprintf(payload, sizeof(payload), "k-%d -1", i);
                        s->poison++;
                } else if (kind == KV_SECOND) {
                        snprintf(id, sizeof(id), "d-%d", i);
                        snprintf(payload, sizeof(payload), "k-%d 777", i);
                        s->second++;
                } else if (kind == KV_BIZDUP) {
                        snprintf(id, sizeof(id), "b-%d", i);
                        snprintf(payload, sizeof(payload), "k-%d %d", j,
                                 s->bizdup_v);
                        /* behind the original on its partition, so the
                         * original is the one applied */
                        part = j % s->parts;
                        s->bizdup++;
                } else {
                        snprintf(id, sizeof(id), "g-%d", i);
                        snprintf(payload, sizeof(payload), "k-%d %d", i,
                                 i % 100);
                        s->good++;
                        s->sum += i % 100;
                }
                kt_produce(pr, topic, part, NULL, payload, id);
                if (s->seed ? kv_draw(s->seed, i, 2) < s->pm_resend
                            : kv_every(i, s->resend_every)) {
                        kt_produce(pr, topic, part, NULL, payload, id);
                        s->resent++;
                }
        }
        kt_producer_flush_destroy(pr);
}

/* kt_attr: a message's business key (k), its value (a CHECK rejects a
 * negative one), its id and the attempt that applied it. */
static void
create_kt_attr(const char *url)
{
        kt_exec(url, "CREATE TABLE kt_attr (k VARCHAR(64) PRIMARY KEY, "
                     "v INT NOT NULL CHECK (v >= 0), msg VARCHAR(64) NOT "
                     "NULL, attempt INT NOT NULL)");
}

/* A consumer of topic for the dirty streams: batch.max bmax, three
 * attempts, short backoffs (a retry would show as an attempt > 1). */
static kinbox_conf_t *
kv_conf(const char *url, const char *name, const char *topic, const char *bmax)
{
        kinbox_conf_t *c = kt_conf(url, name, kt_unique("gdirty"), topic);
        kt_set(c, "retry.max", "3");
        kt_set(c, "batch.max", bmax);
        kt_set(c, "retry.backoff.base.ms", "10");
        kt_set(c, "retry.backoff.max.ms", "50");
        return c;
}

/* Stream ks through attr_handler() (per message) or attr_batch() with
 * shape (batch) on backend, batch.max bmax, and check that every failure
 * was charged to its own message: every good event applied once at its
 * first attempt, the poison and business duplicates undone, the poison
 * dead at its first attempt, nothing retried. */
static void
run_attr(int backend, int shape, bool batch, const char *bmax, kvstream_t *ks)
{
        one_msg_calls = msgs_handed = 0;
        char *url = kt_fresh_db(kt_backend(backend));
        create_kt_attr(url);
        kt_exec(url, "CREATE TABLE kt_total (n BIGINT NOT NULL)");
        kt_exec(url, "INSERT INTO kt_total VALUES (0)");
        kt_exec(url, "CREATE TABLE kt_part (msg VARCHAR(64) PRIMARY KEY, "
                     "v INT NOT NULL CHECK (v >= 0))");
        char *topic = kt_unique("tdirty");
        produce_kv_stream(topic, ks);
        int good = ks->good, poison = ks->poison;
        kinbox_conf_t *c = kv_conf(url, "dirty", topic, bmax);
        /* shape outlives the run: the handlers read it through opaque */
        static int shape_arg;
        shape_arg = shape;
        kt_run_t *r = kt_run_start(c, batch ? NULL : attr_handler,
                                   batch ? attr_batch : NULL, &shape_arg);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, ks->n + ks->resent, 120, &st);
        /* Every good event once, at its first attempt. */
        cr_assert(eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_attr"), good));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kt_attr WHERE "
                                  "msg NOT LIKE 'g-%'"),
                     0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kt_attr WHERE "
                                  "attempt <> 1"),
                     0),
                  "a message was charged another message's failure");
        /* The business duplicates' and the poison's effects were undone
         * (the total, or their kt_part rows). */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT n + (SELECT COALESCE(SUM(v), 0) "
                                  "FROM kt_part) FROM kt_total"),
                     ks->sum));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kt_part WHERE msg "
                                  "NOT LIKE 'g-%'"),
                     0));
        assert_dead_are_poison(url, poison);
        /* Counted: business duplicates apart from redeliveries; nothing
         * was retried. */
        cr_assert(eq(u64, st.business_duplicates, (uint64_t)ks->bizdup));
        cr_assert(eq(u64, st.duplicates, (uint64_t)ks->resent));
        cr_assert(eq(u64, st.retried, 0));
        cr_assert(eq(u64, st.dead, (uint64_t)poison));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), ks->n));
        /* MariaDB names the failing row of an exec_values() statement,
         * and with exec_values() rows only the failing message's rows are
         * dropped: no message is handed to the handler twice, nothing is
         * narrowed down one message at a time. */
        if (shape == ATTR_VALUES_ONLY && backend == 1) {
                cr_assert(eq(int, msgs_handed, ks->n),
                          "messages were run again although their "
                          "neighbour's rows could be dropped");
                cr_assert(eq(int, one_msg_calls, 0),
                          "a failure was narrowed down although its rows "
                          "could be dropped");
        }
}

/* Parameters: backend (0 PostgreSQL, 1 MySQL) x handler shape (per
 * message, batch: plain, exec_values() after an UPDATE, exec_values()
 * only, a query with owners and the rows' keys, the same with misleading
 * keys; per message with a statement text of its own each). */
ParameterizedTestParameters(dirty, attribution_exact)
{
        static int v[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
        return cr_make_param_array(int, v, 14);
}
ParameterizedTest(int *param, dirty, attribution_exact, .timeout = 240)
{
        static const int shapes[] = {ATTR_PLAIN,
                                     ATTR_PLAIN,
                                     ATTR_PLAIN,
                                     ATTR_PLAIN,
                                     ATTR_VALUES_AFTER_UPDATE,
                                     ATTR_VALUES_AFTER_UPDATE,
                                     ATTR_VALUES_ONLY,
                                     ATTR_VALUES_ONLY,
                                     ATTR_OWNED,
                                     ATTR_OWNED,
                                     ATTR_OWNED_MISLEADING,
                                     ATTR_OWNED_MISLEADING,
                                     ATTR_FRESH_SQL,
                                     ATTR_FRESH_SQL};
        /* 1,500 events over 6 partitions: every 37th a CHECK poison, every
         * 29th a business duplicate of an earlier key (new id), every 41st
         * re-sent with its id (a redelivery). */
        kvstream_t ks = {.n = 1500,
                         .parts = 6,
                         .poison_every = 37,
                         .bizdup_every = 29,
                         .bizdup_back = 13,
                         .bizdup_v = 1000,
                         .resend_every = 41};
        run_attr(*param % 2, shapes[*param], *param >= 2 && *param < 12, "200",
                 &ks);
}

/* The same checks on streams drawn from seeds, batch handler only: each
 * seed picks the shape (a query with owners, the same with misleading
 * keys, plain, exec_values() after an UPDATE), batch.max (7 to 500), the
 * partitions (1 to 5) and the poison (1 to 6.6 %; 3 % business
 * duplicates, 2 % redeliveries). Parameter p is backend p % 2; its seed
 * is KT_DIRTY_SEED + p / 2 (two seeds, both backends), without it 31, 25,
 * 22 and 24 (each shape once, batch.max 7, 120, 500 and 250, the backends
 * alternating); the log names the seed. Seed 25 on MariaDB once timed out
 * on a loaded machine (not reproduced in 374 runs). */
ParameterizedTestParameters(dirty, random_attribution)
{
        static int v[] = {0, 1, 2, 3};
        return cr_make_param_array(int, v, 4);
}
ParameterizedTest(int *param, dirty, random_attribution, .timeout = 240)
{
        static const unsigned seeds[] = {31, 25, 22, 24};
        const char *base = getenv("KT_DIRTY_SEED");
        unsigned seed =
            base ? (unsigned)atoi(base) + (unsigned)*param / 2 : seeds[*param];
        static const int shapes[] = {ATTR_OWNED, ATTR_OWNED_MISLEADING,
                                     ATTR_PLAIN, ATTR_VALUES_AFTER_UPDATE};
        static const char *const shape_names[] = {
            "owned", "owned, misleading keys", "plain",
            "exec_values() after an UPDATE"};
        static const char *const bmax[] = {"120", "7", "500", "33", "250"};
        kvstream_t ks = {.n = 1000,
                         .parts = 1 + (int)(seed * 7 % 5),
                         .bizdup_back = 19,
                         .bizdup_v = 1000,
                         .seed = seed,
                         .pm_poison = 10 + 7 * (int)(seed % 9),
                         .pm_bizdup = 30,
                         .pm_resend = 20};
        fprintf(stderr,
                "random_attribution: seed %u, %s: batch handler (%s), "
                "batch.max %s, %d partitions\n",
                seed, *param % 2 ? "MariaDB" : "PostgreSQL",
                shape_names[seed % 4], bmax[seed % 5], ks.parts);
        run_attr(*param % 2, shapes[seed % 4], true, bmax[seed % 5], &ks);
}

/* A handler that says "already applied" itself: KINBOX_RESULT_DUPLICATE
 * commits what it queued, keeps the inbox row, counts the message. */
static kinbox_result_t
self_dup_handler(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        size_t n;
        const char *p = kinbox_msg_payload(msg, &n);
        if (n >= 3 && !memcmp(p, "dup", 3))
                return KINBOX_RESULT_DUPLICATE;
        const char *v[1] = {kinbox_msg_id(msg)};
        if (kinbox_tx_exec(tx, "INSERT INTO kt_seen (id) VALUES ($1)", 1, v))
                return KINBOX_RESULT_RETRY;
        return KINBOX_RESULT_OK;
}

KT_BACKENDS_PARAMS(dirty, result_duplicate)
ParameterizedTest(int *backend, dirty, result_duplicate, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "CREATE TABLE kt_seen (id VARCHAR(64) PRIMARY KEY)");
        char *topic = kt_unique("tsd");
        kt_topic(topic, 2);
        kt_producer_t *pr = kt_producer_new();
        char id[32];
        for (int i = 0; i < 100; i++) {
                snprintf(id, sizeof(id), "s-%d", i);
                kt_produce(pr, topic, i % 2, NULL, i % 10 ? "new" : "dup", id);
        }
        kt_producer_flush_destroy(pr);
        kinbox_conf_t *c = kt_conf(url, "selfdup", kt_unique("gsd"), topic);
        kt_run_t *r = kt_run_start(c, self_dup_handler, NULL, NULL);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, 100, 60, &st);
        cr_assert(eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_seen"), 90));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 100));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_dead_letter"),
                     0));
        cr_assert(eq(u64, st.business_duplicates, 10));
        cr_assert(eq(u64, st.processed, 90));
}

/* kinbox_tx_exec_claims(): each message's payload is a comma-separated
 * list of keys, one row each; the statement returns the keys it inserted.
 * kt_claims_bad: the statement returns no column (the handler's mistake). */
static bool kt_claims_bad;

static kinbox_result_t
claims_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, size_t count,
             kinbox_result_t *results, void *opaque)
{
        (void)results;
        (void)opaque;
        bool pg = kinbox_tx_backend(tx) == KINBOX_BACKEND_POSTGRESQL;
        size_t cap = 4 * count + 1;
        char(*keys)[64] = calloc(cap, sizeof(*keys));
        const char **kp = calloc(cap, sizeof(*kp));
        const kinbox_msg_t **own = calloc(cap, sizeof(*own));
        char *sql = malloc(64 * cap + 256), *arr = malloc(80 * cap + 8);
        size_t n = 0;
        for (size_t i = 0; i < count; i++) {
                size_t len;
                const char *p = kinbox_msg_payload(msgs[i], &len);
                char buf[256];
                snprintf(buf, sizeof(buf), "%.*s", (int)len, p ? p : "");
                for (char *save = NULL, *k = strtok_r(buf, ",", &save); k;
                     k = strtok_r(NULL, ",", &save)) {
                        snprintf(keys[n], sizeof(keys[n]), "%s", k);
                        kp[n] = keys[n];
                        own[n++] = msgs[i];
                }
        }
        const char *ret = kt_claims_bad ? "" : " RETURNING k";
        kinbox_err_t rc;
        if (pg) {
                strcpy(arr, "{");
                for (size_t r = 0; r < n; r++)
                        sprintf(arr + strlen(arr), "%s\"%s\"", r ? "," : "",
                                kp[r]);
                strcat(arr, "}");
                sprintf(sql,
                        "INSERT INTO kt_claim (k) SELECT k FROM "
                        "unnest($1::text[]) WITH ORDINALITY AS t(k, o) "
                        "ORDER BY o ON CONFLICT DO NOTHING%s",
                        ret);
                const char *pa[1] = {arr};
                rc = kinbox_tx_exec_claims(tx, sql, 1, pa, own, kp, n);
        } else {
                strcpy(sql, "INSERT IGNORE INTO kt_claim (k) VALUES ");
                for (size_t r = 0; r < n; r++)
                        sprintf(sql + strlen(sql), "%s($%zu)", r ? ", " : "",
                                r + 1);
                strcat(sql, ret);
                rc = kinbox_tx_exec_claims(tx, sql, (int)n, kp, own, kp, n);
        }
        free(keys);
        free(kp);
        free(own);
        free(sql);
        free(arr);
        return rc ? KINBOX_RESULT_RETRY : KINBOX_RESULT_OK;
}

/* A set-based claim counts a message none of whose rows it inserted as a
 * business duplicate, without the handler looking at the rows: keys taken
 * before the run, taken earlier in the same batch (the first message of a
 * key applies it), a message with one new key of two is applied; on
 * PostgreSQL a row a CHECK rejects dead-letters its own message only, at
 * its first attempt. */
KT_BACKENDS_PARAMS(dirty, exec_claims)
ParameterizedTest(int *backend, dirty, exec_claims, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "CREATE TABLE kt_claim (k VARCHAR(64) PRIMARY KEY, "
                     "CONSTRAINT kt_claim_len CHECK (k NOT LIKE 'bad%'))");
        for (int i = 0; i < 20; i++) {
                char q[96];
                snprintf(q, sizeof(q),
                         "INSERT INTO kt_claim (k) VALUES ('old-%d')", i);
                kt_exec(url, q);
        }
        char *topic = kt_unique("tcl");
        kt_topic(topic, 3);
        kt_producer_t *pr = kt_producer_new();
        char id[32], payload[128];
        int applied = 0, dups = 0, poison = 0, keys = 20;
        for (int i = 0; i < 600; i++) {
                switch (i % 10) {
                case 3: /* taken before the run */
                        snprintf(payload, sizeof(payload), "old-%d", i % 20);
                        dups++;
                        break;
                case 5: /* the key of message i - 1 (same partition) */
                        snprintf(payload, sizeof(payload), "k-%d", i - 1);
                        dups++;
                        break;
                case 6: /* one taken key, one new: applied */
                        snprintf(payload, sizeof(payload), "old-%d,n-%d",
                                 i % 20, i);
                        applied++;
                        keys++;
                        break;
                case 7: /* two taken keys */
                        snprintf(payload, sizeof(payload), "old-1,k-%d",
                                 i - 3);
                        dups++;
                        break;
                case 9: /* poison (MariaDB's INSERT IGNORE would skip
                         * the row: a duplicate) */
                        if (i % 40 == 9 && *backend == 0) {
                                snprintf(payload, sizeof(payload), "bad-%d",
                                         i);
                                poison++;
                                break;
                        }
                        /* fall through */
                default:
                        snprintf(payload, sizeof(payload), "k-%d", i);
                        applied++;
                        keys++;
                        break;
                }
                snprintf(id, sizeof(id), "%s-%d",
                         !strncmp(payload, "bad", 3) ? "p" : "c", i);
                kt_produce(pr, topic, i / 10 % 3, NULL, payload, id);
        }
        kt_producer_flush_destroy(pr);
        kinbox_conf_t *c = kt_conf(url, "claims", kt_unique("gcl"), topic);
        kt_set(c, "batch.max", "150");
        kt_run_t *r = kt_run_start(c, NULL, claims_batch, NULL);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, 600, 60, &st);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_claim"), keys));
        cr_assert(eq(u64, st.business_duplicates, (uint64_t)dups));
        cr_assert(eq(u64, st.processed, (uint64_t)applied));
        cr_assert(eq(u64, st.retried, 0));
        assert_dead_are_poison(url, poison);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 600));
}

/* A claim statement that returns no column is the handler's mistake: its
 * messages are dead letters saying so, nothing is counted as applied. */
KT_BACKENDS_PARAMS(dirty, exec_claims_no_column)
ParameterizedTest(int *backend, dirty, exec_claims_no_column, .timeout = 120)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "CREATE TABLE kt_claim (k VARCHAR(64) PRIMARY KEY)");
        char *topic = kt_unique("tcn");
        kt_topic(topic, 1);
        kt_producer_t *pr = kt_producer_new();
        char id[32], payload[32];
        for (int i = 0; i < 20; i++) {
                snprintf(id, sizeof(id), "c-%d", i);
                snprintf(payload, sizeof(payload), "k-%d", i);
                kt_produce(pr, topic, 0, NULL, payload, id);
        }
        kt_producer_flush_destroy(pr);
        kinbox_conf_t *c = kt_conf(url, "claims", kt_unique("gcn"), topic);
        kt_claims_bad = true;
        kt_run_t *r = kt_run_start(c, NULL, claims_batch, NULL);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, 20, 60, &st);
        kt_claims_bad = false;
        cr_assert(eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_claim"), 0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE attempts = 1 AND error LIKE "
                                  "'%kinbox_tx_exec_claims%RETURNING%'"),
                     20));
        cr_assert(eq(u64, st.dead, 20));
        cr_assert(eq(u64, st.processed, 0));
}

/* The built-in points handlers absorb business duplicates: the order is
 * granted once, whichever message ids carry it; order ids compare byte for
 * byte ("o-1 " and "o-1" are two orders on both backends). */
static void
points_business_duplicates(int backend, bool single)
{
        char *url = kt_fresh_db(kt_backend(backend));
        char *topic = kt_unique("tpb");
        kt_topic(topic, 4);
        kt_producer_t *pr = kt_producer_new();
        char id[32], payload[160], key[16];
        long long total = 0;
        int flows = 0, dups = 0, msgs = 0;
        for (int i = 0; i < 2000; i++) {
                int user = 1 + i % 50;
                bool dup = i % 25 == 24;
                int order = dup ? i - 1 - (i % 7) : i;
                snprintf(id, sizeof(id), "m-%d", i);
                snprintf(payload, sizeof(payload),
                         "{\"order_id\":\"o-%d%s\",\"user_id\":%d,"
                         "\"grant_points\":%d}",
                         order, order % 100 == 3 ? " " : "",
                         dup ? 1 + (order % 50) : user, 1 + order % 9);
                snprintf(key, sizeof(key), "%d", dup ? 1 + order % 50 : user);
                if (dup && order % 25 == 24)
                        continue; /* not an original: keep it simple */
                kt_produce(pr, topic, -1, key, payload, id);
                msgs++;
                if (dup) {
                        dups++;
                } else {
                        flows++;
                        total += 1 + i % 9;
                }
        }
        /* o-3 with a trailing blank is another order than o-3. */
        snprintf(payload, sizeof(payload),
                 "{\"order_id\":\"o-3\",\"user_id\":4,\"grant_points\":5}");
        kt_produce(pr, topic, -1, "4", payload, "m-extra");
        msgs++;
        flows++;
        total += 5;
        kt_producer_flush_destroy(pr);
        kinbox_conf_t *c = kt_conf(url, "points", kt_unique("gpb"), topic);
        kt_run_t *r = kt_run_start(
            c, single ? kinbox_points_single_module.handle : NULL,
            single ? NULL : kinbox_points_module.handle_batch, NULL);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, msgs, 120, &st);
        kt_assert_points(url, total, flows);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_dead_letter"),
                     0));
        cr_assert(eq(u64, st.business_duplicates, (uint64_t)dups));
        cr_assert(eq(u64, st.retried, 0));
}

KT_BACKENDS_PARAMS(dirty, points_batch_business_duplicates)
ParameterizedTest(int *backend, dirty, points_batch_business_duplicates,
                  .timeout = 180)
{
        points_business_duplicates(*backend, false);
}

KT_BACKENDS_PARAMS(dirty, points_single_business_duplicates)
ParameterizedTest(int *backend, dirty, points_single_business_duplicates,
                  .timeout = 180)
{
        points_business_duplicates(*backend, true);
}

/* Batch handler calls with one message whose message is not poison. */
static int good_alone;

static kinbox_result_t
counting_points_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs,
                      size_t count, kinbox_result_t *results, void *opaque)
{
        if (count == 1 && strncmp(kinbox_msg_id(msgs[0]), "p-", 2))
                __atomic_fetch_add(&good_alone, 1, __ATOMIC_RELAXED);
        return kinbox_points_module.handle_batch(tx, msgs, count, results,
                                                 opaque);
}

/* The points batch handler on a stream with SQL poison (grants a CHECK
 * the handler does not know rejects): PostgreSQL describes the failing
 * row, whose order id names a suspect that runs alone; only its own
 * failure dead-letters it. Every good grant is applied once, at its first
 * attempt; the poison is dead at its first attempt. */
KT_BACKENDS_PARAMS(dirty, points_batch_poison)
ParameterizedTest(int *backend, dirty, points_batch_poison, .timeout = 180)
{
        good_alone = 0;
        char *url = kt_fresh_db(kt_backend(*backend));
        kt_exec(url, "ALTER TABLE user_points_flow ADD CONSTRAINT "
                     "kt_grant_limit CHECK (points_delta <= 1000000)");
        char *topic = kt_unique("tpp");
        kt_topic(topic, 3);
        kt_producer_t *pr = kt_producer_new();
        char id[32], payload[160], key[16];
        long long total = 0;
        int flows = 0, poison = 0;
        for (int i = 0; i < 3000; i++) {
                int user = 1 + i % 40;
                bool bad = i % 37 == 36;
                snprintf(id, sizeof(id), "%s-%d", bad ? "p" : "g", i);
                snprintf(payload, sizeof(payload),
                         "{\"order_id\":\"o-%d\",\"user_id\":%d,"
                         "\"grant_points\":%d}",
                         i, user, bad ? 5000000 : 1 + i % 9);
                snprintf(key, sizeof(key), "%d", user);
                kt_produce(pr, topic, -1, key, payload, id);
                if (bad) {
                        poison++;
                } else {
                        flows++;
                        total += 1 + i % 9;
                }
        }
        kt_producer_flush_destroy(pr);
        kinbox_conf_t *c = kt_conf(url, "points", kt_unique("gpp"), topic);
        kt_set(c, "batch.max", "200");
        kt_set(c, "retry.max", "3");
        kt_run_t *r = kt_run_start(c, NULL, counting_points_batch, NULL);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, 3000, 120, &st);
        kt_assert_points(url, total, flows);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM user_points_flow "
                                  "WHERE points_delta > 1000000"),
                     0));
        assert_dead_are_poison(url, poison);
        cr_assert(eq(u64, st.retried, 0));
        cr_assert(eq(u64, st.dead, (uint64_t)poison));
        cr_assert(eq(u64, st.processed, (uint64_t)flows));
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 3000));
        /* Narrowing went by the failing row (PostgreSQL's detail, MariaDB's
         * row number), not one message at a time: a good message runs
         * alone only as what is left beside a poison (at most one on
         * either side), never as the search for it. */
        cr_assert(le(int, good_alone, 2 * poison),
                  "%d good messages ran alone for %d poison", good_alone,
                  poison);
}

/* Two tables a message: payload "KEY V" inserts (KEY, V, attempt) into
 * kt_attr (its business key; a negative V violates a CHECK there) and
 * (msg, V) into kt_credit, whose CHECK rejects V = 777: a message can fail
 * in either statement of its call. */
static kinbox_err_t
credit_rows(kinbox_tx_t *tx, const char *const *cr,
            const kinbox_msg_t *const *owner, size_t n)
{
        return kinbox_tx_exec_values(tx,
                                     "INSERT INTO kt_credit (msg, v) "
                                     "VALUES ",
                                     "($1, $2)", NULL, 2, cr, owner, n);
}

static kinbox_result_t
two_one(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        char key[64], v[32], att[16];
        if (parse_kv(msg, key, sizeof(key), v, sizeof(v))) {
                kinbox_tx_set_error(tx, "payload: expected \"KEY V\"");
                return KINBOX_RESULT_REJECT;
        }
        snprintf(att, sizeof(att), "%d", kinbox_msg_attempt(msg));
        const char *ins[4] = {key, v, kinbox_msg_id(msg), att};
        const char *cr[2] = {kinbox_msg_id(msg), v};
        if (kinbox_tx_exec_unique(tx, NULL,
                                  "INSERT INTO kt_attr (k, v, msg, attempt) "
                                  "VALUES ($1, $2, $3, $4)",
                                  4, ins) ||
            credit_rows(tx, cr, NULL, 1))
                return KINBOX_RESULT_RETRY;
        return KINBOX_RESULT_OK;
}

static kinbox_result_t
two_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, size_t count,
          kinbox_result_t *results, void *opaque)
{
        (void)opaque;
        const char **p = calloc(4 * count + 1, sizeof(*p));
        const char **cr = calloc(2 * count + 1, sizeof(*cr));
        const kinbox_msg_t **owner = calloc(count + 1, sizeof(*owner));
        char(*keys)[64] = calloc(count + 1, 64);
        char(*vs)[32] = calloc(count + 1, 32);
        char(*atts)[16] = calloc(count + 1, 16);
        size_t n = 0;
        kinbox_result_t rc = KINBOX_RESULT_RETRY;
        if (!p || !cr || !owner || !keys || !vs || !atts)
                goto out;
        for (size_t i = 0; i < count; i++) {
                if (parse_kv(msgs[i], keys[i], 64, vs[i], 32)) {
                        results[i] = KINBOX_RESULT_REJECT;
                        kinbox_tx_set_msg_error(tx, msgs[i], "payload");
                        continue;
                }
                snprintf(atts[i], 16, "%d", kinbox_msg_attempt(msgs[i]));
                p[4 * n] = keys[i];
                p[4 * n + 1] = vs[i];
                p[4 * n + 2] = kinbox_msg_id(msgs[i]);
                p[4 * n + 3] = atts[i];
                cr[2 * n] = kinbox_msg_id(msgs[i]);
                cr[2 * n + 1] = vs[i];
                owner[n++] = msgs[i];
        }
        rc = KINBOX_RESULT_OK;
        if (n && (kinbox_tx_exec_values_unique(
                      tx, NULL,
                      "INSERT INTO kt_attr (k, v, msg, attempt) "
                      "VALUES ",
                      "($1, $2, $3, $4)", "", 4, p, owner, n) ||
                  credit_rows(tx, cr, owner, n)))
                rc = KINBOX_RESULT_RETRY;
out:
        free(p);
        free(cr);
        free(owner);
        free(keys);
        free(vs);
        free(atts);
        return rc;
}

/* Stream ks through the two-table handlers (per message when single, else
 * the batch handler) with batch.max bmax, and check what a user would:
 * every good event applied once at its first attempt with one credit,
 * nothing of a poison, a business duplicate or an undone call left, every
 * poison dead once at its first attempt with its own statement's CHECK
 * violation, business duplicates and redeliveries counted, nothing
 * retried. kt_credit has no key: a row applied twice would show. */
static void
run_two_tables(int backend, bool single, const char *bmax, kvstream_t *ks)
{
        char *url = kt_fresh_db(kt_backend(backend));
        create_kt_attr(url);
        kt_exec(url, "CREATE TABLE kt_credit (msg VARCHAR(64) NOT NULL, "
                     "v INT NOT NULL CHECK (v <> 777))");
        char *topic = kt_unique("ttwo");
        produce_kv_stream(topic, ks);
        int good = ks->good, dead = ks->poison + ks->second;
        kinbox_conf_t *c = kv_conf(url, "two", topic, bmax);
        kt_run_t *r = kt_run_start(c, single ? two_one : NULL,
                                   single ? NULL : two_batch, NULL);
        kinbox_consumer_stats_t st;
        drain_stop(url, r, ks->n + ks->resent, 180, &st);
        cr_assert(eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_attr"), good));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kt_attr WHERE "
                                  "msg NOT LIKE 'g-%' OR attempt <> 1"),
                     0),
                  "a message was charged another message's failure");
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kt_credit"), good),
            "rows of undone calls or failed messages committed");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(DISTINCT msg) FROM kt_credit "
                                  "WHERE msg LIKE 'g-%'"),
                     good));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COALESCE(SUM(v), 0) FROM kt_credit"),
                     ks->sum));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(DISTINCT message_id) FROM "
                                  "kinbox_dead_letter"),
                     dead));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"),
                     dead),
                  "a message was dead-lettered twice");
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE (message_id LIKE 'p-%' OR message_id "
                                  "LIKE 'd-%') AND attempts = 1 AND (error "
                                  "LIKE '%23514%' OR error LIKE '%4025%')"),
                     dead));
        cr_assert(eq(u64, st.business_duplicates, (uint64_t)ks->bizdup));
        cr_assert(eq(u64, st.duplicates, (uint64_t)ks->resent));
        cr_assert(eq(u64, st.retried, 0));
        cr_assert(eq(u64, st.processed, (uint64_t)good));
}

/* A message fails in its call's second statement while a neighbour failed
 * in the first. On MariaDB the first failure drops its message's rows and
 * the second cannot (the message's row in the first statement ran); once,
 * when the cut after the second put the first in a later group, the first
 * was dead-lettered twice. 1,200 events over 4 partitions: every 31st a
 * CHECK poison of its own statement, every 97th a poison of its kt_credit
 * row, every 23rd a business duplicate. Parameters: backend x (batch
 * handler, per-message handler). */
ParameterizedTestParameters(dirty, second_statement_poison)
{
        static int v[] = {0, 1, 2, 3};
        return cr_make_param_array(int, v, 4);
}
ParameterizedTest(int *param, dirty, second_statement_poison, .timeout = 240)
{
        kvstream_t ks = {.n = 1200,
                         .parts = 4,
                         .poison_every = 31,
                         .second_every = 97,
                         .bizdup_every = 23,
                         .bizdup_back = 11,
                         .bizdup_v = 5};
        run_two_tables(*param % 2, *param >= 2, "150", &ks);
}

/* The same checks on streams drawn from fixed seeds: each seed picks the
 * handler shape, batch.max (1 to 250), the partitions (1 to 6) and the
 * mix (1-4 % poison of either statement, 4 % business duplicates, 2 %
 * redeliveries), so failures meet cuts, bisections, drops and batch
 * edges in ways no hand-made pattern lists. Parameter p is backend p % 2,
 * seed KT_DIRTY_SEED + p / 2 (KT_DIRTY_SEED defaults to 1: other seeds
 * explore further); the log names the seed. */
ParameterizedTestParameters(dirty, random_streams)
{
        static int v[] = {0, 1, 2, 3, 4, 5, 6, 7};
        return cr_make_param_array(int, v, 8);
}
ParameterizedTest(int *param, dirty, random_streams, .timeout = 240)
{
        const char *base = getenv("KT_DIRTY_SEED");
        unsigned seed =
            (base ? (unsigned)atoi(base) : 1) + (unsigned)*param / 2;
        static const char *const bmax[] = {"250", "1", "9", "64"};
        kvstream_t ks = {.n = 1000,
                         .parts = 1 + (int)(seed * 5 % 6),
                         .bizdup_back = 17,
                         .bizdup_v = 5,
                         .seed = seed,
                         .pm_poison = 5 + 5 * (int)seed,
                         .pm_second = 10,
                         .pm_bizdup = 40,
                         .pm_resend = 20};
        fprintf(stderr,
                "random_streams: seed %u: %s handler, batch.max %s, %d "
                "partitions\n",
                seed, seed % 2 ? "batch" : "per-message", bmax[seed % 4],
                ks.parts);
        run_two_tables(*param % 2, seed % 2 == 0, bmax[seed % 4], &ks);
}
