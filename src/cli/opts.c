/*
 * opts.c -- the operator commands' options: the declarative option set of
 * opts_t (parse_opts() takes the letters a command accepts), ids,
 * durations and the subcommand of `kinbox CMD SUB ...`.
 */
#include "common.h"
#include "confval.h"
#include "internal.h"

#include <getopt.h>
#include <limits.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every option of the operator commands; parse_opts() takes the ones a
 * command allows. */
static const struct option lo[] = {
    {"config", required_argument, NULL, 'c'},
    {"json", no_argument, NULL, 'j'},
    {"dry-run", no_argument, NULL, 'n'},
    {"wait", no_argument, NULL, 'w'},
    {"consumer", required_argument, NULL, 'C'},
    {"status", required_argument, NULL, 's'},
    {"destination", required_argument, NULL, 'd'},
    {"older-than", required_argument, NULL, 'o'},
    {"limit", required_argument, NULL, 'l'},
    {"after", required_argument, NULL, 'a'},
    {"since", required_argument, NULL, 'S'},
    {"topic", required_argument, NULL, 'T'},
    {"partition", required_argument, NULL, 'P'},
    {"to", required_argument, NULL, 't'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

/* An option's number: 0, or -1 with what was expected printed. */
static int
number_opt(const opts_t *o, const char *name, const char *arg, int64_t min,
           int64_t max, const char *expected, int64_t *out)
{
        int64_t v = 0;
        if (kinbox__parse_i64_all(arg, &v) || v < min || v > max) {
                fprintf(stderr, "kinbox %s: --%s \"%s\": expected %s\n",
                        o->cmd, name, arg, expected);
                return -1;
        }
        *out = v;
        return 0;
}

/* The options with a number or a name of `kinbox offsets`, `dead list`
 * and `outbox list`; 0 or -1 (printed). */
static int
value_opt(opts_t *o, int ch, const char *arg)
{
        int64_t v = 0;
        switch (ch) {
        case 'T':
                o->topic = arg;
                return 0;
        case 't':
                o->to = arg;
                return 0;
        case 'P':
                if (number_opt(o, "partition", arg, 0, INT32_MAX,
                               "a partition number", &v))
                        return -1;
                o->partition = (int32_t)v;
                return 0;
        case 'l':
                if (number_opt(o, "limit", arg, 1, LONG_MAX,
                               "a positive number", &v))
                        return -1;
                o->limit = (long)v;
                return 0;
        default: /* 'a' */
                return number_opt(o, "after", arg, 0, INT64_MAX, "an id",
                                  &o->after);
        }
}

/* A flag or an option with text; 1 when ch is neither. */
static int
text_opt(opts_t *o, int ch, const char *arg)
{
        switch (ch) {
        case 'c':
                o->config = arg;
                break;
        case 'j':
                o->json = true;
                break;
        case 'n':
                o->dry_run = true;
                break;
        case 'w':
                o->wait = true;
                break;
        case 'C':
                o->consumer = arg;
                break;
        case 's':
                o->status = arg;
                break;
        case 'd':
                o->destination = arg;
                break;
        case 'o':
                o->older_than = arg;
                break;
        case 'S':
                o->since = arg;
                break;
        default:
                return 1;
        }
        return 0;
}

/* The positional arguments after the options (getopt permuted them). */
static int
positional(int argc, char **argv, opts_t *o)
{
        for (int i = optind; i < argc; i++) {
                if (o->nargs == 4) {
                        fprintf(stderr, "kinbox %s: too many arguments\n",
                                o->cmd);
                        return -1;
                }
                o->args[o->nargs++] = argv[i];
        }
        if (!o->config) {
                fprintf(stderr, "kinbox %s: -c FILE is required\n", o->cmd);
                return -1;
        }
        return 0;
}

int
parse_opts(int argc, char **argv, opts_t *o, const char *allowed)
{
        o->limit = 100;
        o->partition = -1;
        optind = 1;
        opterr = 0;
        int ch;
        while ((ch = getopt_long(argc, argv, "c:h", lo, NULL)) != -1) {
                if (ch == 'h') {
                        kb_usage_of(o->cmd, stdout);
                        exit(KB_EX_OK);
                }
                if (ch == '?' || ch == ':' ||
                    (ch != 'c' && !strchr(allowed, ch))) {
                        const char *bad = argv[optind - 1];
                        fprintf(stderr,
                                "kinbox %s: unknown or misplaced "
                                "option \"%s\"\n\n",
                                o->cmd, bad);
                        kb_usage_of(o->cmd, stderr);
                        return -1;
                }
                if (text_opt(o, ch, optarg) && value_opt(o, ch, optarg))
                        return -1;
        }
        return positional(argc, argv, o);
}

int
parse_id(const opts_t *o, const char *s, int64_t *id)
{
        int64_t v = 0;
        if (kinbox__parse_i64_all(s, &v) || v <= 0) {
                fprintf(stderr, "kinbox %s: \"%s\" is not an id\n", o->cmd,
                        s ? s : "");
                return -1;
        }
        *id = v;
        return 0;
}

/* 5m, 30s, 2h, 1d, 500ms; bare numbers are seconds. */
int
parse_duration_ms(const char *s, int64_t *ms)
{
        return kinbox__confval_duration("duration", s, 0, INT64_MAX, ms, NULL,
                                        0);
}

int
kb_duration_ms(const char *s, int64_t *ms)
{
        return parse_duration_ms(s, ms);
}

/*
 * The subcommand of `kinbox CMD SUB ...`: its 1-based index in subs
 * (NULL-terminated), or 0 with *exitp set: help shown, or a usage error
 * naming what was expected.
 */
int
subcommand(const char *cmd, int argc, char **argv, const char *const *subs,
           int *exitp)
{
        if (argc >= 2 &&
            (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
                kb_usage_of(cmd, stdout);
                *exitp = KB_EX_OK;
                return 0;
        }
        if (argc >= 2 && argv[1][0] != '-') {
                for (int i = 0; subs[i]; i++)
                        if (!strcmp(argv[1], subs[i]))
                                return i + 1;
                fprintf(stderr, "kinbox %s: unknown subcommand \"%s\"\n\n",
                        cmd, argv[1]);
        } else {
                fprintf(stderr, "kinbox %s: expected", cmd);
                for (int i = 0; subs[i]; i++)
                        fprintf(stderr, "%s %s",
                                !i            ? ""
                                : subs[i + 1] ? ","
                                              : " or",
                                subs[i]);
                fprintf(stderr, "\n\n");
        }
        kb_usage_of(cmd, stderr);
        *exitp = KB_EX_USAGE;
        return 0;
}
