#!/usr/bin/env bash
# make run-test (CI): README.md's first steps as a newcomer takes them. `make run PORT=<free>`
# is started in the background (its own process group), polled until it answers PING (bounded:
# it may have to build first), then: the module is loaded, each `redis-cli` line `make run`
# prints to try works, README.md's tour transcripts replay on that very server
# (tests/docs.rs, the_readme_tour_replays_on_make_run), and SHUTDOWN stops it and `make run`
# with it. Nothing is left running. Ends with `test result: ok. N passed; M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MAKE:=make}" "${CARGO:=cargo}" "${RUN_TEST_BUILD_SECONDS:=900}"
# shellcheck source=packaging/smoke.sh
. packaging/smoke.sh
cli=${REDIS_CLI:-redis-cli}
port=$(free_port)
tmp=$(mktemp -d)
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

echo "== make run PORT=$port (in the background)"
setsid "$MAKE" run PORT="$port" >"$tmp/run.out" 2>&1 &
pid=$!
up() { [ "$("$cli" -p "$port" PING 2>/dev/null)" = PONG ] || { kill -0 "$pid" 2>/dev/null || return 2; false; }; }
check "make run PORT=$port answers PING on 127.0.0.1:$port" poll "$RUN_TEST_BUILD_SECONDS" up
check "make run loaded the module (MODULE LIST)" \
    bash -c "'$cli' -p $port --raw MODULE LIST | grep -qx rlock"

# The lines `make run` prints to try: each with this port, none answered with an error.
tries=$(sed -n 's/^  \(redis-cli -p .*\)$/\1/p' "$tmp/run.out")
check "make run printed lines to try ($(wc -l <<<"$tries"))" test -n "$tries"
while IFS= read -r line; do
    [ -n "$line" ] || continue
    read -r -a words <<<"$line"
    check "make run's hint uses its port: $line" test "${words[2]}" = "$port"
    out=$("$cli" -p "$port" "${words[@]:3}" 2>&1) || out="exit $?: $out"
    check "make run's hint works: $line -> $(tr '\n' ' ' <<<"$out")" \
        bash -c '! grep -qE "^(\(error\)|ERR|WRONGTYPE|exit )" <<<"$1"' _ "$out"
done <<<"$tries"

check "README.md's tour replays on make run's server" bash -c \
    "RLOCK_TOUR_PORT=$port '$CARGO' test -q -p rlock-tests-integration --test docs -- --ignored --exact the_readme_tour_replays_on_make_run >'$tmp/tour.out' 2>&1 || { cat '$tmp/tour.out'; false; }"

"$cli" -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
gone() { ! kill -0 "$pid" 2>/dev/null; }
if poll 20 gone; then
    status=0
    wait "$pid" 2>/dev/null || status=$?
    pid=""
    check "SHUTDOWN stops make run, which exits with status 0 ($status)" test "$status" -eq 0
else
    check "SHUTDOWN stops make run (still running: stopped with SIGTERM)" false
fi
if [ "$FAILED" -ne 0 ]; then
    echo "---- make run's output ----"
    tail -n 40 "$tmp/run.out"
fi

if [ "$FAILED" -eq 0 ]; then word=ok; else word=FAILED; fi
echo "test result: $word. $PASSED passed; $FAILED failed"
[ "$FAILED" -eq 0 ]
