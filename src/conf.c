/*
 * conf.c -- the property table, validation, and the generated reference.
 */
#include "confval.h"
#include "internal.h"
#include "settings.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { P_STR, P_INT, P_BOOL, P_ENUM, P_DURATION } ptype_t;

typedef struct prop {
        const char *key;
        size_t off; /* of its field in kinbox__settings_t */
        ptype_t type;
        const char *def;
        int64_t min, max; /* P_INT; P_DURATION in ms */
        const char *enums; /* P_ENUM: "a|b|c" */
        const char *doc;
} prop_t;

#define MAXI INT64_C(0x7fffffffffffffff)
/* The field a key fills (settings.h): the table names it, so the key's
 * type, default and range are written only here. */
#define S(field) offsetof(kinbox__settings_t, field)
/* clang-format off */
static const prop_t props[] = {
{"name", S(name), P_STR, "kinbox", 0, 0, NULL,
 "Consumer (or relay) name. The inbox key is (name, message id), so two consumers with different names each apply a message once."},
{"database.url", S(database_url), P_STR, NULL, 0, 0, NULL,
 "Database to use: `postgresql://user@host:port/db` (or `postgres://`) or `mysql://user@host:port/db`. Required. PostgreSQL takes libpq's list of hosts, `postgresql://user@host1:port1,host2:port2/db?target_session_attrs=read-write`: the primary of a pair whichever it is (docs/outbox.md, failover)."},
{"database.password_file", S(database_password_file), P_STR, NULL, 0, 0, NULL,
 "File whose first line is the database password (never logged). A password in the URL also works."},
{"topics", S(topics), P_STR, NULL, 0, 0, NULL,
 "Comma-separated topics to consume. Required for a consumer."},
{"group.id", S(group_id), P_STR, NULL, 0, 0, NULL,
 "Kafka consumer group; defaults to `name`."},
{"handler", S(handler), P_STR, NULL, 0, 0, NULL,
 "Handler name for `kinbox run`: a built-in (`points`, `ledger`) or a module `<handler.path>/<handler>.so`; a name with `/`, `..` or a control character is refused before anything is loaded."},
{"handler.path", S(handler_path), P_STR, NULL, 0, 0, NULL,
 "Directory searched for handler modules (`<handler>.so`)."},
{"message_id", S(message_id), P_STR, "header:message_id", 0, 0, NULL,
 "Where the message id comes from: `header:NAME`, `key`, `json:/pointer` (RFC 6901, into the payload) or `coords` (topic/partition/offset)."},
{"workers", S(workers), P_INT, "1", 1, 64, NULL,
 "Worker threads, each with its own database connection; partitions are spread over them."},
{"batch.max", S(batch_max), P_INT, "500", 1, 100000, NULL,
 "Most messages in one transaction. 1 gives one transaction per message."},
{"batch.wait.ms", S(batch_wait_ms), P_INT, "10", 0, 60000, NULL,
 "Longest wait for a batch to fill once its first message is there."},
{"queue.max.messages", S(queue_max_messages), P_INT, "2000", 1, 10000000, NULL,
 "Messages buffered per worker; when a worker is full the polling thread holds off (a stall over 3 s pauses partitions). With kafka.queued.min.messages it bounds memory."},
{"mysql.coalesce", S(mysql_coalesce), P_BOOL, "true", 0, 0, NULL,
 "MySQL/MariaDB: in a batch, single-row `INSERT ... VALUES (...)` statements with the same SQL text are sent as one multi-row INSERT (only tables without triggers or foreign keys, only pure expressions; see docs/mysql.md). `false` sends every statement as written."},
{"retry.max", S(retry_max), P_INT, "8", 0, 1000, NULL,
 "Attempts for a message whose handler says RETRY before it is dead-lettered."},
{"dead_letter.hold_key", S(dead_letter_hold_key), P_BOOL, "false", 0, 0, NULL,
 "Per-key order across failures: once a message is dead-lettered, the later messages of its key on its partition are parked (stored with their inbox row, offset moves on) instead of applied, until the dead letter is replayed or discarded; then the running consumer applies them in offset order. Messages without a key are never held (see docs/operations.md, Holding a key)."},
{"dead_letter.hold_key.source", S(dead_letter_hold_key_source), P_STR, "key", 0, 0, NULL,
 "What a held key is: `key` (the Kafka key), `header:NAME` (a header's bytes) or `json:/pointer` (a payload field). At most 1024 bytes; a message without one is never held."},
{"dead_letter.release.poll.ms", S(dead_letter_release_poll_ms), P_INT, "1000", 10, 3600000, NULL,
 "While a worker holds keys: how often it looks for holds whose dead letter was replayed or discarded, to apply their parked messages."},
{"retry.backoff.base.ms", S(retry_backoff_base_ms), P_INT, "100", 1, 3600000, NULL,
 "First retry backoff ceiling; doubles per attempt, full jitter."},
{"retry.backoff.max.ms", S(retry_backoff_max_ms), P_INT, "30000", 1, 86400000, NULL,
 "Largest retry backoff."},
{"reconnect.backoff.max.ms", S(reconnect_backoff_max_ms), P_INT, "5000", 10, 600000, NULL,
 "Largest wait between database reconnect attempts."},
{"log.level", S(log_level), P_ENUM, "info", 0, 0, "error|warning|notice|info|debug",
 "Most verbose level logged."},
{"log.format", S(log_format), P_ENUM, "text", 0, 0, "text|json",
 "Default logger format on stderr: one line per event."},
{"tracing.endpoint", S(tracing_endpoint), P_STR, NULL, 0, 0, NULL,
 "OTLP/HTTP collector to send spans to (e.g. `http://127.0.0.1:4318`; spans are POSTed as JSON to `/v1/traces` under it). Unset: no spans are recorded or sent (trace context in `traceparent` headers is still carried). One exporter per process: the first consumer or relay that starts sets the tracing.* settings."},
{"tracing.sample.ratio", S(tracing_sample_ratio), P_STR, "1", 0, 0, NULL,
 "Share of new traces recorded, 0 to 1. A message or outbox row that carries a `traceparent` follows its sampled flag instead (parent-based sampling)."},
{"tracing.service.name", S(tracing_service_name), P_STR, "kinbox", 0, 0, NULL,
 "The `service.name` resource attribute of the spans."},
{"tracing.headers", S(tracing_headers), P_STR, NULL, 0, 0, NULL,
 "Extra HTTP headers for the collector, `name=value,name2=value2` (e.g. an authorization token)."},
{"tracing.queue.size", S(tracing_queue_size), P_INT, "2048", 1, 1000000, NULL,
 "Finished spans held for export; when full, new spans are dropped and counted in kinbox_tracing_spans_dropped_total (the consumer never waits on the collector)."},
{"tracing.batch.size", S(tracing_batch_size), P_INT, "512", 1, 100000, NULL,
 "Most spans in one export request."},
{"tracing.interval.ms", S(tracing_interval_ms), P_INT, "1000", 10, 600000, NULL,
 "Longest time a finished span waits before it is sent."},
{"tracing.timeout.ms", S(tracing_timeout_ms), P_INT, "5000", 100, 600000, NULL,
 "Deadline of one export request; a request that fails or times out is dropped (counted), not retried."},
{"kafka.redelivery.window", S(kafka_redelivery_window), P_DURATION, "7d", 0, MAXI, NULL,
 "How far back the broker can redeliver (topic retention) when the broker cannot be asked. The inbox retention must exceed it."},
{"inbox.retention", S(inbox_retention), P_DURATION, "14d", 60000, MAXI, NULL,
 "Inbox rows older than this are pruned. Must exceed the redelivery window."},
{"inbox.layout", S(inbox_layout), P_ENUM, "plain", 0, 0, "plain|partitioned",
 "`plain`: one table, pruned by batched DELETEs. `partitioned`: one partition per `inbox.partition.width` of message time, pruned by dropping whole partitions; `kinbox migrate` creates it or converts a plain inbox online (see docs/operations.md, Daily partitions)."},
{"inbox.partition.width", S(inbox_partition_width), P_DURATION, "1d", 3600000, 86400000, NULL,
 "Range of message time (UTC) one inbox partition holds: a whole number of hours dividing a day (`1d`, `12h`, `1h`, ...). Fixed when the inbox is partitioned; every consumer uses the width recorded in the database."},
{"inbox.partition.skew", S(inbox_partition_skew), P_DURATION, "10m", 0, 43200000, NULL,
 "Two deliveries of one message id whose message times differ by at most this much are caught as duplicates across a partition boundary (a message this close to a boundary also writes a marker row in the neighbouring partition). Less than half the width."},
{"inbox.partition.ahead", S(inbox_partition_ahead), P_DURATION, "3d", 3600000, 2592000000, NULL,
 "How far ahead of now the pruner (and `kinbox migrate`) keeps inbox partitions created. Rows whose message time has no partition go to a catch-all partition and are never refused."},
{"outbox.retention", S(outbox_retention), P_DURATION, "7d", 60000, MAXI, NULL,
 "Sent outbox rows older than this are pruned. With relay.source = wal or binlog, event rows (not action:NAME rows) created longer ago than this are pruned whatever their status: the log relay never marks them. Dead rows are kept."},
{"outbox.layout", S(outbox_layout), P_ENUM, "plain", 0, 0, "plain|partitioned",
 "`plain`: one table, sent rows pruned by batched DELETEs. `partitioned`: one partition per UTC day of created_at, pruned by dropping whole days past outbox.retention (with relay.source = poll only days without pending rows; with wal or binlog only days behind the relay's confirmed position); dead rows are kept. `kinbox migrate` creates it or converts a plain outbox, holding writers while it copies (see docs/outbox.md, Write-only retention)."},
{"prune.interval", S(prune_interval), P_DURATION, "10m", 1000, MAXI, NULL,
 "How often the pruner runs."},
{"prune.batch", S(prune_batch), P_INT, "1000", 1, 1000000, NULL,
 "Rows deleted per pruning statement."},
{"reconcile.interval", S(reconcile_interval), P_DURATION, "1h", 0, MAXI, NULL,
 "How often `kinbox run` runs the reconciliation checks of its handler modules (one replica at a time, a database lock; the first run within a minute of the start); 0 turns the periodic run off (`kinbox reconcile` still works)."},
{"reconcile.grace", S(reconcile_grace), P_DURATION, "5m", 0, MAXI, NULL,
 "Reconciliation checks report only discrepancies older than this (work still in flight is not a discrepancy)."},
{"relay.batch.size", S(relay_batch_size), P_INT, "1000", 1, 100000, NULL,
 "Most outbox rows one relay claim takes. Claims follow the backlog: they start at this size, halve after a claim less than half full (down to 16) and double after a full one. Also bounds the run of one aggregate's consecutive rows claimed together."},
{"relay.run.max", S(relay_run_max), P_INT, "1000", 1, 100000, NULL,
 "Most consecutive pending rows of one aggregate (same destination, in order) one claim takes together; 1 claims only the oldest pending row of each aggregate. If a row of a run fails, the rows after it go back to pending untouched (no attempt charged) and stay behind it."},
{"relay.pipeline", S(relay_pipeline), P_INT, "1", 1, 4, NULL,
 "Claimed batches a relay keeps in flight: with 2 or more the next batch is claimed and published while the previous one waits for its delivery reports. No new batch is produced while one in flight has waited half of kafka.message.timeout.ms, so a batch's delivery deadline (which purges the producer, requests in flight included) meets a younger batch's rows only after they had half the deadline to be acknowledged (rows purged in flight that the broker had written are published again: at least once). 1 by default: the relay's time goes to its claims and marks on its one database connection, so a second batch in flight does not make it faster. Above 1 every claim is leased (relay.claim = lock needs the connection's one transaction per batch)."},
{"relay.claim", S(relay_claim), P_ENUM, "lock", 0, 0, "lock|lease",
 "How a claim holds its rows while they are published. lock: the claim's transaction keeps their row locks (FOR UPDATE SKIP LOCKED, nothing written) until the marks, one row write per row; a batch degrades to leases (written and committed in that transaction) when its delivery reports take longer than relay.lock.ms, when it holds local actions, and always with relay.pipeline above 1. lease: every claim writes a lease (relay.lease.ms, version bumped) and commits before publishing. Relays of either kind share a table."},
{"relay.lock.ms", S(relay_lock_ms), P_INT, "250", 1, 60000, NULL,
 "Longest a lock-held claim's transaction stays open waiting for its delivery reports, counted from its BEGIN (at most half of kafka.message.timeout.ms); past it the batch's rows are leased and the transaction commits."},
{"relay.lease.ms", S(relay_lease_ms), P_INT, "30000", 100, 86400000, NULL,
 "How long a claimed outbox row belongs to one relay before another may take it."},
{"relay.poll.ms", S(relay_poll_ms), P_INT, "500", 1, 3600000, NULL,
 "Relay poll interval (the fallback to LISTEN/NOTIFY on PostgreSQL; the wake-up on MySQL)."},
{"relay.backoff.base.ms", S(relay_backoff_base_ms), P_INT, "200", 1, 3600000, NULL,
 "First publish retry backoff ceiling; doubles per attempt, full jitter."},
{"relay.backoff.max.ms", S(relay_backoff_max_ms), P_INT, "60000", 1, 86400000, NULL,
 "Largest publish retry backoff."},
{"relay.max_attempts", S(relay_max_attempts), P_INT, "10", 1, 1000000, NULL,
 "Default attempts before an outbox row is dead (per row override: max_attempts)."},
{"relay.action.timeout.ms", S(relay_action_timeout_ms), P_INT, "10000", 1, 86400000, NULL,
 "Local action time limit; an overrun counts as RETRY. Must be shorter than relay.lease.ms."},
{"relay.source", S(relay_source), P_ENUM, "poll", 0, 0, "poll|wal|binlog",
 "Where the relay finds the events it publishes. poll: claims and marks rows of kinbox_outbox (any backend). wal (PostgreSQL, wal_level = logical, a role with REPLICATION): streams the inserts into kinbox_outbox and the kinbox_outbox_emit_pg() messages from a logical replication slot (relay.slot) and never updates an outbox row; local actions (action:NAME rows) stay with the polling relay of the same process. binlog (MariaDB): reads the ROW binlog. See docs/outbox.md (the log relay)."},
{"relay.slot", S(relay_slot), P_STR, NULL, 0, 0, NULL,
 "relay.source = wal: the logical replication slot's name (created when missing); unset: kinbox_ followed by name (characters other than a-z, 0-9 and _ become _)."},
{"relay.slot_failover", S(relay_slot_failover), P_BOOL, "false", 0, 0, NULL,
 "relay.source = wal: create the slot (relay.slot) as a failover slot, synchronized to physical standbys (PostgreSQL 17 and later, with sync_replication_slots on the standby): after a failover the relay goes on from the promoted standby. A slot that exists without it is altered. On PostgreSQL 16 and earlier the relay refuses to start with it set. See docs/outbox.md (failover)."},
{"relay.server_id", S(relay_server_id), P_INT, "0", 0, 4294967295LL, NULL,
 "relay.source = binlog: the server id the relay's binlog reader registers with (it must differ from every server's and replica's); 0: 0x4B42xxxx, xxxx from name. Relays of one name share it: one reads at a time (a named lock), the other waits and takes over."},
{"relay.notify", S(relay_notify), P_BOOL, "true", 0, 0, NULL,
 "Use PostgreSQL LISTEN/NOTIFY to wake the relay at once."},
{"relay.cloudevents.source", S(relay_cloudevents_source), P_STR, NULL, 0, 0, NULL,
 "When set, every event is published in CloudEvents binary mode (the Kafka protocol binding): the relay adds the headers ce_specversion (1.0), ce_id (the message id), ce_source (this value, a URI-reference such as /points-service), ce_type, ce_time (the row's created_at, UTC, milliseconds) and content-type, each unless the row's stored headers set it. Unset: no CloudEvents headers."},
{"relay.cloudevents.type", S(relay_cloudevents_type), P_STR, NULL, 0, 0, NULL,
 "ce_type of rows whose stored headers do not set ce_type (CloudEvents on); unset: the destination topic's name."},
{"relay.cloudevents.content_type", S(relay_cloudevents_content_type), P_STR, "application/json", 0, 0, NULL,
 "content-type header of rows whose stored headers do not set it (CloudEvents on): the payload's media type, CloudEvents' datacontenttype."},
{"relay.modules", S(relay_modules), P_STR, NULL, 0, 0, NULL,
 "Comma-separated handler modules whose local actions the relay of `kinbox run` registers (`[relay] modules = ...`)."},
{"console.enabled", S(console_enabled), P_BOOL, "false", 0, 0, NULL,
 "`kinbox run`: serve the operator's console at `/console` on the `[metrics] listen` endpoint (see docs/console.md). Read-only unless console.token_file is set."},
{"console.token_file", S(console_token_file), P_STR, NULL, 0, 0, NULL,
 "File whose first line is the console's bearer token (at least 16 characters, never logged). Set: the console's actions (replay, discard, requeue, cancel, pause, resume) accept `Authorization: Bearer TOKEN`; unset: the console is read-only."},
{"console.allow_remote", S(console_allow_remote), P_BOOL, "false", 0, 0, NULL,
 "Answer console requests from addresses other than loopback (127.0.0.0/8, ::1). `false`: they get 403 whatever `[metrics] listen` binds."},
};
/* clang-format on */
#define NPROPS KINBOX__ARRAY_SIZE(props)

