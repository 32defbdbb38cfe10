/*
 * modules.c -- handler modules: the built-in ones, one loaded from
 * handler.path/NAME.so, the one a consumer configures.
 */
#include "common.h"
#include "internal.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../../handlers/deposit/deposit.h"
#include "../../handlers/ledger/ledger.h"
#include "../../handlers/points/points.h"

static const kinbox_module_t *const builtins[] = {
    &kinbox_points_module,
    &kinbox_points_single_module,
    &kinbox_ledger_module,
    &kinbox_deposit_module,
};

const kinbox_module_t *
kb_schema_owner(const kinbox_module_t *m)
{
        for (size_t i = 0; i < sizeof(builtins) / sizeof(builtins[0]); i++) {
                const kinbox_module_t *b = builtins[i];
                if (m->schema_postgresql &&
                    b->schema_version == m->schema_version &&
                    b->schema_postgresql == m->schema_postgresql &&
                    b->schema_mysql == m->schema_mysql)
                        return b;
        }
        return m;
}

const kinbox_module_t *
find_module_named(const kinbox_conf_t *conf, const char *name, char *err,
                  size_t sz)
{
        for (size_t i = 0; i < sizeof(builtins) / sizeof(builtins[0]); i++)
                if (!strcmp(builtins[i]->name, name))
                        return builtins[i];
        const char *dir = kinbox__settings_of(conf)->handler_path;
        if (!dir) {
                snprintf(err, sz,
                         "handler \"%s\" is not built in and handler.path is "
                         "not set",
                         name);
                return NULL;
        }
        char path[512];
        snprintf(path, sizeof(path), "%.400s/%.100s.so", dir, name);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
                const char *why = dlerror();
                /* A module linked with `pkg-config --libs kinbox` needs a
                 * libkinbox.so.N the loader may not find (a --prefix
                 * install); it needs none at all. */
                bool lib = why && strstr(why, "libkinbox");
                snprintf(err, sz, "handler \"%s\": cannot load %s: %s%s", name,
                         path, why ? why : "?",
                         lib ? " (a module is not linked against libkinbox: "
                               "`kinbox run` provides its API; build it with "
                               "`pkg-config --cflags kinbox` only, or "
                               "kinbox_add_module(): docs/modules.md)"
                             : "");
                return NULL;
        }
        const kinbox_module_t *m = dlsym(h, "kinbox_module");
        if (!m) {
                snprintf(err, sz,
                         "handler \"%s\": %s exports no kinbox_module symbol",
                         name, path);
                return NULL;
        }
        if (m->abi_version < KINBOX_MODULE_ABI_VERSION_MIN ||
            m->abi_version > KINBOX_MODULE_ABI_VERSION) {
                snprintf(err, sz,
                         "handler \"%s\": %s has module ABI version %d, this "
                         "kinbox needs %d..%d",
                         name, path, m->abi_version,
                         KINBOX_MODULE_ABI_VERSION_MIN,
                         KINBOX_MODULE_ABI_VERSION);
                return NULL;
        }
        if (strcmp(m->name ? m->name : "", name)) {
                snprintf(err, sz,
                         "handler \"%s\": %s describes itself as \"%s\"", name,
                         path, m->name ? m->name : "");
                return NULL;
        }
        return m;
}

const kinbox_module_t *
find_module(const kinbox_conf_t *conf, char *err, size_t sz)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        const char *name = s->handler;
        if (!name) {
                snprintf(err, sz, "consumer.%s: no handler configured",
                         s->name ? s->name : "(null)");
                return NULL;
        }
        const kinbox_module_t *m = find_module_named(conf, name, err, sz);
        if (m && !m->handle && !m->handle_batch) {
                snprintf(err, sz, "handler \"%s\" has no handle function",
                         name);
                return NULL;
        }
        return m;
}
