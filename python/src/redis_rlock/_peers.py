"""An owner's holds of one name are one server hold: every acquire, re-entry and renewal of
one of them sets the lease of all of them. :class:`Peers` keeps (weakly) the live holds of one
owner, so that what the client sends is never shorter than what any of them was promised."""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Optional

from ._fork import inherited

if TYPE_CHECKING:
    from ._hold import Hold


class Peers:
    """The live holds of one owner (sync and asyncio alike), by key."""

    def __init__(self) -> None:
        self._holds: dict[bytes, weakref.WeakSet[Hold]] = {}
        self._mutex = threading.Lock()

    def track(self, hold: Hold) -> None:
        """Records ``hold`` (a hold granted, or about to be, under this owner)."""
        with self._mutex:
            self._holds.setdefault(hold.spec.key, weakref.WeakSet()).add(hold)

    def _live(self, key: bytes) -> list[Hold]:
        with self._mutex:
            holds = list(self._holds.get(key, ()))
        return [h for h in holds if not (h.done or inherited(h) or h._lost.is_set())]

    def confirmed_until(self, key: bytes) -> float:
        """The latest deadline a live hold of this owner on ``key`` has (-inf: none): the
        server's confirmed lease of their one hold."""
        return max((h.deadline for h in self._live(key)), default=float("-inf"))

    def floor_ms(self, key: bytes, now: Optional[float] = None) -> int:
        """The longest lease, in ms from ``now``, that a live hold of this owner on ``key`` was
        promised or may be promised by a renewal in flight (0: none): a lease sent for ``key``
        must be at least this long, or it would end one of them early on the server."""
        now = time.monotonic() if now is None else now
        until = max((h.promised for h in self._live(key)), default=now)
        if until == float("inf"):
            return 0  # a hold without a lease: nothing a lease could shorten
        return max(0, math.ceil((until - now) * 1000))
