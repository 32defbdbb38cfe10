/*
 * outbox_int.h -- what outbox.c, relay.c and the backends' outbox files
 * (db/pg_outbox.c, db/mysql_outbox.c) share (internal).
 */
#ifndef KINBOX_OUTBOX_INT_H
#define KINBOX_OUTBOX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kinbox/conf.h"
#include "kinbox/outbox.h"

#include "db.h"
#include "internal.h"

#define KINBOX__OUTBOX_COLS                                                   \
        "kind, destination, idem_key, aggregate_id, payload, headers, "       \
        "max_attempts"

#define KINBOX__OUTBOX_FIND_ID_SQL                                            \
        "SELECT id FROM kinbox_outbox WHERE destination = $1 AND idem_key = " \
        "$2"

/* A validated message, ready to bind. */
typedef struct kinbox__outbox_prepared {
        const char *kind;
        char maxbuf[16];
        kinbox__buf_t headers;
        bool has_headers;
} kinbox__outbox_prepared_t;

/* Validate m; on success pr must be freed with _prepared_free(). Errors:
 * KINBOX_ERR_INVALID / KINBOX_ERR_NOMEM with errstr set. */
kinbox_err_t kinbox__outbox_prepare(const kinbox_outbox_msg_t *m,
                                    kinbox__outbox_prepared_t *pr,
                                    char *errstr, size_t errstr_size);
void kinbox__outbox_prepared_free(kinbox__outbox_prepared_t *pr);
/* The 7 parameters of kinbox__sql.outbox_append; pointers into m and pr. */
void kinbox__outbox_params(const kinbox_outbox_msg_t *m,
                           const kinbox__outbox_prepared_t *pr,
                           kinbox__param_t p[7]);

/* An unconnected handle for database.url / database.password_file. */
kinbox__db_t *kinbox__outbox_db_open(const kinbox_conf_t *conf, char *errstr,
                                     size_t errstr_size);
/* An UPDATE in db's dialect and the rows it changed. */
int kinbox__outbox_affected(kinbox__db_t *db, const char *sql, int n,
                            const kinbox__param_t *p, uint64_t *countp);
int kinbox__outbox_headers_json(kinbox__buf_t *b, const kinbox_header_t *h,
                                size_t n);

/*
 * In-process wake-up: every relay of this process that sleeps for want of
 * work wakes up and polls closely for a short while (the row may not be
 * committed yet when this is called). Async-signal-unsafe; thread-safe;
 * never blocks.
 */
void kinbox__relay_poke(void);

#endif
