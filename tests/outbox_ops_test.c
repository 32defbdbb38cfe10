/*
 * outbox_ops_test.c -- the outbox's operator side and its writer on the
 * caller's connection: brokers down until rows go dead, then requeued
 * (issue 4's test 4); local actions, requeue and cancel (test 6); a lock
 * timeout on append; what kinbox_outbox_list() reports. Helpers:
 * outbox_common.h.
 *
 * Each test makes its own database (kt_fresh_db) and its own topics.
 * Tests that take brokers down run their own in-process librdkafka mock
 * cluster, so they never disturb other tests sharing the dev broker.
 */
#include "outbox_common.h"

#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "db.h"

/* ------------------------------------------------------------ test 4 */

static kinbox_outbox_status_t list_status;
static int
count_row(const kinbox_outbox_row_t *row, void *opaque)
{
        int *n = opaque;
        if (row->status == list_status && row->last_error != NULL &&
            row->attempts > 0)
                (*n)++;
        return 0;
}

/*
 * Broker unreachable, then back: attempts and backoff recorded, everything
 * published after recovery; rows past max_attempts are dead; requeue
 * publishes them.
 */
KT_BACKENDS_PARAMS(outbox_broker_down, backends)
ParameterizedTest(int *bidx, outbox_broker_down, backends, .timeout = 180)
{
        const char *backend = kt_backend(*bidx);
        mock_t mk;
        mock_start(&mk, 3);
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_down");
        cr_assert(rd_kafka_mock_topic_create(mk.mc, topic, 4, 1) == 0);
        mock_brokers(&mk, 3, false);

        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        for (int i = 0; i < 13; i++) {
                char key[32], agg[32];
                snprintf(key, sizeof(key), "k-%d", i);
                snprintf(agg, sizeof(agg), "a-%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = key,
                                         .aggregate_id = agg,
                                         .payload = key,
                                         .payload_size = strlen(key),
                                         /* 10 survive, 3 go dead */
                                         .max_attempts = i < 10 ? 1000 : 2};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        kinbox_conf_t *conf = relay_conf(url, mk.bootstrap);
        cset(conf, "kafka.message.timeout.ms", "800");
        cset(conf, "relay.lease.ms", "3000");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);

        bool dead = wait_q(url, 3, 60,
                           "SELECT count(*) FROM kinbox_outbox WHERE "
                           "status = 'dead' AND attempts = 2 AND "
                           "last_error IS NOT NULL");
        bool tried = wait_q(url, 10, 30,
                            "SELECT count(*) FROM kinbox_outbox WHERE "
                            "status = 'pending' AND attempts >= 2 AND "
                            "last_error IS NOT NULL");
        cr_assert(dead, "rows past max_attempts are not dead");
        cr_assert(tried, "failed attempts not recorded");
        cr_assert(eq(i64,
                     kt_qintf(url, "SELECT count(*) FROM kinbox_outbox "
                                   "WHERE status = 'sent'"),
                     0));
        /* The operator's view of it. */
        char e[512];
        kinbox_conf_t *ac = kinbox_conf_new();
        cset(ac, "database.url", url);
        kinbox_admin_t *adm = kinbox_admin_new(ac, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        kinbox_conf_destroy(ac);
        int ndead = 0;
        list_status = KINBOX_OUTBOX_DEAD;
        cr_assert(eq(int,
                     kinbox_outbox_list(adm, KINBOX_OUTBOX_DEAD, topic, 0, 100,
                                        count_row, &ndead),
                     KINBOX_OK));
        cr_assert(eq(int, ndead, 3));

        mock_brokers(&mk, 3, true);
        bool sent = wait_q(url, 10, 60,
                           "SELECT count(*) FROM kinbox_outbox WHERE "
                           "status = 'sent'");
        cr_assert(sent, "not published after the brokers came back");

        uint64_t n = 0;
        cr_assert(eq(int, kinbox_outbox_requeue_destination(adm, topic, &n),
                     KINBOX_OK),
                  "%s", kinbox_admin_errstr(adm));
        cr_assert(eq(u64, n, 3));
        sent = wait_q(url, 13, 30,
                      "SELECT count(*) FROM kinbox_outbox WHERE "
                      "status = 'sent'");
        relay_stop(&tr);
        cr_assert(sent, "requeued rows not published");
        /* Requeue of a row that is not dead: NOT_FOUND. */
        cr_assert(
            eq(int, kinbox_outbox_requeue(adm, 1), KINBOX_ERR_NOT_FOUND));
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        cr_assert(st.retried >= 20);
        cr_assert(eq(u64, st.dead, 3));
        kinbox_relay_destroy(r);
        kinbox_admin_destroy(adm);

        tmsgs_t got;
        consume(mk.bootstrap, topic, 13, 30, 500, &got);
        for (int i = 0; i < 13; i++) {
                char id[300];
                snprintf(id, sizeof(id), "%s:k-%d", topic, i);
                cr_assert(count_msgid(&got, id) >= 1, "%s missing", id);
        }
        msgs_free(&got);
        mock_stop(&mk);
}

/* ------------------------------------------------------------ test 6 */

typedef struct actctx {
        atomic_int pay, slow, nope, stuck;
        atomic_int bad_args;
} actctx_t;

static kinbox_result_t
act_pay(kinbox_action_t *a, void *opaque)
{
        actctx_t *x = opaque;
        size_t n = 0;
        const void *p = kinbox_action_payload(a, &n);
        if (strcmp(kinbox_action_idem_key(a), "pay-order-7") ||
            strcmp(kinbox_action_name(a), "pay") || n != 9 ||
            memcmp(p, "channel-7", 9) ||
            strcmp(kinbox_action_aggregate_id(a), "order-7") ||
            kinbox_action_header_count(a) != 1)
                atomic_fetch_add(&x->bad_args, 1);
        int k = atomic_fetch_add(&x->pay, 1) + 1;
        if (kinbox_action_attempt(a) != k)
                atomic_fetch_add(&x->bad_args, 1);
        if (k <= 2) {
                kinbox_action_set_error(a, "channel busy (try %d)", k);
                return KINBOX_RESULT_RETRY;
        }
        return KINBOX_RESULT_OK;
}

static kinbox_result_t
act_slow(kinbox_action_t *a, void *opaque)
{
        actctx_t *x = opaque;
        (void)a;
        if (atomic_fetch_add(&x->slow, 1) == 0)
                usleep(1500 * 1000); /* past relay.action.timeout.ms */
        return KINBOX_RESULT_OK;
}

static kinbox_result_t
act_nope(kinbox_action_t *a, void *opaque)
{
        actctx_t *x = opaque;
        atomic_fetch_add(&x->nope, 1);
        kinbox_action_set_error(a, "unknown channel order");
        return KINBOX_RESULT_REJECT;
}

/*
 * Local actions: fails twice, then OK; times out → retried; REJECT → dead
 * (and requeue runs it again); cancel stops a pending one.
 */
KT_BACKENDS_PARAMS(outbox_actions, backends)
ParameterizedTest(int *bidx, outbox_actions, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        tconn_t c;
        tc_open(&c, backend, url);
        kinbox_header_t h = {"channel", "alipay", 6};
        kinbox_outbox_msg_t pay = {.destination = "action:pay",
                                   .idem_key = "pay-order-7",
                                   .aggregate_id = "order-7",
                                   .payload = "channel-7",
                                   .payload_size = 9,
                                   .headers = &h,
                                   .header_count = 1};
        kinbox_outbox_msg_t slow = {.destination = "action:slow",
                                    .idem_key = "slow-1"};
        kinbox_outbox_msg_t nope = {.destination = "action:nope",
                                    .idem_key = "nope-1"};
        kinbox_outbox_msg_t later = {.destination = "action:unregistered",
                                     .idem_key = "later-1",
                                     .max_attempts = 1000};
        int64_t idpay, idslow, idnope, idlater;
        tc_sql(&c, "BEGIN");
        cr_assert(eq(int, tc_append(&c, &pay, &idpay), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &slow, &idslow), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &nope, &idnope), KINBOX_OK));
        cr_assert(eq(int, tc_append(&c, &later, &idlater), KINBOX_OK));
        tc_sql(&c, "COMMIT");
        tc_close(&c);

        actctx_t x;
        memset(&x, 0, sizeof(x));
        kinbox_conf_t *conf = relay_conf(url, bootstrap);
        cset(conf, "relay.action.timeout.ms", "500");
        cset(conf, "kafka.message.timeout.ms", "1000");
        cset(conf, "relay.lease.ms", "3000");
        kinbox_relay_t *r = relay_new(conf);
        cr_assert(eq(int, kinbox_relay_register_action(r, "pay", act_pay, &x),
                     KINBOX_OK));
        cr_assert(eq(int,
                     kinbox_relay_register_action(r, "slow", act_slow, &x),
                     KINBOX_OK));
        cr_assert(eq(int,
                     kinbox_relay_register_action(r, "nope", act_nope, &x),
                     KINBOX_OK));
        trelay_t tr;
        relay_start(&tr, r);

        bool done = wait_q(url, 3, 60,
                           "SELECT count(*) FROM kinbox_outbox WHERE "
                           "status <> 'pending' AND id IN (%" PRId64
                           ",%" PRId64 ",%" PRId64 ")",
                           idpay, idslow, idnope);
        cr_assert(done, "actions did not finish");

        char sql[256], *s;
        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idpay);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "sent"));
        free(s);
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT attempts FROM kinbox_outbox "
                              "WHERE id = %" PRId64,
                              idpay),
                     2));
        snprintf(sql, sizeof(sql),
                 "SELECT last_error FROM kinbox_outbox WHERE id = %" PRId64,
                 idpay);
        s = qtext(url, sql);
        cr_assert(strstr(s, "channel busy (try 2)") != NULL, "%s", s);
        free(s);
        cr_assert(eq(int, atomic_load(&x.pay), 3));
        cr_assert(eq(int, atomic_load(&x.bad_args), 0));

        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idslow);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "sent"));
        free(s);
        snprintf(sql, sizeof(sql),
                 "SELECT last_error FROM kinbox_outbox WHERE id = %" PRId64,
                 idslow);
        s = qtext(url, sql);
        cr_assert(strstr(s, "timed out") != NULL, "%s", s);
        free(s);
        cr_assert(eq(int, atomic_load(&x.slow), 2));

        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idnope);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "dead"));
        free(s);
        cr_assert(eq(int, atomic_load(&x.nope), 1));

        /* Requeue the dead one: it runs again (and is rejected again). */
        char e[512];
        kinbox_conf_t *ac = kinbox_conf_new();
        cset(ac, "database.url", url);
        kinbox_admin_t *adm = kinbox_admin_new(ac, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        kinbox_conf_destroy(ac);
        cr_assert(eq(int, kinbox_outbox_requeue(adm, idnope), KINBOX_OK), "%s",
                  kinbox_admin_errstr(adm));
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE id = "
                         "%" PRId64 " AND status = 'dead' AND attempts = 1",
                         idnope));
        cr_assert(eq(int, atomic_load(&x.nope), 2));

        /* The unregistered action keeps failing until canceled. */
        cr_assert(wait_q(url, 1, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE id = "
                         "%" PRId64 " AND attempts >= 2",
                         idlater));
        cr_assert(eq(int, kinbox_outbox_cancel(adm, idlater), KINBOX_OK), "%s",
                  kinbox_admin_errstr(adm));
        cr_assert(
            eq(int, kinbox_outbox_cancel(adm, idlater), KINBOX_ERR_NOT_FOUND));
        usleep(700 * 1000);
        snprintf(sql, sizeof(sql),
                 "SELECT status FROM kinbox_outbox WHERE id = %" PRId64,
                 idlater);
        s = qtext(url, sql);
        cr_assert(eq(str, s, "canceled"));
        free(s);

        relay_stop(&tr);
        kinbox_admin_destroy(adm);
        kinbox_relay_destroy(r); /* waits for the abandoned slow call */
}

