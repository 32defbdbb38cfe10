/**
 * @file consumer.h
 * @brief The inbox consumer: Kafka messages in, exactly-once effect on the
 *        database.
 *
 * Lifecycle: kinbox_consumer_new() → kinbox_consumer_set_handler() (or
 * _set_batch_handler()) → kinbox_consumer_run() (blocks) →
 * kinbox_consumer_stop() from a signal handler or another thread →
 * kinbox_consumer_destroy().
 */
#ifndef KINBOX_CONSUMER_H
#define KINBOX_CONSUMER_H

#include <stdint.h>
#include "export.h"
#include "error.h"
#include "conf.h"
#include "handler.h"

KINBOX_BEGIN_DECLS

/** An inbox consumer: one Kafka consumer group member. Opaque. */
typedef struct kinbox_consumer_s kinbox_consumer_t;

/** Counters of one consumer since it was created. */
typedef struct kinbox_consumer_stats {
        uint64_t processed; /**< messages whose effect committed */
        uint64_t duplicates; /**< messages found in the inbox: skipped */
        uint64_t dead; /**< messages moved to the dead-letter table */
        uint64_t retried; /**< handler RETRY results and retried batches */
        uint64_t batches; /**< committed transactions */
        uint64_t rolled_back; /**< transactions rolled back (also partly:
                                  to a savepoint) */
        /** Business duplicates: messages with a new id whose event was
         *  already applied (::KINBOX_RESULT_DUPLICATE or a unique violation
         *  of a kinbox_tx_exec_unique() statement). Added in 0.2. */
        uint64_t business_duplicates;
} kinbox_consumer_stats_t;

/**
 * @brief Create a consumer.
 * @param conf  configuration; owned by the consumer on success only (set
 *              your pointer to NULL then), still the caller's on failure.
 *              Requires `name`, `database.url`, `topics` and
 *              `kafka.bootstrap.servers`.
 * @param errstr receives what was wrong on failure.
 * @returns A consumer, or NULL on failure (bad configuration, librdkafka
 *          refused its properties). No connection is made yet.
 */
KINBOX_API kinbox_consumer_t *
kinbox_consumer_new(kinbox_conf_t *conf, char *errstr, size_t errstr_size);

/**
 * @brief Register the per-message handler. Call before kinbox_consumer_run().
 * @param opaque handed to every call; owned by the caller.
 * @returns ::KINBOX_OK, or ::KINBOX_ERR_STATE while running.
 */
KINBOX_API kinbox_err_t kinbox_consumer_set_handler(kinbox_consumer_t *c,
                                                    kinbox_handler_fn fn,
                                                    void *opaque);

/**
 * @brief Register a batch handler instead (replaces a per-message handler).
 * @returns ::KINBOX_OK, or ::KINBOX_ERR_STATE while running.
 */
KINBOX_API kinbox_err_t kinbox_consumer_set_batch_handler(
    kinbox_consumer_t *c, kinbox_batch_handler_fn fn, void *opaque);

/**
 * @brief Connect, join the group and process messages until stopped.
 *
 * Blocks the calling thread (which polls Kafka and serves rebalances) and
 * runs `workers` worker threads, each with its own database connection.
 * Database outages are ridden out with backoff (nothing advances meanwhile);
 * they do not make this call return.
 * @returns ::KINBOX_OK after kinbox_consumer_stop() and a clean shutdown
 *          (offsets committed, group left); ::KINBOX_ERR_DB_CONN when the
 *          database was unreachable at start; ::KINBOX_ERR_KAFKA on a fatal
 *          Kafka error; ::KINBOX_ERR_STATE without a handler. Details in
 *          kinbox_consumer_errstr().
 */
KINBOX_API kinbox_err_t kinbox_consumer_run(kinbox_consumer_t *c);

/**
 * @brief Ask a running consumer to finish its batches in flight, commit
 *        offsets and leave the group. Returns at once.
 * @remark Thread-safe and async-signal-safe.
 */
KINBOX_API void kinbox_consumer_stop(kinbox_consumer_t *c);

/** @brief Copy the counters. Thread-safe. */
KINBOX_API void kinbox_consumer_stats(const kinbox_consumer_t *c,
                                      kinbox_consumer_stats_t *out);

/** @brief The consumer's name (`name`). */
KINBOX_API const char *kinbox_consumer_name(const kinbox_consumer_t *c);

/** @brief Last fatal error text, "" if none. Owned by @p c. */
KINBOX_API const char *kinbox_consumer_errstr(const kinbox_consumer_t *c);

/**
 * @brief Free a stopped (or never run) consumer. NULL is a no-op.
 *
 * Not while kinbox_consumer_run() runs (stop it and let run() return
 * first). Bounded: librdkafka's rd_kafka_destroy() waits for its threads,
 * which some librdkafka releases (2.0 among them) can leave waiting for
 * ever under load. If they have not ended within 10 s, an error is logged
 * ("Kafka client did not shut down") and the consumer's memory and the
 * librdkafka handle are left to those threads instead of hanging the
 * caller: nothing is lost (offsets were committed, the database watermark
 * covers them), a little memory is.
 */
KINBOX_API void kinbox_consumer_destroy(kinbox_consumer_t *c);

KINBOX_END_DECLS

#endif
