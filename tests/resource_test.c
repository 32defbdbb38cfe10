/*
 * resource_test.c -- the database server out of a resource while a
 * consumer runs (runs as root: it mounts a small tmpfs).
 *
 *   resource/pg_disk_full  the points tables live in a tablespace on a 4 MB
 *                          tmpfs that a filler table has filled: every
 *                          batch fails with SQLSTATE 53100 (disk full);
 *                          the consumer logs it at warning (the run is at
 *                          level notice), applies nothing, commits no
 *                          offset, and once the space is freed applies the
 *                          whole stream exactly, without a restart
 *   resource/connection_slots  every connection slot taken while a consumer
 *                          runs (both backends): a warning naming the
 *                          limit, nothing applied, exact once freed
 */
#include "harness.h"
#include "db.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* psql as the postgres superuser over the server's socket. */
static int
pg_super(const char *db, const char *sql)
{
        char cmd[2048];
        snprintf(cmd, sizeof(cmd),
                 "runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -h %s "
                 "-p %s -d %s -c \"%s\" >/dev/null 2>&1",
                 kt_env("KINBOX_PG_SOCKET_DIR"), kt_env("KINBOX_PG_PORT"), db,
                 sql);
        return system(cmd);
}

static char *g_mnt;

static void
unmount(void)
{
        if (g_mnt)
                umount2(g_mnt, MNT_DETACH);
}

static bool
log_has(const char *path, const char *needle)
{
        char *s = kt_slurp(path);
        bool ok = s && strstr(s, needle);
        free(s);
        return ok;
}

Test(resource, pg_disk_full, .timeout = 300, .fini = unmount)
{
        char *url = kt_fresh_db("postgresql");
        const char *db = strrchr(url, '/') + 1;
        g_mnt = kt_tmp("small-ts");
        cr_assert(mkdir(g_mnt, 0700) == 0);
        cr_assert(mount("tmpfs", g_mnt, "tmpfs", 0, "size=4m,mode=0700") == 0,
                  "mount tmpfs on %s (the test runs as root)", g_mnt);
        char sql[1024];
        snprintf(sql, sizeof(sql), "chown postgres:postgres %s", g_mnt);
        cr_assert(system(sql) == 0);
        char *ts = kt_unique("kt_small");
        snprintf(sql, sizeof(sql), "CREATE TABLESPACE %s LOCATION '%s'", ts,
                 g_mnt);
        cr_assert(pg_super(db, sql) == 0, "%s", sql);
        snprintf(sql, sizeof(sql), "GRANT CREATE ON TABLESPACE %s TO kinbox",
                 ts);
        cr_assert(pg_super(db, sql) == 0, "%s", sql);
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE user_points_flow SET TABLESPACE %s; "
                 "ALTER TABLE user_account SET TABLESPACE %s; "
                 "CREATE TABLE filler (x text) TABLESPACE %s",
                 ts, ts, ts);
        kt_exec(url, sql);
        /* Fill it: one statement that fails when the disk is full. */
        int e =
            kt_exec_err(url, "INSERT INTO filler SELECT repeat(md5(g::text), "
                             "20) FROM generate_series(1, 1000000) g");
        cr_assert(e != 0, "the 4 MB tablespace did not fill up");

        char *topic = kt_unique("res_full");
        kt_topic(topic, 3);
        long long total = kt_produce_grants(topic, 0, 600, 0, "rf", 0, NULL);
        char *group = kt_unique("grf");
        char *ini = kt_tmp("res.ini");
        FILE *f = fopen(ini, "w");
        cr_assert(f != NULL);
        fprintf(f,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "[log]\nlevel = notice\n[consumer.p]\ntopics = %s\n"
                "handler = points\ngroup.id = %s\n",
                url, kt_env("KINBOX_BOOTSTRAP"), topic, group);
        fclose(f);
        char *log = kt_tmp("res_full.log");
        pid_t p = kt_spawn_kinbox(ini, NULL, log);
        for (int i = 0; i < 300 && !log_has(log, "out of a resource"); i++)
                usleep(100000);
        cr_assert(log_has(log,
                          "warning consumer: worker 0: batch rolled back: "
                          "the database is out of a resource"),
                  "no warning for the full disk: see %s", log);
        cr_assert(log_has(log, "53100") || log_has(log, "No space left"),
                  "the warning does not say what is full: see %s", log);
        sleep(2);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 0));
        cr_assert(eq(i64, kt_committed_sum(group, topic, 3), 0),
                  "offsets committed while nothing was applied");

        /* The operator frees the space: no restart. */
        kt_exec(url, "DROP TABLE filler");
        cr_assert(eq(
            i64,
            kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 600, 120),
            600));
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0), "see %s", log);
        kt_assert_points(url, total, 600);
        cr_assert(eq(i64, kt_committed_sum(group, topic, 3), 600));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"),
                     0),
                  "a message was charged for the full disk");
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE user_points_flow SET TABLESPACE pg_default; "
                 "ALTER TABLE user_account SET TABLESPACE pg_default");
        kt_exec(url, sql);
        snprintf(sql, sizeof(sql), "DROP TABLESPACE %s", ts);
        pg_super(db, sql);
}

/* ------------------------------------------------------------ slots */

static kinbox__db_t *
hold_conn(const char *url)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        return db;
}

static void
hold_exec(kinbox__db_t *db, const char *sql)
{
        cr_assert(kinbox__db_queryv(db, sql, 0, NULL, NULL) == 0, "%s: %s",
                  sql, db->err.msg);
}

