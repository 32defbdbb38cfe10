/*
 * walfailover_test.c -- the wal relay (relay.source = wal) across a
 * PostgreSQL failover: PostgreSQL 17 or later (Debian 13's; the trixie
 * shard runs it, on Apache Kafka: walfailover_test@kafka), a primary and
 * a physical standby of its own made here (initdb, pg_basebackup), the
 * relay's slot a failover slot (relay.slot_failover) that the standby
 * synchronizes (sync_replication_slots), the primary SIGKILLed and the
 * standby promoted while writers append and the relay streams.
 *
 * The relay is pointed at both servers in one URL
 * (host1:port1,host2:port2 with target_session_attrs=read-write): libpq
 * finds whichever is the primary, so the running relay goes on from the
 * promoted standby by itself, as the writers do (docs/outbox.md,
 * failover).
 *
 * Every committed row on the topic, in order per aggregate; a row
 * published again after the promotion (the standby's copy of the slot
 * lags the primary's by up to its last synchronization) is a copy with
 * its original's message id, which an inbox absorbs; no message of a
 * transaction the promoted server does not have.
 */
#include "logrelay_common.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libpq-fe.h>

#define FO_SLOT "kbfo_standby" /* the standby's physical slot */
#define FO_WRITERS 2
#define FO_AGGS 6

typedef struct node {
        char dir[300]; /* data directory (owned by postgres) */
        int port;
        char admin[200]; /* postgres@127.0.0.1:port/postgres */
} node_t;

/* The newest PostgreSQL's bin directory (KINBOX_PGBIN wins); the test
 * fails below 17 (failover slots). */
static const char *
pgbin(void)
{
        static char bin[200];
        const char *e = getenv("KINBOX_PGBIN");
        if (e && *e) {
                snprintf(bin, sizeof(bin), "%s", e);
        } else {
                int best = 0;
                DIR *d = opendir("/usr/lib/postgresql");
                cr_assert(d != NULL, "no PostgreSQL in /usr/lib/postgresql");
                for (struct dirent *de; (de = readdir(d));)
                        if (atoi(de->d_name) > best)
                                best = atoi(de->d_name);
                closedir(d);
                snprintf(bin, sizeof(bin), "/usr/lib/postgresql/%d/bin", best);
        }
        char *out = NULL;
        FILE *p = NULL;
        char cmd[300], line[200] = "";
        snprintf(cmd, sizeof(cmd), "%s/postgres --version", bin);
        p = popen(cmd, "r");
        cr_assert(p && fgets(line, sizeof(line), p), "%s", cmd);
        pclose(p);
        out = strchr(line, ')'); /* "postgres (PostgreSQL) 17.x" */
        int major = out ? atoi(out + 1) : 0;
        cr_assert(major >= 17,
                  "failover slots need PostgreSQL 17 or later; %s is %s "
                  "(the trixie shard runs this suite)",
                  bin, line);
        return bin;
}

static void
node_new(node_t *n, const char *base, const char *name)
{
        snprintf(n->dir, sizeof(n->dir), "%s/%s", base, name);
        n->port = kt_free_port();
        snprintf(n->admin, sizeof(n->admin),
                 "postgresql://postgres@127.0.0.1:%d/postgres", n->port);
}

