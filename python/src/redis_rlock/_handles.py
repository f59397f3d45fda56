"""The handle factories sessions and owners share, sync and asyncio alike: a lock, a read-write
lock (both sides) or a leased semaphore made on the session's or owner's client, with its
response timeout unless the options give one, and tied to it: bound to the session (its holds
are session holds) or held as the owner (every hold under the owner's one id)."""

from __future__ import annotations

from typing import Any, Callable, Generic, Protocol, TypeVar

from ._fork import ForkGuard
from ._peers import Peers
from ._proto import Name


class _Sides(Protocol):
    """A read-write lock: its ``read`` and ``write`` sides."""

    read: Any
    write: Any


LockT = TypeVar("LockT")
RWLockT = TypeVar("RWLockT", bound=_Sides)
SemT = TypeVar("SemT")
_T = TypeVar("_T")


class Handles(Generic[LockT, RWLockT]):
    """:meth:`lock` and :meth:`rw_lock` of a session or an owner; ``_bind`` ties a lock side
    (or a semaphore) to it."""

    _client: Any
    _rt: float
    #: the classes it makes (the sync package's, or ``redis_rlock.aio``'s)
    _lock_class: Callable[..., LockT]
    _rw_lock_class: Callable[..., RWLockT]

    def _bind(self, handle: Any) -> None:
        raise NotImplementedError

    def _make(self, cls: Callable[..., _T], name: Name, options: Any) -> _T:
        options.setdefault("response_timeout", self._rt)
        return cls(self._client, name, **options)

    def lock(self, name: Name, **options: Any) -> LockT:
        """A ``Lock`` (``Lock``'s options) tied to this session or owner: a session's holds
        are bound to its connection, an owner's are held under its id."""
        lk = self._make(self._lock_class, name, options)
        self._bind(lk)
        return lk

    def rw_lock(self, name: Name, **options: Any) -> RWLockT:
        """An ``RWLock`` whose read and write sides are tied to this session or owner."""
        rw = self._make(self._rw_lock_class, name, options)
        self._bind(rw.read)
        self._bind(rw.write)
        return rw


class SessionHandles(Handles[LockT, RWLockT], Generic[LockT, RWLockT, SemT]):
    """A session's handles: locks, read-write locks and leased semaphores whose holds are
    bound to the session."""

    _leased_semaphore_class: Callable[..., SemT]

    def _bind(self, handle: Any) -> None:
        handle._session = self

    def leased_semaphore(self, name: Name, **options: Any) -> SemT:
        """A ``LeasedSemaphore`` whose permits are bound to this session."""
        sem = self._make(self._leased_semaphore_class, name, options)
        self._bind(sem)
        return sem


class OwnerId:
    """An owner id drawn from a client's engine, drawn again in a forked child (the child
    must never share its parent's owner: it would re-enter the parent's holds)."""

    def __init__(self, new_owner: Callable[[], bytes]) -> None:
        self._new_owner = new_owner
        self._fork = ForkGuard()
        self._id: bytes = new_owner()
        #: the owner's live holds, by key (one server hold per key: see ``_peers``)
        self.peers = Peers()

    @property
    def id(self) -> bytes:
        """The owner id (``<client-uuid>:<n>``) every hold of the owner is stored under."""
        if self._fork.forked():
            self._id = self._new_owner()
        return self._id


class OwnerHandles(Handles[LockT, RWLockT]):
    """An owner's id and handles: locks and read-write locks held under exactly that id."""

    def __init__(self, client: Any, response_timeout: float, new_owner: Callable[[], bytes]):
        self._client = client
        self._rt = response_timeout
        self._id = OwnerId(new_owner)

    @property
    def id(self) -> bytes:
        """The owner id the server stores every hold of this owner under."""
        return self._id.id

    def _bind(self, handle: Any) -> None:
        handle._owner_id = self._id
