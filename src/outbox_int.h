/*
 * outbox_int.h -- what outbox.c shares with the modules above it (relay,
 * pruner): message validation and binding, the UPDATE count (internal).
 * The backends' outbox files (db/pg_outbox.c, db/mysql_outbox.c) do not
 * include it: their contract is in db.h.
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
#include "tracing.h"

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

/* An UPDATE in db's dialect and the rows it changed. */
int kinbox__outbox_affected(kinbox__db_t *db, const char *sql, int n,
                            const kinbox__param_t *p, uint64_t *countp);
int kinbox__outbox_headers_json(kinbox__buf_t *b, const kinbox_header_t *h,
                                size_t n);

/* outbox_trace.c: the row's trace context and the append span. begin()
 * returns the message to store (m itself, or a copy in ot whose
 * traceparent is set); cur is the running handler call's message or
 * NULL. end() after the insert (rc its result, id the new row's id or 0)
 * ends the span and frees the copy. */
typedef struct kinbox__outbox_trace {
        kinbox__span_t span;
        bool spanning;
        kinbox_header_t *hdrs;
        kinbox_outbox_msg_t msg;
        char tp[KINBOX_TRACEPARENT_LEN + 1];
} kinbox__outbox_trace_t;
const kinbox_outbox_msg_t *
kinbox__outbox_trace_begin(kinbox__outbox_trace_t *ot,
                           const kinbox_outbox_msg_t *m,
                           const kinbox_msg_t *cur);
void kinbox__outbox_trace_end(kinbox__outbox_trace_t *ot, kinbox_err_t rc,
                              int64_t id);

#endif
