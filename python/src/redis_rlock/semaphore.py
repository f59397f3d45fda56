"""Sync semaphores: :class:`Semaphore` (counted permits, ``RSEM.*``, Redisson's ``RSemaphore``)
and :class:`LeasedSemaphore` (leased permits with ids, Redisson's
``RPermitExpirableSemaphore``)."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Callable, Optional

from redis.exceptions import ResponseError

from . import _proto as P
from ._fork import inherited
from ._hold import Hold
from ._object_drivers import SyncSemCommands
from ._sems import LeasedCore
from ._sync import HANDED_OVER, SyncBackend, backend_for
from .errors import LockTimeout, NotHeld, RLockError, translate


class _SemBase(SyncSemCommands):
    """What both sync semaphores share: the per-thread stack of ``with`` guards."""

    _be: SyncBackend

    def _engine(self, client: Any, response_timeout: float) -> SyncBackend:
        return backend_for(client, response_timeout)

    def _start(self) -> None:
        self._local = threading.local()

    def _stack(self) -> list[Hold]:
        st: Optional[list[Hold]] = getattr(self._local, "stack", None)
        if st is None or (st and inherited(st[-1])):
            st = []
            self._local.stack = st
        return st

    def _exit(self, exc: Optional[BaseException]) -> None:
        st = self._stack()
        if not st:
            raise NotHeld("this thread holds no permits of this semaphore")
        hold = st[-1]
        try:
            if not hold.done:  # (released already through the guard: nothing to send)
                hold.release()
        except NotHeld:
            if exc is None:
                raise
        finally:
            # off the stack once released (or being released in the background); an error
            # reply (nothing changed) or an interrupt before the release leaves it held here
            if (hold.done or inherited(hold)) and st and st[-1] is hold:
                st.pop()

    def _take_one(self, store: Callable[[Hold], None]) -> Optional[Hold]:
        """One permit for ``with``, waiting as the constructor's ``blocking``/``timeout`` say;
        its guard is handed to ``store`` as it is granted."""
        raise NotImplementedError

    def __enter__(self) -> Hold:
        st = self._stack()
        depth = len(st)
        try:
            hold = self._take_one(st.append)
            if hold is None:
                raise LockTimeout("no permit in time", lock_name=self.name.decode(errors="replace"))
            return hold
        except BaseException:
            # the block never runs, so ``__exit__`` never will: a grant stored meanwhile (an
            # interrupt landed after it) is cancelled
            for h in st[depth:]:
                if not h.done:
                    self._be.abandon(h)
            del st[depth:]
            raise

    def __exit__(
        self,
        et: Optional[type[BaseException]],
        e: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self._exit(e)
        except BaseException as err:
            if not isinstance(err, RLockError):
                # an interrupt before the release began: it goes on in the background
                st = self._stack()
                if st and not st[-1].done:
                    self._be.release_later(st[-1])
                    st[-1].done = True
                if st and st[-1].done:
                    st.pop()
            raise


class Semaphore(_SemBase):
    """Counted permits. ``acquire``/``release`` are ``threading.Semaphore``-like (permits have
    no owner); ``permits(n)`` and ``with sem:`` give a guard whose release gives back exactly
    what its acquire took (``RSEM.RELEASE key n REQUEST <its acquire's id>``: idempotent, so
    a retry or a background resend never gives back twice)."""

    def acquire(self, permits: int = 1, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes ``permits``, waiting in the server (FIFO, no barging) up to ``timeout``."""
        got: list[Hold] = []
        try:
            self._take(permits, blocking, timeout, got.append, ownerless=True)
            taken = bool(got)  # (no call right before the ``return``: see ``_abandon``)
            return taken
        except BaseException:
            _abandon(self._be, got)
            raise

    def permits(
        self, permits: int = 1, blocking: bool = True, timeout: float = -1
    ) -> Optional[Hold]:
        """Takes ``permits`` and returns their guard (None when not taken in time)."""
        got: list[Hold] = []
        try:
            self._take(permits, blocking, timeout, got.append)
            return got[0] if got else None
        except BaseException:
            _abandon(self._be, got)
            raise

    def _take(
        self,
        permits: int,
        blocking: bool,
        timeout: float,
        store: Callable[[Hold], None],
        ownerless: bool = False,
    ) -> None:
        """``ownerless``: the caller gives the permits back with :meth:`release` (``ONCE``),
        not through the guard (``REQUEST`` of the acquire)."""
        spec = self._counted(permits, ownerless)
        self._be.acquire(spec, P.wait_budget(blocking, timeout), False, None, store)

    def release(self, permits: int = 1) -> int:
        """Gives back ``permits`` (anyone may); returns the count left. Sent with a request id
        of its own (``RSEM.RELEASE key n ONCE id``: the server gives back once per id and
        remembers it for 60 s), so after a lost reply or a connection dropped under it (the
        client's ``close()``, a reset) it is sent again, never giving back twice. The call
        waits up to three response timeouts; unanswered by then (or interrupted), it raises
        and the same release goes on in the background for 50 s from its first send: do not
        release those permits again (counted permits have no lease: a release given up on
        would be a permit held by nobody for good)."""
        # (A signal handled at the call's very first instruction, before this ``try``, is
        # CPython's, as at the caller's: nothing was sent, and it raises from here.)
        try:
            first = time.monotonic()
            args = self._release_args(permits)
            return int(self._be.counted_release(self.name, args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None
        except BaseException as e:
            if not isinstance(e, Exception) and not getattr(e, HANDED_OVER, False):
                self._release_interrupted(permits, locals())
            raise

    def _release_interrupted(self, permits: int, seen: dict[str, Any]) -> None:
        """:meth:`release` interrupted (a KeyboardInterrupt) at any point, the engine's own
        handling included or not: the release goes on in the background. With the id the
        call made, if it made one (sent again, it gives back once); else with a new one (the
        call sent nothing)."""
        first = seen.get("first", time.monotonic())
        args = seen.get("args") or self._release_args(permits)
        self._be.counted_release_later(self.name, args, first)

    def _take_one(self, store: Callable[[Hold], None]) -> Optional[Hold]:
        spec = self._counted(1)
        return self._be.acquire(
            spec, P.wait_budget(self._blocking, self._timeout), False, None, store
        )


class LeasedSemaphore(LeasedCore, _SemBase):
    """Leased permits, each with an id and a lease the server enforces. No lease: a watchdog
    renews them (``RSEM.RENEW``) until released."""

    def acquire(
        self,
        permits: int = 1,
        blocking: bool = True,
        timeout: float = -1,
        *,
        lease: Optional[float] = None,
    ) -> Optional[Hold]:
        """Takes ``permits`` leased permits: their guard (``ids``), or None when not in time."""
        got: list[Hold] = []
        try:
            self._acquire(permits, blocking, timeout, lease, got.append)
            return got[0] if got else None
        except BaseException:
            _abandon(self._be, got)
            raise

    def _acquire(
        self,
        permits: int,
        blocking: bool,
        timeout: float,
        lease: Optional[float],
        store: Callable[[Hold], None],
    ) -> Optional[Hold]:
        spec, lease_ms, session = self._leased(permits, lease)
        wait = P.wait_budget(blocking, timeout)
        return self._be.acquire(spec, wait, lease_ms is None, self._on_lost, store, session)

    def _take_one(self, store: Callable[[Hold], None]) -> Optional[Hold]:
        return self._acquire(1, self._blocking, self._timeout, None, store)


def _abandon(be: Any, got: list[Hold]) -> None:
    """A call that hands its guard back (``permits``, ``acquire``) and ends with an exception
    (a KeyboardInterrupt between the grant and the return, in any frame of the package): the
    caller never sees the guard, so the grant is cancelled exactly (``RLOCK.CANCEL`` of its
    request id: idempotent, also when the engine cancelled it already). A signal handler
    runs only at a function's start, backward jumps and right after a call: these calls end
    with a ``return`` of no call of its own, so a signal after their last call lands in the
    ``try``."""
    for h in got:
        be.abandon(h)
