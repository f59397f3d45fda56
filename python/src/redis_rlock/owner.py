"""Owners: one owner id for one unit of work (a thread's job, a request handler), shared by
every lock it takes, as a Redisson thread's ``UUID:threadId`` is.

The server's wait-for graph follows owner ids. A plain :class:`~redis_rlock.Lock` gives every
hold an id of its own, so a cycle among plain locks has no common owner and is never refused
(the waits end with their timeouts). Locks made by an :class:`Owner` hold everything under its
one id: a wait that would close a cycle of owners is refused at once with
:class:`~redis_rlock.Deadlock`, nothing taken or queued.
"""

from __future__ import annotations

from typing import Any

from ._handles import OwnerHandles
from ._sync import backend_for
from .lock import Lock, RWLock


class Owner(OwnerHandles[Lock, RWLock]):
    """One owner id for one unit of work on a ``redis.Redis`` / ``RedisCluster`` client (a
    Sentinel master's included): :meth:`lock` and :meth:`rw_lock` (both sides) hold every lock
    under exactly :attr:`id`, as every lock of one Redisson thread is held under one id.

    Holds of one owner are one party: two lock objects of one name from one owner re-enter each
    other's hold on the server (each gives back its own count; a cancelled acquire exactly the
    count it got), and read-write sides follow Redisson's one-owner rules across all of them
    (write then read re-enters; read then write is refused as an upgrade). So an owner belongs
    to one thread's unit of work at a time: two threads sharing it would both get a lock the
    other holds. A hold known lost sends no release (as for every lock of this package); a hold
    lost unnoticed on the server (force-released, evicted) while the owner took the lock again
    through another object has its renewals and release act on that later hold, never on
    another owner's.
    """

    _lock_class = Lock
    _rw_lock_class = RWLock

    def __init__(self, client: Any, *, response_timeout: float = 2.0) -> None:
        super().__init__(client, response_timeout, backend_for(client, response_timeout).new_owner)

    def __repr__(self) -> str:
        return f"<redis_rlock.Owner {self.id!r}>"
