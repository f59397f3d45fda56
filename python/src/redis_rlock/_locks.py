"""What a lock object is, sync or asyncio, without I/O: its options, the owner id and the
acquire command of its next hold, the read-write rules of one owner across the two sides, and
what its caller reads of the current hold. ``lock`` (per thread) and ``aio.lock`` (per task)
keep the holds and talk to their engine."""

from __future__ import annotations

import time
import weakref
from typing import Any, Generic, Optional, TypeVar

from redis.exceptions import ResponseError

from . import _proto as P
from ._fork import inherited
from ._hold import Hold, LostCallback
from .errors import NotHeld, SessionClosed, UpgradeRefused, translate

#: ``acquire``'s ``lease`` when not given: the lock's own
DEFAULT: Any = object()

H = TypeVar("H", bound=Hold)


class LockCore(Generic[H]):
    """What every lock side shares, sync or asyncio: options, owner ids, the acquire's spec,
    and the reads of the caller's hold. ``_who`` names the party a hold belongs to (a thread,
    a task); ``_engine`` makes the engine of a client; ``_start`` sets up the holds' store."""

    _kind = P.LOCK
    _who = "thread"
    #: the session its holds are bound to (set by ``Session.lock`` / ``Session.rw_lock``)
    _session: Any = None
    #: the owner every hold is stored under (set by ``Owner.lock`` / ``Owner.rw_lock``);
    #: None: an owner id of its own per hold
    _owner_id: Any = None

    def __init__(
        self,
        client: Any,
        name: P.Name,
        *,
        lease: Optional[float] = None,
        blocking: bool = True,
        timeout: float = -1,
        fencing: bool = False,
        on_lost: Optional[LostCallback] = None,
        watchdog_timeout: float = 30.0,
        response_timeout: float = 2.0,
    ) -> None:
        self.name = P.name_bytes(name, client)
        self._be = self._engine(client, response_timeout)
        self._lease_ms = None if lease is None else P.to_ms(lease, "lease")
        self._watchdog_ms = P.watchdog_ms(watchdog_timeout)
        P.wait_budget(blocking, timeout)
        self._blocking, self._timeout = blocking, timeout
        self._fencing = fencing
        self._on_lost = on_lost
        self._start()

    def _engine(self, client: Any, response_timeout: float) -> Any:
        raise NotImplementedError

    def _start(self) -> None:
        """Sets up where this object keeps its holds."""

    def _current(self) -> Optional[H]:
        """The caller's live hold of this object (a done or inherited one is dropped)."""
        raise NotImplementedError

    def _other_side(self) -> Optional[H]:
        """A read-write side's: the caller's live hold of the other side (None: none, or not
        a side)."""
        return None

    # -- the next acquire ------------------------------------------------------------------
    def _lease_of(self, lease: Any) -> Optional[int]:
        """``acquire``'s ``lease`` in ms (None: no lease, a watchdog renews the hold)."""
        if lease is DEFAULT:
            return self._lease_ms
        return None if lease is None else P.to_ms(lease, "lease")

    def _open_session(self) -> Any:
        """The session the next hold is bound to (None: none); raises
        :class:`SessionClosed` once it closed."""
        session = self._session
        if session is not None and session.closed.is_set():
            raise SessionClosed("the session is closed", lock_name=self._lock_name())
        return session

    def _spec(self, lease_ms: Optional[int], session: Any) -> P.Spec:
        """The acquire of a new hold (``lease_ms`` None: the watchdog's period)."""
        return P.Spec(
            self._kind,
            self.name,
            owner=self._owner(),
            lease_ms=lease_ms or self._watchdog_ms,
            token=self._fencing and self._kind != P.READ,
            session=session is not None,
            lock_delay_ms=0 if session is None else session.lock_delay_ms,
            peers=None if self._owner_id is None else self._owner_id.peers,
            under=self._under(),
        )

    def _owner(self) -> bytes:
        """The owner id of the next hold. Per caller, the two sides of a read-write lock act
        as one Redisson thread: holding write, a read re-enters under the write's id (the
        server grants it at once); holding read, a write is refused as an upgrade."""
        other = self._other_side()
        if self._kind == P.WRITE and other is not None:
            raise UpgradeRefused(
                f"upgrade refused: this {self._who} holds the read side; release it first",
                lock_name=self._lock_name(),
            )
        if self._kind == P.READ and other is not None:
            return other.spec.owner  # write -> read re-entry: the server grants it at once
        if self._owner_id is not None:
            return bytes(self._owner_id.id)
        return bytes(self._be.new_owner())

    def _under(self) -> Optional[weakref.ref[H]]:
        """The write hold a read acquire re-enters under the same owner id: the read hold
        keeps the key, so the write hold's field, as long as the write is confirmed (an
        Owner's find it in its peers)."""
        other = self._other_side() if self._kind == P.READ else None
        return None if other is None else weakref.ref(other)

    # -- what the caller reads ---------------------------------------------------------------
    def owned(self) -> bool:
        """Whether the caller holds it (a live hold of its own)."""
        hold = self._current()
        return hold is not None and not hold.is_lost()

    @property
    def hold(self) -> H:
        """The caller's hold (raises :class:`NotHeld` if none)."""
        hold = self._current()
        if hold is None:
            raise self._not_held()
        return hold

    def _releasing(self) -> Optional[H]:
        """``release``'s first step: the caller's hold when it is down to its last count (the
        engine releases it on the server); else None, one count dropped here. Raises
        :class:`NotHeld` when the caller holds nothing, :class:`LockLost` (nothing dropped)
        when a re-entered hold was lost."""
        hold = self._current()
        if hold is None:
            raise self._not_held()
        if hold.count > 1:
            hold.check()
            hold.count -= 1
            return None
        return hold

    def _not_held(self) -> NotHeld:
        return NotHeld(f"this {self._who} does not hold the lock", lock_name=self._lock_name())

    def check(self) -> None:
        """Raises :class:`LockLost` if the caller's hold was lost, :class:`NotHeld` if none."""
        self.hold.check()

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the caller's hold (``fencing=True``), else None."""
        return self.hold.token

    def _lock_name(self) -> str:
        return self.name.decode(errors="replace")


def live(hold: Optional[H]) -> Optional[H]:
    """``hold`` unless it is done, lost or another process's."""
    if hold is None or hold.done or inherited(hold) or hold.is_lost():
        return None
    return hold


def other_reads(hold: Hold) -> bool:
    """A read hold of an Owner whose other live read holds share its key: before its last
    count is released, every lease key of the owner's reads is renewed as long as the longest
    promise (the server drops the owner's last read lease key, not necessarily this hold's)."""
    peers = hold.spec.peers
    return hold.spec.kind == P.READ and peers is not None and bool(peers.other_reads(hold))


def read_keys_until(hold: Hold, rt: float) -> float:
    """Until when that renewal (:func:`other_reads`) is tried."""
    return min(hold.deadline, time.monotonic() + rt)


def read_keys_refused(e: ResponseError, until: float, backoff: float, name: str) -> float:
    """That renewal was refused with ``e``: how long to wait before asking again
    (``NOREPLICAS``: an old master after a failover, the connection dropped, so asked again a
    Sentinel client reaches the new one; or a master without its replicas), else the
    package's error (raised: nothing was released, the hold stays the caller's)."""
    left = until - time.monotonic()
    if not P.is_noreplicas(e) or left <= 0:
        raise translate(e, name) from None
    return min(backoff, left)
