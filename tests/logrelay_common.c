/*
 * logrelay_common.c -- the log relay suites' shared helpers
 * (logrelay_common.h).
 */
#include "logrelay_common.h"
#include "db/mysql_binlog.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

kinbox_conf_t *
log_conf(const char *url, const char *bootstrap, const char *source,
         const char *slot)
{
        kinbox_conf_t *c = relay_conf(url, bootstrap);
        cset(c, "relay.source", source);
        cset(c, "relay.slot", slot);
        return c;
}

char *
log_ini(const char *url, const char *source, const char *slot)
{
        return kt_write_ini(url,
                            "[relay]\nenabled = true\nsource = %s\n"
                            "slot = %s\n",
                            source, slot);
}

void *
writer_main(void *arg)
{
        writer_t *w = arg;
        tconn_t c;
        tc_open(&c, w->backend, w->url);
        unsigned seed = (unsigned)w->w * 7919u + 1;
        for (int t = 0; t < w->ntx; t++) {
                bool rollback = t % 5 == 4;
                int rows = 1 + (int)(rand_r(&seed) % 20);
                int next[AGGS];
                memcpy(next, w->seq, sizeof(next));
                tc_sql(&c, "BEGIN");
                for (int i = 0; i < rows; i++) {
                        int a = (int)(rand_r(&seed) % AGGS);
                        char idem[64], agg[32], pay[32];
                        snprintf(agg, sizeof(agg), "w%d-a%d", w->w, a);
                        snprintf(idem, sizeof(idem), "%sw%d-a%d-s%d-t%d",
                                 rollback ? "rb-" : "", w->w, a, next[a], t);
                        int pn = snprintf(pay, sizeof(pay), "%d", next[a]);
                        kinbox_outbox_msg_t m = {.destination = w->topic,
                                                 .idem_key = idem,
                                                 .aggregate_id = agg,
                                                 .payload = pay,
                                                 .payload_size = (size_t)pn};
                        cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                        next[a]++;
                }
                tc_sql(&c, rollback ? "ROLLBACK" : "COMMIT");
                if (rollback) {
                        w->rolled += rows;
                } else {
                        w->committed += rows;
                        memcpy(w->seq, next, sizeof(next));
                }
                usleep(2000);
        }
        tc_close(&c);
        return NULL;
}

void
check_stream(const tmsgs_t *got, const writer_t *ws, int nw, int *dups)
{
        *dups = 0;
        int expect = 0;
        for (int k = 0; k < nw; k++)
                expect += ws[k].committed;
        int seen[4][AGGS];
        memset(seen, 0, sizeof(seen));
        int firsts = 0;
        for (size_t i = 0; i < got->n; i++) {
                const tmsg_t *m = &got->v[i];
                cr_assert(m->msgid && !strstr(m->msgid, ":rb-"),
                          "rolled-back row published: %s", m->msgid);
                int w = -1, a = -1;
                cr_assert(m->key && sscanf(m->key, "w%d-a%d", &w, &a) == 2);
                int s = atoi(m->value);
                cr_assert(w >= 0 && w < nw && a >= 0 && a < AGGS);
                if (s < seen[w][a]) {
                        (*dups)++;
                        continue;
                }
                cr_assert(eq(int, s, seen[w][a]),
                          "aggregate %s: %d after %d (order or a gap)", m->key,
                          s, seen[w][a] - 1);
                seen[w][a]++;
                firsts++;
        }
        for (int w = 0; w < nw; w++)
                for (int a = 0; a < AGGS; a++)
                        cr_assert(eq(int, seen[w][a], ws[w].seq[a]),
                                  "w%d-a%d: %d of %d on the topic", w, a,
                                  seen[w][a], ws[w].seq[a]);
        cr_assert(eq(int, firsts, expect));
}

int
by_offset(const void *x, const void *y)
{
        const tmsg_t *a = x, *b = y;
        if (a->partition != b->partition)
                return a->partition < b->partition ? -1 : 1;
        return a->offset < b->offset ? -1 : a->offset > b->offset;
}

_Atomic int actions_run;

kinbox_result_t
count_action(kinbox_action_t *a, void *opaque)
{
        (void)a;
        (void)opaque;
        actions_run++;
        return KINBOX_RESULT_OK;
}