typedef struct kv {
        char *k, *v;
} kv_t;

struct kinbox_conf_s {
        char *vals[NPROPS]; /* NULL = default */
        kinbox__settings_t set; /* vals[] (or the defaults), parsed */
        kv_t *kafka;
        size_t nkafka, capkafka;
        kinbox_log_cb log_cb;
        void *log_opaque;
};

static int
prop_find(const char *key)
{
        for (size_t i = 0; i < NPROPS; i++)
                if (!strcmp(props[i].key, key))
                        return (int)i;
        return -1;
}

/* P_ENUM fields are written as int (the position in the list). */
_Static_assert(sizeof(kinbox__level_t) == sizeof(int) &&
                   sizeof(kinbox__logfmt_t) == sizeof(int) &&
                   sizeof(kinbox__claim_t) == sizeof(int) &&
                   sizeof(kinbox__layout_t) == sizeof(int),
               "P_ENUM fields are int-sized");

/* The position of v in p's "a|b|c" list, or -1. */
static int
enum_index(const prop_t *p, const char *v)
{
        size_t n = strlen(v);
        int i = 0;
        for (const char *e = p->enums; *e; i++) {
                const char *bar = strchr(e, '|');
                size_t l = bar ? (size_t)(bar - e) : strlen(e);
                if (l == n && !strncmp(e, v, n))
                        return i;
                e += l + (bar ? 1 : 0);
        }
        return -1;
}

