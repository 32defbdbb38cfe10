/*
 * admin.h -- the operator commands of `kinbox` (status, dead, outbox,
 * verify, prune) and the operations side of `kinbox run` (retention check,
 * pruner thread, metrics endpoint).
 */
#ifndef KINBOX_CLI_ADMIN_H
#define KINBOX_CLI_ADMIN_H

#include <kinbox/kinbox.h>
#include <stdio.h>

#include "config.h"

/* Exit status of every command. */
#define KB_EX_OK 0
#define KB_EX_RUNTIME 1 /* runtime failure; verify: a gap was found */
#define KB_EX_USAGE 2 /* usage or configuration error */
#define KB_EX_DB 3 /* database unreachable */
#define KB_EX_NOTFOUND 4 /* no such id / destination */

/* In main.c: the handler module configured for a consumer; a module by
 * name (built in, or handler.path/NAME.so). */
const kinbox_module_t *find_module(const kinbox_conf_t *conf, char *err,
                                   size_t sz);
const kinbox_module_t *find_module_named(const kinbox_conf_t *conf,
                                         const char *name, char *err,
                                         size_t sz);

/* The module whose name records m's schema: the first built-in with the
 * same schema (points-single is the points handler per message: one
 * schema, recorded as points); m itself otherwise. */
const kinbox_module_t *kb_schema_owner(const kinbox_module_t *m);

/* "5m", "30s", "2h", "1d", "500ms"; bare numbers are seconds. 0 or -1. */
int kb_duration_ms(const char *s, int64_t *ms);

/* `kinbox status|dead|outbox|verify|prune ...`: argv[0] is the command. */
int kb_cmd_status(int argc, char **argv);
int kb_cmd_dead(int argc, char **argv);
int kb_cmd_outbox(int argc, char **argv);
int kb_cmd_verify(int argc, char **argv);
int kb_cmd_prune(int argc, char **argv);
/* `kinbox reconcile` (reconcile.c). */
int kb_cmd_reconcile(int argc, char **argv);
/* The reconciliation checks of cfg's modules (consumers' handlers, then
 * relay.modules), each module once, into out (max entries). Returns their
 * number, or -1 with err (a module that cannot be loaded). */
int kb_reconcile_checks(kb_config_t *cfg, const kinbox_check_t **out,
                        size_t max, char *err, size_t sz);
/* `kinbox run`: a thread running the checks every reconcile.interval with
 * the database lock (one replica). NULL with err "" when there is nothing
 * to run (no checks, interval 0); NULL with err set on failure. */
typedef struct kb_reconciler kb_reconciler_t;
kb_reconciler_t *kb_reconciler_start(kb_config_t *cfg, char *err, size_t sz);
void kb_reconciler_stop(kb_reconciler_t *r);
/* `kinbox config-reference [--man] [--output FILE]` (manpage.c). */
int kb_cmd_config_reference(int argc, char **argv);
/* Help text of those commands; 0 when cmd is not one of them. */
int kb_admin_usage(const char *cmd, FILE *fp);

/* `kinbox run` and `kinbox prune`: the retention check of every consumer
 * and of the shared settings the pruner uses (inbox.retention must exceed
 * the redelivery window); prints the refusal as "kinbox CMD: ..." and
 * returns an exit status (KB_EX_USAGE on refusal). Then the pruner thread
 * and the metrics endpoint of `kinbox run` (kb_ops_start/stop). */
int kb_retention_check(kb_config_t *cfg, const char *cmd);
typedef struct kb_ops kb_ops_t;
kb_ops_t *kb_ops_start(kb_config_t *cfg, char *err, size_t sz);
void kb_ops_stop(kb_ops_t *ops);

#endif
