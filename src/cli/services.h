/*
 * services.h -- the services `kinbox run` starts beside its consumers (services.c:
 * retention check, pruner thread, metrics endpoint; reconcile.c: the
 * reconciliation checks and their thread), also used by `kinbox prune`
 * and `kinbox reconcile`.
 */
#ifndef KINBOX_CLI_SERVICES_H
#define KINBOX_CLI_SERVICES_H

#include <kinbox/kinbox.h>

#include "config.h"

/* `kinbox run` and `kinbox prune`: the retention check of every consumer
 * and of the shared settings the pruner uses (inbox.retention must exceed
 * the redelivery window); prints the refusal as "kinbox CMD: ..." and
 * returns an exit status (KB_EX_USAGE on refusal). */
int kb_retention_check(kb_config_t *cfg, const char *cmd);

/* The pruner thread and the metrics endpoint of `kinbox run`. */
typedef struct kb_services kb_services_t;
kb_services_t *kb_services_start(kb_config_t *cfg, char *err, size_t sz);
void kb_services_stop(kb_services_t *svc);

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

#endif
