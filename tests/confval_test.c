/*
 * confval_test.c -- the configuration value parser and the configuration
 * file loader of the kinbox command. No services needed: every case fails
 * while loading the file, before anything connects.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kinbox/kinbox.h>

#include "confval.h"
#include "internal.h"

static bool
has(const char *hay, const char *needle)
{
        return hay && strstr(hay, needle) != NULL;
}

static bool
has_no_file(const char *path)
{
        return access(path, F_OK) != 0;
}

Test(confval, booleans_any_case)
{
        static const char *const t[] = {"true", "TRUE", "True", "yes",
                                        "YES",  "on",   "On",   "1"};
        static const char *const f[] = {"false", "FALSE", "False", "no",
                                        "No",    "off",   "OFF",   "0"};
        char e[200];
        for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
                bool b = false;
                cr_assert(eq(int,
                             kinbox__confval_bool("k", t[i], &b, e, sizeof(e)),
                             0),
                          "%s", t[i]);
                cr_assert(b, "%s", t[i]);
        }
        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
                bool b = true;
                cr_assert(eq(int,
                             kinbox__confval_bool("k", f[i], &b, e, sizeof(e)),
                             0),
                          "%s", f[i]);
                cr_assert(b == false, "%s", f[i]);
        }
}

Test(confval, boolean_typos_name_key_and_value)
{
        static const char *const bad[] = {"ture", "",  " true",   "true ",
                                          "2",    "y", "enabled", "onn"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                char e[200] = "";
                bool b = true;
                cr_assert(eq(int,
                             kinbox__confval_bool("relay.notify", bad[i], &b,
                                                  e, sizeof(e)),
                             -1),
                          "\"%s\" accepted", bad[i]);
                cr_assert(b, "value changed on error");
                cr_assert(has(e, "relay.notify"), "%s", e);
                char q[32];
                snprintf(q, sizeof(q), "\"%s\"", bad[i]);
                cr_assert(has(e, q), "%s", e);
        }
        char e[200];
        bool b;
        cr_assert(
            eq(int, kinbox__confval_bool("k", NULL, &b, e, sizeof(e)), -1));
        /* NULL errstr is allowed */
        cr_assert(eq(int, kinbox__confval_bool("k", "x", &b, NULL, 0), -1));
}

Test(confval, integers_and_ranges)
{
        char e[200];
        int64_t n = 0;
        cr_assert(eq(
            int, kinbox__confval_int("k", "42", 0, 100, &n, e, sizeof(e)), 0));
        cr_assert(eq(i64, n, 42));
        cr_assert(
            eq(int, kinbox__confval_int("k", "-5", -10, 100, &n, e, sizeof(e)),
               0));
        cr_assert(eq(i64, n, -5));
        cr_assert(eq(int,
                     kinbox__confval_int("k", "9223372036854775807", INT64_MIN,
                                         INT64_MAX, &n, e, sizeof(e)),
                     0));
        cr_assert(eq(i64, n, INT64_MAX));
        static const char *const bad[] = {"",   "x",    "1x",  " 1", "1 ",
                                          "+1", "0x10", "1.5", "-",  "--1"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                n = 7;
                cr_assert(eq(int,
                             kinbox__confval_int("batch.max", bad[i], -9, 100,
                                                 &n, e, sizeof(e)),
                             -1),
                          "\"%s\" accepted", bad[i]);
                cr_assert(eq(i64, n, 7));
                cr_assert(has(e, "batch.max") == true &&
                              has(e, "not an integer"),
                          "%s", e);
        }
        cr_assert(eq(
            int, kinbox__confval_int("workers", "65", 1, 64, &n, e, sizeof(e)),
            -1));
        cr_assert(has(e, "workers") && has(e, "\"65\"") && has(e, "[1, 64]"),
                  "%s", e);
        cr_assert(eq(int,
                     kinbox__confval_int("k", "99999999999999999999", 0,
                                         INT64_MAX, &n, e, sizeof(e)),
                     -1));
        cr_assert(has(e, "out of range"), "%s", e);
}

