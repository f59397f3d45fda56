"""Drop-ins for redis-py's ``Lock``: ``r.lock(name, ..., lock_class=RLockCompat)`` (and
``AsyncRLockCompat`` for ``redis.asyncio``) keep redis-py's signature, attributes and
exceptions (``LockError``, ``LockNotOwnedError``) but wait in the server, FIFO, and release
exactly. Differences: ``timeout=None`` (redis-py: a key that never expires) takes a 30 s lease
renewed by a watchdog until release; ``sleep`` is accepted and unused (nobody polls)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional, Union

import redis.asyncio.lock as alock
import redis.lock as slock
from redis.exceptions import LockError, LockNotOwnedError

from . import _proto as P

_WATCHDOG_MS = 30_000


def _wait(blocking: bool, blocking_timeout: Optional[float]) -> Optional[float]:
    if not blocking:
        return 0.0
    if blocking_timeout is None:
        return None
    return max(0.0, float(blocking_timeout))


def _token(token: Union[str, bytes, None]) -> bytes:
    if token is None:
        return uuid.uuid1().hex.encode()
    return token if isinstance(token, bytes) else str(token).encode()


def _lease(timeout: Optional[float]) -> tuple[int, bool]:
    return (_WATCHDOG_MS, True) if timeout is None else (P.to_ms(timeout, "timeout"), False)


class RLockCompat(slock.Lock):
    """redis-py's ``Lock`` API on rlock (sync)."""

    def __init__(self, redis: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(redis, name, *args, **kwargs)
        from ._sync import backend_for

        self._be = backend_for(redis, 2.0)
        self._key = P.name_bytes(name if isinstance(name, (str, bytes)) else bytes(name))
        self._lname = self._key.decode(errors="replace")

    def register_scripts(self) -> None:
        """No Lua scripts: the module's commands do the work."""

    def acquire(
        self,
        sleep: Optional[float] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[str] = None,
    ) -> bool:
        """Takes the lock, waiting in the server (FIFO) up to ``blocking_timeout``."""
        blocking = self.blocking if blocking is None else blocking
        blocking_timeout = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        owner = _token(token)
        lease_ms, watchdog = _lease(self.timeout)
        spec = P.Spec(P.LOCK, self._key, owner=owner, lease_ms=lease_ms)
        hold = self._be.acquire(
            spec,
            _wait(blocking, blocking_timeout),
            watchdog,
            None,
            lambda h: setattr(self.local, "hold", h),
        )
        if hold is None:
            return False
        self.local.token = owner
        return True

    def do_acquire(self, token: Union[str, bytes]) -> bool:
        """One non-blocking try with ``token`` as the owner."""
        return self.acquire(blocking=False, token=token)  # type: ignore[arg-type]

    def locked(self) -> bool:
        """Whether anybody holds the lock."""
        return bool(self._be.call(self._key, ["RLOCK.PTTL", self._key]) != -2)

    def owned(self) -> bool:
        """Whether this lock object's token holds it."""
        token = getattr(self.local, "token", None)
        if token is None:
            return False
        info = P.info_map(self._be.call(self._key, ["RLOCK.INFO", self._key]))
        return info is not None and info.get(b"owner") == _token(token)

    def release(self) -> None:
        """Releases (exactly once, retried after connection errors); ``LockNotOwnedError``
        when the lock was no longer held (unless ``raise_on_release_error=False``)."""
        expected = getattr(self.local, "token", None)
        if expected is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self._lname)
        hold = getattr(self.local, "hold", None)
        self.local.token = None
        self.local.hold = None
        try:
            if hold is not None:
                self._be.release(hold)
            else:
                self.do_release(expected)
        except LockNotOwnedError:
            if getattr(self, "raise_on_release_error", True):
                raise

    def do_release(self, expected_token: Union[str, bytes]) -> None:
        """``RLOCK.RELEASE`` of ``expected_token`` with a request id."""
        args: list[P.Arg] = ["RLOCK.RELEASE", self._key, _token(expected_token)]
        args += ["REQUEST", P.new_id()]
        reply, _ = self._be.call_until(self._key, args, time.monotonic() + 3 * self._be.rt)
        if reply is None:
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self._lname
            )

    def do_extend(self, additional_time: float, replace_ttl: bool) -> bool:  # type: ignore[override]
        """Extends the lease (``replace_ttl``: sets it) of this object's hold."""
        token = _token(self.local.token)
        sent = time.monotonic()
        ms = P.to_ms(additional_time, "additional_time")
        if not replace_ttl:
            pttl = int(self._be.call(self._key, ["RLOCK.PTTL", self._key]))
            ms += max(0, pttl)
        if self._be.call(self._key, ["RLOCK.RENEW", self._key, token, ms]) != 1:
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self._lname
            )
        hold = getattr(self.local, "hold", None)
        if hold is not None:
            hold.lease_ms = ms
            hold.deadline = sent + ms / 1000.0
        return True

    def do_reacquire(self) -> bool:  # type: ignore[override]
        """Resets the lease to ``timeout``."""
        assert self.timeout is not None
        return self.do_extend(self.timeout, True)


