"""redis-rlock: fair, server-side-waiting locks, read-write locks, semaphores and count-down
latches for redis-py, on the rlock Redis module (``RLOCK.*``, ``RWLOCK.*``, ``RSEM.*``,
``RLATCH.*``; Redisson's data layouts).

Sync API here; the asyncio API of the same shape is :mod:`redis_rlock.aio`.
"""

from ._hold import Hold, LossSignal
from ._sync import flush_all
from .compat import RLockCompat
from .errors import (
    Deadlock,
    LockError,
    LockLost,
    LockNotOwnedError,
    LockPermissionError,
    LockTimeout,
    ModuleMissing,
    NoReplicas,
    NotHeld,
    RLockError,
    SessionClosed,
    UpgradeRefused,
    WrongType,
)
from .latch import CountDownLatch
from .lock import Lock, RWLock
from .owner import Owner
from .semaphore import LeasedSemaphore, Semaphore
from .session import Session

__version__ = "0.1.0"

__all__ = [
    "CountDownLatch",
    "Deadlock",
    "Hold",
    "LeasedSemaphore",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotOwnedError",
    "LockPermissionError",
    "LockTimeout",
    "LossSignal",
    "ModuleMissing",
    "NoReplicas",
    "NotHeld",
    "Owner",
    "RLockCompat",
    "RLockError",
    "RWLock",
    "Semaphore",
    "Session",
    "SessionClosed",
    "UpgradeRefused",
    "WrongType",
    "flush_all",
]
