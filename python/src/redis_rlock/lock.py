"""Sync locks: :class:`Lock` (reentrant) and :class:`RWLock` (its ``read`` and ``write`` sides).

Ownership is **per thread**, as ``threading.RLock``'s: a thread re-enters what it holds, and
another thread sharing the same object waits for it. Per handle would let two threads that
share a ``Lock`` object both "re-enter" and run the critical section together; per thread keeps
the object safe to share, and a thread that ends without releasing drops its hold (the
thread-local state goes with it), so the watchdog stops and the lease ends on the server.
"""

from __future__ import annotations

import functools
import threading
from types import TracebackType
from typing import Any, Optional

from . import _proto as P
from ._fork import inherited
from ._hold import Hold, LossSignal
from ._locks import DEFAULT, live
from ._object_drivers import SyncLockDrivers
from ._sync import SyncBackend, backend_for
from .errors import (
    LockTimeout,
    NotHeld,
    RLockError,
)


class _Base(SyncLockDrivers):
    """What every sync lock side shares: the per-thread hold, the threading.Lock API."""

    _be: SyncBackend

    def _engine(self, client: Any, response_timeout: float) -> SyncBackend:
        return backend_for(client, response_timeout)

    def _start(self) -> None:
        self._local = threading.local()

    # -- per-thread state ---------------------------------------------------------------------
    def _slot(self) -> str:
        return "hold"

    def _current(self) -> Optional[Hold]:
        hold: Optional[Hold] = getattr(self._local, self._slot(), None)
        if hold is not None and (inherited(hold) or hold.done):
            setattr(self._local, self._slot(), None)  # a forked child holds nothing
            return None
        return hold

    # -- threading.Lock API -------------------------------------------------------------------
    def acquire(self, blocking: bool = True, timeout: float = -1, *, lease: Any = DEFAULT) -> bool:
        """Takes the lock (or re-enters it): waits in the server, FIFO, up to ``timeout``
        seconds (-1: no limit; ``blocking=False``: one try). ``lease`` (seconds) overrides the
        lock's; no lease means a watchdog renews the hold until release. Returns whether held.
        Raises :class:`LockLost` when re-entering a hold that was lost."""
        wait = P.wait_budget(blocking, timeout)
        lease_ms = self._lease_of(lease)
        session = self._open_session()
        prev = self._current()
        count = 0 if prev is None else prev.count
        try:
            if prev is not None:
                return self._be.reenter(prev, lease_ms or self._watchdog_ms, wait)
            spec = self._spec(lease_ms, session)
            store = functools.partial(setattr, self._local, self._slot())
            return (
                self._be.acquire(spec, wait, lease_ms is None, self._on_lost, store, session)
                is not None
            )
        except BaseException:
            self._undo(prev, count)
            raise

    def _undo(self, prev: Optional[Hold], count: int) -> None:
        """An acquire (or ``with``) that ends with an exception, wherever it landed (a
        KeyboardInterrupt between any two lines), leaves the thread holding what it held
        before: a re-entry's count is taken back, a grant made meanwhile is cancelled."""
        cur = self._current()
        if cur is None:
            return
        if cur is prev:
            if cur.count > count:
                cur.count = count
        else:
            self._be.abandon(cur)

    def release(self) -> None:
        """Drops one count of this thread's hold; the last one releases it on the server.
        Raises :class:`NotHeld` when the thread holds nothing, :class:`LockLost` when the hold
        had ended (nothing is sent then). An interrupt landing in it leaves the hold either
        this thread's (not released yet) or released (in the background if need be)."""
        hold = self._releasing()
        if hold is None:
            return
        # the engine marks the hold done (no longer this thread's) as it releases it; an error
        # reply (nothing changed) leaves it this thread's
        self._be.release(hold)

    @property
    def lost(self) -> LossSignal:
        """Event-like loss signal of this thread's hold."""
        return self.hold.lost

    def __enter__(self) -> _Base:
        prev = self._current()
        count = 0 if prev is None else prev.count
        try:
            if not self.acquire(self._blocking, self._timeout):
                raise LockTimeout("could not take the lock in time", lock_name=self._lock_name())
            return self
        except BaseException:
            self._undo(prev, count)  # the block never runs: nothing taken stays taken
            raise

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except NotHeld:
            if exc is None:
                raise
        except BaseException as err:
            if not isinstance(err, RLockError):
                # an interrupt before the release began: the last count's release goes on
                # in the background (a re-entry's count is left to the outer block)
                hold = self._current()
                if hold is not None and hold.count == 1:
                    self._be.release_later(hold)
                    hold.done = True
            raise


class Lock(_Base):
    """A reentrant distributed lock (``RLOCK.*``, Redisson's ``RLock`` layout)."""

    def __repr__(self) -> str:
        return f"<redis_rlock.Lock {self.name!r}>"


class _Side(_Base):
    def __init__(self, parent: RWLock, kind: str, **kw: Any) -> None:
        self._kind = kind
        self._parent = parent
        super().__init__(parent._client, parent.name, **kw)
        self._local = parent._local

    def _slot(self) -> str:
        return self._kind

    def release(self) -> None:
        self._keep_read_keys()
        super().release()

    def locked(self) -> bool:
        """Whether anybody holds the read-write lock now (either side)."""
        return bool(self._be.call(self.name, ["RLOCK.PTTL", self.name]) != -2)

    def _other_side(self) -> Optional[Hold]:
        other = P.WRITE if self._kind == P.READ else P.READ
        return live(getattr(self._local, other, None))


class RWLock:
    """A read-write lock (``RWLOCK.*``, Redisson's ``RReadWriteLock`` layout): ``read`` and
    ``write`` are lock objects with :class:`Lock`'s API. Per thread, the two sides act as one
    Redisson thread: holding write, the thread takes read at once (releasing write then
    downgrades); holding read, a write acquire raises :class:`UpgradeRefused`."""

    def __init__(self, client: Any, name: P.Name, **options: Any) -> None:
        self._client = client
        self.name = P.name_bytes(name, client)
        self._local = threading.local()
        self.read = _Side(self, P.READ, **options)
        self.write = _Side(self, P.WRITE, **options)

    def __repr__(self) -> str:
        return f"<redis_rlock.RWLock {self.name!r}>"
