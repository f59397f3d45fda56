"""asyncio semaphores: :class:`Semaphore` (counted) and :class:`LeasedSemaphore` (leased ids)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import _proto as P
from .._sems import LeasedCore
from ..errors import LockTimeout, NotHeld, translate
from ._engine import AsyncBackend, backend_for
from ._hold import AsyncHold
from ._object_drivers import AsyncSemCommands
from .lock import _serial, _task_holds


class _SemBase(AsyncSemCommands):
    """What both asyncio semaphores share: the per-task stack of ``async with`` guards."""

    _be: AsyncBackend

    def _engine(self, client: Any, response_timeout: float) -> AsyncBackend:
        return backend_for(client, response_timeout)

    def _start(self) -> None:
        self._id = next(_serial)

    def _push(self, hold: AsyncHold) -> None:
        holds = _task_holds()
        n = 0
        while (self._id, f"sem{n}") in holds:
            n += 1
        holds[(self._id, f"sem{n}")] = hold

    async def _exit(self, exc: Optional[BaseException]) -> None:
        holds = _task_holds()
        keys = [k for k in holds if k[0] == self._id]
        if not keys:
            raise NotHeld("this task holds no permits of this semaphore")
        hold = holds.pop(max(keys, key=lambda k: int(k[1][3:])))
        try:
            await hold.release()
        except NotHeld:
            if exc is None:
                raise

    async def _take_one(self) -> Optional[AsyncHold]:
        """One permit for ``async with``, waiting as the constructor's ``blocking``/``timeout``
        say."""
        raise NotImplementedError

    async def __aenter__(self) -> AsyncHold:
        hold = await self._take_one()
        if hold is None:
            raise LockTimeout("no permit in time", lock_name=self.name.decode(errors="replace"))
        self._push(hold)
        return hold

    async def __aexit__(
        self,
        et: Optional[type[BaseException]],
        e: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self._exit(e)


class Semaphore(_SemBase):
    """Counted permits (see the sync :class:`redis_rlock.Semaphore`)."""

    async def acquire(self, permits: int = 1, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes ``permits``, waiting in the server up to ``timeout`` (given back with
        :meth:`release`: ownerless)."""
        return await self._take(permits, blocking, timeout, ownerless=True) is not None

    async def permits(
        self, permits: int = 1, blocking: bool = True, timeout: float = -1
    ) -> Optional[AsyncHold]:
        """Takes ``permits``; their guard, or None when not in time."""
        return await self._take(permits, blocking, timeout, ownerless=False)

    async def _take(
        self, permits: int, blocking: bool, timeout: float, ownerless: bool
    ) -> Optional[AsyncHold]:
        spec = self._counted(permits, ownerless)
        return await self._be.acquire(spec, P.wait_budget(blocking, timeout), False, None, _noop)

    async def release(self, permits: int = 1) -> int:
        """Gives back ``permits``; the count left. As the sync one: with a request id of its
        own, sent again after a lost reply or a dropped connection, never giving back twice;
        unanswered within three response timeouts (or cancelled) it raises and goes on in the
        background for 50 s from its first send: do not release those permits again."""
        args = self._release_args(permits)
        try:
            return int(await self._be.counted_release(self.name, args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None

    async def _take_one(self) -> Optional[AsyncHold]:
        return await self.permits(1, self._blocking, self._timeout)


class LeasedSemaphore(LeasedCore, _SemBase):
    """Leased permits with ids (see the sync :class:`redis_rlock.LeasedSemaphore`)."""

    async def acquire(
        self,
        permits: int = 1,
        blocking: bool = True,
        timeout: float = -1,
        *,
        lease: Optional[float] = None,
    ) -> Optional[AsyncHold]:
        """Takes ``permits`` leased permits: their guard, or None when not in time."""
        spec, lease_ms, session = self._leased(permits, lease)
        wait = P.wait_budget(blocking, timeout)
        return await self._be.acquire(spec, wait, lease_ms is None, self._on_lost, _noop, session)

    async def _take_one(self) -> Optional[AsyncHold]:
        return await self.acquire(1, self._blocking, self._timeout)


def _noop(_: AsyncHold) -> None:
    return None
