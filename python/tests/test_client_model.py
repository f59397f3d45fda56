"""Model-based: a seeded random run over every kind (Lock, RWLock's sides, a counted Semaphore,
a LeasedSemaphore, a CountDownLatch, session holds), Owners (several handles of one owner,
re-entered with other leases), timeouts, asyncio tasks cancelled at random points, CLIENT KILL
of the package's connections and short SIGSTOPs of the server, sync and asyncio; after every
step what the caller may believe is checked against the server (``_model.Checker``).

``RLOCK_PY_MODEL_SECS`` (default 7 s per test), ``RLOCK_PY_MODEL_SEED`` (default random,
printed); the sync run also raises KeyboardInterrupt at random moments in its acquires and
releases (a signal handler can run between any two bytecodes; ``RLOCK_PY_MODEL_INTERRUPTS=0``
turns that off)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from typing import Any, Optional

import redis
import redis.asyncio as aredis
from _model import Checker, Guard, Model
from _servers import Server
from test_interrupts import quiet_return

import redis_rlock as rl
import redis_rlock.aio as ra

SECS = float(os.environ.get("RLOCK_PY_MODEL_SECS", "7"))
SEED = int(os.environ.get("RLOCK_PY_MODEL_SEED", str(random.randrange(1 << 30))))
INTERRUPTS = os.environ.get("RLOCK_PY_MODEL_INTERRUPTS", "1") == "1"
RT = 0.5  # the package's response timeout here
WATCHDOG = 1.5  # watchdog lease of every lock here (renewed every 0.5 s)
LEASES = [None, None, 0.4, 1.0, 2.5]
KEEPALIVE = 0.5  # the sessions' keepalive: a cut is noticed within two of them
GRACE = 2 * KEEPALIVE + RT
SETTLE = 3.0 + 3 * RT  # the longest lease, and a background release's retries
LOCK_KEYS = [b"m:lock", b"m:lock2", b"m:rw"]
COUNTED = {b"m:sem": 3}
LEASED = {b"m:lsem": 3}
LATCH = 4


def _model() -> Model:
    return Model(list(LOCK_KEYS), dict(COUNTED), dict(LEASED))


_PKG = os.path.dirname(rl.__file__)


class _Interrupt:
    """KeyboardInterrupt at a random moment of the next call (RLOCK_PY_MODEL_INTERRUPTS, on): at
    a random bytecode of the package's own code run by this thread (a trace function raising
    there, as a signal handler may between any two bytecodes), or from a real SIGALRM."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.armed = False
        self.left = 0

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(_PKG):
            return None
        frame.f_trace_opcodes = True
        # not where no signal handler runs (see ``quiet_return``)
        if event == "opcode" and not quiet_return(frame):
            self.left -= 1
            if self.left == 0:
                sys.settrace(None)
                raise KeyboardInterrupt
        return self._trace

    def __enter__(self) -> _Interrupt:
        if INTERRUPTS and self.rng.random() < 0.6:
            self.armed = True
            if self.rng.random() < 0.8:
                self.left = self.rng.randint(1, 3000)
                sys.settrace(self._trace)
            else:
                signal.setitimer(signal.ITIMER_REAL, self.rng.uniform(0.00002, 0.0015))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            sys.settrace(None)
            signal.setitimer(signal.ITIMER_REAL, 0)


def _raise_interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


