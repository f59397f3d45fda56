"""Every kind of lock, owner and session on every kind of redis-py connection: RESP3 and
``decode_responses`` clients, and a server reached over a Unix socket, where a session's holds
are bound to its Unix connection and end when it is killed (sync and asyncio)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _servers import PROMPT, Server, apoll, poll, session_holds

import redis_rlock as rl
import redis_rlock.aio as ra

# -- RESP3 and decoded clients -----------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"protocol": 3}, {"protocol": 3, "decode_responses": True}])
def test_every_kind_on_resp3_and_decoded_clients(server: Server, kw: dict[str, Any]) -> None:
    c = server.client(**kw)
    lock = rl.Lock(c, "r3", fencing=True)
    with lock:
        assert lock.locked() and lock.owned() and lock.token is not None
        assert lock.acquire(timeout=1)  # re-entry
        lock.release()
    rw = rl.RWLock(c, "r3rw", fencing=True)
    with rw.write:
        assert rw.write.token is not None
    sem = rl.Semaphore(c, "r3s")
    sem.try_set_permits(2)
    with sem:
        assert sem.available() == 1
    leased = rl.LeasedSemaphore(c, "r3l", lease=5)
    leased.try_set_permits(1)
    hold = leased.acquire(1)
    assert hold is not None and len(hold.ids) == 1
    hold.release()
    compat = c.lock("r3c", timeout=5, lock_class=rl.RLockCompat)
    assert compat.acquire() and compat.owned() and compat.locked()
    compat.release()
    assert not server.client().exists("r3", "r3rw", "r3c")


async def test_async_every_kind_on_resp3(server: Server) -> None:
    c = aredis.Redis(port=server.port, protocol=3, decode_responses=True)
    lock = ra.Lock(c, "ar3", fencing=True)
    async with lock:
        assert await lock.locked() and lock.token is not None
    sem = ra.LeasedSemaphore(c, "ar3l", lease=5)
    await sem.try_set_permits(1)
    hold = await sem.acquire(1)
    assert hold is not None and len(hold.ids) == 1
    await hold.release()
    assert await sem.available() == 1
    await c.aclose()


# -- a Unix socket -----------------------------------------------------------------------------


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
