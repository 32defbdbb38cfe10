/*
 * logrelay_common.h -- helpers shared by the log relay suites
 * (walrelay_test on PostgreSQL, binlogrelay_test on MariaDB): concurrent
 * writers with rollbacks and the check of their stream, the parity rows
 * and the comparison with the polling relay, rows appended one per
 * transaction.
 */
#ifndef KINBOX_TESTS_LOGRELAY_COMMON_H
#define KINBOX_TESTS_LOGRELAY_COMMON_H

#include "outbox_common.h"

#include <sys/types.h>

/* A log relay's configuration (relay_conf()): relay.source source
 * ("wal", "binlog"), relay.slot slot (the relay's name). */
kinbox_conf_t *log_conf(const char *url, const char *bootstrap,
                        const char *source, const char *slot);

/* A kinbox.ini of url (kt_write_ini()) with that log relay enabled. */
char *log_ini(const char *url, const char *source, const char *slot);

#define AGGS 8

typedef struct writer {
        const char *backend, *url, *topic;
        int w, ntx;
        int committed, rolled; /* rows */
        int *seq; /* per aggregate: the next sequence number committed */
} writer_t;

/* Transactions of 1..20 rows on the writer's aggregates, every fifth
 * rolled back; payload the aggregate's sequence number, idem
 * "wW-aA-sS-tT" (rolled back: "rb-..."): committed sequence numbers of an
 * aggregate have no gaps. A pthread start routine (arg: writer_t *). */
void *writer_main(void *arg);

/* Every committed row at least once, no rolled-back row, and per
 * aggregate the first occurrences in sequence order with no gap; *dups
 * the later occurrences. got sorted by by_offset. */
void check_stream(const tmsgs_t *got, const writer_t *ws, int nw, int *dups);

/* qsort order (partition, offset): messages of one partition come in
 * offset order from consume(); an aggregate lives on one partition. */
int by_offset(const void *x, const void *y);

/* Actions "count" run (count_action, registered by the parity tests). */
extern _Atomic int actions_run;
kinbox_result_t count_action(kinbox_action_t *a, void *opaque);

/* The rows of the parity tests: n events on 5 aggregates in two
 * transactions (some without key, payload or headers), a rolled-back row
 * and one action row (destination "action:count"). */
void parity_rows(const char *backend, const char *url, const char *topic,
                 int n);

/* The polling relay (cloudevents source ce_source) publishes the n event
 * rows of parity_rows again: every message on the topic twice, both
 * copies with the same key, value, timestamp, headers and (keyed)
 * partition. */
void assert_polling_parity(const char *url, const char *bootstrap,
                           const char *topic, int n, const char *ce_source);

/* Rows inserted as one transaction each: destination topic, idem
 * "PREFIX-i", aggregate "agg", payload i. */
void append_rows(const char *backend, const char *url, const char *topic,
                 const char *prefix, int from, int n);

/* One transaction of n rows: destination topic, idem "r-i", aggregate
 * "one", payload i, for i from from. */
void append_tx(const char *backend, const char *url, const char *topic,
               int from, int n);

/* got (sorted here by by_offset) holds the payloads 0..n-1 of one
 * aggregate in order, without a gap; a payload below the next one
 * expected is a repeat (published again after a restart). */
void assert_in_order(tmsgs_t *got, int n);

/* Every row PREFIX-from .. PREFIX-(from+n-1) at least once on got. */
void assert_all(const tmsgs_t *got, const char *topic, const char *prefix,
                int from, int n);

/* Within timeout_s the log relay of url is reading: on PostgreSQL its
 * slot name has an active reader; on MariaDB the relay name has a
 * position row. */
bool log_reading(const char *backend, const char *url, const char *name,
                 int timeout_s);

/* Every broker down (kill -9 of the Apache Kafka broker on real Kafka,
 * KT_BROKER=kafka; "broker-down all" on the dev broker), or up again
 * (started with its data; returns once it answers). */
void brokers_down(void);
void brokers_up(void);

