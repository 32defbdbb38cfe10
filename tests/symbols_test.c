/*
 * symbols_test.c -- libkinbox.so exports exactly the functions its headers
 * declare with KINBOX_API: nothing internal leaks (hidden visibility; the
 * daemon's metrics endpoint among them), and no declared function is
 * missing. The kinbox command links the library's objects rather than
 * libkinbox.so; it exports the same functions, so that a handler module it
 * loads finds the whole public API and nothing else.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KINBOX_SOURCE_DIR
#error "KINBOX_SOURCE_DIR must be defined"
#endif
#ifndef KINBOX_SHARED_LIB
#error "KINBOX_SHARED_LIB must be defined"
#endif
#ifndef KINBOX_CLI
#error "KINBOX_CLI must be defined"
#endif

#define MAXSYMS 512

static int
add(char names[][96], int n, const char *s, size_t len)
{
        if (n >= MAXSYMS || len >= 96)
                return n;
        for (int i = 0; i < n; i++)
                if (strlen(names[i]) == len && !strncmp(names[i], s, len))
                        return n;
        memcpy(names[n], s, len);
        names[n][len] = '\0';
        return n + 1;
}

static int
has(char names[][96], int n, const char *s)
{
        for (int i = 0; i < n; i++)
                if (!strcmp(names[i], s))
                        return 1;
        return 0;
}

/* Names declared with KINBOX_API: the identifier before the first '('. */
static int
declared(char names[][96])
{
        int n = 0;
        DIR *d = opendir(KINBOX_SOURCE_DIR "/include/kinbox");
        cr_assert(d != NULL);
        struct dirent *e;
        while ((e = readdir(d))) {
                if (!strstr(e->d_name, ".h"))
                        continue;
                char path[512];
                snprintf(path, sizeof(path), "%s/%s",
                         KINBOX_SOURCE_DIR "/include/kinbox", e->d_name);
                FILE *fp = fopen(path, "r");
                cr_assert(fp != NULL);
                static char text[1 << 20];
                size_t len = fread(text, 1, sizeof(text) - 1, fp);
                fclose(fp);
                text[len] = '\0';
                for (char *p = text; (p = strstr(p, "KINBOX_API")); p += 10) {
                        if (p > text && p[-1] == '_')
                                continue; /* #define KINBOX_API */
                        char *paren = strchr(p, '(');
                        char *semi = strchr(p, ';');
                        if (!paren || (semi && semi < paren) ||
                            !strncmp(p, "KINBOX_API\n", 11))
                                continue;
                        char *end = paren;
                        while (end > p && end[-1] == ' ')
                                end--;
                        char *start = end;
                        while (start > p &&
                               (start[-1] == '_' ||
                                (start[-1] >= 'a' && start[-1] <= 'z') ||
                                (start[-1] >= '0' && start[-1] <= '9')))
                                start--;
                        if (end > start && !strncmp(start, "kinbox_", 7))
                                n = add(names, n, start,
                                        (size_t)(end - start));
                }
        }
        closedir(d);
        return n;
}

/* The functions a binary exports (nm -D: defined, type T); an
 * executable's start-up code (_start, _init, _fini) left out. */
static int
exported(const char *path, char names[][96], int executable)
{
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s'", path);
        FILE *p = popen(cmd, "r");
        cr_assert(p != NULL);
        char line[512];
        int n = 0;
        while (fgets(line, sizeof(line), p)) {
                char addr[64], type[8], name[256];
                if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3)
                        continue;
                if (!strcmp(type, "T") && !(executable && name[0] == '_'))
                        n = add(names, n, name, strlen(name));
        }
        cr_assert(eq(int, pclose(p), 0), "nm %s failed", path);
        return n;
}

/* path exports exactly the declared functions. */
static void
check_exports(const char *path, int executable)
{
        static char decl[MAXSYMS][96], exp[MAXSYMS][96];
        int nd = declared(decl);
        cr_assert(gt(int, nd, 50), "only %d declarations found", nd);
        int ne = exported(path, exp, executable);
        for (int i = 0; i < ne; i++) {
                /* Every exported function is public API. */
                cr_expect(strncmp(exp[i], "kinbox__", 8) != 0,
                          "%s exports an internal function: %s", path, exp[i]);
                cr_expect(has(decl, nd, exp[i]),
                          "%s: exported, not declared: %s", path, exp[i]);
        }
        for (int i = 0; i < nd; i++)
                cr_expect(has(exp, ne, decl[i]),
                          "%s: declared, not exported: %s", path, decl[i]);
}

Test(symbols, exports_match_headers)
{
        check_exports(KINBOX_SHARED_LIB, 0);
}

/* What only `kinbox run` and the tests use stays out of the public API:
 * the HTTP endpoint, rendering the metrics, raw SQL. */
Test(symbols, daemon_plumbing_is_internal)
{
        static char decl[MAXSYMS][96];
        int nd = declared(decl);
        static const char *const internal[] = {
            "kinbox_http_", "kinbox_metrics_", "kinbox_admin_query",
            "kinbox_outbox_admin_"};
        for (int i = 0; i < nd; i++)
                for (size_t k = 0; k < sizeof(internal) / sizeof(*internal);
                     k++)
                        cr_expect(strncmp(decl[i], internal[k],
                                          strlen(internal[k])) != 0,
                                  "public, but daemon plumbing: %s", decl[i]);
}

/* Handler modules loaded by `kinbox run` link against nothing: the command
 * must export the whole public API, and only it. */
Test(symbols, command_exports_the_api)
{
        check_exports(KINBOX_CLI, 1);
}
