/**
 * @file kinbox.h
 * @brief kinbox: exactly-once effect for Kafka consumers on their own
 *        database (inbox), and a transactional outbox with a relay.
 *
 * Include this umbrella header; link with `pkg-config --libs kinbox`.
 */
#ifndef KINBOX_H
#define KINBOX_H

#include "export.h"
#include "version.h"
#include "error.h"
#include "conf.h"
#include "handler.h"
#include "consumer.h"
#include "outbox.h"

KINBOX_BEGIN_DECLS

/** @brief The library's version string, e.g. "0.1.0". Thread-safe. */
KINBOX_API const char *kinbox_version(void);

/** @brief The library's version as KINBOX_VERSION_NUM. Thread-safe. */
KINBOX_API int kinbox_version_num(void);

KINBOX_END_DECLS

#endif
