"""asyncio semaphores: :class:`Semaphore` (counted) and :class:`LeasedSemaphore` (leased ids)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import _proto as P
from .._hold import LostCallback
from ..errors import LockTimeout, NotHeld, translate
from ._engine import AsyncBackend, backend_for
from ._hold import AsyncHold
from .lock import _serial, _task_holds


class _SemBase:
    def __init__(
        self,
        client: Any,
        name: P.Name,
        *,
        blocking: bool = True,
        timeout: float = -1,
        response_timeout: float = 2.0,
    ) -> None:
        self.name = P.name_bytes(name, client)
        self._be: AsyncBackend = backend_for(client, response_timeout)
        P.wait_budget(blocking, timeout)
        self._blocking, self._timeout = blocking, timeout
        self._id = next(_serial)

    async def _cmd(self, *args: P.Arg) -> Any:
        try:
            return await self._be.call(self.name, list(args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None

    async def try_set_permits(self, permits: int) -> bool:
        """Creates the semaphore with ``permits`` if it does not exist."""
        if isinstance(permits, bool) or not isinstance(permits, int) or not 0 <= permits < 2**63:
            raise ValueError(f"permits must be a non-negative 64-bit integer, got {permits!r}")
        return bool(await self._cmd("RSEM.SETPERMITS", self.name, permits) == 1)

    async def add_permits(self, delta: int) -> int:
        """Adds ``delta`` permits; returns the new count."""
        P.check_delta(delta)
        return int(await self._cmd("RSEM.ADDPERMITS", self.name, delta))

    async def available(self) -> int:
        """The permits available now."""
        return int(await self._cmd("RSEM.AVAILABLE", self.name))

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
        n = P.check_permits(permits, False)
        spec = P.Spec(P.COUNTED, self.name, permits=n, ownerless=ownerless)
        return await self._be.acquire(spec, P.wait_budget(blocking, timeout), False, None, _noop)

    async def release(self, permits: int = 1) -> int:
        """Gives back ``permits``; the count left. As the sync one: with a request id of its
        own, sent again after a lost reply or a dropped connection, never giving back twice;
        unanswered within three response timeouts (or cancelled) it raises and goes on in the
        background for 50 s from its first send: do not release those permits again."""
        args = P.counted_release(self.name, P.check_permits(permits, False))
        try:
            return int(await self._be.counted_release(self.name, args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None

    async def _take_one(self) -> Optional[AsyncHold]:
        return await self.permits(1, self._blocking, self._timeout)


class LeasedSemaphore(_SemBase):
    """Leased permits with ids (see the sync :class:`redis_rlock.LeasedSemaphore`)."""

    #: the session its permits are bound to (set by ``Session.leased_semaphore``)
    _session: Any = None

    def __init__(
        self,
        client: Any,
        name: P.Name,
        *,
        lease: Optional[float] = None,
        on_lost: Optional[LostCallback] = None,
        watchdog_timeout: float = 30.0,
        **kw: Any,
    ) -> None:
        super().__init__(client, name, **kw)
        if lease is not None:
            P.to_ms(lease, "lease")  # refused at once, not at the first acquire
        self._lease = lease
        self._on_lost = on_lost
        self._watchdog_ms = P.watchdog_ms(watchdog_timeout)

    async def acquire(
        self,
        permits: int = 1,
        blocking: bool = True,
        timeout: float = -1,
        *,
        lease: Optional[float] = None,
    ) -> Optional[AsyncHold]:
        """Takes ``permits`` leased permits: their guard, or None when not in time."""
        lease = self._lease if lease is None else lease
        lease_ms = None if lease is None else P.to_ms(lease, "lease")
        session = self._session
        spec = P.Spec(
            P.LEASED,
            self.name,
            permits=P.check_permits(permits, True),
            lease_ms=lease_ms or self._watchdog_ms,
            session=session is not None,
            lock_delay_ms=0 if session is None else session.lock_delay_ms,
        )
        wait = P.wait_budget(blocking, timeout)
        return await self._be.acquire(spec, wait, lease_ms is None, self._on_lost, _noop, session)

    async def _take_one(self) -> Optional[AsyncHold]:
        return await self.acquire(1, self._blocking, self._timeout)


def _noop(_: AsyncHold) -> None:
    return None
