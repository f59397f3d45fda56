"""asyncio count-down latch: :class:`CountDownLatch` (see the sync
:class:`redis_rlock.CountDownLatch`)."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from redis.exceptions import ResponseError

from .. import _proto as P
from .._core import LatchWaiting
from ..errors import translate
from ._engine import AsyncBackend, backend_for


class CountDownLatch:
    """A count-down latch (see the sync :class:`redis_rlock.CountDownLatch`). ``await
    wait()`` blocks in the server on a connection of the package's own pool; a cancellation
    (``task.cancel()``, ``asyncio.wait_for``/``asyncio.timeout`` running out) at any await
    closes that connection, which ends the server's wait at once and leaves the pool sound."""

    def __init__(self, client: Any, name: P.Name, *, response_timeout: float = 2.0) -> None:
        self.name = P.name_bytes(name, client)
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
            await asyncio.sleep(delay)
