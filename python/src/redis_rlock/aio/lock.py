"""asyncio locks: :class:`Lock` and :class:`RWLock`, the sync API with ``await``.

Ownership is **per task**: the task's holds are kept by task (weakly, never in its context),
so a child task starts with nothing rather than "re-entering" its parent's hold (never
``threading.local``: every task of a loop shares its thread). A task that ends without
releasing drops its holds: the watchdog task stops and the lease ends on the server.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import _proto as P
from .._fork import inherited
from .._hold import LostCallback
from ..errors import (
    LockTimeout,
    NotHeld,
    RLockError,
    SessionClosed,
    UpgradeRefused,
    translate,
)
from ._engine import AsyncBackend, backend_for
from ._hold import AsyncHold, AsyncLossSignal

_DEFAULT: Any = object()
_serial = itertools.count(1)
_Holds = dict[tuple[int, str], AsyncHold]
#: each task's holds, by task. Not in a ContextVar: every context copied while the task runs
#: (a socket's reader registered with the loop as the package opens a connection, a task the
#: caller starts) would share the dict and keep the holds alive after the task ended, and the
#: watchdog renewing them for good. A task that ends drops its dict (its done callback).
_by_task: weakref.WeakKeyDictionary[asyncio.Task[Any], _Holds] = weakref.WeakKeyDictionary()
#: holds taken outside any task (a loop callback): kept in its context
_untasked: ContextVar[Optional[_Holds]] = ContextVar("redis_rlock_untasked_holds", default=None)


def _task_holds() -> _Holds:
    task = asyncio.current_task()
    if task is None:
        holds = _untasked.get()
        if holds is None:
            holds = {}
            _untasked.set(holds)
        return holds
    holds = _by_task.get(task)
    if holds is None:
        holds = _by_task[task] = {}
        task.add_done_callback(_drop_holds)
    return holds


def _drop_holds(task: asyncio.Task[Any]) -> None:
    """A task that ended holds nothing: its holds, nobody's any more, go (unrenewed)."""
    _by_task.pop(task, None)


class _Base:
    _kind = P.LOCK
    #: the session its holds are bound to (set by ``Session.lock`` / ``Session.rw_lock``)
    _session: Any = None
    #: the owner every hold is stored under (set by ``Owner.lock`` / ``Owner.rw_lock``);
    #: None: an owner id of its own per hold
    _owner_id: Any = None

    def __init__(
        self,
        client: Any,
        name: P.Name,
        *,
        lease: Optional[float] = None,
        blocking: bool = True,
        timeout: float = -1,
        fencing: bool = False,
        on_lost: Optional[LostCallback] = None,
        watchdog_timeout: float = 30.0,
        response_timeout: float = 2.0,
    ) -> None:
        self.name = P.name_bytes(name, client)
        self._be: AsyncBackend = backend_for(client, response_timeout)
        self._lease_ms = None if lease is None else P.to_ms(lease, "lease")
        self._watchdog_ms = P.watchdog_ms(watchdog_timeout)
        P.wait_budget(blocking, timeout)
        self._blocking, self._timeout = blocking, timeout
        self._fencing = fencing
        self._on_lost = on_lost
        self._id = next(_serial)

    def _key(self, kind: Optional[str] = None) -> tuple[int, str]:
        return (self._id, kind or self._kind)

    def _current(self) -> Optional[AsyncHold]:
        holds = _task_holds()
        hold = holds.get(self._key())
        if hold is not None and (inherited(hold) or hold.done):
            del holds[self._key()]
            return None
        return hold

    def _under(self) -> Optional[weakref.ref[AsyncHold]]:
        """The write hold a read acquire re-enters under the same owner id (see ``_Side``)."""
        return None

    def _owner(self) -> bytes:
        if self._owner_id is not None:
            return bytes(self._owner_id.id)
        return self._be.new_owner()

    async def acquire(
        self, blocking: bool = True, timeout: float = -1, *, lease: Any = _DEFAULT
    ) -> bool:
        """As the sync ``Lock.acquire``: waits in the server (FIFO) up to ``timeout``; a
        cancellation at any point leaves nothing held (``RLOCK.CANCEL`` of the request)."""
        wait = P.wait_budget(blocking, timeout)
        lease_ms = (
            self._lease_ms
            if lease is _DEFAULT
            else (None if lease is None else P.to_ms(lease, "lease"))
        )
        session = self._session
        if session is not None and session.closed.is_set():
            raise SessionClosed(
                "the session is closed", lock_name=self.name.decode("utf-8", "replace")
            )
        hold = self._current()
        if hold is not None:
            return await self._be.reenter(hold, lease_ms or self._watchdog_ms, wait)
        spec = P.Spec(
            self._kind,
            self.name,
            owner=self._owner(),
            lease_ms=lease_ms or self._watchdog_ms,
            token=self._fencing and self._kind != P.READ,
            session=session is not None,
            lock_delay_ms=0 if session is None else session.lock_delay_ms,
            peers=None if self._owner_id is None else self._owner_id.peers,
            under=self._under(),
        )
        holds = _task_holds()
        key = self._key()

        def store(h: AsyncHold) -> None:
            holds[key] = h

        return (
            await self._be.acquire(spec, wait, lease_ms is None, self._on_lost, store, session)
            is not None
        )

    async def release(self) -> None:
        """Drops one count of this task's hold; the last one releases it on the server (in a
        shielded task: cancelling the caller does not cancel the release)."""
        hold = self._current()
        if hold is None:
            raise NotHeld("this task does not hold the lock", lock_name=self._lock_name())
        if hold.count > 1:
            hold.check()
            hold.count -= 1
            return
        holds = _task_holds()
        holds.pop(self._key(), None)
        try:
            await self._be.release(hold)
        except RLockError:
            if not hold.done:  # refused by the server (an error reply): still this task's
                holds[self._key()] = hold
            raise

    async def locked(self) -> bool:
        """Whether anybody holds the lock now."""
        return bool(await self._be.call(self.name, ["RLOCK.PTTL", self.name]) != -2)

    def owned(self) -> bool:
        """Whether this task holds it (a live hold)."""
        hold = self._current()
        return hold is not None and not hold.is_lost()

    @property
    def hold(self) -> AsyncHold:
        """This task's hold (raises :class:`NotHeld` if none)."""
        hold = self._current()
        if hold is None:
            raise NotHeld("this task does not hold the lock", lock_name=self._lock_name())
        return hold

    @property
    def lost(self) -> AsyncLossSignal:
        """Event-like loss signal of this task's hold."""
        return self.hold.lost

    def check(self) -> None:
        """Raises :class:`LockLost` if this task's hold was lost, :class:`NotHeld` if none."""
        self.hold.check()

    @property
    def token(self) -> Optional[int]:
        """The fencing token of this task's hold, else None."""
        return self.hold.token

    def _lock_name(self) -> str:
        return self.name.decode(errors="replace")

    async def __aenter__(self) -> _Base:
        if not await self.acquire(self._blocking, self._timeout):
            raise LockTimeout("could not take the lock in time", lock_name=self._lock_name())
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except NotHeld:
            if exc is None:
                raise