Test(confval, durations)
{
        static const struct {
                const char *s;
                int64_t ms;
        } ok[] = {{"500ms", 500}, {"10s", 10000},  {"10", 10000},
                  {"5m", 300000}, {"2h", 7200000}, {"14d", 1209600000},
                  {"0", 0},       {"0ms", 0}};
        char e[200];
        for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
                int64_t ms = -1;
                cr_assert(
                    eq(int,
                       kinbox__confval_duration("k", ok[i].s, 0, INT64_MAX,
                                                &ms, e, sizeof(e)),
                       0),
                    "%s: %s", ok[i].s, e);
                cr_assert(eq(i64, ms, ok[i].ms), "%s", ok[i].s);
        }
        static const char *const bad[] = {"",     "ms", "10 s",  "10S", "-1s",
                                          "1.5h", "1w", "10sec", "d",   "1dd"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                int64_t ms = 7;
                cr_assert(
                    eq(int,
                       kinbox__confval_duration("inbox.retention", bad[i], 0,
                                                INT64_MAX, &ms, e, sizeof(e)),
                       -1),
                    "\"%s\" accepted", bad[i]);
                cr_assert(eq(i64, ms, 7));
                cr_assert(has(e, "inbox.retention") &&
                              has(e, "not a duration"),
                          "%s", e);
        }
        int64_t ms;
        cr_assert(eq(int,
                     kinbox__confval_duration("k", "99999999999999d", 0,
                                              INT64_MAX, &ms, e, sizeof(e)),
                     -1));
        cr_assert(has(e, "too long"), "%s", e);
        cr_assert(eq(int,
                     kinbox__confval_duration("inbox.retention", "30s", 60000,
                                              INT64_MAX, &ms, e, sizeof(e)),
                     -1));
        cr_assert(has(e, "below the minimum of 1m"), "%s", e);
        cr_assert(eq(
            int,
            kinbox__confval_duration("k", "2h", 0, 3600000, &ms, e, sizeof(e)),
            -1));
        cr_assert(has(e, "[0ms, 1h]"), "%s", e);
}

Test(confval, duration_text)
{
        char b[32];
        cr_assert(
            eq(str,
               (char *)kinbox__confval_duration_str(1209600000, b, sizeof(b)),
               "14d"));
        cr_assert(eq(str,
                     (char *)kinbox__confval_duration_str(90000, b, sizeof(b)),
                     "90s"));
        cr_assert(eq(str,
                     (char *)kinbox__confval_duration_str(60000, b, sizeof(b)),
                     "1m"));
        cr_assert(eq(str,
                     (char *)kinbox__confval_duration_str(250, b, sizeof(b)),
                     "250ms"));
        cr_assert(eq(str,
                     (char *)kinbox__confval_duration_str(0, b, sizeof(b)),
                     "0ms"));
}

