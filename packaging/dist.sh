#!/usr/bin/env bash
# make dist: the release tarball dist/rlock-$VERSION-linux-$ARCH.tar.gz. The module is built
# with cargo-zigbuild against glibc $GLIBC's symbols (zig links against that glibc's stubs; the
# bindings generator still runs on this host), stripped, refused if it needs a newer glibc, and
# loaded into redis-server for a smoke check. Environment (set by the Makefile): VERSION, ARCH,
# GLIBC, RLOCK_GIT_SHA (empty outside git).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VERSION:?}" "${ARCH:?}" "${GLIBC:?}"

name="rlock-$VERSION-linux-$ARCH"
stage="dist/$name"
triple="$ARCH-unknown-linux-gnu"

zigbuild=$(command -v cargo-zigbuild ||
    echo "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/cargo-zigbuild")
# The module reports the commit in INFO rlock; an empty value lets its build script decide.
if [ -n "${RLOCK_GIT_SHA:-}" ]; then export RLOCK_GIT_SHA; else unset RLOCK_GIT_SHA; fi
echo "building $name against glibc $GLIBC (commit ${RLOCK_GIT_SHA:-unknown})"
"$zigbuild" zigbuild --release --locked -p rlock --target "$triple.$GLIBC"

rm -rf "$stage" "dist/$name.tar.gz" "dist/$name.tar.gz.sha256"
mkdir -p "$stage"
cp "target/$triple/release/librlock.so" "$stage/librlock.so"
strip --strip-unneeded --remove-section=.comment "$stage/librlock.so"
chmod 0755 "$stage/librlock.so"  # Redis 7 refuses a module file without execute permission

# The highest glibc symbol version the module needs must not exceed the target.
needed=$(objdump -T "$stage/librlock.so" | grep -oE 'GLIBC_[0-9.]+' | sed 's/GLIBC_//' | sort -Vu | tail -1)
if [ "$(printf '%s\n%s\n' "$needed" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
    echo "dist: librlock.so needs GLIBC_$needed, above the target $GLIBC" >&2
    exit 1
fi
echo "librlock.so needs glibc >= $needed (target $GLIBC)"

sed -e "s|@VERSION@|$VERSION|g" -e "s|@MODULE@|/usr/local/lib/redis/modules/librlock.so|g" \
    -e "s|@CONF@|/usr/local/etc/redis/rlock.conf|g" packaging/rlock.conf.in >"$stage/rlock.conf"
cp LICENSE README.md CHANGELOG.md "$stage/"
python3 packaging/third_party.py "$triple" >"$stage/THIRD-PARTY-LICENSES"
if [ -d docs ]; then cp -r docs "$stage/docs"; fi
(cd "$stage" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort |
    xargs sha256sum >SHA256SUMS)

# Stable archive metadata: sorted names, owner 0, times set to the commit's date (when in git).
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    -C dist -czf "dist/$name.tar.gz" "$name"
(cd dist && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")

# The built module must load and work: the smoke check on this host's redis-server.
if command -v redis-server >/dev/null 2>&1; then
    # shellcheck source=packaging/smoke.sh
    . packaging/smoke.sh
    smoke "dist module on $(redis-server --version | grep -oE 'v=[0-9.]+')" \
        "$(command -v redis-server)" "loadmodule $PWD/$stage/librlock.so"
    if [ "$FAILED" -ne 0 ]; then
        echo "dist: the smoke check failed" >&2
        exit 1
    fi
fi
echo "dist/$name.tar.gz"
