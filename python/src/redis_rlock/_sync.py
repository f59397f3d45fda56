"""The sync engine: bounded calls on the package's own connections, acquire with exact
cancellation, re-entry, release; one engine per client (its watchdog and background releaser
threads are ``_sync_threads``'s)."""

from __future__ import annotations

import atexit
import itertools
import math
import os
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Optional, Protocol

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, ResponseError
from redis.sentinel import SentinelConnectionPool

from . import _proto as P
from ._conn import TOPOLOGY, Stalled, clone_kwargs, is_transient, log, must_drop
from ._fork import check_owner
from ._hold import Hold, LostCallback
from ._sync_threads import Releaser, Watchdog
from .errors import translate

_BACKENDS: weakref.WeakValueDictionary[tuple[int, float], SyncBackend] = (
    weakref.WeakValueDictionary()
)
_ALL: weakref.WeakSet[SyncBackend] = weakref.WeakSet()
_REGISTRY_LOCK = threading.Lock()


def backend_for(client: Any, response_timeout: float) -> SyncBackend:
    """The engine of a redis-py client (one per client and response timeout, cached)."""
    if not isinstance(client, (redis.Redis, RedisCluster)):
        raise TypeError("client must be a redis.Redis or redis.cluster.RedisCluster")
    key = (id(client), response_timeout)
    with _REGISTRY_LOCK:
        be = _BACKENDS.get(key)
        if be is None or be.client is not client:
            be = SyncBackend(client, response_timeout)
            _BACKENDS[key] = be
            _ALL.add(be)
            # the user's client keeps its engine alive
            client.__dict__.setdefault("_redis_rlock_backends", []).append(be)
        return be


class _Addressed:
    """A pool's connection settings for another address (a redirection's target)."""

    def __init__(self, src: Any, host: str, port: int) -> None:
        self.connection_kwargs = dict(src.connection_kwargs, host=host, port=port)
        self.connection_class = src.connection_class


class SessionLink(Protocol):
    """What the engine needs of a session: its connection, and a record of its holds."""

    def call(self, args: list[P.Arg], extra: float) -> Any:
        """One command on the session's connection (raises SessionClosed once closed)."""

    def adopt(self, hold: Hold) -> None:
        """Records a hold granted through the session (raises SessionClosed once closed)."""


