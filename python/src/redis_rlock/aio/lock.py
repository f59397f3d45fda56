"""asyncio locks: :class:`Lock` and :class:`RWLock`, the sync API with ``await``.

Ownership is **per task**: the task's holds are kept by task (weakly, never in its context),
so a child task starts with nothing rather than "re-entering" its parent's hold (never
``threading.local``: every task of a loop shares its thread). A task that ends without
releasing drops its holds: the watchdog task stops and the lease ends on the server.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Optional

from .. import _proto as P
from .._fork import inherited
from .._locks import DEFAULT, live
from ..errors import (
    LockTimeout,
    NotHeld,
    RLockError,
)
from ._engine import AsyncBackend, backend_for
from ._hold import AsyncHold, AsyncLossSignal
from ._object_drivers import AsyncLockDrivers

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


class _Base(AsyncLockDrivers):
    """What every asyncio lock side shares: the per-task hold, the asyncio.Lock-like API."""

    _who = "task"
    _be: AsyncBackend

    def _engine(self, client: Any, response_timeout: float) -> AsyncBackend:
        return backend_for(client, response_timeout)

    def _start(self) -> None:
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

    async def acquire(
        self, blocking: bool = True, timeout: float = -1, *, lease: Any = DEFAULT
    ) -> bool:
        """As the sync ``Lock.acquire``: waits in the server (FIFO) up to ``timeout``; a
        cancellation at any point leaves nothing held (``RLOCK.CANCEL`` of the request)."""
        wait = P.wait_budget(blocking, timeout)
        lease_ms = self._lease_of(lease)
        session = self._open_session()
        hold = self._current()
        if hold is not None:
            return await self._be.reenter(hold, lease_ms or self._watchdog_ms, wait)
        spec = self._spec(lease_ms, session)
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
        hold = self._releasing()
        if hold is None:
            return
        holds = _task_holds()
        holds.pop(self._key(), None)
        try:
            await self._be.release(hold)
        except RLockError:
            if not hold.done:  # refused by the server (an error reply): still this task's
                holds[self._key()] = hold
            raise

    @property
    def lost(self) -> AsyncLossSignal:
        """Event-like loss signal of this task's hold."""
        return self.hold.lost

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
        await self._keep_read_keys()
        await super().release()

    def _other_side(self) -> Optional[AsyncHold]:
        other = P.WRITE if self._kind == P.READ else P.READ
        return live(_task_holds().get(self._key(other)))


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
