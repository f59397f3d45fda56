"""A lock's release whose reply was lost is sent again in the background, but never after the
server forgot its id (10 s): sent then, it would end a later hold of the same owner. It is given
up on ``P.RELEASE_RESEND_S`` after its first send; the lease ends a hold whose release never
arrived."""

from __future__ import annotations

import asyncio
import threading

import redis
import redis.asyncio as aredis
from _proxy import Proxy
from _servers import Server, apoll, poll

import redis_rlock as rl
import redis_rlock.aio as ra

RT = 0.5


def test_a_release_whose_reply_was_lost_is_never_sent_after_the_server_forgot_its_id(
    server: Server, r: redis.Redis
) -> None:
    """A lock release executed with its reply lost, then a network cut past the 10 s the
    server remembers the release's id: the owner takes the lock again (here through another
    connection), the network heals, and the release sent on in the background must not end
    that later hold. It is given up on ``P.RELEASE_RESEND_S`` after its first send (the lease
    ends a hold whose release never arrived)."""
    p = Proxy(server.port)
    c = redis.Redis(port=p.port)
    key = "dr:forgotten"
    try:
        lock = rl.Lock(c, key, lease=60, response_timeout=RT)
        assert lock.acquire()
        (owner,) = r.hkeys(key)
        conns = p.hold()

        def lose_the_reply() -> None:
            poll("the release sent", 5.0, lambda: any(p.held_from_client(i) for i in conns))
            (sent,) = [i for i in conns if p.held_from_client(i)]
            p.release_to_server(sent)  # executed; its reply held back, then dropped by the cut
            poll("the release executed", 5.0, lambda: not r.exists(key))
            p.cut()

        cutter = threading.Thread(target=lose_the_reply, daemon=True)
        cutter.start()
        lock.release()  # unanswered: goes on in the background
        cutter.join(10.0)
        assert not cutter.is_alive() and not r.exists(key)
        # the server forgets the release's id (its latch expires)
        poll("the release's id forgotten", 15.0, lambda: not r.keys("redisson_unlock_latch:*"))
        assert r.execute_command("RLOCK.ACQUIRE", key, owner, 60_000) is None
        p.heal()
        assert rl.flush_all(15.0), "the background release never ended"
        assert r.hget(key, owner) == b"1", "a stale release ended the owner's later hold"
    finally:
        c.close()
        p.close()


async def test_an_async_release_whose_reply_was_lost_is_never_sent_after_the_server_forgot_its_id(
    server: Server, r: redis.Redis
) -> None:
    """As the sync test above, for the asyncio engine."""
    p = Proxy(server.port)
    c = aredis.Redis(port=p.port)
    key = "dr:aforgotten"
    try:
        lock = ra.Lock(c, key, lease=60, response_timeout=RT)
        assert await lock.acquire()
        (owner,) = r.hkeys(key)
        conns = p.hold()

        def lose_the_reply() -> None:
            poll("the release sent", 5.0, lambda: any(p.held_from_client(i) for i in conns))
            (sent,) = [i for i in conns if p.held_from_client(i)]
            p.release_to_server(sent)
            poll("the release executed", 5.0, lambda: not r.exists(key))
            p.cut()

        cutter = threading.Thread(target=lose_the_reply, daemon=True)
        cutter.start()
        await lock.release()  # unanswered: goes on in the background
        await asyncio.to_thread(cutter.join, 10.0)
        assert not cutter.is_alive() and not r.exists(key)
        await apoll(
            "the release's id forgotten", 15.0, lambda: not r.keys("redisson_unlock_latch:*")
        )
        assert r.execute_command("RLOCK.ACQUIRE", key, owner, 60_000) is None
        p.heal()
        assert await lock._be.flush(15.0), "the background release never ended"
        assert r.hget(key, owner) == b"1", "a stale release ended the owner's later hold"
    finally:
        await c.aclose()
        p.close()
