/*
 * hold_test.c -- dead_letter.hold_key (issue 14), on both backends: a dead
 * letter holds back the later messages of its key on its partition (they
 * are parked, the partition flows on for other keys), and replaying or
 * discarding it makes the running consumer apply them in offset order,
 * exactly once, also across a SIGKILL during the release and a rebalance.
 *
 * The handler (tests/modules/hold.c, compiled in here and loaded by
 * `kinbox run` as module kthold) keeps one row per key and counts every
 * message whose sequence number is not the next one in out_of_order, so
 * order is checked by the database, not by trusting the handler.
 */
#include "harness.h"

#include <librdkafka/rdkafka.h>

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modules/hold.c"

#define NKEYS 100
#define NSEQ 10
#define SQL_OFFSETS "SELECT COALESCE(SUM(next_offset), 0) FROM kinbox_offsets"
#define SQL_PARKED "SELECT COUNT(*) FROM kinbox_parked"
#define SQL_HOLDS "SELECT COUNT(*) FROM kinbox_hold"

/* The handler's tables and one state row per key k0..k<nkeys-1>. */
static void
setup_state(const char *url, int nkeys)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        char e[512];
        cr_assert(eq(int,
                     kinbox_migrate_module(c, &kinbox_module, e, sizeof(e)),
                     KINBOX_OK),
                  "%s", e);
        kinbox_conf_destroy(c);
        char sql[64];
        for (int k = 0; k < nkeys; k++) {
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kthold_state (k) VALUES ('k%d')", k);
                kt_exec(url, sql);
        }
}

/* Messages seq from..to of keys 0..nkeys-1 (key = "k<i>", by-key
 * partitioning, id m-<key>-<seq>); (pkey, pseq) is poison. */
static void
produce_keys(const char *topic, int nkeys, int from, int to, int pkey,
             int pseq)
{
        kt_producer_t *p = kt_producer_new();
        for (int s = from; s <= to; s++)
                for (int k = 0; k < nkeys; k++) {
                        char key[16], payload[64], id[48];
                        snprintf(key, sizeof(key), "k%d", k);
                        snprintf(payload, sizeof(payload), "k%d %d%s", k, s,
                                 k == pkey && s == pseq ? " P" : "");
                        snprintf(id, sizeof(id), "m-k%d-%d", k, s);
                        kt_produce(p, topic, -1, key, payload, id);
                }
        kt_producer_flush_destroy(p);
}

/* Key k's state: last_seq, applied, out_of_order. */
static void
assert_key(const char *url, int k, int last, int applied)
{
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT last_seq FROM kthold_state WHERE k = "
                              "'k%d'",
                              k),
                     last),
                  "k%d last_seq", k);
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT applied FROM kthold_state WHERE k = "
                              "'k%d'",
                              k),
                     applied),
                  "k%d applied", k);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COALESCE(SUM(out_of_order), 0) "
                                  "FROM kthold_state"),
                     0),
                  "messages applied out of order");
}

/* Every key but pkey applied completely, in order. */
static void
assert_others(const char *url, int nkeys, int nseq, int pkey)
{
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT COUNT(*) FROM kthold_state WHERE "
                              "last_seq = %d AND applied = %d AND "
                              "out_of_order = 0 AND k <> 'k%d'",
                              nseq, nseq, pkey),
                     nkeys - 1));
}

static long long
dead_id(const char *url)
{
        return kt_qint(url, "SELECT MIN(id) FROM kinbox_dead_letter WHERE "
                            "status = 'dead'");
}

static kinbox_conf_t *
hold_conf(const char *url, const char *group, const char *topic)
{
        kinbox_conf_t *c = kt_conf(url, "hold", group, topic);
        kt_set(c, "dead_letter.hold_key", "true");
        kt_set(c, "dead_letter.release.poll.ms", "100");
        kt_set(c, "retry.backoff.base.ms", "10");
        return c;
}

static void
replay(const char *url, long long id, kinbox_handler_fn fn,
       kinbox_batch_handler_fn bfn)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        char e[512];
        kinbox_admin_t *adm = kinbox_admin_new(c, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        kinbox_result_t r;
        kinbox_err_t rc = kinbox_dead_replay(adm, id, fn, bfn, NULL, &r);
        cr_assert(eq(int, rc, KINBOX_OK), "replay: %s",
                  kinbox_admin_errstr(adm));
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(c);
}

