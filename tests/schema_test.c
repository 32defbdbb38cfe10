/*
 * schema_test.c -- the schema version contract, on both backends.
 *
 *   schema/unmigrated        a database never migrated: run, status and the
 *                            library's consumer and relay refuse it (exit 2,
 *                            KINBOX_ERR_SCHEMA) and say to run migrate;
 *                            migrate --dry-run lists every step and applies
 *                            nothing; migrate prints each step it applied,
 *                            then "up to date"
 *   schema/upgrade_in_place  a database at version 3 (migrations 0001-0003,
 *                            the schema before the claim indexes) holding
 *                            inbox rows, pending outbox rows and an old-form
 *                            dead letter: refused until migrated; migrate
 *                            applies exactly the missing steps; then one
 *                            `kinbox run` absorbs the old inbox's messages,
 *                            applies the new ones, publishes the old outbox
 *                            rows; verify clean
 *   schema/from_the_future   a version this binary does not know: migrate
 *                            refuses it and applies nothing, run, status,
 *                            the consumer and the relay refuse it
 *   schema/module_versions   a handler schema newer than the handler is
 *                            refused; an older (missing) one is refused
 *                            until migrate applies it
 *   schema/consumer_database a consumer with its own database.url: migrate
 *                            migrates it too, and run refuses it unmigrated
 *   schema/concurrent_migrates two `kinbox migrate` at once on an empty
 *                            database, three times: both exit 0 (one
 *                            waits for the other's lock), every step
 *                            recorded once
 *   schema/every_command     every command of `kinbox help` that reads or
 *                            writes kinbox's tables (run, status, dead *,
 *                            outbox *, verify, prune, prune --dry-run,
 *                            reconcile) refuses a schema one version older
 *                            and one at version 99: exit 2, the line saying
 *                            what to do, and no row changed (prune ran no
 *                            DELETE); with the schema restored, the same
 *                            prune deletes the old rows
 */
#include "harness.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../handlers/points/points.h"
#include "db.h"
#include "migrate.h"

static bool
has(const char *s, const char *needle)
{
        return s && strstr(s, needle);
}

/* `kinbox ARGS`, stdout and stderr together in *out. */
static int kb(char **out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int
kb(char **out, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int st = kt_kinboxv(out, NULL, true, fmt, ap);
        va_end(ap);
        return st;
}

static kinbox__db_t *
db_open(const char *url)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        return db;
}

/* The number of kinbox migrations this binary has for url's backend, and
 * the highest version. */
static int
known_migrations(const char *url, int *top)
{
        kinbox__db_t *db = db_open(url);
        int n = 0;
        *top = 0;
        for (const kinbox__migration_t *m = kinbox__migration_next(db, NULL);
             m; m = kinbox__migration_next(db, m)) {
                n++;
                *top = m->version > *top ? m->version : *top;
        }
        kinbox__db_destroy(db);
        return n;
}

/* Apply kinbox's migrations up to version `upto`, as an older kinbox
 * did, and the points schema. */
static void
migrate_upto(const char *url, int upto)
{
        kinbox__db_t *db = db_open(url);
        const struct kinbox__sql *d = db->ops->sql;
        cr_assert(db->ops->script(db, d->migrations_table) == 0, "%s",
                  db->err.msg);
        for (const kinbox__migration_t *m = kinbox__migration_next(db, NULL);
             m; m = kinbox__migration_next(db, m)) {
                if (m->version > upto)
                        continue;
                char *sql = NULL;
                cr_assert(asprintf(&sql, "%s%s;\n%s", d->script_begin, m->sql,
                                   d->script_commit) > 0);
                cr_assert(db->ops->script(db, sql) == 0, "%s: %s", m->name,
                          db->err.msg);
                free(sql);
                char ins[256];
                snprintf(ins, sizeof(ins),
                         "INSERT INTO kinbox_schema_migrations (component, "
                         "version, name) VALUES ('kinbox', %d, '%s')",
                         m->version, m->name);
                cr_assert(db->ops->script(db, ins) == 0, "%s", db->err.msg);
        }
        kinbox__db_destroy(db);
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "database.url", url);
        char e[1024];
        cr_assert(kinbox_migrate_module(c, &kinbox_points_module, e,
                                        sizeof(e)) == KINBOX_OK,
                  "%s", e);
        kinbox_conf_destroy(c);
}

