"""The Python package's benchmark (`make bench-python`): redis-py's ``Lock``, python-redis-lock
and redis-rlock on ONE redis-server with the module, in one run.

Contention: N = 1, 8, 64 contending processes (and asyncio tasks in one process), each looping
acquire -> critical section (0 ms or 10 ms) -> release on one lock for a fixed time.
Reported per row: acquisitions/s, p50/p99 wait, the busiest and the idlest contender's
acquisitions, and server commands per acquisition (INFO commandstats deltas over the run /
acquisitions). Then uncontended acquire+release latency. Rows and targets (ratios against
redis-py's ``Lock`` from the same run) go to stdout and, with ``--out``, into the Python block
of BENCHMARKS.md (between ``<!-- python:`` and ``<!-- /python -->``; the rest is kept).

``--quick`` runs tiny durations (< 30 s, figures meaningless): it proves the harness runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# benchmark the package of this checkout, not whatever is installed
sys.path.insert(0, os.path.join(ROOT, "python", "src"))

import redis  # noqa: E402
import redis.asyncio as aredis  # noqa: E402

SYNC_LIBS = ["redis-py Lock", "python-redis-lock", "redis-rlock"]
ASYNC_LIBS = ["redis-py asyncio Lock", "redis-rlock aio"]
BASE_SYNC, BASE_ASYNC = SYNC_LIBS[0], ASYNC_LIBS[0]
PKG_SYNC, PKG_ASYNC = SYNC_LIBS[2], ASYNC_LIBS[1]
LEASE_S = 10  # redis-py's and python-redis-lock's expiry; redis-rlock: its watchdog (30 s)
#: commands that are the harness's or a connection's setup, not a lock's work
NOT_COUNTED = {"info", "ping", "client|setinfo", "hello", "config|get", "flushall", "select"}

# -- one contender's lock, sync ------------------------------------------------------------------


def sync_lock(lib: str, r: redis.Redis, name: str) -> tuple[Callable[[float], bool], Callable]:
    """(acquire(timeout s) -> bool, release()) for one contender. `with lock:` is exactly
    acquire + release; the explicit form lets a waiter stop at the run's end."""
    if lib == "redis-py Lock":
        lk: Any = r.lock(name, timeout=LEASE_S)  # sleep=0.1, redis-py's default
        return (lambda t: bool(lk.acquire(blocking_timeout=max(t, 0.0)))), lk.release
    if lib == "python-redis-lock":
        import redis_lock

        pl = redis_lock.Lock(r, name, expire=LEASE_S)
        # whole seconds only, and at most `expire`
        return (lambda t: bool(pl.acquire(timeout=min(LEASE_S, max(1, math.ceil(t)))))), (
            pl.release
        )
    if lib == "redis-rlock":
        import redis_rlock

        rl = redis_rlock.Lock(r, name)  # no lease: the watchdog renews (package default)
        return (lambda t: rl.acquire(timeout=max(t, 0.0))), rl.release
    raise ValueError(lib)


def async_lock(lib: str, r: aredis.Redis, name: str) -> tuple[Callable, Callable]:
    if lib == "redis-py asyncio Lock":
        lk: Any = r.lock(name, timeout=LEASE_S)

        async def acq(t: float) -> bool:
            return bool(await lk.acquire(blocking_timeout=max(t, 0.0)))

        return acq, lk.release
    if lib == "redis-rlock aio":
        import redis_rlock.aio

        rl = redis_rlock.aio.Lock(r, name)

        async def acq2(t: float) -> bool:
            return await rl.acquire(timeout=max(t, 0.0))

        return acq2, rl.release
    raise ValueError(lib)


# -- contenders ----------------------------------------------------------------------------------


@dataclass
class Tally:
    """One contender's results: acquisitions before the end, after it, and its waits (s)."""

    acq: int = 0
    late: int = 0
    waits: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each counted acquisition came


