"""The engines' decisions, with no I/O, no threads and no tasks: one copy for the sync engine
(``_sync``) and the asyncio one (``aio._engine``), which send the commands, sleep and hand
work to the background each in their own way, and ask this module what to do next.

Each decision is a plain call that returns what the engine does next (a :class:`Step`) and
changes only the state object it is given: an interrupt landing around it (the sync side's
KeyboardInterrupt, the asyncio side's cancellation) finds that state as it would have found
the engine's own locals, so each engine's exception handling decides as before.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Awaitable, Callable, Optional

from redis.exceptions import ResponseError

from . import _proto as P
from . import _waits as W
from ._conn import Stalled, is_resendable, is_transient, log
from ._hold import Hold, count_field, late_renewal, stale_present, taken_over
from .errors import LockLost, RLockError, SessionClosed, translate

#: a session wait's check of its connection, as the engines hand it to the session's ``call``
#: (True: the connection is silent, the server answered the wait elsewhere): sync, asyncio
Check = Callable[[], bool]
AsyncCheck = Callable[[], Awaitable[bool]]


class Wait:
    """What a call that waits in the server needs: its deadline (for a connection too), and
    the same acquire without ``WAIT`` to check on it from another connection (None: no check).
    ``probed`` is set when that check's answer replaced the reply of a silent connection;
    ``answered`` when a check was answered otherwise than "already waiting": the server no
    longer queued the request then, so the check itself may have been granted (a grant under
    the request's id that only a cancellation gives back when the acquire ends without one);
    so is a try (below) whose answer was lost."""

    def __init__(
        self,
        until: Optional[float],
        probe: Optional[list[P.Arg]],
        spec: Optional[P.Spec] = None,
        rid: bytes = b"",
    ) -> None:
        self.until, self.probe = until, probe
        self.probed = False
        self.answered = False
        self.sent: Callable[[], None] = lambda: None
        #: an acquire's wait queued for a connection is tried without ``WAIT`` (``spec``'s,
        #: same request id as ``probe``; see ``_waits``): its place in line, the granted reply
        self.spec, self.rid = spec, rid
        self.key = None if spec is None else W.line_key(spec)
        self.tried: Any = None

    # -- a try of a wait queued for a connection (the acquire without ``WAIT``, same id) ----
    def try_answered(self, reply: Any) -> bool:
        """The try was answered ``reply``: True when granted (the reply kept in ``tried``)."""
        assert self.spec is not None
        if not self.spec.granted(reply)[0]:
            return False
        self.tried = reply
        return True

    def try_failed(self, e: Exception) -> bool:
        """The try raised ``e``. Failed otherwise than by an error reply (a lost answer, a
        connection refused or broken at ``maxclients``, whatever redis-py raised then), it
        may have been granted: the wait is marked ``answered`` (the acquire cancels its id
        unless it ends holding it) and stays in line (False). An error reply other than a
        transient one is the acquire's answer (raised: refused, cancelled, NOPERM,
        NOREPLICAS ..., the wait would be too)."""
        if isinstance(e, ResponseError) and not is_transient(e):
            raise e
        self.answered = True
        key = None if self.spec is None else self.spec.key
        log.debug("redis_rlock: a try of a queued wait on %r: %s", key, e)
        return False

    # -- a check of a wait from another connection (see ``_waits``) ------------------------
    def checking(self) -> bool:
        """A check is about to be sent: granted, perhaps, from the moment it is sent (the
        acquire cancels the id unless it takes the grant; a "not granted" answer of the wait
        itself may come first). Returns what ``answered`` was, for :meth:`check_failed`."""
        before, self.answered = self.answered, True
        return before

    def check_failed(self, e: Exception, before: bool) -> Optional[BaseException]:
        """The check raised ``e``: None while no conclusion (the server still queues the wait
        and the check took nothing; or no answer), else the wait's answer (``was
        cancelled``: over, holding nothing; see ``_waits.probe_answer``), to be raised."""
        answer = W.probe_answer(e)
        if answer == "waiting":
            self.answered = before  # the server queued it then: the check took nothing
        return e if answer == "over" else None

    def session_check(self, e: Optional[Exception]) -> bool:
        """Whether the server answered a session's wait (its acquire sent again without
        ``WAIT`` and ``SESSION``, same id, from another connection) while its connection is
        silent: anything but ``already waiting`` (``e`` None: answered, perhaps a grant the
        acquire's cancel gives back). "was cancelled" says it is not waiting any more (its
        connection, the session's, is gone on the server), holding nothing; any other error:
        no answer, no conclusion."""
        if e is not None:
            return W.probe_answer(e) == "over"
        self.answered = True  # granted, perhaps (without SESSION): cancelled unless taken
        return True

    def silent(self, key: bytes, reply: Any) -> Any:
        """The wait's connection was silent (the engine dropped it: its reply, if it ever
        comes, is not read) and its check answered ``reply``: the acquire's answer (the grant,
        replayed, or not granted: the request is spent), returned; or the error reply ``was
        cancelled`` (:meth:`check_failed`), raised: the wait is over, holding nothing."""
        log.warning("redis_rlock: a wait on %r had a silent connection: dropped", key)
        self.probed = True
        if isinstance(reply, BaseException):
            raise reply
        return reply


class Probing:
    """A reply awaited on a connection: by ``extra`` plus a response timeout (then the call
    has :meth:`stalled`), and, for a wait with a check (``wait.probe``), that check sent from
    another connection every ``_waits.probe_every`` while no reply came (see ``_waits``; its
    answer on a silent connection: :meth:`Wait.silent`). Made once the command was sent."""

    def __init__(self, wait: Optional[Wait], extra: float, rt: float) -> None:
        now = time.monotonic()
        self.within = extra + rt
        self.end = now + self.within
        self.every = W.probe_every(rt)
        self.probes = wait is not None and wait.probe is not None
        self.probe_at = now + self.every if self.probes else math.inf

    def left(self, most: float) -> float:
        """How long to wait for the reply before the next look: until the end, at most
        ``most`` (the sync engine polls its connection, a check sent at the poll it is due)."""
        return max(0.0, min(self.end - time.monotonic(), most))

    def slice(self) -> float:
        """How long to wait for the reply before the next look: until the next check is due,
        or the end."""
        return max(0.0, min(self.end, self.probe_at) - time.monotonic())

    def due(self, now: float) -> bool:
        """Whether the next check is due at ``now``."""
        return now >= self.probe_at

    def probed(self) -> None:
        """A check found the wait's connection alive (or concluded nothing): the next one in
        ``every``."""
        self.probe_at = time.monotonic() + self.every

    def over(self, now: float) -> bool:
        """Whether the reply's time is up at ``now``."""
        return now >= self.end

    def stalled(self, what: P.Arg) -> Stalled:
        """The error of a call whose reply did not come in time (its connection dropped)."""
        return Stalled(f"no reply to {what!r} within {self.within:.3f} s")


