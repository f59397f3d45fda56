"""Sessions (issue 27 §1): ``redis_rlock.Session`` / ``redis_rlock.aio.Session`` hold one
connection of their own whose locks are session holds (``SESSION [LOCKDELAY ms]``): the server
ends them when that connection closes (the process killed, the session closed, ``CLIENT
KILL``), and every hold taken through the session is marked lost at once.

A session is one connection, bound once: it is never silently made again. An interrupt or a
cancellation inside redis-py's read or send of a session command drops the connection, so the
session closes and refuses further acquires; a session closed by another thread while a grant
is recorded hands out no hold that says held; and every hold is lost by the time ``closed`` is
set. A session in a forked child is in ``test_fork.py``, over a Unix socket in
``test_connection_kinds.py``, under failovers in ``test_session_ha.py``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import PROMPT, Server, apoll, blocked_clients, poll, raise_once_here, session_holds

import redis_rlock as rl
import redis_rlock.aio as ra

CHILD = """
import sys, time, redis, redis_rlock
s = redis_rlock.Session(redis.Redis(port=int(sys.argv[1])))
assert s.lock("proc", lease=60).acquire()
print("HELD", flush=True)
time.sleep(600)
"""


def test_a_killed_process_frees_its_session_lock_and_a_waiter_is_served(
    server: Server, r: redis.Redis
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(server.port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "HELD"
        assert session_holds(r) == 1
        got: list[Any] = []
        waiter = rl.Lock(r, "proc", lease=60)
        t = threading.Thread(
            target=lambda: got.append((waiter.acquire(timeout=10), time.monotonic()))
        )
        t.start()
        poll("the waiter to block", 5, lambda: blocked_clients(r) == 1)
        killed = time.monotonic()
        child.kill()
        t.join(10)
        ok, at = got[0]
        assert ok and at - killed < PROMPT, at - killed
    finally:
        child.kill()
        child.wait()


def test_closing_the_session_ends_its_holds_and_marks_them_lost(r: redis.Redis) -> None:
    with rl.Session(r) as s:
        lk = s.lock("l", lease=60)
        assert lk.acquire()
        hold = lk.hold
        assert session_holds(r) == 1
    assert hold.is_lost(), "closed: lost at once"
    assert s.closed.is_set()
    poll("the end", 5, lambda: r.exists("l") == 0)
    with pytest.raises(rl.SessionClosed):
        lk.acquire(blocking=False)


def test_client_kill_marks_every_hold_lost_and_the_session_refuses_new_acquires(
    r: redis.Redis,
) -> None:
    rl.LeasedSemaphore(r, "s").try_set_permits(3)
    s = rl.Session(r)
    lk, rw, sem = s.lock("l"), s.rw_lock("rw", lease=60), s.leased_semaphore("s", lease=60)
    assert lk.acquire() and rw.read.acquire()
    permits = sem.acquire(2)
    assert permits is not None
    all_holds = [lk.hold, rw.read.hold, permits]
    assert session_holds(r) == 4
    assert s.client_id is not None
    r.execute_command("CLIENT", "KILL", "ID", s.client_id)
    assert s.closed.wait(PROMPT), "the session sees the close"
    for h in all_holds:
        assert h.lost.wait(PROMPT), h
    for attempt in (
        lambda: s.lock("l").acquire(blocking=False),
        lambda: rw.write.acquire(timeout=1),
        lambda: sem.acquire(1, blocking=False),
    ):
        with pytest.raises(rl.SessionClosed):
            attempt()
    poll("the ends", 5, lambda: r.exists("l", "rw") == 0 and session_holds(r) == 0)
    assert rl.LeasedSemaphore(r, "s").available() == 3
    with rl.Session(r) as again:
        assert again.lock("l").acquire(blocking=False)


def test_a_session_lock_reenters_and_its_release_ends_the_binding(r: redis.Redis) -> None:
    with rl.Session(r) as s:
        lk = s.lock("l", lease=60)
        assert lk.acquire() and lk.acquire(blocking=False)
        assert r.hgetall("l") == {lk.hold.owner: b"1"}
        assert session_holds(r) == 1
        lk.release()
        assert r.exists("l") == 1
        lk.release()
        assert r.exists("l") == 0 and session_holds(r) == 0
        assert not s.closed.is_set()


def test_write_side_is_a_session_hold(r: redis.Redis) -> None:
    s = rl.Session(r)
    rw = s.rw_lock("rw", lease=60)
    assert rw.write.acquire()
    hold = rw.write.hold
    assert session_holds(r) == 1
    s.close()
    assert hold.is_lost()
    poll("the end", 5, lambda: r.exists("rw") == 0)
    assert rl.RWLock(r, "rw").write.acquire(blocking=False)


def test_the_lock_delay_is_passed_through(r: redis.Redis) -> None:
    s = rl.Session(r, lock_delay=3)
    assert s.lock("l", lease=60).acquire()
    s.close()
    poll("the lock-delay", 5, lambda: r.hgetall("l") == {b"rlock:lockdelay": b"1"})
    assert int(r.info("rlock")["rlock_lock_delays"]) == 1
    assert not rl.Lock(r, "l").acquire(blocking=False)
    with pytest.raises(ValueError):
        rl.Session(r, lock_delay=61)


def test_a_lost_session_hold_s_release_leaves_the_next_holder_alone(r: redis.Redis) -> None:
    s = rl.Session(r)
    lk = s.lock("l", lease=60)
    assert lk.acquire()
    r.execute_command("CLIENT", "KILL", "ID", s.client_id)
    assert lk.hold.lost.wait(PROMPT)
    nxt = rl.Lock(r, "l", lease=60)
    assert nxt.acquire(timeout=5)
    with pytest.raises(rl.LockLost):
        lk.release()
    assert r.hgetall("l") == {nxt.hold.owner: b"1"}
    nxt.release()


async def test_async_a_cancelled_session_acquire_leaves_nothing_held(
    r: redis.Redis, ar: aredis.Redis
) -> None:
    other = ra.Lock(ar, "l", lease=60)
    assert await other.acquire()
    async with ra.Session(ar) as s:
        lk = s.lock("l", lease=60)
        task = asyncio.ensure_future(lk.acquire())
        await apoll("the session's acquire to block", 5, lambda: blocked_clients(r) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await apoll("the cancelled wait to leave", 5, lambda: blocked_clients(r) == 0)
        await other.release()
        assert r.exists("l") == 0 and session_holds(r) == 0
        assert await lk.acquire(timeout=2), "the session still works"
        assert session_holds(r) == 1
        await lk.release()


async def test_async_client_kill_marks_every_hold_lost(r: redis.Redis, ar: aredis.Redis) -> None:
    await ra.LeasedSemaphore(ar, "s").try_set_permits(2)
    s = ra.Session(ar)
    lk, sem = s.lock("l", lease=60), s.leased_semaphore("s", lease=60)
    assert await lk.acquire()
    permit = await sem.acquire(1)
    assert permit is not None
    hold = lk.hold
    assert session_holds(r) == 2
    r.execute_command("CLIENT", "KILL", "ID", s.client_id)
    assert await s.closed.wait(PROMPT)
    assert await hold.lost.wait(PROMPT) and await permit.lost.wait(PROMPT)
    with pytest.raises(rl.SessionClosed):
        await lk.acquire(blocking=False)
    await apoll("the holds to end", 5, lambda: not r.exists("l") and not session_holds(r))
    assert await ra.LeasedSemaphore(ar, "s").available() == 2
    await s.close()


def test_threads_taking_one_session_lock_in_turn_are_each_served_at_once(
    r: redis.Redis,
) -> None:
    # a grant is recorded with the session as soon as it came, never behind the session's
    # next acquire, which may be a wait for the very lock just granted (a wait that can then
    # only end with its timeout, an untimed one never)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # thread switches everywhere, as on a busy machine
    try:
        with rl.Session(r) as session:
            for _ in range(3):
                holder = session.lock("turns")
                assert holder.acquire()
                took: list[float] = []

                def take(took: list[float] = took) -> None:
                    lock = session.lock("turns")
                    assert lock.acquire(timeout=10)
                    took.append(time.monotonic())
                    lock.release()

                threads = [threading.Thread(target=take) for _ in range(3)]
                for t in threads:
                    t.start()
                poll("the first waiter's wait", PROMPT, lambda: blocked_clients(r) == 1)
                released = time.monotonic()
                holder.release()
                for t in threads:
                    t.join(15)
                assert len(took) == 3
                assert max(took) - released < PROMPT, [round(t - released, 2) for t in took]
    finally:
        sys.setswitchinterval(switch)


def test_a_timed_acquire_queued_behind_the_sessions_wait_ends_at_its_deadline(
    r: redis.Redis,
) -> None:
    busy = rl.Lock(r, "busy")
    assert busy.acquire()
    with rl.Session(r) as session:
        waiter = threading.Thread(target=session.lock("busy").acquire, daemon=True)
        waiter.start()  # holds the session's connection: an untimed wait
        poll("the session's wait", PROMPT, lambda: blocked_clients(r) == 1)
        took: list[Any] = []

        def timed() -> None:
            t0 = time.monotonic()
            took.append(session.lock("free").acquire(timeout=0.5))
            took.append(time.monotonic() - t0)

        behind = threading.Thread(target=timed, daemon=True)
        behind.start()
        behind.join(5)
        assert took and took[0] is False and took[1] < 0.5 + PROMPT, took
        assert not r.exists("free")
        busy.release()
        waiter.join(5)


async def test_async_a_timed_acquire_queued_behind_the_sessions_wait_ends_at_its_deadline(
    ar: aredis.Redis,
) -> None:
    busy = ra.Lock(ar, "busy")
    assert await busy.acquire()
    async with ra.Session(ar) as session:
        waiter = asyncio.ensure_future(session.lock("busy").acquire())
        await apoll("the session's wait", PROMPT, lambda: _blocked(ar))
        t0 = time.monotonic()
        got = await asyncio.wait_for(session.lock("free").acquire(timeout=0.5), 5)
        assert got is False and time.monotonic() - t0 < 0.5 + PROMPT
        assert not await ar.exists("free")
        await busy.release()
        assert await asyncio.wait_for(waiter, 5)


async def _blocked(ar: aredis.Redis) -> bool:
    return int((await ar.info("clients"))["blocked_clients"]) == 1


# -- an interrupt or a cancellation inside the session connection's read or send ---------------


def test_an_interrupt_while_reading_a_session_reply_closes_the_session(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing inside redis-py's read of a session reply makes redis-py drop the socket
    (it disconnects on any BaseException there): the server ends every hold of the session. The
    session must see it (holds lost, closed) and refuse further acquires, never reconnect."""
    s = rl.Session(r)
    first = s.lock("a", lease=60)
    assert first.acquire()
    hold = first.hold
    # Only this thread's read: the watcher's ping (it wakes on the acquire's reply) reads too.
    raise_once_here(monkeypatch, s._conn._parser, "read_response", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        s.lock("b", lease=60).acquire(blocking=False)
    poll("the server ends the session's hold", PROMPT, lambda: r.exists("a") == 0)
    assert hold.is_lost(), "the server ended it: the hold must say lost"
    assert s.closed.is_set()
    with pytest.raises(rl.SessionClosed):
        s.lock("c", lease=60).acquire(blocking=False)
    assert r.exists("b", "c") == 0 and session_holds(r) == 0
    s.close()


async def test_async_a_cancel_while_sending_on_a_session_closes_it(
    r: redis.Redis, ar: aredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled inside redis-py's send of a session command makes redis-py drop the
    connection: the session must close (its holds lost), never reconnect on the next acquire."""
    s = ra.Session(ar)
    first = s.lock("a", lease=60)
    assert await first.acquire()
    hold = first.hold
    # Only this task's send: the watcher task's ping sends too.
    raise_once_here(monkeypatch, s._conn._writer, "writelines", asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await s.lock("b", lease=60).acquire(blocking=False)
    await apoll("the server to end the hold", PROMPT, lambda: not r.exists("a"))
    assert hold.is_lost(), "the server ended it: the hold must say lost"
    with pytest.raises(rl.SessionClosed):
        await s.lock("c", lease=60).acquire(blocking=False)
    assert r.exists("b", "c") == 0 and session_holds(r) == 0
    await s.close()


# -- a session closed from another thread or by the server -------------------------------------


class _ClosesFirst(weakref.WeakSet):  # type: ignore[type-arg]
    """A session's hold set whose ``add`` lets another thread close the session first: the
    instant between the grant's check that the session is open and its record."""

    def __init__(self, session: rl.Session) -> None:
        super().__init__()
        self.session = session

    def add(self, item: Any) -> None:
        closer = threading.Thread(target=self.session.close)
        closer.start()
        closer.join(PROMPT)
        super().add(item)


def test_a_session_closed_by_another_thread_while_a_grant_is_recorded_loses_that_hold(
    r: redis.Redis,
) -> None:
    """``close()`` from another thread (a shutdown hook, a supervisor) while an acquire's grant
    is being recorded: the connection closes, so the server ends that hold. The acquire must
    not hand out a hold that says held (a guard the application would trust while another
    client takes the lock): it is lost, or the acquire raises ``SessionClosed``."""
    s = rl.Session(r)
    s._holds = _ClosesFirst(s)
    lk = s.lock("raced", lease=60)
    try:
        got = lk.acquire(blocking=False)
    except rl.SessionClosed:
        got = False
    assert s.closed.is_set()
    poll("the server ends the closed session's hold", PROMPT, lambda: r.exists("raced") == 0)
    if got:
        assert lk.hold is not None and lk.hold.is_lost(), "a hold the server ended says held"


def test_every_hold_of_a_session_is_lost_by_the_time_closed_is_set(r: redis.Redis) -> None:
    """``closed`` is documented as set once the session is closed, with every hold taken
    through it lost: a thread woken by ``closed.wait()`` (the server killed the connection,
    the watcher closed the session) must never find one of them still saying held."""
    for round_ in range(40):
        s = rl.Session(r)
        locks = [s.lock(f"a{round_}", lease=60), s.lock(f"b{round_}", lease=60)]
        assert all(lk.acquire(blocking=False) for lk in locks)
        holds = [lk.hold for lk in locks]
        seen: list[bool] = []

        def watch(s: rl.Session = s, holds: list[Any] = holds, seen: list[bool] = seen) -> None:
            s.closed.wait(PROMPT)
            seen.extend(h.is_lost() for h in holds)

        watcher = threading.Thread(target=watch)
        watcher.start()
        r.client_kill_filter(_id=s.client_id)
        watcher.join(PROMPT)
        assert seen == [True, True], f"round {round_}: closed is set, a hold says held"
        s.close()