/* The stream with one poison message in the middle of key 42, consumed:
 * the other 99 keys applied, key 42 up to the poison, the rest parked. */
static void
poisoned_stream(const char *url, const char *topic)
{
        kt_topic(topic, 4);
        setup_state(url, NKEYS);
        produce_keys(topic, NKEYS, 1, NSEQ, 42, 5);
}

static void
assert_poisoned(const char *url)
{
        cr_assert(eq(i64, kt_wait_qint(url, SQL_OFFSETS, NKEYS * NSEQ, 90),
                     NKEYS * NSEQ));
        assert_others(url, NKEYS, NSEQ, 42);
        assert_key(url, 42, 4, 4);
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), NSEQ - 5));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_parked WHERE "
                                  "message_id LIKE 'm-k42-%'"),
                     NSEQ - 5));
        cr_assert(eq(i64, kt_qint(url, SQL_HOLDS), 1));
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 1));
        /* Parked messages keep their inbox rows: a redelivery is a
         * duplicate. */
        cr_assert(eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"),
                     NKEYS * NSEQ));
}

/* ---- poison in the middle of one key; fix, replay: in order ---- */

KT_BACKENDS_PARAMS(hold, replay_applies_followers_in_order)
ParameterizedTest(int *backend, hold, replay_applies_followers_in_order,
                  .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("h1");
        poisoned_stream(url, topic);
        kt_run_t *r = kt_run_start(hold_conf(url, kt_unique("hg1"), topic),
                                   kthold_handle, NULL, NULL);
        assert_poisoned(url);
        /* Later messages of the held key keep being parked behind. */
        produce_keys(topic, 43, NSEQ + 1, NSEQ + 2, -1, -1);
        cr_assert(eq(i64,
                     kt_wait_qint(url, SQL_OFFSETS, NKEYS * NSEQ + 86, 60),
                     NKEYS * NSEQ + 86));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), NSEQ - 5 + 2));
        assert_key(url, 41, NSEQ + 2, NSEQ + 2);
        assert_key(url, 42, 4, 4);
        /* A replay that fails leaves the hold. */
        long long id = dead_id(url);
        kinbox_conf_t *ac = kinbox_conf_new();
        kt_set(ac, "database.url", url);
        char e[512];
        kinbox_admin_t *adm = kinbox_admin_new(ac, e, sizeof(e));
        cr_assert(ne(
            int, kinbox_dead_replay(adm, id, kthold_handle, NULL, NULL, NULL),
            KINBOX_OK));
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(ac);
        usleep(500 * 1000);
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), NSEQ - 5 + 2));
        /* Fix the cause, replay: the followers are applied after it. */
        kt_exec(url, "INSERT INTO kthold_fix (k) VALUES ('k42')");
        replay(url, id, kthold_handle, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_HOLDS, 0, 60), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        assert_key(url, 42, NSEQ + 2, NSEQ + 2);
        /* The key is no longer held: new messages are applied. */
        produce_keys(topic, 43, NSEQ + 3, NSEQ + 3, -1, -1);
        cr_assert(eq(i64,
                     kt_wait_qint(url,
                                  "SELECT applied FROM kthold_state WHERE k "
                                  "= 'k42'",
                                  NSEQ + 3, 60),
                     NSEQ + 3));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        kt_run_stop(r);
        assert_key(url, 42, NSEQ + 3, NSEQ + 3);
        /* Keys 0..42 got three more messages, the others none. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kthold_state WHERE "
                                  "last_seq = applied AND out_of_order = 0 "
                                  "AND last_seq = CASE WHEN LENGTH(k) = 2 "
                                  "OR k < 'k43' THEN 13 ELSE 10 END"),
                     NKEYS));
}

/* ---- discard: the followers apply in order, without the poison ---- */

