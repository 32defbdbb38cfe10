/*
 * schema.c -- `kinbox migrate`, and the schema check every command that
 * touches a database runs first (schema.h).
 */
#include "schema.h"
#include "admin.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_MAX_MODS (KB_MAX_CONSUMERS + 16)

/* What a configuration names: its distinct databases (the first section
 * naming each) and its modules, each with the section it runs in. */
typedef struct targets {
        const kinbox_conf_t *db[KB_MAX_CONSUMERS + 2];
        char db_where[KB_MAX_CONSUMERS + 2][160];
        int ndb;
        const kinbox_module_t *mod[KB_MAX_MODS];
        const kinbox_conf_t *mod_conf[KB_MAX_MODS];
        const char *mod_kind[KB_MAX_MODS]; /* "handler" / "module" */
        int nmod;
} targets_t;

static void
add_db(targets_t *t, const kinbox_conf_t *conf, const char *where)
{
        const char *url = kinbox_conf_get(conf, "database.url");
        for (int i = 0; i < t->ndb; i++) {
                const char *u = kinbox_conf_get(t->db[i], "database.url");
                if (u && url && !strcmp(u, url))
                        return;
        }
        t->db[t->ndb] = conf;
        snprintf(t->db_where[t->ndb++], sizeof(t->db_where[0]), "%s", where);
}

static void
add_mod(targets_t *t, const kinbox_module_t *m, const kinbox_conf_t *conf,
        const char *kind)
{
        m = kb_schema_owner(m);
        const char *url = kinbox_conf_get(conf, "database.url");
        for (int i = 0; i < t->nmod; i++) { /* one module, one database */
                const char *u = kinbox_conf_get(t->mod_conf[i],
                                                "database.url");
                if (t->mod[i] == m && u && url && !strcmp(u, url))
                        return;
        }
        if (t->nmod < KB_MAX_MODS) {
                t->mod[t->nmod] = m;
                t->mod_conf[t->nmod] = conf;
                t->mod_kind[t->nmod++] = kind;
        }
}

/* Every database and module of cfg, found before anything touches a
 * database (a bad handler must not leave a half-migrated one). */
static int
targets_collect(kb_config_t *cfg, targets_t *t, const char *cmd)
{
        char err[2048];
        memset(t, 0, sizeof(*t));
        add_db(t, cfg->base, "[database]");
        for (int i = 0; i < cfg->nconsumers; i++) {
                const kinbox_conf_t *c = cfg->consumers[i].conf;
                char where[160];
                snprintf(where, sizeof(where), "[consumer.%s]",
                         cfg->consumers[i].name);
                add_db(t, c, where);
                const kinbox_module_t *m = find_module(c, err, sizeof(err));
                if (!m) {
                        fprintf(stderr, "kinbox %s: %s: %s\n", cmd, where, err);
                        return KB_EX_USAGE;
                }
                add_mod(t, m, c, "handler");
        }
        if (!cfg->relay)
                return KB_EX_OK;
        if (cfg->relay_enabled)
                add_db(t, cfg->relay, "[relay]");
        const char *rm = kinbox_conf_get(cfg->relay, "relay.modules");
        char list[512];
        snprintf(list, sizeof(list), "%s", rm ? rm : "");
        for (char *save = NULL, *tok = strtok_r(list, ", ", &save); tok;
             tok = strtok_r(NULL, ", ", &save)) {
                const kinbox_module_t *m =
                    find_module_named(cfg->relay, tok, err, sizeof(err));
                if (!m) {
                        fprintf(stderr, "kinbox %s: [relay]: %s\n", cmd, err);
                        return KB_EX_USAGE;
                }
                add_mod(t, m, cfg->relay, "module");
        }
        return KB_EX_OK;
}

static int
exit_of(kinbox_err_t rc)
{
        switch (rc) {
        case KINBOX_OK:
                return KB_EX_OK;
        case KINBOX_ERR_DB_CONN:
                return KB_EX_DB;
        case KINBOX_ERR_SCHEMA:
        case KINBOX_ERR_CONFIG:
        case KINBOX_ERR_INVALID:
                return KB_EX_USAGE;
        default:
                return KB_EX_RUNTIME;
        }
}

/* The section a conf's database was first named in, when cfg names more
 * than one database ("" otherwise). */
