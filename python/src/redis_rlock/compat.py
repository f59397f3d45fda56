"""Drop-ins for redis-py's ``Lock``: ``r.lock(name, ..., lock_class=RLockCompat)`` (and
``AsyncRLockCompat`` for ``redis.asyncio``) keep redis-py's signature, attributes and
exceptions (``LockError``, ``LockNotOwnedError``) but wait in the server, FIFO, and release
exactly. Differences: ``timeout=None`` (redis-py: a key that never expires) takes a 30 s lease
renewed by a watchdog until release; ``sleep`` is accepted and unused (nobody polls).

Tokens work as redis-py's: ``acquire(token=...)`` (or a fresh uuid1 hex) is the lock object's
``local.token``; the server stores the hold under ``<token>:<32 hex digits>``, an owner id of
its own per acquire, so an acquire never re-enters a hold (redis-py's lock is not reentrant:
a second acquire with the holder's token waits or fails as any other). ``release``, ``extend``,
``reacquire`` and ``owned`` act on the hold whose owner id carries ``local.token``, whichever
lock object (or process) took it."""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Union

import redis.asyncio.lock as alock
import redis.lock as slock
from redis.exceptions import LockNotOwnedError

from ._compat_async import AsyncCompatDrivers
from ._compat_sync import SyncCompatDrivers
from .errors import WrongType


class RLockCompat(SyncCompatDrivers, slock.Lock):  # type: ignore[misc]
    """redis-py's ``Lock`` API on rlock (sync)."""

    def __init__(self, redis: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(redis, name, *args, **kwargs)
        from ._sync import backend_for

        self._attach(redis, name, backend_for)

    def register_scripts(self) -> None:
        """No Lua scripts: the module's commands do the work."""

    def acquire(
        self,
        sleep: Optional[float] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[str] = None,
    ) -> bool:
        """Takes the lock, waiting in the server (FIFO) up to ``blocking_timeout`` (None,
        +inf or beyond the server's range: without limit). Never re-enters: a lock held under
        the same token (by this object or another) is busy, as with redis-py."""
        spec, wait, watchdog, store = self._acquiring(blocking, blocking_timeout, token)
        return self._be.acquire(spec, wait, watchdog, None, store) is not None

    def do_acquire(self, token: Union[str, bytes]) -> bool:
        """One non-blocking try with ``token``."""
        return self.acquire(blocking=False, token=token)  # type: ignore[arg-type]

    def release(self) -> None:
        """Releases (exactly once, retried after connection errors); ``LockNotOwnedError``
        when the lock was no longer held under this object's token (unless
        ``raise_on_release_error=False``)."""
        raw, expected = self._releasing()
        hold = self._hold_of(expected)
        try:
            if hold is not None:
                try:
                    self._be.release(hold)
                except LockNotOwnedError:
                    # this object's hold is gone; as in redis-py, the token is the owner: a
                    # later hold taken with it (by another object) is the one released
                    self.do_release(expected)
                except WrongType:
                    hold.mark_lost()  # the key was overwritten: this hold is gone
                    hold.done = True
                    raise
            else:
                self.do_release(expected)
        except (LockNotOwnedError, WrongType) as e:
            self._forget(raw)
            self._not_owned_at_release(e)
            return
        except BaseException:
            if hold is not None and hold.done:
                self._forget(raw)  # sent, or left to the background sender
            raise
        self._forget(raw)


class AsyncRLockCompat(AsyncCompatDrivers, alock.Lock):  # type: ignore[misc]
    """redis-py's ``redis.asyncio`` ``Lock`` API on rlock."""

    def __init__(self, redis: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(redis, name, *args, **kwargs)
        from .aio._engine import backend_for

        self._attach(redis, name, backend_for)

    def register_scripts(self) -> None:
        """No Lua scripts."""

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Union[str, bytes, None] = None,
    ) -> bool:
        """Takes the lock, waiting in the server (FIFO) up to ``blocking_timeout`` (None,
        +inf or beyond the server's range: without limit); never re-enters (see the sync one)."""
        spec, wait, watchdog, store = self._acquiring(blocking, blocking_timeout, token)
        return await self._be.acquire(spec, wait, watchdog, None, store) is not None

    async def do_acquire(self, token: Union[str, bytes]) -> bool:
        """One non-blocking try with ``token``."""
        return await self.acquire(blocking=False, token=token)

    async def release(self) -> None:
        """Releases, as redis-py 8.1's: the token is cleared only once the release is done
        (or found the lock not owned). A release cancelled before it ran leaves the hold
        and token as they were (release again); one cancelled while running goes on in a
        shielded task, and a ``release()`` again waits for that one's outcome."""
        raw, expected = self._releasing()
        hold: Any = self._hold_of(expected)
        pending = getattr(self.local, "releasing", None)
        if pending is not None and pending[0] is raw and pending[1] is hold:
            task = pending[2]
        else:
            task = self._be.background(self._release(hold, expected))
            self.local.releasing = (raw, hold, task)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            raise  # the release goes on; the token stays for a release() again
        except (LockNotOwnedError, WrongType) as e:
            self._done_releasing(raw)
            self._not_owned_at_release(e)
            return
        except BaseException:
            self.local.releasing = None  # nothing changed (an error reply): release again
            raise
        self._done_releasing(raw)

    async def _release(self, hold: Any, token: bytes) -> None:
        if hold is None:
            await self.do_release(token)
            return
        try:
            await self._be.release(hold)
        except LockNotOwnedError:
            # this object's hold is gone: a later hold taken with the token (as the sync one)
            await self.do_release(token)
        except WrongType:
            hold.mark_lost()  # the key was overwritten: this hold is gone
            hold.done = True
            hold.stop()
            raise

    def _done_releasing(self, raw: Any) -> None:
        self.local.releasing = None
        self._forget(raw)
