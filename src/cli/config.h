/*
 * ini.h -- the `kinbox` command's configuration file model.
 */
#ifndef KINBOX_CLI_CONFIG_H
#define KINBOX_CLI_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include <kinbox/kinbox.h>

#define KB_MAX_CONSUMERS 32

typedef struct kb_config {
        /* Shared settings: every consumer/relay conf starts as a copy. */
        kinbox_conf_t *base;
        struct {
                char *name;
                kinbox_conf_t *conf;
                /* A copy that stays here when `kinbox run` hands conf
                 * over to the consumer (the reconciler reads it). */
                kinbox_conf_t *settings;
                /* Not configured: found in the database (`status` and
                 * `verify` with no [consumer.NAME], ctx_discover()). */
                bool discovered;
        } consumers[KB_MAX_CONSUMERS];
        int nconsumers;
        bool relay_enabled;
        kinbox_conf_t *relay; /* base + [relay] */
        char *metrics_listen;
        char *path; /* the file, absolute (realpath) when it resolves */
} kb_config_t;

/* Load path; ${VAR} in values expands from the environment. Returns 0, or
 * -1 with "file:line: what" in errstr. */
int kb_config_load(const char *path, kb_config_t *cfg, char *errstr,
                   size_t errstr_size);
void kb_config_free(kb_config_t *cfg);

#endif
