/*
 * hdrcodec.h -- the one stored form of a Kafka header list (not installed).
 *
 * Outbox rows (kinbox_outbox.headers) and dead letters
 * (kinbox_dead_letter.headers) store a message's headers as one JSON text:
 *
 *     [[NAME, VALUE], ...]        in the message's order, duplicates kept
 *
 * NAME and VALUE are JSON strings when the bytes are valid UTF-8 (a NUL or
 * control byte is a \uXXXX escape, as JSON says), {"b64": "..."} (standard
 * base64 with padding) when they are not; VALUE is null for a header without
 * a value, "" for an empty one. [] is an empty list.
 *
 * Dead letters written before migration 0005 used [{"name": N, "value": V}]
 * where \u0080..\u00ff stood for the raw byte, not the code point; the
 * decoder still reads that form (rows the migration could not convert in
 * SQL: those with such bytes).
 *
 * Thread-safety: every function is reentrant (no shared state).
 * hdrcodec.c depends only on jansson and the public headers, so the kinbox
 * command compiles it in too (`kinbox dead show`).
 */
#ifndef KINBOX_HDRCODEC_H
#define KINBOX_HDRCODEC_H

#include <stddef.h>

#include <kinbox/kinbox.h>

/* Most headers a stored list may hold; larger lists are refused. */
#define KINBOX__HDRS_MAX 65536

/** One header: name NUL-terminated; value NULL (no value) or size bytes
 *  followed by a NUL that is not counted. Both owned by the list. */
typedef struct kinbox__hdr {
        char *name;
        char *value;
        size_t size;
} kinbox__hdr_t;

/** A header list; zero-initialise, free with kinbox__hdrs_free(). */
typedef struct kinbox__hdrs {
        kinbox__hdr_t *v;
        size_t n;
        size_t cap;
} kinbox__hdrs_t;

/**
 * @brief Append a copy of a header (value NULL = no value).
 * @returns 0, or -1 when out of memory, the name is NULL or the list is
 *          full (KINBOX__HDRS_MAX); the list is unchanged then.
 */
int kinbox__hdrs_add(kinbox__hdrs_t *h, const char *name, const void *value,
                     size_t size);

/** @brief Free every header and the array; the list is empty afterwards. */
void kinbox__hdrs_free(kinbox__hdrs_t *h);

/**
 * @brief The stored JSON of n headers.
 * @param hdr  n headers (may be NULL when n is 0): name NUL-terminated,
 *             value NULL or size bytes. Any byte is allowed in a value; a
 *             name is a C string.
 * @returns A malloc'ed NUL-terminated text owned by the caller, or NULL
 *          with errstr set (a NULL name, more than
 *          KINBOX__HDRS_MAX headers, out of memory).
 */
char *kinbox__hdrcodec_encode(const kinbox_header_t *hdr, size_t n,
                              char *errstr, size_t errstr_size);

/**
 * @brief Decode a stored list (either form described above).
 * @param json Text of len bytes (need not be NUL-terminated); NULL means
 *             no headers.
 * @param out  Receives the list (zero-initialised by the call); owned by
 *             the caller, free with kinbox__hdrs_free() (also after an
 *             error).
 * @returns 0, or -1 with errstr naming what is wrong (not JSON, not a list
 *          of pairs, bad base64, a NUL in a name, too many headers).
 */
int kinbox__hdrcodec_decode(const char *json, size_t len, kinbox__hdrs_t *out,
                            char *errstr, size_t errstr_size);

/**
 * @brief A header list for people: one "NAME: VALUE" per header joined by
 *        sep; bytes that are not printable UTF-8 written as \xNN (a
 *        backslash as \\); a header without a value as "NAME" alone.
 * @returns A malloc'ed text owned by the caller, or NULL when out of memory.
 */
char *kinbox__hdrcodec_display(const kinbox__hdrs_t *h, const char *sep);

/**
 * @brief Append the stored JSON of a consumed message's headers to b (the
 *        dead-letter writer; in hdrcodec_msg.c, library only). On failure
 *        (out of memory, a malformed header) b's oom flag is set.
 */
struct kinbox__buf;
void kinbox__headers_json(const kinbox_msg_t *m, struct kinbox__buf *b);

#endif
