"""What a session is, sync or asyncio, without I/O: its options (``lock_delay``, ``keepalive``,
``response_timeout``, no cluster client), the records of the holds taken through it (every one
lost at close), and its keepalive (when the next ping is due, how long it waits for the
connection and for its answer, the replies still to read before the next command).
``session`` (a watcher thread sleeping on the socket) and ``aio.session`` (a watcher task)
keep the connection and do the I/O."""

from __future__ import annotations

import math
import weakref
from contextlib import AbstractContextManager
from typing import Any, Callable, Generic, Optional, TypeVar

from redis.exceptions import MasterDownError, ReadOnlyError

from . import _proto as P
from ._hold import Hold
from .errors import SessionClosed

#: The most lock-delay the module accepts (``LOCKDELAY`` 0 to 60000 ms).
MAX_LOCK_DELAY_S = 60.0

H = TypeVar("H", bound=Hold)


def lock_delay_ms(lock_delay: float) -> int:
    """``lock_delay`` seconds as ``LOCKDELAY`` milliseconds (0: none); refuses what the module
    would (negative, NaN, above 60 s) before anything is opened."""
    if isinstance(lock_delay, bool) or not isinstance(lock_delay, (int, float)):
        raise TypeError("lock_delay must be a number of seconds")
    if not math.isfinite(lock_delay) or not 0 <= lock_delay <= MAX_LOCK_DELAY_S:
        raise ValueError(f"lock_delay must be from 0 to 60 seconds, got {lock_delay!r}")
    return math.ceil(lock_delay * 1000)


def check_keepalive(keepalive: float) -> float:
    """A keepalive period: a positive, finite number of seconds, at most a day."""
    return P.check_period(keepalive, "keepalive")


def turn_within(extra: float, rt: float) -> Optional[float]:
    """How long a command may wait for the session's connection while another acquire of the
    session holds it: its wait (``extra``; None: no limit), a one-try the response timeout.
    Past it the command raises :class:`Stalled`, nothing sent: an acquire ends at its
    deadline, not behind another's wait."""
    if extra >= 1e9:  # the engine's "no limit"
        return None
    return extra if extra > 0 else rt


def replica_refusal(err: BaseException) -> bool:
    """Whether a session's command was refused by a replica (``READONLY``, ``MASTERDOWN``): the
    session's server is no longer a master, and a session never follows its master."""
    return isinstance(err, (ReadOnlyError, MasterDownError)) or str(err).startswith(
        ("READONLY", "MASTERDOWN")
    )


def named_elsewhere(named: Optional[tuple[Any, Any]], bound: tuple[Any, Any]) -> bool:
    """Whether the master the Sentinels name (``named``; None: none asked, or none answered)
    is another server than the session's (``bound``: its host and port): after a failover,
    the old master refuses grants (``NOREPLICAS``) until the Sentinels demote it, and a
    session bound to it never grants again."""
    if named is None:
        return False
    return (str(named[0]), int(named[1])) != (str(bound[0]), int(bound[1]))


def sentinel_pool(conn: Any) -> Any:
    """The Sentinel pool a session's connection resolves its master through (it has
    ``get_master_address``), or None (a plain server's connection)."""
    pool = getattr(conn, "connection_pool", None)
    return pool if hasattr(pool, "get_master_address") else None


def sentinel_query(pool: Any) -> tuple[list[tuple[str, int]], list[Any]]:
    """Where to ask which master the Sentinels name for a session's pool: the Sentinels'
    addresses, and the command (``SENTINEL GET-MASTER-ADDR-BY-NAME service``). The sessions
    ask on connections of their own with a short timeout (redis-py's own Sentinel clients may
    have none, and retry: a Sentinel that accepts and never answers would hold the acquire)."""
    addresses: list[tuple[str, int]] = []
    for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", []):
        kwargs = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", {})
        if "host" in kwargs and "port" in kwargs:
            addresses.append((str(kwargs["host"]), int(kwargs["port"])))
    return addresses, ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", getattr(pool, "service_name", "")]