/* Parse props[i]'s value (validated by kinbox_conf_set, or the table's
 * default) into its field; group.id follows name while unset. */
static void
settings_store(kinbox_conf_t *conf, size_t i)
{
        const prop_t *p = &props[i];
        const char *v = conf->vals[i] ? conf->vals[i] : p->def;
        char *f = (char *)&conf->set + p->off;
        switch (p->type) {
        case P_STR:
                *(const char **)f = v;
                break;
        case P_BOOL: {
                bool b = false;
                if (v)
                        kinbox__confval_bool(p->key, v, &b, NULL, 0);
                *(bool *)f = b;
                break;
        }
        case P_ENUM: {
                int e = v ? enum_index(p, v) : 0;
                *(int *)f = e < 0 ? 0 : e;
                break;
        }
        case P_INT:
        case P_DURATION: {
                int64_t n = 0;
                if (v && p->type == P_INT)
                        kinbox__confval_int(p->key, v, INT64_MIN, INT64_MAX,
                                            &n, NULL, 0);
                else if (v)
                        kinbox__confval_duration(p->key, v, 0, INT64_MAX, &n,
                                                 NULL, 0);
                *(int64_t *)f = n;
                break;
        }
        }
        /* group.id unset: the consumer group is the name. */
        for (size_t g = 0; g < NPROPS; g++)
                if (props[g].off == S(group_id) && !conf->vals[g])
                        conf->set.group_id = conf->set.name;
}