/* Lines appended to the node's postgresql.conf. */
static void node_conf(const node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
node_conf(const node_t *n, const char *fmt, ...)
{
        char path[400];
        snprintf(path, sizeof(path), "%s/postgresql.conf", n->dir);
        FILE *f = fopen(path, "a");
        cr_assert(f != NULL, "%s", path);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fclose(f);
}

static void
node_start(const node_t *n)
{
        char log[400];
        snprintf(log, sizeof(log), "%s.log", n->dir);
        if (!sh("runuser -u postgres -- %s/pg_ctl -D %s -l %s -w -t 60 start "
                ">/dev/null",
                pgbin(), n->dir, log))
                return;
        char *t = kt_tail(log, 20);
        cr_assert(false, "%s did not start: %s", n->dir, t);
        free(t);
}

/* SIGKILL the postmaster and every process it started. */
static void
node_kill(const node_t *n)
{
        char path[400];
        snprintf(path, sizeof(path), "%s/postmaster.pid", n->dir);
        FILE *f = fopen(path, "r");
        int pid = 0;
        if (!f)
                return; /* not running */
        bool ok = fscanf(f, "%d", &pid) == 1 && pid > 1;
        fclose(f);
        if (!ok)
                return;
        kill(pid, SIGSTOP); /* no new child meanwhile */
        sh("for p in $(ps -o pid= --ppid %d); do kill -KILL $p; done", pid);
        kill(pid, SIGKILL);
        for (int i = 0; i < 100 && kill(pid, 0) == 0; i++)
                usleep(100 * 1000);
}

/* The test's servers, stopped (SIGKILL) and removed when it ends, passed
 * or not. */
static node_t g_pri, g_sby;

static void
pair_stop(void)
{
        node_kill(&g_pri);
        node_kill(&g_sby);
        if (g_pri.dir[0])
                sh("rm -rf %s %s", g_pri.dir, g_sby.dir);
}

/* The primary (logical WAL, a physical slot for the standby), and the
 * standby from its base backup: hot_standby_feedback, primary_slot_name,
 * sync_replication_slots; the primary waits for it: synchronous commit
 * (a committed row is on the standby) and synchronized_standby_slots (the
 * relay is never sent what the standby has not got). */
static void
pair_start(node_t *pri, node_t *sby)
{
        char *base = kt_tmp("pgfo");
        cr_assert(eq(
            int, sh("install -d -o postgres -g postgres -m 755 %s", base), 0));
        node_new(pri, base, "primary");
        node_new(sby, base, "standby");
        const char *bin = pgbin();
        cr_assert(eq(int,
                     sh("install -d -o postgres -g postgres -m 700 %s && "
                        "runuser -u postgres -- %s/initdb -D %s -U postgres "
                        "--auth-local=trust --auth-host=trust -E UTF8 "
                        "--locale=C.UTF-8 >%s/initdb.log 2>&1",
                        pri->dir, bin, pri->dir, base),
                     0));
        node_conf(pri,
                  "listen_addresses = '127.0.0.1'\nport = %d\n"
                  "unix_socket_directories = '%s'\nwal_level = logical\n"
                  "max_replication_slots = 10\nmax_wal_senders = 10\n"
                  "fsync = off\n",
                  pri->port, pri->dir);
        node_start(pri);
        kt_exec(pri->admin, "CREATE ROLE kinbox LOGIN REPLICATION");
        kt_exec(pri->admin, "CREATE DATABASE kinbox OWNER kinbox");
        kt_exec(pri->admin,
                "SELECT pg_create_physical_replication_slot('" FO_SLOT "')");
        cr_assert(eq(int,
                     sh("install -d -o postgres -g postgres -m 700 %s && "
                        "runuser -u postgres -- %s/pg_basebackup -D %s -h "
                        "127.0.0.1 -p %d -U postgres -X stream -c fast "
                        ">%s/basebackup.log 2>&1 && runuser -u postgres -- "
                        "touch %s/standby.signal",
                        sby->dir, bin, sby->dir, pri->port, base, sby->dir),
                     0));
        node_conf(sby,
                  "port = %d\nunix_socket_directories = '%s'\n"
                  "primary_conninfo = 'host=127.0.0.1 port=%d user=postgres "
                  "dbname=postgres application_name=" FO_SLOT "'\n"
                  "primary_slot_name = '" FO_SLOT "'\n"
                  "hot_standby_feedback = on\nsync_replication_slots = on\n",
                  sby->port, sby->dir, pri->port);
        /* Only the primary waits for the standby (not the promoted one). */
        node_conf(pri, "synchronous_standby_names = '" FO_SLOT "'\n"
                       "synchronized_standby_slots = '" FO_SLOT "'\n");
        kt_exec(pri->admin, "SELECT pg_reload_conf()");
        node_start(sby);
        cr_assert(wait_q(pri->admin, 1, 60,
                         "SELECT count(*) FROM pg_stat_replication WHERE "
                         "application_name = '" FO_SLOT
                         "' AND sync_state = 'sync'"),
                  "the standby is not a synchronous standby");
}

/* ------------------------------------------------------------ writers */

typedef struct fwriter {
        const char *url, *topic;
        int w;
        atomic_bool *stop;
        int next[FO_AGGS]; /* per aggregate: the next sequence number */
        int txs, retried; /* transactions committed; outcome unknown */
        atomic_int committed;
} fwriter_t;

static PGconn *
fw_connect(const fwriter_t *w)
{
        for (int i = 0; i < 600; i++) {
                PGconn *c = PQconnectdb(w->url);
                if (PQstatus(c) == CONNECTION_OK)
                        return c;
                PQfinish(c);
                usleep(100 * 1000);
        }
        cr_assert(false, "writer %d: no primary within 60 s", w->w);
        return NULL;
}

static bool
fw_ok(PGconn *c, const char *sql)
{
        PGresult *r = PQexec(c, sql);
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        return ok;
}

/* One transaction of 1..4 rows; attempt t names its rows ("wW-aA-sS-tT"):
 * rows of a transaction lost with the primary never get a name the
 * promoted server has. false: the outcome is unknown (idem: its first
 * row's key). */
static bool
fw_tx(fwriter_t *w, PGconn *c, unsigned *seed, int t, int *next, char *idem0,
      size_t sz)
{
        int rows = 1 + (int)(rand_r(seed) % 4);
        if (!fw_ok(c, "BEGIN"))
                return false;
        for (int i = 0; i < rows; i++) {
                int a = (int)(rand_r(seed) % FO_AGGS);
                char idem[64], agg[32], pay[16], e[256];
                snprintf(agg, sizeof(agg), "w%d-a%d", w->w, a);
                snprintf(idem, sizeof(idem), "w%d-a%d-s%d-t%d", w->w, a,
                         next[a], t);
                if (!i)
                        snprintf(idem0, sz, "%s", idem);
                int pn = snprintf(pay, sizeof(pay), "%d", next[a]);
                kinbox_outbox_msg_t m = {.destination = w->topic,
                                         .idem_key = idem,
                                         .aggregate_id = agg,
                                         .payload = pay,
                                         .payload_size = (size_t)pn};
                if (kinbox_outbox_append_pg(c, &m, NULL, e, sizeof(e)))
                        return false;
                next[a]++;
        }
        return fw_ok(c, "COMMIT");
}

static void *
fw_main(void *arg)
{
        fwriter_t *w = arg;
        PGconn *c = fw_connect(w);
        unsigned seed = (unsigned)w->w * 7919u + 3;
        for (int t = 0; !atomic_load(w->stop); t++) {
                int next[FO_AGGS];
                char idem0[64] = "";
                memcpy(next, w->next, sizeof(next));
                bool ok = fw_tx(w, c, &seed, t, next, idem0, sizeof(idem0));
                if (!ok) {
                        /* The primary is gone (or going): the transaction
                         * is on the new primary or nowhere. */
                        PQfinish(c);
                        c = fw_connect(w);
                        char *lit = PQescapeLiteral(c, idem0, strlen(idem0));
                        char sql[300];
                        snprintf(sql, sizeof(sql),
                                 "SELECT 1 FROM kinbox_outbox WHERE "
                                 "idem_key = %s",
                                 lit);
                        PQfreemem(lit);
                        PGresult *r = PQexec(c, sql);
                        cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK);
                        ok = idem0[0] && PQntuples(r) == 1;
                        PQclear(r);
                        w->retried++;
                }
                if (ok) {
                        memcpy(w->next, next, sizeof(next));
                        w->txs++;
                        atomic_fetch_add(&w->committed, 1);
                }
                usleep(20 * 1000);
        }
        PQfinish(c);
        return NULL;
}

