"""Owners: one owner id for one unit of work (a thread's job, a request handler), shared by
every lock it takes, as a Redisson thread's ``UUID:threadId`` is.

The server's wait-for graph follows owner ids. A plain :class:`~redis_rlock.Lock` gives every
hold an id of its own, so a cycle among plain locks has no common owner and is never refused
(the waits end with their timeouts). Locks made by an :class:`Owner` hold everything under its
one id: a wait that would close a cycle of owners is refused at once with
:class:`~redis_rlock.Deadlock`, nothing taken or queued.
"""

from __future__ import annotations

from typing import Any, Union

from . import _proto as P
from ._sync import backend_for
from .lock import Lock, RWLock


class OwnerId:
    """An owner id drawn from a client's engine, drawn again in a forked child (the child
    must never share its parent's owner: it would re-enter the parent's holds)."""

    def __init__(self, new_owner: Any) -> None:
        self._new_owner = new_owner
        self._pid = P.current_pid()
        self._id: bytes = new_owner()

    @property
    def id(self) -> bytes:
        """The owner id (``<client-uuid>:<n>``) every hold of the owner is stored under."""
        if self._pid != P.current_pid():
            self._pid, self._id = P.current_pid(), self._new_owner()
        return self._id


class Owner:
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

    def __init__(self, client: Any, *, response_timeout: float = 2.0) -> None:
        self._client = client
        self._rt = response_timeout
        self._id = OwnerId(backend_for(client, response_timeout).new_owner)

    @property
    def id(self) -> bytes:
        """The owner id the server stores every hold of this owner under."""
        return self._id.id

    def lock(self, name: Union[str, bytes], **options: Any) -> Lock:
        """A :class:`~redis_rlock.Lock` held as this owner (``Lock``'s options)."""
        options.setdefault("response_timeout", self._rt)
        lk = Lock(self._client, name, **options)
        lk._owner_id = self._id
        return lk

    def rw_lock(self, name: Union[str, bytes], **options: Any) -> RWLock:
        """A :class:`~redis_rlock.RWLock` whose read and write sides are held as this owner."""
        options.setdefault("response_timeout", self._rt)
        rw = RWLock(self._client, name, **options)
        rw.read._owner_id = rw.write._owner_id = self._id
        return rw

    def __repr__(self) -> str:
        return f"<redis_rlock.Owner {self.id!r}>"