static kinbox_result_t
noop(kinbox_tx_t *tx, const kinbox_msg_t *m, void *o)
{
        (void)tx;
        (void)m;
        (void)o;
        return KINBOX_RESULT_OK;
}

/* The library refuses url: a consumer's and a relay's run return
 * KINBOX_ERR_SCHEMA with errstr containing want. */
static void
library_refuses(const char *url, const char *want)
{
        kinbox_conf_t *c = kt_conf(url, "lib", kt_unique("g"), "t");
        char e[512];
        kinbox_consumer_t *con = kinbox_consumer_new(c, e, sizeof(e));
        cr_assert(con != NULL, "%s", e);
        kinbox_consumer_set_handler(con, noop, NULL);
        cr_assert(eq(int, kinbox_consumer_run(con), KINBOX_ERR_SCHEMA));
        cr_assert(has(kinbox_consumer_errstr(con), want), "consumer: %s",
                  kinbox_consumer_errstr(con));
        kinbox_consumer_destroy(con);

        kinbox_conf_t *rc = kinbox_conf_new();
        kt_set(rc, "database.url", url);
        kt_set(rc, "kafka.bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"));
        kinbox_relay_t *r = kinbox_relay_new(rc, e, sizeof(e));
        cr_assert(r != NULL, "%s", e);
        cr_assert(eq(int, kinbox_relay_run(r), KINBOX_ERR_SCHEMA));
        cr_assert(has(kinbox_relay_errstr(r), want), "relay: %s",
                  kinbox_relay_errstr(r));
        kinbox_relay_destroy(r);

        kinbox_conf_t *cc = kinbox_conf_new();
        kt_set(cc, "database.url", url);
        cr_assert(eq(int, kinbox_schema_check(cc, NULL, e, sizeof(e)),
                     KINBOX_ERR_SCHEMA));
        cr_assert(has(e, want), "%s", e);
        kinbox_conf_destroy(cc);
}

/* run and status refuse ini with exit 2 and a line containing want. */
static void
cli_refuses(const char *ini, const char *want)
{
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "run -c %s", ini), 2), "run: %s", out);
        cr_assert(has(out, want), "run: %s", out);
        free(out);
        cr_assert(eq(int, kb(&out, "status -c %s", ini), 2), "status: %s",
                  out);
        cr_assert(has(out, want), "status: %s", out);
        free(out);
}

static int
count_lines(const char *s, const char *needle)
{
        int n = 0;
        for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
                n++;
        return n;
}

KT_BACKENDS_PARAMS(schema, unmigrated)
ParameterizedTest(int *backend, schema, unmigrated, .timeout = 180)
{
        char *url = kt_empty_db(kt_backend(*backend));
        char *ini = kt_write_ini(url, "[consumer.p]\ntopics = t\n"
                                      "handler = points\n");
        cli_refuses(ini, "no kinbox schema");
        cli_refuses(ini, "run kinbox migrate");
        library_refuses(url, "no kinbox schema");

        int top, n = known_migrations(url, &top);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "migrate --dry-run -c %s", ini), 0), "%s",
                  out);
        cr_assert(eq(int, count_lines(out, "kinbox schema: would apply 0"), n),
                  "%s", out);
        cr_assert(has(out, "handler points schema: would apply version"), "%s",
                  out);
        cr_assert(not(has(out, ": applied")), "%s", out);
        free(out);
        cr_assert(kt_exec_err(url, "SELECT 1 FROM kinbox_schema_migrations") !=
                      0,
                  "--dry-run created kinbox_schema_migrations");

        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        cr_assert(eq(int, count_lines(out, "kinbox schema: applied 0"), n),
                  "%s", out);
        cr_assert(has(out, "kinbox schema: applied 0001_inbox"), "%s", out);
        cr_assert(has(out, "handler points schema: applied version"), "%s",
                  out);
        free(out);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_schema_migrations WHERE component "
                                  "= 'kinbox'"),
                     n));
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        cr_assert(has(out, "kinbox schema: up to date"), "%s", out);
        cr_assert(has(out, "handler points schema: up to date"), "%s", out);
        cr_assert(not(has(out, ": applied")), "%s", out);
        free(out);
        cr_assert(eq(int, kb(&out, "status -c %s", ini), 0), "%s", out);
        free(out);
}