void
parity_rows(const char *backend, const char *url, const char *topic, int n)
{
        tconn_t c;
        tc_open(&c, backend, url);
        static const unsigned char bin[] = {0x00, 0xff, 0x80, 'x'};
        kinbox_header_t hdrs[] = {{"trace", "abc-123", 7},
                                  {"binary", bin, sizeof(bin)},
                                  {"nullhdr", NULL, 0}};
        tc_sql(&c, "BEGIN");
        kinbox_outbox_msg_t rb = {.destination = topic,
                                  .idem_key = "rolled-back",
                                  .aggregate_id = "a-1",
                                  .payload = "nope",
                                  .payload_size = 4};
        cr_assert(eq(int, tc_append(&c, &rb, NULL), KINBOX_OK));
        tc_sql(&c, "ROLLBACK");
        tc_sql(&c, "BEGIN");
        for (int i = 0; i < n; i++) {
                char idem[32], agg[32], pay[64];
                snprintf(idem, sizeof(idem), "e-%d", i);
                snprintf(agg, sizeof(agg), "a-%d", i % 5);
                int pn = snprintf(pay, sizeof(pay), "{\"i\":%d}", i);
                kinbox_outbox_msg_t m = {
                    .destination = topic,
                    .idem_key = idem,
                    .aggregate_id = i % 7 == 3 ? NULL : agg,
                    .payload = i % 11 == 5 ? NULL : pay,
                    .payload_size = i % 11 == 5 ? 0 : (size_t)pn,
                    .headers = i % 2 ? hdrs : NULL,
                    .header_count = i % 2 ? 3 : 0};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                if (i == n / 2) {
                        tc_sql(&c, "COMMIT");
                        tc_sql(&c, "BEGIN");
                }
        }
        kinbox_outbox_msg_t act = {.destination = "action:count",
                                   .idem_key = "act-1",
                                   .aggregate_id = "a-1"};
        cr_assert(eq(int, tc_append(&c, &act, NULL), KINBOX_OK));
        tc_sql(&c, "COMMIT");
        tc_close(&c);
}

static bool
same_headers(const tmsg_t *a, const tmsg_t *b)
{
        size_t n = rd_kafka_header_cnt(a->hdrs);
        if (n != rd_kafka_header_cnt(b->hdrs))
                return false;
        for (size_t i = 0; i < n; i++) {
                const char *na, *nb;
                const void *va, *vb;
                size_t sa, sb;
                rd_kafka_header_get_all(a->hdrs, i, &na, &va, &sa);
                rd_kafka_header_get_all(b->hdrs, i, &nb, &vb, &sb);
                if (strcmp(na, nb) || sa != sb || (!va) != (!vb) ||
                    (sa && memcmp(va, vb, sa)))
                        return false;
        }
        return true;
}

void
assert_polling_parity(const char *url, const char *bootstrap,
                      const char *topic, int n, const char *ce_source)
{
        kinbox_relay_t *r;
        trelay_t tr;
        /* The polling relay publishes the same rows again. */
        kinbox_conf_t *pc = relay_conf(url, bootstrap);
        cset(pc, "relay.cloudevents.source", ce_source);
        r = relay_new(pc);
        relay_start(&tr, r);
        cr_assert(wait_q(url, (long long)n, 30,
                         "SELECT count(*) FROM kinbox_outbox WHERE "
                         "kind = 'event' AND status = 'sent'"));
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        tmsgs_t all;
        consume(bootstrap, topic, 2 * (size_t)n, 30, 1500, &all);
        cr_assert(eq(sz, all.n, 2 * (size_t)n), "%zu messages", all.n);
        for (size_t i = 0; i < all.n; i++) {
                const tmsg_t *a = &all.v[i];
                cr_assert(a->msgid != NULL);
                cr_assert(strstr(a->msgid, "rolled-back") == NULL);
                cr_assert(eq(sz, count_msgid(&all, a->msgid), 2), "%s",
                          a->msgid);
                const tmsg_t *b = NULL;
                for (size_t k = 0; k < all.n && !b; k++)
                        if (k != i && !strcmp(all.v[k].msgid, a->msgid))
                                b = &all.v[k];
                cr_assert(b != NULL);
                bool same_key = (!a->key) == (!b->key) &&
                                (!a->key || !strcmp(a->key, b->key));
                bool same_value = a->value_size == b->value_size &&
                                  (!a->value) == (!b->value) &&
                                  (!a->value_size ||
                                   !memcmp(a->value, b->value, a->value_size));
                cr_assert(same_key, "%s: keys differ", a->msgid);
                cr_assert(same_value, "%s: values differ", a->msgid);
                cr_assert(eq(i64, a->ts, b->ts), "%s: timestamps differ",
                          a->msgid);
                if (a->key)
                        cr_assert(eq(int, a->partition, b->partition));
                cr_assert(same_headers(a, b), "%s: headers differ", a->msgid);
        }
        msgs_free(&all);
}

