# generated from aio/_drivers.py by `make python-generate`; do not edit
"""The engine's drivers that are the same in both engines but for ``await``: loops over the
``_core`` objects that decide, written once here for asyncio. The sync engine's
``_drivers.py`` is generated from this file by ``make python-generate`` (unasync: ``async``
and ``await`` dropped, ``AsyncHold`` -> ``Hold``, ``asyncio.sleep`` -> ``time.sleep`` ...;
tests/test_generated.py fails when it is stale). What differs between the engines beyond
``await`` (connections, the sync side's interrupt hand-offs, shielded tasks, threads) stays in
the engines. A method here is a method of the engine (a mixin): no frame is added around the
sync code."""

from __future__ import annotations

import functools
import time
from time import sleep
from typing import Any, Callable, Optional, Protocol

from redis.exceptions import AskError

from . import _proto as P
from ._conn import is_transient, redirected
from ._core import (
    Acquiring,
    Check,
    CountRead,
    Resending,
    Step,
    Wait,
    reentered,
    reentry,
    reentry_failed,
    renewed,
)
from ._fork import check_owner
from ._hold import Hold


class SessionLink(Protocol):
    """What the engine needs of a session: its connection, and a record of its holds."""

    def call(self, args: list[P.Arg], extra: float, silent: Optional[Check] = None) -> Any:
        """One command on the session's connection (raises SessionClosed once closed);
        ``silent``: a wait's check (True: the connection is dead)."""

    def adopt(self, hold: Hold) -> None:
        """Records a hold granted through the session (raises SessionClosed once closed)."""


