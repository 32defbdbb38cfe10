/*
 * kafka.h -- what kinbox asks of librdkafka in one place (internal): the
 * one builder of a handle's configuration (consumer, relay, operator
 * client) and the log's range of many partitions in one pass.
 */
#ifndef KINBOX_KAFKA_H
#define KINBOX_KAFKA_H

#include "kinbox/conf.h"

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

/* How one kind of handle is configured. Each list is NULL-terminated
 * (key, value pairs; skip: keys), each may be NULL. */
typedef struct kinbox__rkconf_spec {
        /* kinbox's defaults for this handle, set first: the user's
         * kafka.* may override them. */
        const char *const *defaults;
        /* kafka.* keys (without "kafka.") never passed to this handle. */
        const char *const *skip;
        /* Set last, over the user's kafka.*: what this handle's guarantees
         * depend on. */
        const char *const *forced;
} kinbox__rkconf_spec_t;

/* A librdkafka configuration: spec->defaults, then every kafka.* setting
 * of conf (but spec->skip), then spec->forced. The caller owns it (and
 * sets its callbacks and opaque); NULL with errstr ("kafka.KEY: why" for
 * a user's setting librdkafka refused, "KEY: why" for the spec's).
 * Thread-safe (conf is only read). */
rd_kafka_conf_t *kinbox__rkconf_new(const kinbox_conf_t *conf,
                                    const kinbox__rkconf_spec_t *spec,
                                    char *errstr, size_t errstr_size);

/* The log's range [lo, hi) of each partition of pl (lo[i], hi[i] for
 * pl->elems[i]; -1 each, with err[i] set, where it is unknown), asked of
 * all the partitions' leaders at once: one request per leader for the
 * start offsets and one for the ends, not a round trip per partition.
 * Within timeout_ms for the whole list (where a broker refuses the
 * request as a whole, the partitions are asked one by one within what is
 * left of it). An empty partition has lo == hi. Thread-safe as
 * librdkafka's queries are; pl is not changed. */
void kinbox__log_ranges(rd_kafka_t *rk,
                        const rd_kafka_topic_partition_list_t *pl, int64_t *lo,
                        int64_t *hi, rd_kafka_resp_err_t *err, int timeout_ms);

#endif
