"""The sync engine's two daemon threads per client: the watchdog (renewals, and holds
signalled lost at their deadline) and the releaser (idempotent cleanup commands sent in the
background until answered or their hold's lease would have ended)."""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol, TypeVar

from . import _proto as P
from ._conn import is_resendable, log
from ._core import renewal_failed, renewal_period
from ._flag import Flag, start_daemon
from ._fork import inherited
from ._hold import Hold


class Engine(Protocol):
    """What the threads need of the sync engine (``_sync.SyncBackend``)."""

    rt: float

    def renew(self, hold: Hold, lease_ms: int, until: Optional[float]) -> bool:
        """Renews ``hold``; True when the server confirmed."""

    def call_until(
        self,
        key: bytes,
        args: list[P.Arg],
        until: Optional[float],
        resend: Callable[[BaseException], bool] = ...,
    ) -> tuple[Any, int]:
        """An idempotent command, again after errors ``resend`` accepts, until ``until``."""

    def confirm_round(self, key: bytes, args: list[P.Arg], until: float) -> bool:
        """One round of making an answered counted give-back durable."""


#: How long a thread of the engine's stays with nothing to do before it ends (the next hold,
#: or the next cleanup command, starts another). A client nobody references any more, once
#: collected, takes its threads (and its connections) with it at once.
IDLE_S = 5.0


#: Set on the engine's own threads: they use connection pools of their own.
_BACKGROUND = threading.local()


def on_background_thread() -> bool:
    """Whether this thread is one of the package's own (a watchdog, a releaser, a session's
    watcher)."""
    return bool(getattr(_BACKGROUND, "on", False))


def mark_background() -> None:
    """Marks this thread as one of the package's own: its calls use pools of their own."""
    _BACKGROUND.on = True


# No lock here is ever taken by a caller's thread: a KeyboardInterrupt landing between a
# lock's acquire and its ``with`` block (CPython's ``with`` is not signal-safe there,
# bpo-29988) would leave it held, and freeze the thread that renews and releases. Callers
# hand work over through ``queue.SimpleQueue`` (its ``put`` is one C call) and plain dicts.


T = TypeVar("T")


def hand_over(put: Callable[[T], None], item: T, start: Callable[[], None]) -> None:
    """``put(item)`` (the thread's inbox), then ``start()`` (a thread to serve it unless one
    is alive), whatever interrupt lands: one landing before ``put`` ran raises with nothing
    handed over (as before the call); from then on a thread is started, tried again after an
    interrupt, which is raised once a thread runs (``_flag.start_daemon``). The loop is here,
    not in a function called from the ``finally``: a call's first opcode is a point where a
    signal's handler may run, outside the callee's ``try``."""
    try:
        put(item)
    finally:
        late: Optional[BaseException] = None
        while True:
            try:
                start()
                break
            except Exception:
                raise
            except BaseException as e:
                if late is not None:
                    raise
                late = e
        if late is not None:
            raise late


class Watchdog:
    """One daemon thread per client, while it has holds to watch: renews watchdog holds every
    third of their lease and signals holds lost at their deadline. It keeps holds only by weak
    reference: a hold nobody references any more is neither renewed nor released (its lease
    ends on the server). The thread keeps the watchdog (and its engine) only by weak reference
    too: a client that was collected leaves no thread behind."""

    def __init__(self, be: Engine) -> None:
        self._be = be
        self._inbox: queue.SimpleQueue[Optional[tuple[float, weakref.ref[Hold], float]]] = (
            queue.SimpleQueue()
        )
        self._thread: Optional[threading.Thread] = None
        # wakes the thread once the watchdog was collected (detached in a forked child)
        self.finalizer = weakref.finalize(self, self._inbox.put, None)

    def schedule(self, hold: Hold, when: Optional[float] = None, backoff: float = 0.0) -> None:
        """Looks at ``hold`` at ``when`` (default: a third of its lease, or its deadline)."""
        if when is None:
            if hold.watchdog:
                when = time.monotonic() + renewal_period(hold)
            elif hold.deadline == float("inf"):
                return
            else:
                when = hold.deadline
        hand_over(self._inbox.put, (when, weakref.ref(hold), backoff), self._run)

    def _run(self) -> None:
        """Starts the watchdog's thread unless one is alive."""
        _serve(self, _watch_loop, self._inbox, "redis-rlock-watchdog")

    def _tick(self, hold: Hold, backoff: float) -> None:
        now = time.monotonic()
        if hold.is_lost():
            return
        if not hold.watchdog:
            self.schedule(hold, hold.deadline)
            return
        try:
            ok = self._be.renew(hold, hold.lease_ms, min(hold.deadline, now + self._be.rt))
        except Exception as e:
            nxt = renewal_failed(hold, e, backoff)
            self.schedule(hold, min(time.monotonic() + nxt, hold.deadline), nxt)
            return
        if not ok:
            hold.mark_lost()
            return
        self.schedule(hold)


