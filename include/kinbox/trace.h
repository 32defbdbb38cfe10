/**
 * @file trace.h
 * @brief W3C trace context (`traceparent`) carried through the outbox, Kafka
 *        and the inbox, so one event can be followed from the business
 *        transaction that wrote it to the handler that applied it.
 *
 * The context travels as the Kafka header `traceparent` (and, verbatim,
 * `tracestate`): the names the OpenTelemetry Kafka instrumentations of
 * Java, Go and .NET use. kinbox parses it strictly (W3C Trace Context,
 * version 00): a value that is malformed, of another version, or with an
 * all-zero id is ignored, never an error of the message; so are two or more
 * `traceparent` headers on one message or outbox row.
 *
 * Writer side: put the caller's current context in an outbox row with
 * kinbox_trace_header(); the relay publishes the row's headers as they
 * are. Consumer side: kinbox_msg_trace() reads the context a message
 * carries; kinbox_trace_child() makes the context of work done on its
 * behalf (e.g. an outbox append inside the handler), so a chain
 * order → points → notification is one trace.
 *
 * All functions here are pure (no I/O, no allocation) and thread-safe.
 */
#ifndef KINBOX_TRACE_H
#define KINBOX_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "error.h"
#include "handler.h"

KINBOX_BEGIN_DECLS

/** Length of a version-00 `traceparent` value, without a terminator. */
#define KINBOX_TRACEPARENT_LEN 55
/** The header names (W3C Trace Context over Kafka). */
#define KINBOX_TRACEPARENT_HEADER "traceparent"
#define KINBOX_TRACESTATE_HEADER "tracestate"

/** A trace context: which trace, which span is the parent, sampled or not. */
typedef struct kinbox_trace {
        uint8_t trace_id[16]; /**< Never all zeros in a valid context. */
        uint8_t span_id[8]; /**< The span this context names (parent-id). */
        uint8_t flags; /**< trace-flags; bit 0 (0x01): sampled. */
} kinbox_trace_t;

/**
 * @brief Parse a `traceparent` value (W3C Trace Context, version 00).
 * @param value  the bytes (not necessarily NUL-terminated); may be NULL.
 * @param len    their length: exactly ::KINBOX_TRACEPARENT_LEN is valid.
 * @param out    receives the context; untouched on error.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_INVALID for anything else: another
 *          length, a version other than `00` (including the forbidden
 *          `ff`), upper-case or non-hex digits, a missing `-`, an
 *          all-zero trace-id or parent-id.
 */
KINBOX_API kinbox_err_t kinbox_trace_parse(const void *value, size_t len,
                                           kinbox_trace_t *out);

/**
 * @brief Write @p t as a version-00 `traceparent` value into @p buf
 *        (::KINBOX_TRACEPARENT_LEN characters and a NUL).
 */
KINBOX_API void kinbox_trace_format(const kinbox_trace_t *t,
                                    char buf[KINBOX_TRACEPARENT_LEN + 1]);

/**
 * @brief A new trace: random trace-id and span-id, sampled flag set.
 * @remark Ids come from a per-thread generator seeded from the kernel's
 *         random source; they are unique, not secret.
 */
KINBOX_API void kinbox_trace_new(kinbox_trace_t *t);

/**
 * @brief A child of @p parent: the same trace and flags, a new span-id.
 *        @p child may be @p parent.
 */
KINBOX_API void kinbox_trace_child(const kinbox_trace_t *parent,
                                   kinbox_trace_t *child);

/**
 * @brief The trace id (32 lower-case hex digits and a NUL) into @p buf.
 */
KINBOX_API void kinbox_trace_id_hex(const kinbox_trace_t *t, char buf[33]);

/**
 * @brief The span id (16 lower-case hex digits and a NUL) into @p buf.
 */
KINBOX_API void kinbox_trace_span_hex(const kinbox_trace_t *t, char buf[17]);

/**
 * @brief The context a message carries: its `traceparent` header.
 * @returns ::KINBOX_OK; ::KINBOX_ERR_NOT_FOUND when the message has no
 *          such header, has several (W3C Trace Context: a carrier with
 *          more than one is invalid, so all are ignored), or its value is
 *          not a valid version-00 context (ignored, as the specification
 *          asks).
 * @remark Thread-safe for a message the caller holds.
 */
KINBOX_API kinbox_err_t kinbox_msg_trace(const kinbox_msg_t *msg,
                                         kinbox_trace_t *t);

/**
 * @brief Fill @p hdr as the `traceparent` header of @p t, for an outbox
 *        row's header list (kinbox_outbox_msg_t.headers).
 * @param buf  holds the value; it must outlive the append call.
 */
KINBOX_API void kinbox_trace_header(const kinbox_trace_t *t,
                                    char buf[KINBOX_TRACEPARENT_LEN + 1],
                                    kinbox_header_t *hdr);

KINBOX_END_DECLS

#endif /* KINBOX_TRACE_H */
