/*
 * migrate.h -- the schema scripts compiled into the library.
 */
#ifndef KINBOX_MIGRATE_H
#define KINBOX_MIGRATE_H

#include <stddef.h>

struct kinbox__db;
struct kinbox_module;

typedef struct kinbox__migration {
        int backend; /* kinbox_backend_t */
        int version;
        const char *name;
        const char *sql;
} kinbox__migration_t;

/* Terminated by an entry with name == NULL. */
extern const kinbox__migration_t kinbox__migrations[];

/* The schema version contract on an open connection: kinbox's own
 * versions (all known recorded, none unknown) and, when mod is not NULL,
 * the module's. KINBOX_OK, KINBOX_ERR_SCHEMA (errstr says older or newer
 * and what to do) or the query's error. Used by the consumer and the relay
 * when they start; kinbox_schema_check() is the public form. */
int kinbox__schema_check_db(struct kinbox__db *db,
                            const struct kinbox_module *mod, char *errstr,
                            size_t sz);

#endif
