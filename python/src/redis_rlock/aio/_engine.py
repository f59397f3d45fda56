"""The asyncio engine: the sync engine's rules on redis.asyncio connections. Cleanup commands
(``RLOCK.CANCEL``, releases) run in shielded tasks, so a cancellation at any await point never
leaves a grant held by nobody. Its holds, and the watchdog tasks and deadline timers that
watch them, are ``_hold``'s."""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid
import weakref
from typing import Any, Awaitable, Callable, Optional

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from .. import _proto as P
from .. import _waits as W
from .._conn import (
    Stalled,
    clone_kwargs,
    is_resendable,
    log,
    must_drop,
    pool_name,
    refreshes_topology,
)
from .._core import (
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
from .._fork import ForkGuard, check_owner
from .._hold import (
    LostCallback,
    kept_by_cancel,
    stale_writes,
)
from ._drivers import AsyncEngineDrivers, AsyncSessionLink
from ._hold import AsyncHold, watch

_BACKENDS: weakref.WeakValueDictionary[tuple[int, float], AsyncBackend] = (
    weakref.WeakValueDictionary()
)


def backend_for(client: Any, response_timeout: float) -> AsyncBackend:
    """The engine of a redis.asyncio client (one per client and response timeout)."""
    if not isinstance(client, (aredis.Redis, RedisCluster)):
        raise TypeError("client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster")
    response_timeout = P.check_period(response_timeout, "response_timeout")
    key = (id(client), response_timeout)
    be = _BACKENDS.get(key)
    if be is None or be.client is not client:
        be = AsyncBackend(client, response_timeout)
        _BACKENDS[key] = be
        if "_redis_rlock_backends" not in client.__dict__:
            client.__dict__["_redis_rlock_backends"] = []
            _close_with(client)
        client.__dict__["_redis_rlock_backends"].append(be)
    return be


def _close_with(client: Any) -> None:
    """Makes the client's ``aclose()`` (and so ``async with client``) close the package's own
    pools of that client too: their connections are the client's, opened for it."""
    real = client.aclose

    async def aclose(*args: Any, **kwargs: Any) -> None:
        try:
            await real(*args, **kwargs)
        finally:
            for be in list(client.__dict__.get("_redis_rlock_backends", ())):
                await be.aclose()

    client.aclose = aclose


class AsyncBackend(AsyncEngineDrivers):
    """Connections, watchdog tasks and background cleanup of one redis.asyncio client."""

    def __init__(self, client: Any, response_timeout: float) -> None:
        self.client = client
        self.rt = float(response_timeout)
        self.cluster = isinstance(client, RedisCluster)
        self.uuid = uuid.uuid4().hex
        self._n = itertools.count(1)
        self._pools: dict[str, Any] = {}
        self._waits: dict[str, tuple[Any, W.AsyncGate]] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        #: checks that answered counted give-backs reached every replica (``confirm_later``):
        #: apart from ``_bg``, so ``flush`` (and a session's close) never waits for them
        self._confirming: set[asyncio.Task[Any]] = set()
        self._fork = ForkGuard()

    async def aclose(self) -> None:
        """Closes the package's pools of this client (done by the client's ``aclose()``): their
        connections are closed; a later call opens new ones."""
        pools = [*self._pools.values(), *(pool for pool, _ in self._waits.values())]
        self._pools, self._waits = {}, {}
        for pool in pools:
            try:
                await pool.aclose()
            except Exception as e:
                log.debug("redis_rlock: closing a pool: %s", e)

    def new_owner(self) -> bytes:
        """A fresh owner id ``<client-uuid>:<n>`` (unique per hold)."""
        if self._fork.forked():
            self.uuid, self._pools, self._waits = uuid.uuid4().hex, {}, {}
        return f"{self.uuid}:{next(self._n)}".encode()

    async def _pool(
        self, key: bytes, at: Optional[tuple[str, int]] = None, wait: bool = False
    ) -> Any:
        """The package's pool for ``key``'s server: of short commands, or with ``wait`` the
        pool and gate of server-side waits (see ``_waits``)."""
        node = None
        if self.cluster:
            await self.client.initialize()
            node = self.client.get_node_from_key(key)
            if at is not None:
                # a redirection's target: its own pool, on the key's node's settings
                node = self.client.get_node(host=at[0], port=at[1]) or node
            host, port = at if at is not None else (node.host, node.port)
            kwargs = dict(node.connection_kwargs, host=host, port=port)
            cls = node.connection_class
            cap = int(getattr(node, "max_connections", 1) or 1)
        else:
            src = self.client.connection_pool
            kwargs, cls = src.connection_kwargs, src.connection_class
            cap = int(getattr(src, "max_connections", 1) or 1)
        name = pool_name(at, node)
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = self._new_pool(kwargs, cls)
        if not wait:
            return pool
        pair = self._waits.get(name)
        if pair is None:
            pair = self._waits[name] = (self._new_pool(kwargs, cls), W.AsyncGate(cap))
            try:  # a connection for short commands before the first wait (see ``_waits``)
                await pool.release(await _connection(pool, self.rt, "a first command"))
            except Exception as e:
                log.debug("redis_rlock: no connection for short commands yet: %s", e)
        return pair

    def _new_pool(self, kwargs: dict[str, Any], cls: Any) -> Any:
        kw = clone_kwargs(kwargs, self.rt, read_timeout=False)
        kw.pop("connection_class", None)
        if not self.cluster and isinstance(self.client.connection_pool, SentinelConnectionPool):
            src = self.client.connection_pool
            sentinel_pool: Any = SentinelConnectionPool
            return sentinel_pool(src.service_name, src.sentinel_manager, connection_class=cls, **kw)
        return aredis.ConnectionPool(connection_class=cls, **kw)

    async def _call_at(
        self,
        key: bytes,
        args: list[P.Arg],
        extra: float,
        at: Optional[tuple[str, int]],
        asking: bool,
        wait: Optional[Wait] = None,
    ) -> Any:
        if wait is None:
            return await self._call_on(await self._pool(key, at), key, args, extra, asking, None)
        pool, gate = await self._pool(key, at, True)
        front = False
        attempt = None if wait.spec is None else functools.partial(self._try, key, wait)
        while True:
            tickets: list[Any] = []
            entry = await gate.enter(wait.until, front, wait.key, attempt, tickets)
            if entry == "late":
                raise Stalled(f"no connection for {args[0]!r} before its deadline")
            if entry == "tried":
                return wait.tried  # granted by a try (a cancellation after: the id cancelled)
            wait.sent = functools.partial(gate.sent, tickets[0])
            try:
                return await self._call_on(pool, key, args, extra, asking, wait)
            except Exception as e:
                if not W.is_maxclients(e) or not gate.lower():
                    raise
                front = True  # served as the waits holding connections end, first in line
            finally:
                gate.leave(tickets[0])

    async def _call_on(
        self,
        pool: Any,
        key: bytes,
        args: list[P.Arg],
        extra: float,
        asking: bool,
        wait: Optional[Wait],
    ) -> Any:
        W.prefer_connected(pool)
        conn: Any = await _connection(pool, self.rt, args[0])
        read: Optional[asyncio.Future[Any]] = None
        try:
            if asking:
                await conn.send_command("ASKING")
                try:
                    await asyncio.wait_for(conn.read_response(), self.rt)
                except asyncio.TimeoutError:
                    raise Stalled(f"no reply to 'ASKING' within {self.rt:.3f} s") from None
            await conn.send_command(*args)
            if wait is not None:
                wait.sent()
            run = Probing(wait, extra, self.rt)
            if wait is None or wait.probe is None:
                try:
                    return await asyncio.wait_for(conn.read_response(), run.within)
                except asyncio.TimeoutError:
                    raise run.stalled(args[0]) from None
            read = asyncio.ensure_future(conn.read_response())
            while True:
                done, _ = await asyncio.wait({read}, timeout=run.slice())
                if done:
                    return read.result()
                if run.over(time.monotonic()):
                    raise run.stalled(args[0])
                found, reply = await self._check(key, wait)
                if found:  # the wait's own connection may answer after all
                    await asyncio.wait({read}, timeout=self.rt)
                if read.done():
                    return read.result()
                if found:
                    await _drop(conn)  # silent: its reply (if it ever comes) is dropped
                    return wait.silent(key, reply)
                run.probed()
        except BaseException as e:
            await self._failed(conn, e)
            raise
        finally:
            if read is not None and not read.done():
                read.cancel()
            await pool.release(conn)

    async def _failed(self, conn: Any, e: BaseException) -> None:
        """After a command on ``conn`` failed with ``e``: the connection dropped when its
        state is unknown, a cluster's slot map refreshed after a topology or transient error
        (the next attempt retries)."""
        if must_drop(e):
            await _drop(conn)
        if self.cluster and refreshes_topology(e):
            try:
                await self.client.nodes_manager.initialize()
            except Exception as err:
                log.debug("redis_rlock: cluster refresh failed: %s", err)

    def release_later(
        self,
        hold: AsyncHold,
        args: list[P.Arg],
        first: float,
        ended: Optional[Callable[..., None]] = None,
    ) -> None:
        """As the sync engine's: ``hold``'s (idempotent) release sent in a background task
        until answered or :func:`~.._core.resend_until` passed; an answered counted give-back
        is then made durable. ``ended`` (:func:`~.._core.settle`, None: a new one) is called
        once it was answered or given up on."""
        horizon = max(0.0, resend_until(hold, first) - time.monotonic())
        if ended is None:
            ended = settle(hold.spec, horizon + self.rt)
        if hold.spec.kind == P.COUNTED:
            task = self.background(self._give_back(hold.spec.key, args, first))
        else:
            task = self.background(self._cleanup(hold.spec.key, args, horizon))
        task.add_done_callback(ended)

    async def counted_release(self, key: bytes, args: list[P.Arg]) -> Any:
        """``RSEM.RELEASE key n ONCE id`` (``Semaphore.release``) in a task nobody's
        cancellation reaches, retried while the server remembers it (``P.COUNTED_RESEND_S``
        from its first send); the caller waits for it up to three response timeouts, then
        gets the error while it goes on: counted permits have no lease, so a release given
        up on (or cancelled with its caller) would be a permit held by nobody for good."""
        first = time.monotonic()
        task = self.background(self._give_back(key, args, first))
        done, _ = await asyncio.wait({task}, timeout=min(3 * self.rt, P.COUNTED_RESEND_S))
        if task in done:
            return task.result()
        task.add_done_callback(_report_unseen)
        msg = f"no reply to 'RSEM.RELEASE' within {3 * self.rt:.3f} s: it goes on in the background"
        raise Stalled(msg)

    async def _give_back(self, key: bytes, args: list[P.Arg], first: float) -> Any:
        """A counted give-back sent (``NOREPLICAS`` too) until answered while the server
        remembers it, then made durable (:meth:`confirm_later`); returns the reply."""
        reply = (await self.call_until(key, args, first + P.COUNTED_RESEND_S, is_resendable))[0]
        self.confirm_later(key, args, first)
        return reply

    def confirm_later(self, key: bytes, args: list[P.Arg], first: float) -> None:
        """As the sync engine's: an answered counted give-back (``RSEM.RELEASE key n REQUEST
        id``, or an ``RLOCK.CANCEL`` that gave counted permits back) sent again and ``WAIT``ed
        for every replica of the master, again on the current master until all acknowledged
        or ``P.COUNTED_RESEND_S`` from ``first`` passed; in a task of its own (not waited for
        by :meth:`flush`)."""
        task = asyncio.ensure_future(self._confirm_until(key, args, first + P.COUNTED_RESEND_S))
        self._confirming.add(task)
        task.add_done_callback(self._confirming.discard)
        task.add_done_callback(_retrieve)

    async def _confirm_until(self, key: bytes, args: list[P.Arg], until: float) -> bool:
        backoff = 0.05
        while True:
            try:
                if await self._confirm(key, args):
                    return True
                err: BaseException = Stalled(f"{args[0]!r} not acknowledged by every replica")
            except Exception as e:
                if not Confirming.again(e):
                    log.warning("redis_rlock: %r of %r not made durable: %s", args[0], key, e)
                    return False  # e.g. NOPERM for INFO or WAIT: it cannot be checked
                err = e
            now = time.monotonic()
            if now >= until:
                log.warning("redis_rlock: gave up on %r for %r: %s", args[0], key, err)
                return False
            await asyncio.sleep(min(backoff, until - now))
            backoff = min(backoff * 2, 1.0)

    async def _confirm(self, key: bytes, args: list[P.Arg]) -> bool:
        """As the sync engine's ``confirm``: on one connection, ``args`` again, ``INFO
        replication`` (a server no longer master: False), ``WAIT n``; True when all ``n``
        replicas acknowledged (or none)."""
        round_ = Confirming(args)
        pool = await self._pool(key)
        conn: Any = await _connection(pool, self.rt, args[0])
        try:
            reply: Any = None
            for cmd in round_.commands:
                await conn.send_command(*cmd)
                try:
                    reply = await asyncio.wait_for(conn.read_response(), self.rt)
                except asyncio.TimeoutError:
                    raise Stalled(f"no reply to {cmd[0]!r} within {self.rt:.3f} s") from None
            seen = round_.seen(reply)
            if seen is not None:
                if not seen:
                    await _drop(conn)  # a demoted master: a new connection finds the current one
                return seen
            within = round_.wait_s + self.rt
            await conn.send_command(*round_.wait_args())
            try:
                acked = await asyncio.wait_for(conn.read_response(), within)
            except asyncio.TimeoutError:
                raise Stalled(f"no reply to 'WAIT' within {within:.3f} s") from None
            return round_.acked(acked)
        except BaseException as e:
            await self._failed(conn, e)
            raise
        finally:
            await pool.release(conn)

    def background(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        """Runs ``coro`` as a task nobody's cancellation reaches (kept until done)."""
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        task.add_done_callback(_retrieve)
        return task

    async def flush(self, timeout: float = 5.0) -> bool:
        """Waits (bounded) until every background cancel and release was sent."""
        if not self._bg:
            return True
        _, pending = await asyncio.wait(set(self._bg), timeout=timeout)
        return not pending

    async def _cleanup(self, key: bytes, args: list[P.Arg], horizon: float) -> Any:
        try:
            until = time.monotonic() + horizon
            return (await self.call_until(key, args, until, is_resendable))[0]
        except Exception as e:
            log.warning("redis_rlock: gave up on %r for %r: %s", args[0], key, e)
            return None

    async def release_stale(self, holds: list[Any], wait: bool = True) -> None:
        """As the sync engine's: lost holds a grant or renewal may have kept on the server,
        released (their own idempotent release) in shielded tasks, awaited a bounded time
        (``wait``: not by the watchdog)."""
        if not holds:
            return
        tasks = []
        for h in holds:
            ended = settle(h.spec, 4 * self.rt)
            tasks.append(self.background(self._cleanup(h.spec.key, h.release_args(), 3 * self.rt)))
            tasks[-1].add_done_callback(ended)
        if not wait:
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*tasks)), 2 * self.rt)
        except asyncio.TimeoutError:
            pass

    async def cancel(self, spec: P.Spec, rid: bytes, t0: float) -> None:
        """``RLOCK.CANCEL key rid`` of an acquire sent from ``t0`` on, in a shielded task,
        awaited a bounded time (a grant given back leaves the key's expiry: ``kept_by_cancel``)."""
        args, horizon = cancelling(spec, rid, self.rt)
        asked_at = time.monotonic()
        ended = settle(spec, horizon + self.rt)
        task = self.background(self._cleanup(spec.key, args, horizon))
        task.add_done_callback(ended)
        task.add_done_callback(functools.partial(_kept_by_cancel, spec, t0, asked_at))
        if spec.kind == P.COUNTED:
            task.add_done_callback(functools.partial(self._cancelled_counted, spec.key, args, t0))
        try:
            await asyncio.wait_for(asyncio.shield(task), 2 * self.rt)
        except asyncio.TimeoutError:
            pass

    def _cancelled_counted(
        self, key: bytes, args: list[P.Arg], first: float, task: asyncio.Task[Any]
    ) -> None:
        """A cancellation of a counted request answered ``2`` gave its permits back: made
        durable as a counted release is (:meth:`confirm_later`)."""
        if not task.cancelled() and task.exception() is None and task.result() == 2:
            self.confirm_later(key, args, first)

    async def acquire(
        self,
        spec: P.Spec,
        wait: Optional[float],
        watchdog: bool,
        on_lost: Optional[LostCallback],
        store: Callable[[AsyncHold], None],
        session: Optional[AsyncSessionLink] = None,
    ) -> Optional[AsyncHold]:
        """As the sync engine's ``acquire`` (its decisions: :class:`~.._core.Acquiring`); a
        cancellation at any await cancels exactly. With ``session`` the command runs on the
        session's connection, the hold is recorded with it."""
        run = Acquiring(spec, wait, self.rt)
        if not await self.settled_first(run):
            return None
        handed = False
        try:
            while True:
                step = await self._attempt(run, session)
                if step.cancel is not None:
                    await self.cancel(spec, step.cancel, run.t0)
                if step.kind == Step.AGAIN:
                    continue
                if step.kind == Step.SLEEP:
                    await asyncio.sleep(step.delay)
                    continue
                if step.kind in (Step.NONE, Step.CANCEL_NONE):
                    return None  # CANCEL_NONE: ``need_cancel`` is set, the cancel below
                if step.kind == Step.RAISE:
                    raise step.failure()
                rid = run.rid
                await self.release_stale(stale_writes(spec, rid))
                await self.release_stale(await self.taken_over(spec, rid))
                hold = AsyncHold(
                    spec, rid, run.t0, spec.lease_ms, watchdog, step.token, step.ids, on_lost
                )
                hold.engine = self
                if session is not None:
                    session.adopt(hold)  # SessionClosed when it closed meanwhile: cancelled
                store(hold)
                handed = True
                watch(hold, self)
                return hold
        finally:
            if run.need_cancel and not handed:
                await self.cancel(spec, run.rid, run.t0)

    async def release(self, hold: AsyncHold) -> None:
        """Gives ``hold`` back in a shielded task (a cancelled release still completes)."""
        check_owner(hold)
        was_lost = hold.is_lost()
        hold.done = True
        hold.stop()
        if was_lost:
            raise hold.lost_error()
        task = self.background(self._release(hold))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_report_unseen)  # nobody awaits it any more
            raise

    async def _release(self, hold: AsyncHold) -> None:
        spec = hold.spec
        ended = settle(spec, P.RELEASE_RESEND_S + self.rt)  # the call's, then the background's
        args = hold.release_args()  # idempotent: the same request id every time
        first, until, resend = release_bounds(hold, self.rt)
        try:
            reply, attempts = await self.call_until(spec.key, args, until, resend)
        except Exception as e:
            failed = release_failed(hold, e)
            if failed is None:
                ended()
                raise
            if failed != RELEASE_REFUSED:
                # a counted give-back refused (never given up while the server remembers
                # it), or a transient failure: the release is idempotent
                log.warning("redis_rlock: release of %r goes on in the background: %s", spec.key, e)
                self.release_later(hold, args, first, ended)
                return
            ended()
            hold.done = False  # an error reply changed nothing: the caller still holds it
            watch(hold, self)
            raise release_refused(hold, e) from None
        except BaseException:
            ended()  # the task cancelled (the loop closing): nothing goes on
            raise
        ended()  # answered
        if spec.kind == P.COUNTED:
            self.confirm_later(spec.key, args, first)
        if release_missed(hold, reply, attempts):
            raise gone(hold)


