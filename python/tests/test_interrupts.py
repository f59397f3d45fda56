"""A net for asynchronous exceptions: a KeyboardInterrupt raised at every line, in turn, that
the package's code runs for a ``with`` block (entry, re-entry, exit) of a lock, both sides of
a read-write lock, counted and leased semaphores, and a guard's own release. After each
interrupted run, what the caller may believe is checked against the server: a guard that
says held is held; nothing else stays held (bounded poll); permits are conserved.

The interrupt is injected with ``sys.settrace`` on the test's thread only (deterministic:
one run per line event, until a run ends before the k-th event), so the watchdog's and the
releaser's threads are never interrupted.

And single interrupts where they land in practice: a ``KeyboardInterrupt`` in a lock's or a
semaphore guard's release (the release goes on in the background), and a real ``SIGINT`` in a
wait (the waiter leaves the line; the lock is not handed to it)."""

from __future__ import annotations

import dis
import os
import queue
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional

import pytest
import redis
import redis.connection
from _servers import Server, info, poll, raise_once_here

import redis_rlock as rl
from redis_rlock import Hold, _sync

PKG = os.path.dirname(rl.__file__) + os.sep
PERMITS = 3
NOP = dis.opmap["NOP"]


_WITH_EXITS: dict[Any, frozenset[int]] = {}


def _with_exits(code: Any) -> frozenset[int]:
    """Offsets where no real signal lands, though a line event fires there: where a ``with``
    block's normal exit begins (three ``LOAD_CONST None`` and the call of ``__exit__``, on the
    ``with`` line: ``__exit__`` has not run yet) and the ``NOP`` of a ``try:`` line (outside
    the enclosing ``try``'s range in CPython 3.11). The interpreter looks for signals only at
    calls and jumps; the next line event stands for the same moment."""
    got = _WITH_EXITS.get(code)
    if got is None:
        ins = list(dis.get_instructions(code))
        exits = [
            i
            for i in range(len(ins) - 3)
            if all(x.opname == "LOAD_CONST" and x.argval is None for x in ins[i : i + 3])
            and ins[i + 3].opname in ("PRECALL", "CALL")
        ]
        # a ``return`` inside the block: the exit begins with a SWAP (its line: the ``with``)
        got = frozenset(
            [ins[i].offset for i in exits]
            + [ins[i - 1].offset for i in exits if i and ins[i - 1].opname == "SWAP"]
            + [x.offset for x in ins if x.opname == "NOP"]
        )
        _WITH_EXITS[code] = got
    return got