static void
settings_fill(kinbox_conf_t *conf)
{
        for (size_t i = 0; i < NPROPS; i++)
                settings_store(conf, i);
}

const kinbox__settings_t *
kinbox__settings_of(const kinbox_conf_t *conf)
{
        return &conf->set;
}

kinbox_conf_t *
kinbox_conf_new(void)
{
        kinbox_conf_t *c = kinbox__calloc(1, sizeof(kinbox_conf_t));
        if (c)
                settings_fill(c);
        return c;
}

void
kinbox_conf_destroy(kinbox_conf_t *conf)
{
        if (!conf)
                return;
        for (size_t i = 0; i < NPROPS; i++)
                free(conf->vals[i]);
        for (size_t i = 0; i < conf->nkafka; i++) {
                free(conf->kafka[i].k);
                free(conf->kafka[i].v);
        }
        free(conf->kafka);
        free(conf);
}

kinbox_conf_t *
kinbox_conf_dup(const kinbox_conf_t *conf)
{
        kinbox_conf_t *c = kinbox_conf_new();
        if (!c)
                return NULL;
        c->log_cb = conf->log_cb;
        c->log_opaque = conf->log_opaque;
        for (size_t i = 0; i < NPROPS; i++)
                if (conf->vals[i] &&
                    !(c->vals[i] = kinbox__strdup(conf->vals[i])))
                        goto oom;
        if (conf->nkafka) {
                c->kafka = kinbox__calloc(conf->nkafka, sizeof(kv_t));
                if (!c->kafka)
                        goto oom;
                c->capkafka = conf->nkafka;
                for (size_t i = 0; i < conf->nkafka; i++) {
                        c->kafka[i].k = kinbox__strdup(conf->kafka[i].k);
                        c->kafka[i].v = kinbox__strdup(conf->kafka[i].v);
                        c->nkafka++;
                        if (!c->kafka[i].k || !c->kafka[i].v)
                                goto oom;
                }
        }
        settings_fill(c);
        return c;
oom:
        kinbox_conf_destroy(c);
        return NULL;
}