/* A lock timeout while appending on the caller's own connection is
 * KINBOX_ERR_TRANSIENT (retry the transaction), not KINBOX_ERR_DB. */
KT_BACKENDS_PARAMS(outbox_append_transient, backends)
ParameterizedTest(int *bidx, outbox_append_transient, backends, .timeout = 60)
{
        const char *backend = kt_backend(*bidx);
        char *url = kt_fresh_db(backend);
        tconn_t a, b;
        tc_open(&a, backend, url);
        tc_open(&b, backend, url);
        kinbox_outbox_msg_t m = {.destination = "t", .idem_key = "same"};
        tc_sql(&a, "BEGIN");
        cr_assert(eq(int, tc_append(&a, &m, NULL), KINBOX_OK));
        tc_sql(&b, a.my ? "SET SESSION innodb_lock_wait_timeout = 1"
                        : "SET lock_timeout = '300ms'");
        tc_sql(&b, "BEGIN");
        char e[512];
        /* b waits for a's uncommitted row with the same key. */
        kinbox_err_t rc =
            b.my ? kinbox_outbox_append_mysql(b.m, &m, NULL, e, sizeof(e))
                 : kinbox_outbox_append_pg(b.pg, &m, NULL, e, sizeof(e));
        cr_assert(eq(int, rc, KINBOX_ERR_TRANSIENT), "%s: %s",
                  kinbox_err_name(rc), e);
        tc_sql(&b, "ROLLBACK");
        tc_sql(&a, "COMMIT");
        /* The retry after the rollback sees the committed row. */
        tc_sql(&b, "BEGIN");
        cr_assert(eq(int, tc_append(&b, &m, NULL), KINBOX_ERR_DUPLICATE));
        tc_sql(&b, "COMMIT");
        tc_close(&a);
        tc_close(&b);
}

