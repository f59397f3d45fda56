"""asyncio owners: :class:`redis_rlock.Owner`'s shape on ``redis.asyncio`` clients."""

from __future__ import annotations

from typing import Any, Union

from ..owner import OwnerId
from ._engine import backend_for
from .lock import Lock, RWLock


class Owner:
    """One owner id for one unit of work (a task, a request handler) on a
    ``redis.asyncio.Redis`` / ``RedisCluster`` client: :meth:`lock` and :meth:`rw_lock` hold
    every lock under exactly :attr:`id`, so the server refuses a wait that would close a cycle
    of owners (:class:`~redis_rlock.Deadlock`). As :class:`redis_rlock.Owner`: holds of one
    owner are one party (lock objects of one name re-enter each other's hold on the server),
    so an owner belongs to one task's unit of work at a time."""

    def __init__(self, client: Any, *, response_timeout: float = 2.0) -> None:
        self._client = client
        self._rt = response_timeout
        self._id = OwnerId(backend_for(client, response_timeout).new_owner)

    @property
    def id(self) -> bytes:
        """The owner id the server stores every hold of this owner under."""
        return self._id.id

    def lock(self, name: Union[str, bytes], **options: Any) -> Lock:
        """A :class:`~redis_rlock.aio.Lock` held as this owner (``Lock``'s options)."""
        options.setdefault("response_timeout", self._rt)
        lk = Lock(self._client, name, **options)
        lk._owner_id = self._id
        return lk

    def rw_lock(self, name: Union[str, bytes], **options: Any) -> RWLock:
        """A :class:`~redis_rlock.aio.RWLock` whose sides are held as this owner."""
        options.setdefault("response_timeout", self._rt)
        rw = RWLock(self._client, name, **options)
        rw.read._owner_id = rw.write._owner_id = self._id
        return rw

    def __repr__(self) -> str:
        return f"<redis_rlock.aio.Owner {self.id!r}>"