static const char *
db_label(const targets_t *t, const kinbox_conf_t *conf, char *b, size_t sz)
{
        b[0] = '\0';
        if (t->ndb < 2)
                return b;
        const char *url = kinbox_conf_get(conf, "database.url");
        for (int i = 0; i < t->ndb; i++) {
                const char *u = kinbox_conf_get(t->db[i], "database.url");
                if (u && url && !strcmp(u, url)) {
                        snprintf(b, sz, " (database of %s)", t->db_where[i]);
                        break;
                }
        }
        return b;
}

int
kb_schema_check_config(kb_config_t *cfg, const char *cmd)
{
        targets_t t;
        int ex = targets_collect(cfg, &t, cmd);
        char err[2048], lab[200];
        for (int i = 0; !ex && i < t.ndb; i++) {
                kinbox_err_t rc =
                    kinbox_schema_check(t.db[i], NULL, err, sizeof(err));
                if (rc) {
                        fprintf(stderr, "kinbox %s: %s: %s\n", cmd,
                                t.db_where[i], err);
                        ex = exit_of(rc);
                }
        }
        for (int i = 0; !ex && i < t.nmod; i++) {
                kinbox_err_t rc = kinbox_schema_check(t.mod_conf[i], t.mod[i],
                                                      err, sizeof(err));
                if (rc) {
                        fprintf(stderr, "kinbox %s: %s %s%s: %s\n", cmd,
                                t.mod_kind[i], t.mod[i]->name,
                                db_label(&t, t.mod_conf[i], lab, sizeof(lab)),
                                err);
                        ex = exit_of(rc);
                }
        }
        return ex;
}

/* ---------------------------------------------------------- migrate */

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

/* One component on one database; prints its steps and its state. */
static int
migrate_one(const kinbox_conf_t *conf, const kinbox_module_t *mod, int flags,
            const char *what, const char *where)
{
        char err[2048];
        report_t r = {.what = what};
        kinbox_err_t rc =
            kinbox_migrate_run(conf, mod, flags, on_step, &r, err, sizeof(err));
        if (rc) {
                fprintf(stderr, "kinbox migrate%s%s: %s\n", *where ? ":" : "",
                        where, err);
                return exit_of(rc);
        }
        if (!r.steps)
                printf("%s: up to date\n", what);
        else if (flags & KINBOX_MIGRATE_DRY_RUN)
                printf("%s: %d step(s) to apply (--dry-run: nothing "
                       "applied)\n",
                       what, r.steps);
        return KB_EX_OK;
}

void
kb_migrate_usage(FILE *fp)
{
        fprintf(fp,
                "usage: kinbox migrate -c FILE [--dry-run]\n\n"
                "Applies kinbox's schema (inbox, offsets, "
                "dead letters, outbox) to every database\n"
                "the configuration names ([database] url, "
                "each consumer's own database.url,\n"
                "the relay's) and each handler's and relay "
                "module's schema to its consumer's\n"
                "database, and prints each step it applied. "
                "Applied versions are recorded in\n"
                "kinbox_schema_migrations; running it again "
                "is harmless. A database whose schema\n"
                "was written by a newer kinbox is refused "
                "(exit 2), nothing applied.\n\n"
                "  -c, --config FILE  configuration file "
                "(INI)\n"
                "  -n, --dry-run      print what would be "
                "applied, apply nothing\n"
                "  -h, --help         this text\n");
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
                        kb_migrate_usage(ch == 'h' ? stdout : stderr);
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
        ex = targets_collect(&cfg, &t, "migrate");
        for (int i = 0; !ex && i < t.ndb; i++) {
                snprintf(what, sizeof(what), "kinbox schema%s",
                         db_label(&t, t.db[i], lab, sizeof(lab)));
                ex = migrate_one(t.db[i], NULL, flags, what, lab);
        }
        for (int i = 0; !ex && i < t.nmod; i++) {
                snprintf(what, sizeof(what), "%s %s schema%s", t.mod_kind[i],
                         t.mod[i]->name,
                         db_label(&t, t.mod_conf[i], lab, sizeof(lab)));
                ex = migrate_one(t.mod_conf[i], t.mod[i], flags, what, lab);
        }
        kb_config_free(&cfg);
        return ex;
}
