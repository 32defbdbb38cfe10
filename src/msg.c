/*
 * msg.c -- the message view handlers read: Kafka messages and replayed dead letters alike
 */
#include "consumer_int.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* message accessors: one view for Kafka and replayed messages alike */

const char *
kinbox_msg_topic(const kinbox_msg_t *m)
{
        return m->v.topic;
}

int32_t
kinbox_msg_partition(const kinbox_msg_t *m)
{
        return m->v.partition;
}

int64_t
kinbox_msg_offset(const kinbox_msg_t *m)
{
        return m->v.offset;
}

int64_t
kinbox_msg_timestamp(const kinbox_msg_t *m)
{
        return m->ts;
}

const void *
kinbox_msg_key(const kinbox_msg_t *m, size_t *sizep)
{
        if (sizep)
                *sizep = m->v.key_len;
        return m->v.key;
}

const void *
kinbox_msg_payload(const kinbox_msg_t *m, size_t *sizep)
{
        if (sizep)
                *sizep = m->v.len;
        return m->v.payload;
}

const char *
kinbox_msg_id(const kinbox_msg_t *m)
{
        return m->id ? m->id : "";
}

int
kinbox_msg_attempt(const kinbox_msg_t *m)
{
        return m->attempt;
}

/* librdkafka's header getters take a non-const list. */
static rd_kafka_headers_t *
msg_headers(const kinbox_msg_t *m)
{
        return (rd_kafka_headers_t *)m->v.headers;
}

size_t
kinbox_msg_header_count(const kinbox_msg_t *m)
{
        return m->v.headers ? rd_kafka_header_cnt(msg_headers(m)) : 0;
}

kinbox_err_t
kinbox_msg_header_at(const kinbox_msg_t *m, size_t idx, kinbox_header_t *hdr)
{
        if (!m->v.headers ||
            rd_kafka_header_get_all(msg_headers(m), idx, &hdr->name,
                                    &hdr->value, &hdr->size))
                return KINBOX_ERR_NOT_FOUND;
        return KINBOX_OK;
}

kinbox_err_t
kinbox_msg_header(const kinbox_msg_t *m, const char *name, const void **valuep,
                  size_t *sizep)
{
        if (!m->v.headers ||
            rd_kafka_header_get_last(msg_headers(m), name, valuep, sizep))
                return KINBOX_ERR_NOT_FOUND;
        return KINBOX_OK;
}

int
kinbox__msg_traceparent(const kinbox_msg_t *m, kinbox_trace_t *t)
{
        const void *v, *v2;
        size_t n, n2;
        if (!m->v.headers ||
            rd_kafka_header_get(msg_headers(m), 0, KINBOX_TRACEPARENT_HEADER,
                                &v, &n) ||
            !rd_kafka_header_get(msg_headers(m), 1, KINBOX_TRACEPARENT_HEADER,
                                 &v2, &n2) ||
            kinbox_trace_parse(v, n, t))
                return KINBOX_ERR_NOT_FOUND;
        return KINBOX_OK;
}

/* The consume span's context when tracing is on (set at receive), else
 * the message's own traceparent. */
kinbox_err_t
kinbox_msg_trace(const kinbox_msg_t *m, kinbox_trace_t *t)
{
        if (m->trace_set) {
                *t = m->trace;
                return KINBOX_OK;
        }
        return (kinbox_err_t)kinbox__msg_traceparent(m, t);
}

kinbox_msg_t *
kinbox__msg_alloc(const void *payload, size_t len)
{
        /* The payload's copy lives in the message's own allocation, one
         * NUL after it (kinbox_msg_payload()'s promise): librdkafka's
         * buffer has the record's headers or the next record there. */
        size_t extra = payload ? len + 1 : 0;
        if (extra && extra < len) /* overflow */
                return NULL;
        /* Only the struct is zeroed: the copy is written right after. */
        kinbox_msg_t *m = malloc(sizeof(*m) + extra);
        if (!m)
                return NULL;
        memset(m, 0, sizeof(*m));
        if (payload) {
                char *copy = (char *)(m + 1);
                memcpy(copy, payload, len);
                copy[len] = '\0';
                m->v.payload = copy;
        }
        m->v.len = len;
        return m;
}

void
kinbox__msg_free(kinbox_msg_t *m)
{
        if (!m)
                return;
        if (m->rkm)
                rd_kafka_message_destroy(m->rkm);
        if (m->own_headers)
                rd_kafka_headers_destroy(m->own_headers);
        free(m->id);
        free(m->reason);
        free(m->hkey_own);
        free(m);
}

void
kinbox__msg_set_reason(kinbox_msg_t *m, const char *r)
{
        char *n = kinbox__strdup(r && *r ? r : "no reason given");
        if (n) {
                free(m->reason);
                m->reason = n;
        }
}

/* ------------------------------------------------------------------ */
/* stored messages and transactions outside a consumer (replay.c) */

kinbox_msg_t *
kinbox__msg_from_parts(const kinbox__msg_parts_t *parts)
{
        kinbox_msg_t *m = kinbox__msg_alloc(parts->payload, parts->len);
        if (!m)
                return NULL;
        m->v = (kinbox__msgview_t){
            parts->topic,   parts->partition, parts->offset, parts->key,
            parts->key_len, m->v.payload,     parts->len,    NULL};
        m->ts = parts->timestamp;
        if (parts->nheaders) {
                m->own_headers = rd_kafka_headers_new(parts->nheaders);
                for (size_t i = 0; m->own_headers && i < parts->nheaders; i++)
                        rd_kafka_header_add(
                            m->own_headers, parts->headers[i].name, -1,
                            parts->headers[i].value,
                            parts->headers[i].value
                                ? (ssize_t)parts->headers[i].size
                                : 0);
                m->v.headers = m->own_headers;
        }
        m->id = kinbox__strdup(parts->id);
        m->attempt = 1;
        if (!m->id || (parts->nheaders && !m->own_headers)) {
                kinbox__msg_free(m);
                return NULL;
        }
        return m;
}

void
kinbox__msg_destroy(kinbox_msg_t *m)
{
        kinbox__msg_free(m);
}

const char *
kinbox__msg_reason(const kinbox_msg_t *m)
{
        return m->reason;
}
