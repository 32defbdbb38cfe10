/*
 * outbox_env.h -- the envelope of an outbox event written to the log
 * without a table row (kinbox_outbox_emit_pg(): pg_logical_emit_message
 * with the prefix KINBOX__ENV_PREFIX), internal. docs/outbox.md documents
 * the bytes:
 *
 *   byte 0        version, 1
 *   then five fields, in this order, each a 4-byte big-endian length
 *   followed by that many bytes; length 0xFFFFFFFF is NULL:
 *     destination   (required, 1..255 bytes, no NUL, not action:...)
 *     aggregate_id  (NULL: no key; at most 255 bytes, no NUL)
 *     idem_key      (required, 1..255 bytes, no NUL)
 *     headers       (NULL: none; the stored headers' JSON form, hdrcodec.h)
 *     payload       (NULL: a null value)
 *   nothing after the last field.
 */
#ifndef KINBOX_OUTBOX_ENV_H
#define KINBOX_OUTBOX_ENV_H

#include <stddef.h>

#include "internal.h"
#include "kinbox/outbox.h"

#define KINBOX__ENV_PREFIX "kinbox.outbox.v1"
#define KINBOX__ENV_VERSION 1

/* A decoded envelope: NUL-terminated copies in one allocation (mem). */
typedef struct kinbox__outbox_env {
        const char *destination, *aggregate_id, *idem_key, *headers_json;
        const char *payload; /* NULL: null */
        size_t payload_size;
        char *mem;
} kinbox__outbox_env_t;

/* Decode a logical message: 0, or -1 with why set (wrong prefix, unknown
 * version, truncated or trailing bytes, a field out of its bounds, out of
 * memory). *out is freed by kinbox__outbox_env_free() after 0 only. */
int kinbox__outbox_env_decode(const char *prefix, const unsigned char *p,
                              size_t n, kinbox__outbox_env_t *out, char *why,
                              size_t whysz);
void kinbox__outbox_env_free(kinbox__outbox_env_t *e);

/* Encode m (headers in their stored JSON form) into b: 0, or -1 with why
 * set (a missing or over-long field, an action destination, headers that
 * do not encode, out of memory). */
int kinbox__outbox_env_encode(const kinbox_outbox_msg_t *m, kinbox__buf_t *b,
                              char *why, size_t whysz);

#endif