class Resending:
    """An idempotent command sent again after the errors ``resend`` accepts (transient ones),
    backing off up to 1 s, until a reply or ``until`` (monotonic; None: no limit)."""

    def __init__(self, until: Optional[float], resend: Callable[[BaseException], bool]) -> None:
        self.until, self.resend = until, resend
        self.backoff, self.attempts = 0.02, 0

    def attempt(self) -> int:
        """Counts the next send; returns how many there were."""
        self.attempts += 1
        return self.attempts

    def failed(self, e: Exception) -> float:
        """The send raised ``e``: raised again when it is not one to resend after or the time
        is up, else how long to wait before the next send."""
        if not self.resend(e):
            raise e
        now = time.monotonic()
        if self.until is not None and now >= self.until:
            raise e
        delay = min(self.backoff, self.until - now) if self.until is not None else self.backoff
        self.backoff = min(self.backoff * 2, 1.0)
        return delay


class Step:
    """What an engine does next in an acquire (:class:`Acquiring`): ``kind`` is one of

    - ``AGAIN``: the next attempt at once (with ``Acquiring.rid``, perhaps a new one);
    - ``SLEEP``: the next attempt after ``delay`` seconds;
    - ``NONE``: the acquire returns None (not taken; nothing to give back);
    - ``CANCEL_NONE``: the request (``Acquiring.rid``) is cancelled (an attempt may have
      queued, or been granted), then the acquire returns None;
    - ``RAISE``: ``error`` is raised (the package's translation of an error reply, or the
      call's own exception when it is ``raw``);
    - ``GRANTED``: the grant (``token``, ``ids``) is the caller's.

    ``cancel`` (a request id), when set with ``AGAIN`` or ``NONE``, is cancelled first: a
    check of a wait may have been granted under that id after the answer "not granted"."""

    AGAIN, SLEEP, NONE, CANCEL_NONE, RAISE, GRANTED = "again", "sleep", "none", "cn", "raise", "ok"

    __slots__ = ("cancel", "delay", "error", "ids", "kind", "raw", "token")

    def __init__(
        self,
        kind: str,
        delay: float = 0.0,
        error: Optional[BaseException] = None,
        raw: bool = False,
        cancel: Optional[bytes] = None,
        token: Optional[int] = None,
        ids: Optional[list[bytes]] = None,
    ) -> None:
        self.kind, self.delay, self.error, self.raw = kind, delay, error, raw
        self.cancel, self.token, self.ids = cancel, token, ids

    def failure(self) -> BaseException:
        """The error a ``RAISE`` step raises: the call's own as it is (``raw``), else the
        package's, shown without the error it translates (as ``raise ... from None``)."""
        assert self.error is not None
        if not self.raw:
            self.error.__cause__ = None
            self.error.__suppress_context__ = True
        return self.error