KT_BACKENDS_PARAMS(hold, discard_releases_followers)
ParameterizedTest(int *backend, hold, discard_releases_followers,
                  .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("h2");
        char *group = kt_unique("hg2");
        poisoned_stream(url, topic);
        kt_run_t *r = kt_run_start(hold_conf(url, group, topic), kthold_handle,
                                   NULL, NULL);
        assert_poisoned(url);
        char *ini = kt_write_ini(url,
                                 "[consumer.hold]\ngroup.id = %s\ntopics = "
                                 "%s\nhandler = kthold\nhandler.path = %s\n"
                                 "dead_letter.hold_key = true\n",
                                 group, topic, kt_env("KINBOX_TEST_MODULES"));
        char *out = NULL;
        cr_assert(
            eq(int, kt_kinbox(&out, NULL, true, "dead list -c %s", ini), 0));
        cr_assert(strstr(out, "HOLDS BACK") != NULL, "%s", out);
        free(out);
        cr_assert(
            eq(int, kt_kinbox(&out, NULL, true, "dead parked -c %s", ini), 0));
        cr_assert(strstr(out, "m-k42-10") != NULL, "%s", out);
        free(out);
        cr_assert(eq(int, kt_kinbox(&out, NULL, true, "status -c %s", ini), 0),
                  "%s", out);
        cr_assert(strstr(out, "HELD KEYS") != NULL, "%s", out);
        free(out);
        kt_exec(url, "INSERT INTO kthold_skip (k, seq) VALUES ('k42', 5)");
        cr_assert(
            eq(int,
               kt_kinbox(&out, NULL, true, "dead discard %lld -c %s --wait",
                         dead_id(url), ini),
               0),
            "%s", out);
        cr_assert(strstr(out, "5 parked") != NULL, "%s", out);
        cr_assert(strstr(out, "released messages applied") != NULL, "%s", out);
        free(out);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_HOLDS, 0, 60), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        kt_run_stop(r);
        assert_key(url, 42, NSEQ, NSEQ - 1);
        assert_others(url, NKEYS, NSEQ, 42);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kthold_poison"), 0));
}

/* ---- option off: the partition moves on, the key too ---- */

KT_BACKENDS_PARAMS(hold, off_applies_followers)
ParameterizedTest(int *backend, hold, off_applies_followers, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("h0");
        poisoned_stream(url, topic);
        kinbox_conf_t *c = hold_conf(url, kt_unique("hg0"), topic);
        kt_set(c, "dead_letter.hold_key", "false");
        kt_run_t *r = kt_run_start(c, kthold_handle, NULL, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_OFFSETS, NKEYS * NSEQ, 90),
                     NKEYS * NSEQ));
        kt_run_stop(r);
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_HOLDS), 0));
        /* Key 42 jumped over the poison: one out-of-order application. */
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT out_of_order FROM kthold_state "
                                  "WHERE k = 'k42'"),
                     1));
}

/* ---- a batch handler that rejects a message and applied its follower
 * in the same call ---- */

static atomic_int g_fixed;

static kinbox_result_t
kthold_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, size_t count,
             kinbox_result_t *results, void *opaque)
{
        (void)opaque;
        for (size_t i = 0; i < count; i++) {
                char k[64], seq[32];
                int poison;
                results[i] = KINBOX_RESULT_OK;
                if (kthold_parse(msgs[i], k, sizeof(k), seq, sizeof(seq),
                                 &poison) ||
                    (poison && !atomic_load(&g_fixed))) {
                        kinbox_tx_set_msg_error(tx, msgs[i], "poison");
                        results[i] = KINBOX_RESULT_REJECT;
                        continue;
                }
                const char *v[2] = {k, seq};
                if (kinbox_tx_exec(
                        tx,
                        "UPDATE kthold_state SET out_of_order = out_of_order "
                        "+ CASE WHEN $2 = last_seq + 1 THEN 0 ELSE 1 END, "
                        "last_seq = $2, applied = applied + 1 WHERE k = $1",
                        2, v))
                        return KINBOX_RESULT_RETRY;
        }
        return KINBOX_RESULT_OK;
}

KT_BACKENDS_PARAMS(hold, batch_handler)
ParameterizedTest(int *backend, hold, batch_handler, .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("h3");
        poisoned_stream(url, topic);
        atomic_store(&g_fixed, 0);
        kt_run_t *r = kt_run_start(hold_conf(url, kt_unique("hg3"), topic),
                                   NULL, kthold_batch, NULL);
        assert_poisoned(url);
        atomic_store(&g_fixed, 1);
        replay(url, dead_id(url), NULL, kthold_batch);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_HOLDS, 0, 60), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        kt_run_stop(r);
        assert_key(url, 42, NSEQ, NSEQ);
        assert_others(url, NKEYS, NSEQ, 42);
}