#: How many of its caller's bounds a connection's handshake may go on after the caller gave
#: up on it (then it is cut, and the connection dropped).
HANDSHAKE_ROOM = 10


async def _connection(pool: Any, timeout: float, what: P.Arg) -> Any:
    """A connection of ``pool`` within ``timeout`` (a new connection's handshake has no socket
    timeout under asyncio), else :class:`Stalled`. Not ``asyncio.wait_for``: before Python
    3.12 it can swallow a cancellation that lands as the connection is ready. A connection
    that comes after its caller left (cancelled, or ``timeout`` passed) goes back to the pool:
    its handshake is not cut at ``timeout`` but goes on (up to ``HANDSHAKE_ROOM`` times it),
    so over a link where a handshake takes longer than the response timeout a retry finds a
    connection ready (cut, every retry's handshake would be cut again: a release retried
    while the server remembers it would never get through)."""
    before = {id(c) for c in list(getattr(pool, "_available_connections", [])) if _open(c)}
    get = asyncio.ensure_future(pool.get_connection())
    try:
        done, _ = await asyncio.wait({get}, timeout=timeout)
    except BaseException:
        _finish_later(pool, get, before, timeout)
        raise
    if not done:
        _finish_later(pool, get, before, timeout)
        raise Stalled(f"no connection for {what!r} within {timeout:.3f} s")
    return get.result()


