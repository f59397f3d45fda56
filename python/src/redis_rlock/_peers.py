"""An owner's holds of one name are one server hold: every acquire, re-entry and renewal of
one of them sets the lease of all of them. :class:`Peers` keeps (weakly) the live holds of one
owner, so that what the client sends is never shorter than what any of them was promised."""

from __future__ import annotations

import math
import time
import weakref
from typing import TYPE_CHECKING, Optional

from ._fork import inherited
from ._ledger import Ledger

if TYPE_CHECKING:
    from ._hold import Hold


class Peers:
    """The live holds of one owner (sync and asyncio alike), by key.

    Read holds need one more step: the server keeps an owner's read holds as lease keys
    ``...:rwlock_timeout:1..n`` and a release drops the last one, whichever guard released, so a
    guard's own lease key may go and leave it with another's shorter one. A read release while
    other read holds of the owner live is therefore preceded by a renewal of the owner's reads
    (``RWLOCK.RENEW ... READ`` sets every one of those keys) to the longest promise of them."""

    def __init__(self) -> None:
        # no lock: a KeyboardInterrupt between a lock's acquire and its ``with`` body would
        # leave it held for good; these dict operations are each atomic under the GIL
        self._holds: dict[bytes, dict[int, weakref.ref[Hold]]] = {}
        #: leases sent by acquires not answered yet (their hold does not exist yet), by key: the
        #: latest end each may give; kept until that end passes
        self._pending: dict[bytes, float] = {}
        #: the lease-setting commands of the owner's server hold of each key (``_ledger``)
        self._ledgers: dict[bytes, Ledger] = {}

    def ledger(self, key: bytes) -> Ledger:
        """The ledger of this owner's one server hold of ``key``."""
        found = self._ledgers.get(key)
        if found is None:
            found = self._ledgers.setdefault(key, Ledger())  # atomic: one wins
        return found

    def track(self, hold: Hold) -> None:
        """Records ``hold`` (a hold granted, or about to be, under this owner)."""
        self._holds.setdefault(hold.spec.key, {})[id(hold)] = weakref.ref(hold)

    def sending(self, key: bytes, now: float, lease_ms: int) -> None:
        """An acquire for ``key`` sends ``lease_ms`` now: a renewal of another hold sent before
        its grant is known must not be shorter (it would set the new hold's lease too)."""
        self._pending[key] = max(self._pending.get(key, now), now + lease_ms / 1000.0)

    def _live(self, key: bytes) -> list[Hold]:
        refs = self._holds.get(key)
        if refs is None:
            return []
        live = []
        for i, ref in refs.copy().items():
            h = ref()
            if h is None:
                if refs.get(i) is ref:
                    refs.pop(i, None)
            elif not (h.done or inherited(h) or h._lost.is_set()):
                live.append(h)
        return live

    def holds(self, key: bytes) -> list[Hold]:
        """The live holds of this owner on ``key``."""
        return self._live(key)

    def other_reads(self, hold: Hold) -> bool:
        """Whether another live read hold of this owner shares ``hold``'s key."""
        return any(h is not hold and h.spec.kind == "read" for h in self._live(hold.spec.key))

    def confirmed_until(self, key: bytes) -> float:
        """The latest deadline a live hold of this owner on ``key`` has (-inf: none): the
        server's confirmed lease of their one hold."""
        return max((h.deadline for h in self._live(key)), default=float("-inf"))

    def floor_ms(self, key: bytes, now: Optional[float] = None) -> int:
        """The longest lease, in ms from ``now``, that a live hold of this owner on ``key`` was
        promised or may be promised by a renewal in flight (0: none): a lease sent for ``key``
        must be at least this long, or it would end one of them early on the server."""
        now = time.monotonic() if now is None else now
        live = self._live(key)
        until = max((h.promised for h in live), default=now)
        # A live watchdog hold's renewals ask its full lease whenever they are sent: a lease
        # sent for the key now that is shorter could reach the server after one of them (another
        # connection, a stall) and end the key before what that renewal promised.
        for h in live:
            if h.watchdog and h.lease_ms:
                until = max(until, now + h.lease_ms / 1000.0)
        pending = self._pending.get(key)
        if pending is not None:
            until = max(until, pending)
        if until == float("inf"):
            return 0  # a hold without a lease: nothing a lease could shorten
        return max(0, math.ceil((until - now) * 1000))
