/*
 * msgid.h -- where a message's id comes from (message_id setting).
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

/*
 * Extract the id of a message according to spec ("header:NAME", "key",
 * "json:/pointer", "coords"). Returns a malloc'ed NUL-terminated id, or NULL
 * with a reason in why (e.g. "no header \"message_id\"").
 */
char *kinbox__msgid_extract(const char *spec, const kinbox__msgview_t *m,
                            char *why, size_t why_size);

/* Resolve an RFC 6901 pointer in a JSON text of len bytes; returns the
 * malloc'ed string value (strings as is, integers as decimal) or NULL. */
char *kinbox__json_pointer(const char *json, size_t len, const char *ptr,
                           char *why, size_t why_size);

#endif
