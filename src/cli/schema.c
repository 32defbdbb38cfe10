/*
 * schema.c -- what a configuration names (databases, modules) and the
 * schema check every command that touches a database runs first
 * (schema.h); `kinbox migrate` is cmd_migrate.c.
 */
#include "schema.h"
#include "common.h"
#include "internal.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void
add_db(targets_t *t, const kinbox_conf_t *conf, const char *where)
{
        const char *url = kinbox__settings_of(conf)->database_url;
        for (int i = 0; i < t->ndb; i++) {
                const char *u = kinbox__settings_of(t->db[i])->database_url;
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
        const char *url = kinbox__settings_of(conf)->database_url;
        for (int i = 0; i < t->nmod; i++) { /* one module, one database */
                const char *u =
                    kinbox__settings_of(t->mod_conf[i])->database_url;
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
int
kb_schema_targets(kb_config_t *cfg, targets_t *t, const char *cmd,
                  bool handlers)
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
                if (!m && !handlers)
                        continue; /* embedded: its program checks it */
                if (!m) {
                        fprintf(stderr, "kinbox %s: %s: %s\n", cmd, where,
                                err);
                        return KB_EX_USAGE;
                }
                add_mod(t, m, c, "handler");
        }
        if (!cfg->relay)
                return KB_EX_OK;
        if (cfg->relay_enabled)
                add_db(t, cfg->relay, "[relay]");
        const char *rm = kinbox__settings_of(cfg->relay)->relay_modules;
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

/* The section a conf's database was first named in, when cfg names more
 * than one database ("" otherwise). */
const char *
kb_schema_db_label(const targets_t *t, const kinbox_conf_t *conf, char *b,
                   size_t sz)
{
        b[0] = '\0';
        if (t->ndb < 2)
                return b;
        const char *url = kinbox__settings_of(conf)->database_url;
        for (int i = 0; i < t->ndb; i++) {
                const char *u = kinbox__settings_of(t->db[i])->database_url;
                if (u && url && !strcmp(u, url)) {
                        snprintf(b, sz, " (database of %s)", t->db_where[i]);
                        break;
                }
        }
        return b;
}

int
kb_schema_check_config(kb_config_t *cfg, const char *cmd, bool handlers)
{
        targets_t t;
        int ex = kb_schema_targets(cfg, &t, cmd, handlers);
        char err[2048], lab[200];
        for (int i = 0; !ex && i < t.ndb; i++) {
                ex = kb_db_reachable(t.db[i], cmd, t.db_where[i]);
                if (ex)
                        break;
                kinbox_err_t rc =
                    kinbox_schema_check(t.db[i], NULL, err, sizeof(err));
                if (rc) {
                        fprintf(stderr, "kinbox %s: %s: %s%s\n", cmd,
                                t.db_where[i],
                                rc == KINBOX_ERR_DB_CONN
                                    ? "database unreachable: "
                                    : "",
                                err);
                        ex = kb_exit_of(rc);
                }
        }
        for (int i = 0; !ex && i < t.nmod; i++) {
                kinbox_err_t rc = kinbox_schema_check(t.mod_conf[i], t.mod[i],
                                                      err, sizeof(err));
                if (rc) {
                        fprintf(stderr, "kinbox %s: %s %s%s: %s\n", cmd,
                                t.mod_kind[i], t.mod[i]->name,
                                kb_schema_db_label(&t, t.mod_conf[i], lab,
                                                   sizeof(lab)),
                                err);
                        ex = kb_exit_of(rc);
                }
        }
        return ex;
}

int
kb_schema_load(const char *path, kb_config_t *cfg, const char *cmd,
               bool handlers)
{
        char err[2048];
        if (kb_config_load(path, cfg, err, sizeof(err))) {
                fprintf(stderr, "kinbox %s: %s\n", cmd, err);
                return KB_EX_USAGE;
        }
        int ex = kb_schema_check_config(cfg, cmd, handlers);
        if (ex)
                kb_config_free(cfg);
        return ex;
}