class SyncEngineDrivers:
    """The engine's await-only drivers (a mixin of the engine: ``rt``, ``cluster``,
    ``_call_at`` and ``release_stale`` are the engine's)."""

    rt: float
    cluster: bool

    _call_at: Callable[..., Any]  # (key, args, extra, at, asking, wait): the engine's
    release_stale: Callable[..., Any]  # (holds, wait=True): the engine's

    def call(
        self, key: bytes, args: list[P.Arg], extra: float = 0.0, wait: Optional[Wait] = None
    ) -> Any:
        """Sends one command and reads its reply within ``extra`` + the response timeout;
        raises :class:`Stalled` (connection closed) when no reply came by then. In a cluster,
        a ``MOVED`` or ``ASK`` reply (the command did not run) sends it again where the key is
        served now (``ASKING`` first for an ``ASK``), as redis-py's cluster client does. With
        ``wait`` (a command that waits in the server) it runs on a connection for waits."""
        at: Optional[tuple[str, int]] = None
        asking = False
        for _ in range(P.MAX_REDIRECTS):
            try:
                return self._call_at(key, args, extra, at, asking, wait)
            except AskError as e:
                at, asking = redirected(e, self.cluster)
        return self._call_at(key, args, extra, at, asking, wait)

    def _try(self, key: bytes, wait: Wait) -> bool:
        """The acquire of a wait queued for a connection, without ``WAIT`` (same request id), on
        a short-command connection: True when granted (``Wait.try_answered``, ``try_failed``)."""
        assert wait.spec is not None
        try:
            reply = self.call(key, wait.spec.acquire(wait.rid, None))
        except Exception as e:
            return wait.try_failed(e)
        return wait.try_answered(reply)

    def _check(self, key: bytes, wait: Wait) -> tuple[bool, Any]:
        """Checks a wait from another connection (see ``_waits``): (False, None) while the
        server still queues it; (True, reply) when it answered it itself: the acquire's answer
        now (the grant, replayed, or not granted: the request is spent; or the error reply
        ``was cancelled``, the wait's answer, to be raised: ``Wait.check_failed``). The caller
        then gives the wait's own connection a response timeout to answer after all."""
        before = wait.checking()
        try:
            assert wait.probe is not None
            reply = self.call(key, wait.probe)
        except Exception as e:
            reply = wait.check_failed(e, before)
            if reply is None:
                return False, None
        return True, reply

    def call_until(
        self,
        key: bytes,
        args: list[P.Arg],
        until: Optional[float],
        resend: Callable[[BaseException], bool] = is_transient,
    ) -> tuple[Any, int]:
        """Sends an idempotent command, again after errors ``resend`` accepts (transient
        ones), until a reply or ``until`` (monotonic; None: no limit): :class:`~._core.Resending`.
        Returns (reply, attempts)."""
        run = Resending(until, resend)
        while True:
            attempts = run.attempt()
            try:
                return self.call(key, args), attempts
            except Exception as e:
                delay = run.failed(e)
            sleep(delay)

    # -- acquire -------------------------------------------------------------------------------
    def settled_first(self, run: Acquiring) -> bool:
        """Before an Owner's acquire is sent: waits until no release or cancel of the owner's
        holds of its key may still reach the server (``Acquiring.unsettled``), at most until
        ``run.settle_by()``; False when one still may then (the acquire takes nothing)."""
        until = run.settle_by()
        while run.unsettled():
            now = time.monotonic()
            if until is not None and now >= until:
                return False
            sleep(0.005 if until is None else max(0.0, min(0.005, until - now)))
        return True

    def _attempt(self, run: Acquiring, session: Optional[SessionLink]) -> Step:
        """One attempt of an acquire: ``run``'s next command (on the session's connection with
        ``session``), and what to do next (:class:`~._core.Step`). An interrupt (not an
        ``Exception``) passes through: what the caller's handler needs (``run.need_cancel``)
        is in ``run``, not in this frame."""
        spec = run.spec
        waiting: Optional[Wait] = None
        wait_ms, extra = run.attempt()
        try:
            args, waiting = run.command(wait_ms, session is not None)
            if session is not None and waiting is not None:
                check = functools.partial(self._answered, spec, waiting)
                reply = session.call(args, extra, check)
            elif session is not None:
                reply = session.call(args, extra)
            else:
                reply = self.call(spec.key, args, extra, waiting)
        except Exception as e:
            return run.failed(e, waiting)
        return run.granted(reply, waiting)

    def _answered(self, spec: P.Spec, wait: Wait) -> bool:
        """Whether the server answered a session's wait elsewhere (``Wait.session_check``)."""
        try:
            assert wait.probe is not None
            self.call(spec.key, wait.probe)
        except Exception as e:
            return wait.session_check(e)
        return wait.session_check(None)

    def taken_over(self, spec: P.Spec, rid: bytes) -> list[Any]:
        """An Owner's lock or write grant that may have found lost holds' counts of its owner
        (``_hold.taken_over``): the owner's count read right after it says how many of them
        are there (``_hold.stale_present``); nothing when it cannot be read."""
        read = CountRead(spec, rid)
        if read.args is None:
            return []
        try:
            count = self.call(spec.key, read.args)
        except Exception as e:
            return read.failed(e)
        return read.read(count)

    # -- re-entry / renewal --------------------------------------------------------------------
    def renew(self, hold: Hold, lease_ms: int, until: Optional[float]) -> bool:
        """Renews every part of ``hold`` for ``lease_ms``; True when the server confirmed."""
        ticket = hold.ledger.ticket()
        try:
            lease_ms, confirms = hold.renewal(ticket, lease_ms, time.monotonic())
            for cmd in hold.spec.renew(lease_ms, hold.ids):
                reply, _ = self.call_until(hold.spec.key, cmd, until)
                if reply != 1:
                    return False
        finally:
            hold.ledger.done(ticket)  # answered, or given up on
        # confirmed after the guard was declared lost: its count, held by nobody, released
        self.release_stale(renewed(hold, confirms), wait=False)
        return True

    def reenter(self, hold: Hold, lease_ms: int, wait: Optional[float]) -> bool:
        """Joins ``hold`` again once the server confirmed it (a renewal that never shortens
        the lease); raises :class:`LockLost` when it is gone."""
        check_owner(hold)
        hold.check()
        lease, until = reentry(hold, lease_ms, wait, self.rt)
        try:
            confirmed = self.renew(hold, lease, until)
        except Exception as e:
            return reentry_failed(hold, e, wait)
        return reentered(hold, confirmed)