def sync_loop(
    acquire: Callable[[float], bool], release: Callable, crit: float, end: float
) -> Tally:
    t = Tally()
    while True:
        t0 = time.monotonic()
        if t0 >= end:
            return t
        ok = acquire(end - t0)
        t1 = time.monotonic()
        if not ok:  # gave up at the run's end: a wait at least this long
            t.waits.append(t1 - t0)
            continue
        if crit:
            time.sleep(crit)
        release()
        if t1 <= end:
            t.acq += 1
            t.waits.append(t1 - t0)
            t.times.append(t1)
        else:
            t.late += 1


def process_contender(lib, port, name, crit, ready, go, start_at, duration, out) -> None:
    r = redis.Redis(port=port)
    acquire, release = sync_lock(lib, r, name)
    # warm up: the connection(s) and the library's first-use work, on a lock of its own
    wa, wr = sync_lock(lib, r, f"{name}:warm:{os.getpid()}")
    if wa(1.0):
        wr()
    ready.wait()
    go.wait()
    start = start_at.value
    time.sleep(max(0.0, start - time.monotonic()))
    t = sync_loop(acquire, release, crit, start + duration)
    out.put((t.acq, t.late, t.waits, t.times))


async def async_main(lib, port, name, n, crit, ready, go, start_at, duration, out) -> None:
    r = aredis.Redis(port=port, max_connections=n + 8)
    pairs = [async_lock(lib, r, name) for _ in range(n)]

    async def warm(i: int) -> None:  # the pool's connections, and the first-use work
        wa, wr = async_lock(lib, r, f"{name}:warm:{os.getpid()}:{i}")
        if await wa(1.0):
            await wr()

    await asyncio.gather(*[warm(i) for i in range(n)])
    await asyncio.to_thread(ready.wait)
    await asyncio.to_thread(go.wait)
    start = start_at.value
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    end = start + duration

    async def loop(acquire: Callable, release: Callable) -> Tally:
        t = Tally()
        while True:
            t0 = time.monotonic()
            if t0 >= end:
                return t
            ok = await acquire(end - t0)
            t1 = time.monotonic()
            if not ok:
                t.waits.append(t1 - t0)
                continue
            if crit:
                await asyncio.sleep(crit)
            await release()
            if t1 <= end:
                t.acq += 1
                t.waits.append(t1 - t0)
                t.times.append(t1)
            else:
                t.late += 1

    for t in await asyncio.gather(*[loop(a, rl) for a, rl in pairs]):
        out.put((t.acq, t.late, t.waits, t.times))
    if lib == "redis-rlock aio":  # background cleanups (none expected) before the loop ends
        await pairs[0][1].__self__._be.flush(2.0)
    await r.aclose()


def async_process(*args: Any) -> None:
    asyncio.run(async_main(*args))


# -- the server ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, binary: str, module: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlock-pybench-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--loadmodule", module,
             "--logfile", os.path.join(self.dir, "server.log")],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.r = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                self.r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"the server did not start; see {self.dir}/server.log")

    def commands(self) -> dict[str, int]:
        stats = self.r.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- one row -------------------------------------------------------------------------------------


