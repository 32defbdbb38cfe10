/*
 * docs_test.c -- the README's configuration reference is the code's.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#ifndef KINBOX_SOURCE_DIR
#error "KINBOX_SOURCE_DIR must be defined"
#endif

Test(docs, readme_reference_matches_code)
{
        char *gen = NULL;
        size_t glen = 0;
        FILE *mem = open_memstream(&gen, &glen);
        kinbox_conf_write_reference(mem);
        fclose(mem);
        FILE *fp = fopen(KINBOX_SOURCE_DIR "/README.md", "r");
        cr_assert(fp != NULL);
        char *readme = NULL;
        size_t rlen = 0;
        FILE *rm = open_memstream(&readme, &rlen);
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), fp)) > 0)
                fwrite(buf, 1, n, rm);
        fclose(rm);
        fclose(fp);
        const char *b = strstr(readme, "<!-- BEGIN CONFIG REFERENCE -->\n");
        const char *e = strstr(readme, "<!-- END CONFIG REFERENCE -->");
        cr_assert(b != NULL && e != NULL);
        b += strlen("<!-- BEGIN CONFIG REFERENCE -->\n");
        size_t len = (size_t)(e - b);
        /* scripts/gen-docs writes the reference plus one newline. */
        cr_assert(len >= glen && strncmp(b, gen, glen) == 0,
                  "README.md configuration reference is stale: run "
                  "scripts/gen-docs");
        free(gen);
        free(readme);
}