static int
check_msgid(const char *v)
{
        if (!strcmp(v, "key") || !strcmp(v, "coords"))
                return 0;
        if (!strncmp(v, "header:", 7) && v[7])
                return 0;
        if (!strncmp(v, "json:", 5) && (v[5] == '/' || !v[5]))
                return 0;
        return -1;
}

/* A handler or module name becomes "<handler.path>/<name>.so": a name that
 * could leave that directory is refused before anything is loaded. */
static int
check_module_names(const char *key, const char *v, char *errstr, size_t sz)
{
        size_t n = strlen(v);
        for (size_t i = 0; i < n; i++) {
                if (v[i] == '/' || (v[i] == '.' && v[i + 1] == '.') ||
                    (unsigned char)v[i] < 0x20) {
                        kinbox__errstr(errstr, sz,
                                       "%s: \"%.80s\" is not a handler name "
                                       "(no '/', no '..', no control "
                                       "characters)",
                                       key, v);
                        return -1;
                }
        }
        return 0;
}

static kinbox_err_t
validate(const prop_t *p, const char *value, char *errstr, size_t sz)
{
        switch (p->type) {
        case P_STR:
                if (!strcmp(p->key, "message_id") && check_msgid(value)) {
                        kinbox__errstr(errstr, sz,
                                       "message_id: \"%s\" is not one of "
                                       "header:NAME, key, json:/pointer, "
                                       "coords",
                                       value);
                        return KINBOX_ERR_INVALID;
                }
                if (!strcmp(p->key, "dead_letter.hold_key.source") &&
                    (check_msgid(value) || !strcmp(value, "coords"))) {
                        kinbox__errstr(errstr, sz,
                                       "dead_letter.hold_key.source: \"%s\" "
                                       "is not one of key, header:NAME, "
                                       "json:/pointer",
                                       value);
                        return KINBOX_ERR_INVALID;
                }
                if (!strcmp(p->key, "topics") &&
                    kinbox__confval_topics(p->key, value, errstr, sz))
                        return KINBOX_ERR_INVALID;
                if ((!strcmp(p->key, "handler") ||
                     !strcmp(p->key, "relay.modules")) &&
                    check_module_names(p->key, value, errstr, sz))
                        return KINBOX_ERR_INVALID;
                return KINBOX_OK;
        case P_INT: {
                int64_t n;
                return kinbox__confval_int(p->key, value, p->min, p->max, &n,
                                           errstr, sz)
                           ? KINBOX_ERR_INVALID
                           : KINBOX_OK;
        }
        case P_BOOL: {
                bool b;
                return kinbox__confval_bool(p->key, value, &b, errstr, sz)
                           ? KINBOX_ERR_INVALID
                           : KINBOX_OK;
        }
        case P_ENUM: {
                if (enum_index(p, value) >= 0)
                        return KINBOX_OK;
                kinbox__errstr(errstr, sz, "%s: \"%s\" is not one of %s",
                               p->key, value, p->enums);
                return KINBOX_ERR_INVALID;
        }
        case P_DURATION: {
                int64_t ms;
                if (kinbox__confval_duration(p->key, value, p->min, p->max,
                                             &ms, errstr, sz))
                        return KINBOX_ERR_INVALID;
                if (!strcmp(p->key, "inbox.partition.width") &&
                    (ms % 3600000 || 86400000 % ms)) {
                        kinbox__errstr(errstr, sz,
                                       "inbox.partition.width: \"%s\" is "
                                       "not a whole number of hours that "
                                       "divides a day (1h, 2h, 3h, 4h, 6h, "
                                       "8h, 12h, 1d)",
                                       value);
                        return KINBOX_ERR_INVALID;
                }
                return KINBOX_OK;
        }
        }
        return KINBOX_ERR_INVALID;
}