@dataclass
class Row:
    mode: str
    lib: str
    n: int
    crit_ms: int
    acq_s: float
    handoffs_s: float
    p50_ms: float
    p99_ms: float
    min_acq: int
    max_acq: int
    cmds_per_acq: float
    top: str


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def run_row(srv: Server, mode: str, lib: str, n: int, crit_ms: int, duration: float) -> Row:
    ctx = mp.get_context("fork")
    name = f"bench:{mode}:{lib}:{n}:{crit_ms}".replace(" ", "-")
    procs = n if mode == "processes" else 1
    ready, go = ctx.Barrier(procs + 1), ctx.Event()
    start_at, out = ctx.Value("d", 0.0), ctx.Queue()
    if mode == "processes":
        ps = [
            ctx.Process(
                target=process_contender,
                args=(lib, srv.port, name, crit_ms / 1000, ready, go, start_at, duration, out),
            )
            for _ in range(n)
        ]
    else:
        ps = [
            ctx.Process(
                target=async_process,
                args=(lib, srv.port, name, n, crit_ms / 1000, ready, go, start_at, duration, out),
            )
        ]
    for p in ps:
        p.start()
    ready.wait(120)
    before = srv.commands()
    start_at.value = time.monotonic() + 0.05
    go.set()
    tallies = [out.get(timeout=duration + 120) for _ in range(n)]
    for p in ps:
        p.join(60)
    after = srv.commands()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if k not in NOT_COUNTED}
    delta = {k: v for k, v in delta.items() if v > 0}
    acq = [a for a, _, _, _ in tallies]
    every = sum(a + late for a, late, _, _ in tallies)
    waits = [w for _, _, ws, _ in tallies for w in ws]
    # a hand-off: an acquisition by another contender than the previous one
    order = sorted((t, i) for i, (_, _, _, ts) in enumerate(tallies) for t in ts)
    handoffs = sum(1 for a, b in zip(order, order[1:]) if a[1] != b[1])
    total_cmds = sum(delta.values())
    top = ", ".join(
        f"{k.upper()} {v / max(every, 1):.2f}"
        for k, v in sorted(delta.items(), key=lambda kv: -kv[1])[:3]
    )
    return Row(
        mode, lib, n, crit_ms, sum(acq) / duration, handoffs / duration, pct(waits, 0.5) * 1000,
        pct(waits, 0.99) * 1000, min(acq), max(acq), total_cmds / max(every, 1), top,
    )  # fmt: skip


# -- uncontended ---------------------------------------------------------------------------------


def uncontended_child(port: int, block: int, blocks: int, out: Any) -> None:
    """Blocks of ``block`` acquire+release pairs, the libraries alternating block by block
    (the order flipping each time), so a shared machine's slow moments hit both alike: per
    library the median block, and the median of the per-block ratios to redis-py."""
    r = redis.Redis(port=port)
    sync = {lib: sync_lock(lib, r, f"bench:solo:{lib}".replace(" ", "-")) for lib in SYNC_LIBS}
    del sync["python-redis-lock"]
    res: dict[str, list[float]] = {lib: [] for lib in sync}
    for acquire, release in sync.values():  # warm
        for _ in range(block):
            acquire(1.0)
            release()
    for i in range(blocks):
        for lib in list(sync) if i % 2 == 0 else list(sync)[::-1]:
            acquire, release = sync[lib]
            t0 = time.perf_counter()
            for _ in range(block):
                acquire(1.0)
                release()
            res[lib].append((time.perf_counter() - t0) / block * 1e6)

    async def amain() -> dict[str, list[float]]:
        ar = aredis.Redis(port=port)
        alocks = {
            lib: async_lock(lib, ar, f"bench:solo:{lib}".replace(" ", "-")) for lib in ASYNC_LIBS
        }
        ares: dict[str, list[float]] = {lib: [] for lib in alocks}
        for acquire, release in alocks.values():
            for _ in range(block):
                await acquire(1.0)
                await release()
        for i in range(blocks):
            for lib in ASYNC_LIBS if i % 2 == 0 else ASYNC_LIBS[::-1]:
                acquire, release = alocks[lib]
                t0 = time.perf_counter()
                for _ in range(block):
                    await acquire(1.0)
                    await release()
                ares[lib].append((time.perf_counter() - t0) / block * 1e6)
        await ar.aclose()
        return ares

    res.update(asyncio.run(amain()))
    summary: dict[str, tuple[float, float]] = {}
    for lib, v in res.items():
        base = res[BASE_SYNC if lib in SYNC_LIBS else BASE_ASYNC]
        summary[lib] = (statistics.median(v), statistics.median(a / b for a, b in zip(v, base)))
    out.put(summary)


def uncontended(srv: Server, block: int, blocks: int) -> dict[str, tuple[float, float]]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=uncontended_child, args=(srv.port, block, blocks, out))
    p.start()
    res: dict[str, tuple[float, float]] = out.get(timeout=600)
    p.join(60)
    return res


# -- report --------------------------------------------------------------------------------------


