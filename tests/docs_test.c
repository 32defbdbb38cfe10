/*
 * docs_test.c -- the README's configuration reference is the code's.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdbool.h>
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

/* Whole file, or NULL. */
static char *
slurp(const char *path)
{
        FILE *fp = fopen(path, "r");
        if (!fp)
                return NULL;
        char *s = NULL;
        size_t n = 0;
        FILE *m = open_memstream(&s, &n);
        char buf[4096];
        size_t r;
        while ((r = fread(buf, 1, sizeof(buf), fp)) > 0)
                fwrite(buf, 1, r, m);
        fclose(m);
        fclose(fp);
        return s;
}

/* roff spelling of a key: '-' is written "\-". */
static void
roff_key(char *out, size_t sz, const char *key, size_t len)
{
        size_t o = 0;
        for (size_t i = 0; i < len && o + 3 < sz; i++) {
                if (key[i] == '-')
                        out[o++] = '\\';
                out[o++] = key[i];
        }
        out[o] = '\0';
}

/* `man --warnings` has nothing to say about the page. */
static void
assert_man_renders(const char *path)
{
        char cmd[1024];
        snprintf(cmd, sizeof(cmd),
                 "MANWIDTH=80 man --warnings -E UTF-8 -l '%s' 2>&1 >/dev/null",
                 path);
        FILE *p = popen(cmd, "r");
        cr_assert(p != NULL);
        char out[2048] = "";
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        int st = pclose(p);
        cr_assert(st == 0 && n == 0, "man %s: status %d: %s", path, st, out);
}

/* kinbox.conf(5) is generated at build time from the property table: it
 * describes every key of the reference, and renders without warnings. */
Test(docs, conf_man_page_matches_code)
{
        char *man = slurp(KINBOX_BINARY_DIR "/man/kinbox.conf.5");
        cr_assert(man != NULL, "kinbox.conf.5 was not generated in %s/man",
                  KINBOX_BINARY_DIR);
        char *gen = NULL;
        size_t glen = 0;
        FILE *mem = open_memstream(&gen, &glen);
        kinbox_conf_write_reference(mem);
        fclose(mem);
        int keys = 0;
        for (const char *p = strstr(gen, "\n| `"); p;
             p = strstr(p + 1, "\n| `")) {
                const char *k = p + 4, *e = strchr(k, '`');
                cr_assert(e != NULL);
                char want[256], rk[200];
                roff_key(rk, sizeof(rk), k, (size_t)(e - k));
                snprintf(want, sizeof(want), "\n.B %s", rk);
                cr_assert(strstr(man, want) != NULL,
                          "kinbox.conf.5 lacks key %s: rebuild", rk);
                keys++;
        }
        cr_assert(keys > 30, "only %d keys parsed from the reference", keys);
        assert_man_renders(KINBOX_BINARY_DIR "/man/kinbox.conf.5");
        free(gen);
        free(man);
}

/* kinbox(1) has every command `kinbox help` lists and every exit status. */
Test(docs, kinbox_man_page_has_every_command)
{
        char *man = slurp(KINBOX_SOURCE_DIR "/dist/man/kinbox.1");
        cr_assert(man != NULL);
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "\"%s\" help", getenv("KINBOX_BIN"));
        FILE *p = popen(cmd, "r");
        cr_assert(p != NULL);
        char line[512];
        int cmds = 0;
        bool in = false;
        while (fgets(line, sizeof(line), p)) {
                if (!strncmp(line, "Commands:", 9)) {
                        in = true;
                        continue;
                }
                if (!in || strncmp(line, "  ", 2) || line[2] == ' ')
                        continue;
                char name[64];
                if (sscanf(line + 2, "%63s", name) != 1)
                        continue;
                char rk[128], want[160];
                roff_key(rk, sizeof(rk), name, strlen(name));
                snprintf(want, sizeof(want), "\n.B %s", rk);
                cr_assert(strstr(man, want) != NULL,
                          "kinbox.1 does not describe command \"%s\"", name);
                cmds++;
        }
        pclose(p);
        cr_assert(cmds >= 10, "only %d commands parsed from kinbox help",
                  cmds);
        const char *ex = strstr(man, ".SH EXIT STATUS");
        cr_assert(ex != NULL);
        for (int s = 0; s <= 4; s++) {
                char want[16];
                snprintf(want, sizeof(want), "\n.B %d\n", s);
                cr_assert(strstr(ex, want) != NULL,
                          "kinbox.1 EXIT STATUS lacks %d", s);
        }
        assert_man_renders(KINBOX_SOURCE_DIR "/dist/man/kinbox.1");
        free(man);
}
