#!/usr/bin/env bash
# package_test -- the Debian packages as an operator gets them: build them
# (scripts/package), install them on this machine with apt-get, then from
# the installed files only: `kinbox --version`, `man kinbox`, `man
# kinbox.conf`, `systemd-analyze verify` of the unit, the README handler
# compiled with the installed pkg-config, `kinbox migrate` and `kinbox run`
# as the kinbox system user against the test services (a points grant from
# the topic and one from the outbox, through the relay, must reach the
# database), then purge: no file of the packages, no
# /etc/kinbox, no kinbox user left. Also `cmake --install --prefix DIR`:
# the README handler compiles and links with DIR's kinbox.pc.
#
# Needs root and the services of scripts/services (KINBOX_PG_URL,
# KINBOX_BOOTSTRAP). Runs on Debian 12 and in the Debian 13 root of
# scripts/trixie (the trixie shard): the package's Debian revision must
# name the distribution it was built on (~deb12u1, ~deb13u1). Usage (ctest
# sets these):
#   package_test.sh SOURCE_DIR WORK_DIR BUILD_DIR
# BUILD_DIR (configured for the default prefix) is the tree installed with
# --prefix.
set -euo pipefail
src=$1
work=$2
build=$3
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }
for v in KINBOX_PG_URL KINBOX_BOOTSTRAP; do
    [ -n "${!v:-}" ] || fail "$v is not set (start scripts/services and source services.env)"
done
[ "$(id -u)" -eq 0 ] || fail "needs root (dpkg)"

# One package test per system at a time (the ASan and plain suites, other
# worktrees): dpkg and /usr are shared. The Debian 13 root has its own
# dpkg and /usr (and shares /tmp with the host).
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
exec 9>"/tmp/kinbox-package-test-$codename.lock"
flock -w 1200 9 || fail "another package test holds /tmp/kinbox-package-test-$codename.lock"