/* ---- `kinbox run`: SIGKILL during the release, a rebalance during the
 * release ---- */

#define PKEYS 10

static char *
run_ini(const char *url, const char *group, const char *topic)
{
        return kt_write_ini(url,
                            "[consumer.hold]\ngroup.id = %s\ntopics = %s\n"
                            "handler = kthold\nhandler.path = %s\n"
                            "batch.max = 50\ndead_letter.hold_key = true\n"
                            "dead_letter.release.poll.ms = 100\n",
                            group, topic, kt_env("KINBOX_TEST_MODULES"));
}

/* PKEYS keys of nseq messages, poison at key 3 seq 2, consumed by one
 * `kinbox run` and stopped: nseq - 2 parked. Returns the ini. */
static char *
parked_by_process(const char *url, const char *topic, int nseq)
{
        kt_topic(topic, 4);
        setup_state(url, PKEYS);
        produce_keys(topic, PKEYS, 1, nseq, 3, 2);
        char *ini = run_ini(url, kt_unique("hgp"), topic);
        pid_t a = kt_spawn_kinbox(ini, NULL, kt_tmp("hold_a"));
        cr_assert(eq(i64, kt_wait_qint(url, SQL_OFFSETS, PKEYS * nseq, 90),
                     PKEYS * nseq));
        kill(a, SIGTERM);
        cr_assert(eq(int, kt_wait(a, 60), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), nseq - 2));
        assert_key(url, 3, 1, 1);
        /* Fix the cause; replay with the command. */
        kt_exec(url, "INSERT INTO kthold_fix (k) VALUES ('k3')");
        char *out = NULL;
        int ex = kt_kinbox(&out, NULL, true, "dead replay %lld -c %s",
                           dead_id(url), ini);
        cr_assert(eq(int, ex, 0), "%s", out);
        char want[64];
        snprintf(want, sizeof(want), "%d parked", nseq - 2);
        cr_assert(strstr(out, want) != NULL, "%s", out);
        free(out);
        assert_key(url, 3, 2, 2);
        return ini;
}

KT_BACKENDS_PARAMS(hold, sigkill_during_release)
ParameterizedTest(int *backend, hold, sigkill_during_release, .timeout = 300)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("h4");
        char *ini = parked_by_process(url, topic, 40);
        /* Killed before the 6th release transaction commits. */
        pid_t b = kt_spawn_kinbox(ini, "KINBOX_FAULT=release_commit:5",
                                  kt_tmp("hold_b"));
        cr_assert(eq(int, kt_wait(b, 90), -SIGKILL));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 38 - 5));
        assert_key(url, 3, 7, 7);
        pid_t c = kt_spawn_kinbox(ini, NULL, kt_tmp("hold_c"));
        cr_assert(eq(i64, kt_wait_qint(url, SQL_HOLDS, 0, 90), 0));
        kill(c, SIGTERM);
        cr_assert(eq(int, kt_wait(c, 60), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        assert_key(url, 3, 40, 40);
        assert_others(url, PKEYS, 40, 3);
}

KT_BACKENDS_PARAMS(hold, rebalance_during_release)
ParameterizedTest(int *backend, hold, rebalance_during_release, .timeout = 300)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("h5");
        char *ini = parked_by_process(url, topic, 100);
        /* Slow releases (30 ms a message); a second process joins the
         * group while the first one releases. */
        pid_t a =
            kt_spawn_kinbox(ini, "KTHOLD_SLOW_US=30000", kt_tmp("hold_ra"));
        long long left = 98;
        for (int i = 0; i < 600 && left > 95; i++) {
                usleep(100 * 1000);
                left = kt_qint(url, SQL_PARKED);
        }
        cr_assert(le(i64, left, 95), "the release did not start");
        pid_t b =
            kt_spawn_kinbox(ini, "KTHOLD_SLOW_US=30000", kt_tmp("hold_rb"));
        cr_assert(eq(i64, kt_wait_qint(url, SQL_HOLDS, 0, 120), 0));
        kill(a, SIGTERM);
        kill(b, SIGTERM);
        cr_assert(eq(int, kt_wait(a, 60), 0));
        cr_assert(eq(int, kt_wait(b, 60), 0));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 0));
        assert_key(url, 3, 100, 100);
        assert_others(url, PKEYS, 100, 3);
}

