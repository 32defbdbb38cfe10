/*
 * relay_log.h -- the log relay (relay_log.c), internal: relay.source =
 * wal | binlog run beside the polling relay of a kinbox_relay_t. The
 * backend-neutral loop (produce, delivery reports, confirm the
 * acknowledged prefix) reads a database log reader through
 * kinbox__db_logsrc(): PostgreSQL's is db/pg_repl.c (a logical replication
 * slot, pgoutput), MariaDB's db/mysql_binlog.c (the ROW binlog). The
 * source's contract: db/logsrc_ops.h.
 */
#ifndef KINBOX_RELAY_LOG_H
#define KINBOX_RELAY_LOG_H

#include <stdbool.h>
#include <stddef.h>

#include "db.h"

/* ---- relay_log.c: the log relay of a kinbox_relay_t */
struct kinbox_relay_s;
/* relay.source is not poll: open the source (its prerequisites checked:
 * KINBOX_ERR_CONFIG / KINBOX_ERR_SCHEMA with r->errstr naming the setting)
 * and run the log relay on a thread of its own, with a producer of its
 * own, until kinbox_relay_stop(). */
int kinbox__relay_log_start(struct kinbox_relay_s *r);
/* Wait for that thread: 0, or why it stopped the relay (r->errstr). */
int kinbox__relay_log_join(struct kinbox_relay_s *r);
/* Whether the log relay runs (the polling relay then claims only local
 * actions). */
bool kinbox__relay_log_active(const struct kinbox_relay_s *r);
/* kinbox migrate: the checks of relay.source's source on conf's database
 * (the slot made when missing). 0, or as kinbox__relay_log_start(). */
int kinbox__relay_log_check(const struct kinbox_conf_s *conf, char *errstr,
                            size_t errsz);

/* kinbox status: the name of relay.source's slot (reader) and its
 * figures (-1 / "" unknown), on a connection of its own. 0, or an error
 * with errstr. */
int kinbox__relay_log_lag(const struct kinbox_conf_s *conf, char *slot,
                          size_t slotsz, kinbox__loglag_t *out, char *errstr,
                          size_t errsz);

#endif
