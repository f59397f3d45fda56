"""Sentinel-discovered masters (sync and asyncio): the package's own connections follow the
master the Sentinels name."""

from __future__ import annotations

import redis.asyncio.sentinel as asentinel
from _servers import Server, info
from redis.sentinel import Sentinel

import redis_rlock as rl
import redis_rlock.aio as ra


def _sentinel_for(master: Server) -> Server:
    return Server(
        sentinel_conf=(
            f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
            "sentinel down-after-milliseconds mymaster 1000\n"
        )
    )


def test_sync_and_async_locks_on_a_sentinel_master(server: Server) -> None:
    sentinel = _sentinel_for(server)
    try:
        master = Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=5).master_for("mymaster")
        lock = rl.Lock(master, "sent", fencing=True)
        with lock:
            assert info(server.client(), "sent")["owner"] == lock.hold.owner
        assert not server.client().exists("sent")

        import asyncio

        async def run() -> None:
            amaster = asentinel.Sentinel([("127.0.0.1", sentinel.port)]).master_for("mymaster")
            alock = ra.Lock(amaster, "asent")
            async with alock:
                assert alock.owned() and server.client().exists("asent")
            await amaster.aclose()

        asyncio.run(run())
    finally:
        sentinel.close()