def run_interrupted_at(k: int, body: Callable[[], None]) -> Optional[str]:
    """Runs ``body``, raising KeyboardInterrupt at the ``k``-th line event of the package's
    code on this thread (once). Returns where it fired (None: the body ended first)."""
    seen = [0]
    fired: list[str] = []

    def local(frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if event == "line" and not fired and frame.f_lasti not in _with_exits(frame.f_code):
            seen[0] += 1
            if seen[0] == k:
                code = frame.f_code
                fired.append(
                    f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"
                )
                raise KeyboardInterrupt
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if fired or not frame.f_code.co_filename.startswith(PKG):
            return None
        return local

    sys.settrace(global_)
    try:
        body()
    except KeyboardInterrupt:
        assert fired, "a KeyboardInterrupt the test did not raise"
    finally:
        sys.settrace(None)
    return fired[0] if fired else None


_QUIET_RETURNS: dict[Any, frozenset[int]] = {}


def quiet_return(frame: FrameType) -> bool:
    """Whether ``frame`` is about to return at a moment no signal handler runs (CPython 3.11
    looks for signals at a function's start, backward jumps and right after calls): a
    ``RETURN_VALUE`` that does not follow a call. (An exception raised there by a trace
    function would leave the frame's own ``try``, popped before a ``return``.) One that
    follows a call stands for the moment right after it: ``return f()`` can be interrupted
    after ``f`` returned, outside any ``try`` of the frame's."""
    code = frame.f_code
    got = _QUIET_RETURNS.get(code)
    if got is None:
        ins = list(dis.get_instructions(code))
        got = frozenset(
            x.offset
            for i, x in enumerate(ins)
            if x.opname == "RETURN_VALUE" and not (i and ins[i - 1].opname.startswith("CALL"))
        )
        _QUIET_RETURNS[code] = got
    return frame.f_lasti in got


def run_interrupted_at_opcode(
    k: int, body: Callable[[], None], module: str, functions: frozenset[str] = frozenset()
) -> Optional[str]:
    """Runs ``body``, raising KeyboardInterrupt at the ``k``-th bytecode run in the frames of
    the package's ``module`` (a file name; only of these ``functions``, when given) on this
    thread (once), as a signal handler may between any two bytecodes. Returns where it fired
    (None: the body ended first)."""
    seen = [0]
    fired: list[str] = []

    def local(frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if (
            event == "opcode"
            and not fired
            and not quiet_return(frame)
            # a ``try:`` line's NOP, outside the ``try`` (CPython 3.11): no signal lands on
            # it, the interpreter looks for them at calls and jumps
            and frame.f_code.co_code[frame.f_lasti] != NOP
        ):
            seen[0] += 1
            if seen[0] == k:
                op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
                fired.append(f"{module}:{frame.f_lineno} {frame.f_code.co_name} {op}")
                raise KeyboardInterrupt
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if fired or frame.f_code.co_filename != PKG + module:
            return None
        if functions and frame.f_code.co_name not in functions:
            return None
        frame.f_trace_opcodes = True
        return local

    sys.settrace(global_)
    try:
        body()
    except KeyboardInterrupt:
        assert fired, "a KeyboardInterrupt the test did not raise"
    finally:
        sys.settrace(None)
    return fired[0] if fired else None


def sweep(
    scenario: Callable[[], Callable[[], None]],
    check: Callable[[], None],
    run: Callable[[int, Callable[[], None]], Optional[str]] = run_interrupted_at,
) -> int:
    """Runs ``scenario()``'s body interrupted at line 1, 2, ... until a run completes without
    an interrupt; ``check()`` after each run. Returns how many runs were interrupted."""
    k = 0
    assert threading.current_thread() is threading.main_thread()
    while True:
        k += 1
        fired = run(k, scenario())
        try:
            check()
        except AssertionError as e:
            raise AssertionError(f"interrupted at line event {k}, {fired}: {e}") from None
        if not fired:
            assert k > 20, f"only {k - 1} lines traced: the net caught nothing"
            return k - 1


def _free(r: redis.Redis, key: str) -> Callable[[], bool]:
    return lambda: r.execute_command("RLOCK.PTTL", key) == -2


def test_lock_with_blocks_interrupted_anywhere_leave_nothing_held(r: redis.Redis) -> None:
    cur: list[rl.Lock] = []

    def scenario() -> Callable[[], None]:
        lk = rl.Lock(r, "ki:lock", response_timeout=0.5)
        cur[:] = [lk]

        def body() -> None:
            with lk, lk:  # a re-entry, and its exit
                pass

        return body

    def check() -> None:
        lk = cur[0]
        if lk.owned():  # the caller believes it holds it: the server must agree
            assert r.execute_command("RLOCK.PTTL", "ki:lock") > 0
            while lk.owned():
                lk.release()
        poll("the lock free after an interrupted run", 3.0, _free(r, "ki:lock"))

    assert sweep(scenario, check) > 0


def test_read_write_with_blocks_interrupted_anywhere_leave_nothing_held(
    r: redis.Redis,
) -> None:
    cur: list[rl.RWLock] = []

    def scenario() -> Callable[[], None]:
        rw = rl.RWLock(r, "ki:rw", response_timeout=0.5)
        cur[:] = [rw]

        def body() -> None:
            with rw.write, rw.read:  # write then read: one owner's re-entry
                pass
            with rw.read:
                pass

        return body

    def check() -> None:
        rw = cur[0]
        for side in (rw.read, rw.write):
            if side.owned():
                assert r.execute_command("RLOCK.PTTL", "ki:rw") > 0
        for side in (rw.read, rw.write):
            while side.owned():
                side.release()
        poll("the read-write lock free after an interrupted run", 3.0, _free(r, "ki:rw"))

    assert sweep(scenario, check) > 0


def _semaphore_net(
    r: redis.Redis, key: str, make: Callable[[], Any], take: Callable[[Any], Hold]
) -> None:
    guards: list[Hold] = []

    def scenario() -> Callable[[], None]:
        sem = make()
        guards.clear()

        def body() -> None:
            with sem as g:  # ``with`` entry and exit
                guards.append(g)
            g2 = take(sem)  # a guard of two permits, released through itself
            guards.append(g2)
            g2.release()

        return body

    def available() -> int:
        return int(r.execute_command("RSEM.AVAILABLE", key))

    def check() -> None:
        believed = [g for g in guards if not g.done and not g.is_lost()]
        held = sum(g.permits for g in believed)
        # the guards the caller still has are held; every other permit comes back
        poll(
            f"{PERMITS - held} permits available ({held} believed held)",
            3.0,
            lambda: available() == PERMITS - held,
        )
        for g in believed:
            g.release()
        poll("every permit back", 3.0, lambda: available() == PERMITS)

    r.execute_command("RSEM.SETPERMITS", key, PERMITS)
    assert sweep(scenario, check) > 0


def test_counted_semaphore_interrupted_anywhere_conserves_permits(r: redis.Redis) -> None:
    _semaphore_net(
        r,
        "ki:sem",
        lambda: rl.Semaphore(r, "ki:sem", response_timeout=0.5),
        lambda sem: sem.permits(2),
    )


def test_leased_semaphore_interrupted_anywhere_conserves_permits(r: redis.Redis) -> None:
    _semaphore_net(
        r,
        "ki:leased",
        lambda: rl.LeasedSemaphore(r, "ki:leased", response_timeout=0.5),
        lambda sem: sem.acquire(2),
    )


@pytest.mark.parametrize(
    "kind, take",
    [
        ("counted", lambda sem: sem.permits(2)),
        ("counted", lambda sem: sem.acquire(2) and None),
        ("leased", lambda sem: sem.acquire(2)),
    ],
    ids=["counted-permits", "counted-acquire", "leased-acquire"],
)
def test_semaphore_call_interrupted_at_any_bytecode_of_its_own_frames_gives_permits_back(
    r: redis.Redis, kind: str, take: Callable[[Any], Optional[Hold]]
) -> None:
    """A KeyboardInterrupt at every bytecode of the semaphore's own frames (between the
    engine's grant and the return to the caller, too): a call that raised leaves every
    permit available; one that returned a guard holds exactly its permits."""
    key = f"ki:op:{kind}"
    r.execute_command("RSEM.SETPERMITS", key, PERMITS)
    got: list[Optional[Hold]] = []

    def scenario() -> Callable[[], None]:
        cls = rl.Semaphore if kind == "counted" else rl.LeasedSemaphore
        sem = cls(r, key, response_timeout=0.5)
        got.clear()
        return lambda: got.append(take(sem))

    def check() -> None:
        guard = got[0] if got else None
        held = 2 if got and (guard is None or not guard.done) else 0
        poll(
            f"{PERMITS - held} permits available",
            3.0,
            lambda: int(r.execute_command("RSEM.AVAILABLE", key)) == PERMITS - held,
        )
        if guard is not None:
            guard.release()
        elif got:
            r.execute_command("RSEM.RELEASE", key, 2)  # ``acquire``'s permits have no guard
        poll(
            "every permit back",
            3.0,
            lambda: int(r.execute_command("RSEM.AVAILABLE", key)) == PERMITS,
        )

    def run(k: int, body: Callable[[], None]) -> Optional[str]:
        return run_interrupted_at_opcode(k, body, "semaphore.py")

    assert sweep(scenario, check, run) > 20


@pytest.mark.parametrize(
    "module, functions",
    [("semaphore.py", frozenset()), ("_sync.py", frozenset({"counted_release"}))],
    ids=["semaphore", "engine"],
)
def test_semaphore_release_interrupted_at_any_bytecode_gives_the_permits_back(
    r: redis.Redis, module: str, functions: frozenset[str]
) -> None:
    """``Semaphore.release(n)`` (an ownerless release, ``ONCE id``) interrupted at every
    bytecode of its own frame and of the engine's ``counted_release``: it either returned, or
    raised and goes on in the background (as its docstring tells the caller, who must not
    release again), so every permit comes back, once."""
    key = f"ki:release:{module}"
    r.execute_command("RSEM.SETPERMITS", key, PERMITS)

    def scenario() -> Callable[[], None]:
        sem = rl.Semaphore(r, key, response_timeout=0.5)
        sem.acquire(2)
        return lambda: sem.release(2) and None

    def check() -> None:
        poll(
            f"every permit back ({PERMITS})",
            3.0,
            lambda: int(r.execute_command("RSEM.AVAILABLE", key)) == PERMITS,
        )
        # none twice: still all of them a moment later (a late background resend would add)
        time.sleep(0.05)
        assert int(r.execute_command("RSEM.AVAILABLE", key)) == PERMITS

    def run(k: int, body: Callable[[], None]) -> Optional[str]:
        return run_interrupted_at_opcode(k, body, module, functions)

    assert sweep(scenario, check, run) > 5


def test_acquires_granted_by_their_try_while_the_line_is_full_interrupted_anywhere(
    server: Server, r: redis.Redis
) -> None:
    """The line of waits full (a pool of one connection; its wait blocked on a lock held
    throughout): a free lock's ``with`` and a guard of two free permits are granted by their
    try (the acquire without ``WAIT``). A KeyboardInterrupt at every line of the package: what
    the caller believes held is held, nothing else stays held, and the line keeps no place,
    slot or try of an interrupted acquire."""
    capped = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=1)
    )
    blocker = rl.Lock(r, "ki:blocker")
    assert blocker.acquire(timeout=0)

    def block() -> None:
        lk = rl.Lock(capped, "ki:blocker", response_timeout=0.5)
        if lk.acquire(timeout=120):
            lk.release()

    t = threading.Thread(target=block, daemon=True)
    t.start()
    be = rl._sync.backend_for(capped, 0.5)
    poll("the line full", 5.0, lambda: be._waits[""][1].busy == 1)
    gate = be._waits[""][1]
    r.execute_command("RSEM.SETPERMITS", "ki:tsem", PERMITS)
    cur: list[Any] = []
    guards: list[Hold] = []

    def scenario() -> Callable[[], None]:
        lk = rl.Lock(capped, "ki:tried", response_timeout=0.5)
        sem = rl.Semaphore(capped, "ki:tsem", response_timeout=0.5)
        cur[:] = [lk]
        guards.clear()

        def body() -> None:
            with lk:
                pass
            g = sem.permits(2)
            assert g is not None
            guards.append(g)
            g.release()

        return body

    def available() -> int:
        return int(r.execute_command("RSEM.AVAILABLE", "ki:tsem"))

    def check() -> None:
        lk = cur[0]
        if lk.owned():
            assert r.execute_command("RLOCK.PTTL", "ki:tried") > 0
            while lk.owned():
                lk.release()
        poll("the lock free after an interrupted run", 3.0, _free(r, "ki:tried"))
        held = sum(g.permits for g in guards if not g.done and not g.is_lost())
        poll(f"{PERMITS - held} permits available", 3.0, lambda: available() == PERMITS - held)
        for g in guards:
            if not g.done and not g.is_lost():
                g.release()
        poll("every permit back", 3.0, lambda: available() == PERMITS)
        assert gate.busy == 1 and not gate._queue and not gate._trying, "the line kept a place"

    try:
        assert sweep(scenario, check) > 20
    finally:
        blocker.release()
        t.join(10)
        capped.close()
    assert not t.is_alive()


