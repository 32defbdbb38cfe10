#!/bin/sh
# extract_snippets.sh OUT FILE... -- the C code blocks of Markdown files
# marked "<!-- snippet: NAME ... -->" on the line before their ```c fence,
# as one header for tests/snippets_test.c: each block as written (with
# #line directives pointing at the Markdown), its main() renamed, then
# kt_snippet_names[] listing NAME of every block.
set -eu
out=$1
shift
tmp=$out.tmp
: > "$tmp"
names=
for f in "$@"; do
    awk -v file="$f" -v base="$(basename "$f")" '
        /^<!-- snippet: / { name = $3; want = NR + 1; next }
        NR == want && /^```c$/ {
            printf "/* %s, snippet %s */\n#define main kt_snippet_main_%s\n#line %d \"%s\"\n", base, name, name, NR + 1, file
            inb = 1; next
        }
        inb && /^```/ { printf "#undef main\n"; inb = 0; next }
        inb { print }
    ' "$f" >> "$tmp"
    names="$names $(sed -n 's/^<!-- snippet: \([A-Za-z0-9_]*\).*/\1/p' "$f" | tr '\n' ' ')"
done
{
    echo "static const char *const kt_snippet_names[] = {"
    for n in $names; do echo "    \"$n\","; done
    echo "    NULL};"
} >> "$tmp"
mv "$tmp" "$out"
