/*
 * settings.h -- the configuration as typed fields: one field per key of
 * the property table in conf.c, named after the key ('.' becomes '_').
 *
 * Each table entry names its field (offsetof), so a key's type, default
 * and range are written once, in the table. A conf fills its settings
 * when it is created, duplicated and each time kinbox_conf_set() accepts
 * a value, with the parser that validated it; modules read fields, never
 * keys, so a misspelt key is a compile error. kafka.* pass-through
 * properties are not settings (kinbox__conf_kafka_each()).
 *
 * Types: P_INT and P_DURATION (milliseconds) are int64_t, P_BOOL is
 * bool, P_STR is a string owned by the conf (NULL when unset without a
 * default), P_ENUM is the enum below whose order is that of the table's
 * "a|b|c" list.
 */
#ifndef KINBOX_SETTINGS_H
#define KINBOX_SETTINGS_H

#include <stdbool.h>
#include <stdint.h>

/* log.level: error|warning|notice|info|debug */
typedef enum {
        KINBOX__LEVEL_ERROR,
        KINBOX__LEVEL_WARNING,
        KINBOX__LEVEL_NOTICE,
        KINBOX__LEVEL_INFO,
        KINBOX__LEVEL_DEBUG
} kinbox__level_t;

/* log.format: text|json */
typedef enum { KINBOX__LOGFMT_TEXT, KINBOX__LOGFMT_JSON } kinbox__logfmt_t;

/* relay.claim: lock|lease */
typedef enum { KINBOX__CLAIM_LOCK, KINBOX__CLAIM_LEASE } kinbox__claim_t;

/* relay.source: poll|wal|binlog */
typedef enum {
        KINBOX__SOURCE_POLL,
        KINBOX__SOURCE_WAL,
        KINBOX__SOURCE_BINLOG
} kinbox__source_t;

/* inbox.layout, outbox.layout */
typedef enum {
        KINBOX__LAYOUT_PLAIN,
        KINBOX__LAYOUT_PARTITIONED
} kinbox__layout_t;

typedef struct kinbox__settings {
        const char *name;
        const char *database_url;
        const char *database_password_file;
        const char *topics;
        const char *group_id; /* name when unset */
        const char *handler;
        const char *handler_path;
        const char *message_id;
        int64_t workers;
        int64_t batch_max;
        int64_t batch_wait_ms;
        int64_t queue_max_messages;
        bool mysql_coalesce;
        int64_t retry_max;
        bool dead_letter_hold_key;
        const char *dead_letter_hold_key_source;
        int64_t dead_letter_release_poll_ms;
        int64_t retry_backoff_base_ms;
        int64_t retry_backoff_max_ms;
        int64_t reconnect_backoff_max_ms;
        kinbox__level_t log_level;
        kinbox__logfmt_t log_format;
        const char *tracing_endpoint;
        const char *tracing_sample_ratio; /* parsed by tracing.c */
        const char *tracing_service_name;
        const char *tracing_headers;
        int64_t tracing_queue_size;
        int64_t tracing_batch_size;
        int64_t tracing_interval_ms;
        int64_t tracing_timeout_ms;
        int64_t kafka_redelivery_window;
        int64_t inbox_retention;
        kinbox__layout_t inbox_layout;
        int64_t inbox_partition_width; /* ms */
        int64_t inbox_partition_skew; /* ms */
        int64_t inbox_partition_ahead; /* ms */
        int64_t outbox_retention;
        kinbox__layout_t outbox_layout;
        int64_t prune_interval;
        int64_t prune_batch;
        int64_t reconcile_interval;
        int64_t reconcile_grace;
        int64_t relay_batch_size;
        int64_t relay_run_max;
        int64_t relay_pipeline;
        kinbox__claim_t relay_claim;
        int64_t relay_lock_ms;
        int64_t relay_lease_ms;
        int64_t relay_poll_ms;
        int64_t relay_backoff_base_ms;
        int64_t relay_backoff_max_ms;
        int64_t relay_max_attempts;
        int64_t relay_action_timeout_ms;
        bool relay_notify;
        kinbox__source_t relay_source;
        const char *relay_slot;
        bool relay_slot_failover;
        int64_t relay_server_id;
        const char *relay_cloudevents_source;
        const char *relay_cloudevents_type;
        const char *relay_cloudevents_content_type;
        const char *relay_modules;
        bool console_enabled;
        const char *console_token_file;
        bool console_allow_remote;
} kinbox__settings_t;

struct kinbox_conf_s;
/* The settings of conf: valid, and unchanged, until the next
 * kinbox_conf_set() on conf or kinbox_conf_destroy(). */
const kinbox__settings_t *
kinbox__settings_of(const struct kinbox_conf_s *conf);

#endif
