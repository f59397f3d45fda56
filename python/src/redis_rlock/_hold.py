"""A hold: exactly one server grant, with one deadline, and its loss signal (sync and asyncio)."""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Optional

from . import _proto as P
from ._conn import log
from ._flag import Flag
from ._fork import current_pid
from ._ledger import Ledger
from ._proto import Spec
from .errors import LockLost

LostCallback = Callable[["Hold"], Any]


class Hold:
    """One grant of the server: a lock hold, one side of a read-write lock, or permits.

    Its deadline is on this process's monotonic clock: the moment the grant was asked for plus
    its lease, pushed later only by renewals (or re-entries) the server confirmed, each counted
    from when it was sent. The server's lease cannot end earlier. Once that moment passes
    without a confirmation, or a renewal finds the hold gone, the hold is *lost*.
    """

    def __init__(
        self,
        spec: Spec,
        rid: bytes,
        sent_at: float,
        lease_ms: int,
        watchdog: bool,
        token: Optional[int],
        ids: Optional[list[bytes]],
        on_lost: Optional[LostCallback],
    ) -> None:
        self.spec = spec
        self.rid = rid
        self.sent_at = sent_at
        self.lease_ms = lease_ms
        self.watchdog = watchdog
        self._token = token
        self._ids = ids
        self._on_lost = on_lost
        self.pid = current_pid()
        #: when this client learnt of the grant (its reply read): ``kept_by_cancel`` keeps only
        #: holds already granted when a cancel was sent
        self.granted_at = time.monotonic()
        self.count = 1
        self.done = False
        self.deadline = sent_at + lease_ms / 1000.0 if lease_ms else float("inf")
        #: the lease-setting commands of its server hold: an Owner's on this key are one
        #: (``Peers.ledger``), a read taken under the write of its owner shares the write's
        self.ledger = Ledger()
        under = spec.under() if spec.under is not None else None
        if spec.peers is not None:
            self.ledger = spec.peers.ledger(spec.key)
        elif under is not None:
            self.ledger = under.ledger
        if lease_ms and not spec.gt:
            # a renewal of the server hold sent before this grant and still unanswered may run
            # after it and set its own (shorter) end (never with GT, which locks send)
            self.deadline = min(self.deadline, max(sent_at, self.ledger.in_flight_until()))
        if spec.peers is not None:
            # one server hold with the owner's other live holds of this key: it lasts as long
            # as the longest of them was confirmed (no lease sent for it is ever shorter)
            self.deadline = max(self.deadline, spec.peers.confirmed_until(spec.key))
            # the grant set the key's expiry to the lease sent, which may be longer than this
            # hold's own (see ``Peers.granted_until``): valid as long, and needing nobody's
            # cancel to say so (``kept_by_cancel`` extends no hold sent after the cancelled one)
            if self.deadline != float("inf"):
                self.deadline = max(self.deadline, spec.peers.granted_until(rid))
        #: the latest end a lease sent for this hold may give it (a renewal in flight included)
        self.promised = self.deadline
        self._lost = Flag()  # set by the watchdog, waited for by the caller: no shared lock
        # no lock the watchdog shares with the caller's threads (a KeyboardInterrupt may leave
        # one held): the loss's callback is claimed once through ``dict.setdefault`` (atomic)
        self._claims: dict[str, object] = {}
        # guards only short max() updates of ``deadline``/``promised`` with no wait inside: a
        # ``with`` on a C lock releases it whatever exception lands (CPython checks for signals
        # neither inside the lock's C code nor between ``__enter__`` and the protected block)
        self._mutex = threading.Lock()
        self.engine: Any = None  # set by the engine that granted it
        if spec.peers is not None:
            spec.peers.track(self)
        self._release_args: Optional[list[P.Arg]] = None
        self._settled = False
        self._keep_kin(self.deadline)  # a grant: the key lives at least that long

    @property
    def settled(self) -> bool:
        """Whether anything that gives this grant back was asked for (its release, with its
        fixed request id; the cancel of its request): ``stale_writes`` never sends another."""
        return self._settled

    @settled.setter
    def settled(self, value: bool) -> None:
        if value and self.spec.peers is not None:
            self.spec.peers.settling(self.spec.key)  # the owner's count there may drop now
        self._settled = value

    def release_args(self) -> list[P.Arg]:
        """The release command of this hold, the same every time it is asked for (its request
        id is fixed), so that sending it again, after an interrupt or a lost reply, is never a
        second release: a lock's ``REQUEST`` release, leased permits' ids, counted permits'
        ``RSEM.RELEASE key n REQUEST <the acquire's id>``."""
        self.settled = True
        args = self._release_args
        if args is None:
            if self.spec.kind == P.COUNTED:
                args = ["RSEM.RELEASE", self.spec.key, self.spec.permits, "REQUEST", self.rid]
            else:
                args = self.spec.release(P.new_id(), self._ids)
            self._release_args = args
        return args

    def release(self) -> None:
        """Gives the grant back now (whatever re-entry count a lock object keeps)."""
        self.engine.release(self)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.done:
            self.release()

    # -- what a caller reads -------------------------------------------------------------
    @property
    def name(self) -> bytes:
        """The lock's (or semaphore's) key."""
        return self.spec.key

    @property
    def owner(self) -> bytes:
        """The owner id the server stores for this hold (b"" for permits)."""
        return self.spec.owner

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the grant (None unless taken with ``fencing=True``)."""
        return self._token

    @property
    def ids(self) -> list[bytes]:
        """Leased permits' ids (empty for other kinds)."""
        return list(self._ids or [])

    @property
    def permits(self) -> int:
        """How many permits the grant holds (1 for locks)."""
        return self.spec.permits

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` value until which the hold is known valid (inf: no lease)."""
        return self.deadline

    @property
    def lost(self) -> LossSignal:
        """Event-like loss signal: ``is_set()``, ``wait(timeout)``."""
        return LossSignal(self)

    def is_lost(self) -> bool:
        """True once the hold is lost (its deadline passed unconfirmed, or found gone)."""
        if self._lost.is_set():
            return True
        if not self.done and time.monotonic() >= self.deadline:
            self.mark_lost()
            return True
        return False

    def check(self) -> None:
        """Raises :class:`LockLost` when the hold is lost; nothing otherwise."""
        if self.is_lost():
            raise self.lost_error()

    def lost_error(self) -> LockLost:
        """The :class:`LockLost` a lost hold's check or release raises."""
        return LockLost(
            "the hold ended before its release (lease over, or the lock was taken away)",
            lock_name=self.spec.key.decode(errors="replace"),
        )

    # -- engine side ----------------------------------------------------------------------
    def renewal(self, ticket: int, lease_ms: int, sent_at: float) -> tuple[int, float]:
        """The lease a renewal sent at ``sent_at`` asks for, and the end its confirmation
        proves. The lease is ``lease_ms``, or longer when this hold, one of the owner's other
        live holds of this key, or any command sent for its server hold before (its ledger)
        was promised more (the renewal sets the lease of all of them: a watchdog's period, or a
        re-entry with a shorter lease, must not end what a longer re-entry promised); recorded
        as promised before it is sent. What a confirmation proves is capped by the commands
        for the hold in flight now (:class:`~._ledger.Ledger`); ``ticket``: from
        ``self.ledger.ticket()``, given back with ``self.ledger.done`` whatever happens."""
        if self.promised != float("inf"):
            lease_ms = max(lease_ms, math.ceil((self.promised - sent_at) * 1000))
        if self.spec.peers is not None:
            lease_ms = max(lease_ms, self.spec.peers.floor_ms(self.spec.key, sent_at))
        lease_ms, confirms = self.ledger.send(ticket, sent_at, lease_ms, self.spec.gt)
        with self._mutex:
            self.promised = max(self.promised, sent_at + lease_ms / 1000.0)
        return lease_ms, confirms

    def extend(self, until: float) -> None:
        """A renewal was confirmed: the server holds the hold at least until ``until``."""
        with self._mutex:
            if not self._lost.is_set():
                self.deadline = max(self.deadline, until)
        self._keep_kin(until)  # the server confirmed the owner's hold: the key lives so long

    def reset(self, sent_at: float, lease_ms: int) -> None:
        """An exact lease ``lease_ms`` sent at ``sent_at`` was confirmed (it may shorten the
        hold: the drop-in's ``extend(..., replace_ttl=True)``, the user's explicit ask)."""
        until = sent_at + lease_ms / 1000.0
        with self._mutex:
            self.lease_ms = lease_ms
            self.deadline = until
            self.promised = until
        self.ledger.reset(until)

    # -- an owner's holds of one key: one server hold ---------------------------------------
    # A lock hold and a read-write lock's write hold have no lease of their own on the server:
    # the owner's field lives as long as the key, and every hold of that owner on the key
    # (a nested hold with a longer lease, a read hold taken under the write, a watchdog's)
    # keeps the key as long as its confirmed lease (an acquire or renewal sets the key's
    # expiry to at least its lease; a read release never shortens it while a writer holds).
    # So such a hold is valid as long as any hold of its owner on the key is confirmed:
    # counted lost at its own lease's end instead, it would send no release (a hold known
    # lost is mute), and its count would stay on the server, held by nobody, as long as the
    # other hold kept the key (a watchdog read under a write: for good).

    def _keep_kin(self, until: float) -> None:
        """This hold was confirmed until ``until``: so is the key, and with it every hold of
        its owner on that key whose field lives as long as the key."""
        keep_kin(self.spec, until, self)

    def outlast(self, until: float) -> None:
        """The server keeps this hold's key until ``until`` (another hold of its owner on the
        key was confirmed until then): a lock or write hold still confirmed now (so its field
        was on the server when that hold's command ran, and stays as long as the key) is valid
        until then too, and no lease sent for the key from now on is shorter."""
        if self.spec.kind not in (P.LOCK, P.WRITE):
            return
        with self._mutex:
            if self._lost.is_set() or self.done or time.monotonic() >= self.deadline:
                return
            self.deadline = max(self.deadline, until)
            self.promised = max(self.promised, until)

    def mark_lost(self) -> None:
        """Sets the loss signal (once) and calls the callback, if any."""
        if self._lost.is_set() or self.done:
            return
        self._lost.set()  # first: whatever lands next, the hold reads lost
        me = object()
        if self._claims.setdefault("lost", me) is not me:
            return  # another thread calls the callback
        cb = self._on_lost
        if cb is not None:
            try:
                cb(self)
            except Exception:
                log.exception("redis_rlock: on_lost callback raised")
        self.on_lost_hook()

    def on_lost_hook(self) -> None:
        """Overridden by asyncio holds (they also set an asyncio.Event)."""

    def wait_lost(self, timeout: Optional[float]) -> bool:
        """Blocks until lost or ``timeout`` seconds; returns whether lost."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            over, step = self.lost_wait_step(end)
            if over is not None:
                return over
            self._lost.wait(step)

    def lost_wait_step(self, end: Optional[float]) -> tuple[Optional[bool], Optional[float]]:
        """One step of a wait for the loss until ``end`` (monotonic; None: no limit), sync or
        asyncio: (True, None) once lost, (False, None) once ``end`` passed, else (None, how
        long to wait for the loss signal before the next step: at most until the deadline,
        where the hold is lost unless renewed; None: no limit)."""
        if self.is_lost():
            return True, None
        now = time.monotonic()
        step = self.deadline - now
        if end is not None:
            step = min(step, end - now)
            if step <= 0:
                return False, None
        return None, None if step == float("inf") else max(step, 0.0)

    def __repr__(self) -> str:
        state = "lost" if self._lost.is_set() else "released" if self.done else "held"
        return f"<Hold {self.spec.kind} {self.spec.key!r} {state} count={self.count}>"


def keep_kin(
    spec: Spec,
    until: float,
    skip: Optional[Hold] = None,
    sent_by: float = float("inf"),
    granted_by: float = float("inf"),
) -> None:
    """A hold of ``spec``'s owner on its key was confirmed until ``until`` (so the key lives
    that long): the owner's lock and write holds on that key still confirmed (an Owner's
    peers, or the write hold a plain read-write lock's read was taken under: ``spec.under``)
    are valid until then too (:meth:`Hold.outlast`); only those whose acquire was sent by
    ``sent_by`` and whose grant this client knew of by ``granted_by``."""
    kin: list[Optional[Hold]] = []
    if spec.peers is not None:
        kin.extend(spec.peers.holds(spec.key))
    kin.append(spec.under() if spec.under is not None else None)
    for h in kin:
        if h is None or h is skip or h.owner != spec.owner or h.spec.key != spec.key:
            continue
        if h.sent_at <= sent_by and h.granted_at <= granted_by:
            h.outlast(until)


def kept_by_cancel(spec: Spec, t0: float, reply: Any, asked_at: float = float("inf")) -> None:
    """``RLOCK.CANCEL`` of an acquire of ``spec`` sent from ``t0`` on, the cancel asked for at
    ``asked_at`` (before it was first sent), replied ``reply``: 2 says the acquire had been
    granted (and was given back now). Its grant set the key's expiry to at least its lease,
    which giving it back never shortens while the owner holds the key otherwise (a write or
    lock count's release leaves the expiry, a read release never shortens a writer's): so the
    owner's other holds there that are still confirmed are valid that long, and their guards
    still release them (not told lost at their own end).

    Only holds that were on the server before that grant was given back, on the terms it
    extends: their acquire sent at or before ``t0`` (one sent later was granted on its own
    terms) and their grant known here before the cancel was sent (a grant read after that may
    have been made after the cancel gave the key's last count back and deleted it: a fresh
    key, with that grant's own lease)."""
    if reply == 2 and spec.kind in (P.LOCK, P.READ, P.WRITE) and spec.lease_ms:
        keep_kin(spec, t0 + spec.lease_ms / 1000.0, sent_by=t0, granted_by=asked_at)


def stale_writes(spec: Spec, rid: bytes) -> list[Hold]:
    """A read acquire of ``spec`` (request ``rid``) was granted: the write holds of its owner
    on its key that are lost now, their release never sent, whose write count that grant may
    have kept on the server (the server's lease of a write ends later than its guard's
    deadline, by up to the time its command took to get there: a read sent even after the
    guard's deadline may find the field).

    A read under the owner's own write, reaching the server before the write's lease ended,
    sets the key's expiry to the read's lease, and the write's field lives as long as the key;
    its reply, read after the write guard declared itself lost (its deadline passed: the guard
    cannot know), does not tell that from a read granted on an expired key. The guard stays
    lost (it may have said so already), and its write count, if still there, is held by
    nobody: each hold returned is claimed here (once) for its release, which the caller sends
    (``RWLOCK.RELEASE ... WRITE``: nil when the field had gone). Exact only when no other
    write count of the owner can be there: a plain read-write lock's write has an owner id of
    its own; an Owner's, only while it has no other live write hold there and no other
    acquire of the key in flight (``Peers.no_other_writer``; else nothing is returned and the
    count ends with the key's expiry, never taken from a newer hold)."""
    if spec.kind != P.READ:
        return []
    kin: list[Optional[Hold]] = []
    if spec.peers is not None:
        kin.extend(spec.peers.tracked(spec.key))
    kin.append(spec.under() if spec.under is not None else None)
    stale: list[Hold] = []
    for h in kin:
        if h is None or h in stale or h.spec.kind != P.WRITE or h.owner != spec.owner:
            continue
        if h.spec.key != spec.key or h.settled or not h.is_lost():
            continue
        stale.append(h)
    if not stale or (spec.peers is not None and not spec.peers.no_other_writer(spec.key, rid)):
        return []
    me = object()
    return [h for h in stale if h._claims.setdefault("stale", me) is me]


def late_renewal(hold: Hold) -> list[Hold]:
    """A renewal of ``hold`` (watchdog, re-entry) was confirmed ("1", after
    :meth:`Hold.extend`): if the guard was declared lost meanwhile (the renewal sent before its
    deadline, its reply read after), the guard stays lost (it may have said so already: its
    release sends nothing), and the server holds its count for the renewal's lease, held by
    nobody. Returns ``[hold]``, claimed here (once, as ``stale_writes`` claims), for its own
    idempotent release (its fixed request id: nil when the field had gone), which the caller
    sends in the background; ``[]`` when there is nothing to do or it would not be exact.

    A lock's or write's count only (a read's lease keys are the owner's, shared). Exact only
    when no other count of that kind of the owner can be there: a plain lock's and a plain
    read-write lock's write have an owner id of their own; an Owner's, only while it has no
    other live hold of that kind on the key, no other acquire of it in flight and no release
    or cancel of its holds there under way (``Peers.quiet``: the "1" may have confirmed a newer
    hold's field, its release still on the way; else the count ends with the key's expiry,
    never taken from a newer hold)."""
    spec = hold.spec
    if spec.kind not in (P.LOCK, P.WRITE) or not hold._lost.is_set() or hold.settled:
        return []
    if spec.peers is not None and not spec.peers.quiet(spec.key, spec.kind, hold.rid):
        return []
    me = object()
    return [hold] if hold._claims.setdefault("stale", me) is me else []


def taken_over(spec: Spec, rid: bytes) -> list[Hold]:
    """An Owner's lock or write acquire of ``spec`` (request ``rid``) was granted: the lost
    holds of that kind of the owner on its key, their release never sent, whose count the
    grant may have found on the server (sent before their server lease ended, its reply read
    after their guard declared itself lost: a re-entry, count + 1, that the reply does not tell
    from a fresh grant). They share one field with the new grant, so a blind release is not
    exact: each returned hold is claimed (once), and the caller reads the owner's count right
    after the grant and releases as many of them as the count exceeds 1 (their own idempotent
    releases). Only while nothing else can change that count (``Peers.quiet``: no other live
    hold of the kind, no other acquire in flight, no release or cancel of the owner's holds
    there under way); else ``[]`` and the count ends with the key's expiry."""
    peers = spec.peers
    if peers is None or spec.kind not in (P.LOCK, P.WRITE):
        return []
    stale = [
        h
        for h in peers.tracked(spec.key)
        if h.spec.kind == spec.kind and h.owner == spec.owner and not h.settled and h.is_lost()
    ]
    if not stale or not peers.quiet(spec.key, spec.kind, rid):
        return []
    me = object()
    return [h for h in stale if h._claims.setdefault("stale", me) is me]


def count_field(spec: Spec) -> bytes:
    """The field of the lock key that holds the owner's count of ``spec``'s kind."""
    return spec.owner + b":write" if spec.kind == P.WRITE else spec.owner


def stale_present(spec: Spec, rid: bytes, stale: list[Hold], count: Any) -> list[Hold]:
    """Of the lost holds ``taken_over`` claimed, as many as the owner's count read right after
    the grant exceeds that grant's 1 (none when the read is not exact any more)."""
    if spec.peers is None or not spec.peers.quiet(spec.key, spec.kind, rid):
        return []
    try:
        n = int(count) - 1 if count is not None else 0
    except (TypeError, ValueError):
        return []
    return stale[: max(0, n)]


class LossView:
    """What the sync and asyncio loss signals share: ``is_set()``, truth."""

    __slots__ = ("_hold",)

    def __init__(self, hold: Hold) -> None:
        self._hold = hold

    def is_set(self) -> bool:
        """True once the hold is lost."""
        return self._hold.is_lost()

    def __bool__(self) -> bool:
        return self.is_set()


class LossSignal(LossView):
    """Event-like view of a hold's loss (``threading.Event``'s ``is_set``/``wait``)."""

    __slots__ = ()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the hold is lost (True) or ``timeout`` seconds passed (False)."""
        return self._hold.wait_lost(timeout)