class Acquiring:
    """One acquire of ``spec``, waiting up to ``wait`` seconds in the server (0: one try; None:
    no limit), as a state machine: the engine asks :meth:`attempt` for the next command,
    sends it, and hands the reply to :meth:`granted` or the exception to :meth:`failed`; each
    says what to do next. ``rid`` is the request id to cancel should the acquire end without
    handing a grant over while ``need_cancel`` is set."""

    def __init__(self, spec: P.Spec, wait: Optional[float], rt: float) -> None:
        self.spec, self.wait = spec, wait
        self.rid = P.new_id()
        self.t0 = time.monotonic()
        self.end = None if wait is None else self.t0 + wait
        # one try: transient errors retried briefly
        self.retry_end = self.t0 + rt if wait == 0.0 else self.end
        self.need_cancel = False
        self.backoff, self.attempts = 0.02, 0

    def _time_left(self) -> bool:
        return self.end is None or time.monotonic() < self.end

    def unsettled(self) -> bool:
        """Whether the acquire must not be sent yet: an Owner's release or cancel of a hold of
        its key may still reach the server (``Peers.unsettled``), and give back a count of the
        grant this acquire may get (a new server hold, should the owner's one there have ended
        meanwhile). Asked before the first attempt, again while :meth:`settle_by` allows."""
        peers = self.spec.peers
        return peers is not None and peers.unsettled(self.spec.key)

    def settle_by(self) -> Optional[float]:
        """Until when the acquire waits for :meth:`unsettled` to clear: its deadline (a one-try
        acquire's: one response timeout; None: no limit). Past it the acquire takes nothing."""
        return self.retry_end

    def attempt(self) -> tuple[Optional[int], float]:
        """The next attempt's ``WAIT`` in ms (None: one try without ``WAIT``; 0: no limit)
        and how much longer than the response timeout its reply may take; from here on the
        request may be queued or granted (``need_cancel``)."""
        now = time.monotonic()
        if self.wait == 0.0:
            wait_ms: Optional[int] = None
        elif self.end is None:
            wait_ms = 0
        else:
            wait_ms = max(1, math.ceil((self.end - now) * 1000)) if self.end > now else None
        self.need_cancel = True
        self.attempts += 1
        return wait_ms, (wait_ms or 0) / 1000.0 if self.end is not None else 1e9

    def command(self, wait_ms: Optional[int], session: bool) -> tuple[list[P.Arg], Optional[Wait]]:
        """The acquire command of this attempt and what its wait needs (None: no wait, or a
        session's wait on its own connection without a check: ``wait_ms`` None). A session's
        wait is checked by the same acquire without ``WAIT`` and ``SESSION``; another wait by
        the acquire without ``WAIT``, which also tries it while it queues for a connection."""
        spec, rid = self.spec, self.rid
        args = spec.acquire(rid, wait_ms)
        if wait_ms is None:
            return args, None
        if session:
            probe = dataclasses.replace(spec, session=False).acquire(rid, None)
            return args, Wait(self.end, probe)
        return args, Wait(self.end, spec.acquire(rid, None), spec, rid)

    def failed(self, e: Exception, waiting: Optional[Wait]) -> Step:
        """The attempt raised ``e`` (its wait: ``waiting``)."""
        spec, wait = self.spec, self.wait
        if isinstance(e, ResponseError) and P.is_cancelled_reply(e):
            # the request holds nothing and never will: the server rolled back a grant made
            # into a connection that went (closed, dropped) before its reply was read; asked
            # again, a new request, with the time left
            self.need_cancel = False
            if wait != 0.0 and self._time_left():
                self.rid = P.new_id()
                return Step(Step.AGAIN)
            return Step(Step.NONE)
        if isinstance(e, ResponseError) and P.is_unblocked(e) and wait != 0.0:
            # a failover ended the wait (UNBLOCKED at a demotion): asked again with the same
            # id, where the key is served now, within the deadline
            e = Stalled(str(e))
        if isinstance(e, ResponseError) and P.is_noreplicas(e) and wait != 0.0:
            # this master grants nothing until its replicas are in sync (a promoted master
            # waiting for one, a master that lost them): asked again, backing off, within the
            # acquire's deadline; NoReplicas when it passes
            now = time.monotonic()
            if self.end is not None and now + min(self.backoff, 0.05) >= self.end:
                self.need_cancel = self.attempts > 1  # an earlier attempt may have queued
                return Step(Step.RAISE, error=translate(e, _name(spec)))
            return self._sleep(now, self.end)
        if not is_transient(e):
            if isinstance(e, ResponseError):
                # an error reply changed nothing, unless a check was answered
                self.need_cancel = waiting is not None and waiting.answered
                return Step(Step.RAISE, error=translate(e, _name(spec)))
            if isinstance(e, SessionClosed) and e.nothing_ran:
                # a session closed before this attempt was sent, or by its refusal: only an
                # earlier attempt (or an answered check) may hold something
                self.need_cancel = self.attempts > 1 or (waiting is not None and waiting.answered)
            return Step(Step.RAISE, error=e, raw=True)
        now = time.monotonic()
        if self.retry_end is not None and now >= self.retry_end:
            if wait == 0.0:
                return Step(Step.RAISE, error=e, raw=True)
            return Step(Step.CANCEL_NONE)
        return self._sleep(now, self.retry_end)

    def _sleep(self, now: float, until: Optional[float]) -> Step:
        step = self.backoff if until is None else min(self.backoff, until - now)
        self.backoff = min(self.backoff * 2, 1.0)
        return Step(Step.SLEEP, delay=max(step, 0.0))

    def granted(self, reply: Any, waiting: Optional[Wait]) -> Step:
        """The attempt was answered ``reply`` (its wait: ``waiting``)."""
        ok, token, ids, again = self.spec.granted(reply)
        if ok:
            return Step(Step.GRANTED, token=token, ids=ids)
        if waiting is not None and waiting.probed and self._time_left():
            # the wait's connection died silently and the server no longer queues it (a
            # restart, a failover, a connection the server closed): a new request with what
            # is left of the deadline
            self.rid = P.new_id()
            return Step(Step.AGAIN)
        self.need_cancel = False
        cancel = None
        if waiting is not None and waiting.answered:
            # a check of this wait, sent while the server no longer queued it, may have been
            # granted under its id after the answer "not granted": given back exactly, and any
            # next attempt is a new request
            cancel, self.rid = self.rid, P.new_id()
        if again and self._time_left() and self.wait != 0.0:
            return Step(Step.AGAIN, cancel=cancel)
        return Step(Step.NONE, cancel=cancel)


