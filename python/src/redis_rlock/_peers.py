"""An owner's holds of one name are one server hold: every acquire, re-entry and renewal of
one of them sets the lease of all of them. :class:`Peers` keeps (weakly) the live holds of one
owner, so that what the client sends is never shorter than what any of them was promised."""

from __future__ import annotations

import itertools
import math
import time
import weakref
from typing import TYPE_CHECKING, Callable, Optional

from ._fork import inherited
from ._ledger import Ledger
from ._proto import REQUEST_RECORD_S

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
        #: by request id: the earliest end any lease sent under it gives (a grant under that
        #: id set the key's expiry to at least this: its hold is valid that long)
        self._sent: dict[bytes, tuple[bytes, float]] = {}
        #: the lease-setting commands of the owner's server hold of each key (``_ledger``)
        self._ledgers: dict[bytes, Ledger] = {}
        #: by key: until when a release or cancel of one of this owner's holds there may still
        #: be sent (asked for; its reply perhaps not read): the owner's count may drop then
        self._settling: dict[bytes, float] = {}
        #: by key: the releases and cancels of this owner's holds there not answered yet (and
        #: not given up on): see :meth:`unsettled`
        self._unsettled: dict[bytes, dict[int, float]] = {}
        self._tokens = itertools.count(1)  # next() is atomic under the GIL

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

    def sent(self, key: bytes, rid: bytes, until: float) -> None:
        """An acquire of ``key`` under request id ``rid`` sent a lease ending no earlier than
        ``until`` (recorded until it is granted, or that lease ended)."""
        if len(self._sent) > 256:  # requests never granted: forgotten once their lease ended
            now = time.monotonic()
            for r, (_, u) in list(self._sent.items()):
                if u < now:
                    self._sent.pop(r, None)
        old = self._sent.get(rid)
        self._sent[rid] = (key, until if old is None else min(old[1], until))

    def granted_until(self, rid: bytes) -> float:
        """The end of the shortest lease sent under ``rid`` (-inf: none recorded), forgotten:
        a grant under ``rid`` keeps the owner's one server hold at least that long, whatever
        the hold's own lease (a lease sent is never shorter than what the owner's other holds
        were promised, or than a pending acquire's)."""
        return self._sent.pop(rid, (b"", float("-inf")))[1]

    def tracked(self, key: bytes) -> list[Hold]:
        """Every hold of this owner on ``key`` still referenced (lost and released ones too)."""
        refs = self._holds.get(key)
        holds = [] if refs is None else [ref() for ref in refs.copy().values()]
        return [h for h in holds if h is not None and not inherited(h)]

    def no_other_writer(self, key: bytes, rid: bytes) -> bool:
        """Whether no write hold of this owner on ``key`` is live and no acquire of it other
        than ``rid`` may be in flight (or granted unseen, or being cancelled): any write count
        of the owner on the server is then one of its lost holds'."""
        return self.no_other_count(key, "write", rid)

    def no_other_count(self, key: bytes, kind: str, rid: bytes) -> bool:
        """As :meth:`no_other_writer`, for the owner's counts of ``kind`` (a lock's, a write's)."""
        if any(h.spec.kind == kind for h in self._live(key)):
            return False
        now = time.monotonic()
        return not any(k == key and u >= now and r != rid for r, (k, u) in self._sent.items())

    def settling(self, key: bytes) -> None:
        """A release or cancel of one of this owner's holds of ``key`` was asked for: it may
        reach the server any time while it is sent again (at most the request record's life)."""
        until = time.monotonic() + REQUEST_RECORD_S
        self._settling[key] = max(self._settling.get(key, until), until)

    def settle(self, key: bytes, within: float) -> Callable[..., None]:
        """A release or cancel of one of this owner's holds of ``key`` is about to be sent
        (again and again until answered, or given up on, within ``within`` seconds): returns
        what ends it (idempotent; any arguments ignored), called once it was answered or given
        up on. Past ``within`` it counts as ended whatever happened (a job never run)."""
        token = next(self._tokens)
        self._unsettled.setdefault(key, {})[token] = time.monotonic() + within

        def ended(*_: object) -> None:
            found = self._unsettled.get(key)
            if found is not None:
                found.pop(token, None)

        return ended

    def unsettled(self, key: bytes) -> bool:
        """Whether a release or cancel of one of this owner's holds of ``key`` may still reach
        the server: sent, neither answered nor given up on. The owner's holds of a key are one
        count in one field, which no command tells apart: such a command, run after the
        owner's server hold there ended (its lease over, its count at 0) and a new one began,
        would give back a count of the new hold (the key deleted under it). Once answered,
        its copies change nothing (its request id: the release or the cancel is recorded);
        given up on, a cancel's record has expired (see ``_core.cancelling``) and a release's
        copies were sent for as long as the server remembers one that landed. An Owner's
        acquire of the key waits for none of them to be left (``_core.Acquiring.settle_by``)."""
        found = self._unsettled.get(key)
        if not found:
            return False
        now = time.monotonic()
        for token, until in list(found.items()):
            if until < now:
                found.pop(token, None)
        return bool(found)

    def quiet(self, key: bytes, kind: str, rid: bytes) -> bool:
        """:meth:`no_other_count`, and no release or cancel of the owner's holds of ``key``
        may be under way: the owner's count there then changes only by what this client does
        next (a read of it is exact)."""
        if self._settling.get(key, float("-inf")) >= time.monotonic():
            return False
        return self.no_other_count(key, kind, rid)

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