/* The property table uses the same parser. */
Test(confval, conf_set_uses_it)
{
        kinbox_conf_t *c = kinbox_conf_new();
        char e[256];
        cr_assert(eq(int,
                     kinbox_conf_set(c, "relay.notify", "TRUE", e, sizeof(e)),
                     KINBOX_OK));
        cr_assert(eq(i64, kinbox__settings_of(c)->relay_notify, 1));
        cr_assert(eq(int,
                     kinbox_conf_set(c, "relay.notify", "Off", e, sizeof(e)),
                     KINBOX_OK));
        cr_assert(eq(i64, kinbox__settings_of(c)->relay_notify, 0));
        cr_assert(eq(int,
                     kinbox_conf_set(c, "relay.notify", "ture", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(has(e, "relay.notify") && has(e, "\"ture\""), "%s", e);
        cr_assert(eq(int,
                     kinbox_conf_set(c, "inbox.retention", "2d", e, sizeof(e)),
                     KINBOX_OK));
        cr_assert(
            eq(i64, kinbox__settings_of(c)->inbox_retention, 2 * 86400000LL));
        cr_assert(eq(int,
                     kinbox_conf_set(c, "handler", "../evil", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(has(e, "handler") && has(e, "../evil"), "%s", e);
        cr_assert(eq(int, kinbox_conf_set(c, "handler", "a/b", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        cr_assert(eq(
            int,
            kinbox_conf_set(c, "relay.modules", "orders, ../x", e, sizeof(e)),
            KINBOX_ERR_INVALID));
        cr_assert(eq(
            int, kinbox_conf_set(c, "handler", "my.handler_2", e, sizeof(e)),
            KINBOX_OK));
        kinbox_conf_destroy(c);
}

/* ------------------------------------------------ the configuration file */

static const char *
bin(void)
{
        const char *b = getenv("KINBOX_BIN");
        cr_assert(b != NULL, "KINBOX_BIN is not set (run through ctest)");
        return b;
}

/* Write ini text to a temporary file, run `kinbox CMD -c FILE` with env
 * (NULL or "NAME=value") added, return the exit status and stderr. */
static int
kb_ini(const char *cmd, const char *env, const char *ini, char **err)
{
        char path[] = "/tmp/kinbox-confval-XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        FILE *fp = fdopen(fd, "w");
        fputs(ini, fp);
        fclose(fp);
        char errp[] = "/tmp/kinbox-confval-err-XXXXXX";
        int efd = mkstemp(errp);
        cr_assert(efd >= 0);
        close(efd);
        char line[4096];
        snprintf(line, sizeof(line), "%s \"%s\" %s -c %s >/dev/null 2>%s",
                 env ? env : "", bin(), cmd, path, errp);
        int st = system(line);
        unlink(path);
        FILE *ef = fopen(errp, "r");
        cr_assert(ef != NULL);
        static char buf[8192];
        size_t n = fread(buf, 1, sizeof(buf) - 1, ef);
        buf[n] = '\0';
        fclose(ef);
        unlink(errp);
        *err = buf;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Unreachable on purpose: a case that got past the file would fail to
 * connect with exit 3 instead of 2. */
#define DB                                                                    \
        "[database]\nurl = postgresql://kinbox@127.0.0.1:1/nosuch\n"          \
        "[kafka]\nbootstrap.servers = 127.0.0.1:1\n"

Test(config_file, relay_enabled_typo_is_refused)
{
        char *err;
        int rc = kb_ini("run", NULL, DB "[relay]\nenabled = ture\n", &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "[relay] enabled") && has(err, "\"ture\""), "%s",
                  err);
        rc = kb_ini("run", NULL, DB "[relay]\nnotify = TRUEE\n", &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "relay.notify") && has(err, "\"TRUEE\""), "%s",
                  err);
}

Test(config_file, relay_enabled_any_case_is_on)
{
        /* An enabled relay gets past the file and fails on the database
         * (exit 3): with "enabled" read as false, run would refuse an
         * empty configuration with exit 2. */
        static const char *const on[] = {"TRUE", "True", "on", "YES", "1"};
        for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
                char ini[512], *err;
                snprintf(ini, sizeof(ini), DB "[relay]\nenabled = %s\n",
                         on[i]);
                int rc = kb_ini("run", NULL, ini, &err);
                cr_assert(eq(int, rc, 3), "enabled = %s: rc %d: %s", on[i], rc,
                          err);
        }
        char *err;
        int rc = kb_ini("run", NULL, DB "[relay]\nenabled = Off\n", &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "no enabled [relay]"), "%s", err);
}

Test(config_file, duplicate_consumer_section)
{
        char *err;
        int rc = kb_ini("run", NULL,
                        DB "[consumer.points]\nhandler = points\ntopics = a\n"
                           "[relay]\nenabled = false\n"
                           "[consumer.points]\ntopics = b\n",
                        &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "[consumer.points] appears twice"), "%s", err);
        /* Written twice in a row (libinih hands over keys, not headers:
         * this looked like one section), and any other section twice. */
        rc = kb_ini("run", NULL,
                    DB "[consumer.points]\nhandler = points\n"
                       "[consumer.points]\ntopics = b\n",
                    &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, ":7: [consumer.points] appears twice (first at "
                           "line 5)"),
                  "%s", err);
        rc = kb_ini("migrate", NULL, DB "[kafka]\nacks = 1\n", &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, ":5: [kafka] appears twice (first at line 3)"),
                  "%s", err);
}

/* A mysql:// URL parameter kinbox does not know is refused at load, naming
 * it (no connection tried: nothing listens on port 1), also in a
 * consumer's own database.url. */
Test(config_file, unknown_mysql_url_parameter)
{
        char *err;
        int rc = kb_ini("run", NULL,
                        "[database]\nurl = mysql://u:p@127.0.0.1:1/x?"
                        "sslmode=require\n[relay]\nenabled = true\n",
                        &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "unknown parameter \"sslmode\" for mysql://"), "%s",
                  err);
        rc = kb_ini("migrate", NULL,
                    "[database]\nurl = mysql://u:p@127.0.0.1:1/x?"
                    "ssl-mode=sometimes\n",
                    &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "ssl-mode \"sometimes\" is not one of"), "%s", err);
        /* A value that does not look like a mode may be a secret pasted
         * in the wrong place: not echoed. */
        rc = kb_ini("migrate", NULL,
                    "[database]\nurl = mysql://u:p@127.0.0.1:1/x?"
                    "ssl-mode=s3cr3t=pw\n",
                    &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "ssl-mode is not one of"), "%s", err);
        cr_assert(not(has(err, "s3cr3t")), "%s", err);
}

