/*
 * partition.h -- the partitioned inbox's life (partition.c, internal):
 * made by kinbox migrate, kept by the pruner, checked by consumers.
 */
#ifndef KINBOX_PARTITION_H
#define KINBOX_PARTITION_H

#include "db.h"
#include "internal.h"
#include "kinbox/admin.h"

#include <stdbool.h>
#include <stddef.h>

/* Consumer start: the database's layout (into db), KINBOX_ERR_SCHEMA
 * when the configuration asks for partitions it does not have, and
 * KINBOX_ERR_CONFIG (errstr with the number) when it needs more than
 * 8,192 partitions (retention and ahead in ranges of the width). */
int kinbox__partition_check(kinbox__db_t *db, const kinbox__settings_t *s,
                            char *errstr, size_t sz);

/* The pruner's single-instance lock (PostgreSQL advisory lock, MySQL
 * GET_LOCK) on db's session: up to tries attempts 100 ms apart; *locked
 * whether it was taken. Held by kinbox_prune() and by a conversion. */
int kinbox__prune_lock(kinbox__db_t *db, int tries, bool *locked);
void kinbox__prune_unlock(kinbox__db_t *db);

/* The pruner's inbox step for a partitioned inbox, under the pruning lock
 * (dry: count only): finish interrupted drops, drop ranges past the
 * retention, create ranges ahead, prune the catch-all, set the gauges.
 * *partitioned false: the inbox is plain, nothing done. */
int kinbox__partition_prune(kinbox__db_t *db, const kinbox__settings_t *s,
                            const kinbox__log_t *lg, bool dry,
                            const volatile int *stop,
                            kinbox_prune_result_t *res, bool *partitioned);

/* The layout settings alone, before kinbox migrate touches anything
 * (inbox.layout = partitioned; KINBOX_OK otherwise): skew under half the
 * width, at most 8,192 partitions. KINBOX_ERR_CONFIG with errstr. */
int kinbox__partition_settings_check(const kinbox__settings_t *s, char *errstr,
                                     size_t sz);

/* kinbox migrate, after the scripts: with inbox.layout = partitioned,
 * convert a plain inbox (online: mirror, copy, swap) or check that a
 * partitioned one has the configured width. *note: what was (dry: would
 * be) done, "" for nothing. */
int kinbox__partition_apply(kinbox__db_t *db, const kinbox__settings_t *s,
                            bool dry, char *note, size_t note_sz, char *errstr,
                            size_t sz);

#endif
