"""asyncio holds: :class:`AsyncHold` and its loss signal, and what watches a hold (its
watchdog task, or the timer at its deadline); both keep the hold only weakly."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Optional, Protocol

from .._core import renewal_failed, renewal_period
from .._fork import inherited
from .._hold import Hold, LossView


class Renewer(Protocol):
    """What a watchdog task needs of the asyncio engine (``_engine.AsyncBackend``)."""

    rt: float

    async def renew(self, hold: AsyncHold, lease_ms: int, until: Optional[float]) -> bool:
        """Renews ``hold``; True when the server confirmed."""


class AsyncHold(Hold):
    """A :class:`Hold` of the asyncio API: ``await hold.release()``, ``await lost.wait()``."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._aevent = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        #: the watchdog task awaits a renewal's reply: not cancelled then (a "renewed" read
        #: after the hold was lost sends its release: ``_hold.late_renewal``)
        self._renewing = False

    def on_lost_hook(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._aevent.set()

    async def release(self) -> None:  # type: ignore[override]
        """Gives the grant back now."""
        await self.engine.release(self)

    async def __aenter__(self) -> AsyncHold:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.done:
            await self.release()

    @property
    def lost(self) -> AsyncLossSignal:  # type: ignore[override]
        """Event-like loss signal: ``is_set()``, ``await wait(timeout)``."""
        return AsyncLossSignal(self)

    async def wait_lost_async(self, timeout: Optional[float]) -> bool:
        """Waits until lost (True) or ``timeout`` seconds (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            over, step = self.lost_wait_step(end)
            if over is not None:
                return over
            try:
                await asyncio.wait_for(self._aevent.wait(), step)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        """Stops the watchdog task (one awaiting a renewal's reply ends once it is read) and
        the deadline timer."""
        if self._task is not None and not self._renewing:
            self._task.cancel()
        if self._timer is not None:
            self._timer.cancel()


class AsyncLossSignal(LossView):
    """Event-like view of an asyncio hold's loss."""

    __slots__ = ()
    _hold: AsyncHold

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the hold is lost (True) or ``timeout`` seconds passed (False)."""
        return await self._hold.wait_lost_async(timeout)


def watch(hold: AsyncHold, be: Renewer) -> None:
    """Starts what watches ``hold``: its watchdog task (renewals every third of its lease), or
    a timer that marks it lost at its deadline."""
    ref = weakref.ref(hold)
    if hold.watchdog:
        hold._task = asyncio.ensure_future(_watchdog(ref, be))
    elif hold.deadline != float("inf"):
        loop = asyncio.get_running_loop()
        delay = max(0.0, hold.deadline - time.monotonic())
        hold._timer = loop.call_later(delay, _deadline, ref, loop)


def _deadline(ref: weakref.ref[AsyncHold], loop: asyncio.AbstractEventLoop) -> None:
    hold = ref()
    if hold is None or hold.done:
        return
    if not hold.is_lost():  # extended by a re-entry: look again at the new deadline
        hold._timer = loop.call_later(
            max(0.0, hold.deadline - time.monotonic()), _deadline, ref, loop
        )


async def _watchdog(ref: weakref.ref[AsyncHold], be: Renewer) -> None:
    hold = ref()
    if hold is None:
        return
    period = renewal_period(hold)
    delay, backoff = period, 0.0
    del hold
    while True:
        await asyncio.sleep(delay)
        hold = ref()
        if hold is None or hold.done or hold.is_lost() or inherited(hold):
            return
        now = time.monotonic()
        try:
            hold._renewing = True
            try:
                ok = await be.renew(hold, hold.lease_ms, min(hold.deadline, now + be.rt))
            finally:
                hold._renewing = False
        except asyncio.CancelledError:
            raise
        except Exception as e:
            backoff = renewal_failed(hold, e, backoff)
            delay = max(0.0, min(backoff, hold.deadline - time.monotonic()))
            del hold
            continue
        if hold.done:
            return  # released while the renewal was in flight
        if not ok:
            hold.mark_lost()
            return
        backoff, delay = 0.0, period
        del hold