def _name(spec: P.Spec) -> str:
    return spec.key.decode(errors="replace")


def cancelling(spec: P.Spec, rid: bytes, rt: float) -> tuple[list[P.Arg], float]:
    """An ``RLOCK.CANCEL`` of the acquire ``rid`` of ``spec`` about to be sent: the command,
    and how long it is sent again (until the grant's lease would have ended; no lease: while
    the server remembers the request; plus one response timeout). An Owner's peers are told
    first: the cancel may give a grant of the owner back."""
    if spec.peers is not None:
        spec.peers.settling(spec.key)
    horizon = (spec.lease_ms / 1000.0 if spec.lease_ms else P.REQUEST_RECORD_S) + rt
    return P.cancel_args(spec.key, rid), horizon


def _nothing(*_: object) -> None:
    pass


def settle(spec: P.Spec, within: float) -> Callable[..., None]:
    """A release or cancel of a hold of ``spec`` is about to be sent, until answered or given up
    on (at most ``within`` seconds from now): an Owner's peers count it as unsettled
    (``Peers.unsettled``) until what is returned is called (idempotent; a no-op for every
    other lock)."""
    return spec.peers.settle(spec.key, within) if spec.peers is not None else _nothing


def reentry(hold: Hold, lease_ms: int, wait: Optional[float], rt: float) -> tuple[int, float]:
    """The lease a re-entry of ``hold`` renews it for (never shorter than what it has: a
    watchdog hold's period, another's time left) and until when it is tried (``wait``, or
    one response timeout for a one-try or unbounded acquire)."""
    remaining = max(0, math.ceil((hold.deadline - time.monotonic()) * 1000))
    lease = max(lease_ms, hold.lease_ms if hold.watchdog else remaining, 1)
    return lease, time.monotonic() + (rt if not wait else wait)


