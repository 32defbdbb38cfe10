/*
 * docs_test.c -- the documentation is the code's: the configuration
 * reference in docs/configuration.md and kinbox.conf(5) are generated from
 * the property table, kinbox(1) has every command, every relative link
 * of the Markdown (README.md, CHANGELOG.md, every docs/NAME.md) resolves to
 * a file and, with a #fragment, to a heading of it, and every handler the
 * Markdown defines is marked for snippets_test to run.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <ctype.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <kinbox/kinbox.h>

#include "harness.h"

#ifndef KINBOX_SOURCE_DIR
#error "KINBOX_SOURCE_DIR must be defined"
#endif

/* Whole file, or NULL. */
Test(docs, configuration_reference_matches_code)
{
        char *gen = NULL;
        size_t glen = 0;
        FILE *mem = open_memstream(&gen, &glen);
        kinbox_conf_write_reference(mem);
        fclose(mem);
        char *doc = kt_slurp(KINBOX_SOURCE_DIR "/docs/configuration.md");
        cr_assert(doc != NULL, "docs/configuration.md not found");
        const char *b = strstr(doc, "<!-- BEGIN CONFIG REFERENCE -->\n");
        const char *e = strstr(doc, "<!-- END CONFIG REFERENCE -->");
        cr_assert(b != NULL && e != NULL,
                  "docs/configuration.md lacks the reference markers");
        b += strlen("<!-- BEGIN CONFIG REFERENCE -->\n");
        size_t len = (size_t)(e - b);
        /* scripts/gen-docs writes the reference plus one newline. */
        cr_assert(len >= glen && strncmp(b, gen, glen) == 0,
                  "docs/configuration.md configuration reference is stale: "
                  "run scripts/gen-docs");
        free(gen);
        free(doc);
}

/* ---- relative links of the Markdown */

/* GitHub's anchor of a heading's text: lower case, spaces to '-', other
 * ASCII punctuation but '-' and '_' dropped; of the non-ASCII characters
 * the Latin-1 symbols, general punctuation, arrows and mathematical
 * operators (U+00A0..U+00BF, U+00D7, U+00F7, U+2000..U+2BFF) are dropped,
 * other letters kept as they are. */
static void
gh_slug(char *out, size_t sz, const char *h, size_t n)
{
        size_t o = 0;
        for (size_t i = 0; i < n && o + 5 < sz;) {
                unsigned char c = (unsigned char)h[i];
                if (c < 0x80) {
                        if (isalnum(c) || c == '-' || c == '_')
                                out[o++] = (char)tolower(c);
                        else if (c == ' ')
                                out[o++] = '-';
                        i++;
                        continue;
                }
                size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
                unsigned cp = 0;
                if (len == 2 && i + 1 < n)
                        cp = ((c & 0x1fu) << 6) | (h[i + 1] & 0x3fu);
                else if (len == 3 && i + 2 < n)
                        cp = ((c & 0x0fu) << 12) |
                             ((unsigned)(h[i + 1] & 0x3f) << 6) |
                             (h[i + 2] & 0x3fu);
                bool drop = (cp >= 0xa0 && cp <= 0xbf) || cp == 0xd7 ||
                            cp == 0xf7 || (cp >= 0x2000 && cp <= 0x2bff);
                for (size_t k = 0; k < len && i < n; k++, i++)
                        if (!drop)
                                out[o++] = h[i];
        }
        out[o] = '\0';
}

/* Whether a line opens or closes a fenced code block. */
static bool
is_fence(const char *line)
{
        while (*line == ' ')
                line++;
        return !strncmp(line, "```", 3) || !strncmp(line, "~~~", 3);
}

/* Whether @p md has a heading whose anchor is @p frag (GitHub numbers
 * repeated anchors: "x", "x-1", "x-2", ...). */