/* --------------------------------------------------------------- check */

static int
cmp_str(const void *x, const void *y)
{
        return strcmp(*(char *const *)x, *(char *const *)y);
}

/* The promoted server's rows, "idem=payload" each, sorted. */
static char **
rows_of(const char *url, size_t *n)
{
        PGconn *c = PQconnectdb(url);
        cr_assert(PQstatus(c) == CONNECTION_OK, "%s", PQerrorMessage(c));
        PGresult *r = PQexec(c, "SELECT idem_key || '=' || "
                                "convert_from(payload, 'UTF8') FROM "
                                "kinbox_outbox");
        cr_assert(PQresultStatus(r) == PGRES_TUPLES_OK);
        *n = (size_t)PQntuples(r);
        char **v = calloc(*n + 1, sizeof(*v));
        for (size_t i = 0; i < *n; i++)
                v[i] = strdup(PQgetvalue(r, (int)i, 0));
        PQclear(r);
        PQfinish(c);
        qsort(v, *n, sizeof(*v), cmp_str);
        return v;
}

/*
 * The topic against the promoted server's outbox: every message is a row
 * there (its message id "topic:idem", its payload); per aggregate, first
 * occurrences 0, 1, 2, ... without a gap up to the writer's last, a later
 * occurrence a copy of a row already seen (the same message id: an inbox
 * absorbs it). Returns the copies.
 */
