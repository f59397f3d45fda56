"""asyncio sessions: the sync :class:`redis_rlock.Session` on ``redis.asyncio``.

One connection of its own (opened by ``async with`` or the first acquire), whose locks are
session holds. A watcher task pings the idle connection every ``keepalive`` seconds: a close by
the server, or a ping not answered within ``keepalive``, closes the session (seen within two
periods); every hold taken through it is then lost at once. A cancelled acquire leaves its
reply to be read (its request is cancelled, which answers a blocked wait at once) before the
session's next command, so the session stays usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from types import TracebackType
from typing import Any, Awaitable, Callable, Optional

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from .. import _proto as P
from .. import _waits as W
from .._conn import Stalled, log
from .._fork import ForkGuard
from .._handles import SessionHandles
from .._sessions import (
    REPLACED,
    SENTINEL_CHECK_S,
    master_named,
    named_elsewhere,
    replica_refusal,
    sentinel_pool,
    sentinel_query,
    turn_within,
    unsent,
)
from ..errors import SessionClosed
from ._engine import AsyncBackend, backend_for
from ._hold import AsyncHold
from ._object_drivers import AsyncSessionDrivers
from .lock import Lock, RWLock
from .semaphore import LeasedSemaphore


class AsyncClosedSignal:
    """Event-like view of a session's close (``is_set()``, ``await wait(timeout)``)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    def is_set(self) -> bool:
        """True once the session is closed (in a forked child: always)."""
        self._session._forked()
        return self._session._is_closed

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the session is closed (True) or ``timeout`` seconds passed (False)."""
        try:
            await asyncio.wait_for(self._session._closed_event().wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def __bool__(self) -> bool:
        return self.is_set()


class Session(AsyncSessionDrivers, SessionHandles[Lock, RWLock, LeasedSemaphore]):
    """A session on a ``redis.asyncio.Redis`` client (not a cluster): see the sync
    :class:`redis_rlock.Session`. ``async with ra.Session(client) as s:`` opens it and closes
    it; ``await s.close()`` closes it (the server ends its holds)."""

    _lock_class = Lock
    _rw_lock_class = RWLock
    _leased_semaphore_class = LeasedSemaphore

    def __init__(
        self,
        client: Any,
        *,
        lock_delay: float = 0.0,
        keepalive: float = 1.0,
        response_timeout: float = 2.0,
    ) -> None:
        self._options(client, RedisCluster, lock_delay, keepalive, response_timeout)
        self._be: AsyncBackend = backend_for(client, response_timeout)
        self._pool: Any = None
        self._conn: Any = None
        self._mutex = asyncio.Lock()
        self._is_closed = False
        self._event: Optional[asyncio.Event] = None
        self._new_records(contextlib.nullcontext())  # one thread: no lock
        # the reply of a cancelled command, read before the next command
        self._reader: Optional[asyncio.Future[Any]] = None
        self._watcher: Optional[asyncio.Task[None]] = None
        self.client_id: Optional[int] = None
        self._fork = ForkGuard()  # a forked child never uses the parent's socket

    @property
    def closed(self) -> AsyncClosedSignal:
        """Event-like close signal: ``is_set()``, ``await wait(timeout)``."""
        return AsyncClosedSignal(self)

    def _forked(self) -> bool:
        """In a process forked from the session's: closed here (its socket is the parent's),
        without a byte on it; the parent's session is untouched."""
        if not self._fork.forked():
            return False
        self._is_closed, self._conn, self._reader, self._watcher = True, None, None, None
        self._mutex, self._event = asyncio.Lock(), None
        # Its holds are the parent's: the child's copies of them act on nothing (their pid).
        self._new_records(contextlib.nullcontext())
        return True

    def _closed_event(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
            if self._is_closed:
                self._event.set()
        return self._event

    async def open(self) -> Session:
        """Opens the connection (done by ``async with`` and by the first acquire)."""
        async with self._mutex:
            await self._open()
        return self

    async def _open(self) -> None:
        if self._is_closed:
            raise unsent(SessionClosed("the session is closed"))
        if self._conn is not None:
            return
        self._pool = await self._be._pool(b"")
        # A connection of its own, never the pool's: once closed it can never be handed to
        # another caller while a cancelled reader or the watcher still uses it.
        conn = self._pool.connection_class(**self._pool.connection_kwargs)
        self._conn = conn
        try:
            await conn.connect()
            self.client_id = int(await self._raw(["CLIENT", "ID"], 0.0))
        except ResponseError:
            self.client_id = None  # not allowed (ACL)
        self._watcher = asyncio.ensure_future(_watch(weakref.ref(self)))

    def _close_now(self) -> None:
        """Closes at once (no await): the connection is dropped in the background."""
        if self._forked() or self._is_closed:
            return
        self._is_closed = True
        self._closed_event().set()
        if self._reader is not None:
            self._reader.cancel()
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            self._be.background(self._drop(conn))
        self._lose_all()

    async def _drop(self, conn: Any) -> None:
        try:
            await conn.disconnect(nowait=True)
        except Exception as e:
            log.debug("redis_rlock: session disconnect: %s", e)

    async def close(self) -> None:
        """Closes the connection (the server ends its holds); every hold taken through the
        session is lost. Idempotent."""
        self._close_now()
        await self._be.flush(self._rt)

    async def __aenter__(self) -> Session:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._is_closed else "open"
        return f"<redis_rlock.aio.Session id={self.client_id} {state}>"

    # -- the engine's side -------------------------------------------------------------------
    async def call(
        self,
        args: list[P.Arg],
        extra: float,
        silent: Optional[Callable[[], Awaitable[bool]]] = None,
    ) -> Any:
        """One command on the session's connection (see the sync ``Session.call``)."""
        if self._forked():
            raise SessionClosed("the session belongs to the process that forked this one")
        await _take(self._mutex, turn_within(extra, self._rt), args[0])
        try:
            await self._open()
            return await self._raw(args, extra, silent)
        except ResponseError as e:
            refused = e
        finally:
            self._mutex.release()
        if await self._replaced(refused):
            await self.close()
            raise unsent(SessionClosed(REPLACED)) from None
        raise refused

    async def _replaced(self, err: ResponseError) -> bool:
        """As the sync session's: a replica's refusal, or ``NOREPLICAS`` while the Sentinels
        name another master."""
        if replica_refusal(err):
            return True
        conn = self._conn
        pool = sentinel_pool(conn)
        if conn is None or not P.is_noreplicas(err) or pool is None:
            return False
        addresses, ask = sentinel_query(pool)
        end = time.monotonic() + min(SENTINEL_CHECK_S, self._rt)
        for host, port in addresses:
            left = end - time.monotonic()
            if left <= 0:
                break
            sentinel = aredis.Redis(
                host=host,
                port=port,
                socket_timeout=left,
                socket_connect_timeout=left,
                retry=Retry(NoBackoff(), 0),  # redis-py retries timeouts 3 times by default
            )
            try:
                reply = await asyncio.wait_for(sentinel.execute_command(*ask), left)  # type: ignore[no-untyped-call]
                named = master_named(reply)
            except Exception:
                continue  # this Sentinel does not answer: the next one
            finally:
                await sentinel.aclose()
            return named_elsewhere(named, (conn.host, conn.port))
        return False

    async def _raw(
        self,
        args: list[P.Arg],
        extra: float,
        silent: Optional[Callable[[], Awaitable[bool]]] = None,
    ) -> Any:
        if self._is_closed or self._conn is None:
            raise unsent(SessionClosed("the session is closed"))
        conn = self._conn
        if not conn.is_connected:
            # Dropped under us (redis-py disconnects on a cancel inside a send): the server
            # ended the holds; redis-py would silently reconnect.
            self._close_now()
            raise unsent(SessionClosed("the session's connection was dropped"))
        try:
            await self._drain()
            await conn.send_command(*args)
            reader = asyncio.ensure_future(conn.read_response())
            self._reader = reader
            end = time.monotonic() + extra + self._rt
            while True:
                step = end - time.monotonic()
                if silent is not None:
                    step = min(step, W.probe_every(self._rt))
                done, _ = await asyncio.wait({reader}, timeout=max(0.0, step))
                if done:
                    reply = reader.result()
                    break
                if time.monotonic() >= end:
                    raise SessionClosed(f"no reply to {args[0]!r} in time: the session closed")
                if silent is not None and await silent():
                    await asyncio.wait({reader}, timeout=self._rt)
                    if not reader.done():
                        await self._kill_server_side()
                        raise SessionClosed("the session's connection went silent in a wait")
            self._reader = None
            return reply
        except ResponseError:
            self._reader = None
            raise
        except asyncio.CancelledError:
            if not conn.is_connected:
                self._close_now()  # redis-py dropped the socket: the server ends the holds
            raise  # else the reply (if any) is read before the next command
        except Exception as e:
            self._close_now()
            if isinstance(e, SessionClosed):
                raise
            raise SessionClosed(f"the session's connection failed: {e}") from e

    async def _drain(self) -> None:
        """Waits for the reply of a cancelled command (bounded)."""
        reader, self._reader = self._reader, None
        if reader is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(reader), self._ka.drain_within())
        except ResponseError:
            pass
        except asyncio.TimeoutError:
            raise SessionClosed("a cancelled command was never answered") from None

    def adopt(self, hold: AsyncHold) -> None:
        """Records a hold granted through the session (lost when it closes)."""
        self._forked()  # closed in a forked child
        self._record(hold, lambda: self._is_closed)


