/*
 * rkdestroy.h -- destroying a librdkafka handle within a bound
 * (internal): the consumer and the relay use it so that a librdkafka
 * termination hang cannot hang their caller.
 */
#ifndef KINBOX_RKDESTROY_H
#define KINBOX_RKDESTROY_H

#include <librdkafka/rdkafka.h>
#include <stdbool.h>

/* How long rd_kafka_destroy() may take, in ms. */
#define KINBOX__RK_DESTROY_MS 10000

/*
 * rd_kafka_destroy_flags(rk, flags) within KINBOX__RK_DESTROY_MS. True when
 * it finished; false when it did not: it goes on in a detached thread,
 * which still owns rk, and whatever rk's callbacks reach (their opaque)
 * must never be freed: hand it to kinbox__rk_abandon(). fault names the
 * KINBOX_FAULT point that makes the destroy take 8 s longer than the bound
 * (tests), or NULL. Thread-safe; blocks the caller at most the bound.
 */
bool kinbox__rk_destroy_bounded(rd_kafka_t *rk, int flags, const char *fault);

/* Keep owner (the opaque of a handle that did not shut down) reachable
 * for the life of the process: never freed, and a leak checker sees
 * memory kept on purpose. Thread-safe. */
void kinbox__rk_abandon(void *owner);

#endif
