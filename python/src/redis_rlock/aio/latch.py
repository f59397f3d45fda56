"""asyncio count-down latch: :class:`CountDownLatch` (see the sync
:class:`redis_rlock.CountDownLatch`)."""

from __future__ import annotations

from typing import Any

from .. import _proto as P
from ._engine import AsyncBackend, backend_for
from ._object_drivers import AsyncLatchDrivers


class CountDownLatch(AsyncLatchDrivers):
    """A count-down latch (see the sync :class:`redis_rlock.CountDownLatch`). ``await
    wait()`` blocks in the server on a connection of the package's own pool; a cancellation
    (``task.cancel()``, ``asyncio.wait_for``/``asyncio.timeout`` running out) at any await
    closes that connection, which ends the server's wait at once and leaves the pool sound."""

    def __init__(self, client: Any, name: P.Name, *, response_timeout: float = 2.0) -> None:
        self.name = P.name_bytes(name, client)
        self._be: AsyncBackend = backend_for(client, response_timeout)
