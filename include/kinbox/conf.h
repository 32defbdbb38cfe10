/**
 * @file conf.h
 * @brief Configuration objects: string key/value, validated against one
 *        property table (the configuration reference is generated from it).
 *
 * Keys are dotted. Keys starting with `kafka.` are handed to librdkafka
 * unchanged (without the prefix) and validated by it. One configuration
 * object describes one consumer or one relay; the INI loader of the
 * `kinbox` command builds one per `[consumer.NAME]` section.
 */
#ifndef KINBOX_CONF_H
#define KINBOX_CONF_H

#include <stddef.h>
#include <stdio.h>
#include "export.h"
#include "error.h"

KINBOX_BEGIN_DECLS

/** An opaque configuration object. */
typedef struct kinbox_conf_s kinbox_conf_t;

/** Log levels, syslog numbering. */
typedef enum kinbox_log_level {
        KINBOX_LOG_ERR = 3,
        KINBOX_LOG_WARNING = 4,
        KINBOX_LOG_NOTICE = 5,
        KINBOX_LOG_INFO = 6,
        KINBOX_LOG_DEBUG = 7
} kinbox_log_level_t;

/**
 * @brief Log callback.
 * @param level     syslog level (::kinbox_log_level_t).
 * @param facility  short subsystem name ("consumer", "db", "rdkafka", ...).
 * @param message   one line, no trailing newline; never contains payloads
 *                  or passwords.
 * @remark Called from any kinbox thread, possibly concurrently; the pointers
 *         are valid only during the call; it must not call back into kinbox.
 */
typedef void (*kinbox_log_cb)(int level, const char *facility,
                              const char *message, void *opaque);

/**
 * @brief Create a configuration object holding every default.
 * @returns A new object owned by the caller (free with kinbox_conf_destroy()),
 *          or NULL when out of memory.
 * @remark Thread-safe; the object itself is not: use one thread at a time.
 */
KINBOX_API kinbox_conf_t *kinbox_conf_new(void);

/**
 * @brief Deep-copy a configuration object (including the log callback).
 * @returns A new object owned by the caller, or NULL when out of memory.
 */
KINBOX_API kinbox_conf_t *kinbox_conf_dup(const kinbox_conf_t *conf);

/** @brief Free a configuration object. NULL is a no-op. */
KINBOX_API void kinbox_conf_destroy(kinbox_conf_t *conf);

/**
 * @brief Set one property.
 * @param key    a key of the configuration reference, or `kafka.<property>`.
 * @param value  the value as text; copied.
 * @param errstr buffer receiving a message naming the key and what was
 *               wrong when the call fails; may be NULL.
 * @returns ::KINBOX_OK, ::KINBOX_ERR_UNKNOWN_KEY for a key that does not
 *          exist, ::KINBOX_ERR_INVALID for a value that does not parse or
 *          is out of range (the old value is kept).
 */
KINBOX_API kinbox_err_t kinbox_conf_set(kinbox_conf_t *conf, const char *key,
                                        const char *value, char *errstr,
                                        size_t errstr_size);

/**
 * @brief Read one property as text.
 * @returns The current value (the default when never set), owned by the
 *          object and valid until the next kinbox_conf_set() of that key or
 *          kinbox_conf_destroy(); NULL for an unknown or unset `kafka.` key.
 */
KINBOX_API const char *kinbox_conf_get(const kinbox_conf_t *conf,
                                       const char *key);

/**
 * @brief Route kinbox's log lines (and librdkafka's and the database
 *        client's notices) to @p cb instead of stderr.
 * @param cb NULL restores the default stderr logger (format per `log.format`).
 */
KINBOX_API void kinbox_conf_set_log_cb(kinbox_conf_t *conf, kinbox_log_cb cb,
                                       void *opaque);

/**
 * @brief Change the most verbose level logged by every kinbox logger of the
 *        process at once, overriding each configuration's `log.level`
 *        (`kinbox run` calls it on SIGHUP with the file's new level).
 * @param level a ::kinbox_log_level_t; -1 returns every logger to the
 *              `log.level` of its configuration.
 * @remark Thread-safe and async-signal-safe (one atomic store); takes effect
 *         from the next line. librdkafka's own `kafka.log_level` is not
 *         changed.
 */
KINBOX_API void kinbox_log_set_level(int level);

/**
 * @brief Write the configuration reference (Markdown) generated from the
 *        property table to @p fp, open for writing (the caller's; not
 *        closed). Write errors are the stream's (ferror()).
 * @remark Thread-safe.
 */
KINBOX_API void kinbox_conf_write_reference(FILE *fp);

/**
 * @brief Write the same reference as kinbox_conf_write_reference() as
 *        roff: one `.TP` paragraph per key (the body of kinbox.conf(5)).
 * @param fp a FILE * open for writing.
 * @remark Thread-safe.
 */
KINBOX_API void kinbox_conf_write_reference_man(FILE *fp);

KINBOX_END_DECLS

#endif
