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
from typing import TYPE_CHECKING, Any, Optional

from . import _proto as P
from ._conn import is_transient, log
from ._fork import inherited
from ._hold import Hold

if TYPE_CHECKING:
    from ._sync import SyncBackend


class Watchdog:
    """One daemon thread per client: renews watchdog holds every third of their lease and
    signals holds lost at their deadline. It keeps holds only by weak reference: a hold nobody
    references any more is neither renewed nor released (its lease ends on the server)."""

    def __init__(self, be: SyncBackend) -> None:
        self._be = be
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, weakref.ref[Hold], float]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

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
                    target=self._run, name="redis-rlock-watchdog", daemon=True
                )
                self._thread.start()
            elif self._heap[0][1] == seq:
                # only an entry that became the earliest moves the thread's wake-up; waking it
                # for every acquire costs a thread hand-off (and the GIL) per acquisition
                self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    delay = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(delay)
                _, _, ref, backoff = heapq.heappop(self._heap)
            hold = ref()
            if hold is None or hold.done or inherited(hold):
                continue
            try:
                self._tick(hold, backoff)
            except Exception:
                log.exception("redis_rlock: watchdog")
            del hold

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


class Job:
    """One command of the releaser's, tried until ``until`` (monotonic); ``done`` is set once
    it was answered or given up on (``reply`` or ``error``)."""

    def __init__(self, key: bytes, args: list[P.Arg], until: float) -> None:
        self.key, self.args, self.until = key, args, until
        self.done = threading.Event()
        self.reply: Any = None
        self.error: Optional[BaseException] = None

    def wait(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` s) until the job ended; returns whether it did."""
        return self.done.wait(timeout)


class Releaser:
    """A daemon thread sending idempotent cleanup commands (``RLOCK.CANCEL``, releases with a
    request id) until they are answered or their hold's lease would have ended."""

    def __init__(self, be: SyncBackend) -> None:
        self._be = be
        self._q: queue.Queue[Job] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.pending = 0

    def submit(self, key: bytes, args: list[P.Arg], horizon: float) -> Job:
        """Queues ``args`` for ``key``, to be tried for ``horizon`` seconds."""
        job = Job(key, args, time.monotonic() + horizon)
        with self._lock:
            self.pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="redis-rlock-releaser", daemon=True
                )
                self._thread.start()
        self._q.put(job)
        return job

    def flush(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` s) until every job submitted so far ended."""
        end = time.monotonic() + timeout
        while self.pending and time.monotonic() < end:
            time.sleep(0.005)
        return self.pending == 0

    def _run(self) -> None:
        while True:
            job = self._q.get()
            try:
                job.reply, _ = self._be.call_until(job.key, job.args, job.until)
            except BaseException as e:
                job.error = e
                log.warning("redis_rlock: gave up on %r for %r: %s", job.args[0], job.key, e)
            finally:
                with self._lock:
                    self.pending -= 1
                job.done.set()