Test(config_file, unset_variable_is_an_error)
{
        char *err;
        unsetenv("KINBOX_TEST_UNSET_VAR");
        int rc = kb_ini("run", "env -u KINBOX_TEST_UNSET_VAR",
                        "[database]\nurl = postgresql://kinbox:"
                        "${KINBOX_TEST_UNSET_VAR}@127.0.0.1:1/x\n",
                        &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "KINBOX_TEST_UNSET_VAR is not set"), "%s", err);
        /* group.id too: exit 2 at load, not 1 at run time */
        rc = kb_ini("migrate", "env -u KINBOX_TEST_UNSET_VAR",
                    DB "[consumer.c]\nhandler = points\ntopics = t\n"
                       "group.id = ${KINBOX_TEST_UNSET_VAR}\n",
                    &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "KINBOX_TEST_UNSET_VAR"), "%s", err);
}

Test(config_file, variable_defaults)
{
        char *err;
        /* The default is used when unset or empty: a bad default shows. */
        int rc = kb_ini("run", "env -u KB_T_BATCH",
                        DB "[consumer.c]\nhandler = points\ntopics = t\n"
                           "batch.max = ${KB_T_BATCH:-nine}\n",
                        &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "batch.max") && has(err, "\"nine\""), "%s", err);
        rc = kb_ini("run", "env KB_T_BATCH=",
                    DB "[consumer.c]\nhandler = points\ntopics = t\n"
                       "batch.max = ${KB_T_BATCH:-eight}\n",
                    &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "\"eight\""), "%s", err);
        /* A set variable wins over the default. */
        rc = kb_ini("run", "env KB_T_BATCH=seven",
                    DB "[consumer.c]\nhandler = points\ntopics = t\n"
                       "batch.max = ${KB_T_BATCH:-8}\n",
                    &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "\"seven\""), "%s", err);
        /* And a good default gets past the file (the database is next). */
        rc = kb_ini("run", "env -u KB_T_BATCH",
                    DB "[consumer.c]\nhandler = points\ntopics = t\n"
                       "batch.max = ${KB_T_BATCH:-8}\n",
                    &err);
        cr_assert(eq(int, rc, 3), "%s", err);
        /* An empty default (found by the INI fuzzer: UB on an empty copy) */
        rc = kb_ini("run", "env -u KB_T_BATCH",
                    DB "[consumer.c]\nhandler = points\ntopics = t\n"
                       "group.id = g${KB_T_BATCH:-}\n",
                    &err);
        cr_assert(eq(int, rc, 3), "%s", err);
}