def release_bounds(hold: Hold, rt: float) -> tuple[float, float, Callable[[BaseException], bool]]:
    """A release of ``hold`` sent now: (its first send, until when it is sent again in the
    caller's time, which errors send it again: counted permits' ``NOREPLICAS`` too)."""
    first = time.monotonic()
    until = P.resend_end(hold.spec.kind, first, min(hold.deadline, first + 3 * rt))
    return first, until, is_resendable if hold.spec.kind == P.COUNTED else is_transient


def resend_until(hold: Hold, first: float) -> float:
    """Until when (monotonic) ``hold``'s release, first sent at ``first``, is sent again in
    the background (both engines): counted permits' while the server remembers it
    (``P.COUNTED_RESEND_S``); a lock's or side's at most ``P.RELEASE_RESEND_S`` (sent after
    the server forgot its id, it would end a later hold of the same owner); leased permits'
    until their lease would have ended (``P.resend_end``). Nothing caps it further: a leased
    release names its permits' ids, which no later grant reuses, so it is safe to send for as
    long as the permits could still be held, and each one given back before its lease ends
    serves a waiter at once (the cancel of a grant goes on as long: :func:`cancelling`)."""
    if hold.spec.kind == P.COUNTED:
        return first + P.COUNTED_RESEND_S
    if hold.spec.peers is not None:
        # an Owner's: no new hold of its owner on the key is asked for until the release was
        # answered or given up on (``Peers.unsettled``), so a copy that reaches the server after
        # the hold's lease ended finds the owner's hold it was meant for or none: sent again
        # past the deadline, for as long as the server remembers a copy that landed
        return first + P.RELEASE_RESEND_S
    return P.resend_end(hold.spec.kind, first, hold.deadline)


def release_missed(hold: Hold, reply: Any, attempts: int) -> bool:
    """Whether the release's ``reply`` says the hold was gone (lost before it was sent). A
    leased permits' release sent again may find its own first send's work done."""
    spec = hold.spec
    return not spec.released(reply, hold.ids) and not (spec.kind == P.LEASED and attempts > 1)


def gone(hold: Hold) -> LockLost:
    """A release found ``hold`` gone (:func:`release_missed`): it is marked lost (its
    callback called), then done; returns the error its release raises."""
    hold.done = False
    hold.mark_lost()
    hold.done = True
    return hold.lost_error()


#: What a release's failure leads to (:func:`release_failed`). REFUSED: an error reply that
#: changed nothing (the caller still holds it: its watchdog goes on, the error is raised);
#: SEND_ON: a transient failure, the (idempotent) release goes on in the background;
#: SEND_ON_REFUSED: counted permits' give-back refused (``NOREPLICAS``: a master that may have
#: been replaced gives back no counted permits; ``READONLY`` ...), nothing given back: it goes
#: on in the background while the server remembers it.
RELEASE_REFUSED = "refused"
RELEASE_SEND_ON = "send on"
RELEASE_SEND_ON_REFUSED = "send on, refused"


