/*
 * schema.h -- the schema version contract of every
 * command: the databases and handler modules a configuration names, each
 * migrated or checked once.
 */
#ifndef KINBOX_CLI_SCHEMA_H
#define KINBOX_CLI_SCHEMA_H

#include <stdbool.h>
#include <stdio.h>

#include <kinbox/kinbox.h>

#include "config.h"

/* The schema version contract for cfg: kinbox's schema on every database
 * it names, each consumer's handler and each relay module on theirs. 0, or
 * an exit status (KB_EX_USAGE: a schema older or newer than this binary, or
 * with handlers a handler that does not load; KB_EX_DB: unreachable) with
 * one line on stderr naming the section. Without handlers (the read-only
 * operator commands) a consumer whose handler is not configured or does
 * not load here (it runs in a program embedding the library) is checked
 * for kinbox's schema only. */
int kb_schema_check_config(kb_config_t *cfg, const char *cmd, bool handlers);

/* Load the configuration at path for command cmd and run
 * kb_schema_check_config() on it: how every command that reads or writes
 * kinbox's tables loads its configuration (`run`, the operator commands
 * through ctx_open(), `prune`, `reconcile`); only `migrate`, which changes
 * the schema, loads without it. 0 with *cfg loaded, or the exit status
 * (printed on stderr; *cfg freed). Not thread-safe (getenv, module
 * loading). */
int kb_schema_load(const char *path, kb_config_t *cfg, const char *cmd,
                   bool handlers);

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
/* Collect what cfg names into t; an exit status (printed as "kinbox
 * CMD: ..."). Without handlers, consumer handlers that do not load are
 * left out (kb_schema_check_config()). */
int kb_schema_targets(kb_config_t *cfg, targets_t *t, const char *cmd,
                      bool handlers);
/* " (database of SECTION)" for conf's database when t names several,
 * else ""; in b. */
const char *kb_schema_db_label(const targets_t *t, const kinbox_conf_t *conf,
                               char *b, size_t sz);

#endif