KT_BACKENDS_PARAMS(schema, upgrade_in_place)
ParameterizedTest(int *backend, schema, upgrade_in_place, .timeout = 300)
{
        bool my = *backend == 1;
        char *url = kt_empty_db(kt_backend(*backend));
        migrate_upto(url, 3);
        char *topic = kt_unique("sch_up"), *out_topic = kt_unique("sch_out");
        kt_topic(topic, 3);
        kt_topic(out_topic, 2);
        /* What the old kinbox left: 100 messages applied (their inbox rows;
         * their effect is not what this test counts), 50 pending outbox
         * rows of 5 aggregates, a dead letter in the old header form. */
        for (int i = 0; i < 100; i++) {
                char sql[300];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_inbox (consumer, message_id, "
                         "topic, kafka_partition, kafka_offset) VALUES "
                         "('p', 'm-%d', 'old', 0, %d)",
                         i, i);
                kt_exec(url, sql);
        }
        for (int i = 0; i < 50; i++) {
                char sql[400];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_outbox (destination, idem_key, "
                         "aggregate_id, payload) VALUES ('%s', 'o-%d', "
                         "'agg-%d', '{\"n\":%d}')",
                         out_topic, i, i % 5, i / 5);
                kt_exec(url, sql);
        }
        /* Their watermark, as the old kinbox stored it with the batch. */
        kt_exec(url, "INSERT INTO kinbox_offsets (consumer, topic, "
                     "kafka_partition, next_offset) VALUES ('p', 'old', 0, "
                     "100)");
        char sql[600];
        snprintf(
            sql, sizeof(sql),
            "INSERT INTO kinbox_dead_letter (consumer, message_id, topic, "
            "kafka_partition, kafka_offset, headers, error, dead_at, "
            "first_failed_at) VALUES ('p', 'old-dead', 'old', 0, 1, "
            "'[{\"name\":\"a\",\"value\":\"x\"}]', 'bad', %s, %s)",
            my ? "CURRENT_TIMESTAMP(6)" : "now()",
            my ? "CURRENT_TIMESTAMP(6)" : "now()");
        kt_exec(url, sql);

        char *ini = kt_write_ini(url,
                                 "[consumer.p]\ntopics = %s\nhandler = "
                                 "points\ngroup.id = %s\n[relay]\nenabled = "
                                 "true\npoll.ms = 100\n",
                                 topic, kt_unique("gup"));
        cli_refuses(ini, "the kinbox schema is at version 3");
        cli_refuses(ini, "missing 0004_outbox_claim");
        library_refuses(url, "at version 3");

        int top, n = known_migrations(url, &top);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        cr_assert(eq(int, count_lines(out, "kinbox schema: applied 0"), n - 3),
                  "%s", out);
        cr_assert(has(out, "applied 0004_outbox_claim"), "%s", out);
        cr_assert(has(out, "applied 0005_headers"), "%s", out);
        cr_assert(not(has(out, "applied 0001") || has(out, "applied 0003")),
                  "%s", out);
        cr_assert(has(out, "handler points schema: up to date"), "%s", out);
        free(out);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_dead_letter "
                                  "WHERE message_id = 'old-dead' AND headers "
                                  "LIKE '[[%'"),
                     1),
                  "0005 did not rewrite the old dead letter's headers");

        /* The stream: m-0..m-99 again (already applied: absorbed), and
         * m-100..m-199 (new). */
        kt_produce_grants(topic, 0, 100, 0, "ord", 0, NULL);
        long long total =
            kt_produce_grants(topic, 100, 100, 0, "ord", 0, NULL);
        char *log = kt_tmp("sch_up.log");
        pid_t p = kt_spawn_kinbox(ini, NULL, log);
        long long inbox = kt_wait_qint(
            url, "SELECT COUNT(*) FROM kinbox_inbox WHERE consumer = 'p'", 200,
            90);
        long long sent = kt_wait_qint(
            url, "SELECT COUNT(*) FROM kinbox_outbox WHERE status = 'sent'",
            50, 90);
        kill(p, SIGTERM);
        cr_assert(eq(int, kt_wait(p, 60), 0), "kinbox run: see %s", log);
        cr_assert(eq(i64, inbox, 200));
        cr_assert(eq(i64, sent, 50));
        cr_assert(eq(i64, kt_high_sum(out_topic, 2), 50));
        /* Only the new 100 applied: the old inbox rows absorbed theirs. */
        kt_assert_points(url, total, 100);
        cr_assert(eq(int, kb(&out, "verify -c %s", ini), 0), "%s", out);
        free(out);
}