Test(config_file, handler_outside_path_refused_before_loading)
{
        /* A module that would write a file from its constructor must never
         * be loaded: the name is refused first. */
        char dir[] = "/tmp/kinbox-evil-XXXXXX";
        cr_assert(mkdtemp(dir) != NULL);
        char sub[300], marker[300];
        snprintf(sub, sizeof(sub), "%s/handlers", dir);
        cr_assert(eq(int, mkdir(sub, 0700), 0));
        snprintf(marker, sizeof(marker), "%s/loaded", dir);
        char src[300], cmd[1200];
        snprintf(src, sizeof(src), "%s/evil.c", dir);
        FILE *fp = fopen(src, "w");
        fprintf(fp,
                "#include <stdio.h>\n"
                "__attribute__((constructor)) static void c(void) {\n"
                "  FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f); }\n",
                marker);
        fclose(fp);
        snprintf(cmd, sizeof(cmd), "cc -shared -fPIC -o %s/evil.so %s", dir,
                 src);
        cr_assert(eq(int, system(cmd), 0));
        static const char *const cmds[] = {"run", "migrate"};
        for (size_t i = 0; i < 2; i++) {
                char ini[1024], *err;
                snprintf(ini, sizeof(ini),
                         DB "[consumer.c]\nhandler = ../evil\n"
                            "handler.path = %s\ntopics = t\n",
                         sub);
                int rc = kb_ini(cmds[i], NULL, ini, &err);
                cr_assert(eq(int, rc, 2), "%s: %s", cmds[i], err);
                cr_assert(has(err, "\"../evil\" is not a handler name"), "%s",
                          err);
                cr_assert(has_no_file(marker), "%s loaded the module",
                          cmds[i]);
        }
        char ini[1024], *err;
        snprintf(ini, sizeof(ini),
                 DB "[relay]\nenabled = true\nmodules = ../evil\n");
        cr_assert(eq(int, kb_ini("run", NULL, ini, &err), 2), "%s", err);
        cr_assert(has_no_file(marker));
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        cr_assert(eq(int, system(cmd), 0));
}

/* Kafka's topic-name rule at load: a name no broker can have is refused
 * with the rule, not "does not exist" forever. */
Test(confval, topic_names)
{
        char e[512];
        cr_assert(
            eq(int,
               kinbox__confval_topics("topics", "a, b.c_d-1 ,,", e, sizeof(e)),
               0),
            "%s", e);
        static const char *const bad[] = {"bad topic", "a,b/c", "..",
                                          ".",         "^re.*", "caf\xc3\xa9"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                cr_assert(
                    eq(int,
                       kinbox__confval_topics("topics", bad[i], e, sizeof(e)),
                       -1),
                    "%s accepted", bad[i]);
                cr_assert(has(e, "is not a Kafka topic name"), "%s", e);
        }
        char longname[260];
        memset(longname, 'x', 250);
        longname[250] = '\0';
        cr_assert(eq(int,
                     kinbox__confval_topics("topics", longname, e, sizeof(e)),
                     -1));
        cr_assert(has(e, "250 characters"), "%s", e);
        longname[249] = '\0';
        cr_assert(eq(
            int, kinbox__confval_topics("topics", longname, e, sizeof(e)), 0));
        /* Through the configuration, and the kinbox command. */
        kinbox_conf_t *c = kinbox_conf_new();
        cr_assert(eq(int,
                     kinbox_conf_set(c, "topics", "bad topic", e, sizeof(e)),
                     KINBOX_ERR_INVALID));
        kinbox_conf_destroy(c);
        char *err;
        int rc =
            kb_ini("run", NULL,
                   DB "[consumer.p]\nhandler = points\ntopics = a b\n", &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, "\"a b\" is not a Kafka topic name"), "%s", err);
}

/* A [consumer.NAME] the INI reader would cut: an error naming the
 * limit, and a name at the limit works (it gets past the file). */
Test(config_file, long_consumer_name)
{
        char ini[1024], name[64], *err;
        memset(name, 'c', 41);
        name[41] = '\0';
        snprintf(ini, sizeof(ini),
                 DB "[consumer.%s]\nhandler = points\ntopics = a\n", name);
        int rc = kb_ini("run", NULL, ini, &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, ":5: [consumer.ccc") &&
                      has(err, "the consumer name is 41 characters long; at "
                               "most 40"),
                  "%s", err);
        name[40] = '\0';
        snprintf(ini, sizeof(ini),
                 DB "[consumer.%s]\nhandler = points\ntopics = a\n", name);
        rc = kb_ini("run", NULL, ini, &err);
        cr_assert(eq(int, rc, 3), "%s", err);
        /* A line the reader would cut. */
        char big[400];
        snprintf(big, sizeof(big),
                 DB "[consumer.p]\nhandler = points\n"
                    "topics = %0250d\n",
                 0);
        rc = kb_ini("run", NULL, big, &err);
        cr_assert(eq(int, rc, 2), "%s", err);
        cr_assert(has(err, ":7: line longer than 197 characters"), "%s", err);
}