kinbox_err_t
kinbox_conf_set(kinbox_conf_t *conf, const char *key, const char *value,
                char *errstr, size_t errstr_size)
{
        if (!conf || !key || !value) {
                kinbox__errstr(errstr, errstr_size,
                               "kinbox_conf_set: NULL argument");
                return KINBOX_ERR_INVALID;
        }
        if (!strncmp(key, "kafka.", 6) &&
            strcmp(key, "kafka.redelivery.window")) {
                const char *k = key + 6;
                if (!*k) {
                        kinbox__errstr(errstr, errstr_size,
                                       "\"%s\": empty Kafka property", key);
                        return KINBOX_ERR_UNKNOWN_KEY;
                }
                for (size_t i = 0; i < conf->nkafka; i++) {
                        if (!strcmp(conf->kafka[i].k, k)) {
                                char *v = kinbox__strdup(value);
                                if (!v)
                                        return KINBOX_ERR_NOMEM;
                                free(conf->kafka[i].v);
                                conf->kafka[i].v = v;
                                return KINBOX_OK;
                        }
                }
                if (conf->nkafka == conf->capkafka) {
                        size_t cap = conf->capkafka ? conf->capkafka * 2 : 8;
                        kv_t *n = realloc(conf->kafka, cap * sizeof(kv_t));
                        if (!n)
                                return KINBOX_ERR_NOMEM;
                        conf->kafka = n;
                        conf->capkafka = cap;
                }
                kv_t *e = &conf->kafka[conf->nkafka];
                e->k = kinbox__strdup(k);
                e->v = kinbox__strdup(value);
                if (!e->k || !e->v) {
                        free(e->k);
                        free(e->v);
                        return KINBOX_ERR_NOMEM;
                }
                conf->nkafka++;
                return KINBOX_OK;
        }
        int i = prop_find(key);
        if (i < 0) {
                const char *keys[NPROPS];
                for (size_t k = 0; k < NPROPS; k++)
                        keys[k] = props[k].key;
                const char *near = kinbox__closest(key, keys, NPROPS);
                kinbox__errstr(errstr, errstr_size,
                               "unknown configuration key \"%s\"%s%s%s", key,
                               near ? " (did you mean \"" : "",
                               near ? near : "", near ? "\"?)" : "");
                return KINBOX_ERR_UNKNOWN_KEY;
        }
        kinbox_err_t err = validate(&props[i], value, errstr, errstr_size);
        if (err)
                return err;
        char *v = kinbox__strdup(value);
        if (!v)
                return KINBOX_ERR_NOMEM;
        free(conf->vals[i]);
        conf->vals[i] = v;
        settings_store(conf, (size_t)i);
        return KINBOX_OK;
}

