/*
 * migrate.h -- the schema scripts compiled into the library.
 */
#ifndef KINBOX_MIGRATE_H
#define KINBOX_MIGRATE_H

#include <stddef.h>

typedef struct kinbox__migration {
        int backend; /* kinbox_backend_t */
        int version;
        const char *name;
        const char *sql;
} kinbox__migration_t;

/* Terminated by an entry with name == NULL. */
extern const kinbox__migration_t kinbox__migrations[];

#endif