/* A `kinbox run` of a log relay (relay.source source, relay.slot name)
 * on a fresh database of backend, publishing to topic (4 partitions). */
typedef struct logrun {
        const char *backend, *source;
        char *url, *topic, *name, *ini, *log;
        pid_t pid;
} logrun_t;

/* Make the database, topic and ini (migrated), start `kinbox run` and wait
 * until it reads the log; tag names the topic and relay. */
void logrun_start(logrun_t *lr, const char *backend, const char *source,
                  const char *tag);

/* Two writers (writer_main, 150 transactions each, rollbacks included)
 * while `kinbox run` is SIGKILLed mid-stream and started again; with
 * broker_kill, every broker is killed first and comes back after the
 * relay's restart (the relay killed with records in flight, the new one
 * starting with no broker). Then every committed row on the topic at
 * least once, no rolled-back row, per-aggregate order (check_stream),
 * the duplicates logged; caught_up (NULL: none) is asserted before
 * SIGTERM; no outbox row updated. Returns the duplicates. */
int two_writers_kill(logrun_t *lr, bool broker_kill,
                     bool (*caught_up)(const char *url, const char *name));

/* Two `kinbox run` of one relay name (tag names the topic and relay):
 * the second waits (its log says waiting) while the first publishes 50
 * rows; after a kill -9 of the first it takes over (its log says ours,
 * unless NULL) and publishes the next 50: every row on the topic, in
 * order (assert_in_order); caught_up (NULL: none) asserted before the
 * second stops. Returns the database and name in *lr. */
void
takeover_after_kill9(logrun_t *lr, const char *backend, const char *source,
                     const char *tag, const char *waiting, const char *ours,
                     bool (*caught_up)(const char *url, const char *name));

/* An in-process log relay (relay_new(log_conf()), relay_start) on a fresh
 * database of backend, publishing to topic; name its slot / relay name. */
typedef struct logrel {
        const char *backend, *bootstrap;
        char *url, *topic, *name;
        kinbox_relay_t *r;
        trelay_t tr;
} logrel_t;

/* Make the database and the topic (partitions), start the relay and wait
 * until it reads the log; tag names the topic and the relay. */
void logrel_start(logrel_t *l, const char *backend, const char *source,
                  const char *tag, int partitions);
/* relay_stop() and kinbox_relay_destroy(). */
void logrel_stop(logrel_t *l);

/* The database restarted under a running log relay (PostgreSQL: stop
 * immediate; MariaDB: kill -9) between two 50-row transactions: every row
 * on the topic, in order (assert_in_order); caught_up (NULL: none)
 * asserted before the relay stops. Returns the relay's database and name
 * in *l (stopped). */
void restart_under_relay(logrel_t *l, const char *backend, const char *source,
                         const char *tag,
                         bool (*caught_up)(const char *url, const char *name));

/* The refusal tests' rows (lost slot, purged binlog): `kinbox run` of ini
 * (log: its log) publishes rows "a-0".."a-19" of url (the relay name),
 * then stops (SIGTERM, exit 0). */
void rows_a_then_stop(const char *backend, const char *url, const char *name,
                      const char *ini, const char *log, const char *topic);

/* After the refusal: `kinbox outbox resend --since since -c ini` publishes
 * again at least the 30 rows "b-*" appended since; then `kinbox run`
 * again while rows "c-0".."c-9" are appended: every "a", "b" and "c" row
 * on the topic. */
void resend_then_all(const char *backend, const char *url, const char *ini,
                     const char *log, const char *topic, const char *since);

/* The large-transaction tests' stream: got (sorted here by by_offset)
 * holds want messages; the row with idem key dead is dead with
 * SIZE_TOO_LARGE, the only outbox row not pending; each aggregate
 * "agg-N" (N < 16) comes in its payloads' order; every other message is
 * handed to other(m, arg). */
void check_big_stream(const char *url, tmsgs_t *got, size_t want,
                      const char *dead,
                      void (*other)(const tmsg_t *m, void *arg), void *arg);

/* system(3) of the formatted command: its exit status, -1 if killed. */
int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
