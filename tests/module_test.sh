#!/usr/bin/env bash
# module_test -- a handler module built as docs/modules.md says, from an
# installed prefix only, and loaded by that prefix's `kinbox run` against
# the test services on both backends:
#   * `cmake --install BUILD --prefix DIR`;
#   * examples/module built with the installed CMake package
#     (find_package(kinbox), kinbox_add_module()) and with the compile line
#     (`cc -shared -fPIC tally.c $(pkg-config --cflags kinbox)`);
#   * each loaded by DIR/bin/kinbox (migrate, run) on PostgreSQL and on
#     MariaDB: records with a message_id header on every one, the balances,
#     the dead letter of the bad payload and the outbox rows of the applied
#     messages (and none of the rejected one) asserted;
#   * a module linked with `pkg-config --libs kinbox` (needs a libkinbox.so
#     that a --prefix install leaves off the loader's path) is refused with
#     the advice, not a bare loader error.
#
# Needs the services of scripts/services (KINBOX_PG_URL, KINBOX_MYSQL_URL,
# KINBOX_BOOTSTRAP; KT_BROKER=kafka: KINBOX_KAFKA_BOOTSTRAP). Usage (ctest
# sets these):  module_test.sh SOURCE_DIR WORK_DIR BUILD_DIR
set -euo pipefail
src=$(realpath "$1")
work=$(realpath -m "$2")
build=$(realpath "$3")
fail() { echo "module_test: FAIL: $*" >&2; exit 1; }
boot=${KINBOX_BOOTSTRAP:-}
[ "${KT_BROKER:-}" = kafka ] && boot=${KINBOX_KAFKA_BOOTSTRAP:-}
for v in KINBOX_PG_URL KINBOX_MYSQL_URL; do
    [ -n "${!v:-}" ] || fail "$v is not set (start scripts/services and source services.env)"
done
[ -n "$boot" ] || fail "no broker: KINBOX_BOOTSTRAP / KINBOX_KAFKA_BOOTSTRAP not set"

rm -rf "$work"
mkdir -p "$work"
runpid=
dbs=()
my_re='^mysql://([^:]+):([^@]*)@([^:/]+):([0-9]+)/'
[[ $KINBOX_MYSQL_URL =~ $my_re ]] || fail "cannot read KINBOX_MYSQL_URL"
my=(mariadb -u"${BASH_REMATCH[1]}" -p"${BASH_REMATCH[2]}" -h"${BASH_REMATCH[3]}" -P"${BASH_REMATCH[4]}" -N -B)
cleanup() {
    [ -n "$runpid" ] && kill -9 "$runpid" 2>/dev/null || true
    for d in "${dbs[@]}"; do
        case $d in
            pg:*) psql "$KINBOX_PG_URL" -qc "DROP DATABASE IF EXISTS ${d#pg:}" >/dev/null 2>&1 || true ;;
            my:*) "${my[@]}" -e "DROP DATABASE IF EXISTS ${d#my:}" >/dev/null 2>&1 || true ;;
        esac
    done
}
trap cleanup EXIT

echo "== cmake --install --prefix"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log" || fail "cmake --install failed"
kinbox=$prefix/bin/kinbox
pc=$(find "$prefix" -name kinbox.pc)
[ -n "$pc" ] || fail "no kinbox.pc under $prefix"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")

out=$("$prefix/bin/kinbox-points-producer" --help) || fail "kinbox-points-producer --help exited $?"
grep -q "^usage: .*-b BOOTSTRAP" <<< "$out" || fail "kinbox-points-producer --help printed: $out"

echo "== examples/module with the installed CMake package"
cmake -S "$src/examples/module" -B "$work/cm" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" > "$work/cm.log" 2>&1 ||
    { cat "$work/cm.log"; fail "find_package(kinbox) / kinbox_add_module() failed"; }
cmake --build "$work/cm" >> "$work/cm.log" 2>&1 || { cat "$work/cm.log"; fail "the module does not build with the CMake package"; }
[ -f "$work/cm/tally.so" ] || fail "kinbox_add_module(tally ...) made no tally.so"

echo "== examples/module with the compile line"
mkdir -p "$work/pc"
# shellcheck disable=SC2046
cc -shared -fPIC -Wall -Wextra -Werror -o "$work/pc/tally.so" "$src/examples/module/tally.c" \
    $(pkg-config --cflags kinbox) || fail "the module does not build with pkg-config --cflags"
for so in "$work/cm/tally.so" "$work/pc/tally.so"; do
    syms=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^_' | tr '\n' ' ')
    [ "$syms" = "kinbox_module " ] || fail "$so exports \"$syms\", want only kinbox_module"
    ! readelf -d "$so" | grep -q 'libkinbox' || fail "$so needs libkinbox"
done

echo "== a module linked with pkg-config --libs"
mkdir -p "$work/libs"
# shellcheck disable=SC2046
cc -shared -fPIC -o "$work/libs/tally.so" "$src/examples/module/tally.c" $(pkg-config --cflags --libs kinbox) ||
    fail "the module does not build with pkg-config --cflags --libs"