static bool
has_anchor(const char *md, const char *frag)
{
        struct seen {
                char slug[256];
                int count;
        } *seen = calloc(1024, sizeof(*seen));
        cr_assert(seen != NULL);
        int nseen = 0;
        bool found = false, fenced = false;
        for (const char *l = md; l && *l && !found;) {
                const char *nl = strchr(l, '\n');
                size_t len = nl ? (size_t)(nl - l) : strlen(l);
                if (is_fence(l))
                        fenced = !fenced;
                else if (!fenced && l[0] == '#') {
                        size_t h = 0;
                        while (h < len && l[h] == '#')
                                h++;
                        if (h <= 6 && h < len && l[h] == ' ') {
                                const char *t = l + h + 1;
                                size_t tl = len - h - 1;
                                while (tl &&
                                       (t[tl - 1] == '#' || t[tl - 1] == ' '))
                                        tl--;
                                char slug[256], want[300];
                                gh_slug(slug, sizeof(slug), t, tl);
                                int k = 0;
                                for (; k < nseen; k++)
                                        if (!strcmp(seen[k].slug, slug))
                                                break;
                                if (k == nseen && nseen < 1024) {
                                        snprintf(seen[k].slug,
                                                 sizeof(seen[k].slug), "%s",
                                                 slug);
                                        nseen++;
                                }
                                int dup = k < 1024 ? seen[k].count++ : 0;
                                if (dup)
                                        snprintf(want, sizeof(want), "%s-%d",
                                                 slug, dup);
                                else
                                        snprintf(want, sizeof(want), "%s",
                                                 slug);
                                found = !strcmp(want, frag);
                        }
                }
                l = nl ? nl + 1 : NULL;
        }
        free(seen);
        return found;
}

/* Checks every relative link of @p path (a Markdown file under the source
 * tree, named @p rel in messages); appends one line per broken link to
 * @p bad. Returns the number of links checked. */
static int
check_links(const char *path, const char *rel, FILE *bad)
{
        char *md = kt_slurp(path);
        cr_assert(md != NULL, "%s: cannot read", path);
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        *slash = '\0';
        int checked = 0, lineno = 0;
        bool fenced = false;
        for (const char *l = md; l && *l;) {
                const char *nl = strchr(l, '\n');
                size_t len = nl ? (size_t)(nl - l) : strlen(l);
                lineno++;
                if (is_fence(l)) {
                        fenced = !fenced;
                        l = nl ? nl + 1 : NULL;
                        continue;
                }
                bool code = false;
                for (size_t i = 0; !fenced && i + 1 < len; i++) {
                        if (l[i] == '`')
                                code = !code;
                        if (code || l[i] != ']' || l[i + 1] != '(')
                                continue;
                        const char *t = l + i + 2;
                        size_t tl = 0;
                        while (i + 2 + tl < len && t[tl] != ')' &&
                               t[tl] != ' ')
                                tl++;
                        char target[1024];
                        snprintf(target, sizeof(target), "%.*s", (int)tl, t);
                        if (strstr(target, "://") ||
                            !strncmp(target, "mailto:", 7) || !*target)
                                continue;
                        checked++;
                        char *hash = strchr(target, '#');
                        char *frag = NULL;
                        if (hash) {
                                *hash = '\0';
                                frag = hash + 1;
                        }
                        char file[8192];
                        if (*target)
                                snprintf(file, sizeof(file), "%s/%s", dir,
                                         target);
                        else
                                snprintf(file, sizeof(file), "%s", path);
                        struct stat st;
                        if (stat(file, &st)) {
                                fprintf(bad, "%s:%d: %.*s: no such file\n",
                                        rel, lineno, (int)tl, t);
                                continue;
                        }
                        if (!frag)
                                continue;
                        size_t fl = strlen(file);
                        if (fl < 3 || strcmp(file + fl - 3, ".md"))
                                continue;
                        char *target_md = kt_slurp(file);
                        if (!target_md || !has_anchor(target_md, frag))
                                fprintf(bad,
                                        "%s:%d: %.*s: no heading with "
                                        "anchor #%s\n",
                                        rel, lineno, (int)tl, t, frag);
                        free(target_md);
                }
                l = nl ? nl + 1 : NULL;
        }
        free(md);
        return checked;
}

