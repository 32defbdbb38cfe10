/**
 * @file kinbox.h
 * @brief kinbox: exactly-once effect for Kafka consumers on their own
 *        database (inbox), and a transactional outbox with a relay.
 *
 * Include this umbrella header; link with `pkg-config --libs kinbox`.
 */
#ifndef KINBOX_H
#define KINBOX_H

#include "export.h"
#include "version.h"
#include "error.h"
#include "conf.h"
#include "handler.h"
#include "consumer.h"
#include "outbox.h"
#include "module.h"
#include "admin.h"

KINBOX_BEGIN_DECLS

/** @brief The library's version string, e.g. "0.1.0". Thread-safe. */
KINBOX_API const char *kinbox_version(void);

/** @brief The library's version as KINBOX_VERSION_NUM. Thread-safe. */
KINBOX_API int kinbox_version_num(void);

/**
 * @brief Apply kinbox's own schema (inbox, offsets, dead letters, outbox) to
 *        the database of `database.url`, versioned and idempotent.
 *
 * Applied versions are recorded in `kinbox_schema_migrations`; a version
 * already recorded is skipped, so running it again (or from two processes)
 * is harmless.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN when the database is
 *          unreachable; ::KINBOX_ERR_DB when a script fails (errstr names it).
 * @remark Thread-safe (opens its own connection).
 */
KINBOX_API kinbox_err_t kinbox_migrate(const kinbox_conf_t *conf, char *errstr,
                                       size_t errstr_size);

/**
 * @brief Apply a handler module's schema for the configured backend,
 *        recorded as (module name, schema_version).
 * @returns As kinbox_migrate().
 */
KINBOX_API kinbox_err_t kinbox_migrate_module(const kinbox_conf_t *conf,
                                              const kinbox_module_t *mod,
                                              char *errstr,
                                              size_t errstr_size);

KINBOX_END_DECLS

#endif