class AsyncRLockCompat(alock.Lock):
    """redis-py's ``redis.asyncio`` ``Lock`` API on rlock."""

    def __init__(self, redis: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(redis, name, *args, **kwargs)
        from .aio._engine import backend_for

        self._be = backend_for(redis, 2.0)
        self._key = P.name_bytes(name if isinstance(name, (str, bytes)) else bytes(name))
        self._lname = self._key.decode(errors="replace")

    def register_scripts(self) -> None:
        """No Lua scripts."""

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Union[str, bytes, None] = None,
    ) -> bool:
        """Takes the lock, waiting in the server (FIFO) up to ``blocking_timeout``."""
        blocking = self.blocking if blocking is None else blocking
        blocking_timeout = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        owner = _token(token)
        lease_ms, watchdog = _lease(self.timeout)
        spec = P.Spec(P.LOCK, self._key, owner=owner, lease_ms=lease_ms)
        hold = await self._be.acquire(
            spec,
            _wait(blocking, blocking_timeout),
            watchdog,
            None,
            lambda h: setattr(self.local, "hold", h),
        )
        if hold is None:
            return False
        self.local.token = owner
        return True

    async def do_acquire(self, token: Union[str, bytes]) -> bool:
        """One non-blocking try with ``token`` as the owner."""
        return await self.acquire(blocking=False, token=token)

    async def locked(self) -> bool:
        """Whether anybody holds the lock."""
        return bool(await self._be.call(self._key, ["RLOCK.PTTL", self._key]) != -2)

    async def owned(self) -> bool:
        """Whether this lock object's token holds it."""
        token = getattr(self.local, "token", None)
        if token is None:
            return False
        info = P.info_map(await self._be.call(self._key, ["RLOCK.INFO", self._key]))
        return info is not None and info.get(b"owner") == _token(token)

    def release(self) -> Any:
        """Releases (in a shielded task: a cancelled release still completes)."""
        expected = getattr(self.local, "token", None)
        if expected is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self._lname)
        hold = getattr(self.local, "hold", None)
        self.local.token = None
        self.local.hold = None

        async def run() -> None:
            try:
                if hold is not None:
                    await self._be.release(hold)
                else:
                    await self.do_release(expected)
            except LockNotOwnedError:
                if getattr(self, "raise_on_release_error", True):
                    raise

        return run()

    async def do_release(self, expected_token: bytes) -> None:
        """``RLOCK.RELEASE`` of ``expected_token`` with a request id."""
        args: list[P.Arg] = ["RLOCK.RELEASE", self._key, _token(expected_token)]
        args += ["REQUEST", P.new_id()]
        reply, _ = await self._be.call_until(self._key, args, time.monotonic() + 3 * self._be.rt)
        if reply is None:
            raise LockNotOwnedError(
                "Cannot release a lock that's no longer owned", lock_name=self._lname
            )

    async def do_extend(self, additional_time: float, replace_ttl: bool) -> bool:  # type: ignore[override]
        """Extends the lease (``replace_ttl``: sets it)."""
        token = _token(self.local.token)
        sent = time.monotonic()
        ms = P.to_ms(additional_time, "additional_time")
        if not replace_ttl:
            ms += max(0, int(await self._be.call(self._key, ["RLOCK.PTTL", self._key])))
        if await self._be.call(self._key, ["RLOCK.RENEW", self._key, token, ms]) != 1:
            raise LockNotOwnedError(
                "Cannot extend a lock that's no longer owned", lock_name=self._lname
            )
        hold = getattr(self.local, "hold", None)
        if hold is not None:
            hold.lease_ms = ms
            hold.deadline = sent + ms / 1000.0
        return True

    async def do_reacquire(self) -> bool:  # type: ignore[override]
        """Resets the lease to ``timeout``."""
        assert self.timeout is not None
        return await self.do_extend(self.timeout, True)
