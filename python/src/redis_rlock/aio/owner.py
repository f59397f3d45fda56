"""asyncio owners: :class:`redis_rlock.Owner`'s shape on ``redis.asyncio`` clients."""

from __future__ import annotations

from typing import Any

from .._handles import OwnerHandles
from ._engine import backend_for
from .lock import Lock, RWLock


class Owner(OwnerHandles[Lock, RWLock]):
    """One owner id for one unit of work (a task, a request handler) on a
    ``redis.asyncio.Redis`` / ``RedisCluster`` client: :meth:`lock` and :meth:`rw_lock` hold
    every lock under exactly :attr:`id`, so the server refuses a wait that would close a cycle
    of owners (:class:`~redis_rlock.Deadlock`). As :class:`redis_rlock.Owner`: holds of one
    owner are one party (lock objects of one name re-enter each other's hold on the server),
    so an owner belongs to one task's unit of work at a time."""

    _lock_class = Lock
    _rw_lock_class = RWLock

    def __init__(self, client: Any, *, response_timeout: float = 2.0) -> None:
        super().__init__(client, response_timeout, backend_for(client, response_timeout).new_owner)

    def __repr__(self) -> str:
        return f"<redis_rlock.aio.Owner {self.id!r}>"
