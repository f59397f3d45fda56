"""A one-way signal between threads that no KeyboardInterrupt can jam (sync).

``threading.Event`` keeps a ``Condition`` whose ``__enter__`` is Python code: a signal handler
that raises right after it took the lock (CPython runs handlers after calls) leaves the lock
held for good, outside the ``with`` that would release it, and from then on every ``set`` and
``wait`` of every thread blocks on it: a watchdog that marks a hold lost, a session watcher
that closes a session. A :class:`Flag` holds no lock any two threads share: its state is one
attribute, and each waiter sleeps on a lock of its own, which :meth:`Flag.set` releases."""

from __future__ import annotations

import threading
import time
from typing import Optional

#: The longest a waiter sleeps before it looks at the flag again: a ``set`` interrupted after
#: the flag was raised, before it woke the waiters, delays them by at most this much.
RECHECK_S = 1.0


class Flag:
    """``threading.Event``'s ``set``/``is_set``/``wait``, without a shared lock."""

    __slots__ = ("_on", "_sleepers")

    def __init__(self) -> None:
        self._on = False
        self._sleepers: dict[threading.Lock, None] = {}

    def is_set(self) -> bool:
        """True once :meth:`set` was called."""
        return self._on

    def set(self) -> None:
        """Raises the flag (first: whatever lands next, it reads set) and wakes the waiters."""
        self._on = True
        for lock in self._sleepers.copy():
            try:
                lock.release()
            except RuntimeError:
                pass  # woken already

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the flag is raised (True) or ``timeout`` seconds passed (the flag)."""
        if self._on:
            return True
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        me = threading.Lock()
        me.acquire()
        # registered before the flag is read again: a ``set`` from now on releases ``me``
        self._sleepers[me] = None
        try:
            while not self._on:
                step = RECHECK_S if end is None else min(RECHECK_S, end - time.monotonic())
                if step <= 0:
                    break
                me.acquire(timeout=step)
        finally:
            self._sleepers.pop(me, None)
        return self._on
