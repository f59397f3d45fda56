"""The sync engine: bounded calls on the package's own connections, acquire with exact
cancellation, re-entry, release; one engine per client (its watchdog and background releaser
threads are ``_sync_threads``'s)."""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import time
import uuid
import weakref
from typing import Any, Callable, Optional

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.sentinel import SentinelConnectionPool

from . import _proto as P
from . import _waits as W
from ._conn import (
    Stalled,
    clone_kwargs,
    is_resendable,
    log,
    must_drop,
    pool_name,
    refreshes_topology,
)
from ._core import (
    RELEASE_REFUSED,
    Acquiring,
    Confirming,
    Probing,
    Step,
    Wait,
    cancelling,
    gone,
    release_bounds,
    release_failed,
    release_missed,
    release_refused,
    resend_until,
    settle,
)
from ._drivers import SessionLink, SyncEngineDrivers
from ._fork import check_owner, inherited
from ._hold import (
    Hold,
    LostCallback,
    kept_by_cancel,
    stale_writes,
)
from ._sync_threads import Releaser, Watchdog, on_background_thread
from .errors import RLockError

#: set on an exception whose counted release the engine already handed to the background
HANDED_OVER = "_rlock_release_handed_over"

_ALL: weakref.WeakSet[SyncBackend] = weakref.WeakSet()


def backend_for(client: Any, response_timeout: float) -> SyncBackend:
    """The engine of a redis-py client (one per client and response timeout, cached on the
    client). Lock-free (``dict.setdefault`` is atomic in CPython): a lock taken here could be
    left held by a KeyboardInterrupt landing inside ``with lock:`` (bpo-29988)."""
    if not isinstance(client, (redis.Redis, RedisCluster)):
        raise TypeError("client must be a redis.Redis or redis.cluster.RedisCluster")
    response_timeout = P.check_period(response_timeout, "response_timeout")
    # the user's client keeps its engines alive
    engines: dict[float, SyncBackend] = client.__dict__.setdefault("_redis_rlock_backends", {})
    be = engines.get(response_timeout)
    if be is None:
        be = engines.setdefault(response_timeout, SyncBackend(client, response_timeout))
    if be not in _ALL:
        _ALL.add(be)
    if not getattr(client.close, "_redis_rlock", False):
        _close_with(client)
    return be


def _close_with(client: Any) -> None:
    """Makes the client's ``close()`` (and so ``with client``) close the package's own pools
    of that client too (their connections are the client's, opened for it)."""
    real = client.close

    def close(*args: Any, **kwargs: Any) -> None:
        try:
            real(*args, **kwargs)
        finally:
            for be in list(client.__dict__.get("_redis_rlock_backends", {}).values()):
                be.close()

    close._redis_rlock = True  # type: ignore[attr-defined]
    client.close = close


def _whole_handshake(inner: Optional[Callable[[Any], None]]) -> Callable[[Any], None]:
    """A connection's handshake (``HELLO``, ``AUTH``, ``SELECT``, ``CLIENT SETINFO`` ...: redis-py's
    own, or the client's ``redis_connect_func``) that leaves the connection closed when anything
    interrupts it. redis-py closes it only after a ``RedisError``: a KeyboardInterrupt between a
    handshake command and its reply left a connected socket with replies still to come, which
    the pool handed out again, so the next command read a stale reply (an acquire's grant read
    as a refusal: a counted permit lost for good)."""

    def handshake(conn: Any) -> None:
        try:
            if inner is None:
                conn.on_connect()
            else:
                inner(conn)
        except BaseException:
            conn.disconnect()
            raise

    return handshake


class _Addressed:
    """A pool's connection settings for another address (a redirection's target)."""

    def __init__(self, src: Any, host: str, port: int) -> None:
        self.connection_kwargs = dict(src.connection_kwargs, host=host, port=port)
        self.connection_class = src.connection_class
        self.max_connections = getattr(src, "max_connections", 1)


