"""Redis Cluster (sync and asyncio RedisCluster) with braced names, spread over 3 masters."""

from __future__ import annotations

import pytest
import redis.asyncio.cluster as acluster
from _servers import Server
from redis.cluster import RedisCluster

import redis_rlock as rl
import redis_rlock.aio as ra

NAMES = [f"{{user:{i}}}:lock" for i in range(12)]


def test_sync_cluster_locks_semaphores_with_braced_names(cluster: list[Server]) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    slots = {rc.keyslot(n) for n in NAMES}
    nodes = {rc.get_node_from_key(n).name for n in NAMES}
    assert len(nodes) == 3 and len(slots) > 3
    for name in NAMES:
        lock = rl.Lock(rc, name, fencing=True)
        with lock:
            assert lock.token is not None and rc.exists(name)
            assert rl.Lock(rc, name).acquire(timeout=0.05) is False
        assert not rc.exists(name)
    rw = rl.RWLock(rc, "{cfg}:rw")
    with rw.write, rw.read:
        pass
    sem = rl.Semaphore(rc, "{pool}:sem")
    sem.try_set_permits(2)
    with sem:
        assert sem.available() == 1
    assert sem.available() == 2
    compat = rc.lock("{x}:compat", timeout=5, lock_class=rl.RLockCompat)
    assert compat.acquire() and compat.owned()
    compat.release()
    rc.close()


async def test_async_cluster_locks_with_braced_names(cluster: list[Server]) -> None:
    rc = acluster.RedisCluster(host="127.0.0.1", port=cluster[1].port)
    for name in NAMES[:6]:
        lock = ra.Lock(rc, name)
        async with lock:
            assert await lock.locked()
            assert lock.owned()
        assert not await rc.exists(name)
    ls = ra.LeasedSemaphore(rc, "{p}:leased")
    await ls.try_set_permits(1)
    async with ls as hold:
        assert len(hold.ids) == 1
    assert await ls.available() == 1
    await rc.aclose()


def test_odd_braces_are_refused_in_cluster_mode(cluster: list[Server]) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    with pytest.raises(rl.RLockError, match="hash tag"):
        rl.Lock(rc, "odd{name").acquire()
    rc.close()