def master_named(reply: Any) -> Optional[tuple[str, int]]:
    """The address in a ``SENTINEL GET-MASTER-ADDR-BY-NAME`` reply (None: none named)."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 2:
        return None
    host, port = reply
    host = host.decode() if isinstance(host, bytes) else str(host)
    return host, int(port)


def unsent(e: SessionClosed) -> SessionClosed:
    """``e``, marked as raised by a command that ran nothing (refused before it was sent, or
    answered with a refusal)."""
    e.nothing_ran = True
    return e


#: How long a session gives the Sentinels to say which master they name (all of them, in
#: turn), at most: the Rust client's bound.
SENTINEL_CHECK_S = 2.0


#: The text of the :class:`SessionClosed` raised when the session's server was replaced.
REPLACED = "the session's server is no longer the master (a failover): the session closed"


class Keepalive:
    """A session connection's keepalive: the watcher looks at the idle connection every
    ``period`` seconds and pings it; the ping waits for the connection as long as a period (a
    command in flight that holds it longer defers the ping: that command checks the connection
    itself), and an answer not come within the period (its extra plus the response timeout)
    closes the session. ``pending``: replies of interrupted commands, sent but not read, which
    the next command reads first (each within ``drain_within``); the sync session counts them
    in place (``+= 1`` in its interrupt handler: no call, so no point between the interrupt
    and the count where another interrupt could leave a reply uncounted); the asyncio
    session keeps its one pending reader instead, a future, as I/O is none of this class's."""

    __slots__ = ("pending", "period", "rt")

    def __init__(self, period: float, rt: float) -> None:
        self.period = period
        self.rt = rt
        self.pending = 0

    def due_in(self) -> float:
        """Seconds from a look at the connection (or a wake by it) to the next ping."""
        return self.period

    def turn(self) -> float:
        """Seconds the ping waits for a connection a command holds; past it, no ping."""
        return self.period

    def ping(self) -> tuple[list[P.Arg], float]:
        """The ping and its extra wait: answered within the period, or the session closes."""
        return ["PING"], self.period - self.rt

    def drain_within(self) -> float:
        """Seconds the reply of an interrupted command may take (its request was cancelled,
        which answers a blocked wait at once); past them, the session closes."""
        return 2 * self.rt


class SessionCore(Generic[H]):
    """What both session classes share: the options and the holds' records. ``_holds_guard``
    guards ``_holds`` only (the sync side's lock, never held across I/O: a grant is recorded at
    once, not behind the session's next command; nothing on the asyncio side)."""

    _holds: weakref.WeakSet[H]
    _holds_guard: AbstractContextManager[Any]

    def _options(
        self,
        client: Any,
        cluster: type,
        lock_delay: float,
        keepalive: float,
        response_timeout: float,
    ) -> None:
        """Checks the options (nothing opened yet) and keeps them."""
        if isinstance(client, cluster):
            raise TypeError("sessions need one server: a cluster client has none")
        self._delay_ms = lock_delay_ms(lock_delay)
        period = check_keepalive(keepalive)
        self._client = client
        self._rt = P.check_period(response_timeout, "response_timeout")
        self._ka = Keepalive(period, self._rt)

    @property
    def lock_delay_ms(self) -> int:
        """The ``LOCKDELAY`` its acquires carry (0: none)."""
        return self._delay_ms

    def _new_records(self, guard: AbstractContextManager[Any]) -> None:
        """No hold recorded yet (a new session, or a forked child's copy: its holds are the
        parent's, acting on nothing here)."""
        self._holds = weakref.WeakSet()
        self._holds_guard = guard

    def _record(self, hold: H, closing: Callable[[], bool]) -> None:
        """Records a hold granted through the session (lost at close); a hold granted as the
        session closes is lost, and :class:`SessionClosed` raised."""
        with self._holds_guard:
            if not closing():
                self._holds.add(hold)
            # ``close()`` says closing, then marks the holds it finds lost. Asked again after
            # the add, a close that came meanwhile, and may have missed this hold, is seen here.
            if closing():
                hold.mark_lost()
                raise SessionClosed("the session closed before its grant was recorded")

    def _lose_all(self) -> None:
        """Marks every recorded hold lost (the session is closing: the server ends them)."""
        with self._holds_guard:
            holds = list(self._holds)
        for hold in holds:
            hold.mark_lost()

    def _kill_args(self, client_id: Optional[int]) -> Optional[list[P.Arg]]:
        """The command that ends the server's side of the session's connection (went silent:
        its holds end with it); None without its id (ACL): they end with their leases."""
        if client_id is None:
            return None
        return ["CLIENT", "KILL", "ID", client_id]
