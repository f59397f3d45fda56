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
from typing import Any, Callable, Optional

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

    def _at_fork_reinit(self) -> None:
        """In a forked child (``threading._after_fork`` calls it on a thread's ``_started``, as
        ``Event``'s): the parent's waiters are not in the child; the flag keeps its state."""
        self._sleepers = {}

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


class Sleepers:
    """``threading.Condition``'s ``wait``/``notify_all`` over a lock the caller takes with a
    plain ``with`` (a C ``RLock``: its ``__enter__`` is one C call, after which CPython runs no
    signal handler before the block is entered), without ``Condition``'s own Python-level
    ``__enter__`` that a KeyboardInterrupt can leave holding the lock for every other thread.
    Each waiter sleeps on a lock of its own, which :meth:`notify_all` releases."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: dict[threading.Lock, None] = {}

    def wait(self, mu: threading.RLock, timeout: float) -> None:
        """Releases ``mu`` (held once by the caller), sleeps until :meth:`notify_all` or
        ``timeout`` seconds, and takes ``mu`` again — whatever exception lands meanwhile, so
        that the caller's ``with`` gives it back."""
        me = threading.Lock()
        me.acquire()
        self._locks[me] = None  # before ``mu`` is released: a notify from now on wakes ``me``
        try:
            mu.release()
            me.acquire(timeout=max(0.0, timeout))
        finally:
            self._locks.pop(me, None)
            if not mu._is_owned():  # type: ignore[attr-defined]
                mu.acquire()

    def notify_all(self) -> None:
        """Wakes every waiter (called with ``mu`` held)."""
        for lock in self._locks.copy():
            try:
                lock.release()
            except RuntimeError:
                pass  # woken already


def start_daemon(target: Callable[..., Any], args: tuple[Any, ...], name: str) -> threading.Thread:
    """Starts a daemon thread whose start no KeyboardInterrupt can jam. ``Thread.start`` waits
    for the new thread on a ``threading.Event``; an interrupt inside that ``Event``'s
    ``Condition`` can leave its lock held (the new thread then blocks for good before it runs
    ``target``) or raise ``RuntimeError`` instead of itself. So the thread signals its start
    through a :class:`Flag` (the private ``_started`` attribute, where this Python has it): an
    interrupt during the start raises as itself, the thread runs all the same."""
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    if isinstance(getattr(t, "_started", None), threading.Event):
        t._started = Flag()  # type: ignore[attr-defined]
    t.start()
    return t