KT_BACKENDS_PARAMS(schema, from_the_future)
ParameterizedTest(int *backend, schema, from_the_future, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        int top;
        known_migrations(url, &top);
        /* A newer kinbox applied version 99, and this database also lacks
         * this kinbox's last step: nothing may be applied. */
        kt_exec(url, "INSERT INTO kinbox_schema_migrations (component, "
                     "version, name) VALUES ('kinbox', 99, '0099_future')");
        char del[200];
        snprintf(del, sizeof(del),
                 "DELETE FROM kinbox_schema_migrations WHERE component = "
                 "'kinbox' AND version = %d",
                 top);
        kt_exec(url, del);
        char *ini = kt_write_ini(url, "[consumer.p]\ntopics = t\n"
                                      "handler = points\n");
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "written by a newer kinbox (version 99"), "%s",
                  out);
        cr_assert(has(out, "upgrade this binary"), "%s", out);
        cr_assert(not(has(out, ": applied")), "%s", out);
        free(out);
        cr_assert(eq(i64,
                     kt_qintf(url,
                              "SELECT COUNT(*) FROM kinbox_schema_migrations "
                              "WHERE component = 'kinbox' AND version = %d",
                              top),
                     0),
                  "migrate applied a step on a schema from the future");
        cr_assert(eq(int, kb(&out, "migrate --dry-run -c %s", ini), 2), "%s",
                  out);
        free(out);
        cli_refuses(ini, "written by a newer kinbox (version 99");
        library_refuses(url, "newer kinbox");
}

KT_BACKENDS_PARAMS(schema, module_versions)
ParameterizedTest(int *backend, schema, module_versions, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *ini = kt_write_ini(url, "[consumer.p]\ntopics = t\n"
                                      "handler = points\n");
        int v = kinbox_points_module.schema_version;
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_schema_migrations (component, version, "
                 "name) VALUES ('points', %d, 'schema')",
                 v + 1);
        kt_exec(url, sql);
        cli_refuses(ini, "the points schema was written by a newer points");
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "newer points"), "%s", out);
        free(out);

        /* Without its row: older than the handler, until migrate. */
        kt_exec(url, "DELETE FROM kinbox_schema_migrations WHERE component = "
                     "'points'");
        cli_refuses(ini, "the points schema is at version 0, this points "
                         "needs");
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        cr_assert(has(out, "kinbox schema: up to date"), "%s", out);
        char want[64];
        snprintf(want, sizeof(want),
                 "handler points schema: applied version %d", v);
        cr_assert(has(out, want), "%s", out);
        free(out);
        cr_assert(eq(int, kb(&out, "status -c %s", ini), 0), "%s", out);
        free(out);
        /* points-single is the points handler per message: one schema,
         * recorded as points, so the database migrated for points serves
         * it without another migrate. */
        char *single = kt_write_ini(url, "[consumer.s]\ntopics = t\n"
                                         "handler = points-single\n");
        cr_assert(eq(int, kb(&out, "status -c %s", single), 0), "%s", out);
        free(out);
}