/* Every relative link in README.md, CHANGELOG.md and docs/NAME.md names a
 * file that exists, and a #fragment names a heading of it. */
Test(docs, markdown_links_resolve)
{
        char *bad = NULL;
        size_t blen = 0;
        FILE *out = open_memstream(&bad, &blen);
        int links = 0, files = 0;
        links += check_links(KINBOX_SOURCE_DIR "/README.md", "README.md", out);
        links += check_links(KINBOX_SOURCE_DIR "/CHANGELOG.md", "CHANGELOG.md",
                             out);
        links += check_links(KINBOX_SOURCE_DIR "/CONTRIBUTING.md",
                             "CONTRIBUTING.md", out);
        files += 3;
        glob_t g;
        cr_assert(glob(KINBOX_SOURCE_DIR "/docs/*.md", 0, NULL, &g) == 0);
        for (size_t i = 0; i < g.gl_pathc; i++, files++)
                links += check_links(
                    g.gl_pathv[i],
                    g.gl_pathv[i] + strlen(KINBOX_SOURCE_DIR "/"), out);
        globfree(&g);
        fclose(out);
        cr_assert(blen == 0, "broken Markdown links:\n%s", bad);
        cr_assert(files > 10 && links > 50,
                  "only %d links in %d files: is the parser broken?", links,
                  files);
        free(bad);
}

