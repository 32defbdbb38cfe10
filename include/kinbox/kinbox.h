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
#include "trace.h"
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
 * already recorded is skipped, so running it again is harmless. Migrations
 * of one database run one at a time: a second process waits for the
 * first one's database lock (`pg_advisory_lock` / `GET_LOCK`, on its
 * connection; up to 10 minutes on MySQL), then finds the steps applied.
 * Same as kinbox_migrate_run(conf, NULL, 0, NULL, NULL, ...).
 * @returns ::KINBOX_OK; ::KINBOX_ERR_DB_CONN when the database is
 *          unreachable; ::KINBOX_ERR_DB when a script fails (errstr names
 *          it); ::KINBOX_ERR_SCHEMA when the database records a version
 *          this kinbox does not know (written by a newer kinbox: nothing is
 *          applied); ::KINBOX_ERR_TIMEOUT when another migrate held the
 *          lock for 10 minutes (MySQL).
 * @remark Thread-safe (opens its own connection).
 */
KINBOX_API kinbox_err_t kinbox_migrate(const kinbox_conf_t *conf, char *errstr,
                                       size_t errstr_size);

/**
 * @brief Apply a handler module's schema for the configured backend,
 *        recorded as (module name, schema_version).
 * @returns As kinbox_migrate(); ::KINBOX_ERR_SCHEMA when the database
 *          records a newer version of the module's schema than
 *          `mod->schema_version`; ::KINBOX_ERR_INVALID when mod is NULL.
 */
KINBOX_API kinbox_err_t kinbox_migrate_module(const kinbox_conf_t *conf,
                                              const kinbox_module_t *mod,
                                              char *errstr,
                                              size_t errstr_size);

/** kinbox_migrate_run() flag: report what would be applied, apply nothing
 *  (not even the `kinbox_schema_migrations` table). */
#define KINBOX_MIGRATE_DRY_RUN 0x1

/**
 * @brief Called by kinbox_migrate_run() once per step it applied (applied
 *        = 1) or, with ::KINBOX_MIGRATE_DRY_RUN, would apply (applied = 0).
 *
 * @p component is "kinbox" or the module's name, @p name the migration's
 * name (e.g. "0004_outbox_claim"; "schema" for a module). The strings are
 * valid during the call only. Called in the caller's thread.
 */
typedef void (*kinbox_migrate_cb)(const char *component, int version,
                                  const char *name, int applied, void *opaque);

/**
 * @brief kinbox_migrate() (mod NULL) or kinbox_migrate_module() (mod set),
 *        reporting every step to @p cb (may be NULL), or only reporting
 *        them with ::KINBOX_MIGRATE_DRY_RUN in @p flags.
 *
 * A schema from the future is refused before anything is applied.
 * @returns As kinbox_migrate().
 * @remark Thread-safe (opens its own connection).
 */
KINBOX_API kinbox_err_t kinbox_migrate_run(const kinbox_conf_t *conf,
                                           const kinbox_module_t *mod,
                                           int flags, kinbox_migrate_cb cb,
                                           void *opaque, char *errstr,
                                           size_t errstr_size);

/**
 * @brief The schema version contract: does the database of `database.url`
 *        hold exactly the schema this kinbox (and @p mod, when not NULL)
 *        was built for?
 *
 * Every migration this kinbox knows for the backend must be recorded in
 * `kinbox_schema_migrations`, and no version it does not know; for @p mod
 * (a module with a schema for the backend) its `schema_version` must be
 * recorded and nothing newer. kinbox_consumer_run() and kinbox_relay_run()
 * check kinbox's own schema when they start; `kinbox run` and the admin
 * commands check every schema the configuration names.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_SCHEMA with errstr saying which way
 *          it differs and what to do ("the kinbox schema is at version 3,
 *          this kinbox needs 7 (missing ...): run kinbox migrate", or
 *          "... written by a newer kinbox (version 9 ...): upgrade this
 *          binary, or restore ..."); ::KINBOX_ERR_DB_CONN when the database
 *          is unreachable; ::KINBOX_ERR_DB; ::KINBOX_ERR_CONFIG.
 * @remark Thread-safe (opens its own connection, reads only).
 */
KINBOX_API kinbox_err_t kinbox_schema_check(const kinbox_conf_t *conf,
                                            const kinbox_module_t *mod,
                                            char *errstr, size_t errstr_size);

KINBOX_END_DECLS

#endif
