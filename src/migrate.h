/*
 * migrate.h -- the schema scripts compiled into the library.
 */
#ifndef KINBOX_MIGRATE_H
#define KINBOX_MIGRATE_H

#include <stddef.h>

#include "db.h"

struct kinbox_module;

/* Terminated by an entry with name == NULL (kinbox__migration_t: db.h). */
extern const kinbox__migration_t kinbox__migrations[];

/* The embedded migrations of db's backend in order: the first after m
 * (NULL: the first of all); NULL after the last. */
const kinbox__migration_t *
kinbox__migration_next(const kinbox__db_t *db, const kinbox__migration_t *m);

/* The schema version contract on an open connection: kinbox's own
 * versions (all known recorded, none unknown) and, when mod is not NULL,
 * the module's. KINBOX_OK, KINBOX_ERR_SCHEMA (errstr says older or newer
 * and what to do) or the query's error. Used by the consumer and the relay
 * when they start; kinbox_schema_check() is the public form. */
int kinbox__schema_check_db(struct kinbox__db *db,
                            const struct kinbox_module *mod, char *errstr,
                            size_t sz);

#endif
