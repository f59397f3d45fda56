"""Hostile tests of issue 27's Python sessions and owners, third round: the package used as a
user would, over a Unix-socket server, and a session closed from another thread while one of
its acquires is being granted."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import PROMPT, Server, apoll, poll, session_holds

import redis_rlock as rl
import redis_rlock.aio as ra


@pytest.fixture
def unix_server() -> Iterator[tuple[Server, str]]:
    """A server listening on a Unix socket too (a short path: sun_path holds ~100 bytes)."""
    where = tempfile.mkdtemp(prefix="rl-", dir="/tmp")
    path = os.path.join(where, "r.sock")
    s = Server("--unixsocket", path, "--unixsocketperm", "700")
    yield s, path
    s.close()
    shutil.rmtree(where, ignore_errors=True)


def test_locks_owners_and_sessions_work_over_a_unix_socket(
    unix_server: tuple[Server, str],
) -> None:
    """A client of a Unix-socket server (``redis.Redis(unix_socket_path=...)``): every lock,
    owner and session must work on it as on TCP; a session's holds are bound to its Unix
    connection and end when it is killed."""
    server, path = unix_server
    admin = server.client()
    r = redis.Redis(unix_socket_path=path, socket_timeout=10)
    assert rl.Lock(r, "plain", lease=60).acquire(blocking=False)
    owner = rl.Owner(r)
    assert owner.lock("owned", lease=60).acquire(blocking=False)
    assert admin.hexists("owned", owner.id)
    with rl.Session(r) as s:
        held = s.lock("bound", lease=60)
        assert held.acquire(blocking=False)
        assert session_holds(admin) == 1
        assert s.client_id is not None
        admin.client_kill_filter(_id=s.client_id)
        poll("the killed session's hold ends", PROMPT, lambda: admin.exists("bound") == 0)
        poll("the hold is marked lost", PROMPT, lambda: held.hold is None or held.hold.is_lost())
        assert s.closed.is_set()
    r.close()


async def test_async_locks_owners_and_sessions_work_over_a_unix_socket(
    unix_server: tuple[Server, str],
) -> None:
    """The asyncio package over a Unix socket, as the sync one."""
    server, path = unix_server
    admin = server.client()
    ar = aredis.Redis(unix_socket_path=path, socket_timeout=10)
    assert await ra.Lock(ar, "plain", lease=60).acquire(blocking=False)
    owner = ra.Owner(ar)
    assert await owner.lock("owned", lease=60).acquire(blocking=False)
    assert admin.hexists("owned", owner.id)
    async with ra.Session(ar) as s:
        held = s.lock("bound", lease=60)
        assert await held.acquire(blocking=False)
        assert session_holds(admin) == 1
        admin.client_kill_filter(_id=s.client_id)
        await apoll("the killed session's hold ends", PROMPT, lambda: admin.exists("bound") == 0)
        await apoll(
            "the hold is marked lost", PROMPT, lambda: held.hold is None or held.hold.is_lost()
        )
    await ar.aclose()


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
