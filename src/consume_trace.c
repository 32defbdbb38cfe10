/*
 * consume_trace.c -- trace context of received messages and the consume
 * span of each message of a committed batch (tracing on: `tracing.endpoint`).
 *
 * A message's context is fixed when it is received, before any handler
 * runs: a child of its `traceparent` (or a new root trace), so the handler
 * can read the consume span's ids (kinbox_msg_trace()) and an outbox row
 * it appends becomes that span's child. The span ends when the batch that
 * decided the message commits; attributes follow OpenTelemetry's messaging
 * conventions plus what kinbox decided (duplicate, dead letter, parked).
 */
#include "consumer_int.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

void
kinbox__msg_trace_start(kinbox_msg_t *m)
{
        kinbox_trace_t parent;
        m->recv_ns = kinbox__tracing_now_ns();
        if (!kinbox__msg_traceparent(m, &parent)) {
                kinbox_trace_child(&parent, &m->trace);
                memcpy(m->trace_parent, parent.span_id, 8);
                m->trace_has_parent = true;
        } else {
                kinbox_trace_new(&m->trace);
                m->trace.flags = kinbox__tracing_sample_root() ? 0x01 : 0x00;
        }
        m->trace_set = true;
}

/* What kinbox decided for the message, as span attributes. */
static void
decision(kinbox__span_t *sp, const kinbox_msg_t *m, const kinbox__run_t *ru)
{
        const char *dup = NULL;
        if (ru->state == KINBOX__MSG_DUP)
                dup = "redelivery";
        else if (ru->state == KINBOX__MSG_BIZDUP ||
                 (ru->state == KINBOX__MSG_RUN && ru->dup_ok))
                dup = "business";
        kinbox__span_bool(sp, "kinbox.duplicate", dup != NULL);
        if (dup)
                kinbox__span_str(sp, "kinbox.duplicate.kind", dup);
        kinbox__span_bool(sp, "kinbox.dead_lettered",
                          ru->state == KINBOX__MSG_DEAD);
        if (ru->state == KINBOX__MSG_PARK)
                kinbox__span_bool(sp, "kinbox.parked", true);
        kinbox__span_int(sp, "kinbox.attempt", m->attempt ? m->attempt : 1);
        if (ru->state == KINBOX__MSG_DEAD) {
                sp->status = KINBOX__STATUS_ERROR;
                if (m->reason)
                        kinbox__span_str(sp, "error.type", m->reason);
        }
}

static void
consume_span(kinbox_consumer_t *c, const kinbox_msg_t *m,
             const kinbox__run_t *ru, const char *group)
{
        if (!m->trace_set || !(m->trace.flags & 0x01))
                return;
        kinbox__span_t sp;
        memset(&sp, 0, offsetof(kinbox__span_t, sbuf));
        sp.ctx = m->trace;
        memcpy(sp.parent, m->trace_parent, 8);
        sp.has_parent = m->trace_has_parent;
        sp.name = "process";
        sp.kind = KINBOX__SPAN_CONSUMER;
        sp.start_ns = m->recv_ns;
        kinbox__span_str(&sp, "messaging.system", "kafka");
        kinbox__span_str(&sp, "messaging.operation.type", "process");
        kinbox__span_str(&sp, "messaging.destination.name", m->part->topic);
        char pid[16];
        snprintf(pid, sizeof(pid), "%" PRId32, m->rkm->partition);
        kinbox__span_str(&sp, "messaging.destination.partition.id", pid);
        kinbox__span_int(&sp, "messaging.kafka.offset", m->rkm->offset);
        kinbox__span_str(&sp, "messaging.consumer.group.name", group);
        if (m->id)
                kinbox__span_str(&sp, "messaging.message.id", m->id);
        kinbox__span_str(&sp, "kinbox.consumer", c->name);
        decision(&sp, m, ru);
        kinbox__span_end(&sp);
}

void
kinbox__consume_spans(const kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        const char *group = kinbox__settings_of(c->conf)->group_id;
        for (size_t i = 0; i < b->nmsgs; i++) {
                const kinbox_msg_t *m = b->msgs[i];
                /* KINBOX__MSG_CUT: not decided by this transaction (runs again). */
                if (b->run[i].state != KINBOX__MSG_CUT && m->rkm)
                        consume_span(c, m, &b->run[i], group);
        }
}

const char *
kinbox__msg_trace_note(const kinbox_msg_t *m, char buf[48])
{
        kinbox_trace_t t;
        if (kinbox_msg_trace(m, &t) != KINBOX_OK)
                return "";
        char id[33];
        kinbox_trace_id_hex(&t, id);
        snprintf(buf, 48, " (trace %s)", id);
        return buf;
}