void
append_rows(const char *backend, const char *url, const char *topic,
            const char *prefix, int from, int n)
{
        tconn_t c;
        tc_open(&c, backend, url);
        for (int i = from; i < from + n; i++) {
                char idem[64], pay[16];
                snprintf(idem, sizeof(idem), "%s-%d", prefix, i);
                int pn = snprintf(pay, sizeof(pay), "%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = idem,
                                         .aggregate_id = "agg",
                                         .payload = pay,
                                         .payload_size = (size_t)pn};
                tc_sql(&c, "BEGIN");
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
                tc_sql(&c, "COMMIT");
        }
        tc_close(&c);
}

void
append_tx(const char *backend, const char *url, const char *topic, int from,
          int n)
{
        tconn_t c;
        tc_open(&c, backend, url);
        tc_sql(&c, "BEGIN");
        for (int i = from; i < from + n; i++) {
                char idem[32], pay[32];
                snprintf(idem, sizeof(idem), "r-%d", i);
                int pn = snprintf(pay, sizeof(pay), "%d", i);
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = idem,
                                         .aggregate_id = "one",
                                         .payload = pay,
                                         .payload_size = (size_t)pn};
                cr_assert(eq(int, tc_append(&c, &m, NULL), KINBOX_OK));
        }
        tc_sql(&c, "COMMIT");
        tc_close(&c);
}

void
assert_in_order(tmsgs_t *got, int n)
{
        qsort(got->v, got->n, sizeof(*got->v), by_offset);
        int next = 0;
        for (size_t i = 0; i < got->n; i++) {
                int v = atoi(got->v[i].value);
                if (v < next)
                        continue; /* published again after a restart */
                cr_assert(eq(int, v, next), "order or a gap");
                next++;
        }
        cr_assert(eq(int, next, n));
}

void
assert_all(const tmsgs_t *got, const char *topic, const char *prefix, int from,
           int n)
{
        for (int i = from; i < from + n; i++) {
                char id[128];
                snprintf(id, sizeof(id), "%s:%s-%d", topic, prefix, i);
                cr_assert(count_msgid(got, id) >= 1, "%s not on the topic",
                          id);
        }
}

