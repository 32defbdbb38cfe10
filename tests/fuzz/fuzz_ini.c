/* Fuzz the INI configuration loader of the kinbox command. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static char path[64];
        if (!path[0]) {
                snprintf(path, sizeof(path), "/tmp/kinbox-fuzz-ini-%d",
                         (int)getpid());
                setenv("KINBOX_FUZZ_SET", "value", 1);
        }
        FILE *fp = fopen(path, "w");
        if (!fp)
                return 0;
        fwrite(data, 1, size, fp);
        fclose(fp);
        kb_config_t cfg;
        char e[2048];
        if (!kb_config_load(path, &cfg, e, sizeof(e)))
                kb_config_free(&cfg);
        unlink(path);
        return 0;
}
