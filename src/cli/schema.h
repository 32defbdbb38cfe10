/*
 * schema.h -- `kinbox migrate` and the schema version contract of every
 * command: the databases and handler modules a configuration names, each
 * migrated or checked once.
 */
#ifndef KINBOX_CLI_SCHEMA_H
#define KINBOX_CLI_SCHEMA_H

#include <stdio.h>

#include "config.h"

/* `kinbox migrate -c FILE [--dry-run]`: argv[0] is the command. Migrates
 * every distinct database the configuration names ([database], each
 * consumer's own database.url, the relay's) and each handler's and relay
 * module's schema on its consumer's database, printing each step it
 * applied (or would apply). Returns the exit status. */
int kb_cmd_migrate(int argc, char **argv);
void kb_migrate_usage(FILE *fp);

/* The schema version contract for cfg: kinbox's schema on every database
 * it names, each consumer's handler and each relay module on theirs. 0, or
 * an exit status (KB_EX_USAGE: a schema older or newer than this binary;
 * KB_EX_DB: unreachable) with one line on stderr naming the section. */
int kb_schema_check_config(kb_config_t *cfg, const char *cmd);

#endif
