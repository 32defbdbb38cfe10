/*
 * cmd_reconcile.c -- `kinbox reconcile -c FILE [--json]`: the configured
 * modules' reconciliation checks, once (exit 1 on a discrepancy).
 */
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kinbox/kinbox.h>

#include "common.h"
#include "services.h"
#include "config.h"
#include "schema.h"

#define MAX_CHECKS 64

typedef struct report {
        bool json;
        json_t *arr;
} report_t;

static void
on_check(const kinbox_check_t *c, const kinbox_rows_t *rows, void *opaque)
{
        report_t *r = opaque;
        size_t n = kinbox_rows_count(rows);
        int nc = kinbox_rows_columns(rows);
        if (r->json) {
                json_t *jr = json_array();
                for (size_t i = 0; i < n; i++) {
                        json_t *o = json_object();
                        for (int k = 0; k < nc; k++) {
                                const char *v =
                                    kinbox_rows_value(rows, i, k, NULL);
                                const char *name =
                                    kinbox_rows_column_name(rows, k);
                                json_object_set_new(o, name ? name : "?",
                                                    v ? json_string(v)
                                                      : json_null());
                        }
                        json_array_append_new(jr, o);
                }
                json_array_append_new(
                    r->arr,
                    json_pack("{s:s, s:s, s:I, s:o}", "check", c->name,
                              "description",
                              c->description ? c->description : "",
                              "discrepancies", (json_int_t)n, "rows", jr));
                return;
        }
        printf("%-40s %s\n", c->name, n ? "DISCREPANCIES" : "ok");
        if (!n)
                return;
        if (c->description)
                printf("  %s\n", c->description);
        for (size_t i = 0; i < n; i++) {
                printf("  -");
                for (int k = 0; k < nc; k++) {
                        const char *v = kinbox_rows_value(rows, i, k, NULL);
                        const char *name = kinbox_rows_column_name(rows, k);
                        printf(" %s=%s", name ? name : "?", v ? v : "NULL");
                }
                printf("\n");
        }
}

int
kb_cmd_reconcile(int argc, char **argv)
{
        static const struct option opts[] = {
            {"config", required_argument, NULL, 'c'},
            {"json", no_argument, NULL, 'j'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0}};
        const char *path = NULL;
        report_t rep = {false, NULL};
        int ch;
        optind = 1;
        while ((ch = getopt_long(argc, argv, "c:jh", opts, NULL)) != -1) {
                switch (ch) {
                case 'c':
                        path = optarg;
                        break;
                case 'j':
                        rep.json = true;
                        break;
                case 'h':
                        kb_usage_of("reconcile", stdout);
                        return KB_EX_OK;
                default:
                        kb_usage_of("reconcile", stderr);
                        return KB_EX_USAGE;
                }
        }
        if (optind < argc) {
                fprintf(stderr,
                        "kinbox reconcile: unexpected argument \"%s\"\n",
                        argv[optind]);
                return KB_EX_USAGE;
        }
        if (!path) {
                fprintf(stderr, "kinbox reconcile: -c FILE is required\n");
                return KB_EX_USAGE;
        }
        kb_config_t cfg;
        char err[2048];
        int ex = kb_schema_load(path, &cfg, "reconcile", true);
        if (ex)
                return ex;
        const kinbox_check_t *checks[MAX_CHECKS];
        int n =
            kb_reconcile_checks(&cfg, checks, MAX_CHECKS, err, sizeof(err));
        if (n < 0) {
                fprintf(stderr, "kinbox reconcile: %s\n", err);
                kb_config_free(&cfg);
                return KB_EX_USAGE;
        }
        if (n == 0 && !rep.json)
                fprintf(stderr, "kinbox reconcile: the configured handlers "
                                "declare no reconciliation checks\n");
        if (rep.json)
                rep.arr = json_array();
        kinbox_reconcile_result_t res;
        kinbox_err_t rc =
            kinbox_reconcile(cfg.base, checks, (size_t)n, 0, on_check, &rep,
                             &res, err, sizeof(err));
        int status = KB_EX_OK;
        if (rc) {
                fprintf(stderr, "kinbox reconcile: %s\n", err);
                status = kb_exit_of(rc);
        } else if (res.discrepancies) {
                status = KB_EX_RUNTIME;
        }
        if (rep.json) {
                json_t *doc = json_pack(
                    "{s:o, s:I, s:b}", "checks", rep.arr, "discrepancies",
                    (json_int_t)res.discrepancies, "ok", status == KB_EX_OK);
                char *s = json_dumps(doc, JSON_INDENT(2));
                if (s)
                        puts(s);
                free(s);
                json_decref(doc);
        } else if (!rc) {
                printf("%d check(s), %llu discrepancy row(s)\n", res.checks,
                       (unsigned long long)res.discrepancies);
        }
        kb_config_free(&cfg);
        return status;
}
