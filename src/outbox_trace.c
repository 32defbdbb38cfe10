/*
 * outbox_trace.c -- the trace context an appended outbox row carries, and
 * the writer's "create" span (see docs/tracing.md).
 *
 * The row's parent context is the caller's: a valid `traceparent` among
 * the row's headers, else the message of the running handler call (an
 * append made while handling a message continues its trace). With this
 * process's exporter running, the append is a span of its own (child of
 * that context, or a new root trace) and the row's `traceparent` names
 * it; without one, a context inherited from the handler's message is
 * stored as it is and the caller's own header is left untouched, so no
 * row names a span that is never exported.
 */
#include "outbox_int.h"
#include "tracing.h"

#include <stdlib.h>
#include <string.h>

static bool
is_tp(const kinbox_header_t *h)
{
        return h->name && !strcmp(h->name, KINBOX_TRACEPARENT_HEADER);
}

/* Index of the one header named traceparent; -1 none, -2 several (an
 * invalid carrier by W3C Trace Context: none of them is the parent). */
static long
traceparent_at(const kinbox_outbox_msg_t *m)
{
        long at = -1;
        for (size_t i = 0; m->headers && i < m->header_count; i++)
                if (is_tp(&m->headers[i]))
                        at = at == -1 ? (long)i : -2;
        return at;
}

/* m with one traceparent, ot->tp (replacing every other one). */
static const kinbox_outbox_msg_t *
with_traceparent(kinbox__outbox_trace_t *ot, const kinbox_outbox_msg_t *m)
{
        static const kinbox_header_t none;
        size_t n = 0;
        long put = -1; /* where the first traceparent was, or the end */
        ot->hdrs = malloc((m->header_count + 1) * sizeof(*ot->hdrs));
        if (!ot->hdrs)
                return m; /* the row goes out without it */
        for (size_t i = 0; m->headers && i < m->header_count; i++) {
                if (!is_tp(&m->headers[i]))
                        ot->hdrs[n++] = m->headers[i];
                else if (put < 0)
                        ot->hdrs[put = (long)n++] = none;
        }
        kinbox_header_t *h = &ot->hdrs[put < 0 ? (long)n++ : put];
        h->name = KINBOX_TRACEPARENT_HEADER;
        h->value = ot->tp;
        h->size = KINBOX_TRACEPARENT_LEN;
        ot->msg = *m;
        ot->msg.headers = ot->hdrs;
        ot->msg.header_count = n;
        return &ot->msg;
}

static void
span_begin(kinbox__outbox_trace_t *ot, const kinbox_outbox_msg_t *m,
           const kinbox_trace_t *parent)
{
        size_t plen = strlen(KINBOX_OUTBOX_ACTION_PREFIX);
        bool action =
            m->destination &&
            !strncmp(m->destination, KINBOX_OUTBOX_ACTION_PREFIX, plen);
        kinbox__span_start(&ot->span, "create", KINBOX__SPAN_PRODUCER, parent);
        ot->spanning = true;
        if (!action)
                kinbox__span_str(&ot->span, "messaging.system", "kafka");
        kinbox__span_str(&ot->span, "messaging.operation.type", "create");
        kinbox__span_str(&ot->span, "messaging.destination.name",
                         m->destination);
        kinbox__span_str(&ot->span, "kinbox.outbox.idem_key", m->idem_key);
        if (m->aggregate_id)
                kinbox__span_str(&ot->span, "messaging.kafka.message.key",
                                 m->aggregate_id);
        kinbox_trace_format(&ot->span.ctx, ot->tp);
}

const kinbox_outbox_msg_t *
kinbox__outbox_trace_begin(kinbox__outbox_trace_t *ot,
                           const kinbox_outbox_msg_t *m,
                           const kinbox_msg_t *cur)
{
        memset(ot, 0, sizeof(*ot));
        if (!m)
                return m;
        long at = traceparent_at(m);
        kinbox_trace_t parent;
        bool has_parent = false, from_msg = false;
        if (at >= 0 && !kinbox_trace_parse(m->headers[at].value,
                                           m->headers[at].size, &parent))
                has_parent = true;
        else if (cur && !kinbox_msg_trace(cur, &parent))
                has_parent = from_msg = true;
        if (kinbox__tracing_active()) {
                span_begin(ot, m, has_parent ? &parent : NULL);
                return with_traceparent(ot, m);
        }
        if (!from_msg)
                return m;
        kinbox_trace_format(&parent, ot->tp);
        return with_traceparent(ot, m);
}

void
kinbox__outbox_trace_end(kinbox__outbox_trace_t *ot, kinbox_err_t rc,
                         int64_t id)
{
        if (ot->spanning) {
                if (id > 0)
                        kinbox__span_int(&ot->span, "kinbox.outbox.id", id);
                if (rc == KINBOX_ERR_DUPLICATE)
                        kinbox__span_bool(&ot->span, "kinbox.duplicate", true);
                else if (rc != KINBOX_OK)
                        ot->span.status = KINBOX__STATUS_ERROR;
                kinbox__span_end(&ot->span);
        }
        free(ot->hdrs);
        ot->hdrs = NULL;
        ot->spanning = false;
}