class SyncBackend(SyncEngineDrivers):
    """Connections, watchdog and releaser of one redis-py client."""

    def __init__(self, client: Any, response_timeout: float) -> None:
        self.client = client
        self.rt = float(response_timeout)
        self.cluster = isinstance(client, RedisCluster)
        self.uuid = uuid.uuid4().hex
        self._n = itertools.count(1)
        # lazily created, lock-free (``dict.setdefault`` is atomic in CPython): a lock the
        # caller's thread takes could be left held by a KeyboardInterrupt landing between its
        # acquire and the ``with`` block (bpo-29988), and freeze the background threads
        self._pools: dict[str, Any] = {}
        self._waits: dict[str, tuple[Any, W.Gate]] = {}
        self._opened: dict[int, object] = {}  # pools whose first connection is being opened
        #: how many times :meth:`close` ran: a call it overlapped lost its connection to it
        self.closes = 0
        self.watchdog = Watchdog(self)
        self.releaser = Releaser(self)
        #: makes answered counted give-backs durable (``confirm_later``): a thread of its own,
        #: so a check waiting on cut-off replicas never delays releases
        self.confirmer = Releaser(self)

    def new_owner(self) -> bytes:
        """A fresh owner id ``<client-uuid>:<n>`` (unique per hold)."""
        return f"{self.uuid}:{next(self._n)}".encode()

    def close(self) -> None:
        """Closes the package's pools of this client (done by the client's ``close()``); a later
        call opens new connections. Only idle connections are disconnected here: a connection
        another thread is using at that moment (a wait in the server, a handshake, a reply being
        read) is never cut under it (that left redis-py's parser reading a closed buffer, or a
        handshake reply unread on a connection redis-py reconnected silently, to be read by the
        next command). Such a call goes on, on its connection, as after any dropped connection
        it would be sent again; its user disconnects that connection when the call ends
        (``closes`` moved on), so none of the connections open at the close is used again."""
        self.closes += 1  # before any disconnect: a call that took its connection earlier sees it
        pools = [*list(self._pools.values()), *(pool for pool, _ in list(self._waits.values()))]
        for pool in pools:
            try:
                pool.disconnect(inuse_connections=False)
            except Exception as e:
                log.debug("redis_rlock: closing a pool: %s", e)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's threads and jobs (their holds are not ours)."""
        self.uuid = uuid.uuid4().hex
        self._pools = {}
        self._waits = {}
        self._opened = {}
        self.watchdog.finalizer.detach()
        self.releaser.finalizer.detach()
        self.confirmer.finalizer.detach()
        self.watchdog = Watchdog(self)
        self.releaser = Releaser(self)
        self.confirmer = Releaser(self)

    # -- connections -------------------------------------------------------------------------
    def _pool(self, key: bytes, at: Optional[tuple[str, int]] = None, wait: bool = False) -> Any:
        """The package's pool for ``key``'s server (or a redirection's target ``at``): the
        one of short commands, or with ``wait`` that of server-side waits (see ``_waits``)."""
        return self._pools_for(key, at, wait)[0]

    def _pools_for(
        self, key: bytes, at: Optional[tuple[str, int]], wait: bool
    ) -> tuple[Any, Optional[W.Gate]]:
        node = None
        if self.cluster and at is not None:
            # a redirection's target: its own pool, on any known node's connection settings
            node = self.client.get_node(host=at[0], port=at[1]) or self.client.get_default_node()
            src = self.client.get_redis_connection(node).connection_pool
            src = _Addressed(src, host=at[0], port=at[1])
        elif self.cluster:
            node = self.client.get_node_from_key(key)
            src = self.client.get_redis_connection(node).connection_pool
        else:
            src = self.client.connection_pool
        # on the watchdog's, the releaser's and the session watchers' threads, their own pools:
        # no lock a caller's thread takes (a KeyboardInterrupt may land in redis-py's pool code
        # at any moment) is ever one these threads wait for; renewals and releases go on
        name = pool_name(at, node, on_background_thread())
        pool = self._pools.get(name)
        if pool is None:  # a pool made twice by a race is dropped unused (no connection yet)
            pool = self._pools.setdefault(name, self._new_pool(src))
        if not wait:
            return pool, None
        pair = self._waits.get(name)
        if pair is None:
            cap = int(getattr(src, "max_connections", 1) or 1)
            pair = self._waits.setdefault(name, (self._new_pool(src), W.Gate(cap)))
        bg_name = pool_name(at, node, background=True)
        bg = self._pools.get(bg_name)
        if bg is None:
            bg = self._pools.setdefault(bg_name, self._new_pool(src))
        for short in (pool, bg):
            if short._available_connections or short._in_use_connections:
                continue
            me = object()
            if self._opened.setdefault(id(short), me) is me:  # once (threads race here)
                # the first wait on this server opens a connection for short commands first
                # (the callers' and the background threads'): the releases, renewals and
                # cancels that end waits must not meet a server full of waiting connections
                try:
                    short.release(W.get_connection(short))
                except Exception as e:
                    self._opened.pop(id(short), None)
                    log.debug("redis_rlock: no connection for short commands yet: %s", e)
        return pair

    def _new_pool(self, src: Any) -> Any:
        kw = clone_kwargs(src.connection_kwargs, self.rt)
        kw["redis_connect_func"] = _whole_handshake(kw.get("redis_connect_func"))
        if isinstance(src, SentinelConnectionPool):
            kw.pop("connection_class", None)
            sentinel_pool: Any = SentinelConnectionPool
            return sentinel_pool(
                src.service_name,
                src.sentinel_manager,
                connection_class=src.connection_class,
                is_master=True,
                check_connection=False,
                **kw,
            )
        return redis.ConnectionPool(connection_class=src.connection_class, **kw)

    def _call_at(
        self,
        key: bytes,
        args: list[P.Arg],
        extra: float,
        at: Optional[tuple[str, int]],
        asking: bool,
        wait: Optional[Wait] = None,
    ) -> Any:
        if wait is None:
            return self._call_conn(self._pool(key, at), key, args, extra, asking, None)
        pool, gate = self._pools_for(key, at, True)
        assert gate is not None
        front = False
        while True:
            # the ticket lands in ``tickets`` inside ``enter``: an interrupt anywhere here (also
            # right after ``enter`` returned) still gives its slot and place in line back
            tickets: list[object] = []
            attempt = None if wait.spec is None else functools.partial(self._try, key, wait)
            try:
                ticket = gate.enter(wait.until, front, tickets, wait.key, attempt)
                if ticket is None:
                    raise Stalled(f"no connection for {args[0]!r} before its deadline")
                if ticket is W.TRIED:
                    return wait.tried  # granted by a try (an interrupt after: the id cancelled)
                wait.sent = lambda t=ticket: gate.sent(t)  # type: ignore[misc]
                return self._call_conn(pool, key, args, extra, asking, wait)
            except Exception as e:
                if not W.is_maxclients(e) or not gate.lower():
                    raise
                front = True  # served as the waits holding connections end, first in line
            finally:
                for t in tickets:
                    gate.leave(t)

    def _call_conn(
        self,
        pool: Any,
        key: bytes,
        args: list[P.Arg],
        extra: float,
        asking: bool,
        wait: Optional[Wait],
    ) -> Any:
        closes = self.closes  # read before the connection is taken: see ``close``
        W.prefer_connected(pool)
        conn: Any = W.get_connection(pool)
        try:
            if asking:
                conn.send_command("ASKING")
                conn.read_response()
            conn.send_command(*args)
            if wait is not None:
                wait.sent()
            run = Probing(wait, extra, self.rt)
            while not conn.can_read(timeout=run.left(1.0)):
                now = time.monotonic()
                if run.due(now):
                    assert wait is not None
                    found, reply = self._check(key, wait)
                    if found and not conn.can_read(timeout=self.rt):  # else: read the reply
                        conn.disconnect()  # silent: its reply (if it ever comes) is dropped
                        return wait.silent(key, reply)
                    run.probed()
                if run.over(now):
                    raise run.stalled(args[0])
            return conn.read_response()
        except BaseException as e:
            self._failed(conn, e)
            raise
        finally:
            if self.closes != closes:
                conn.disconnect()  # open at a close(): closed now that no one uses it
            pool.release(conn)

    def _failed(self, conn: Any, e: BaseException) -> None:
        """After a command on ``conn`` failed with ``e``: the connection dropped when its
        state is unknown, a cluster's slot map refreshed after a topology or transient error."""
        if must_drop(e):
            conn.disconnect()
        if self.cluster and refreshes_topology(e):
            self._refresh_topology()

    def _refresh_topology(self) -> None:
        try:
            self.client.nodes_manager.initialize()
        except Exception as e:  # the next attempt retries
            log.debug("redis_rlock: cluster refresh failed: %s", e)

    # -- acquire / cancel ----------------------------------------------------------------------
    def acquire(
        self,
        spec: P.Spec,
        wait: Optional[float],
        watchdog: bool,
        on_lost: Optional[LostCallback],
        store: Callable[[Hold], None],
        session: Optional[SessionLink] = None,
    ) -> Optional[Hold]:
        """Asks for ``spec`` (waiting up to ``wait`` s in the server; 0: one try; None: no
        limit) with a fresh REQUEST id. A grant is handed to ``store``; whatever ends the call
        without that (timeout, lost reply, stall, KeyboardInterrupt, an error) cancels the
        request exactly (``RLOCK.CANCEL``), so nothing stays held by nobody. With ``session``
        (a session's acquire: ``spec.session``) the command runs on the session's connection,
        and the hold is recorded with the session. What to do after each attempt is
        :class:`~._core.Acquiring`'s to say."""
        run = Acquiring(spec, wait, self.rt)
        hold: Optional[Hold] = None
        if not self.settled_first(run):
            return None
        try:
            while True:
                step = self._attempt(run, session)
                if step.cancel is not None:
                    self.cancel(spec, step.cancel, run.t0)
                if step.kind == Step.AGAIN:
                    continue
                if step.kind == Step.SLEEP:
                    time.sleep(step.delay)
                    continue
                if step.kind == Step.CANCEL_NONE:
                    self.cancel(
                        spec, run.rid, run.t0
                    )  # an attempt may have queued, or been granted
                    run.need_cancel = False
                    return None
                if step.kind == Step.NONE:
                    return None
                if step.kind == Step.RAISE:
                    raise step.failure()
                rid = run.rid
                self.release_stale(stale_writes(spec, rid))
                self.release_stale(self.taken_over(spec, rid))
                hold = Hold(
                    spec, rid, run.t0, spec.lease_ms, watchdog, step.token, step.ids, on_lost
                )
                hold.engine = self
                if session is not None:
                    session.adopt(hold)  # SessionClosed when it closed meanwhile: cancelled
                store(hold)
                self.watchdog.schedule(hold)
                return hold
        except BaseException:
            # Whatever ends the call with an exception, wherever it lands (an error, a
            # KeyboardInterrupt between any two lines, after the grant was stored too): the
            # caller is told nothing was taken, so the grant, if any, is cancelled exactly.
            if run.need_cancel:
                if hold is not None:
                    hold.settled = True  # given back by the cancel below
                    hold.done = True  # a stored guard of a cancelled grant says "not held"
                self.cancel(spec, run.rid, run.t0)
            raise

    def release_stale(self, holds: list[Hold], wait: bool = True) -> None:
        """Releases lost holds whose count a grant or renewal just read may have kept on the
        server (``_hold.stale_writes``, ``_hold.late_renewal``): each hold's own release (its
        fixed request id: sent again, it is never a second release), in the background,
        waited for a bounded time (``wait``: never on the watchdog's thread)."""
        jobs = [
            self.releaser.submit(
                h.spec.key, h.release_args(), 3 * self.rt, ended=settle(h.spec, 4 * self.rt)
            )
            for h in holds
        ]
        for job in jobs if wait else []:
            job.wait(2 * self.rt)

    def cancel(self, spec: P.Spec, rid: bytes, t0: float) -> None:
        """``RLOCK.CANCEL key rid`` of an acquire sent from ``t0`` on, retried in the background
        until answered or the grant's lease would have ended; waits for it a bounded time (two
        response timeouts). A grant given back leaves the key's expiry: see ``kept_by_cancel``."""
        args, horizon = cancelling(spec, rid, self.rt)
        then = functools.partial(kept_by_cancel, spec, t0, asked_at=time.monotonic())
        if spec.kind == P.COUNTED:
            then = functools.partial(self._cancelled_counted, spec.key, args, t0)
        ended = settle(spec, horizon + self.rt)
        job = self.releaser.submit(spec.key, args, horizon, then, ended=ended)
        job.wait(2 * self.rt)

    # -- re-entry / renewal / release -----------------------------------------------------------
    def release(self, hold: Hold) -> None:
        """Gives ``hold`` back (its last count): a release with a request id fixed for the hold
        (:meth:`Hold.release_args`), retried after connection errors (so it is never done
        twice), bounded by the hold's deadline.

        Safe against an exception landing anywhere in it (a KeyboardInterrupt between any two
        lines): unless the server answered (or refused) the release, or the hold was found
        lost, it goes on in the background: the release is idempotent, so sending it twice
        does no harm."""
        settled = False
        first: Optional[float] = None
        ended: Optional[Callable[..., None]] = None  # the release answered or handed on
        try:
            check_owner(hold)
            if hold.is_lost():
                settled = True
                hold.done = True
                raise hold.lost_error()
            spec = hold.spec
            # unsettled while the caller sends it, then while the background does
            ended = settle(spec, P.RELEASE_RESEND_S + self.rt)
            args = hold.release_args()
            hold.done = True
            first, until, resend = release_bounds(hold, self.rt)
            try:
                reply, attempts = self.call_until(spec.key, args, until, resend)
            except Exception as e:
                failed = release_failed(hold, e)
                if failed is None:
                    raise
                if failed != RELEASE_REFUSED:
                    # a counted give-back refused (never given up while the server remembers
                    # it), or a transient failure: the release is idempotent
                    log.warning(
                        "redis_rlock: release of %r goes on in the background: %s", spec.key, e
                    )
                    self.release_later(hold, args, first, ended)
                    ended = None
                    settled = True
                    return
                settled = True
                hold.done = False  # an error reply changed nothing: the caller still holds it
                self.watchdog.schedule(hold)
                raise release_refused(hold, e) from None
            settled = True
            if spec.kind == P.COUNTED:
                self.confirm_later(spec.key, args, first)
            if release_missed(hold, reply, attempts):
                raise gone(hold)
        except BaseException as e:
            if not settled and not isinstance(e, RLockError) and not inherited(hold):
                # KeyboardInterrupt / SystemExit / an unexpected error mid-release: the
                # release was decided (by the call); it goes on in the background (queued
                # first, then the hold marked done)
                self.release_later(hold, None, first, ended)
                ended = None
                hold.done = True
            raise
        finally:
            if ended is not None:
                ended()  # answered (or refused, or never sent)

    def release_later(
        self,
        hold: Hold,
        args: Optional[list[P.Arg]] = None,
        first: Optional[float] = None,
        ended: Optional[Callable[..., None]] = None,
    ) -> None:
        """Sends ``hold``'s (idempotent) release in the background, until answered or
        :func:`~._core.resend_until` (from ``first``, its first send; None: now) passed;
        an answered counted give-back is then made durable. ``ended`` (:func:`~._core.settle`,
        None: a new one) is called once it was answered or given up on."""
        if args is None:
            args = hold.release_args()
        now = time.monotonic()
        then = None
        sent = now if first is None else first
        if hold.spec.kind == P.COUNTED:
            then = functools.partial(self._answered_give_back, hold.spec.key, args, sent)
        horizon = max(0.0, resend_until(hold, sent) - now)
        if ended is None:
            ended = settle(hold.spec, horizon + self.rt)
        self.releaser.submit(hold.spec.key, args, horizon, then, ended=ended)

    def counted_release(self, key: bytes, args: list[P.Arg]) -> Any:
        """``RSEM.RELEASE key n ONCE id`` (``Semaphore.release``): tried for three response
        timeouts in the caller's thread (``NOREPLICAS`` refusals too: nothing was given back);
        unanswered by then, or cut by an exception (a KeyboardInterrupt), the same command goes
        on in the background while the server remembers it (``P.COUNTED_RESEND_S`` from its
        first send) and the caller gets the error: counted permits have no lease, so a release
        given up on is a permit lost. Answered, it is made durable in the background
        (:meth:`confirm_later`)."""
        first = time.monotonic()
        try:
            until = first + min(3 * self.rt, P.COUNTED_RESEND_S)
            reply = self.call_until(key, args, until, is_resendable)[0]
        except BaseException as e:
            if isinstance(e, Exception) and not is_resendable(e):
                raise  # an error reply (or a bad argument): nothing was given back
            log.warning("redis_rlock: release of %r goes on in the background: %r", key, e)
            self.counted_release_later(key, args, first)
            setattr(e, HANDED_OVER, True)  # the caller's own handler need not hand it over
            if isinstance(e, ResponseError):
                # refused all along (NOREPLICAS: a master without its replicas gives back no
                # counted permits), yet not given up: the caller must not release them again
                msg = f"'RSEM.RELEASE' refused ({e}): it goes on in the background"
                raise Stalled(msg) from e
            raise
        self.confirm_later(key, args, first)
        return reply

    def counted_release_later(self, key: bytes, args: list[P.Arg], first: float) -> None:
        """Sends the counted release ``args`` (``ONCE id``: given back once per id, however
        often it is sent) in the background while the server remembers it
        (``P.COUNTED_RESEND_S`` from ``first``), then makes it durable: the release of a call
        interrupted or unanswered, which the caller must not repeat."""
        horizon = first + P.COUNTED_RESEND_S - time.monotonic()
        then = functools.partial(self._answered_give_back, key, args, first)
        self.releaser.submit(key, args, max(0.0, horizon), then)

    def _cancelled_counted(self, key: bytes, args: list[P.Arg], first: float, reply: Any) -> None:
        """An ``RLOCK.CANCEL`` of a counted request answered ``2`` gave its permits back: made
        durable as a counted release is (:meth:`confirm_later`)."""
        if reply == 2:
            self.confirm_later(key, args, first)

    def _answered_give_back(self, key: bytes, args: list[P.Arg], first: float, _: Any) -> None:
        self.confirm_later(key, args, first)

    def confirm_later(self, key: bytes, args: list[P.Arg], first: float) -> None:
        """Makes an answered counted give-back (``args``: a ``RSEM.RELEASE key n REQUEST id``,
        or an ``RLOCK.CANCEL`` that gave counted permits back) durable, in the background: a
        master that answered it and then lost its role (cut off and replaced, resumed from a
        stall already replaced) loses it with its data, and counted permits have no lease to
        bring them back. The confirmer sends ``args`` again (idempotent by its request id: the
        master that ran it does nothing more, a new master whose record still says granted
        gives back now) and ``WAIT``s on that connection for every replica the master has,
        again (the current master) until they all acknowledged or the server forgets the
        request (``P.COUNTED_RESEND_S`` from ``first``)."""
        horizon = first + P.COUNTED_RESEND_S - time.monotonic()
        self.confirmer.submit(key, args, max(0.0, horizon), confirm=True)

    def confirm_round(self, key: bytes, args: list[P.Arg], until: float) -> bool:
        """One round of :meth:`confirm`: True when durable, False when another round is due;
        raises when ``until`` passed (the give-back not known durable) or the check is refused
        (e.g. ``NOPERM`` for ``INFO`` or ``WAIT``: it cannot be checked)."""
        err: BaseException
        try:
            if self.confirm(key, args):
                return True
            err = Stalled(f"{args[0]!r} of {key!r} not acknowledged by every replica")
        except Exception as e:
            if not Confirming.again(e):
                raise
            err = e
        if time.monotonic() >= until:
            raise err
        return False

    def confirm(self, key: bytes, args: list[P.Arg]) -> bool:
        """One round on one connection (so one server): ``args`` sent again, ``INFO
        replication`` (the master's replicas; a server no longer master: False), then ``WAIT n``
        (:data:`P.DURABLE_WAIT_MS`). True when all ``n`` replicas acknowledged (or none)."""
        closes = self.closes
        round_ = Confirming(args)
        pool = self._pool(key)
        conn: Any = W.get_connection(pool)
        try:
            for cmd in round_.commands:
                conn.send_command(*cmd)
                if not conn.can_read(timeout=self.rt):
                    raise Stalled(f"no reply to {cmd[0]!r} within {self.rt:.3f} s")
                reply = conn.read_response()
            seen = round_.seen(reply)
            if seen is not None:
                if not seen:
                    conn.disconnect()  # a demoted master: a new connection finds the current one
                return seen
            within = round_.wait_s + self.rt
            conn.send_command(*round_.wait_args())
            if not conn.can_read(timeout=within):
                raise Stalled(f"no reply to 'WAIT' within {within:.3f} s")
            return round_.acked(conn.read_response())
        except BaseException as e:
            self._failed(conn, e)
            raise
        finally:
            if self.closes != closes:
                conn.disconnect()
            pool.release(conn)

    def abandon(self, hold: Hold) -> None:
        """Undoes a grant its caller will never know of (an exception landed after it was
        recorded): ``RLOCK.CANCEL`` of its request, exact and idempotent, in the background
        (queued first), then the hold is marked done."""
        spec = hold.spec
        horizon = spec.lease_ms / 1000.0 if spec.lease_ms else P.REQUEST_RECORD_S - 10
        hold.settled = True
        args = P.cancel_args(spec.key, hold.rid)
        then = None
        if spec.kind == P.COUNTED:
            then = functools.partial(self._cancelled_counted, spec.key, args, time.monotonic())
        self.releaser.submit(
            spec.key, args, horizon + self.rt, then, ended=settle(spec, horizon + 2 * self.rt)
        )
        hold.done = True


def flush_all(timeout: float = 5.0) -> bool:
    """Waits (bounded) until every background cancel and release of this process was sent.
    The checks that answered counted give-backs reached every replica are not waited for
    (they may go on for 50 s on a master whose replicas are cut off): see :func:`_at_exit`."""
    end = time.monotonic() + timeout
    ok = True
    for be in list(_ALL):
        ok = be.releaser.flush(max(0.0, end - time.monotonic())) and ok
    return ok


def _at_exit(timeout: float) -> None:
    """At the interpreter's exit: background releases sent, then, within the same bound,
    the checks of counted give-backs done (a give-back still unconfirmed then is logged)."""
    end = time.monotonic() + timeout
    flush_all(timeout)
    for be in list(_ALL):
        if not be.confirmer.flush(max(0.0, end - time.monotonic())):
            log.warning("redis_rlock: counted give-backs not known durable at exit")


def _after_fork_in_child() -> None:
    # every lock the package holds at module or client level is new in the child: a thread of
    # the parent may have held one at the fork, and no thread of the child would release it
    for be in list(_ALL):
        be.after_fork()


atexit.register(_at_exit, 5.0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
