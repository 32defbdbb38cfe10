/*
 * dashboard_test.c -- the Grafana dashboard and the Prometheus alert rules
 * (dist/) against what /metrics really exports: the exposition the library
 * renders (kinbox__metrics_render(), the body of /metrics) declares every
 * family with # TYPE. Every kinbox_* name in the dashboard's queries and in
 * the rules must be one of them (histograms: _bucket/_sum/_count), and
 * every exported family has a panel. Then `promtool check rules` and
 * `promtool test rules` (tests/alerts_test.yml: a case for every alert).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#include "harness.h"
#include "metrics.h" /* internal: the body of /metrics */

#ifndef KINBOX_SOURCE_DIR
#error "KINBOX_SOURCE_DIR must be defined"
#endif

#define MAXN 128

typedef struct names {
        char n[MAXN][96];
        char type[MAXN][16];
        int count;
} names_t;

/* Families of the exposition: "# TYPE name type". */
static void
exported(names_t *ex)
{
        char *body = kinbox__metrics_render();
        cr_assert(body != NULL);
        ex->count = 0;
        for (const char *p = strstr(body, "# TYPE "); p;
             p = strstr(p + 1, "# TYPE ")) {
                cr_assert(ex->count < MAXN);
                cr_assert(sscanf(p + 7, "%95s %15s", ex->n[ex->count],
                                 ex->type[ex->count]) == 2);
                ex->count++;
        }
        free(body);
        cr_assert(ex->count >= 20, "only %d families exported", ex->count);
}

/* The family a series name belongs to, or -1. */
static int
family_of(const names_t *ex, const char *name)
{
        for (int i = 0; i < ex->count; i++) {
                size_t l = strlen(ex->n[i]);
                if (!strcmp(name, ex->n[i]))
                        return i;
                if (!strcmp(ex->type[i], "histogram") &&
                    !strncmp(name, ex->n[i], l) &&
                    (!strcmp(name + l, "_bucket") ||
                     !strcmp(name + l, "_sum") || !strcmp(name + l, "_count")))
                        return i;
        }
        return -1;
}

/* Check every kinbox_* identifier of text; mark the families used. */
static void
check_names(const names_t *ex, const char *text, const char *where, bool *used)
{
        for (const char *p = strstr(text, "kinbox_"); p;
             p = strstr(p + 1, "kinbox_")) {
                if (p > text &&
                    (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
                        continue;
                char name[96];
                size_t n = 0;
                while ((isalnum((unsigned char)p[n]) || p[n] == '_') &&
                       n + 1 < sizeof(name)) {
                        name[n] = p[n];
                        n++;
                }
                name[n] = '\0';
                int f = family_of(ex, name);
                cr_assert(f >= 0, "%s uses %s, which /metrics does not export",
                          where, name);
                if (used)
                        used[f] = true;
        }
}

static void
walk_exprs(json_t *j, const names_t *ex, bool *used, int *nexpr)
{
        if (json_is_object(j)) {
                const char *k;
                json_t *v;
                json_object_foreach(j, k, v)
                {
                        if (!strcmp(k, "expr") && json_is_string(v)) {
                                check_names(ex, json_string_value(v),
                                            "the dashboard", used);
                                (*nexpr)++;
                        } else {
                                walk_exprs(v, ex, used, nexpr);
                        }
                }
        } else if (json_is_array(j)) {
                size_t i;
                json_t *v;
                json_array_foreach(j, i, v) walk_exprs(v, ex, used, nexpr);
        }
}

Test(dashboard, queries_use_exported_metrics_and_cover_them)
{
        names_t ex;
        exported(&ex);
        json_error_t je;
        json_t *d = json_load_file(
            KINBOX_SOURCE_DIR "/dist/grafana/kinbox-dashboard.json", 0, &je);
        cr_assert(d != NULL, "dashboard is not JSON: %s (line %d)", je.text,
                  je.line);
        bool used[MAXN] = {false};
        int nexpr = 0;
        walk_exprs(d, &ex, used, &nexpr);
        cr_assert(nexpr >= 15, "only %d queries in the dashboard", nexpr);
        for (int i = 0; i < ex.count; i++)
                cr_assert(used[i], "no dashboard panel shows %s", ex.n[i]);
        json_decref(d);
}

static char *
slurp(const char *path)
{
        char *s = kt_slurp(path);
        cr_assert(s != NULL, "cannot open %s", path);
        return s;
}

Test(dashboard, alert_rules_use_exported_metrics)
{
        names_t ex;
        exported(&ex);
        char *rules =
            slurp(KINBOX_SOURCE_DIR "/dist/prometheus/kinbox-alerts.yml");
        /* The expressions only: a runbook may name other things. */
        int nexpr = 0;
        for (char *p = strstr(rules, "expr:"); p; p = strstr(p + 1, "expr:")) {
                char *e = strstr(p, "labels:"), *f = strstr(p, "for:");
                if (f && (!e || f < e))
                        e = f;
                cr_assert(e != NULL);
                char save = *e;
                *e = '\0';
                check_names(&ex, p, "an expr of kinbox-alerts.yml", NULL);
                *e = save;
                nexpr++;
        }
        cr_assert(nexpr >= 10, "only %d expressions found", nexpr);
        free(rules);
}

/* Run a shell command; its output goes to the test log on failure. */
static void
run_ok(const char *cmd)
{
        char full[2048];
        snprintf(full, sizeof(full), "%s 2>&1", cmd);
        FILE *p = popen(full, "r");
        cr_assert(p != NULL);
        static char out[65536];
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        int st = pclose(p);
        cr_assert(st == 0, "%s failed (status %d):\n%s", cmd, st, out);
}

Test(dashboard, promtool_checks_and_tests_every_alert)
{
        cr_assert(system("command -v promtool >/dev/null") == 0,
                  "promtool is missing: install Debian's prometheus package "
                  "(scripts/setup)");
        run_ok("promtool check rules " KINBOX_SOURCE_DIR
               "/dist/prometheus/kinbox-alerts.yml");
        /* Every alert has a case in the unit tests. */
        char *rules =
            slurp(KINBOX_SOURCE_DIR "/dist/prometheus/kinbox-alerts.yml");
        char *tests = slurp(KINBOX_SOURCE_DIR "/tests/alerts_test.yml");
        int nalerts = 0;
        for (const char *p = strstr(rules, "- alert: "); p;
             p = strstr(p + 1, "- alert: ")) {
                char name[128], want[160];
                cr_assert(sscanf(p + 9, "%127s", name) == 1);
                snprintf(want, sizeof(want), "alertname: %s\n", name);
                cr_assert(strstr(tests, want) != NULL,
                          "tests/alerts_test.yml has no case for %s "
                          "(scripts/gen-alert-tests)",
                          name);
                nalerts++;
        }
        cr_assert(nalerts >= 10, "only %d alerts found", nalerts);
        free(rules);
        free(tests);
        run_ok("cd " KINBOX_SOURCE_DIR "/tests && promtool test rules "
               "alerts_test.yml");
}