typedef struct listed {
        int sent_ok, pending_ok, n;
} listed_t;

static int
check_listed(const kinbox_outbox_row_t *row, void *opaque)
{
        listed_t *l = opaque;
        l->n++;
        if (row->status == KINBOX_OUTBOX_SENT && row->sent_at &&
            !row->next_attempt_at && row->version >= 1)
                l->sent_ok++;
        if (row->status == KINBOX_OUTBOX_PENDING && !row->sent_at &&
            row->next_attempt_at && row->version == 0)
                l->pending_ok++;
        return 0;
}

/* kinbox_outbox_list (and `outbox list --json`) shows sent_at and version;
 * a sent row shows no next_attempt_at (its column may hold an old lease).
 * A sent row's version is 1 when it was sent from a lock-held claim (one
 * write), 2 or more after a lease. */
KT_BACKENDS_PARAMS(outbox_list_fields, backends)
ParameterizedTest(int *bidx, outbox_list_fields, backends, .timeout = 120)
{
        const char *backend = kt_backend(*bidx);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *url = kt_fresh_db(backend);
        char *topic = kt_unique("obx_list");
        kt_topic(topic, 1);
        tconn_t c;
        tc_open(&c, backend, url);
        kinbox_outbox_msg_t m = {.destination = topic, .idem_key = "a"};
        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        kinbox_relay_t *r = relay_new(relay_conf(url, bootstrap));
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(wait_q(url, 1, 60,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "status = 'sent'"));
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        kinbox_outbox_msg_t m2 = {.destination = topic, .idem_key = "b"};
        cr_assert(eq(int, tc_append(&c, &m2, NULL), KINBOX_OK));
        tc_close(&c);
        kinbox_conf_t *conf = kinbox_conf_new();
        cset(conf, "database.url", url);
        char e[512];
        kinbox_admin_t *adm = kinbox_admin_new(conf, e, sizeof(e));
        cr_assert(adm != NULL, "%s", e);
        listed_t l = {0};
        cr_assert(eq(int,
                     kinbox_outbox_list(adm, KINBOX_OUTBOX_ANY, NULL, 0, 0,
                                        check_listed, &l),
                     KINBOX_OK));
        cr_assert(eq(int, l.n, 2));
        cr_assert(eq(int, l.sent_ok, 1));
        cr_assert(eq(int, l.pending_ok, 1));
        kinbox_admin_destroy(adm);
        kinbox_conf_destroy(conf);
}
