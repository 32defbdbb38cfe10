/*
 * msgid.h -- where a message's id comes from (message_id setting).
 */
#ifndef KINBOX_MSGID_H
#define KINBOX_MSGID_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>

#define KINBOX__MSGID_MAX 255 /* bytes; the inbox column's width */

/*
 * Extract the id of rkm according to spec ("header:NAME", "key",
 * "json:/pointer", "coords"). Returns a malloc'ed NUL-terminated id, or NULL
 * with a reason in why (e.g. "no header \"message_id\"").
 */
char *kinbox__msgid_extract(const char *spec, const rd_kafka_message_t *rkm,
                            char *why, size_t why_size);

/* Resolve an RFC 6901 pointer in a JSON text of len bytes; returns the
 * malloc'ed string value (strings as is, integers as decimal) or NULL. */
char *kinbox__json_pointer(const char *json, size_t len, const char *ptr,
                           char *why, size_t why_size);

#endif
