"""Sync sessions: one connection of their own whose locks are session holds (``SESSION``).

The server ends a session hold as soon as the connection that made it closes (the process
died, ``close()``, ``CLIENT KILL``); the session marks every hold taken through it lost at once.
A watcher thread sleeps on the idle connection's socket, so a close by the server is seen at
once, and pings it every ``keepalive`` seconds: a ping not answered within ``keepalive`` closes
the session (a server that stopped answering, a cut network), within two periods. While an
acquire is in flight on the connection (a blocked ``WAIT``) the watcher waits for it.
"""

from __future__ import annotations

import math
import select
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Optional

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.retry import Retry

from . import _proto as P
from . import _waits as W
from ._conn import Stalled, log
from ._flag import Flag, start_daemon
from ._fork import ForkGuard
from ._handles import SessionHandles
from ._hold import Hold
from ._object_drivers import SyncSessionDrivers
from ._sessions import MAX_LOCK_DELAY_S as MAX_LOCK_DELAY_S
from ._sessions import (
    REPLACED,
    SENTINEL_CHECK_S,
    master_named,
    named_elsewhere,
    replica_refusal,
    sentinel_pool,
    sentinel_query,
    unsent,
)
from ._sessions import check_keepalive as check_keepalive
from ._sessions import lock_delay_ms as lock_delay_ms
from ._sessions import turn_within as turn_within
from ._sync import SyncBackend, backend_for
from ._sync_threads import mark_background
from .errors import SessionClosed
from .lock import Lock, RWLock
from .semaphore import LeasedSemaphore


class ClosedSignal:
    """Event-like view of a session's close (``is_set()``, ``wait(timeout)``)."""

    __slots__ = ("_event",)

    def __init__(self, event: Flag) -> None:
        self._event = event

    def is_set(self) -> bool:
        """True once the session is closed."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the session is closed (True) or ``timeout`` seconds passed (False)."""
        return self._event.wait(timeout)

    def __bool__(self) -> bool:
        return self.is_set()