class SyncBackend:
    """Connections, watchdog and releaser of one redis-py client."""

    def __init__(self, client: Any, response_timeout: float) -> None:
        self.client = client
        self.rt = float(response_timeout)
        self.cluster = isinstance(client, RedisCluster)
        self.uuid = uuid.uuid4().hex
        self._n = itertools.count(1)
        self._pools: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.watchdog = Watchdog(self)
        self.releaser = Releaser(self)

    def new_owner(self) -> bytes:
        """A fresh owner id ``<client-uuid>:<n>`` (unique per hold)."""
        return f"{self.uuid}:{next(self._n)}".encode()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's threads and jobs (their holds are not ours)."""
        self.uuid = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._pools = {}
        self.watchdog = Watchdog(self)
        self.releaser = Releaser(self)

    # -- connections -------------------------------------------------------------------------
    def _pool(self, key: bytes, at: Optional[tuple[str, int]] = None) -> Any:
        if self.cluster and at is not None:
            # a redirection's target: its own pool, on any known node's connection settings
            node = self.client.get_node(host=at[0], port=at[1]) or self.client.get_default_node()
            src = self.client.get_redis_connection(node).connection_pool
            name = f"{at[0]}:{at[1]}"
            src = _Addressed(src, host=at[0], port=at[1])
        elif self.cluster:
            node = self.client.get_node_from_key(key)
            src = self.client.get_redis_connection(node).connection_pool
            name = node.name
        else:
            src = self.client.connection_pool
            name = ""
        with self._lock:
            pool = self._pools.get(name)
            if pool is None:
                kw = clone_kwargs(src.connection_kwargs, self.rt)
                if isinstance(src, SentinelConnectionPool):
                    kw.pop("connection_class", None)
                    sentinel_pool: Any = SentinelConnectionPool
                    pool = sentinel_pool(
                        src.service_name,
                        src.sentinel_manager,
                        connection_class=src.connection_class,
                        is_master=True,
                        check_connection=False,
                        **kw,
                    )
                else:
                    pool = redis.ConnectionPool(connection_class=src.connection_class, **kw)
                self._pools[name] = pool
            return pool

    def call(self, key: bytes, args: list[P.Arg], extra: float = 0.0) -> Any:
        """Sends one command and reads its reply within ``extra`` + the response timeout;
        raises :class:`Stalled` (connection closed) when no reply came by then. In a cluster,
        a ``MOVED`` or ``ASK`` reply (the command did not run) sends it again where the key is
        served now (``ASKING`` first for an ``ASK``), as redis-py's cluster client does."""
        at: Optional[tuple[str, int]] = None
        asking = False
        for _ in range(P.MAX_REDIRECTS):
            try:
                return self._call_at(key, args, extra, at, asking)
            except AskError as e:
                if not self.cluster:
                    raise
                at, asking = (e.host, e.port), not isinstance(e, MovedError)
        return self._call_at(key, args, extra, at, asking)

    def _call_at(
        self,
        key: bytes,
        args: list[P.Arg],
        extra: float,
        at: Optional[tuple[str, int]],
        asking: bool,
    ) -> Any:
        pool = self._pool(key, at)
        conn: Any = pool.get_connection()
        try:
            if asking:
                conn.send_command("ASKING")
                conn.read_response()
            conn.send_command(*args)
            end = time.monotonic() + extra + self.rt
            while not conn.can_read(timeout=max(0.0, min(end - time.monotonic(), 1.0))):
                if time.monotonic() >= end:
                    raise Stalled(f"no reply to {args[0]!r} within {extra + self.rt:.3f} s")
            return conn.read_response()
        except BaseException as e:
            if must_drop(e):
                conn.disconnect()
            if self.cluster and (isinstance(e, TOPOLOGY) or is_transient(e)):
                self._refresh_topology()
            raise
        finally:
            pool.release(conn)

    def _refresh_topology(self) -> None:
        try:
            self.client.nodes_manager.initialize()
        except Exception as e:  # the next attempt retries
            log.debug("redis_rlock: cluster refresh failed: %s", e)

    def call_until(self, key: bytes, args: list[P.Arg], until: Optional[float]) -> tuple[Any, int]:
        """Sends an idempotent command, again after transient errors, until a reply or
        ``until`` (monotonic; None: no limit). Returns (reply, attempts)."""
        backoff, attempts = 0.02, 0
        while True:
            attempts += 1
            try:
                return self.call(key, args), attempts
            except ResponseError as e:
                if not is_transient(e):
                    raise
                err: BaseException = e
            except Exception as e:
                if not is_transient(e):
                    raise
                err = e
            now = time.monotonic()
            if until is not None and now >= until:
                raise err
            time.sleep(min(backoff, until - now) if until is not None else backoff)
            backoff = min(backoff * 2, 1.0)

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
        and the hold is recorded with the session."""
        rid = P.new_id()
        t0 = time.monotonic()
        end = None if wait is None else t0 + wait
        retry_end = (
            t0 + self.rt if wait == 0.0 else end
        )  # one try: transient errors retried briefly
        need_cancel = handed = False
        backoff, attempts = 0.02, 0
        try:
            while True:
                now = time.monotonic()
                if wait == 0.0:
                    wait_ms: Optional[int] = None
                elif end is None:
                    wait_ms = 0
                else:
                    wait_ms = max(1, math.ceil((end - now) * 1000)) if end > now else None
                need_cancel = True
                attempts += 1
                try:
                    args, extra = (
                        spec.acquire(rid, wait_ms),
                        (wait_ms or 0) / 1000.0 if end is not None else 1e9,
                    )
                    if session is not None:
                        reply = session.call(args, extra)
                    else:
                        reply = self.call(spec.key, args, extra)
                except Exception as e:
                    if isinstance(e, ResponseError) and P.is_cancelled_reply(e):
                        need_cancel = False
                        return None
                    if isinstance(e, ResponseError) and P.is_noreplicas(e) and wait != 0.0:
                        # this master grants nothing until its replicas are in sync (a promoted
                        # master waiting for one, a master that lost them): asked again, backing
                        # off, within the acquire's deadline; NoReplicas when it passes
                        now = time.monotonic()
                        if end is not None and now + min(backoff, 0.05) >= end:
                            need_cancel = attempts > 1  # an earlier attempt may have queued
                            raise translate(e, spec.key.decode(errors="replace")) from None
                        step = backoff if end is None else min(backoff, end - now)
                        time.sleep(max(step, 0.0))
                        backoff = min(backoff * 2, 1.0)
                        continue
                    if not is_transient(e):
                        if isinstance(e, ResponseError):
                            need_cancel = False  # an error reply changed nothing
                            raise translate(e, spec.key.decode(errors="replace")) from None
                        raise
                    now = time.monotonic()
                    if retry_end is not None and now >= retry_end:
                        if wait == 0.0:
                            raise
                        return None
                    step = backoff if retry_end is None else min(backoff, retry_end - now)
                    time.sleep(max(step, 0.0))
                    backoff = min(backoff * 2, 1.0)
                    continue
                ok, token, ids, again = spec.granted(reply)
                if not ok:
                    need_cancel = False
                    if again and (end is None or time.monotonic() < end) and wait != 0.0:
                        continue
                    return None
                hold = Hold(spec, rid, t0, spec.lease_ms, watchdog, token, ids, on_lost)
                hold.engine = self
                if session is not None:
                    session.adopt(hold)  # SessionClosed when it closed meanwhile: cancelled
                store(hold)
                handed = True
                self.watchdog.schedule(hold)
                return hold
        finally:
            if need_cancel and not handed:
                self.cancel(spec, rid)

    def cancel(self, spec: P.Spec, rid: bytes) -> None:
        """``RLOCK.CANCEL key rid``, retried in the background until answered or the grant's
        lease would have ended; waits for it a bounded time (two response timeouts)."""
        horizon = spec.lease_ms / 1000.0 if spec.lease_ms else P.REQUEST_RECORD_S
        job = self.releaser.submit(spec.key, P.cancel_args(spec.key, rid), horizon + self.rt)
        job.wait(2 * self.rt)

    # -- re-entry / renewal / release -----------------------------------------------------------
    def renew(self, hold: Hold, lease_ms: int, until: Optional[float]) -> bool:
        """Renews every part of ``hold`` for ``lease_ms``; True when the server confirmed."""
        sent = time.monotonic()
        lease_ms = hold.renewal_lease_ms(lease_ms, sent)
        for cmd in hold.spec.renew(lease_ms, hold.ids):
            reply, _ = self.call_until(hold.spec.key, cmd, until)
            if reply != 1:
                return False
        hold.extend(sent, lease_ms)
        return True

    def reenter(self, hold: Hold, lease_ms: int, wait: Optional[float]) -> bool:
        """Joins ``hold`` again once the server confirmed it (a renewal that never shortens
        the lease); raises :class:`LockLost` when it is gone."""
        check_owner(hold)
        hold.check()
        remaining = max(0, math.ceil((hold.deadline - time.monotonic()) * 1000))
        lease = max(lease_ms, hold.lease_ms if hold.watchdog else remaining, 1)
        until = time.monotonic() + (self.rt if not wait else wait)
        try:
            confirmed = self.renew(hold, lease, until)
        except ResponseError as e:
            raise translate(e, hold.spec.key.decode(errors="replace")) from None
        except Exception as e:
            if is_transient(e) and wait is not None:
                return False
            raise
        if not confirmed:
            hold.mark_lost()
            hold.check()
        hold.count += 1
        return True

    def release(self, hold: Hold) -> None:
        """Gives ``hold`` back (its last count): a release with a request id, retried after
        connection errors (so it is never done twice), bounded by the hold's deadline."""
        check_owner(hold)
        was_lost = hold.is_lost()
        hold.done = True
        if was_lost:
            raise hold.lost_error()
        spec = hold.spec
        if spec.kind == P.COUNTED and time.monotonic() < hold.sent_at + P.REQUEST_RECORD_S - 5:
            args = P.cancel_args(spec.key, hold.rid)  # exact and idempotent while the record lives
        else:
            args = spec.release(P.new_id(), hold.ids)
        if spec.kind == P.COUNTED and args[0] == "RSEM.RELEASE":
            self.call(spec.key, args)  # counted permits carry no owner: never sent twice
            return
        until = min(hold.deadline, time.monotonic() + 3 * self.rt)
        try:
            reply, attempts = self.call_until(spec.key, args, until)
        except ResponseError as e:
            hold.done = False  # an error reply changed nothing: the caller still holds it
            self.watchdog.schedule(hold)
            raise translate(e, spec.key.decode(errors="replace")) from None
        except Exception as e:
            if not is_transient(e):
                raise
            log.warning("redis_rlock: release of %r goes on in the background: %s", spec.key, e)
            self.releaser.submit(spec.key, args, max(0.0, hold.deadline - time.monotonic()))
            return
        except BaseException:
            # KeyboardInterrupt / SystemExit mid-release: the release is idempotent (its own
            # request id, or the CANCEL of the grant's), so it goes on in the background
            self.releaser.submit(spec.key, args, max(0.0, hold.deadline - time.monotonic()))
            raise
        if spec.kind == P.COUNTED:
            if reply == 0 and attempts == 1:  # record gone (evicted): give back by count
                self.call(spec.key, spec.release(b"", None))
            return
        if not spec.released(reply, hold.ids) and not (spec.kind == P.LEASED and attempts > 1):
            hold.done = False
            hold.mark_lost()
            hold.done = True
            raise hold.lost_error()


def flush_all(timeout: float = 5.0) -> bool:
    """Waits (bounded) until every background cancel and release of this process was sent."""
    end = time.monotonic() + timeout
    ok = True
    for be in list(_ALL):
        ok = be.releaser.flush(max(0.0, end - time.monotonic())) and ok
    return ok


def _after_fork_in_child() -> None:
    # every lock the package holds at module or client level is new in the child: a thread of
    # the parent may have held one at the fork, and no thread of the child would release it
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for be in list(_ALL):
        be.after_fork()


atexit.register(flush_all, 5.0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