def release_failed(hold: Hold, e: Exception) -> Optional[str]:
    """What the failure ``e`` of ``hold``'s release (after its resends) leads to; None: an
    unexpected error, raised as it is."""
    if isinstance(e, ResponseError):
        if hold.spec.kind == P.COUNTED and is_resendable(e):
            return RELEASE_SEND_ON_REFUSED
        return RELEASE_REFUSED
    return RELEASE_SEND_ON if is_transient(e) else None


def release_refused(hold: Hold, e: Exception) -> RLockError:
    """The error a release :func:`release_failed` called REFUSED raises."""
    assert isinstance(e, ResponseError)
    return translate(e, _name(hold.spec))


class Confirming:
    """One round, on one connection (so one server), of making an answered counted give-back
    (``args``: its ``RSEM.RELEASE`` or ``RLOCK.CANCEL``, idempotent by its request id) durable:
    :attr:`commands` sent in turn, each reply read within a response timeout (``args`` again,
    then ``INFO replication``), then :meth:`seen` says what the master's replicas lead to: a
    server no longer master ends the round (False: the engine drops the connection, a new one
    finds the current master), none is durable at once (True), else ``WAIT`` for all of them
    (:meth:`wait_args`, its reply read within :attr:`wait_s` plus a response timeout) and
    :meth:`acked` concludes."""

    __slots__ = ("commands", "replicas")

    #: how long ``WAIT`` waits in the server
    wait_s = P.DURABLE_WAIT_MS / 1000.0

    def __init__(self, args: list[P.Arg]) -> None:
        self.commands: tuple[list[P.Arg], ...] = (args, ["INFO", "replication"])
        self.replicas: Optional[int] = None

    def seen(self, info: Any) -> Optional[bool]:
        """``INFO replication``'s reply read: the round's answer, or None (WAIT for them)."""
        self.replicas = P.replicas_of(info)
        if self.replicas is None:
            return False
        if self.replicas == 0:
            return True
        return None

    def wait_args(self) -> list[P.Arg]:
        assert self.replicas is not None
        return ["WAIT", self.replicas, P.DURABLE_WAIT_MS]

    def acked(self, reply: Any) -> bool:
        """``WAIT``'s reply: durable when every replica acknowledged."""
        assert self.replicas is not None
        return int(reply) >= self.replicas

    @staticmethod
    def again(e: Exception) -> bool:
        """Whether a round that failed with ``e`` is followed by another (a transient failure,
        ``NOREPLICAS``: a master whose replicas are not back yet); else the give-back cannot
        be checked (e.g. ``NOPERM`` for ``INFO`` or ``WAIT``)."""
        return is_resendable(e)


class CountRead:
    """An Owner's lock or write grant that may have found lost holds' counts of its owner
    (``_hold.taken_over``, claimed here): the owner's count, read right after (:attr:`args`;
    None: nothing to read), says how many of them are there (``_hold.stale_present``);
    nothing when it cannot be read (the count ends with the key)."""

    __slots__ = ("args", "rid", "spec", "stale")

    def __init__(self, spec: P.Spec, rid: bytes) -> None:
        self.spec, self.rid = spec, rid
        self.stale = taken_over(spec, rid)
        self.args: Optional[list[P.Arg]] = (
            ["HGET", spec.key, count_field(spec)] if self.stale else None
        )

    def read(self, count: Any) -> list[Hold]:
        """The holds to release, given the count read."""
        return stale_present(self.spec, self.rid, self.stale, count)

    def failed(self, e: Exception) -> list[Hold]:
        """The count was not read: none released."""
        log.warning("redis_rlock: count of %r not read: %s", self.spec.key, e)
        return []


def renewed(hold: Hold, confirms: float) -> list[Hold]:
    """A renewal of ``hold`` was confirmed (every command "1"): the server holds it at least
    until ``confirms``. Returns the holds whose count that confirmation kept on the server
    held by nobody (``_hold.late_renewal``: the guard was declared lost meanwhile), for the
    engine to release in the background."""
    hold.extend(confirms)
    return late_renewal(hold)


