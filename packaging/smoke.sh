# shellcheck shell=bash
# Sourced by the packaging scripts: `smoke LABEL SERVER LOAD` starts SERVER (a redis-server or
# valkey-server binary) on a free port of 127.0.0.1 with a temporary directory and a config file
# whose first line is LOAD (a `loadmodule ...` or an `include ...` line), checks the module
# (MODULE LIST, an acquire, a waiter served on release, INFO rlock), shuts it down and counts
# each check in PASSED / FAILED. With SMOKE_AS=redis (and root), the server runs as that user,
# as Debian's service does, so the files it reads must be readable by that user.
# Needs VERSION (Cargo's) and redis-cli (REDIS_CLI overrides it); checks the commit too when
# RLOCK_GIT_SHA is set. Safe under set -eu.
PASSED=${PASSED:-0}
FAILED=${FAILED:-0}

# check DESCRIPTION COMMAND...: runs COMMAND, counts and prints the outcome.
check() {
    local what=$1
    shift
    if "$@"; then
        PASSED=$((PASSED + 1))
        echo "  ok: $what"
    else
        FAILED=$((FAILED + 1))
        echo "  FAILED: $what"
    fi
}

# poll SECONDS COMMAND...: true as soon as COMMAND succeeds, false after SECONDS;
# COMMAND returning 2 means it never will: stop there.
poll() {
    local deadline=$((SECONDS + $1)) rc
    shift
    while :; do
        rc=0
        "$@" || rc=$?
        [ "$rc" -eq 0 ] && return 0
        if [ "$rc" -eq 2 ] || [ "$SECONDS" -ge "$deadline" ]; then return 1; fi
        sleep 0.05
    done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The module version as MODULE LIST shows it: major * 10000 + minor * 100 + patch.
module_ver() {
    local major minor patch
    IFS=. read -r major minor patch <<<"${VERSION%%-*}"
    echo $((major * 10000 + minor * 100 + patch))
}

smoke() {
    local label=$1 server=$2 load=$3
    local cli=${REDIS_CLI:-redis-cli} failed_before=$FAILED dir port pid waiter
    dir=$(mktemp -d)
    port=$(free_port)
    printf '%s\n' "$load" "port $port" "bind 127.0.0.1" "dir $dir" "logfile $dir/server.log" \
        'save ""' "appendonly no" "daemonize no" >"$dir/server.conf"
    local as=()
    if [ -n "${SMOKE_AS:-}" ]; then
        chown -R "$SMOKE_AS:" "$dir"
        as=(setpriv --reuid="$SMOKE_AS" --regid="$SMOKE_AS" --init-groups --)
    fi
    echo "smoke: $label ($server, $load)"
    "${as[@]+"${as[@]}"}" "$server" "$dir/server.conf" >"$dir/stdout" 2>&1 &
    pid=$!
    c() { "$cli" -p "$port" --no-raw "$@" 2>&1; }
    raw() { "$cli" -p "$port" --raw "$@" 2>&1; }
    up() { [ "$(c PING)" = PONG ] || { kill -0 "$pid" 2>/dev/null || return 2; false; }; }
    check "$label: the server starts with the module loaded" poll 10 up

    local list
    list=$(raw MODULE LIST | tr '\n' ' ') || true
    check "$label: MODULE LIST shows rlock ver $(module_ver) ($list)" \
        grep -q "name rlock ver $(module_ver) " <<<"$list"
    check "$label: RLOCK.ACQUIRE takes a free lock" \
        test "$(c RLOCK.ACQUIRE smoke:lock owner-a 30000)" = "(nil)"

    # A second client waits server-side, and is served when the holder releases.
    waiter="$dir/waiter.out"
    "$cli" -p "$port" --no-raw RLOCK.ACQUIRE smoke:lock owner-b 30000 WAIT 20000 >"$waiter" 2>&1 &
    local wpid=$!
    waiting() { grep -qx 'rlock_waiting_clients:1' <<<"$(raw INFO rlock | tr -d '\r')"; }
    check "$label: a second client's RLOCK.ACQUIRE ... WAIT blocks" poll 10 waiting
    check "$label: RLOCK.RELEASE frees the lock" \
        test "$(c RLOCK.RELEASE smoke:lock owner-a)" = "(integer) 1"
    served() { ! kill -0 "$wpid" 2>/dev/null; }
    check "$label: the waiter is served on release" poll 10 served
    kill "$wpid" 2>/dev/null || true
    wait "$wpid" 2>/dev/null || true
    check "$label: the waiter got the lock ($(cat "$waiter"))" \
        test "$(cat "$waiter")" = "(nil)" -a "$(raw HGETALL smoke:lock | tr '\n' ' ')" = "owner-b 1 "

    local info
    info=$(raw INFO rlock | tr -d '\r') || true
    check "$label: INFO rlock shows rlock_version:$VERSION" grep -qx "rlock_version:$VERSION" <<<"$info"
    if [ -n "${RLOCK_GIT_SHA:-}" ]; then
        check "$label: INFO rlock shows rlock_git_sha:$RLOCK_GIT_SHA" \
            grep -qx "rlock_git_sha:$RLOCK_GIT_SHA" <<<"$info"
    fi

    c SHUTDOWN NOSAVE >/dev/null || true
    gone() { ! kill -0 "$pid" 2>/dev/null; }
    check "$label: the server shuts down" poll 10 gone
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if [ "$FAILED" -ne "$failed_before" ]; then
        echo "---- $label: server log ($dir/server.log) ----"
        cat "$dir/server.log" "$dir/stdout" 2>/dev/null || true
        echo "---- end of the server log ----"
    fi
    rm -rf "$dir"
}