const char *
kinbox_conf_get(const kinbox_conf_t *conf, const char *key)
{
        if (!conf || !key)
                return NULL;
        if (!strncmp(key, "kafka.", 6) &&
            strcmp(key, "kafka.redelivery.window")) {
                for (size_t i = 0; i < conf->nkafka; i++)
                        if (!strcmp(conf->kafka[i].k, key + 6))
                                return conf->kafka[i].v;
                return NULL;
        }
        int i = prop_find(key);
        if (i < 0)
                return NULL;
        /* The string settings are the value or the default (group.id's
         * being the name). */
        if (props[i].type == P_STR)
                return *(const char *const *)((const char *)&conf->set +
                                              props[i].off);
        return conf->vals[i] ? conf->vals[i] : props[i].def;
}

void
kinbox_conf_set_log_cb(kinbox_conf_t *conf, kinbox_log_cb cb, void *opaque)
{
        conf->log_cb = cb;
        conf->log_opaque = opaque;
}

void
kinbox__conf_kafka_each(const kinbox_conf_t *conf,
                        void (*fn)(const char *k, const char *v, void *arg),
                        void *arg)
{
        for (size_t i = 0; i < conf->nkafka; i++)
                fn(conf->kafka[i].k, conf->kafka[i].v, arg);
}

void
kinbox__conf_logger(const kinbox_conf_t *conf, kinbox__log_t *out)
{
        static const int lv[] = {[KINBOX__LEVEL_ERROR] = KINBOX_LOG_ERR,
                                 [KINBOX__LEVEL_WARNING] = KINBOX_LOG_WARNING,
                                 [KINBOX__LEVEL_NOTICE] = KINBOX_LOG_NOTICE,
                                 [KINBOX__LEVEL_INFO] = KINBOX_LOG_INFO,
                                 [KINBOX__LEVEL_DEBUG] = KINBOX_LOG_DEBUG};
        out->level = lv[conf->set.log_level];
        out->json = conf->set.log_format == KINBOX__LOGFMT_JSON;
        out->cb = conf->log_cb;
        out->opaque = conf->log_opaque;
}

int
kinbox__conf_password(const kinbox_conf_t *conf, char **out, char *errstr,
                      size_t errstr_size)
{
        *out = NULL;
        const char *path = conf->set.database_password_file;
        if (!path)
                return 0;
        FILE *fp = fopen(path, "r");
        if (!fp) {
                kinbox__errstr(errstr, errstr_size,
                               "database.password_file: cannot open %s: %s",
                               path, strerror(errno));
                return -1;
        }
        char line[1024];
        if (!fgets(line, sizeof(line), fp))
                line[0] = '\0';
        fclose(fp);
        line[strcspn(line, "\r\n")] = '\0';
        *out = kinbox__strdup(line);
        return *out ? 0 : -1;
}

