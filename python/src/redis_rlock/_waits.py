"""Server-side waits and the connections they pin (sync and asyncio).

A wait blocked in the server holds its connection until it is answered, so waits get
connections of their own: at most the user's pool cap (``max_connections``) at once per server,
admitted in arrival order (a gate); renewals, releases and cancels use a separate set, one
connection of which is opened before the first wait, so a holder's release always has a
connection even when waits have taken all the server allows (``maxclients``). A wait whose
connection is refused there (``max number of clients reached``) while other waits hold
connections lowers the gate to what the server gave, and takes the head of the queue again: it
is served as those waits end, in order; the gate grows back by one each second.

A wait that lasts is checked from another connection every :func:`probe_every` seconds by
sending its acquire again without ``WAIT`` under the same ``REQUEST`` id: ``already waiting``
means the server still queues it; any other answer (the grant, replayed; or nothing) while
its own connection brought no reply means that connection died without a word (a cut
network, a host gone): the answer is used, the silent connection dropped.

A wait that must queue for a connection (the line is full) is first tried, and then tried
again every :data:`TRY_FIRST_S` doubling up to :data:`TRY_MAX_S` while it stays queued, as its
acquire without ``WAIT`` under the same ``REQUEST`` id on a short-command connection: a free
lock or permit, or a re-entry of the owner's own hold, is granted at once, never behind waits
that only its caller's own release ends (the holder of ``a`` taking ``b`` while the line is full
of waits for ``a``). A try not granted records nothing (the wait is then sent with the same
id); a try whose answer was lost may have been granted under that id: the wait, sent later,
replays that grant, and an acquire that ends without one cancels the id. Order is kept: a
queued wait is tried only when no wait queued ahead of it is for the same key (a re-entry
excepted: the server grants it whoever waits), and the server itself lets no try jump the
waits it queues; at most :data:`TRIES_AT_ONCE` tries run at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Awaitable, Callable, Literal, Optional

from redis.exceptions import ResponseError

from . import _proto as P
from ._flag import Sleepers

#: A lasting wait is checked every this many response timeouts (at least 1 s): well within
#: the 60 s a counted grant's request record lives.
PROBE_RT = 5.0
#: How long a gate lowered at ``maxclients`` waits before it lets one more connection try.
REGROW_S = 1.0
#: A wait queued for a connection is tried (without ``WAIT``) as it queues, then after this
#: many seconds, doubling up to :data:`TRY_MAX_S`.
TRY_FIRST_S = 0.05
TRY_MAX_S = 1.0
#: At most this many tries of queued waits run at once per server (and never more than the
#: line's cap): each takes a short-command connection for a moment, so renewals, releases
#: and cancels still find one at once, or after a try's round trip at the server's
#: ``maxclients``.
TRIES_AT_ONCE = 2
#: What :meth:`Gate.enter` returns when a try was granted (the caller has the reply).
TRIED = object()


def line_key(spec: Any) -> Optional[bytes]:
    """The key whose earlier queued waits a queued wait lets go first (its tries wait until
    none is ahead); None for a re-entry (an owner's acquire of a key one of its holds holds,
    or a plain read-write lock's read under the thread's or task's write, ``spec.under``):
    the server grants it whoever waits, so it is tried at once."""
    peers = getattr(spec, "peers", None)
    if peers is not None and peers.holds(spec.key):
        return None
    under = getattr(spec, "under", None)
    write = None if under is None else under()
    if write is not None and not write.done and not write.is_lost():
        return None
    return bytes(spec.key)


def probe_every(rt: float) -> float:
    """Seconds between two checks of a lasting wait (``rt``: the response timeout)."""
    return max(1.0, PROBE_RT * rt)


def probe_answer(err: BaseException) -> Literal["waiting", "over", "unknown"]:
    """What an error answer to a wait's check (its acquire sent again without ``WAIT``, same
    ``REQUEST`` id, from another connection) says of the wait. A reply (granted, or not) says
    the server no longer queues it (the reply is the wait's answer). Of the errors:
    ``already waiting``: still queued ("waiting"); ``was cancelled``: the request holds nothing
    and never will, so the wait is not waiting any more and that is its answer ("over": the
    acquire asks again as a new request, as when the wait itself is told so); anything else
    (no reply, a transient error, ``NOPERM``, ``OOM``, ``NOREPLICAS``, ``WRONGTYPE``: refused
    before or without reading the request's state) says nothing of it ("unknown")."""
    if isinstance(err, ResponseError):
        if P.is_waiting_reply(err):
            return "waiting"
        if P.is_cancelled_reply(err):
            return "over"
    return "unknown"


def is_maxclients(err: BaseException) -> bool:
    """Whether ``err`` is the server refusing a new connection at its ``maxclients``."""
    return "max number of clients" in str(err)


def prefer_connected(pool: Any) -> None:
    """Puts a redis-py pool's open connections first in line: a connection whose connect was
    refused goes back to the pool unconnected, and would be connected again (refused again at
    ``maxclients``) before an open one is used. (An asyncio pool is used by one thread: no
    lock; nothing here awaits.)"""
    avail = getattr(pool, "_available_connections", None)
    if not avail or getattr(avail[-1], "is_connected", True):
        return
    lock = getattr(pool, "_lock", None)
    if isinstance(lock, asyncio.Lock) or lock is None:
        avail.sort(key=lambda c: bool(getattr(c, "is_connected", False)))
        return
    with lock:
        avail.sort(key=lambda c: bool(getattr(c, "is_connected", False)))


def get_connection(pool: Any) -> Any:
    """``pool.get_connection()``, except that a connection interrupted in its handshake
    (``KeyboardInterrupt`` in redis-py's ``on_connect``, which then keeps the socket, its
    handshake's replies unread, and puts it back in the pool) is disconnected: its next user
    would read those replies as its own."""
    before = {id(c) for c in list(getattr(pool, "_available_connections", [])) if _open(c)}
    try:
        return pool.get_connection()
    except BaseException:
        _drop_new(pool, before)
        raise


def _drop_new(pool: Any, before: set[int]) -> None:
    """Disconnects the open connections put back in ``pool`` since ``before`` was taken, each
    only while it is still idle there (under the pool's lock): one another thread took from the
    pool meanwhile is in use, never cut under its user."""
    avail = getattr(pool, "_available_connections", None)
    lock = getattr(pool, "_lock", None)
    if not avail or lock is None or isinstance(lock, asyncio.Lock):
        return
    with lock:
        for c in list(avail):
            if id(c) not in before and _open(c):
                c.disconnect()


def _open(conn: Any) -> bool:
    return bool(getattr(conn, "is_connected", False))


class _Ticket:
    """A wait's place in a gate's line (and then its slot), with its key."""

    __slots__ = ("fut", "key")

    def __init__(self, key: Optional[bytes], fut: Optional[asyncio.Future[None]] = None) -> None:
        self.key, self.fut = key, fut


def _first_of_key(queue: deque[_Ticket], me: _Ticket) -> bool:
    """Whether no ticket ahead of ``me`` in ``queue`` has its key (a None key: never held back)."""
    if me.key is None:
        return True
    for t in queue:
        if t is me:
            return True
        if t.key == me.key:
            return False
    return True


class Gate:
    """FIFO admission of waits to at most ``cap`` connections (sync)."""

    def __init__(self, cap: int) -> None:
        self.full_cap = self.cap = max(1, cap)
        self._in: set[object] = set()
        self._shrunk_at = 0.0
        self._queue: deque[_Ticket] = deque()
        self._trying: set[object] = set()
        # not a ``threading.Condition``: see ``_flag.Sleepers`` (a KeyboardInterrupt in its
        # ``__enter__`` would leave every waiting thread of the client blocked for good)
        self._mu = threading.RLock()
        self._wake = Sleepers()

    def enter(
        self,
        until: Optional[float],
        front: bool = False,
        out: Optional[list[object]] = None,
        key: Optional[bytes] = None,
        attempt: Optional[Callable[[], bool]] = None,
    ) -> Optional[object]:
        """Waits for a connection slot until ``until`` (monotonic; None: no limit); returns a
        ticket (None: none before ``until``) which stays first in line until :meth:`sent`
        (the next wait is sent after this one, never before), and is given to :meth:`leave`.
        The ticket is put in ``out`` before anything else: a caller interrupted anywhere
        (a signal after this call returned, before its result was stored) still finds it there
        and leaves with it, so no slot and no place in line is ever kept by nobody.

        While queued, ``attempt`` (the wait's acquire without ``WAIT``: True when granted) is
        called outside the gate's lock, at once and then at growing intervals, whenever no
        wait queued ahead has the same ``key`` (None: always) and fewer than
        :data:`TRIES_AT_ONCE` tries run; :data:`TRIED` is returned when one was granted."""
        me = _Ticket(key)
        if out is not None:
            out.append(me)
        try_at, step = time.monotonic(), TRY_FIRST_S
        try:
            with self._mu:
                (self._queue.appendleft if front else self._queue.append)(me)
            while True:
                with self._mu:
                    while True:
                        if self._queue[0] is me and len(self._in) < self._regrown():
                            self._in.add(me)  # one step: admitted (leave() gives the slot back)
                            return me
                        now = time.monotonic()
                        left = None if until is None else until - now
                        if left is not None and left <= 0:
                            return None
                        pause = REGROW_S if left is None else min(left, REGROW_S)
                        if attempt is not None and now < try_at:
                            pause = min(pause, try_at - now)
                        elif attempt is not None and self._may_try(me):
                            self._trying.add(me)
                            break
                        self._wake.wait(self._mu, pause)
                if attempt():
                    return TRIED
                with self._mu:
                    self._trying.discard(me)
                    self._wake.notify_all()
                try_at, step = time.monotonic() + step, min(2 * step, TRY_MAX_S)
        finally:
            with self._mu:
                self._trying.discard(me)
                if me not in self._in and me in self._queue:
                    self._queue.remove(me)
                self._wake.notify_all()

    def _may_try(self, me: _Ticket) -> bool:
        busy = len(self._trying) >= min(self.full_cap, TRIES_AT_ONCE)
        return not busy and _first_of_key(self._queue, me)

    def sent(self, ticket: object) -> None:
        """The wait of ``ticket`` was sent: the next in line may go."""
        with self._mu:
            if isinstance(ticket, _Ticket) and ticket in self._queue:
                self._queue.remove(ticket)
                self._wake.notify_all()

    def leave(self, ticket: object) -> None:
        """Gives back ``ticket``'s slot, place in line and try, whichever it has (idempotent)."""
        with self._mu:
            if isinstance(ticket, _Ticket) and ticket in self._queue:
                self._queue.remove(ticket)
            self._in.discard(ticket)
            self._trying.discard(ticket)
            self._wake.notify_all()

    @property
    def busy(self) -> int:
        return len(self._in)

    def _regrown(self) -> int:
        if self.cap < self.full_cap and time.monotonic() - self._shrunk_at >= REGROW_S:
            self.cap += 1
            self._shrunk_at = time.monotonic()
        return self.cap

    def lower(self) -> bool:
        """Called by a slot holder the server refused a connection: lowers the cap to the
        other holders' connections; False when there are none (nobody to wait for)."""
        with self._mu:
            if self.busy <= 1:
                return False
            self.cap = len(self._in) - 1
            self._shrunk_at = time.monotonic()
            return True


class AsyncGate:
    """:class:`Gate` for asyncio (one event loop)."""

    def __init__(self, cap: int) -> None:
        self.full_cap = self.cap = max(1, cap)
        self.busy = 0
        self._shrunk_at = 0.0
        self._queue: deque[_Ticket] = deque()
        #: admitted, their wait not sent yet: a later wait for the same key tries after it
        self._unsent: deque[_Ticket] = deque()
        self._trying = 0

    async def enter(
        self,
        until: Optional[float],
        front: bool = False,
        key: Optional[bytes] = None,
        attempt: Optional[Callable[[], Awaitable[bool]]] = None,
        out: Optional[list[_Ticket]] = None,
    ) -> Literal["admitted", "late", "tried"]:
        """As :meth:`Gate.enter`: ``"admitted"`` (a slot taken: :meth:`leave` gives it back;
        the ticket, put in ``out``, is given to :meth:`sent` once the wait was sent),
        ``"late"`` (none before ``until``) or ``"tried"`` (``attempt`` was granted)."""
        loop = asyncio.get_running_loop()
        me = _Ticket(key, loop.create_future())
        if out is not None:
            out.append(me)
        (self._queue.appendleft if front else self._queue.append)(me)
        try_at, step = time.monotonic(), TRY_FIRST_S
        try:
            while True:
                if self._queue[0] is me and self.busy < self._regrown():
                    self.busy += 1
                    self._unsent.append(me)
                    return "admitted"
                now = time.monotonic()
                left = None if until is None else until - now
                if left is not None and left <= 0:
                    return "late"
                pause = REGROW_S if left is None else min(left, REGROW_S)
                if attempt is not None and now < try_at:
                    pause = min(pause, try_at - now)
                elif attempt is not None and self._may_try(me):
                    self._trying += 1
                    try:
                        if await attempt():
                            return "tried"
                    finally:
                        self._trying -= 1
                        self._wake()
                    try_at, step = time.monotonic() + step, min(2 * step, TRY_MAX_S)
                    continue
                assert me.fut is not None
                try:
                    await asyncio.wait_for(asyncio.shield(me.fut), pause)
                except asyncio.TimeoutError:
                    pass
                if me.fut.done():
                    me.fut = loop.create_future()
        finally:
            self._queue.remove(me)
            self._wake()

    def _may_try(self, me: _Ticket) -> bool:
        busy = self._trying >= min(self.full_cap, TRIES_AT_ONCE)
        if busy or (me.key is not None and any(t.key == me.key for t in self._unsent)):
            return False
        return _first_of_key(self._queue, me)

    def _wake(self) -> None:
        for t in self._queue:
            if t.fut is not None and not t.fut.done():
                t.fut.set_result(None)

    def _regrown(self) -> int:
        if self.cap < self.full_cap and time.monotonic() - self._shrunk_at >= REGROW_S:
            self.cap += 1
            self._shrunk_at = time.monotonic()
        return self.cap

    def sent(self, ticket: _Ticket) -> None:
        """The admitted wait of ``ticket`` was sent: later waits for its key may be tried."""
        if ticket in self._unsent:
            self._unsent.remove(ticket)
            self._wake()

    def leave(self, ticket: Optional[_Ticket] = None) -> None:
        """Gives back an admitted wait's slot (and ``ticket``'s mark, if not sent)."""
        if ticket is not None and ticket in self._unsent:
            self._unsent.remove(ticket)
        self.busy -= 1
        self._wake()

    def lower(self) -> bool:
        if self.busy <= 1:
            return False
        self.cap = self.busy - 1
        self._shrunk_at = time.monotonic()
        return True
