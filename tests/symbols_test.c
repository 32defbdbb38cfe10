/*
 * symbols_test.c -- libkinbox.so exports exactly the functions its headers
 * declare with KINBOX_API: nothing internal leaks (hidden visibility), and
 * no declared function is missing.
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

Test(symbols, exports_match_headers)
{
        static char decl[MAXSYMS][96], exp[MAXSYMS][96];
        int nd = declared(decl);
        cr_assert(gt(int, nd, 50), "only %d declarations found", nd);
        FILE *p = popen("nm -D --defined-only " KINBOX_SHARED_LIB, "r");
        cr_assert(p != NULL);
        char line[512];
        int ne = 0;
        while (fgets(line, sizeof(line), p)) {
                char addr[64], type[8], name[256];
                if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3)
                        continue;
                if (strcmp(type, "T"))
                        continue;
                /* Every exported function is public API. */
                cr_expect(strncmp(name, "kinbox_", 7) == 0 &&
                              strncmp(name, "kinbox__", 8) != 0,
                          "exported but not public: %s", name);
                ne = add(exp, ne, name, strlen(name));
        }
        cr_assert(eq(int, pclose(p), 0), "nm failed");
        for (int i = 0; i < nd; i++)
                cr_expect(has(exp, ne, decl[i]), "declared, not exported: %s",
                          decl[i]);
        for (int i = 0; i < ne; i++)
                cr_expect(has(decl, nd, exp[i]), "exported, not declared: %s",
                          exp[i]);
}