KT_BACKENDS_PARAMS(schema, consumer_database)
ParameterizedTest(int *backend, schema, consumer_database, .timeout = 180)
{
        char *url = kt_fresh_db(kt_backend(*backend));
        char *own = kt_empty_db(kt_backend(*backend));
        char *ini = kt_write_ini(url,
                                 "[consumer.b]\ntopics = t\nhandler = points\n"
                                 "database.url = %s\n",
                                 own);
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "run -c %s", ini), 2), "%s", out);
        cr_assert(has(out, "[consumer.b]: the database has no kinbox schema"),
                  "%s", out);
        free(out);
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        cr_assert(has(out, "kinbox schema (database of [database]): up to "
                           "date"),
                  "%s", out);
        cr_assert(has(out, "kinbox schema (database of [consumer.b]): applied "
                           "0001_inbox"),
                  "%s", out);
        cr_assert(has(out, "handler points schema (database of [consumer.b]): "
                           "applied version"),
                  "%s", out);
        free(out);
        cr_assert(
            eq(i64, kt_qint(own, "SELECT COUNT(*) FROM kinbox_inbox"), 0));
        cr_assert(
            eq(i64, kt_qint(own, "SELECT COUNT(*) FROM user_account"), 0));
        cr_assert(eq(int, kb(&out, "migrate -c %s", ini), 0), "%s", out);
        cr_assert(not(has(out, ": applied")), "%s", out);
        free(out);
}

/* Every command that reads or writes kinbox's tables, with arguments that
 * would change rows; DEAD and OUT stand for a dead letter's and an outbox
 * row's id. */
static const char *const db_cmds[] = {
    "run",
    "status",
    "dead list",
    "dead parked",
    "dead show DEAD",
    "dead replay DEAD",
    "dead discard DEAD",
    "outbox list",
    "outbox requeue OUT",
    "outbox cancel OUT",
    "outbox pause d",
    "outbox resume d",
    "outbox resend --since 2h",
    "verify",
    "offsets list",
    "offsets reset --consumer p --to earliest",
    "prune",
    "prune --dry-run",
    "reconcile"};
/* The commands that touch no table, or (migrate) check the schema to
 * change it (the tests above). */
static const char *const other_cmds[] = {"migrate", "config-reference",
                                         "version", "help"};

static bool
listed(const char *cmd)
{
        size_t n = strlen(cmd);
        for (size_t i = 0; i < sizeof(db_cmds) / sizeof(db_cmds[0]); i++)
                if (!strncmp(db_cmds[i], cmd, n) &&
                    (db_cmds[i][n] == ' ' || !db_cmds[i][n]))
                        return true;
        return false;
}

/* Each command (and subcommand) of `kinbox help` is in db_cmds or
 * other_cmds: a new command cannot skip this test. */
static void
audit_help(void)
{
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "help"), 0), "%s", out);
        for (char *save = NULL, *l = strtok_r(out, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save)) {
                char cmd[64], subs[128] = "";
                if (strncmp(l, "  ", 2) || l[2] == ' ' ||
                    sscanf(l + 2, "%63s %127s", cmd, subs) < 1)
                        continue;
                bool other = false;
                for (size_t i = 0;
                     i < sizeof(other_cmds) / sizeof(other_cmds[0]); i++)
                        other = other || !strcmp(cmd, other_cmds[i]);
                bool known = other || listed(cmd);
                cr_assert(known, "kinbox %s: not in schema_test's db_cmds",
                          cmd);
                if (!strchr(subs, '|'))
                        continue;
                for (char *s2 = NULL, *sub = strtok_r(subs, "|", &s2); sub;
                     sub = strtok_r(NULL, "|", &s2)) {
                        char full[200];
                        snprintf(full, sizeof(full), "%s %s", cmd, sub);
                        cr_assert(listed(full),
                                  "kinbox %s: not in schema_test's db_cmds",
                                  full);
                }
        }
        free(out);
}

