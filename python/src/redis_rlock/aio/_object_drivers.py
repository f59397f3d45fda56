"""The public objects' drivers that are the same in both packages but for ``await``: the
locks' reads and a read hold's last release's first step, the count-down latch's commands
and wait, the semaphores' count commands, a session's end of a silent connection (the
redis-py drop-in's
are in ``_compat_async.py``: outside this package, which imports the drop-in). Written once
here for asyncio as mixins of those classes; the sync package's ``_object_drivers.py`` is
generated from this file by ``make python-generate`` (tests/test_generated.py fails when it
is stale). What differs beyond ``await`` (acquire and release hand-offs, threads and tasks,
shielded releases) stays in the classes."""

from __future__ import annotations

from asyncio import sleep
from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import _proto as P
from .._conn import log
from .._core import LatchWaiting
from .._locks import LockCore, other_reads, read_keys_refused, read_keys_until
from .._sems import SemCore
from .._sessions import SessionCore
from ..errors import translate
from ._engine import AsyncBackend
from ._hold import AsyncHold


class AsyncLatchDrivers:
    """The count-down latch's methods (``CountDownLatch``: ``name``, ``_be``)."""

    name: bytes
    _be: AsyncBackend

    async def _cmd(self, *args: P.Arg) -> Any:
        try:
            return await self._be.call(self.name, list(args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None

    async def try_set_count(self, count: int) -> bool:
        """Sets the count (positive) if the latch does not exist; False when it does (then
        nothing changes). Not retried after a lost reply (a retry would answer False)."""
        n = P.check_latch_count(count, "count")
        return bool(await self._cmd("RLATCH.SETCOUNT", self.name, n))

    async def count_down(self, amount: int = 1) -> int:
        """Counts down by ``amount`` (positive), never below zero; returns the count left. At
        zero the latch opens: its key is deleted and every waiter answered. A missing latch
        stays missing (0). Not retried after a lost reply (a retry could count down twice)."""
        n = P.check_latch_count(amount, "amount")
        return int(await self._cmd("RLATCH.COUNTDOWN", self.name, n))

    async def get_count(self) -> int:
        """The count left (0 when the latch is missing: open)."""
        return int(await self._cmd("RLATCH.COUNT", self.name))

    async def delete(self) -> bool:
        """Deletes the latch (it opens: every waiter is answered True); False when missing."""
        return bool(await self._cmd("RLATCH.DELETE", self.name) == 1)

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the latch is open (its count at zero, or its key deleted by anyone,
        ``DEL`` included); True once open, False when ``timeout`` seconds passed first
        (Redisson's ``await``; ``threading.Event.wait``'s signature). ``timeout=0`` looks
        without waiting; None waits without a limit.

        Returns within ``timeout`` plus the response timeout even when the server stalls. A
        lost connection (``CLIENT KILL``, a restart, a failover) ends nothing: the wait is sent
        again on a new connection, backing off up to 1 s between tries, within ``timeout``
        (False once it passed) or, without one, until the latch opens. One server-side
        wait lasts at most 30 s (a longer one is sent again as it ends), so a connection that
        died silently is noticed within that and the response timeout. Error replies
        (``WRONGTYPE``, ``NOPERM``, ...) raise the package's exceptions."""
        run = LatchWaiting(self.name, timeout, self._be.rt)
        if run.look:
            try:
                reply, _ = await self._be.call_until(
                    self.name, ["RLATCH.COUNT", self.name], run.look_until
                )
            except Exception as e:
                return run.looked(error=e)
            return run.looked(reply)
        while True:
            slice_ = run.next()
            if slice_ is None:
                return False
            try:
                if run.answered(await self._be.call(self.name, *slice_)):
                    return True
            except Exception as e:
                run.failed(e)
            delay = run.pause()
            if delay is None:
                return False
            await sleep(delay)


class AsyncSemCommands(SemCore):
    """The semaphores' count commands (both kinds)."""

    _be: AsyncBackend

    async def _cmd(self, *args: P.Arg) -> Any:
        try:
            return await self._be.call(self.name, list(args))
        except ResponseError as e:
            raise translate(e, self._lock_name()) from None

    async def try_set_permits(self, permits: int) -> bool:
        """Creates the semaphore with ``permits`` (0 allowed) if it does not exist."""
        return bool(await self._cmd(*self._set_permits(permits)) == 1)

    async def add_permits(self, delta: int) -> int:
        """Adds ``delta`` permits (may be negative); returns the new count."""
        return int(await self._cmd(*self._add_permits(delta)))

    async def available(self) -> int:
        """The permits available now (0 when the semaphore does not exist)."""
        return int(await self._cmd("RSEM.AVAILABLE", self.name))


class AsyncLockDrivers(LockCore[AsyncHold]):
    """The locks' await-only methods (``lock``'s ``Lock`` and read-write sides)."""

    _be: AsyncBackend

    async def locked(self) -> bool:
        """Whether anybody holds the lock now (any owner, any process)."""
        return bool(await self._be.call(self.name, ["RLOCK.PTTL", self.name]) != -2)

    async def _keep_read_keys(self) -> None:
        """Before the last release of a read hold while the owner has other reads: every key
        of the owner's reads as long as the longest promise first (the server drops the
        owner's last key, not this hold's; an error here raises with nothing released: the
        hold stays the caller's)."""
        hold = self._current()
        if hold is not None and hold.count == 1 and not hold.is_lost() and other_reads(hold):
            until = read_keys_until(hold, self._be.rt)
            backoff = 0.02
            while True:
                try:
                    await self._be.renew(hold, hold.lease_ms, until)
                    break
                except ResponseError as e:
                    await sleep(read_keys_refused(e, until, backoff, self._lock_name()))
                    backoff *= 2


class AsyncSessionDrivers(SessionCore[AsyncHold]):
    """The session's await-only methods (``session``'s ``Session``)."""

    _be: AsyncBackend
    client_id: Optional[int]

    async def _kill_server_side(self) -> None:
        """Ends the server's side of a connection that went silent (its holds end with it);
        without the right (ACL) they end with their leases, no longer renewed."""
        kill = self._kill_args(self.client_id)
        if kill is None:
            return
        try:
            await self._be.call(b"", kill)
        except Exception as e:
            log.info("redis_rlock: a silent session's connection stays on the server: %s", e)
