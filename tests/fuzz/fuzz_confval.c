/* Fuzz the configuration value parser: booleans, integers, durations. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "confval.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = '\0';
        char e[300];
        bool b;
        int64_t n;
        kinbox__confval_bool("k", s, &b, e, sizeof(e));
        if (!kinbox__confval_int("k", s, -1000, 1000, &n, e, sizeof(e)) &&
            (n < -1000 || n > 1000))
                abort();
        kinbox__confval_int("k", s, INT64_MIN, INT64_MAX, &n, e, sizeof(e));
        if (!kinbox__confval_duration("k", s, 60000, INT64_MAX, &n, e,
                                      sizeof(e))) {
                if (n < 60000)
                        abort();
                /* the printed form parses back to the same value */
                char t[64];
                int64_t m;
                kinbox__confval_duration_str(n, t, sizeof(t));
                if (kinbox__confval_duration("k", t, 0, INT64_MAX, &m, e,
                                             sizeof(e)) ||
                    m != n)
                        abort();
        }
        kinbox__confval_duration("k", s, 0, 5000, &n, e, sizeof(e));
        free(s);
        return 0;
}
