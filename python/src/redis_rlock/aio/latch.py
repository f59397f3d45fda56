"""asyncio count-down latch: :class:`CountDownLatch` (see the sync
:class:`redis_rlock.CountDownLatch`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, Union

from redis.exceptions import ResponseError

from .. import _proto as P
from .._conn import is_transient, log
from ..errors import translate
from ._engine import AsyncBackend, backend_for


class CountDownLatch:
    """A count-down latch (see the sync :class:`redis_rlock.CountDownLatch`). ``await
    wait()`` blocks in the server on a connection of the package's own pool; a cancellation
    (``task.cancel()``, ``asyncio.wait_for``/``asyncio.timeout`` running out) at any await
    closes that connection, which ends the server's wait at once and leaves the pool sound."""

    def __init__(
        self, client: Any, name: Union[str, bytes], *, response_timeout: float = 2.0
    ) -> None:
        self.name = P.name_bytes(name)
        self._be: AsyncBackend = backend_for(client, response_timeout)

    async def _cmd(self, *args: P.Arg) -> Any:
        try:
            return await self._be.call(self.name, list(args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None

    async def try_set_count(self, count: int) -> bool:
        """Sets the count (positive) if the latch does not exist; False when it does."""
        n = P.check_latch_count(count, "count")
        return bool(await self._cmd("RLATCH.SETCOUNT", self.name, n))

    async def count_down(self, amount: int = 1) -> int:
        """Counts down by ``amount`` (positive), never below zero; the count left (not
        retried after a lost reply)."""
        n = P.check_latch_count(amount, "amount")
        return int(await self._cmd("RLATCH.COUNTDOWN", self.name, n))

    async def get_count(self) -> int:
        """The count left (0 when the latch is missing: open)."""
        return int(await self._cmd("RLATCH.COUNT", self.name))

    async def delete(self) -> bool:
        """Deletes the latch (every waiter is answered True); False when it was missing."""
        return bool(await self._cmd("RLATCH.DELETE", self.name) == 1)

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the latch is open: True, or False once ``timeout`` seconds passed (0:
        look without waiting; None: no limit). As the sync ``wait``: within ``timeout`` plus
        the response timeout even when the server stalls; sent again after a lost
        connection."""
        budget = P.latch_budget(timeout)
        t0 = time.monotonic()
        if budget == 0.0:
            # one look; no answer within the response timeout is False, as for a timed wait
            try:
                reply, _ = await self._be.call_until(
                    self.name, ["RLATCH.COUNT", self.name], t0 + self._be.rt
                )
            except ResponseError as e:
                if not is_transient(e):
                    raise translate(e, self.name.decode(errors="replace")) from None
                return False
            except Exception as e:
                if not is_transient(e):
                    raise
                return False
            return int(reply) <= 0
        end = None if budget is None else t0 + budget
        backoff = 0.02
        while True:
            now = time.monotonic()
            if end is not None and now >= end:
                return False
            args, extra = P.latch_await(self.name, end, now)
            try:
                if await self._be.call(self.name, args, extra) == 1:
                    return True
                # 0: its time (or its slice) ran out, or a server that does not block (a
                # replica) or CLIENT UNBLOCK ended it early: sent again while time is left, at
                # once when it lasted (a working wait whose slice ended)
                if time.monotonic() - now >= 1.0:
                    backoff = 0.0
            except ResponseError as e:
                if not (is_transient(e) or P.is_unblocked(e)):
                    raise translate(e, self.name.decode(errors="replace")) from None
                log.debug("redis_rlock: latch wait on %r sent again: %s", self.name, e)
            except Exception as e:
                if not is_transient(e):
                    raise
                log.debug("redis_rlock: latch wait on %r sent again: %s", self.name, e)
            now = time.monotonic()
            if end is not None and now >= end:
                return False
            await asyncio.sleep(backoff if end is None else min(backoff, end - now))
            backoff = min(max(backoff * 2, 0.02), 1.0)