def _finish_later(pool: Any, get: asyncio.Future[Any], before: set[int], timeout: float) -> None:
    """``get``'s connection, once ready, back to the pool; cut (and dropped) after
    ``HANDSHAKE_ROOM`` times ``timeout`` more."""
    get.add_done_callback(lambda f: _give_back(pool, f, before))
    if not get.done():
        cut = asyncio.get_running_loop().call_later(HANDSHAKE_ROOM * timeout, get.cancel)
        get.add_done_callback(lambda f: cut.cancel())


_GIVING_BACK: set[asyncio.Task[Any]] = set()


def _open(conn: Any) -> bool:
    return bool(getattr(conn, "is_connected", False))


def _give_back(pool: Any, fut: asyncio.Future[Any], before: set[int]) -> None:
    """A connection that came after its caller left goes back to the pool; one cancelled in
    its handshake (redis-py keeps its socket, the handshake's replies unread, and puts it
    back in the pool) is disconnected: its next user would read those replies."""
    if not fut.cancelled() and fut.exception() is None:
        work: Any = pool.release(fut.result())
    else:
        stale = [
            c
            for c in list(getattr(pool, "_available_connections", []))
            if id(c) not in before and _open(c)
        ]
        work = asyncio.gather(*(c.disconnect(nowait=True) for c in stale), return_exceptions=True)
    task = asyncio.ensure_future(work)
    _GIVING_BACK.add(task)
    task.add_done_callback(_GIVING_BACK.discard)


async def _drop(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except BaseException:
        pass


def _kept_by_cancel(spec: P.Spec, t0: float, asked_at: float, task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is None:
        kept_by_cancel(spec, t0, task.result(), asked_at)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Retrieves a background task's exception (never "Task exception was never retrieved")."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("redis_rlock: background task failed: %r", task.exception())


def _report_unseen(task: asyncio.Task[Any]) -> None:
    """A release whose caller was cancelled failed: said once, as a warning."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("redis_rlock: release after a cancellation failed: %r", task.exception())
