"""Sync count-down latch: :class:`CountDownLatch` (``RLATCH.*``, Redisson's
``RCountDownLatch``), waited for in the server."""

from __future__ import annotations

from typing import Any

from . import _proto as P
from ._object_drivers import SyncLatchDrivers
from ._sync import SyncBackend, backend_for


class CountDownLatch(SyncLatchDrivers):
    """A count-down latch on Redisson's layout (a string holding the count; missing: open), so
    Redisson's ``RCountDownLatch`` of the same name is the same latch.

    ``wait()`` blocks in the server (``RLATCH.AWAIT``), on a connection of the package's own
    pool (never the client's: a blocking command whose reply is never read would be the next
    user's reply). Whatever ends a wait early (``KeyboardInterrupt``, a stall past its
    deadline, a lost connection) closes that connection, which ends the server's wait at once;
    the pool opens a fresh one for its next user.
    """

    def __init__(self, client: Any, name: P.Name, *, response_timeout: float = 2.0) -> None:
        self.name = P.name_bytes(name, client)
        self._be: SyncBackend = backend_for(client, response_timeout)
