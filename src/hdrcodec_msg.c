/*
 * hdrcodec_msg.c -- a consumed message's headers in the stored form (the
 * dead-letter writer's entry point; library only, unlike hdrcodec.c).
 */
#include "hdrcodec.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void
kinbox__headers_json(const kinbox_msg_t *m, kinbox__buf_t *b)
{
        size_t n = kinbox_msg_header_count(m);
        kinbox_header_t *v = n ? calloc(n, sizeof(*v)) : NULL;
        if (n && !v) {
                b->oom = true;
                return;
        }
        size_t k = 0;
        for (; k < n; k++)
                if (kinbox_msg_header_at(m, k, &v[k]))
                        break;
        char *s = kinbox__hdrcodec_encode(v, k, NULL, 0);
        free(v);
        if (!s) {
                b->oom = true;
                return;
        }
        kinbox__buf_adds(b, s);
        free(s);
}