static int
check_topic(const char *url, const tmsgs_t *got, const fwriter_t *ws)
{
        int last[FO_WRITERS][FO_AGGS], copies = 0;
        memset(last, 0xff, sizeof(last)); /* -1 */
        size_t tl = strlen(ws[0].topic), nrows = 0;
        char **rows = rows_of(url, &nrows);
        for (size_t i = 0; i < got->n; i++) {
                const tmsg_t *m = &got->v[i];
                int w = -1, a = -1;
                cr_assert(m->key && sscanf(m->key, "w%d-a%d", &w, &a) == 2 &&
                          w >= 0 && w < FO_WRITERS && a >= 0 && a < FO_AGGS);
                int s = atoi(m->value);
                cr_assert(m->msgid && !strncmp(m->msgid, ws[0].topic, tl) &&
                              m->msgid[tl] == ':',
                          "message id %s", m->msgid ? m->msgid : "(none)");
                char want[200], *wp = want;
                snprintf(want, sizeof(want), "%s=%d", m->msgid + tl + 1, s);
                cr_assert(bsearch(&wp, rows, nrows, sizeof(*rows), cmp_str) !=
                              NULL,
                          "%s (seq %d) is no row of the promoted server",
                          m->msgid, s);
                if (s <= last[w][a]) {
                        copies++;
                        continue;
                }
                cr_assert(eq(int, s, last[w][a] + 1), "%s: seq %d after %d",
                          m->key, s, last[w][a]);
                last[w][a] = s;
        }
        for (int w = 0; w < FO_WRITERS; w++)
                for (int a = 0; a < FO_AGGS; a++)
                        cr_assert(eq(int, last[w][a], ws[w].next[a] - 1),
                                  "w%d-a%d", w, a);
        for (size_t i = 0; i < nrows; i++)
                free(rows[i]);
        free(rows);
        return copies;
}

/* Within s seconds the slot is on the standby, synchronized and no longer
 * temporary (a temporary synchronized slot does not survive a promotion).
 * The standby's copy stays temporary until the primary's slot moved past
 * where the copy began, which a logical slot's restart_lsn does at a
 * running-transactions record: one now and then (the server logs one every
 * 15 s) spares the wait. */
static bool
slot_synced(const node_t *pri, const node_t *sby, const char *slot, int s)
{
        for (int i = 0; i < s * 2; i++) {
                kt_exec(pri->admin, "SELECT pg_log_standby_snapshot()");
                if (kt_qintf(sby->admin,
                             "SELECT count(*) FROM pg_replication_slots "
                             "WHERE slot_name = '%s' AND synced AND NOT "
                             "temporary AND failover",
                             slot) == 1)
                        return true;
                usleep(500 * 1000);
        }
        return false;
}

static long long
published(kinbox_relay_t *r)
{
        kinbox_relay_stats_t st;
        kinbox_relay_stats(r, &st);
        return (long long)st.published;
}

static void
wait_committed(fwriter_t *ws, int more, int s)
{
        int want[FO_WRITERS];
        for (int k = 0; k < FO_WRITERS; k++)
                want[k] = atomic_load(&ws[k].committed) + more;
        for (int k = 0; k < FO_WRITERS; k++)
                for (int i = 0;
                     i < s * 10 && atomic_load(&ws[k].committed) < want[k];
                     i++)
                        usleep(100 * 1000);
}

