"""A server stopped (``SIGSTOP``) under an acquire or a wait, past the call's deadline: the
caller is answered by its deadline plus the response timeout, and the grant the server makes once
it resumes, after the caller gave up, is given back (sync and asyncio): nothing is left held by
nobody, and the given-up call's cancel is answered."""

from __future__ import annotations

import threading
import time

import redis
import redis.asyncio as aredis
from _servers import Server, apoll, info, poll

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.5  # the package's response timeout in these tests


def _no_grant_left(r: redis.Redis, name: str, holder_owner: bytes | None) -> bool:
    i = info(r, name)
    if holder_owner is None:
        return not i
    return i.get("owner") == holder_owner and i.get("waiters") == 0


def test_an_acquire_read_by_a_server_resuming_after_its_deadline_holds_nothing(
    r: redis.Redis, paused: Server
) -> None:
    lock = rl.Lock(r, "stall", response_timeout=RT, lease=20)
    lock._be.call(b"stall", ["PING"])  # a connection ready before the stall
    paused.pause()
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.3) is False  # the acquire sits in the stopped server
    assert time.monotonic() - t0 < 0.3 + RT + 2 * RT + 1
    paused.resume()
    # the server runs the acquire (a grant), then the cancel: nothing stays held
    poll("the late grant given back", 10, lambda: _no_grant_left(r, "stall", None))
    assert not lock.owned()


def test_a_waiter_whose_server_stalls_past_its_deadline_holds_nothing(
    r: redis.Redis, paused: Server
) -> None:
    holder = rl.Lock(r, "stall2", lease=0.6)
    holder.acquire()
    lock = rl.Lock(r, "stall2", response_timeout=RT)
    res: list[bool] = []
    t = threading.Thread(target=lambda: res.append(lock.acquire(timeout=0.3)))
    t.start()
    poll("queued", 5, lambda: info(r, "stall2")["waiters"] == 1)
    paused.pause()  # the holder's lease ends during the stall: a hand-off on resume
    t.join(10)
    assert res == [False]
    time.sleep(0.7)  # the subject: the stall outlasting the holder's lease
    paused.resume()
    poll("nobody holds it", 10, lambda: _no_grant_left(r, "stall2", None))
    # its cancel answered (not left retrying against this test's server after it stops)
    assert lock._be.releaser.flush(10)


async def test_async_acquire_read_by_a_resuming_server_holds_nothing(
    server: Server, paused: Server
) -> None:
    ar = aredis.Redis(port=server.port)
    r = server.client()
    lock = ra.Lock(ar, "astall", response_timeout=RT, lease=20)
    await lock._be.call(b"astall", ["PING"])
    paused.pause()
    assert await lock.acquire(timeout=0.3) is False
    paused.resume()
    # the cancel goes on in a background task of this loop: poll without blocking it
    await apoll("the late grant given back", 10, lambda: _no_grant_left(r, "astall", None))
    await ar.aclose()
