"""Sync count-down latch: :class:`CountDownLatch` (``RLATCH.*``, Redisson's
``RCountDownLatch``), waited for in the server."""

from __future__ import annotations

import time
from typing import Any, Optional

from redis.exceptions import ResponseError

from . import _proto as P
from ._core import LatchWaiting
from ._sync import SyncBackend, backend_for
from .errors import translate


class CountDownLatch:
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

    def _cmd(self, *args: P.Arg) -> Any:
        try:
            return self._be.call(self.name, list(args))
        except ResponseError as e:
            raise translate(e, self.name.decode(errors="replace")) from None

    def try_set_count(self, count: int) -> bool:
        """Sets the count (positive) if the latch does not exist; False when it does (then
        nothing changes). Not retried after a lost reply (a retry would answer False)."""
        return bool(self._cmd("RLATCH.SETCOUNT", self.name, P.check_latch_count(count, "count")))

    def count_down(self, amount: int = 1) -> int:
        """Counts down by ``amount`` (positive), never below zero; returns the count left. At
        zero the latch opens: its key is deleted and every waiter answered. A missing latch
        stays missing (0). Not retried after a lost reply (a retry could count down twice)."""
        n = P.check_latch_count(amount, "amount")
        return int(self._cmd("RLATCH.COUNTDOWN", self.name, n))

    def get_count(self) -> int:
        """The count left (0 when the latch is missing: open)."""
        return int(self._cmd("RLATCH.COUNT", self.name))

    def delete(self) -> bool:
        """Deletes the latch (it opens: every waiter is answered True); False when missing."""
        return bool(self._cmd("RLATCH.DELETE", self.name) == 1)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the latch is open (its count at zero, or its key deleted by anyone,
        ``DEL`` included); True once open, False when ``timeout`` seconds passed first
        (Redisson's ``await``; ``threading.Event.wait``'s signature). ``timeout=0`` looks
        without waiting; None waits without a limit.

        Returns within ``timeout`` plus the response timeout even when the server stalls. A
        lost connection (``CLIENT KILL``, a restart, a failover) ends nothing: the wait is sent
        again on a new connection, backing off up to 1 s between tries, within ``timeout``
        (False once it passed) or, without one, until the latch opens. One server-side
        wait lasts at most 30 s (a longer one is sent again as it ends), so a connection that
        died silently is noticed within that and the response timeout. Error replies
        (``WRONGTYPE``, ``NOPERM``, ...) raise the package's exceptions."""
        run = LatchWaiting(self.name, timeout, self._be.rt)
        if run.look:
            try:
                reply, _ = self._be.call_until(
                    self.name, ["RLATCH.COUNT", self.name], run.look_until
                )
            except Exception as e:
                return run.looked(error=e)
            return run.looked(reply)
        while True:
            slice_ = run.next()
            if slice_ is None:
                return False
            try:
                if run.answered(self._be.call(self.name, *slice_)):
                    return True
            except Exception as e:
                run.failed(e)
            delay = run.pause()
            if delay is None:
                return False
            time.sleep(delay)
