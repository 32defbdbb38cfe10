/**
 * @file error.h
 * @brief Error codes shared by every kinbox call.
 *
 * Every fallible call returns a ::kinbox_err_t. Values are fixed and will
 * never be renumbered. Human-readable context (operation, topic/partition/
 * offset, SQLSTATE or MySQL errno) is written to the caller's errstr buffer
 * or is available from the object's last error.
 */
#ifndef KINBOX_ERROR_H
#define KINBOX_ERROR_H

#include "export.h"

KINBOX_BEGIN_DECLS

/** X-macro of every error: name, value, description. */
#define KINBOX_ERRNO_MAP(XX)                                                  \
        XX(OK, 0, "success")                                                  \
        XX(INVALID, -1, "invalid argument or value")                          \
        XX(UNKNOWN_KEY, -2, "unknown configuration key")                      \
        XX(NOMEM, -3, "out of memory")                                        \
        XX(DB, -4, "database error")                                          \
        XX(DB_CONN, -5, "database connection lost or unreachable")            \
        XX(DUPLICATE, -6, "duplicate key: already done")                      \
        XX(KAFKA, -7, "Kafka client error")                                   \
        XX(COMMIT_UNKNOWN, -8, "commit outcome unknown")                      \
        XX(CONFIG, -9, "configuration error")                                 \
        XX(STATE, -10, "call not allowed in this state")                      \
        XX(NOT_FOUND, -11, "not found")                                       \
        XX(TRANSIENT, -12, "transient failure, retry")                        \
        XX(ABI, -13, "handler module ABI mismatch")                           \
        XX(IO, -14, "I/O error")                                              \
        XX(TIMEOUT, -15, "timed out")                                         \
        XX(ABORTED, -16,                                                      \
           "transaction aborted by another message's failed statement")       \
        XX(SCHEMA, -17, "database schema version does not match this kinbox")

/** Error codes. ::KINBOX_OK is zero, every failure is negative. */
typedef enum kinbox_err {
#define KINBOX_ERR_GEN_(name, val, s) KINBOX_ERR_##name = (val),
        KINBOX_ERRNO_MAP(KINBOX_ERR_GEN_)
#undef KINBOX_ERR_GEN_
} kinbox_err_t;

/** ::KINBOX_OK spelled the short way. */
#define KINBOX_OK KINBOX_ERR_OK

/**
 * @brief The symbolic name of an error, e.g. "KINBOX_ERR_DB".
 * @returns A static string; never NULL ("KINBOX_ERR_?" for unknown values).
 * @remark Thread-safe.
 */
KINBOX_API const char *kinbox_err_name(kinbox_err_t err);

/**
 * @brief A one-line description of an error.
 * @returns A static string; never NULL.
 * @remark Thread-safe.
 */
KINBOX_API const char *kinbox_strerror(kinbox_err_t err);

KINBOX_END_DECLS

#endif
