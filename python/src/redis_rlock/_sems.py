"""What a semaphore object is, sync or asyncio, without I/O: its options, the commands of
its counts and the acquire of its permits. ``semaphore`` (per thread) and ``aio.semaphore``
(per task) keep the guards and talk to their engine."""

from __future__ import annotations

from typing import Any, Optional

from . import _proto as P
from ._hold import LostCallback


class SemCore:
    """What both kinds of semaphore share, sync or asyncio: ``_engine`` makes the engine of
    a client, ``_start`` sets up the guards' store."""

    def __init__(
        self,
        client: Any,
        name: P.Name,
        *,
        blocking: bool = True,
        timeout: float = -1,
        response_timeout: float = 2.0,
    ) -> None:
        self.name = P.name_bytes(name, client)
        self._be = self._engine(client, response_timeout)
        P.wait_budget(blocking, timeout)
        self._blocking, self._timeout = blocking, timeout
        self._start()

    def _engine(self, client: Any, response_timeout: float) -> Any:
        raise NotImplementedError

    def _start(self) -> None:
        """Sets up where this object keeps its guards."""

    def _lock_name(self) -> str:
        return self.name.decode(errors="replace")

    def _set_permits(self, permits: int) -> list[P.Arg]:
        """``try_set_permits``' command: creates the semaphore with ``permits`` (0 allowed)."""
        if isinstance(permits, bool) or not isinstance(permits, int) or not 0 <= permits < 2**63:
            raise ValueError(f"permits must be a non-negative 64-bit integer, got {permits!r}")
        return ["RSEM.SETPERMITS", self.name, permits]

    def _add_permits(self, delta: int) -> list[P.Arg]:
        """``add_permits``' command (``delta`` may be negative)."""
        P.check_delta(delta)
        return ["RSEM.ADDPERMITS", self.name, delta]

    def _counted(self, permits: int, ownerless: bool = False) -> P.Spec:
        """The acquire of ``permits`` counted permits (``ownerless``: given back with
        ``release``, ``ONCE``, not through the guard, ``REQUEST`` of the acquire)."""
        n = P.check_permits(permits, False)
        return P.Spec(P.COUNTED, self.name, permits=n, ownerless=ownerless)

    def _release_args(self, permits: int) -> list[P.Arg]:
        """``release``'s command: ``RSEM.RELEASE key n ONCE <a new id>``."""
        return P.counted_release(self.name, P.check_permits(permits, False))


class LeasedCore(SemCore):
    """Leased permits' options and acquire, sync or asyncio."""

    #: the session its permits are bound to (set by ``Session.leased_semaphore``)
    _session: Any = None

    def __init__(
        self,
        client: Any,
        name: P.Name,
        *,
        lease: Optional[float] = None,
        on_lost: Optional[LostCallback] = None,
        watchdog_timeout: float = 30.0,
        **kw: Any,
    ) -> None:
        super().__init__(client, name, **kw)
        if lease is not None:
            P.to_ms(lease, "lease")  # refused at once, not at the first acquire
        self._lease = lease
        self._on_lost = on_lost
        self._watchdog_ms = P.watchdog_ms(watchdog_timeout)

    def _leased(self, permits: int, lease: Optional[float]) -> tuple[P.Spec, Optional[int], Any]:
        """The acquire of ``permits`` leased permits (``lease`` None: the semaphore's), its
        lease in ms (None: a watchdog renews them) and the session it binds them to."""
        lease = self._lease if lease is None else lease
        lease_ms = None if lease is None else P.to_ms(lease, "lease")
        session = self._session
        spec = P.Spec(
            P.LEASED,
            self.name,
            permits=P.check_permits(permits, True),
            lease_ms=lease_ms or self._watchdog_ms,
            session=session is not None,
            lock_delay_ms=0 if session is None else session.lock_delay_ms,
        )
        return spec, lease_ms, session
