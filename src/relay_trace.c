/*
 * relay_trace.c -- the relay's spans (tracing on, see docs/tracing.md):
 * one per outbox row that carries a valid traceparent, from the start of
 * its publish (or local action) to the batch's marks, a child of the
 * row's context (the writer's append span). A row without a context
 * gets none: its trace, if any, began elsewhere and was not carried.
 */
#include "relay_int.h"

void
kinbox__relay_trace_begin(kinbox_relay_t *r, item_t *it, const void *tp,
                          size_t tp_len)
{
        KINBOX__UNUSED(r);
        it->traced = tp && !kinbox_trace_parse(tp, tp_len, &it->trace);
        if (it->traced)
                it->trace_start_ns = kinbox__tracing_now_ns();
}

static const char *
outcome_name(outcome_t o)
{
        switch (o) {
        case OUT_SENT:
                return "sent";
        case OUT_RETRY:
                return "retry";
        case OUT_DEAD:
                return "dead";
        default:
                return "released";
        }
}

static void
item_span(const item_t *it)
{
        kinbox__span_t sp;
        kinbox__span_start(&sp, it->action ? "action" : "send",
                           it->action ? KINBOX__SPAN_INTERNAL
                                      : KINBOX__SPAN_PRODUCER,
                           &it->trace);
        sp.start_ns = it->trace_start_ns;
        if (!it->action) {
                kinbox__span_str(&sp, "messaging.system", "kafka");
                kinbox__span_str(&sp, "messaging.operation.type", "send");
                kinbox__span_str(&sp, "messaging.destination.name",
                                 it->destination);
                if (it->aggregate_id)
                        kinbox__span_str(&sp, "messaging.kafka.message.key",
                                         it->aggregate_id);
        } else {
                kinbox__span_str(&sp, "kinbox.action", it->destination);
        }
        kinbox__span_int(&sp, "kinbox.outbox.id", it->id);
        kinbox__span_int(&sp, "kinbox.attempt", it->attempts + 1);
        kinbox__span_str(&sp, "kinbox.outcome", outcome_name(it->out));
        if (it->out == OUT_RETRY || it->out == OUT_DEAD) {
                sp.status = KINBOX__STATUS_ERROR;
                if (it->err[0])
                        kinbox__span_str(&sp, "error.type", it->err);
        } else if (it->out == OUT_SENT) {
                sp.status = KINBOX__STATUS_OK;
        }
        kinbox__span_end(&sp);
}

void
kinbox__relay_trace_spans(kinbox_relay_t *r, const batch_t *b)
{
        KINBOX__UNUSED(r);
        for (size_t i = 0; i < b->n; i++)
                if (b->v[i].traced)
                        item_span(&b->v[i]);
}
