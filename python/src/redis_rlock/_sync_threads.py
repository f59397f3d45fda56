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
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import _proto as P
from ._conn import is_transient, log
from ._fork import inherited
from ._hold import Hold

if TYPE_CHECKING:
    from ._sync import SyncBackend


#: How long a thread of the engine's stays with nothing to do before it ends (the next hold,
#: or the next cleanup command, starts another). A client nobody references any more, once
#: collected, takes its threads (and its connections) with it at once.
IDLE_S = 5.0


def _wake(cv: threading.Condition) -> None:
    with cv:
        cv.notify_all()


class Watchdog:
    """One daemon thread per client, while it has holds to watch: renews watchdog holds every
    third of their lease and signals holds lost at their deadline. It keeps holds only by weak
    reference: a hold nobody references any more is neither renewed nor released (its lease
    ends on the server). The thread keeps the watchdog (and its engine) only by weak reference
    too: a client that was collected leaves no thread behind."""

    def __init__(self, be: SyncBackend) -> None:
        self._be = be
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, weakref.ref[Hold], float]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None
        # wakes the thread once the watchdog was collected (detached in a forked child: the
        # parent's thread may have held the condition's lock at the fork)
        self.finalizer = weakref.finalize(self, _wake, self._cv)

    def schedule(self, hold: Hold, when: Optional[float] = None, backoff: float = 0.0) -> None:
        """Looks at ``hold`` at ``when`` (default: a third of its lease, or its deadline)."""
        if when is None:
            if hold.watchdog:
                when = time.monotonic() + hold.lease_ms / 3000.0
            elif hold.deadline == float("inf"):
                return
            else:
                when = hold.deadline
        with self._cv:
            seq = next(self._seq)
            heapq.heappush(self._heap, (when, seq, weakref.ref(hold), backoff))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=_watch_loop,
                    args=(weakref.ref(self), self._cv, self._heap),
                    name="redis-rlock-watchdog",
                    daemon=True,
                )
                self._thread.start()
            elif self._heap[0][1] == seq:
                # only an entry that became the earliest moves the thread's wake-up; waking it
                # for every acquire costs a thread hand-off (and the GIL) per acquisition
                self._cv.notify()

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
            if not is_transient(e):
                log.warning("redis_rlock: renewal of %r failed: %s", hold.spec.key, e)
            period = hold.lease_ms / 3000.0
            nxt = min(period, max(0.05, backoff * 2))
            self.schedule(hold, min(time.monotonic() + nxt, hold.deadline), nxt)
            return
        if not ok:
            hold.mark_lost()
            return
        self.schedule(hold)


def _watch_loop(
    ref: weakref.ref[Watchdog],
    cv: threading.Condition,
    heap: list[tuple[float, int, weakref.ref[Hold], float]],
) -> None:
    """The watchdog thread: pops entries as they fall due; ends once its watchdog was
    collected, or after :data:`IDLE_S` with nothing scheduled."""
    while True:
        with cv:
            while True:
                wd = ref()
                if wd is None:
                    return
                if not heap:
                    del wd
                    if not cv.wait(IDLE_S) and not heap:
                        wd = ref()
                        if wd is not None and wd._thread is threading.current_thread():
                            wd._thread = None  # under ``cv``: ``schedule`` starts another
                        return
                    continue
                delay = heap[0][0] - time.monotonic()
                if delay <= 0:
                    break
                del wd
                cv.wait(min(delay, IDLE_S))
            _, _, hold_ref, backoff = heapq.heappop(heap)
        hold = hold_ref()
        if hold is None or hold.done or inherited(hold):
            del wd, hold
            continue
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
    ) -> None:
        self.key, self.args, self.until = key, args, until
        #: called with the reply, once answered (in the releaser's thread)
        self.then = then
        self.done = threading.Event()
        self.reply: Any = None
        self.error: Optional[BaseException] = None
        self.be: Any = None  # the engine that sends it (kept alive until it was sent)

    def wait(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` s) until the job ended; returns whether it did."""
        return self.done.wait(timeout)


class Releaser:
    """A daemon thread, while there is work, sending idempotent cleanup commands
    (``RLOCK.CANCEL``, releases with a request id) until they are answered or their hold's
    lease would have ended. A queued job keeps its engine alive until it was sent."""

    def __init__(self, be: SyncBackend) -> None:
        self._be = be
        self._q: queue.Queue[Optional[Job]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.pending = 0
        self.finalizer = weakref.finalize(self, self._q.put, None)  # detached after a fork

    def submit(
        self,
        key: bytes,
        args: list[P.Arg],
        horizon: float,
        then: Optional[Callable[[Any], None]] = None,
    ) -> Job:
        """Queues ``args`` for ``key``, to be tried for ``horizon`` seconds (``then``: called
        with the reply once answered)."""
        job = Job(key, args, time.monotonic() + horizon, then)
        job.be = self._be
        with self._lock:
            self._q.put(job)  # first: once queued, it is sent whatever lands next
            self.pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=_release_loop,
                    args=(weakref.ref(self), self._q),
                    name="redis-rlock-releaser",
                    daemon=True,
                )
                self._thread.start()
        return job

    def flush(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` s) until every job submitted so far ended."""
        end = time.monotonic() + timeout
        while self.pending and time.monotonic() < end:
            time.sleep(0.005)
        return self.pending == 0


def _release_loop(ref: weakref.ref[Releaser], q: queue.Queue[Optional[Job]]) -> None:
    """The releaser thread: sends jobs as they come; ends once its releaser was collected,
    or after :data:`IDLE_S` with nothing queued."""
    while True:
        try:
            job = q.get(timeout=IDLE_S)
        except queue.Empty:
            rl = ref()
            if rl is None:
                return
            with rl._lock:
                if q.empty():
                    if rl._thread is threading.current_thread():
                        rl._thread = None  # under the lock: ``submit`` starts another
                    return
            del rl
            continue
        if job is None:  # the releaser was collected
            return
        try:
            job.reply, _ = job.be.call_until(job.key, job.args, job.until)
            if job.then is not None:
                job.then(job.reply)
        except BaseException as e:
            job.error = e
            log.warning("redis_rlock: gave up on %r for %r: %s", job.args[0], job.key, e)
        finally:
            rl = ref()
            if rl is not None:
                with rl._lock:
                    rl.pending -= 1
            job.be = None
            job.done.set()
            del rl
