/*
 * cmd_migrate.c -- `kinbox migrate [--dry-run]`: kinbox's schema on every
 * database the configuration names, each module's on its consumer's.
 */
#include "common.h"
#include "relay_log.h"
#include "schema.h"
#include "settings.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct report {
        const char *what; /* "kinbox schema (database of ...)" */
        int steps;
} report_t;

static void
on_step(const char *component, int version, const char *name, int applied,
        void *opaque)
{
        report_t *r = opaque;
        (void)component;
        r->steps++;
        if (!strcmp(name, "schema"))
                printf("%s: %s version %d\n", r->what,
                       applied ? "applied" : "would apply", version);
        else
                printf("%s: %s %s\n", r->what,
                       applied ? "applied" : "would apply", name);
}

/* relay.source = wal | binlog: the server's prerequisites (and the slot,
 * made now so the log keeps every event from here on). */
static int
check_relay_source(const kb_config_t *cfg)
{
        if (!cfg->relay_enabled ||
            kinbox__settings_of(cfg->relay)->relay_source ==
                KINBOX__SOURCE_POLL)
                return KB_EX_OK;
        char err[1024];
        int rc = kinbox__relay_log_check(cfg->relay, err, sizeof(err));
        if (!rc)
                return KB_EX_OK;
        fprintf(stderr, "kinbox migrate: %s\n", err);
        /* STATE: the source could not be opened (its slot is another
         * reader's): the database's side, as the relay counts it. */
        return rc == KINBOX_ERR_STATE ? KB_EX_DB : kb_exit_of(rc);
}

/* One component on one database; prints its steps and its state. */
static int
migrate_one(const kinbox_conf_t *conf, const kinbox_module_t *mod, int flags,
            const char *what, const char *where)
{
        char err[2048];
        report_t r = {.what = what};
        kinbox_err_t rc = kinbox_migrate_run(conf, mod, flags, on_step, &r,
                                             err, sizeof(err));
        if (rc) {
                fprintf(stderr, "kinbox migrate%s%s: %s\n", *where ? ":" : "",
                        where, err);
                return kb_exit_of(rc);
        }
        if (!r.steps)
                printf("%s: up to date\n", what);
        else if (flags & KINBOX_MIGRATE_DRY_RUN)
                printf("%s: %d step(s) to apply (--dry-run: nothing "
                       "applied)\n",
                       what, r.steps);
        return KB_EX_OK;
}

static int
migrate_args(int argc, char **argv, const char **path, int *flags)
{
        static const struct option opts[] = {
            {"config", required_argument, NULL, 'c'},
            {"dry-run", no_argument, NULL, 'n'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0}};
        int ch;
        optind = 1;
        while ((ch = getopt_long(argc, argv, "c:nh", opts, NULL)) != -1) {
                if (ch == 'c') {
                        *path = optarg;
                } else if (ch == 'n') {
                        *flags |= KINBOX_MIGRATE_DRY_RUN;
                } else {
                        kb_usage_cmd("migrate", ch == 'h' ? stdout : stderr);
                        return ch == 'h' ? -1 : KB_EX_USAGE;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "kinbox migrate: unexpected argument \"%s\"\n",
                        argv[optind]);
                return KB_EX_USAGE;
        }
        if (!*path) {
                fprintf(stderr, "kinbox migrate: -c FILE is required\n");
                return KB_EX_USAGE;
        }
        return KB_EX_OK;
}

int
kb_cmd_migrate(int argc, char **argv)
{
        const char *path = NULL;
        int flags = 0, ex = migrate_args(argc, argv, &path, &flags);
        if (ex)
                return ex < 0 ? KB_EX_OK : ex;
        kb_config_t cfg;
        char err[2048], what[300], lab[200];
        if (kb_config_load(path, &cfg, err, sizeof(err))) {
                fprintf(stderr, "kinbox migrate: %s\n", err);
                return KB_EX_USAGE;
        }
        targets_t t;
        ex = kb_schema_targets(&cfg, &t, "migrate", true);
        for (int i = 0; !ex && i < t.ndb; i++)
                ex = kb_db_reachable(t.db[i], "migrate", t.db_where[i]);
        for (int i = 0; !ex && i < t.ndb; i++) {
                snprintf(what, sizeof(what), "kinbox schema%s",
                         kb_schema_db_label(&t, t.db[i], lab, sizeof(lab)));
                ex = migrate_one(t.db[i], NULL, flags, what, lab);
        }
        for (int i = 0; !ex && i < t.nmod; i++) {
                snprintf(
                    what, sizeof(what), "%s %s schema%s", t.mod_kind[i],
                    t.mod[i]->name,
                    kb_schema_db_label(&t, t.mod_conf[i], lab, sizeof(lab)));
                ex = migrate_one(t.mod_conf[i], t.mod[i], flags, what, lab);
        }
        if (!ex && !(flags & KINBOX_MIGRATE_DRY_RUN))
                ex = check_relay_source(&cfg);
        kb_config_free(&cfg);
        return ex;
}