/* What any command could change, as one line. */
static char *
snapshot(const char *url)
{
        static const char *const q[] = {
            "SELECT COUNT(*) FROM kinbox_inbox",
            "SELECT COUNT(*) FROM kinbox_outbox WHERE status = 'sent'",
            "SELECT COUNT(*) FROM kinbox_outbox WHERE status = 'pending'",
            "SELECT COUNT(*) FROM kinbox_outbox WHERE status = 'canceled'",
            "SELECT COUNT(*) FROM kinbox_dead_letter WHERE status = 'dead'",
            "SELECT COUNT(*) FROM kinbox_outbox_paused",
            "SELECT COUNT(*) FROM kinbox_offsets"};
        char *s = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&s, &n);
        for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++)
                fprintf(f, "%lld ", kt_qint(url, q[i]));
        fclose(f);
        return s;
}

/* "dead show DEAD" with the ids. */
static void
with_ids(char *b, size_t sz, const char *cmd, long long dead, long long out)
{
        const char *p = strstr(cmd, "DEAD"), *o = strstr(cmd, "OUT");
        if (p)
                snprintf(b, sz, "%.*s%lld", (int)(p - cmd), cmd, dead);
        else if (o)
                snprintf(b, sz, "%.*s%lld", (int)(o - cmd), cmd, out);
        else
                snprintf(b, sz, "%s", cmd);
}

static void
every_command_refuses(const char *url, const char *ini, const char *want,
                      const char *want2)
{
        char *before = snapshot(url);
        long long dead =
            kt_qint(url, "SELECT MIN(id) FROM kinbox_dead_letter");
        long long ob = kt_qint(url, "SELECT MIN(id) FROM kinbox_outbox WHERE "
                                    "status = 'pending'");
        for (size_t i = 0; i < sizeof(db_cmds) / sizeof(db_cmds[0]); i++) {
                char cmd[128], *out = NULL;
                with_ids(cmd, sizeof(cmd), db_cmds[i], dead, ob);
                cr_assert(eq(int, kb(&out, "%s -c %s", cmd, ini), 2),
                          "kinbox %s: %s", cmd, out);
                cr_assert(has(out, want), "kinbox %s: %s", cmd, out);
                bool second = !want2 || has(out, want2);
                cr_assert(second, "kinbox %s: %s", cmd, out);
                free(out);
                char *after = snapshot(url);
                cr_assert(eq(str, after, before), "kinbox %s changed rows",
                          cmd);
                free(after);
        }
        free(before);
}