static const char *g_my_admin; /* restore max_connections at the end */
static long long g_my_max;

static void
restore_max(void)
{
        if (!g_my_admin)
                return;
        char sql[128];
        snprintf(sql, sizeof(sql), "SET GLOBAL max_connections = %lld",
                 g_my_max);
        kt_exec(g_my_admin, sql);
}

/*
 * Every connection slot taken while a consumer runs: its connections are
 * cut and cannot come back (PostgreSQL: the database's CONNECTION LIMIT;
 * MariaDB: max_connections, the SUPER extra slot taken too). The consumer
 * says so at warning, applies nothing, and once slots are free again
 * applies the rest exactly, without a restart.
 */
KT_BACKENDS_PARAMS(resource, connection_slots)
ParameterizedTest(int *backend, resource, connection_slots, .timeout = 300,
                  .fini = restore_max)
{
        bool my = *backend == 1;
        char *url = kt_fresh_db(kt_backend(*backend));
        const char *dbname = strrchr(url, '/') + 1;
        char *topic = kt_unique("res_slots");
        kt_topic(topic, 3);
        char *group = kt_unique("gsl");
        char *ini = kt_tmp("slots.ini");
        FILE *f = fopen(ini, "w");
        cr_assert(f != NULL);
        fprintf(f,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "[log]\nlevel = notice\n[consumer.p]\ntopics = %s\n"
                "handler = points\ngroup.id = %s\n"
                "reconnect.backoff.max.ms = 500\n",
                url, kt_env("KINBOX_BOOTSTRAP"), topic, group);
        fclose(f);
        long long total = kt_produce_grants(topic, 0, 300, 0, "sl", 0, NULL);
        char *log = kt_tmp("res_slots.log");
        pid_t p = kt_spawn_kinbox(ini, NULL, log);
        cr_assert(
            eq(i64,
               kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", 300, 90),
               300));

        /* Take every slot, then cut the consumer's connections. */
        kinbox__db_t *h[32] = {hold_conn(url)};
        int nh = 1;
        char sql[512];
        if (my) {
                g_my_admin = url;
                g_my_max = kt_qint(url, "SELECT @@GLOBAL.max_connections");
                hold_exec(h[0], "SET GLOBAL max_connections = 10");
                snprintf(sql, sizeof(sql),
                         "SELECT id FROM information_schema.processlist WHERE "
                         "db = '%s' AND id <> CONNECTION_ID()",
                         dbname);
                kinbox_rows_t *rows = NULL;
                cr_assert(kinbox__db_queryv(h[0], sql, 0, NULL, &rows) == 0);
                for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                        char k[64];
                        snprintf(k, sizeof(k), "KILL %s",
                                 kinbox_rows_value(rows, i, 0, NULL));
                        kinbox__db_queryv(h[0], k, 0, NULL, NULL);
                }
                kinbox_rows_destroy(rows);
                /* Every slot left, the SUPER extra one included. */
                for (; nh < 32; nh++) {
                        char e[512];
                        h[nh] = kinbox__db_new(url, NULL, e, sizeof(e));
                        if (kinbox__db_connect(h[nh])) {
                                kinbox__db_destroy(h[nh]);
                                break;
                        }
                }
                cr_assert(nh < 32, "max_connections never reached");
        } else {
                h[nh++] = hold_conn(url);
                hold_exec(h[1], "SET application_name = 'kt-holder'");
                snprintf(sql, sizeof(sql),
                         "ALTER DATABASE %s CONNECTION LIMIT 2", dbname);
                hold_exec(h[0], sql);
                snprintf(sql, sizeof(sql),
                         "SELECT pg_terminate_backend(pid) FROM "
                         "pg_stat_activity WHERE datname = '%s' AND pid <> "
                         "pg_backend_pid() AND application_name <> "
                         "'kt-holder'",
                         dbname);
                hold_exec(h[0], sql);
        }

        long long more = kt_produce_grants(topic, 300, 300, 0, "sl", 0, NULL);
        const char *want =
            my ? "Too many connections" : "too many connections";
        bool seen = false;
        for (int i = 0; i < 300 && !seen; i++) {
                char *s = kt_slurp(log);
                seen = s && strstr(s, want) && strstr(s, "warning consumer");
                free(s);
                if (!seen)
                        usleep(100000);
        }
        cr_assert(seen, "no warning naming the connection limit: see %s", log);
        kinbox_rows_t *rows = NULL;
        cr_assert(kinbox__db_queryv(h[0], "SELECT COUNT(*) FROM kinbox_inbox",
                                    0, NULL, &rows) == 0);
        cr_assert(eq(str, (char *)kinbox_rows_value(rows, 0, 0, NULL), "300"),
                  "applied while the consumer had no connection?");
        kinbox_rows_destroy(rows);

        /* Slots free again: no restart. */
        if (my) {
                snprintf(sql, sizeof(sql), "SET GLOBAL max_connections = %lld",
                         g_my_max);
                g_my_admin = NULL;
        } else {
                snprintf(sql, sizeof(sql),
                         "ALTER DATABASE %s CONNECTION LIMIT -1", dbname);
        }
        hold_exec(h[0], sql);
        for (int i = 0; i < nh; i++)
                kinbox__db_destroy(h[i]);
        cr_assert(eq(i64,
                     kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox",
                                  600, 120),
                     600),
                  "see %s", log);
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0), "see %s", log);
        kt_assert_points(url, total + more, 600);
        cr_assert(eq(
            i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter"), 0));
        cr_assert(eq(i64, kt_committed_sum(group, topic, 3), 600));
}
