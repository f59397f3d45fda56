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
network, a host gone): the answer is used, the silent connection dropped."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Optional

#: A lasting wait is checked every this many response timeouts (at least 1 s): well within
#: the 60 s a counted grant's request record lives.
PROBE_RT = 5.0
#: How long a gate lowered at ``maxclients`` waits before it lets one more connection try.
REGROW_S = 1.0


def probe_every(rt: float) -> float:
    """Seconds between two checks of a lasting wait (``rt``: the response timeout)."""
    return max(1.0, PROBE_RT * rt)


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
        for c in list(getattr(pool, "_available_connections", [])):
            if id(c) not in before and _open(c):
                c.disconnect()
        raise


def _open(conn: Any) -> bool:
    return bool(getattr(conn, "is_connected", False))


class Gate:
    """FIFO admission of waits to at most ``cap`` connections (sync).

    No lock: a KeyboardInterrupt landing in a caller's thread right after it took one (in
    ``threading.Condition.__enter__``, outside the ``with`` that releases it) would leave it
    held, and every later wait of every thread blocked for good. The line is a deque, the
    slots a set, each changed in one atomic step; only the head of the line takes a slot. A
    waiter sleeps on a lock of its own, which every change of the line or the slots releases
    (and at most :data:`REGROW_S` in any case)."""

    def __init__(self, cap: int) -> None:
        self.full_cap = self.cap = max(1, cap)
        self._in: set[object] = set()
        self._shrunk_at = 0.0
        self._queue: deque[object] = deque()
        self._sleepers: dict[threading.Lock, None] = {}

    def enter(
        self, until: Optional[float], front: bool = False, out: Optional[list[object]] = None
    ) -> Optional[object]:
        """Waits for a connection slot until ``until`` (monotonic; None: no limit); returns a
        ticket (None: none before ``until``) which stays first in line until :meth:`sent`
        (the next wait is sent after this one, never before), and is given to :meth:`leave`.
        The ticket is put in ``out`` before anything else: a caller interrupted anywhere
        (a signal after this call returned, before its result was stored) still finds it there
        and leaves with it, so no slot and no place in line is ever kept by nobody."""
        me = object()
        if out is not None:
            out.append(me)
        (self._queue.appendleft if front else self._queue.append)(me)
        sleeper = threading.Lock()
        sleeper.acquire()
        self._sleepers[sleeper] = None  # before the line is read: a change from now on wakes it
        try:
            while True:
                if self._queue[0] is me and len(self._in) < self._regrown():
                    self._in.add(me)  # one step: admitted (leave() gives the slot back)
                    return me
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    return None
                sleeper.acquire(timeout=REGROW_S if left is None else min(left, REGROW_S))
        finally:
            self._sleepers.pop(sleeper, None)
            if me not in self._in:
                self._drop(me)
                self._wake()

    def _drop(self, ticket: object) -> None:
        try:
            self._queue.remove(ticket)
        except ValueError:
            pass  # not in line (any more)

    def _wake(self) -> None:
        for sleeper in self._sleepers.copy():
            try:
                sleeper.release()
            except RuntimeError:
                pass  # woken already

    def sent(self, ticket: object) -> None:
        """The wait of ``ticket`` was sent: the next in line may go."""
        self._drop(ticket)
        self._wake()

    def leave(self, ticket: object) -> None:
        """Gives back ``ticket``'s slot and place in line, whichever it has (idempotent)."""
        self._drop(ticket)
        self._in.discard(ticket)
        self._wake()

    @property
    def busy(self) -> int:
        return len(self._in)

    def _regrown(self) -> int:
        if self.cap < self.full_cap and time.monotonic() - self._shrunk_at >= REGROW_S:
            self._shrunk_at = time.monotonic()
            self.cap = min(self.full_cap, self.cap + 1)
        return self.cap

    def lower(self) -> bool:
        """Called by a slot holder the server refused a connection: lowers the cap to the
        other holders' connections; False when there are none (nobody to wait for)."""
        busy = len(self._in)
        if busy <= 1:
            return False
        self.cap = busy - 1
        self._shrunk_at = time.monotonic()
        return True


class AsyncGate:
    """:class:`Gate` for asyncio (one event loop)."""

    def __init__(self, cap: int) -> None:
        self.full_cap = self.cap = max(1, cap)
        self.busy = 0
        self._shrunk_at = 0.0
        self._queue: deque[asyncio.Future[None]] = deque()

    async def enter(self, until: Optional[float], front: bool = False) -> bool:
        loop = asyncio.get_running_loop()
        me: asyncio.Future[None] = loop.create_future()
        (self._queue.appendleft if front else self._queue.append)(me)
        try:
            while self._queue[0] is not me or self.busy >= self._regrown():
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    return False
                step = REGROW_S if left is None else min(left, REGROW_S)
                try:
                    await asyncio.wait_for(asyncio.shield(me), step)
                except asyncio.TimeoutError:
                    pass
                me = self._renew(me, loop)
            self.busy += 1
            return True
        finally:
            self._queue.remove(me)
            self._wake()

    def _renew(self, fut: asyncio.Future[None], loop: Any) -> asyncio.Future[None]:
        if not fut.done():
            return fut
        new: asyncio.Future[None] = loop.create_future()
        self._queue[self._queue.index(fut)] = new
        return new

    def _wake(self) -> None:
        for f in self._queue:
            if not f.done():
                f.set_result(None)

    def _regrown(self) -> int:
        if self.cap < self.full_cap and time.monotonic() - self._shrunk_at >= REGROW_S:
            self.cap += 1
            self._shrunk_at = time.monotonic()
        return self.cap

    def leave(self) -> None:
        self.busy -= 1
        self._wake()

    def lower(self) -> bool:
        if self.busy <= 1:
            return False
        self.cap = self.busy - 1
        self._shrunk_at = time.monotonic()
        return True
