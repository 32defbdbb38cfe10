/* Fuzz the stored-header codec: any input decodes or is refused; what
 * decodes encodes and decodes again to the same list. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hdrcodec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        kinbox__hdrs_t h, h2;
        char e[300];
        if (kinbox__hdrcodec_decode((const char *)data, size, &h, e,
                                    sizeof(e))) {
                kinbox__hdrs_free(&h);
                return 0;
        }
        kinbox_header_t *v = calloc(h.n + 1, sizeof(*v));
        if (!v)
                abort();
        for (size_t i = 0; i < h.n; i++)
                v[i] =
                    (kinbox_header_t){h.v[i].name, h.v[i].value, h.v[i].size};
        char *s = kinbox__hdrcodec_encode(v, h.n, e, sizeof(e));
        if (!s)
                abort();
        if (kinbox__hdrcodec_decode(s, strlen(s), &h2, e, sizeof(e)) ||
            h2.n != h.n)
                abort();
        for (size_t i = 0; i < h.n; i++) {
                if (strcmp(h.v[i].name, h2.v[i].name) ||
                    !h.v[i].value != !h2.v[i].value ||
                    h.v[i].size != h2.v[i].size ||
                    (h.v[i].value &&
                     memcmp(h.v[i].value, h2.v[i].value, h.v[i].size)))
                        abort();
        }
        free(kinbox__hdrcodec_display(&h, "; "));
        free(s);
        free(v);
        kinbox__hdrs_free(&h);
        kinbox__hdrs_free(&h2);
        return 0;
}
