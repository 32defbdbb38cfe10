/*
 * msgid.h -- where a value comes from in a message: the one locator of the
 * message id (message_id) and the held key (dead_letter.hold_key.source).
 */
#ifndef KINBOX_MSGID_H
#define KINBOX_MSGID_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#define KINBOX__MSGID_MAX 255 /* bytes; the inbox column's width */

/* The parts of a message an id can come from. */
typedef struct kinbox__msgview {
        const char *topic;
        int32_t partition;
        int64_t offset;
        const void *key;
        size_t key_len;
        const void *payload;
        size_t len;
        const rd_kafka_headers_t *headers; /* may be NULL */
} kinbox__msgview_t;

/* The view of a librdkafka message. */
void kinbox__msgview_of(const rd_kafka_message_t *rkm, kinbox__msgview_t *v);

/* What kinbox__msgfield_locate() found. */
typedef enum kinbox__field_rc {
        KINBOX__FIELD_SET, /* the value is in the field */
        KINBOX__FIELD_NONE, /* the message has none (or it is unreadable) */
        /* The source is a header the message carries more than once: no
         * value is picked (docs/handlers.md, "Repeated headers"). */
        KINBOX__FIELD_AMBIGUOUS
} kinbox__field_rc_t;

/* A located value: v/n borrowed from the message, or from own (malloc'ed,
 * the caller frees it) for a JSON field or the coordinates. */
typedef struct kinbox__field {
        const void *v;
        size_t n;
        char *own;
} kinbox__field_t;

/*
 * The value spec names in message m: "header:NAME" (the header's bytes;
 * a repeated header is KINBOX__FIELD_AMBIGUOUS, whichever values it
 * carries), "key", "json:/pointer" (a string or an integer of the
 * payload) or "coords" (topic/partition/offset). Anything but
 * KINBOX__FIELD_SET comes with a reason in why, naming the value as what
 * ("message id", "held key"). Thread-safe; *out is always set.
 */
kinbox__field_rc_t kinbox__msgfield_locate(const char *spec,
                                           const kinbox__msgview_t *m,
                                           const char *what,
                                           kinbox__field_t *out, char *why,
                                           size_t why_size);

/*
 * Extract the id of a message according to spec (kinbox__msgfield_locate();
 * a header, the key or the coordinates checked to be at most
 * KINBOX__MSGID_MAX bytes of UTF-8 text). Returns a malloc'ed
 * NUL-terminated id, or NULL with a reason in why (e.g. "no header
 * \"message_id\"").
 */
char *kinbox__msgid_extract(const char *spec, const kinbox__msgview_t *m,
                            char *why, size_t why_size);

/* Resolve an RFC 6901 pointer in a JSON text of len bytes; returns the
 * malloc'ed string value (strings as is, integers as decimal) or NULL. */
char *kinbox__json_pointer(const char *json, size_t len, const char *ptr,
                           char *why, size_t why_size);

#endif