KT_BACKENDS_PARAMS(schema, every_command)
ParameterizedTest(int *backend, schema, every_command, .timeout = 300)
{
        audit_help();
        bool my = *backend == 1;
        char *url = kt_fresh_db(kt_backend(*backend));
        const char *old = my ? "CURRENT_TIMESTAMP(6) - INTERVAL 30 DAY"
                             : "now() - interval '30 days'";
        /* What prune would delete (inbox and sent outbox rows 30 days
         * old), what the other commands would change. */
        for (int i = 0; i < 20; i++) {
                char sql[400];
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_inbox (consumer, message_id, "
                         "topic, kafka_partition, kafka_offset, "
                         "processed_at) VALUES ('p', 'id-%d', 't', 0, %d, "
                         "%s)",
                         i, i, old);
                kt_exec(url, sql);
                snprintf(sql, sizeof(sql),
                         "INSERT INTO kinbox_outbox (destination, idem_key, "
                         "status, sent_at, created_at) VALUES ('d', 'k%d', "
                         "'%s', %s, %s)",
                         i, i < 15 ? "sent" : "pending", old, old);
                kt_exec(url, sql);
        }
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_dead_letter (consumer, message_id, "
                 "topic, kafka_partition, kafka_offset, error, dead_at, "
                 "first_failed_at) VALUES ('p', 'dl', 't', 0, 100, 'bad', "
                 "%s, %s)",
                 old, old);
        kt_exec(url, sql);
        kt_exec(url, "INSERT INTO kinbox_offsets (consumer, topic, "
                     "kafka_partition, next_offset) VALUES ('p', 't', 0, 20)");
        char *ini =
            kt_write_ini(url, "[consumer.p]\ntopics = t\nhandler = "
                              "points\n[prune]\ninbox.retention = 14d\n"
                              "outbox.retention = 7d\n");

        /* Newer: version 99. */
        kt_exec(url, "INSERT INTO kinbox_schema_migrations (component, "
                     "version, name) VALUES ('kinbox', 99, '0099_future')");
        every_command_refuses(url, ini,
                              "written by a newer kinbox (version 99",
                              "upgrade this binary");
        kt_exec(url, "DELETE FROM kinbox_schema_migrations WHERE component = "
                     "'kinbox' AND version = 99");

        /* Older: this binary's last step missing. */
        int top;
        known_migrations(url, &top);
        char name[200];
        snprintf(sql, sizeof(sql),
                 "SELECT name FROM kinbox_schema_migrations WHERE component "
                 "= 'kinbox' AND version = %d",
                 top);
        kinbox__db_t *db = db_open(url);
        kinbox_rows_t *r = NULL;
        cr_assert(kinbox__db_queryv(db, sql, 0, NULL, &r) == 0, "%s",
                  db->err.msg);
        cr_assert(eq(sz, kinbox_rows_count(r), 1));
        snprintf(name, sizeof(name), "%s", kinbox_rows_value(r, 0, 0, NULL));
        kinbox_rows_destroy(r);
        kinbox__db_destroy(db);
        snprintf(sql, sizeof(sql),
                 "DELETE FROM kinbox_schema_migrations WHERE component = "
                 "'kinbox' AND version = %d",
                 top);
        kt_exec(url, sql);
        char want[400];
        snprintf(want, sizeof(want), "this kinbox needs %d (missing %s", top,
                 name);
        every_command_refuses(url, ini, want, "run kinbox migrate");

        /* Restored: the same prune deletes what it was refused. */
        snprintf(sql, sizeof(sql),
                 "INSERT INTO kinbox_schema_migrations (component, version, "
                 "name) VALUES ('kinbox', %d, '%s')",
                 top, name);
        kt_exec(url, sql);
        char *pini = kt_write_ini(url, "[prune]\ninbox.retention = 14d\n"
                                       "outbox.retention = 7d\n");
        char *out = NULL;
        cr_assert(eq(int, kb(&out, "prune -c %s", pini), 0), "%s", out);
        free(out);
        cr_assert(
            eq(i64, kt_qint(url, "SELECT COUNT(*) FROM kinbox_inbox"), 0));
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM kinbox_outbox WHERE "
                                  "status = 'sent'"),
                     0));
}

KT_BACKENDS_PARAMS(schema, concurrent_migrates)
ParameterizedTest(int *backend, schema, concurrent_migrates, .timeout = 300)
{
        for (int round = 0; round < 3; round++) {
                char *url = kt_empty_db(kt_backend(*backend));
                char *ini = kt_write_ini(url, "[consumer.p]\ntopics = t\n"
                                              "handler = points\n");
                pid_t pid[2];
                char *log[2];
                for (int i = 0; i < 2; i++) {
                        log[i] = kt_tmp("migrate_race");
                        pid[i] = fork();
                        cr_assert(pid[i] >= 0);
                        if (pid[i] == 0) {
                                char *out = NULL;
                                int st = kb(&out, "migrate -c %s", ini);
                                FILE *f = fopen(log[i], "w");
                                if (f) {
                                        fputs(out ? out : "", f);
                                        fclose(f);
                                }
                                _exit(st);
                        }
                }
                for (int i = 0; i < 2; i++) {
                        int st = 0;
                        bool reaped = waitpid(pid[i], &st, 0) == pid[i];
                        cr_assert(reaped);
                        char *out = kt_slurp(log[i]);
                        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                        cr_assert(ok, "round %d, migrate %d: status %d: %s",
                                  round, i, st, out ? out : "");
                        free(out);
                }
                int top, n = known_migrations(url, &top);
                cr_assert(eq(i64,
                             kt_qint(url, "SELECT COUNT(*) FROM "
                                          "kinbox_schema_migrations WHERE "
                                          "component = 'kinbox'"),
                             n));
                char *out = NULL;
                cr_assert(eq(int, kb(&out, "status -c %s", ini), 0), "%s",
                          out);
                free(out);
        }
}
