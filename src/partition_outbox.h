/*
 * partition_outbox.h -- the partitioned outbox's life (partition_outbox.c,
 * internal; outbox.layout = partitioned): made by kinbox migrate, kept by
 * the pruner.
 */
#ifndef KINBOX_PARTITION_OUTBOX_H
#define KINBOX_PARTITION_OUTBOX_H

#include "db.h"
#include "internal.h"
#include "kinbox/admin.h"
#include "partition.h"

#include <stdbool.h>
#include <stddef.h>

/* The pruner's outbox step, under the pruning lock: *partitioned false
 * when kinbox_outbox is the plain table (nothing done; the caller prunes
 * it by rows). Dry: nothing changed, the days that would be dropped and
 * those the database refuses yet logged (lg). Otherwise: complete interrupted
 * drops, drop the days past outbox.retention that the database allows
 * (partition_outbox.c: a refused day is logged and kept), create days
 * ahead, prune the catch-all by rows; deleted and dropped rows add to
 * res->outbox_rows. Errors: the database's, db->err set. */
int kinbox__outbox_partition_prune(kinbox__db_t *db, const kinbox_conf_t *conf,
                                   const kinbox__log_t *lg, bool dry,
                                   const volatile int *stop,
                                   kinbox_prune_result_t *res,
                                   bool *partitioned);

/* kinbox migrate, after the scripts: with outbox.layout = partitioned,
 * convert a plain kinbox_outbox (one locked copy; under the pruning
 * lock). *note: what was (dry: would be) done, "" for nothing; errstr set
 * on failure. A partitioned outbox is never made plain again. */
int kinbox__outbox_partition_apply(kinbox__db_t *db,
                                   const kinbox__settings_t *s, bool dry,
                                   char *note, size_t note_sz, char *errstr,
                                   size_t sz);

#endif