class Lock(_Base):
    """A reentrant distributed lock for asyncio (``RLOCK.*``)."""

    def __repr__(self) -> str:
        return f"<redis_rlock.aio.Lock {self.name!r}>"


class _Side(_Base):
    def __init__(self, parent: RWLock, kind: str, **kw: Any) -> None:
        self._kind = kind
        super().__init__(parent._client, parent.name, **kw)
        self._id = parent._id

    async def release(self) -> None:
        hold = self._current()
        if hold is not None and hold.count == 1 and not hold.is_lost() and _other_reads(hold):
            # as the sync side's: every lease key of the owner's reads as long as the longest
            # promise first (the server drops the owner's last key, not this hold's)
            until = min(hold.deadline, time.monotonic() + self._be.rt)
            backoff = 0.02
            while True:
                try:
                    await self._be.renew(hold, hold.lease_ms, until)
                    break
                except ResponseError as e:
                    # as the sync side's: NOREPLICAS asked again until the time is up
                    left = until - time.monotonic()
                    if not P.is_noreplicas(e) or left <= 0:
                        raise translate(e, self._lock_name()) from None
                    await asyncio.sleep(min(backoff, left))
                    backoff *= 2
        await super().release()

    def _under(self) -> Optional[weakref.ref[AsyncHold]]:
        # as the sync side's: the read hold keeps the key, so the write hold's field
        if self._kind != P.READ:
            return None
        write = _task_holds().get(self._key(P.WRITE))
        if write is None or write.done or write.is_lost() or inherited(write):
            return None
        return weakref.ref(write)

    def _owner(self) -> bytes:
        other_kind = P.WRITE if self._kind == P.READ else P.READ
        other = _task_holds().get(self._key(other_kind))
        if other is not None and (other.done or other.is_lost() or inherited(other)):
            other = None
        if self._kind == P.WRITE and other is not None:
            raise UpgradeRefused(
                "upgrade refused: this task holds the read side; release it first",
                lock_name=self._lock_name(),
            )
        if self._kind == P.READ and other is not None:
            return other.spec.owner
        return super()._owner()


def _other_reads(hold: AsyncHold) -> bool:
    """A read hold of an Owner whose other live read holds share its key."""
    peers = hold.spec.peers
    return hold.spec.kind == P.READ and peers is not None and bool(peers.other_reads(hold))


class RWLock:
    """A read-write lock for asyncio: ``read`` and ``write`` with :class:`Lock`'s API; per
    task, the sides act as one Redisson thread (write then read: at once; read then write:
    :class:`UpgradeRefused`)."""

    def __init__(self, client: Any, name: P.Name, **options: Any) -> None:
        self._client = client
        self.name = P.name_bytes(name, client)
        self._id = next(_serial)
        self.read = _Side(self, P.READ, **options)
        self.write = _Side(self, P.WRITE, **options)

    def __repr__(self) -> str:
        return f"<redis_rlock.aio.RWLock {self.name!r}>"
