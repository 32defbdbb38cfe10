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

/* Whether this librdkafka's rd_kafka_destroy() can hang for ever: releases
 * before 2.6.0 (librdkafka PR #4724; Debian 12 ships 2.0.2, Debian 13
 * 2.8.0). Only there is the destroy bounded; on later releases
 * kinbox__rk_destroy_bounded() is a plain rd_kafka_destroy_flags(). */
#define KINBOX__RK_DESTROY_MAY_HANG (RD_KAFKA_VERSION < 0x020600ff)

/*
 * rd_kafka_destroy_flags(rk, flags), within KINBOX__RK_DESTROY_MS where
 * KINBOX__RK_DESTROY_MAY_HANG (otherwise it just returns true). True when
 * it finished; false when it did not: it goes on in a detached thread,
 * which still owns rk, and whatever rk's callbacks reach (their opaque)
 * must never be freed: hand it to kinbox__rk_abandon(). fault names the
 * KINBOX_FAULT point that makes the destroy take 8 s longer than the bound
 * (tests; only where the bound applies), or NULL. Thread-safe; blocks the caller at most the bound.
 */
bool kinbox__rk_destroy_bounded(rd_kafka_t *rk, int flags, const char *fault);

/* Keep owner (the opaque of a handle that did not shut down) reachable
 * for the life of the process: never freed, and a leak checker sees
 * memory kept on purpose. Thread-safe. */
void kinbox__rk_abandon(void *owner);

#endif