#: Where the library's calls take locks that the engine's background threads (the watchdog,
#: the releaser, a session's watcher) may take too: the standard library's threading and
#: queue, and redis-py's connection pools, besides the package's own code.
SHARED_CODE = (PKG, threading.__file__, queue.__file__, redis.connection.__file__)
#: After these opcodes a signal handler may run (CPython looks for signals at a function's
#: start, after calls and at backward jumps); None: the frame's first opcode.
_SIGNAL_AFTER = frozenset({None, "CALL", "CALL_FUNCTION_EX", "JUMP_BACKWARD"})


def run_interrupted_at_signal_point(k: int, body: Callable[[], None]) -> Optional[str]:
    """Runs ``body``, raising KeyboardInterrupt (once) at the ``k``-th moment of this thread in
    :data:`SHARED_CODE` at which a real signal's handler may run: the start of a function, right
    after a call (a lock just taken by ``acquire`` or a ``with``'s ``__enter__`` written in
    Python, as ``threading.Condition``'s is), a backward jump. Returns where it fired (None: the
    body ended first)."""
    seen = [0]
    fired: list[str] = []
    last: dict[int, Optional[str]] = {}

    def local(frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if event != "opcode" or fired:
            return local
        op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
        prev = last.get(id(frame))
        last[id(frame)] = op
        if prev in _SIGNAL_AFTER and op != "CACHE":
            seen[0] += 1
            if seen[0] == k:
                code = frame.f_code
                where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"
                fired.append(f"{where} after {prev or 'its start'}")
                raise KeyboardInterrupt
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if fired or not frame.f_code.co_filename.startswith(SHARED_CODE):
            return None
        last[id(frame)] = None
        frame.f_trace_opcodes = True
        return local

    sys.settrace(global_)
    try:
        body()
    except KeyboardInterrupt:
        assert fired, "a KeyboardInterrupt the test did not raise"
    finally:
        sys.settrace(None)
    return fired[0] if fired else None


class Blocked(BaseException):
    """A call of the test's thread that blocked for good (raised by :func:`bounded`'s alarm;
    a BaseException, so that no ``except Exception`` of the package takes it for an error)."""


def bounded(seconds: float, run: Callable[[int, Callable[[], None]], Optional[str]]) -> Any:
    """``run`` (a sweep's runner), failing with :class:`Blocked` when one run takes longer
    than ``seconds``: a SIGALRM's handler raises in the test's thread wherever it waits (a
    lock acquire too), so a lock left held fails the test instead of hanging it."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise Blocked(f"a run blocked for more than {seconds} s (a lock left held)")

    def bounded_run(k: int, body: Callable[[], None]) -> Optional[str]:
        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return run(k, body)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)

    return bounded_run


def _within(seconds: float, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` on another thread, which must end within ``seconds`` (a library call that
    blocks for good fails the test instead of hanging it); returns its result."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{what}: still blocked after {seconds} s (a lock left held)"
    assert out, f"{what}: raised (see the thread's traceback above)"
    return out[0]


def test_interrupts_in_locks_shared_with_background_threads_keep_them_going(
    server: Server,
) -> None:
    """A KeyboardInterrupt at every moment a signal may land while the caller's thread runs
    the library's calls that meet its background threads: a hold's and a session's close
    signals, an acquire and a release (pools, the watchdog's schedule), a try of a lock held,
    the hand-over of a cancel to the releaser, and the wait for it. Meanwhile the
    watchdog renews a hold every 0.1 s. Every few runs, from other threads (bounded, so a
    lock left held fails the test rather than hang it): the hold is still renewed (its
    deadline moves on, the server agrees), the releaser still sends, waits are still served,
    a hold's loss signal can still be waited on, a session's watcher still sees its connection
    closed; after every run nothing the caller does not believe held stays held."""
    from redis_rlock import _proto as P

    r = server.client()
    held = rl.Lock(r, "ki:bg:held", watchdog_timeout=0.3, response_timeout=0.5)
    assert held.acquire()
    hold = held.hold
    assert hold is not None
    be = held._be
    lk = rl.Lock(r, "ki:bg:lock", response_timeout=0.5)
    sessions = [rl.Session(r, keepalive=0.2, response_timeout=0.5)]
    spec = P.Spec(kind=P.LOCK, key=b"ki:bg:gone", owner=b"nobody", lease_ms=1000)

    def scenario() -> Callable[[], None]:
        s = sessions[-1]
        other = rl.Lock(r, "ki:bg:held", response_timeout=0.5)

        def body() -> None:
            hold.lost.wait(0.001)  # set by the watchdog
            s.closed.wait(0.001)  # set by the session's watcher
            if lk.acquire(blocking=False):  # the pools, the watchdog's schedule, the release
                lk.release()
            assert not other.acquire(blocking=False)  # a lock held: not granted
            assert not other.acquire(timeout=0.02)  # a wait: the line's gate, the server
            be.cancel(spec, P.new_id(), time.monotonic())  # handed to the releaser, waited for

        return body

    runs = [0]

    def check() -> None:
        while lk.owned():
            lk.release()
        poll("the with block's lock free", 3.0, _free(r, "ki:bg:lock"))
        runs[0] += 1
        if runs[0] % 40:
            return
        # from other threads: the library still works where its threads meet the caller's
        before = hold.deadline
        poll("the watchdog renewing the hold", 3.0, lambda: hold.deadline > before + 0.05)
        assert not hold.is_lost() and r.execute_command("RLOCK.PTTL", "ki:bg:held") > 0
        job = _within(
            3.0,
            "a job handed to the releaser",
            lambda: be.releaser.submit(
                b"ki:bg:gone", P.cancel_args(b"ki:bg:gone", P.new_id()), 1.0
            ),
        )
        assert _within(3.0, "the releaser sending a job", lambda: job.wait(2.0))
        assert not _within(
            3.0,
            "a wait for the held lock",
            lambda: rl.Lock(r, "ki:bg:held", response_timeout=0.5).acquire(timeout=0.05),
        )
        assert not _within(3.0, "a wait on a hold's loss", lambda: hold.lost.wait(0.01))
        s = sessions[-1]
        assert s.client_id is not None
        r.client_kill_filter(_id=str(s.client_id))
        _within(3.0, "the session's watcher seeing it closed", lambda: s.closed.wait(2.0))
        assert s.closed.is_set()
        sessions.append(rl.Session(r, keepalive=0.2, response_timeout=0.5))

    try:
        fired: list[Optional[str]] = []

        def run(k: int, body: Callable[[], None]) -> Optional[str]:
            fired.append(run_interrupted_at_signal_point(k, body))
            return fired[-1]

        try:
            n = sweep(scenario, check, bounded(10.0, run))
        except Blocked as e:
            raise AssertionError(f"{e}; the last interrupts: {fired[-5:]}") from None
        runs[0] = 39
        check()  # the last runs too
        print(f"{n} interrupted runs")
        assert n > 100
    finally:
        for s in sessions:  # (on threads of their own: a close may block where the test failed)
            threading.Thread(target=s.close, daemon=True).start()


@pytest.mark.skipif(
    not os.environ.get("RLOCK_PY_SIGNAL_NET"),
    reason="set RLOCK_PY_SIGNAL_NET=1: a real signal can land inside redis-py's pool lock",
)
def test_a_real_signal_at_random_moments_loses_no_permit(server: Server) -> None:
    """SIGALRM at random moments while the main thread takes and gives back permits: the
    handler raises KeyboardInterrupt wherever the thread is; afterwards every permit the
    thread does not believe it holds comes back.

    Opt-in: about one run in ten (under load) the signal lands between redis-py's pool
    ``with self._lock:`` acquiring its lock and entering the block (CPython's ``with`` is not
    signal-safe there, bpo-29988): the main thread keeps the pool's RLock for good, and the
    background sender, on the same pool, never sends the cleanup it was given."""
    import random
    import signal
    import time

    r = server.client()
    r.execute_command("RSEM.SETPERMITS", "ki:alarm", PERMITS)
    sem = rl.Semaphore(r, "ki:alarm", response_timeout=0.5)
    rng = random.Random()
    guards: list[Hold] = []

    def on_alarm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, on_alarm)
    interrupts = 0
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, 0.003))
            # bounded: an interrupt landing in a ``__del__`` or a weakref callback (a collection
            # on this thread) is printed and dropped by the interpreter, never raised here
            round_end = time.monotonic() + 0.1
            try:
                while time.monotonic() < round_end:
                    with sem as g:
                        guards.append(g)
            except KeyboardInterrupt:
                interrupts += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert interrupts > 10
    believed = [g for g in guards if not g.done]
    held = sum(g.permits for g in believed)
    poll(
        f"{PERMITS - held} permits available after {interrupts} interrupts",
        5.0,
        lambda: int(r.execute_command("RSEM.AVAILABLE", "ki:alarm")) == PERMITS - held,
    )


# -- asyncio: a cancellation at every await ------------------------------------------------


async def cancelled_after(k: int, body: Callable[[], Any]) -> bool:
    """Runs ``body()`` as a task and cancels it after ``k`` turns of the event loop (wherever
    it waits then). Returns whether it was cancelled before the body ended (a cancellation
    that lands as a reply arrives may be absorbed by ``asyncio.wait_for`` in Python 3.11: the
    body then goes on, holding what it got, which the checks allow)."""
    import asyncio

    task = asyncio.ensure_future(body())
    loop = asyncio.get_running_loop()
    turns = [0]
    asked: list[bool] = []

    def tick() -> None:
        turns[0] += 1
        if task.done():
            return
        if turns[0] >= k:
            asked.append(True)
            task.cancel()
        else:
            loop.call_soon(tick)

    loop.call_soon(tick)
    try:
        await task
    except asyncio.CancelledError:
        pass
    return bool(asked)


async def _async_sweep(body: Callable[[], Any], check: Callable[[], Any]) -> int:
    k = 0
    while True:
        k += 1
        cancelled = await cancelled_after(k, body)
        try:
            await check()
        except AssertionError as e:
            raise AssertionError(f"cancelled after {k} loop turns: {e}") from None
        if not cancelled:
            assert k > 5, f"only {k - 1} loop turns: the net caught nothing"
            return k - 1


async def test_async_with_blocks_cancelled_at_every_await_leave_nothing_held(
    server: Server,
) -> None:
    import redis.asyncio as aredis
    from _servers import apoll

    import redis_rlock.aio as ra

    ar = aredis.Redis(port=server.port)
    await ar.execute_command("RSEM.SETPERMITS", "kc:sem", PERMITS)
    await ar.execute_command("RSEM.SETPERMITS", "kc:leased", PERMITS)
    objs: dict[str, Any] = {}
    guards: list[Any] = []

    async def body() -> None:
        lk = objs["lock"] = ra.Lock(ar, "kc:lock", response_timeout=0.5)
        rw = objs["rw"] = ra.RWLock(ar, "kc:rw", response_timeout=0.5)
        sem = ra.Semaphore(ar, "kc:sem", response_timeout=0.5)
        ls = ra.LeasedSemaphore(ar, "kc:leased", response_timeout=0.5)
        async with lk, lk:
            pass
        async with rw.write, rw.read:
            pass
        async with sem as g:
            guards.append(g)
        async with ls as g2:
            guards.append(g2)
        g3 = await sem.permits(2)
        guards.append(g3)
        await g3.release()

    async def free(key: str) -> bool:
        return bool(await ar.execute_command("RLOCK.PTTL", key) == -2)

    async def check() -> None:
        # a cancelled task's holds went with it (its context): nothing is believed held
        assert not [g for g in guards if not g.done and not g.is_lost()]
        await apoll("the lock free", 3.0, lambda: free("kc:lock"))
        await apoll("the read-write lock free", 3.0, lambda: free("kc:rw"))
        for key in ("kc:sem", "kc:leased"):
            await apoll(
                f"every permit of {key} back",
                3.0,
                lambda key=key: _available(ar, key),  # type: ignore[misc]
            )
        guards.clear()

    async def _available(c: Any, key: str) -> bool:
        return bool(int(await c.execute_command("RSEM.AVAILABLE", key)) == PERMITS)

    try:
        n = await _async_sweep(body, check)
        print(f"{n} cancelled runs")
        assert n > 20
    finally:
        await ar.aclose()


async def test_async_acquires_granted_by_their_try_while_the_line_is_full_cancelled_anywhere(
    server: Server, r: redis.Redis
) -> None:
    """asyncio, the line of waits full (a pool of one connection; its wait blocked on a lock
    held throughout): a free lock's ``async with`` and a guard of two free permits, granted by
    their try, cancelled at every await: nothing believed held stays unheld or the other way
    round, and the line keeps no place, slot or try of a cancelled acquire."""
    import asyncio

    import redis.asyncio as aredis
    from _servers import apoll

    import redis_rlock.aio as ra
    from redis_rlock.aio import _engine

    capped = aredis.Redis(
        connection_pool=aredis.BlockingConnectionPool(port=server.port, max_connections=1)
    )
    blocker = rl.Lock(r, "kc:blocker")
    assert blocker.acquire(timeout=0)

    async def block() -> None:
        lk = ra.Lock(capped, "kc:blocker", response_timeout=0.5)
        if await lk.acquire(timeout=120):
            await lk.release()

    blocked = asyncio.ensure_future(block())
    be = _engine.backend_for(capped, 0.5)
    await apoll("the line full", 5.0, lambda: "" in be._waits and be._waits[""][1].busy == 1)
    gate = be._waits[""][1]
    r.execute_command("RSEM.SETPERMITS", "kc:tsem", PERMITS)
    guards: list[Any] = []
    locks: list[Any] = []

    async def body() -> None:
        lk = ra.Lock(capped, "kc:tried", response_timeout=0.5)
        sem = ra.Semaphore(capped, "kc:tsem", response_timeout=0.5)
        locks[:] = [lk]
        async with lk:
            pass
        g = await sem.permits(2)
        guards.append(g)
        await g.release()

    async def check() -> None:
        assert not [g for g in guards if not g.done and not g.is_lost()]
        await apoll("the lock free", 3.0, lambda: r.execute_command("RLOCK.PTTL", "kc:tried") == -2)
        await apoll(
            "every permit back",
            3.0,
            lambda: int(r.execute_command("RSEM.AVAILABLE", "kc:tsem")) == PERMITS,
        )
        assert gate.busy == 1 and not gate._queue and not gate._trying, "the line kept a place"
        guards.clear()

    try:
        assert await _async_sweep(body, check) > 20
    finally:
        blocker.release()
        await asyncio.wait_for(blocked, 10)
        await capped.aclose()


def test_work_handed_to_a_background_thread_while_interrupted_is_done(server: Server) -> None:
    """A KeyboardInterrupt at every moment a signal may land while a cleanup command is handed
    to the releaser and a hold to the watchdog of a client none of whose background threads
    runs yet (their start included: ``Thread.start`` waits on an ``Event``): whatever was
    handed over is done without any further call — the command is sent, the hold renewed."""

    r = server.client()
    state: dict[str, Any] = {}

    def scenario() -> Callable[[], None]:
        c = server.client()
        be = rl._sync.backend_for(c, 0.5)  # a fresh engine: no thread of its own yet
        n = len(state.setdefault("keys", []))
        key = f"ki:handed:{n}".encode()
        state["keys"].append(key)
        lk = rl.Lock(c, f"ki:watched:{n}", watchdog_timeout=0.3, response_timeout=0.5)
        assert lk.acquire(blocking=False)  # scheduled with the watchdog: its thread starts
        hold = lk.hold
        assert hold is not None
        state.update(be=be, key=key, client=c, lk=lk, hold=hold, until=hold.deadline)
        lk._be.watchdog._thread = None  # as after the thread's idle end
        be.releaser._thread = None

        def body() -> None:
            be.releaser.submit(key, ["SET", key, b"1"], 2.0)
            be.watchdog.schedule(hold)

        return body

    def check() -> None:
        be, key, hold = state["be"], state["key"], state["hold"]
        if not be.releaser._q.empty() or r.exists(key):  # handed over: it must be sent
            poll("the handed-over command sent", 3.0, lambda: r.exists(key) == 1)
        until = state["until"]
        poll("the hold renewed", 3.0, lambda: hold.deadline > until + 0.05)
        state["lk"].release()
        state["client"].close()

    n = sweep(scenario, check, run_interrupted_at_signal_point)
    assert n > 20


# -- a KeyboardInterrupt inside a release ------------------------------------------------------


def test_keyboard_interrupt_in_release_still_releases(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = rl.Lock(r, "kbi")
    assert lock.acquire()
    # the next command this thread sends raises before it is sent (an interrupt landing between
    # two bytecodes of the release); the watchdog's and releaser's threads send theirs
    raise_once_here(monkeypatch, _sync.SyncBackend, "call", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    # the release goes on in the background (same request id: never twice); nothing stays
    # held by nobody until the 30 s watchdog lease ends
    poll("the interrupted release to reach the server", 5, lambda: not r.exists("kbi"))


def test_keyboard_interrupt_in_a_semaphore_guard_release_gives_back(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = rl.Semaphore(r, "kbisem")
    sem.try_set_permits(2)
    hold = sem.permits(2)
    assert hold is not None and sem.available() == 0
    # the next command this thread sends raises before it is sent (an interrupt landing between
    # two bytecodes of the release); the watchdog's and releaser's threads send theirs
    raise_once_here(monkeypatch, _sync.SyncBackend, "call", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        hold.release()
    poll("the permits to come back", 5, lambda: sem.available() == 2)


# -- a real SIGINT in a wait -------------------------------------------------------------------


def test_keyboard_interrupt_in_a_wait_leaves_nothing(r: redis.Redis) -> None:
    holder = rl.Lock(r, "kbd")
    holder.acquire()
    lock = rl.Lock(r, "kbd")
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    assert not lock.owned()
    poll("the waiter gone", 5, lambda: info(r, "kbd")["waiters"] == 0)
    holder.release()
    assert not r.exists("kbd")  # not handed to the interrupted waiter