/* ---- a repeated header: one rule for the message id and the held key
 * (docs/handlers.md, "Repeated headers") ---- */

static kinbox_result_t
applied_handle(kinbox_tx_t *tx, const kinbox_msg_t *m, void *opaque)
{
        (void)opaque;
        const char *p[1] = {kinbox_msg_id(m)};
        kinbox_tx_exec(tx, "INSERT INTO hdr_applied (id) VALUES ($1)", 1, p);
        return KINBOX_RESULT_OK;
}

/* One record: key "k", its message_id headers, then its "acct" ones. */
static void
produce_hdrs(rd_kafka_t *rk, const char *topic, const char *const *ids,
             const char *const *accts)
{
        rd_kafka_headers_t *h = rd_kafka_headers_new(4);
        for (; *ids; ids++)
                rd_kafka_header_add(h, "message_id", -1, *ids, -1);
        for (; *accts; accts++)
                rd_kafka_header_add(h, "acct", -1, *accts, -1);
        rd_kafka_resp_err_t err = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
            RD_KAFKA_V_KEY("k", 1), RD_KAFKA_V_VALUE("v", 1),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h),
            RD_KAFKA_V_END);
        cr_assert(err == 0, "produce: %s", rd_kafka_err2str(err));
}

KT_BACKENDS_PARAMS(hold, repeated_header_is_ambiguous)
ParameterizedTest(int *backend, hold, repeated_header_is_ambiguous,
                  .timeout = 240)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *topic = kt_unique("hh");
        kt_topic(topic, 1);
        kt_exec(url, "CREATE TABLE hdr_applied (id VARCHAR(64) PRIMARY KEY)");
        char e[512];
        rd_kafka_conf_t *pc = rd_kafka_conf_new();
        rd_kafka_conf_set(pc, "bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"),
                          e, sizeof(e));
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, pc, e, sizeof(e));
        cr_assert(rk != NULL, "%s", e);
        /* The held key's header twice: dead, holding nothing, so the next
         * message of either value is applied. */
        produce_hdrs(rk, topic, (const char *[]){"m1", NULL},
                     (const char *[]){"A", "B", NULL});
        produce_hdrs(rk, topic, (const char *[]){"m2", NULL},
                     (const char *[]){"B", NULL});
        /* The id's header twice: dead; its held key is one value, held. */
        produce_hdrs(rk, topic, (const char *[]){"m3", "m3", NULL},
                     (const char *[]){"C", NULL});
        produce_hdrs(rk, topic, (const char *[]){"m4", NULL},
                     (const char *[]){"C", NULL});
        cr_assert(rd_kafka_flush(rk, 60000) == 0, "flush");
        rd_kafka_destroy(rk);
        kinbox_conf_t *c = hold_conf(url, kt_unique("hgh"), topic);
        kt_set(c, "dead_letter.hold_key.source", "header:acct");
        kt_run_t *r = kt_run_start(c, applied_handle, NULL, NULL);
        cr_assert(eq(i64, kt_wait_qint(url, SQL_OFFSETS, 4, 90), 4));
        kt_run_stop(r);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM hdr_applied"), 1));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM hdr_applied WHERE "
                                  "id = 'm2'"),
                     1));
        cr_assert(
            eq(i64,
               kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter WHERE "
                            "message_id = 'm1' AND error LIKE "
                            "'%ambiguous held key: 2 \"acct\" headers%'"),
               1));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE message_id IS NULL AND error LIKE "
                                  "'%ambiguous message id: 2 \"message_id\" "
                                  "headers%'"),
                     1));
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 2));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_parked WHERE "
                                  "message_id = 'm4' AND hold_key = 'C'"),
                     1));
        cr_assert(eq(i64, kt_qint(url, SQL_PARKED), 1));
        cr_assert(eq(i64, kt_qint(url, SQL_HOLDS), 1));
}