def fmt(x: float) -> str:
    if math.isnan(x):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def machine(srv: Server) -> list[str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    info = srv.r.info("server")
    try:
        import redis_lock

        prl = redis_lock.__version__
    except Exception:
        prl = "?"
    commit = subprocess.run(
        ["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores (shared with other work)",
        f"- Server: Redis {info.get('redis_version')} with the module, one server for every row",
        f"- Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"python-redis-lock {prl}, redis-rlock from this checkout ({commit})",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]


def targets(
    rows: list[Row], solo: dict[str, tuple[float, float]]
) -> list[tuple[str, float, str, bool]]:
    def get(mode: str, lib: str, n: int, crit: int) -> Row:
        return next(r for r in rows if (r.mode, r.lib, r.n, r.crit_ms) == (mode, lib, n, crit))

    out = []
    for mode, base, pkg in (("processes", BASE_SYNC, PKG_SYNC), ("asyncio", BASE_ASYNC, PKG_ASYNC)):
        if not any(r.mode == mode and r.n == 8 for r in rows):
            continue
        b, p = get(mode, base, 8, 0), get(mode, pkg, 8, 0)
        what = "processes" if mode == "processes" else "asyncio tasks"
        ratio = p.acq_s / b.acq_s if b.acq_s else float("inf")
        out.append((f"acquisitions/s / {base}'s, 8 {what}, 0 ms held", ratio, "≥ 5", ratio >= 5))
        wr = p.p99_ms / b.p99_ms if b.p99_ms else float("nan")
        out.append((f"p99 wait / {base}'s, 8 {what}, 0 ms held", wr, "≤ 0.10", wr <= 0.1))
        starved = min(r.min_acq for r in rows if r.mode == mode and r.lib == pkg and r.n > 1)
        out.append(
            (
                f"idlest contender's acquisitions, every {pkg} row with N > 1 ({what})",
                float(starved),
                "≥ 1",
                starved >= 1,
            )
        )
    ur = solo[PKG_SYNC][1]
    out.append((f"uncontended acquire+release µs / {BASE_SYNC}'s", ur, "≤ 1.30", ur <= 1.3))
    return out


def why_not(rows: list[Row]) -> list[str]:
    """The reading of the first target when it is missed, with this run's figures."""

    def get(lib: str, n: int) -> Row:
        return next(r for r in rows if (r.mode, r.lib, r.n, r.crit_ms) == ("processes", lib, n, 0))

    try:
        b8, b1, p8, p1 = get(BASE_SYNC, 8), get(BASE_SYNC, 1), get(PKG_SYNC, 8), get(PKG_SYNC, 1)
    except StopIteration:
        return []
    if not b8.acq_s or p8.acq_s / b8.acq_s >= 5:
        return []
    same = 100 * (1 - b8.handoffs_s / b8.acq_s)
    return [
        "",
        "Why the first target is not met. At 0 ms held, redis-py's `Lock` is hardly contended: "
        "the process that releases takes the lock again at once while the others sleep out "
        f"their 0.1 s poll, so {same:.0f} % of its acquisitions are the same process again "
        f"({fmt(b8.handoffs_s)} hand-offs/s of {fmt(b8.acq_s)} acquisitions/s; idlest "
        f"contender {b8.min_acq}, busiest {b8.max_acq}), and its acquisitions/s is of the "
        f"order of one process's uncontended loop ({fmt(b1.acq_s)}/s at N = 1; rows run "
        "seconds to minutes apart on a shared machine, so this pair is noisier than the "
        "uncontended table). The package hands the "
        "lock over FIFO at every release, so every acquisition wakes another process: its "
        f"{fmt(p8.acq_s)}/s at 8 are {p8.acq_s / p1.acq_s:.2f}x its own uncontended loop "
        f"({fmt(p1.acq_s)}/s). 5x redis-py's figure would be {5 * b8.acq_s / p1.acq_s:.1f}x "
        "the rate of one process doing nothing but uncontended acquire+release, with a "
        "process wake-up in every cycle, on 2 shared cores. Where a cycle's time goes: the "
        "new holder's one round trip (its `RLOCK.RELEASE`, which hands the lock to the next "
        "waiter inside the server) and the next process's wake-up; 2.00 commands per "
        "acquisition, no polling, no retries, no thread hand-off (the watchdog thread is only "
        "woken when a hold's renewal becomes its earliest). The client's CPU per call "
        "(redis-py's connection pool and parser, the same for both libraries: see the "
        "uncontended table) bounds it. Reaching 5x would mean letting the releaser jump the "
        "queue as redis-py's does, giving up FIFO and the no-starvation target: not done.",
    ]


def report(
    rows: list[Row], solo: dict[str, tuple[float, float]], mach: list[str], args: Any
) -> str:
    s = ["<!-- python: written by `make bench-python` (python/bench/bench.py) -->", "## Python", ""]
    s += [
        "What Python users run today against the package (python/, redis-rlock), on ONE "
        "redis-server with the module, in one run of `make bench-python`"
        + (" (**--quick: tiny durations, figures meaningless**)" if args.quick else "")
        + ". The figures are ratios from one run on a shared 2-core machine: the load "
        "generators (up to 64 Python processes) and the server share the same 2 cores, so "
        "absolute numbers are noisy and only the ratios against redis-py's `Lock` measured in "
        "the same run mean anything.",
        "",
        *mach,
        "",
        "### Targets",
        "",
        "| target | measured | limit | met |",
        "|---|---|---|---|",
    ]
    for what, val, lim, ok in targets(rows, solo):
        s.append(f"| {what} | {fmt(val)} | {lim} | {'yes' if ok else '**no**'} |")
    notes = []
    for mode, base, pkg in (("processes", BASE_SYNC, PKG_SYNC), ("asyncio", BASE_ASYNC, PKG_ASYNC)):
        b = [r for r in rows if (r.mode, r.lib, r.n, r.crit_ms) == (mode, base, 8, 0)]
        p = [r for r in rows if (r.mode, r.lib, r.n, r.crit_ms) == (mode, pkg, 8, 0)]
        if b and p and b[0].handoffs_s:
            notes.append(
                f"{mode}: {fmt(p[0].handoffs_s)} against {fmt(b[0].handoffs_s)}, "
                f"{p[0].handoffs_s / b[0].handoffs_s:.1f}x"
            )
    if notes:
        s += [
            "",
            "Not a target, for reading the first row: hand-offs/s (an acquisition by another "
            "contender than the previous one) of the package against redis-py's at 8 "
            "contenders, 0 ms held: " + "; ".join(notes) + ".",
        ]
    s += why_not(rows)
    s += [
        "",
        "### Contention",
        "",
        f"N contenders loop acquire -> critical section (0 or 10 ms) -> release on one lock "
        f"for {args.duration:g} s each row (`with lock:` is exactly that; the explicit form lets "
        "a waiter give up at the run's end). Processes: N `multiprocessing` processes, a client "
        "each. asyncio: N tasks in one process sharing one `redis.asyncio` client, a lock object "
        "each (python-redis-lock has no asyncio API). redis-py's `Lock`: "
        f"`r.lock(name, timeout={LEASE_S})`, polling every 0.1 s (its default); "
        f"python-redis-lock: `Lock(r, name, expire={LEASE_S})` (SET NX + BLPOP); redis-rlock: "
        "`Lock(r, name)` (waits in the server, watchdog lease). Wait: from calling acquire to "
        "holding the lock, p50/p99 over every acquisition, plus the waits cut off by the run's "
        "end (a contender that never got the lock counts one wait of the whole run). "
        "min/max: the idlest and the busiest contender's acquisitions. Commands per "
        "acquisition: INFO commandstats calls during the row (without INFO, PING, HELLO, "
        "CLIENT SETINFO) / every acquisition, the three largest shares after it; "
        "commandstats also counts the commands a Lua script runs (redis-py's release is one "
        "EVALSHA running GET and DEL), so round trips per uncontended acquire+release are 2 "
        "for redis-py's `Lock` (SET, EVALSHA) and for the package (RLOCK.ACQUIRE, "
        "RLOCK.RELEASE).",
        "",
        "| mode | N | held ms | library | acquisitions/s | vs redis-py | hand-offs/s "
        "| p50 wait ms | p99 wait ms | min/max acquisitions | commands/acq "
        "| largest shares per acq |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = BASE_SYNC if r.mode == "processes" else BASE_ASYNC
        b = next(
            x for x in rows if (x.mode, x.lib, x.n, x.crit_ms) == (r.mode, base, r.n, r.crit_ms)
        )
        vs = f"{r.acq_s / b.acq_s:.2f}x" if b.acq_s else "∞ (0 for redis-py)"
        s.append(
            f"| {r.mode} | {r.n} | {r.crit_ms} | {r.lib} | {fmt(r.acq_s)} | {vs} | "
            f"{fmt(r.handoffs_s)} | {fmt(r.p50_ms)} | {fmt(r.p99_ms)} | {r.min_acq}/{r.max_acq} | "
            f"{fmt(r.cmds_per_acq)} | {r.top} |"
        )
    s += [
        "",
        "### Uncontended acquire + release",
        "",
        f"One process, a lock nobody else uses: blocks of {args.block} acquire+release pairs, "
        f"{args.blocks} blocks per library, the libraries alternating block by block (sync, "
        "then asyncio): the median block, and the median of the per-block ratios to redis-py's "
        "(the ratio of neighbouring blocks, which the shared machine's slow moments hit alike).",
        "",
        "| library | µs per acquire+release | vs redis-py |",
        "|---|---|---|",
    ]
    for lib in (BASE_SYNC, PKG_SYNC, BASE_ASYNC, PKG_ASYNC):
        s.append(f"| {lib} | {fmt(solo[lib][0])} | {solo[lib][1]:.2f}x |")
    s += ["<!-- /python -->", ""]
    return "\n".join(s)


def write_block(path: str, block: str) -> None:
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    b, e = old.find("<!-- python:"), old.find("<!-- /python -->")
    if b != -1 and e > b:
        new = old[:b] + block.rstrip("\n") + old[e + len("<!-- /python -->") :]
    else:
        new = old.rstrip("\n") + "\n\n" + block
    with open(path, "w") as f:
        f.write(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny durations (< 30 s)")
    ap.add_argument("--out", help="BENCHMARKS.md to write the Python block into")
    ap.add_argument("--server", default=os.environ.get("REDIS_SERVER", "redis-server"))
    ap.add_argument("--module", default=os.path.join(ROOT, "target", "release", "librlock.so"))
    ap.add_argument("--duration", type=float, help="seconds per contention row")
    args = ap.parse_args()
    if args.duration is None:
        args.duration = 0.4 if args.quick else 4.0
    args.block, args.blocks = (20, 10) if args.quick else (50, 60)
    sizes = [1, 8, 64]
    srv = Server(args.server, os.path.abspath(args.module))
    t0 = time.monotonic()
    try:
        rows = []
        for mode, libs in (("processes", SYNC_LIBS), ("asyncio", ASYNC_LIBS)):
            for n in sizes:
                for crit in (0, 10):
                    for lib in libs:
                        row = run_row(srv, mode, lib, n, crit, args.duration)
                        rows.append(row)
                        print(
                            f"{mode:9} N={n:<2} {crit:2} ms {lib:22} {fmt(row.acq_s):>7} acq/s "
                            f"hand-offs {fmt(row.handoffs_s):>6}/s p50 {fmt(row.p50_ms):>6} ms "
                            f"p99 {fmt(row.p99_ms):>6} ms "
                            f"min/max {row.min_acq}/{row.max_acq} cmds/acq "
                            f"{fmt(row.cmds_per_acq)} ({row.top})",
                            flush=True,
                        )
        solo = uncontended(srv, args.block, args.blocks)
        for lib, (us, ratio) in solo.items():
            print(
                f"uncontended {lib:22} {us:8.1f} µs per acquire+release, {ratio:.2f}x", flush=True
            )
        text = report(rows, solo, machine(srv), args)
    finally:
        srv.stop()
    print()
    print(text)
    print(f"took {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if args.out:
        write_block(args.out, text)
        print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
