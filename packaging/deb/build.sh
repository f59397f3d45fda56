#!/usr/bin/env bash
# make deb: dist/redis-rlock_$VERSION-1_<arch>.deb with dpkg-deb, from the module `make dist`
# staged in dist/rlock-$VERSION-linux-$ARCH/ (stripped, checked against glibc $GLIBC). Layout as
# Debian's own Redis module packages (redis-redisearch): the module in /usr/lib/redis/modules,
# plus the snippet /etc/redis/rlock.conf (a conffile) and the docs. No maintainer scripts: the
# admin's redis.conf is never edited. Runs lintian when it is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${VERSION:?}" "${ARCH:?}" "${GLIBC:?}"

stage="dist/rlock-$VERSION-linux-$ARCH"
debarch=$(dpkg --print-architecture)
debversion="$VERSION-1"
deb="dist/redis-rlock_${debversion}_$debarch.deb"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
doc="$root/usr/share/doc/redis-rlock"

install -d "$root/DEBIAN" "$root/usr/lib/redis/modules" "$root/etc/redis" "$doc"
install -m 0755 "$stage/librlock.so" "$root/usr/lib/redis/modules/librlock.so"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@MODULE@|/usr/lib/redis/modules/librlock.so|g" \
    -e "s|@CONF@|/etc/redis/rlock.conf|g" packaging/rlock.conf.in >"$root/etc/redis/rlock.conf"
chmod 0644 "$root/etc/redis/rlock.conf"
echo /etc/redis/rlock.conf >"$root/DEBIAN/conffiles"

# Docs as Debian ships them: copyright as is, changelogs and larger texts gzipped (-n: no
# name or time in the header, so the same input gives the same package).
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
install -m 0644 packaging/deb/copyright "$doc/copyright"
# Lintian overrides: not uploaded to Debian (its changelog closes no bug); Rust (nothing to fortify).
install -D -m 0644 packaging/deb/lintian-overrides "$root/usr/share/lintian/overrides/redis-rlock"
sed -e "s|@DEBVERSION@|$debversion|g" -e "s|@VERSION@|$VERSION|g" -e "s|@GLIBC@|$GLIBC|g" \
    -e "s|@DATE@|$(date -R -u -d "@$epoch")|g" packaging/deb/changelog.in |
    gzip -9n >"$doc/changelog.Debian.gz"
gzip -9n <CHANGELOG.md >"$doc/changelog.gz"
gzip -9n <README.md >"$doc/README.md.gz"
gzip -9n <"$stage/THIRD-PARTY-LICENSES" >"$doc/THIRD-PARTY-LICENSES.gz"
if [ -d docs ]; then
    install -d "$doc/docs"
    for f in docs/*.md; do gzip -9n <"$f" >"$doc/docs/$(basename "$f").gz"; done
fi
# Whatever the umask: 0644 files, 0755 directories, the module 0755 (Redis 7 refuses a module
# file without execute permission, as Debian's redis-redisearch also ships it).
find "$root" -path "$root/DEBIAN" -prune -o -type d -exec chmod 0755 {} + -o -type f -exec chmod 0644 {} +
chmod 0755 "$root/usr/lib/redis/modules/librlock.so"

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@DEBVERSION@|$debversion|g" -e "s|@DEBARCH@|$debarch|g" -e "s|@SIZE@|$size|g" \
    -e "s|@GLIBC@|$GLIBC|g" packaging/deb/control.in >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f ! -path './etc/*' -printf '%P\n' |
    LC_ALL=C sort | xargs md5sum >DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/"*
find "$root" -exec touch -h -d "@$epoch" {} +

rm -f "$deb"
SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
if command -v lintian >/dev/null 2>&1; then
    lintian --fail-on error "$deb"
fi
echo "$deb"