rm -rf "$work"
mkdir -p "$work"
db=kbpkg_$$_$RANDOM
topic=pkgtest-$$-$RANDOM
conf=/etc/kinbox/pkgtest$$.conf
runpid=
cleanup() {
    [ -n "$runpid" ] && kill -9 "$runpid" 2>/dev/null || true
    if dpkg-query -W -f='${Status}' kinbox 2>/dev/null | grep installed >/dev/null; then
        dpkg --purge libkinbox-dev kinbox >/dev/null 2>&1 || true
    fi
    psql "$KINBOX_PG_URL" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== build the packages"
"$src/scripts/package" "$work/build" > "$work/debs.txt" || fail "scripts/package failed"
deb=$(grep '/kinbox_.*\.deb$' "$work/debs.txt")
devdeb=$(grep '/libkinbox-dev_.*\.deb$' "$work/debs.txt")
[ -f "$deb" ] && [ -f "$devdeb" ] || fail "packages not built: $(cat "$work/debs.txt")"
version=$(sed -n 's/^#define KINBOX_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
    "$src/include/kinbox/version.h" | paste -sd.)
want="$version-1~deb$(. /etc/os-release && echo "$VERSION_ID")u1"
for d in "$deb" "$devdeb"; do
    [ "$(dpkg-deb -f "$d" Version)" = "$want" ] ||
        fail "$d has version $(dpkg-deb -f "$d" Version), want $want (built on $codename)"
done

# A package left by an interrupted run would hide this one's problems.
dpkg --purge libkinbox-dev kinbox >/dev/null 2>&1 || true

echo "== install $deb $devdeb"
DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y \
    --no-install-recommends "$deb" "$devdeb" > "$work/apt.log" 2>&1 ||
    { cat "$work/apt.log"; fail "apt-get install failed"; }
dpkg -L kinbox libkinbox-dev > "$work/files.txt"

echo "== installed files"
[ "$(command -v kinbox)" = /usr/bin/kinbox ] || fail "kinbox is not /usr/bin/kinbox: $(command -v kinbox)"
out=$(/usr/bin/kinbox --version)
[ "$out" = "kinbox $version" ] || fail "kinbox --version printed \"$out\", want \"kinbox $version\""
# grep reads to the end (no -q): under pipefail a grep that leaves early
# makes ldd fail with SIGPIPE (a CI run failed so).
# The command carries the library's objects (it uses internals the shared
# library hides) and exports the public API to the handler modules it
# loads; libkinbox.so.0 is for programs built against the library.
! ldd /usr/bin/kinbox | grep libkinbox >/dev/null ||
    fail "installed kinbox loads a libkinbox: $(ldd /usr/bin/kinbox | grep kinbox)"
nm -D --defined-only /usr/bin/kinbox | grep -E " T kinbox_tx_exec$" >/dev/null ||
    fail "installed kinbox does not export the public API to handler modules"
[ -f /usr/lib/x86_64-linux-gnu/libkinbox.so.0 ] || fail "libkinbox.so.0 is not installed"
[ -x /usr/bin/kinbox-devbroker ] || fail "kinbox-devbroker is not installed"
! ldd /usr/bin/kinbox /usr/bin/kinbox-devbroker | grep "not found" >/dev/null ||
    fail "installed binaries miss libraries: $(ldd /usr/bin/kinbox /usr/bin/kinbox-devbroker | grep 'not found')"
for f in /usr/share/kinbox/kinbox-dashboard.json /usr/share/kinbox/kinbox-alerts.yml \
         /usr/share/kinbox/migrations/postgresql/0001_inbox.sql /etc/kinbox/kinbox.conf \
         /usr/lib/systemd/system/kinbox@.service /usr/include/kinbox/kinbox.h; do
    [ -f "$f" ] || fail "$f is not installed"
done
grep -qx /etc/kinbox/kinbox.conf /var/lib/dpkg/info/kinbox.conffiles ||
    fail "/etc/kinbox/kinbox.conf is not a conffile"
getent passwd kinbox >/dev/null || fail "the kinbox system user was not created"
[ "$(stat -c '%a %G' /etc/kinbox/kinbox.conf)" = "640 kinbox" ] ||
    fail "/etc/kinbox/kinbox.conf is $(stat -c '%a %G' /etc/kinbox/kinbox.conf), want 640 kinbox"
grep -q "Depends:.*libpq5" /var/lib/dpkg/status || fail "runtime Depends lack libpq5 (shlibdeps)"

echo "== man pages"
MANWIDTH=100 man kinbox > "$work/kinbox.1.txt" 2> "$work/man.err" || fail "man kinbox failed: $(cat "$work/man.err")"
grep -q "reconcile" "$work/kinbox.1.txt" || fail "man kinbox lacks the reconcile command"
grep -q "EXIT STATUS" "$work/kinbox.1.txt" || fail "man kinbox lacks EXIT STATUS"
MANWIDTH=100 man 5 kinbox.conf > "$work/kinbox.conf.5.txt" 2>>"$work/man.err" || fail "man 5 kinbox.conf failed"
grep -q "database.url" "$work/kinbox.conf.5.txt" || fail "man kinbox.conf lacks database.url"

echo "== systemd-analyze verify"
install -m 0640 -g kinbox /dev/null "$conf"
unit=kinbox@pkgtest$$.service
systemd-analyze verify "$unit" > "$work/verify.log" 2>&1 ||
    { cat "$work/verify.log"; fail "systemd-analyze verify $unit failed"; }
if [ -s "$work/verify.log" ]; then cat "$work/verify.log"; fail "systemd-analyze verify printed warnings"; fi

echo "== the README handler against the installed libkinbox-dev"
sed -n '/^```c$/,/^```$/p' "$src/README.md" | awk '/^```c$/{n++} n==1' | sed '/^```/d' > "$work/credit.c"
grep -q kinbox_consumer_new "$work/credit.c" || fail "README handler not found"
cc -Wall -o "$work/credit" "$work/credit.c" $(pkg-config --cflags --libs kinbox) ||
    fail "README handler does not build with the installed pkg-config"
cat > "$work/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(credit C)
find_package(kinbox REQUIRED)
add_executable(credit credit.c)
target_link_libraries(credit PRIVATE kinbox::kinbox)
CM
cmake -S "$work" -B "$work/cm" >/dev/null && cmake --build "$work/cm" >/dev/null ||
    fail "README handler does not build with find_package(kinbox)"

echo "== kinbox migrate + run as user kinbox against the test services"
psql "$KINBOX_PG_URL" -qc "CREATE DATABASE $db" >/dev/null || fail "cannot create database $db"
url=${KINBOX_PG_URL%/*}/$db
cat > "$conf" <<INI
[database]
url = $url
[kafka]
bootstrap.servers = $KINBOX_BOOTSTRAP
session.timeout.ms = 6000
[metrics]
listen = 127.0.0.1:0
[relay]
enabled = true
[consumer.pkgpoints]
topics = $topic
handler = points
INI
runuser -u kinbox -- /usr/bin/kinbox migrate -c "$conf" > "$work/migrate.log" 2>&1 ||
    { cat "$work/migrate.log"; fail "installed kinbox migrate failed"; }
printf '%s\n' '{"order_id": "o-pkg-1", "user_id": 7, "grant_points": 42}' |
    kcat -P -b "$KINBOX_BOOTSTRAP" -t "$topic" -k 7 -H message_id=pkg-1 ||
    fail "cannot produce to $topic"
# setpriv execs kinbox itself (runuser would stay the parent and take the signal).
setpriv --reuid=kinbox --regid=kinbox --init-groups -- /usr/bin/kinbox run -c "$conf" > "$work/run.log" 2>&1 &
runpid=$!
# The relay: an outbox row committed by the "service" goes to the topic,
# and the consumer applies it like the grant produced directly.
psql "$url" -qc "INSERT INTO kinbox_outbox (destination, idem_key, aggregate_id, payload)
    VALUES ('$topic', 'pkg-2', '7',
            convert_to('{\"order_id\": \"o-pkg-2\", \"user_id\": 7, \"grant_points\": 58}', 'UTF8'))" ||
    fail "cannot append to the outbox"
points=
for _ in $(seq 1 120); do
    points=$(psql "$url" -Atc "SELECT coalesce(sum(points), 0) FROM user_account" 2>/dev/null || true)
    [ "$points" = 100 ] && break
    kill -0 "$runpid" 2>/dev/null || break
    sleep 0.5
done
[ "$points" = 100 ] || { cat "$work/run.log"; fail "the grants did not reach the database (points = $points, want 42 from the topic + 58 through the outbox)"; }
sent=$(psql "$url" -Atc "SELECT count(*) FROM kinbox_outbox WHERE status = 'sent'")
[ "$sent" = 1 ] || fail "the relay did not mark the outbox row sent ($sent)"
kill -TERM "$runpid"
rc=0; wait "$runpid" || rc=$?
runpid=
[ "$rc" -eq 0 ] || { cat "$work/run.log"; fail "kinbox run exited $rc after SIGTERM"; }
rm -f "$conf"

echo "== purge"
dpkg --purge libkinbox-dev kinbox > "$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg --purge failed"; }
left=
while read -r f; do
    [ -e "$f" ] && [ ! -d "$f" ] && left="$left $f"
done < "$work/files.txt"
[ -z "$left" ] || fail "files left after purge:$left"
[ ! -e /etc/kinbox ] || fail "/etc/kinbox left after purge"
[ ! -e /usr/share/kinbox ] || fail "/usr/share/kinbox left after purge"
! getent passwd kinbox >/dev/null || fail "user kinbox left after purge"

echo "== cmake --install --prefix"
cmake --install "$build" --prefix "$work/prefix" >/dev/null || fail "cmake --install failed"
[ -f "$work/prefix/etc/kinbox/kinbox.conf" ] || fail "--prefix: the sample configuration is not under the prefix"
pc=$(find "$work/prefix" -name kinbox.pc)
cc -o "$work/credit2" "$work/credit.c" $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs kinbox) ||
    fail "README handler does not build against kinbox.pc installed with --prefix"
LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")") ldd "$work/credit2" | grep "$work/prefix/.*libkinbox.so.0" >/dev/null ||
    fail "the --prefix build does not link the --prefix libkinbox"
[ ! -e /etc/kinbox ] || fail "cmake --install --prefix wrote to /etc/kinbox"
echo "package_test: all checks passed"