# A fresh database on backend pg|my; prints its URL.
fresh_db() {
    local name=kbmod_$$_$RANDOM
    if [ "$1" = pg ]; then
        psql "$KINBOX_PG_URL" -qc "CREATE DATABASE $name" >/dev/null || fail "cannot create $name"
        dbs+=("pg:$name")
        echo "${KINBOX_PG_URL%/*}/$name"
    else
        "${my[@]}" -e "CREATE DATABASE $name" || fail "cannot create $name"
        dbs+=("my:$name")
        echo "${KINBOX_MYSQL_URL%/*}/$name"
    fi
}
q() { # backend url sql
    if [ "$1" = pg ]; then psql "$2" -Atc "$3" 2>/dev/null || true
    else "${my[@]}" -D "${2##*/}" -e "$3" 2>/dev/null || true; fi
}
write_ini() { # url topic module_dir
    cat > "$work/tally.ini" <<INI
[database]
url = $1
[kafka]
bootstrap.servers = $boot
session.timeout.ms = 6000
[consumer.tally]
topics = $2
handler = tally
handler.path = $3
batch.max = 64
INI
}

# Load the module in dir on backend be: the balances, one dead letter, an
# outbox row per applied message.
load_and_run() {
    local be=$1 dir=$2 url topic
    echo "== kinbox run, handler tally from $dir, on $be"
    url=$(fresh_db "$be")
    topic=modtest-$$-$RANDOM
    write_ini "$url" "$topic" "$dir"
    "$kinbox" migrate -c "$work/tally.ini" > "$work/migrate.log" 2>&1 ||
        { cat "$work/migrate.log"; fail "kinbox migrate with the module failed on $be"; }
    # Apache Kafka creates no topic on its own here; the dev broker does
    if [ "${KT_BROKER:-}" = kafka ]; then
        "${KINBOX_SERVICES:-$src/scripts/services}" kafka-topic "$topic" 1 ||
            fail "cannot create topic $topic"
    fi
    # alice twice in one batch: PostgreSQL's ON CONFLICT sums per account
    local i=0
    for p in "alice 5" "bob 3" "alice 2" "not a tally" "alice 1" "carol 4"; do
        i=$((i + 1))
        printf '%s\n' "$p" | kcat -P -b "$boot" -t "$topic" -p 0 -H "message_id=tally-$i" -H "source=module_test" ||
            fail "cannot produce to $topic"
    done
    "$kinbox" run -c "$work/tally.ini" > "$work/run.log" 2>&1 &
    runpid=$!
    local total=
    for _ in $(seq 1 120); do
        total=$(q "$be" "$url" "SELECT SUM(next_offset) FROM kinbox_offsets")
        [ "$total" = 6 ] && break
        kill -0 "$runpid" 2>/dev/null || break
        sleep 0.5
    done
    [ "$total" = 6 ] || { cat "$work/run.log"; fail "$be: the watermark did not reach 6 (${total:-none})"; }
    kill -TERM "$runpid"
    local rc=0
    wait "$runpid" || rc=$?
    runpid=
    [ "$rc" -eq 0 ] || { cat "$work/run.log"; fail "$be: kinbox run exited $rc after SIGTERM"; }
    local got
    got=$(q "$be" "$url" "SELECT account, total FROM tally_account ORDER BY account" | tr '\t|\n' '== ')
    [ "$got" = "alice=8 bob=3 carol=4 " ] || fail "$be: balances \"$got\", want alice=8 bob=3 carol=4"
    got=$(q "$be" "$url" "SELECT message_id FROM kinbox_dead_letter")
    [ "$got" = tally-4 ] || fail "$be: dead letters \"$got\", want tally-4"
    got=$(q "$be" "$url" "SELECT idem_key FROM kinbox_outbox WHERE destination = 'tally.applied' ORDER BY idem_key" | tr '\n' ' ')
    [ "$got" = "tally-1 tally-2 tally-3 tally-5 tally-6 " ] ||
        fail "$be: outbox rows \"$got\", want those of the 5 applied messages"
    # the operator commands on it
    "$kinbox" verify -c "$work/tally.ini" > "$work/verify.log" 2>&1 ||
        { cat "$work/verify.log"; fail "$be: kinbox verify failed"; }
}

for be in pg my; do
    load_and_run "$be" "$work/cm"
    load_and_run "$be" "$work/pc"
done

echo "== the --libs module under a --prefix install"
url=$(fresh_db pg)
write_ini "$url" "modtest-libs-$$" "$work/libs"
rc=0
"$kinbox" migrate -c "$work/tally.ini" > "$work/libs.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$work/libs.log"; fail "a module needing an unreachable libkinbox: migrate exited $rc, want 2"; }
grep -q "is not linked against libkinbox" "$work/libs.log" &&
    grep -q "docs/modules.md" "$work/libs.log" ||
    { cat "$work/libs.log"; fail "the loader error does not say how to build the module"; }
echo "module_test: all checks passed"
