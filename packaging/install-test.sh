#!/usr/bin/env bash
# `make install` / `make uninstall` into a temporary DESTDIR, as packagers call them: the files
# and the printed loadmodule line, then nothing left; a DESTDIR with spaces (and a PREFIX with
# one) writes and removes only under it; a snippet edited after the install is kept. Sourced
# by packaging/deb-test.sh (install_test adds to its counts); run alone (as any user), it ends
# with its own `test result:` line. Needs the module built (target/release/librlock.so).
# shellcheck source=packaging/smoke.sh
. "$(dirname "${BASH_SOURCE[0]}")/smoke.sh"

# install_test TMP: everything under TMP (an existing empty directory).
install_test() {
    local tmp=$1 root out
    local files="usr/local/lib/redis/modules/librlock.so usr/local/etc/redis/rlock.conf"
    echo "== make install / make uninstall (DESTDIR=$tmp/root)"
    "${MAKE:-make}" -s install DESTDIR="$tmp/root" >"$tmp/install.out"
    for f in $files; do check "make install put /$f" test -s "$tmp/root/$f"; done
    check "the installed snippet loads the installed module" \
        grep -qx "loadmodule /usr/local/lib/redis/modules/librlock.so" "$tmp/root/usr/local/etc/redis/rlock.conf"
    check "make install printed the loadmodule line" \
        grep -q "loadmodule /usr/local/lib/redis/modules/librlock.so" "$tmp/install.out"
    "${MAKE:-make}" -s uninstall DESTDIR="$tmp/root"
    check "make uninstall left no file ($(find "$tmp/root" -type f | tr '\n' ' '))" \
        test -z "$(find "$tmp/root" -type f)"
    check "make uninstall removed its directories" test ! -e "$tmp/root/usr/local/lib/redis" \
        -a ! -e "$tmp/root/usr/local/etc/redis"

    # A packager's DESTDIR and PREFIX with spaces: all under DESTDIR, nothing beside it (a word
    # of it taken for a path of its own would be created, or removed, elsewhere).
    root="$tmp/dest dir/root"
    mkdir -p "$tmp/dest dir" "$tmp/cwd"
    echo "== make install / uninstall, DESTDIR=\"$root\" PREFIX=\"/opt/my rlock\""
    out=$( (cd "$tmp/cwd" && "${MAKE:-make}" -s -C "$OLDPWD" install DESTDIR="$root" PREFIX="/opt/my rlock") 2>&1) || true
    check "make install into a DESTDIR with spaces put the module under it" \
        test -s "$root/opt/my rlock/lib/redis/modules/librlock.so"
    check "... and the snippet, naming the module's path" \
        grep -qx "loadmodule \"/opt/my rlock/lib/redis/modules/librlock.so\"" "$root/opt/my rlock/etc/redis/rlock.conf"
    check "make install wrote nothing beside DESTDIR ($(ls "$tmp" | tr '\n' ' ')) ($out)" \
        test "$(cd "$tmp" && find . -mindepth 1 -maxdepth 1 ! -name root ! -name 'dest dir' ! -name cwd ! -name '*.out' | wc -l)" -eq 0 -a -z "$(ls -A "$tmp/cwd")"
    "${MAKE:-make}" -s uninstall DESTDIR="$root" PREFIX="/opt/my rlock" >/dev/null 2>&1 || true
    check "make uninstall emptied the DESTDIR with spaces ($(find "$root" -type f | tr '\n' ' '))" \
        test -z "$(find "$root" -type f 2>/dev/null)"

    # An edited snippet is kept by uninstall (and said so); the module goes.
    "${MAKE:-make}" -s install DESTDIR="$tmp/edited" >/dev/null
    echo "rlock.stall-ms 2000" >>"$tmp/edited/usr/local/etc/redis/rlock.conf"
    out=$("${MAKE:-make}" -s uninstall DESTDIR="$tmp/edited" 2>&1) || true
    check "make uninstall keeps an edited snippet" test -s "$tmp/edited/usr/local/etc/redis/rlock.conf"
    check "... says so" grep -q "kept .*rlock.conf" <<<"$out"
    check "... and removes the module" test ! -e "$tmp/edited/usr/local/lib/redis/modules/librlock.so"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    cd "$(dirname "$0")/.."
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    install_test "$tmp"
    if [ "$FAILED" -eq 0 ]; then word=ok; else word=FAILED; fi
    echo "test result: $word. $PASSED passed; $FAILED failed"
    [ "$FAILED" -eq 0 ]
fi