def _serve(owner: Any, loop: Callable[..., None], inbox: Any, name: str) -> None:
    """Starts ``owner``'s thread (a watchdog's, a releaser's: ``loop(ref, inbox)``, keeping
    ``owner`` only by weak reference) unless one is alive (run by :func:`hand_over`)."""
    t = owner._thread
    if t is None or not t.is_alive():
        owner._thread = start_daemon(loop, (weakref.ref(owner), inbox), name)


def _idle_end(ref: weakref.ref[Any], inbox: queue.SimpleQueue[Any]) -> bool:
    """A thread of the engine's found nothing to do for :data:`IDLE_S`: whether it ends (its
    watchdog or releaser, ``ref``, was collected, or nothing came meanwhile). From now on
    :func:`hand_over` starts another; work that came meanwhile is served by this one (another
    thread may serve it too: both are right)."""
    owner = ref()
    if owner is None:
        return True
    if owner._thread is threading.current_thread():
        owner._thread = None
    del owner
    return inbox.empty()


def _watch_loop(
    ref: weakref.ref[Watchdog],
    inbox: queue.SimpleQueue[Optional[tuple[float, weakref.ref[Hold], float]]],
) -> None:
    """The watchdog thread: takes entries from the inbox, pops them as they fall due; ends
    once its watchdog was collected, or after :data:`IDLE_S` with nothing scheduled."""
    mark_background()
    heap: list[tuple[float, int, weakref.ref[Hold], float]] = []
    seq = itertools.count()
    while True:
        delay = IDLE_S if not heap else min(IDLE_S, heap[0][0] - time.monotonic())
        try:
            item = inbox.get(timeout=delay) if delay > 0 else inbox.get_nowait()
        except queue.Empty:
            item = ()  # type: ignore[assignment]
        if item is None:  # the watchdog was collected
            return
        if item:
            when, hold_ref, backoff = item
            heapq.heappush(heap, (when, next(seq), hold_ref, backoff))
        elif not heap:
            if _idle_end(ref, inbox):
                return
            continue
        while heap and heap[0][0] <= time.monotonic():
            _, _, hold_ref, backoff = heapq.heappop(heap)
            hold = hold_ref()
            if hold is None or hold.done or inherited(hold):
                del hold
                continue
            wd = ref()
            if wd is None:
                return
            try:
                wd._tick(hold, backoff)
            except Exception:
                log.exception("redis_rlock: watchdog")
            del wd, hold