static const char *
type_name(ptype_t t)
{
        switch (t) {
        case P_STR:
                return "string";
        case P_INT:
                return "integer";
        case P_BOOL:
                return "boolean";
        case P_ENUM:
                return "enum";
        case P_DURATION:
                return "duration";
        }
        return "?";
}

/* A duration for people: the largest unit that divides it. */
static void
fmt_ms(int64_t ms, char *b, size_t sz)
{
        static const struct {
                int64_t ms;
                const char *u;
        } units[] = {
            {86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
                if (ms && ms % units[i].ms == 0) {
                        snprintf(b, sz, "%lld%s",
                                 (long long)(ms / units[i].ms), units[i].u);
                        return;
                }
        snprintf(b, sz, ms ? "%lldms" : "%lld", (long long)ms);
}

/* A property's range for the reference ("" when it has none). */
static void
range_of(const prop_t *p, char *b, size_t sz)
{
        char lo[32], hi[32];
        b[0] = '\0';
        if (p->type == P_INT) {
                snprintf(b, sz, "%lld..%lld", (long long)p->min,
                         (long long)p->max);
        } else if (p->type == P_DURATION) {
                fmt_ms(p->min, lo, sizeof(lo));
                fmt_ms(p->max, hi, sizeof(hi));
                snprintf(b, sz, "%s..%s", lo, p->max >= MAXI ? "" : hi);
        } else if (p->type == P_ENUM) {
                snprintf(b, sz, "%s", p->enums);
        }
}

void
kinbox_conf_write_reference(FILE *fp)
{
        fprintf(fp, "| key | type | default | range | description |\n"
                    "|---|---|---|---|---|\n");
        for (size_t i = 0; i < NPROPS; i++) {
                const prop_t *p = &props[i];
                char range[128];
                range_of(p, range, sizeof(range));
                fprintf(fp, "| `%s` | %s | %s | %s | %s |\n", p->key,
                        type_name(p->type), p->def ? p->def : "—", range,
                        p->doc);
        }
        fprintf(fp, "| `kafka.*` | string | — | | Passed to librdkafka "
                    "unchanged without the `kafka.` prefix (see librdkafka's "
                    "CONFIGURATION.md). The relay's producer uses "
                    "`partitioner = murmur2_random` (the partition Kafka's "
                    "Java producer picks for a key; docs/interop.md) unless "
                    "`kafka.partitioner` is set. |\n");
}

/* roff text: `code` becomes bold, backslashes are escaped, and a line
 * never starts with a control character. */
static void
man_text(FILE *fp, const char *s)
{
        bool bold = false;
        if (*s == '.' || *s == '\'')
                fputs("\\&", fp);
        for (; *s; s++) {
                if (*s == '`') {
                        fputs(bold ? "\\fR" : "\\fB", fp);
                        bold = !bold;
                } else if (*s == '\\') {
                        fputs("\\e", fp);
                } else if (*s == '-') {
                        fputs("\\-", fp);
                } else {
                        fputc(*s, fp);
                }
        }
        if (bold)
                fputs("\\fR", fp);
}

void
kinbox_conf_write_reference_man(FILE *fp)
{
        for (size_t i = 0; i < NPROPS; i++) {
                const prop_t *p = &props[i];
                fprintf(fp, ".TP\n.B ");
                man_text(fp, p->key);
                fprintf(fp, " \\fR(%s", type_name(p->type));
                if (p->def) {
                        fprintf(fp, ", default ");
                        man_text(fp, p->def);
                }
                if (p->type == P_INT || p->type == P_DURATION) {
                        char range[128];
                        range_of(p, range, sizeof(range));
                        fprintf(fp, ", ");
                        man_text(fp, range);
                } else if (p->type == P_ENUM) {
                        fprintf(fp, ", one of ");
                        man_text(fp, p->enums);
                }
                fprintf(fp, ")\n");
                man_text(fp, p->doc);
                fputc('\n', fp);
        }
        fprintf(fp,
                ".TP\n.B kafka.*\n\\fR(string) Passed to librdkafka "
                "unchanged without the \\fBkafka.\\fR prefix (see "
                "librdkafka's CONFIGURATION.md). The relay's producer uses "
                "\\fBpartitioner = murmur2_random\\fR (the partition "
                "Kafka's Java producer picks for a key) unless "
                "\\fBkafka.partitioner\\fR is set.\n");
}