/* The slug rules themselves. */
Test(docs, github_heading_anchors)
{
        char s[256];
        const char *h = "Holding a key: per-key order across dead letters";
        gh_slug(s, sizeof(s), h, strlen(h));
        cr_assert_str_eq(s, "holding-a-key-per-key-order-across-dead-letters");
        h = "`kinbox_tx_exec_values()` and `kinbox_tx_exec_values_unique()`";
        gh_slug(s, sizeof(s), h, strlen(h));
        cr_assert_str_eq(
            s, "kinbox_tx_exec_values-and-kinbox_tx_exec_values_unique");
        h = "Issue 11, fifth pass: A/B \xe2\x86\x92 `x` (2026-12-02)";
        gh_slug(s, sizeof(s), h, strlen(h));
        cr_assert_str_eq(s, "issue-11-fifth-pass-ab--x-2026-12-02");
        cr_assert(
            has_anchor("# A\n## B c\n```\n# not\n```\n## B c\n", "b-c-1"));
        cr_assert(has_anchor("# A\n```\n# not a heading\n```\n",
                             "not-a-heading") == false);
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
        char *man = kt_slurp(KINBOX_BINARY_DIR "/man/kinbox.conf.5");
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
        char *man = kt_slurp(KINBOX_SOURCE_DIR "/dist/man/kinbox.1");
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

/* docs/architecture.md names every source file of src/ (its module map is
 * the newcomer's way in: a file it does not name is a file nobody finds). */
Test(docs, architecture_names_every_source_file)
{
        char *arch = kt_slurp(KINBOX_SOURCE_DIR "/docs/architecture.md");
        cr_assert(arch != NULL);
        static const char *const pats[] = {KINBOX_SOURCE_DIR "/src/*.[ch]",
                                           KINBOX_SOURCE_DIR "/src/db/*.[ch]",
                                           KINBOX_SOURCE_DIR
                                           "/src/cli/*.[ch]"};
        int files = 0;
        char *missing = NULL;
        size_t mlen = 0;
        FILE *out = open_memstream(&missing, &mlen);
        for (size_t p = 0; p < sizeof(pats) / sizeof(pats[0]); p++) {
                glob_t g;
                cr_assert(glob(pats[p], 0, NULL, &g) == 0, "%s", pats[p]);
                for (size_t i = 0; i < g.gl_pathc; i++, files++) {
                        const char *base = strrchr(g.gl_pathv[i], '/') + 1;
                        char tick[300];
                        snprintf(tick, sizeof(tick), "%s`", base);
                        /* As a whole name: `name` or `dir/name`. */
                        bool named = false;
                        for (const char *q = strstr(arch, tick); q && !named;
                             q = strstr(q + 1, tick))
                                named =
                                    q > arch && (q[-1] == '`' || q[-1] == '/');
                        if (!named)
                                fprintf(out, "  %s\n",
                                        g.gl_pathv[i] +
                                            strlen(KINBOX_SOURCE_DIR) + 1);
                }
                globfree(&g);
        }
        fclose(out);
        cr_assert(files > 50, "only %d source files found", files);
        cr_assert(mlen == 0, "docs/architecture.md does not name:\n%s",
                  missing);
        free(missing);
        free(arch);
}

/* Every C block of README.md and docs/NAME.md that defines a handler (a
 * line "NAME(kinbox_tx_t *tx" opening a definition) is marked
 * "<!-- snippet: NAME -->" on the line before its fence: snippets_test
 * extracts the marked blocks and runs them against a broker and both
 * databases, so a handler a reader copies is one that ran. */
static int
check_snippets(const char *path, const char *rel, FILE *bad)
{
        char *md = kt_slurp(path);
        cr_assert(md != NULL, "%s: cannot read", path);
        int handlers = 0, lineno = 0, start = 0;
        bool in = false, marked = false, defines = false, prev_marker = false;
        for (const char *l = md; l && *l;) {
                const char *nl = strchr(l, '\n');
                size_t len = nl ? (size_t)(nl - l) : strlen(l);
                lineno++;
                if (!in && !strncmp(l, "```c", 4) && len == 4) {
                        in = true;
                        start = lineno;
                        marked = prev_marker;
                        defines = false;
                } else if (in && is_fence(l)) {
                        in = false;
                        if (defines && !marked)
                                fprintf(bad,
                                        "%s:%d: a handler without a "
                                        "\"<!-- snippet: NAME -->\" line "
                                        "before its fence\n",
                                        rel, start);
                        handlers += defines;
                } else if (in) {
                        const char *paren = memchr(l, '(', len);
                        if (paren && paren > l &&
                            (isalpha((unsigned char)l[0]) || l[0] == '_') &&
                            !strncmp(paren, "(kinbox_tx_t *tx", 16)) {
                                bool ident = true;
                                for (const char *q = l; q < paren && ident;
                                     q++)
                                        ident = isalnum((unsigned char)*q) ||
                                                *q == '_';
                                defines = defines || ident;
                        }
                }
                prev_marker = !strncmp(l, "<!-- snippet: ", 14);
                l = nl ? nl + 1 : NULL;
        }
        free(md);
        return handlers;
}

Test(docs, handler_snippets_are_marked_to_run)
{
        char *bad = NULL;
        size_t blen = 0;
        FILE *out = open_memstream(&bad, &blen);
        int handlers =
            check_snippets(KINBOX_SOURCE_DIR "/README.md", "README.md", out);
        glob_t g;
        cr_assert(glob(KINBOX_SOURCE_DIR "/docs/*.md", 0, NULL, &g) == 0);
        for (size_t i = 0; i < g.gl_pathc; i++)
                handlers += check_snippets(
                    g.gl_pathv[i],
                    g.gl_pathv[i] + strlen(KINBOX_SOURCE_DIR "/"), out);
        globfree(&g);
        fclose(out);
        cr_assert(blen == 0, "handler snippets not marked:\n%s", bad);
        cr_assert(handlers >= 2,
                  "only %d handler snippets found: is the parser broken?",
                  handlers);
        free(bad);
}
