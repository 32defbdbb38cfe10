/**
 * @file module.h
 * @brief Handler modules: a handler packaged with its schema, loadable by
 *        `kinbox run` (built in, or a shared object in `handler.path`).
 *
 * A module shared object exports one symbol, `kinbox_module`, of type
 * ::kinbox_module_t, with `abi_version = KINBOX_MODULE_ABI_VERSION`
 * (::KINBOX_MODULE_EXPORT). It is not linked against libkinbox: the
 * `kinbox` command that loads it provides the public API (docs/modules.md).
 */
#ifndef KINBOX_MODULE_H
#define KINBOX_MODULE_H

#include <stddef.h>
#include "export.h"
#include "conf.h"
#include "handler.h"
#include "outbox.h"
#include "admin.h"

KINBOX_BEGIN_DECLS

/**
 * Bumped whenever ::kinbox_module_t changes shape. Version 2 appended
 * `checks`; `kinbox run` still loads version 1 modules (they have no
 * checks), since the fields before it did not move.
 */
#define KINBOX_MODULE_ABI_VERSION 2
/** The oldest module ABI version `kinbox run` loads. */
#define KINBOX_MODULE_ABI_VERSION_MIN 1

/**
 * Exports a module's descriptor from its shared object, whatever the
 * build's default visibility (`-fvisibility=hidden`, which
 * kinbox_add_module() of the CMake package sets, or ::KINBOX_API being
 * empty under `KINBOX_STATIC`):
 *
 *     KINBOX_MODULE_EXPORT const kinbox_module_t kinbox_module = { ... };
 *
 * docs/modules.md: building a module.
 */
#if defined(__GNUC__)
#define KINBOX_MODULE_EXPORT __attribute__((visibility("default")))
#else
#define KINBOX_MODULE_EXPORT
#endif

/** A local action a module provides to the relay (`action:NAME` rows). */
typedef struct kinbox_module_action {
        const char *name; /**< NAME of `action:NAME` */
        /** Called by the relay of `kinbox run` with opaque = the relay's
         *  configuration (`const kinbox_conf_t *`, read-only, valid while
         *  the relay runs: `database.url` etc.). */
        kinbox_action_fn fn;
} kinbox_module_action_t;

/** The versioned descriptor of a handler module. */
typedef struct kinbox_module {
        int abi_version; /**< KINBOX_MODULE_ABI_VERSION */
        const char *name; /**< handler name used in `handler = NAME` */
        /** Schema version; bump when the schema strings change. */
        int schema_version;
        /** Schema for PostgreSQL / MySQL (idempotent DDL), may be NULL. */
        const char *schema_postgresql;
        const char *schema_mysql;
        /**
         * Called once per consumer before it runs. @p conf is the
         * consumer's configuration (read-only, valid during the call).
         * Store per-consumer state in *opaquep. Return 0, or -1 with a
         * reason in errstr. May be NULL.
         */
        int (*init)(const kinbox_conf_t *conf, void **opaquep, char *errstr,
                    size_t errstr_size);
        /** Per-message handler; or NULL when handle_batch is set. */
        kinbox_handler_fn handle;
        /** Batch handler; preferred when both are set. */
        kinbox_batch_handler_fn handle_batch;
        /** Called after the consumer stopped. May be NULL. */
        void (*fini)(void *opaque);
        /** Local actions, terminated by {NULL, NULL}; may be NULL. The
         *  relay of `kinbox run` registers those of the modules listed in
         *  `relay.modules`. */
        const kinbox_module_action_t *actions;
        /** Reconciliation checks (ABI version 2), terminated by an entry
         *  whose name is NULL; may be NULL. `kinbox reconcile` and the
         *  periodic run of `kinbox run` execute those of the configured
         *  consumers' modules and of `relay.modules` (see
         *  kinbox_reconcile()). Only read when abi_version >= 2. */
        const kinbox_check_t *checks;
} kinbox_module_t;

KINBOX_END_DECLS

#endif