async def _take(mutex: asyncio.Lock, within: Optional[float], what: P.Arg) -> None:
    """Takes ``mutex`` within ``within`` seconds (None: no limit), else :class:`Stalled`. Not
    ``asyncio.wait_for``, which may lose a lock taken as it times out: a lock that comes after
    its caller left (timed out, cancelled) is given back."""
    if within is None:
        await mutex.acquire()
        return
    taking = asyncio.ensure_future(mutex.acquire())
    try:
        done, _ = await asyncio.wait({taking}, timeout=within)
    except BaseException:
        taking.add_done_callback(lambda f: _give_back(mutex, f))
        taking.cancel()
        raise
    if not done:
        taking.add_done_callback(lambda f: _give_back(mutex, f))
        taking.cancel()
        raise Stalled(f"the session's connection stayed busy for {what!r}")


def _give_back(mutex: asyncio.Lock, taking: asyncio.Future[Any]) -> None:
    if not taking.cancelled() and taking.exception() is None:
        mutex.release()


async def _watch(ref: weakref.ref[Session]) -> None:
    """The watcher task: pings the idle connection every ``keepalive``; ends with the session."""
    while True:
        session = ref()
        if session is None or session._is_closed:
            return
        period = session._ka.due_in()
        del session
        await asyncio.sleep(period)
        session = ref()
        if session is None or session._is_closed:
            return
        if not session._mutex.locked():  # else a command in flight checks the connection
            try:
                async with session._mutex:
                    await session._raw(*session._ka.ping())
            except ResponseError:
                pass  # an answer all the same
            except Exception as e:
                log.info("redis_rlock: session closed: %s", e)
        del session
