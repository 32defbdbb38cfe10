/* Fuzz database URL parsing; a parse error must never echo a password. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = '\0';
        kinbox__dburl_t u;
        char e[512] = "";
        if (!kinbox__dburl_parse(s, &u, e, sizeof(e)))
                kinbox__dburl_free(&u);
        else if (strstr(s, "password=") && strstr(e, "password="))
                abort(); /* keyword form echoed */
        free(s);
        return 0;
}