class Job:
    """One command of the releaser's, tried until ``until`` (monotonic); ``done`` is set once
    it was answered or given up on (``reply`` or ``error``)."""

    def __init__(
        self,
        key: bytes,
        args: list[P.Arg],
        until: float,
        then: Optional[Callable[[Any], None]] = None,
        confirm: bool = False,
        ended: Optional[Callable[[], None]] = None,
    ) -> None:
        self.key, self.args, self.until = key, args, until
        #: a durability check of an answered counted give-back (``SyncBackend.confirm_round``),
        #: a round per turn: the next not before ``next_at``, ``pause`` after that one
        self.confirm = confirm
        self.next_at, self.pause = 0.0, 0.05
        #: called with the reply, once answered (in the releaser's thread)
        self.then = then
        #: called once it was answered or given up on (in the releaser's thread), before ``done``
        self.ended = ended
        self.done = Flag()  # not an Event: see ``_flag``
        self.reply: Any = None
        self.error: Optional[BaseException] = None
        self.be: Any = None  # the engine that sends it (kept alive until it was sent)

    @property
    def finished(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` s) until the job ended; returns whether it did."""
        return self.done.wait(timeout)


class Releaser:
    """A daemon thread, while there is work, sending idempotent cleanup commands
    (``RLOCK.CANCEL``, releases with a request id) until they are answered or their hold's
    lease would have ended. A queued job keeps its engine alive until it was sent."""

    def __init__(self, be: Engine) -> None:
        self._be = be
        self._q: queue.SimpleQueue[Optional[Job]] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._jobs: dict[Job, None] = {}
        self.finalizer = weakref.finalize(self, self._q.put, None)  # detached after a fork

    @property
    def pending(self) -> int:
        """How many submitted jobs have not ended yet."""
        return sum(not j.finished for j in list(self._jobs))

    def submit(
        self,
        key: bytes,
        args: list[P.Arg],
        horizon: float,
        then: Optional[Callable[[Any], None]] = None,
        confirm: bool = False,
        ended: Optional[Callable[[], None]] = None,
    ) -> Job:
        """Queues ``args`` for ``key``, to be tried for ``horizon`` seconds (``then``: called
        with the reply once answered; ``confirm``: checked durable instead of sent once;
        ``ended``: called once it was answered or given up on)."""
        job = Job(key, args, time.monotonic() + horizon, then, confirm, ended)
        job.be = self._be
        hand_over(self._queue, job, self._run)
        return job

    def _queue(self, job: Job) -> None:
        self._q.put(job)  # first: once queued, it is sent whatever lands next
        self._jobs[job] = None
        if job.finished:
            self._jobs.pop(job, None)

    def _run(self) -> None:
        """Starts the releaser's thread unless one is alive."""
        _serve(self, _release_loop, self._q, "redis-rlock-releaser")

    def flush(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` s) until every job submitted so far ended."""
        end = time.monotonic() + timeout
        while self.pending and time.monotonic() < end:
            time.sleep(0.005)
        return self.pending == 0


def _release_loop(ref: weakref.ref[Releaser], q: queue.SimpleQueue[Optional[Job]]) -> None:
    """The releaser thread: sends jobs as they come; ends once its releaser was collected,
    or after :data:`IDLE_S` with nothing queued."""
    mark_background()
    while True:
        try:
            job = q.get(timeout=IDLE_S)
        except queue.Empty:
            if _idle_end(ref, q):
                return
            continue
        if job is None:  # the releaser was collected
            return
        again = False
        try:
            if job.confirm:
                # one round per turn: checks waiting on cut-off replicas take turns, so each
                # is sent again to a new master soon after a failover
                delay = job.next_at - time.monotonic()
                if delay > 0:
                    time.sleep(min(delay, 1.0))
                if not job.be.confirm_round(job.key, job.args, job.until):
                    job.next_at = time.monotonic() + job.pause
                    job.pause = min(job.pause * 2, 1.0)
                    q.put(job)
                    again = True  # queued again: not ended
                    continue
                job.reply = True
            else:
                # NOREPLICAS too: give-backs of counted permits are refused by a master that
                # may have been replaced (``is_resendable``)
                job.reply, _ = job.be.call_until(job.key, job.args, job.until, is_resendable)
            if job.then is not None:
                job.then(job.reply)
        except BaseException as e:
            job.error = e
            log.warning("redis_rlock: gave up on %r for %r: %s", job.args[0], job.key, e)
        finally:
            if not again:
                if job.ended is not None:
                    job.ended()
                rl = ref()
                if rl is not None:
                    rl._jobs.pop(job, None)
                job.be = None
                job.done.set()
                del rl