class LatchWaiting:
    """One ``CountDownLatch.wait(timeout)`` of the latch ``key``, as a state machine: with no
    time to wait (``look``) one ``RLATCH.COUNT`` (:meth:`looked` reads its outcome); else
    :meth:`next` gives each ``RLATCH.AWAIT`` slice (None: the time is up, the wait is False),
    :meth:`answered` reads its reply, :meth:`failed` its exception, :meth:`pause` says how
    long to wait before the next one (None: the time is up)."""

    def __init__(self, key: bytes, timeout: Optional[float], rt: float) -> None:
        self.key = key
        budget = P.latch_budget(timeout)
        t0 = time.monotonic()
        #: a look without waiting, its answer due by ``look_until``
        self.look, self.look_until = budget == 0.0, t0 + rt
        self.end = None if budget is None else t0 + budget
        self.backoff = 0.02
        self._sent_at = t0

    def looked(self, reply: Any = None, error: Optional[Exception] = None) -> bool:
        """The look's outcome: open, or not (no answer within the response timeout, from a
        stalled, unreachable or loading server, is False as for a timed wait, never an
        exception); an error reply raises the package's exception."""
        if error is not None:
            if not is_transient(error):
                if isinstance(error, ResponseError):
                    raise translate(error, self.key.decode(errors="replace")) from None
                raise error
            return False
        return int(reply) <= 0

    def next(self) -> Optional[tuple[list[P.Arg], float]]:
        """The next ``RLATCH.AWAIT`` slice and how long its reply may take beyond the
        response timeout; None when the time is up."""
        now = time.monotonic()
        if self.end is not None and now >= self.end:
            return None
        self._sent_at = now
        return P.latch_await(self.key, self.end, now)

    def answered(self, reply: Any) -> bool:
        """True: the latch is open. 0: its time (or its slice) ran out, or a server that does
        not block (a replica) or CLIENT UNBLOCK ended it early: sent again while time is left,
        at once when it lasted (a working wait whose slice ended)."""
        if reply == 1:
            return True
        if time.monotonic() - self._sent_at >= 1.0:
            self.backoff = 0.0
        return False

    def failed(self, e: Exception) -> None:
        """A slice raised ``e``: sent again after a lost connection or a failover's
        ``UNBLOCKED``; an error reply otherwise raises the package's exception."""
        if isinstance(e, ResponseError):
            if not (is_transient(e) or P.is_unblocked(e)):
                raise translate(e, self.key.decode(errors="replace")) from None
        elif not is_transient(e):
            raise e
        log.debug("redis_rlock: latch wait on %r sent again: %s", self.key, e)

    def pause(self) -> Optional[float]:
        """How long to wait before the next slice (backing off up to 1 s); None when the time
        is up."""
        now = time.monotonic()
        if self.end is not None and now >= self.end:
            return None
        delay = self.backoff if self.end is None else min(self.backoff, self.end - now)
        self.backoff = min(max(self.backoff * 2, 0.02), 1.0)
        return delay


def reentry_failed(hold: Hold, e: Exception, wait: Optional[float]) -> bool:
    """A re-entry's renewal raised ``e``: an error reply raises the package's exception; a
    transient error of a re-entry with a wait is "not taken" (False); anything else raises."""
    if isinstance(e, ResponseError):
        raise translate(e, _name(hold.spec)) from None
    if is_transient(e) and wait is not None:
        return False
    raise e


def reentered(hold: Hold, confirmed: bool) -> bool:
    """A re-entry's renewal was answered (``confirmed``: the server holds it): one more count
    of ``hold``; :class:`LockLost` when it was lost (found gone, or lost while the renewal was
    in flight: no re-entry of a lost hold)."""
    if not confirmed:
        hold.mark_lost()
    hold.check()
    hold.count += 1
    return True


def renewal_period(hold: Hold) -> float:
    """How often a watchdog renews ``hold``: every third of its lease."""
    return hold.lease_ms / 3000.0


def renewal_failed(hold: Hold, e: Exception, backoff: float) -> float:
    """A watchdog's renewal of ``hold`` raised ``e`` (said unless transient): the next
    backoff, doubling from 50 ms up to the renewal period (the next renewal is due then, or
    at the hold's deadline if sooner)."""
    if not is_transient(e):
        log.warning("redis_rlock: renewal of %r failed: %s", hold.spec.key, e)
    return min(renewal_period(hold), max(0.05, backoff * 2))
