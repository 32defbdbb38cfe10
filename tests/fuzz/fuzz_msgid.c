/* Fuzz message-id extraction. Input: one selector byte, then the spec
 * argument, the key, a header value and the payload separated by 0xff
 * bytes. An id, when one comes out, is non-empty UTF-8 without NUL and at
 * most KINBOX__MSGID_MAX bytes. */
#include <librdkafka/rdkafka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "msgid.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t *
part(const uint8_t **p, const uint8_t *end, size_t *n)
{
        const uint8_t *s = *p;
        const uint8_t *q = s < end ? memchr(s, 0xff, (size_t)(end - s)) : NULL;
        *n = (size_t)((q ? q : end) - s);
        *p = q ? q + 1 : end;
        return s;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (size < 1)
                return 0;
        const uint8_t *p = data + 1, *end = data + size;
        size_t an, kn, hn, pn;
        const uint8_t *arg = part(&p, end, &an);
        const uint8_t *key = part(&p, end, &kn);
        const uint8_t *hv = part(&p, end, &hn);
        const uint8_t *pl = part(&p, end, &pn);
        char spec[300];
        static const char *const kinds[] = {"header:", "key",
                                            "json:", "coords"};
        const char *kind = kinds[data[0] % 4];
        size_t al = an < 200 ? an : 200;
        memcpy(spec, kind, strlen(kind) + 1);
        if (data[0] % 4 == 0 || data[0] % 4 == 2) {
                memcpy(spec + strlen(kind), arg, al);
                spec[strlen(kind) + al] = '\0';
                if (strlen(spec) != strlen(kind) + al)
                        return 0; /* a NUL in the spec: not a C string */
        }
        rd_kafka_headers_t *hs = rd_kafka_headers_new(4);
        const char *hname = data[0] % 4 == 0 ? spec + 7 : "message_id";
        rd_kafka_header_add(hs, hname, -1, hv, (ssize_t)hn);
        if (data[0] & 0x80)
                rd_kafka_header_add(hs, hname, -1, hv, (ssize_t)hn);
        kinbox__msgview_t m = {.topic = "t",
                               .partition = 1,
                               .offset = 2,
                               .key = (data[0] & 0x40) ? NULL : key,
                               .key_len = kn,
                               .payload = (data[0] & 0x20) ? NULL : pl,
                               .len = pn,
                               .headers = hs};
        char why[300];
        char *id = kinbox__msgid_extract(spec, &m, why, sizeof(why));
        if (id && (!*id || strlen(id) > KINBOX__MSGID_MAX))
                abort();
        free(id);
        rd_kafka_headers_destroy(hs);
        return 0;
}