class Session(SyncSessionDrivers, SessionHandles[Lock, RWLock, LeasedSemaphore]):
    """A session on a ``redis.Redis`` client (a Sentinel master's included; not a cluster):
    one connection of its own, whose :meth:`lock`, :meth:`rw_lock` and
    :meth:`leased_semaphore` take session holds. Acquires (tries and waits) run on that
    connection, one at a time (a waiting acquire holds it); renewals and releases use the
    client's other connections. When the connection closes or fails, every hold taken through
    the session is lost at once and later acquires raise :class:`SessionClosed`: the session
    never reconnects. ``close()`` (or leaving ``with``) closes the connection, which ends its
    holds on the server.

    ``lock_delay``: seconds (0 to 60) nobody is granted a lock after a hold of this session
    ended because the connection closed (``LOCKDELAY``). ``keepalive``: the ping period."""

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
        self._be: SyncBackend = backend_for(client, response_timeout)
        self._pool = self._be._pool(b"")
        # A connection of its own, never the pool's: once closed it can never be handed to
        # another caller while the watcher still reads or writes on it.
        self._conn: Any = self._pool.connection_class(**self._pool.connection_kwargs)
        self._mutex = threading.Lock()
        # (flags, not threading.Events: the watcher sets them while callers wait for them, and
        # an Event's lock may be left held by a KeyboardInterrupt in a caller's wait)
        self._closed = Flag()  # closing: no command, no new hold from now on
        self._ended = Flag()  # closed, every hold lost (``closed``)
        # ``_holds``' lock, never held across I/O: a grant is recorded at once, not behind the
        # session's next command (a wait, perhaps for the lock just granted)
        self._new_records(threading.Lock())
        self._fork = ForkGuard()  # a forked child never uses the parent's socket
        try:
            self._conn.connect()
            self.client_id: Optional[int] = int(self._raw(["CLIENT", "ID"], 0.0))
        except ResponseError:
            self.client_id = None  # not allowed (ACL)
        except BaseException:
            self._conn.disconnect()
            raise
        self._watcher = start_daemon(_watch, (weakref.ref(self),), "redis-rlock-session")

    @property
    def closed(self) -> ClosedSignal:
        """Event-like close signal: ``is_set()``, ``wait(timeout)``. Closed in a forked
        child: the session's connection is its parent's."""
        self._forked()
        return ClosedSignal(self._ended)

    def _forked(self) -> bool:
        """In a process forked from the session's (its socket is the parent's, its watcher
        did not follow, its locks may have been held by a parent thread): the session is
        closed here, without a byte on the parent's socket; the parent's session is untouched."""
        if not self._fork.forked():
            return False
        self._mutex = threading.Lock()
        self._closed, self._ended = Flag(), Flag()
        self._closed.set()
        self._ended.set()
        # Its holds are the parent's: the child's copies of them act on nothing (their pid);
        # a new lock (the old one perhaps held by a parent's thread at the fork).
        self._new_records(threading.Lock())
        return True

    def close(self) -> None:
        """Closes the connection (the server ends its holds); every hold taken through the
        session is lost. Idempotent."""
        if self._forked() or self._closed.is_set():
            return
        self._closed.set()
        conn = self._conn
        try:
            conn.disconnect()
        except Exception as e:
            log.debug("redis_rlock: session disconnect: %s", e)
        self._lose_all()
        self._ended.set()  # only now: whoever ``closed`` wakes finds every hold lost

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", Flag()).is_set() and hasattr(self, "_conn"):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "open"
        return f"<redis_rlock.Session id={self.client_id} {state}>"

    # -- the engine's side -------------------------------------------------------------------
    def call(
        self, args: list[P.Arg], extra: float, silent: Optional[Callable[[], bool]] = None
    ) -> Any:
        """One command on the session's connection, its reply awaited within ``extra`` + the
        response timeout. Error replies are raised as they are; any other failure closes the
        session (:class:`SessionClosed`). An interrupt (KeyboardInterrupt) leaves the reply to
        be read before the next command. ``silent`` (a wait's check, see ``_waits``), asked
        every few response timeouts while no reply came, True when the server answered the
        wait elsewhere: the connection is dead, the session closes (its server side killed)."""
        if self._forked():
            raise SessionClosed("the session belongs to the process that forked this one")
        turn = turn_within(extra, self._rt)
        if not self._mutex.acquire(timeout=-1 if turn is None else turn):
            raise Stalled(f"the session's connection stayed busy for {args[0]!r}")
        try:
            return self._raw(args, extra, silent)
        except ResponseError as e:
            refused = e
        finally:
            self._mutex.release()
        if self._replaced(refused):
            self.close()
            raise unsent(SessionClosed(REPLACED)) from None
        raise refused

    def _replaced(self, err: ResponseError) -> bool:
        """Whether ``err``, an error reply to the session's command, says its server is no
        longer the master: a replica's refusal, or ``NOREPLICAS`` while the Sentinels name
        another master. A master that grants nothing for a while (its replicas lag) is still
        the session's: the engine asks it again."""
        if replica_refusal(err):
            return True
        pool = sentinel_pool(self._conn)
        if not P.is_noreplicas(err) or pool is None:
            return False
        addresses, ask = sentinel_query(pool)
        end = time.monotonic() + min(SENTINEL_CHECK_S, self._rt)
        for host, port in addresses:
            left = end - time.monotonic()
            if left <= 0:
                break
            sentinel = redis.Redis(
                host=host,
                port=port,
                socket_timeout=left,
                socket_connect_timeout=left,
                retry=Retry(NoBackoff(), 0),  # redis-py retries timeouts 3 times by default
            )
            try:
                named = master_named(sentinel.execute_command(*ask))  # type: ignore[no-untyped-call]
            except Exception:
                continue  # this Sentinel does not answer: the next one
            finally:
                sentinel.close()
            # None answering: as every other command, the master known last
            return named_elsewhere(named, (self._conn.host, self._conn.port))
        return False

    def _raw(
        self, args: list[P.Arg], extra: float, silent: Optional[Callable[[], bool]] = None
    ) -> Any:
        if self._closed.is_set():
            raise unsent(SessionClosed("the session is closed"))
        conn = self._conn
        if getattr(conn, "_sock", None) is None:
            # Dropped under us (redis-py disconnects on an interrupt inside a read or a
            # send): the server ended the holds; redis-py would silently reconnect.
            self.close()
            raise unsent(SessionClosed("the session's connection was dropped"))
        sent = False
        try:
            self._drain()
            conn.send_command(*args)
            sent = True
            end = time.monotonic() + extra + self._rt
            check_at = time.monotonic() + W.probe_every(self._rt) if silent else math.inf
            while not conn.can_read(timeout=max(0.0, min(end - time.monotonic(), 1.0))):
                if self._closed.is_set():
                    raise SessionClosed("the session is closed")
                if time.monotonic() >= end:
                    raise SessionClosed(f"no reply to {args[0]!r} in time: the session closed")
                if silent is not None and time.monotonic() >= check_at:
                    if silent() and not conn.can_read(timeout=self._rt):
                        self._kill_server_side()
                        raise SessionClosed("the session's connection went silent in a wait")
                    check_at = time.monotonic() + W.probe_every(self._rt)
            return conn.read_response()
        except ResponseError:
            raise
        except Exception as e:
            self.close()
            if isinstance(e, SessionClosed):
                raise
            raise SessionClosed(f"the session's connection failed: {e}") from e
        except BaseException:
            if getattr(conn, "_sock", None) is None:
                self.close()  # redis-py dropped the socket: the server ends the holds
            elif sent:
                self._ka.pending += 1  # interrupted: its reply is still to come
            raise

    def _drain(self) -> None:
        """Reads the replies of interrupted commands (their requests were cancelled, which
        answers a blocked wait at once)."""
        while self._ka.pending:
            if not self._conn.can_read(timeout=self._ka.drain_within()):
                raise SessionClosed("an interrupted command was never answered")
            try:
                self._conn.read_response()
            except ResponseError:
                pass
            self._ka.pending -= 1

    def adopt(self, hold: Hold) -> None:
        """Records a hold granted through the session (lost when it closes)."""
        if self._forked():
            hold.mark_lost()
            raise SessionClosed("the session belongs to the process that forked this one")
        # (under the records' own lock, not ``_mutex``: the session's next acquire may hold it)
        self._record(hold, self._closed.is_set)

    def ping(self) -> None:
        """The watcher's check of an idle connection: a close by the server, or a ping not
        answered within ``keepalive``, closes the session."""
        if not self._mutex.acquire(timeout=self._ka.turn()):
            return  # an acquire is in flight: it checks the connection itself
        try:
            if self._closed.is_set():
                return
            args, extra = self._ka.ping()
            self._raw(args, extra)
        except ResponseError:
            pass  # an answer all the same
        except Exception as e:
            log.info("redis_rlock: session closed: %s", e)
        finally:
            self._mutex.release()


def _watch(ref: weakref.ref[Session]) -> None:
    """The watcher thread: sleeps on the idle connection's socket (a close is seen at once),
    pings every ``keepalive``; ends with the session. Should it fail unexpectedly, it closes
    the session rather than leave it unwatched (its holds would be believed past their end)."""
    mark_background()  # pools of the background threads' own
    try:
        _watch_loop(ref)
    except BaseException as e:
        session = ref()
        if session is not None:
            log.warning("redis_rlock: session watcher failed, the session is closed: %r", e)
            session.close()


def _watch_loop(ref: weakref.ref[Session]) -> None:
    while True:
        session = ref()
        if session is None or session._closed.is_set():
            return
        period = session._ka.due_in()
        sock = getattr(session._conn, "_sock", None)
        closed = session._closed
        del session
        try:
            if sock is not None:
                select.select([sock], [], [], period)
            else:
                closed.wait(period)
        except (OSError, ValueError):
            pass  # closed meanwhile: the ping below finds out
        session = ref()
        if session is None:
            return
        session.ping()
        del session