int
sh(const char *fmt, ...)
{
        char cmd[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cmd, sizeof(cmd), fmt, ap);
        va_end(ap);
        int st = system(cmd);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool
log_reading(const char *backend, const char *url, const char *name,
            int timeout_s)
{
        if (!strcmp(backend, "postgresql"))
                return wait_q(url, 1, timeout_s,
                              "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = '%s' AND active",
                              name);
        /* The row alone is not enough: kinbox migrate's check stores it
         * too. The reader holds its lock while it reads. */
        char lk[65];
        kinbox__binlog_lock_name(name, lk);
        return wait_q(url, 1, timeout_s,
                      "SELECT count(*) FROM kinbox_relay_position WHERE "
                      "relay = '%s' AND IS_USED_LOCK('%s') IS NOT NULL",
                      name, lk);
}

void
brokers_down(void)
{
        if (kt_real_kafka())
                kt_services("kafka-stop kill");
        else
                kt_broker("broker-down all");
}

void
brokers_up(void)
{
        if (kt_real_kafka())
                kt_services("kafka-start");
        else
                kt_broker("broker-up all");
}

void
logrun_start(logrun_t *lr, const char *backend, const char *source,
             const char *tag)
{
        memset(lr, 0, sizeof(*lr));
        lr->backend = backend;
        lr->source = source;
        lr->url = kt_fresh_db(backend);
        lr->topic = kt_unique(tag);
        lr->name = kt_unique(tag);
        kt_topic(lr->topic, 4);
        lr->ini = log_ini(lr->url, source, lr->name);
        cr_assert(
            eq(int, kt_kinbox(NULL, NULL, true, "migrate -c %s", lr->ini), 0));
        lr->log = kt_tmp(tag);
        lr->pid = kt_spawn_kinbox(lr->ini, NULL, lr->log);
        cr_assert(log_reading(backend, lr->url, lr->name, 30), "%s",
                  kt_tail(lr->log, 20));
}

int
two_writers_kill(logrun_t *lr, bool broker_kill,
                 bool (*caught_up)(const char *url, const char *name))
{
        writer_t ws[2];
        int seqs[2][AGGS];
        memset(seqs, 0, sizeof(seqs));
        pthread_t th[2];
        for (int k = 0; k < 2; k++) {
                ws[k] = (writer_t){lr->backend, lr->url, lr->topic, k,
                                   150,         0,       0,         seqs[k]};
                pthread_create(&th[k], NULL, writer_main, &ws[k]);
        }
        usleep(700 * 1000);
        if (broker_kill) {
                brokers_down();
                usleep(1000 * 1000);
        }
        kill(lr->pid, SIGKILL);
        cr_assert(eq(int, kt_wait(lr->pid, 10), -SIGKILL));
        usleep(500 * 1000);
        lr->pid = kt_spawn_kinbox(lr->ini, NULL, lr->log);
        if (broker_kill) {
                usleep(2000 * 1000);
                brokers_up();
        }
        for (int k = 0; k < 2; k++)
                pthread_join(th[k], NULL);
        int expect = ws[0].committed + ws[1].committed;
        cr_assert(ws[0].rolled + ws[1].rolled > 0);
        tmsgs_t got;
        consume(kt_env("KINBOX_BOOTSTRAP"), lr->topic, (size_t)expect, 120,
                2000, &got);
        if (caught_up)
                cr_assert(caught_up(lr->url, lr->name), "%s",
                          kt_tail(lr->log, 30));
        kill(lr->pid, SIGTERM);
        cr_assert(eq(int, kt_wait(lr->pid, 30), 0), "%s",
                  kt_tail(lr->log, 30));
        qsort(got.v, got.n, sizeof(*got.v), by_offset);
        int dups = 0;
        check_stream(&got, ws, 2, &dups);
        cr_log_info("%s%s: %d rows committed, %zu on the topic, "
                    "%d duplicates",
                    lr->source, broker_kill ? " (broker killed)" : "", expect,
                    got.n, dups);
        msgs_free(&got);
        /* Nothing in the table was touched. */
        cr_assert(
            eq(i64,
               kt_qintf(lr->url, "SELECT count(*) FROM kinbox_outbox "
                                 "WHERE status <> 'pending' OR version <> 0"),
               0));
        return dups;
}

void
logrel_start(logrel_t *l, const char *backend, const char *source,
             const char *tag, int partitions)
{
        memset(l, 0, sizeof(*l));
        l->backend = backend;
        l->bootstrap = kt_env("KINBOX_BOOTSTRAP");
        l->url = kt_fresh_db(backend);
        l->topic = kt_unique(tag);
        l->name = kt_unique(tag);
        kt_topic(l->topic, partitions);
        l->r = relay_new(log_conf(l->url, l->bootstrap, source, l->name));
        relay_start(&l->tr, l->r);
        cr_assert(log_reading(backend, l->url, l->name, 30));
}

void
logrel_stop(logrel_t *l)
{
        relay_stop(&l->tr);
        kinbox_relay_destroy(l->r);
        l->r = NULL;
}

void
restart_under_relay(logrel_t *l, const char *backend, const char *source,
                    const char *tag,
                    bool (*caught_up)(const char *url, const char *name))
{
        bool pg = !strcmp(backend, "postgresql");
        logrel_start(l, backend, source, tag, 2);
        int n = 0;
        for (int round = 0; round < 2; round++) {
                append_tx(backend, l->url, l->topic, n, 50);
                n += 50;
                if (round == 0) {
                        kt_services(pg ? "pg-stop immediate"
                                       : "mysql-stop kill");
                        sleep(1);
                        kt_services(pg ? "pg-start" : "mysql-start");
                }
        }
        tmsgs_t got;
        consume(l->bootstrap, l->topic, (size_t)n, 90, 2000, &got);
        if (caught_up)
                cr_assert(caught_up(l->url, l->name), "not confirmed");
        logrel_stop(l);
        assert_in_order(&got, n);
        msgs_free(&got);
}

/* Whether the log of path holds what (within a few seconds). */
static bool
log_says(const char *path, const char *what)
{
        bool found = false;
        for (int i = 0; i < 50 && !found; i++) {
                char *t = kt_slurp(path);
                found = t && strstr(t, what);
                free(t);
                if (!found)
                        usleep(100 * 1000);
        }
        return found;
}

void
takeover_after_kill9(logrun_t *lr, const char *backend, const char *source,
                     const char *tag, const char *waiting, const char *ours,
                     bool (*caught_up)(const char *url, const char *name))
{
        logrun_start(lr, backend, source, tag);
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        char *logb = kt_tmp(tag);
        pid_t b = kt_spawn_kinbox(lr->ini, NULL, logb);
        append_rows(backend, lr->url, lr->topic, "one", 0, 50);
        tmsgs_t got;
        consume(bootstrap, lr->topic, 50, 60, 500, &got);
        assert_all(&got, lr->topic, "one", 0, 50);
        msgs_free(&got);
        /* b waits: it says so, and has published nothing. */
        cr_assert(log_says(logb, waiting), "%s", kt_tail(logb, 40));
        kill(lr->pid, SIGKILL);
        cr_assert(eq(int, kt_wait(lr->pid, 10), -SIGKILL));
        append_rows(backend, lr->url, lr->topic, "two", 50, 50);
        consume(bootstrap, lr->topic, 100, 90, 2000, &got);
        if (caught_up)
                cr_assert(caught_up(lr->url, lr->name), "%s",
                          kt_tail(logb, 20));
        if (ours)
                cr_assert(log_says(logb, ours), "%s", kt_tail(logb, 40));
        kill(b, SIGTERM);
        cr_assert(eq(int, kt_wait(b, 30), 0), "%s", kt_tail(logb, 30));
        assert_all(&got, lr->topic, "one", 0, 50);
        assert_all(&got, lr->topic, "two", 50, 50);
        cr_log_info("%s: %zu messages for 100 rows", source, got.n);
        assert_in_order(&got, 100); /* copies: published again after the
                                       kill */
        msgs_free(&got);
}

void
rows_a_then_stop(const char *backend, const char *url, const char *name,
                 const char *ini, const char *log, const char *topic)
{
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(log_reading(backend, url, name, 30), "%s", kt_tail(log, 20));
        append_rows(backend, url, topic, "a", 0, 20);
        tmsgs_t got;
        consume(kt_env("KINBOX_BOOTSTRAP"), topic, 20, 60, 500, &got);
        assert_all(&got, topic, "a", 0, 20);
        msgs_free(&got);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 30), 0), "%s", kt_tail(log, 30));
}

