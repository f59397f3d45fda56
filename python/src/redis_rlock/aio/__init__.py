"""The asyncio API of redis-rlock: the sync API's shape, with ``await`` and ``async with``,
on ``redis.asyncio.Redis`` / ``redis.asyncio.RedisCluster`` / Sentinel masters."""

from ..compat import AsyncRLockCompat
from ._hold import AsyncHold, AsyncLossSignal
from .latch import CountDownLatch
from .lock import Lock, RWLock
from .owner import Owner
from .semaphore import LeasedSemaphore, Semaphore
from .session import Session

__all__ = [
    "AsyncHold",
    "AsyncLossSignal",
    "AsyncRLockCompat",
    "CountDownLatch",
    "LeasedSemaphore",
    "Lock",
    "Owner",
    "RWLock",
    "Semaphore",
    "Session",
]