Test(walfailover, promote_mid_stream, .timeout = 400, .fini = pair_stop)
{
        const char *bootstrap = kt_env("KINBOX_BOOTSTRAP");
        node_t *pri_n = &g_pri, *sby_n = &g_sby;
        pair_start(pri_n, sby_n);
        node_t pri = *pri_n, sby = *sby_n;
        char url[300], pri_url[200], sby_url[200];
        snprintf(pri_url, sizeof(pri_url),
                 "postgresql://kinbox@127.0.0.1:%d/kinbox", pri.port);
        snprintf(sby_url, sizeof(sby_url),
                 "postgresql://kinbox@127.0.0.1:%d/kinbox", sby.port);
        snprintf(url, sizeof(url),
                 "postgresql://kinbox@127.0.0.1:%d,127.0.0.1:%d/kinbox"
                 "?target_session_attrs=read-write&connect_timeout=2",
                 pri.port, sby.port);
        kinbox_conf_t *mc = kinbox_conf_new();
        cset(mc, "database.url", url);
        char e[1024];
        cr_assert(eq(int, kinbox_migrate(mc, e, sizeof(e)), KINBOX_OK), "%s",
                  e);
        kinbox_conf_destroy(mc);

        char *topic = kt_unique("wal_fo");
        char *slot = kt_unique("kbt_fo");
        kt_topic(topic, 4);
        kinbox_conf_t *conf = log_conf(url, bootstrap, "wal", slot);
        cset(conf, "relay.slot_failover", "true");
        kinbox_relay_t *r = relay_new(conf);
        trelay_t tr;
        relay_start(&tr, r);
        cr_assert(wait_q(pri_url, 1, 30,
                         "SELECT count(*) FROM pg_replication_slots WHERE "
                         "slot_name = '%s' AND active AND failover",
                         slot),
                  "no active failover slot %s on the primary", slot);
        int64_t t_sync = kt_clock_ms();

        atomic_bool stop = false;
        fwriter_t ws[FO_WRITERS];
        pthread_t th[FO_WRITERS];
        memset(ws, 0, sizeof(ws));
        for (int k = 0; k < FO_WRITERS; k++) {
                ws[k].url = url;
                ws[k].topic = topic;
                ws[k].w = k;
                ws[k].stop = &stop;
                pthread_create(&th[k], NULL, fw_main, &ws[k]);
        }
        /* Mid-stream: rows published, more being written and read. */
        for (int i = 0; i < 300 && published(r) < 300; i++)
                usleep(100 * 1000);
        cr_assert(published(r) >= 300, "the relay published %lld rows",
                  published(r));
        cr_assert(slot_synced(&pri, &sby, slot, 60),
                  "slot %s not synchronized to the standby", slot);
        cr_log_info("slot synchronized to the standby in %lld ms",
                    (long long)(kt_clock_ms() - t_sync));
        wait_committed(ws, 20, 30);
        long long before = published(r);
        node_kill(&pri);
        cr_assert(eq(int,
                     sh("runuser -u postgres -- %s/pg_ctl -D %s -w -t 60 "
                        "promote >/dev/null",
                        pgbin(), sby.dir),
                     0));
        /* The writers and the relay go on on the promoted standby. */
        wait_committed(ws, 50, 90);
        atomic_store(&stop, true);
        for (int k = 0; k < FO_WRITERS; k++)
                pthread_join(th[k], NULL);
        char *lsn = qtext(sby_url, "SELECT pg_current_wal_lsn()::text");
        bool caught = wait_q(sby_url, 1, 90,
                             "SELECT count(*) FROM pg_replication_slots "
                             "WHERE slot_name = '%s' AND confirmed_flush_lsn "
                             ">= '%s'",
                             slot, lsn);
        free(lsn);
        long long after = published(r);
        relay_stop(&tr);
        kinbox_relay_destroy(r);
        cr_assert(caught, "the relay did not catch up on the promoted "
                          "standby");
        cr_assert(after > before, "nothing published after the promotion");

        long long rows =
            kt_qint(sby_url, "SELECT count(*) FROM kinbox_outbox");
        int committed = 0, retried = 0;
        for (int k = 0; k < FO_WRITERS; k++) {
                retried += ws[k].retried;
                for (int a = 0; a < FO_AGGS; a++)
                        committed += ws[k].next[a];
        }
        /* Synchronous commit: every row a writer saw committed is on the
         * promoted standby, and nothing else. */
        cr_assert(eq(i64, rows, committed));
        tmsgs_t got;
        consume(bootstrap, topic, (size_t)rows, 60, 2000, &got);
        qsort(got.v, got.n, sizeof(*got.v), by_offset);
        int copies = check_topic(sby_url, &got, ws);
        cr_log_info("%lld rows, %zu messages (%d copies after the promotion), "
                    "%d transactions of unknown outcome",
                    rows, got.n, copies, retried);
        msgs_free(&got);
}

/*
 * A slot made without failover (by a kinbox before relay.slot_failover, or
 * by hand) is altered into one by kinbox migrate (ALTER_REPLICATION_SLOT),
 * and one already failover is left as it is.
 */
Test(walfailover, existing_slot_altered, .timeout = 120)
{
        pgbin(); /* PostgreSQL 17 or later */
        char *url = kt_fresh_db("postgresql");
        char *slot = kt_unique("kbt_alt");
        char sql[300];
        snprintf(sql, sizeof(sql),
                 "SELECT 1 FROM pg_create_logical_replication_slot('%s', "
                 "'pgoutput')",
                 slot);
        kt_exec(url, sql);
        char *ini = kt_write_ini(url,
                                 "[relay]\nenabled = true\nsource = wal\n"
                                 "slot = %s\nslot_failover = true\n",
                                 slot);
        for (int i = 0; i < 2; i++) {
                char *out = NULL;
                cr_assert(eq(int,
                             kt_kinbox(&out, NULL, true, "migrate -c %s", ini),
                             0),
                          "%s", out);
                cr_assert(i == 0 || strstr(out, "altered") == NULL, "%s", out);
                free(out);
                cr_assert(eq(i64,
                             kt_qintf(url,
                                      "SELECT count(*) FROM "
                                      "pg_replication_slots WHERE slot_name = "
                                      "'%s' AND failover",
                                      slot),
                             1));
        }
        snprintf(sql, sizeof(sql), "SELECT pg_drop_replication_slot('%s')",
                 slot);
        kt_exec(url, sql);
}