# ---------------------------------------------------------------------------------------------
# sync: one thread drives every kind; objects are per thread, so it plays every party
# ---------------------------------------------------------------------------------------------
class _SyncRun:
    def __init__(self, server: Server, rng: random.Random) -> None:
        self.server = server
        self.rng = rng
        self.r = redis.Redis(port=server.port, socket_timeout=10)
        self.m = _model()
        self.c = Checker(server.port, self.m, SETTLE)
        opts: dict[str, Any] = {"response_timeout": RT, "watchdog_timeout": WATCHDOG}
        self.opts = opts
        self.owners = [rl.Owner(self.r, response_timeout=RT) for _ in range(2)]
        self.sem = rl.Semaphore(self.r, "m:sem", response_timeout=RT)
        self.lsem = rl.LeasedSemaphore(self.r, "m:lsem", lease=2.5, response_timeout=RT)
        self.session: Optional[rl.Session] = None
        self.latch = rl.CountDownLatch(self.r, "m:latch", response_timeout=RT)
        self.counted_down = 0
        # live lock objects and what they hold: (object, guard)
        self.locks: list[tuple[Any, Guard]] = []

    def setup(self) -> None:
        for k, n in {**COUNTED, **LEASED}.items():
            self.c.r.execute_command("RSEM.SETPERMITS", k, n)
        self.c.r.delete("m:latch")
        self.latch.try_set_count(LATCH)

    # -- the steps ---------------------------------------------------------------------------
    def _new_lock(self) -> tuple[Any, str, bytes, str]:
        rng = self.rng
        key = rng.choice(LOCK_KEYS)
        side = rng.choice(["read", "write"])
        how = rng.choice(["plain", "owner", "owner", "session"])
        if how == "owner":
            o = rng.choice(self.owners)
            made: Any = o.rw_lock(key, **self.opts) if key == b"m:rw" else o.lock(key, **self.opts)
            how = f"owner{self.owners.index(o)}"
        elif how == "session":
            if self.session is None or self.session.closed.is_set():
                self.session = rl.Session(self.r, response_timeout=RT, keepalive=KEEPALIVE)
            s = self.session
            made = s.rw_lock(key, **self.opts) if key == b"m:rw" else s.lock(key, **self.opts)
        else:
            cls: Any = rl.RWLock if key == b"m:rw" else rl.Lock
            made = cls(self.r, key, **self.opts)
        if key == b"m:rw":
            return getattr(made, side), side, key, f"{how} {side}"
        return made, "lock", key, how

    def _acquire(self, obj: Any, kind: str, key: bytes, label: str) -> None:
        rng = self.rng
        lease = rng.choice(LEASES)
        timeout = rng.choice([0, 0.05, 0.3])
        label = f"{label} {key.decode()} lease={lease}"
        self.m.log(f"acquire {label} timeout={timeout}")
        try:
            with _Interrupt(rng):
                got = obj.acquire(timeout > 0, timeout if timeout else -1, lease=lease)
        except KeyboardInterrupt:
            self.m.log("  KeyboardInterrupt")
            got = obj.owned()
        except rl.RLockError as e:
            self.m.log(f"  {type(e).__name__}: {e}")
            got = False
        except (redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"  {type(e).__name__}: {e}")
            got = False
        self.m.log(f"  -> {got}")
        if got:
            hold = obj.hold
            if any(g.hold is hold for _, g in self.locks):
                return  # a re-entry: the same hold, one more count
            g = Guard(kind, key, hold, label)
            self.locks.append((obj, g))
            self.m.add(g)

    def step_lock(self) -> None:
        if self.locks and self.rng.random() < 0.3:  # re-enter what an object holds
            obj, g = self.rng.choice(self.locks)
            self._acquire(obj, g.kind, g.key, "again " + g.label.split(" ")[0])
        else:
            self._acquire(*self._new_lock())

    def step_release(self) -> None:
        if not self.locks:
            return
        i = self.rng.randrange(len(self.locks))
        obj, g = self.locks[i]
        self.m.log(f"release {g.label} count={g.hold.count}")
        try:
            with _Interrupt(self.rng):
                obj.release()
        except KeyboardInterrupt:
            self.m.log("  KeyboardInterrupt")
        except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"  {type(e).__name__}: {e}")
        if g.hold.done:
            self.locks.pop(i)

    def step_permits(self) -> None:
        rng = self.rng
        timeout = rng.choice([0, 0.05, 0.3])
        n = rng.randint(1, 2)
        leased = rng.random() < 0.5
        label = f"{'leased' if leased else 'counted'} {n}"
        self.m.log(f"acquire {label} timeout={timeout}")
        hold = None
        try:
            with _Interrupt(rng):
                if leased:
                    hold = self.lsem.acquire(n, timeout > 0, timeout if timeout else -1)
                else:
                    hold = self.sem.permits(n, timeout > 0, timeout if timeout else -1)
        except KeyboardInterrupt:
            self.m.log("  KeyboardInterrupt (the call's grant, if any, is not the caller's)")
        except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"  {type(e).__name__}: {e}")
        self.m.log(f"  -> {hold}")
        if hold is not None:
            key = b"m:lsem" if leased else b"m:sem"
            self.m.add(Guard("leased" if leased else "counted", key, hold, label))

    def step_permits_release(self) -> None:
        holds = [g for g in self.m.guards if g.kind in ("counted", "leased") and not g.hold.done]
        if not holds:
            return
        g = self.rng.choice(holds)
        self.m.log(f"release {g.label}")
        try:
            with _Interrupt(self.rng):
                g.hold.release()
        except KeyboardInterrupt:
            self.m.log("  KeyboardInterrupt")
        except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"  {type(e).__name__}: {e}")

    def step_latch(self) -> None:
        if self.rng.random() < 0.5 and self.counted_down < LATCH + 1:
            self.counted_down += 1  # counted before it is sent: it may have reached the server
            self.m.log(f"latch count_down ({self.counted_down})")
            try:
                self.latch.count_down()
            except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
                self.m.log(f"  {type(e).__name__}: {e}")
        else:
            try:
                opened = self.latch.wait(self.rng.choice([0, 0.02]))
            except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
                self.m.log(f"latch wait: {type(e).__name__}: {e}")
                return
            self.m.log(f"latch wait -> {opened}")
            if opened:
                self.c.latch_opened("latch wait", self.counted_down, LATCH)

    def step_chaos(self) -> None:
        rng = self.rng
        x = rng.random()
        if x < 0.5:
            n = self.c.kill_clients(GRACE)
            self.m.log(f"CLIENT KILL: {n} connections")
        elif x < 0.7:
            pause = rng.uniform(0.1, 0.6)
            self.m.log(f"SIGSTOP for {pause:.2f} s")
            self.server.pause()
            time.sleep(pause)
            self.server.resume()
            self.c.cut(GRACE)
        else:
            t = rng.uniform(0.05, 1.2)
            self.m.log(f"sleep {t:.2f} s (leases run, watchdogs renew)")
            time.sleep(t)

    def quiesce(self) -> None:
        """Releases everything the caller holds, closes the session; then: settled."""
        self.m.log("quiesce: release everything")
        for obj, g in self.locks:
            while not g.hold.done and not g.hold.is_lost():
                try:
                    obj.release()
                except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
                    self.m.log(f"  {g.label}: {type(e).__name__}")
                    break
        self.locks = []
        for g in self.m.guards:
            if g.kind in ("counted", "leased") and not g.hold.done:
                try:
                    g.hold.release()
                except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
                    self.m.log(f"  {g.label}: {type(e).__name__}")
        if self.session is not None:
            self.session.close()
            self.session = None
        self.m.guards = []
        self.c.settled()
        self.m.log("settled")

    def run(self, secs: float) -> None:
        self.setup()
        steps = [
            (self.step_lock, 5),
            (self.step_release, 4),
            (self.step_permits, 2),
            (self.step_permits_release, 2),
            (self.step_latch, 1),
            (self.step_chaos, 1),
        ]
        fns = [f for f, _ in steps]
        weights = [w for _, w in steps]
        end = time.monotonic() + secs
        n = 0
        while time.monotonic() < end:
            self.rng.choices(fns, weights)[0]()
            self.m.drop_done()
            self.c.check()
            n += 1
            if n % 60 == 0:
                self.quiesce()
        self.quiesce()
        hits = sum("KeyboardInterrupt" in line for line in self.m.steps)
        print(f"sync model: {n} steps, {hits} KeyboardInterrupts")