void
resend_then_all(const char *backend, const char *url, const char *ini,
                const char *log, const char *topic, const char *since)
{
        char *out = NULL;
        int rc = kt_kinbox(&out, NULL, true, "outbox resend --since %s -c %s",
                           since, ini);
        cr_assert(eq(int, rc, 0), "%s", out);
        long long n = 0;
        cr_assert(sscanf(out, "%lld rows published again", &n) == 1, "%s",
                  out);
        cr_assert(ge(i64, n, 30), "%s", out);
        free(out);
        pid_t pid = kt_spawn_kinbox(ini, NULL, log);
        append_rows(backend, url, topic, "c", 0, 10);
        tmsgs_t got;
        consume(kt_env("KINBOX_BOOTSTRAP"), topic, (size_t)(20 + n + 10), 90,
                2000, &got);
        kill(pid, SIGTERM);
        cr_assert(eq(int, kt_wait(pid, 30), 0), "%s", kt_tail(log, 30));
        assert_all(&got, topic, "a", 0, 20);
        assert_all(&got, topic, "b", 0, 30);
        assert_all(&got, topic, "c", 0, 10);
        cr_log_info("%zu messages for 60 rows (%lld resent)", got.n, n);
        msgs_free(&got);
}

void
check_big_stream(const char *url, tmsgs_t *got, size_t want, const char *dead,
                 void (*other)(const tmsg_t *m, void *arg), void *arg)
{
        cr_assert(eq(sz, got->n, want), "%zu of %zu", got->n, want);
        char q[300];
        snprintf(q, sizeof(q),
                 "SELECT CONCAT(status, ': ', last_error) FROM "
                 "kinbox_outbox WHERE idem_key = '%s'",
                 dead);
        char *err = qtext(url, q);
        cr_assert(strncmp(err, "dead: ", 6) == 0 &&
                      strstr(err, "SIZE_TOO_LARGE") != NULL,
                  "%s", err);
        free(err);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT count(*) FROM kinbox_outbox WHERE "
                                  "status <> 'pending'"),
                     1));
        qsort(got->v, got->n, sizeof(*got->v), by_offset);
        int last[16];
        for (int i = 0; i < 16; i++)
                last[i] = -1;
        for (size_t i = 0; i < got->n; i++) {
                const tmsg_t *m = &got->v[i];
                int a;
                if (sscanf(m->key, "agg-%d", &a) == 1) {
                        cr_assert(a >= 0 && a < 16, "%s", m->key);
                        int v = atoi(m->value);
                        cr_assert(v > last[a], "agg-%d: %d after %d", a, v,
                                  last[a]);
                        last[a] = v;
                } else {
                        other(m, arg);
                }
        }
}