def test_sync_clients_keep_every_promise_against_the_model(server: Server) -> None:
    print(f"RLOCK_PY_MODEL_SEED={SEED}")
    old = signal.signal(signal.SIGALRM, _raise_interrupt)
    try:
        _SyncRun(server, random.Random(SEED)).run(SECS)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------------------
# asyncio: worker tasks (each its own party), cancelled at random points
# ---------------------------------------------------------------------------------------------
class _AsyncRun:
    def __init__(self, server: Server, rng: random.Random) -> None:
        self.server = server
        self.rng = rng
        self.r = aredis.Redis(port=server.port, socket_timeout=10)
        self.m = _model()
        self.c = Checker(server.port, self.m, SETTLE)
        self.opts: dict[str, Any] = {"response_timeout": RT, "watchdog_timeout": WATCHDOG}
        self.sem = ra.Semaphore(self.r, "m:sem", response_timeout=RT)
        self.lsem = ra.LeasedSemaphore(self.r, "m:lsem", lease=2.5, response_timeout=RT)
        self.latch = ra.CountDownLatch(self.r, "m:latch", response_timeout=RT)
        self.session: Optional[ra.Session] = None
        self.counted_down = 0
        self.n = 0

    async def _lock(self, tag: str) -> None:
        rng = self.rng
        key = rng.choice(LOCK_KEYS)
        side = rng.choice(["read", "write"])
        how = rng.choice(["plain", "owner", "owner", "session"])
        if how == "owner":
            o = ra.Owner(self.r, response_timeout=RT)
            objs = [o.rw_lock(key, **self.opts) if key == b"m:rw" else o.lock(key, **self.opts)]
            if rng.random() < 0.6:  # the same owner's unit of work takes it again, nested
                objs.append(
                    o.rw_lock(key, **self.opts) if key == b"m:rw" else o.lock(key, **self.opts)
                )
        elif how == "session":
            if self.session is None or self.session.closed.is_set():
                self.session = await ra.Session(
                    self.r, response_timeout=RT, keepalive=KEEPALIVE
                ).open()
            s = self.session
            objs = [s.rw_lock(key, **self.opts) if key == b"m:rw" else s.lock(key, **self.opts)]
        else:
            cls: Any = ra.RWLock if key == b"m:rw" else ra.Lock
            objs = [cls(self.r, key, **self.opts)]
        if key == b"m:rw":
            objs = [getattr(x, side) for x in objs]
        kind = side if key == b"m:rw" else "lock"
        await self._nested(tag, how, kind, key, objs)

    async def _nested(self, tag: str, how: str, kind: str, key: bytes, objs: list[Any]) -> None:
        if not objs:
            await asyncio.sleep(self.rng.uniform(0, 0.3))
            return
        obj, rest = objs[0], objs[1:]
        lease = self.rng.choice(LEASES)
        timeout = self.rng.choice([0, 0.05, 0.3, -1])
        label = f"{tag} {how} {kind} {key.decode()} lease={lease}"
        self.m.log(f"acquire {label} timeout={timeout}")
        try:
            got = await obj.acquire(timeout != 0, timeout if timeout else -1, lease=lease)
        except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"  {label}: {type(e).__name__}: {e}")
            return
        self.m.log(f"  {label} -> {got}")
        if not got:
            return
        g = Guard(kind, key, obj.hold, label)
        self.m.add(g)
        try:
            await asyncio.sleep(self.rng.uniform(0, 0.3))
            await self._nested(tag, how, kind, key, rest)
            await asyncio.sleep(self.rng.uniform(0, 0.3))
        finally:
            self.m.log(f"release {label}")
            try:
                await obj.release()
            except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
                self.m.log(f"  {label}: {type(e).__name__}: {e}")

    async def _permits(self, tag: str) -> None:
        rng = self.rng
        n = rng.randint(1, 2)
        leased = rng.random() < 0.5
        timeout = rng.choice([0, 0.05, 0.3, -1])
        label = f"{tag} {'leased' if leased else 'counted'} {n}"
        self.m.log(f"acquire {label} timeout={timeout}")
        try:
            if leased:
                hold = await self.lsem.acquire(n, timeout != 0, timeout if timeout else -1)
            else:
                hold = await self.sem.permits(n, timeout != 0, timeout if timeout else -1)
        except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"  {label}: {type(e).__name__}: {e}")
            return
        self.m.log(f"  {label} -> {hold}")
        if hold is None:
            return
        key = b"m:lsem" if leased else b"m:sem"
        g = Guard("leased" if leased else "counted", key, hold, label)
        self.m.add(g)
        async with hold:
            await asyncio.sleep(rng.uniform(0, 0.5))
            self.m.log(f"release {label}")

    async def _latch(self, tag: str) -> None:
        if self.rng.random() < 0.4 and self.counted_down < LATCH + 1:
            self.counted_down += 1
            self.m.log(f"{tag} latch count_down ({self.counted_down})")
            await self.latch.count_down()
            return
        timeout = self.rng.choice([0, 0.1, None])
        opened = await self.latch.wait(timeout)
        self.m.log(f"{tag} latch wait({timeout}) -> {opened}")
        if opened:
            self.c.latch_opened(f"{tag} latch wait", self.counted_down, LATCH)

    async def _worker(self) -> None:
        self.n += 1
        tag = f"t{self.n}"
        op = self.rng.choices([self._lock, self._permits, self._latch], [5, 3, 1])[0]
        try:
            await op(tag)
        except asyncio.CancelledError:
            self.m.log(f"{tag} cancelled")
            raise
        except (rl.RLockError, redis.ConnectionError, redis.TimeoutError) as e:
            self.m.log(f"{tag} {type(e).__name__}: {e}")

    async def _round(self, secs: float) -> int:
        rng = self.rng
        tasks: list[asyncio.Task[None]] = []
        end = time.monotonic() + secs
        steps = 0
        while time.monotonic() < end:
            steps += 1
            if len(tasks) < 8:
                tasks.append(asyncio.create_task(self._worker()))
            await asyncio.sleep(rng.uniform(0, 0.03))
            if tasks and rng.random() < 0.15:
                t = rng.choice(tasks)
                self.m.log(f"cancel a task ({t.get_name()})")
                t.cancel()
            x = rng.random()
            if x < 0.03:
                self.m.log(f"CLIENT KILL: {self.c.kill_clients(GRACE)} connections")
            elif x < 0.045:
                pause = rng.uniform(0.1, 0.6)
                self.m.log(f"SIGSTOP for {pause:.2f} s")
                self.server.pause()
                await asyncio.sleep(pause)
                self.server.resume()
                self.c.cut(GRACE)
            tasks = [t for t in tasks if not t.done() or _reraise(t)]
            self.m.drop_done()
            self.c.check()
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self.session is not None:
            await self.session.close()
            self.session = None
        self.m.drop_done()
        self.c.check()
        self.m.guards = []
        self.m.log("quiesce")
        await asyncio.to_thread(self.c.settled)
        self.m.log("settled")
        return steps

    async def run(self, secs: float) -> None:
        for k, n in {**COUNTED, **LEASED}.items():
            self.c.r.execute_command("RSEM.SETPERMITS", k, n)
        self.c.r.delete("m:latch")
        await self.latch.try_set_count(LATCH)
        end = time.monotonic() + secs
        steps = 0
        while time.monotonic() < end:
            steps += await self._round(min(2.5, max(0.5, end - time.monotonic())))
        print(f"asyncio model: {steps} steps")
        await self.r.aclose()


def _reraise(t: asyncio.Task[None]) -> bool:
    """A finished task's unexpected exception (a model violation in a latch wait) fails."""
    if not t.cancelled() and t.exception() is not None:
        raise t.exception()  # type: ignore[misc]
    return False


async def test_asyncio_clients_keep_every_promise_against_the_model(server: Server) -> None:
    print(f"RLOCK_PY_MODEL_SEED={SEED}")
    await _AsyncRun(server, random.Random(SEED)).run(SECS)
