# generated from _compat_async.py by `make python-generate`; do not edit
"""The redis-py drop-in's await-only methods (``compat.AsyncRLockCompat``'s reads, release
by token, extend), written once here as a mixin; ``_compat_sync.py`` (``RLockCompat``'s) is
generated from this file by ``make python-generate`` (tests/test_generated.py fails when it
is stale). It lives outside ``aio``: importing anything of ``aio`` imports ``compat`` first.
What differs beyond ``await`` (``release``'s interrupt hand-off and its shielded task,
``acquire``'s signature) stays in ``compat``."""

from __future__ import annotations

import time
from typing import Any, Optional, Union

from redis.exceptions import ResponseError

from . import _proto as P
from ._compat_core import (
    _carries,
    _Common,
    _is_wrongtype,
    _not_owned,
    _owner_in,
    _renew_args,
    _renewed,
    _unless_wrongtype,
)


class SyncCompatDrivers(_Common):
    """The redis-py drop-in's await-only methods (``compat``)."""

    def _owner(self) -> Any:
        """The owner id the server stores for the lock now (None when free)."""
        try:
            return _owner_in(self._be.call(self._key, ["RLOCK.INFO", self._key]))
        except ResponseError as e:
            return _unless_wrongtype(e, None)  # the key holds something else: nobody holds it

    def locked(self) -> bool:
        """Whether anybody holds the lock (or the key holds another value, which redis-py
        counts as locked)."""
        try:
            return bool(self._be.call(self._key, ["RLOCK.PTTL", self._key]) != -2)
        except ResponseError as e:
            return _unless_wrongtype(e, True)

    def owned(self) -> bool:
        """Whether the lock is held under this lock object's token."""
        _, token = self._token()
        return token is not None and _carries(self._owner(), token)

    def do_release(self, expected_token: Union[str, bytes]) -> None:
        """Releases the hold taken with ``expected_token`` (whichever object took it):
        ``RLOCK.RELEASE`` of its owner id, with a request id."""
        token = P.encode(expected_token, self.redis, "lock token")
        args = self._release_args(token, self._owner())
        until = time.monotonic() + 3 * self._be.rt
        try:
            reply, _ = self._be.call_until(self._key, args, until)
        except ResponseError as e:
            if _is_wrongtype(e):
                raise _not_owned("release", self._lname) from None
            raise
        self._released(reply)

    def _renew(self, owner: Any, ms: int, replace_ttl: bool) -> Optional[int]:
        """``RLOCK.RENEW`` of ``owner`` for ``ms`` (added to the lease left, unless
        ``replace_ttl``): the lease set, None when that owner does not hold the lock."""
        try:
            if not replace_ttl:
                ms += max(0, int(self._be.call(self._key, ["RLOCK.PTTL", self._key])))
                if ms <= 0:  # extend(0) of a lease that just ended: nothing to keep
                    return None
            renewed = self._be.call(self._key, _renew_args(self._key, owner, ms, replace_ttl))
        except ResponseError as e:
            return _unless_wrongtype(e, None)
        return ms if renewed == 1 else None

    def do_extend(self, additional_time: float, replace_ttl: bool) -> bool:
        """Extends the lease (``replace_ttl``: sets it) of the hold under this object's
        token: its own hold, or (that one gone) whichever hold carries the token."""
        token, ms, hold = self._extending(additional_time, replace_ttl)
        if hold is not None:
            sent = time.monotonic()
            lease = self._renew(hold.spec.owner, ms, replace_ttl)
            if lease is not None:
                _renewed(hold, sent, lease, replace_ttl)
                return True
        owner = self._owner()
        if token is None or not _carries(owner, token):
            raise _not_owned("extend", self._lname)
        if self._renew(owner, ms, replace_ttl) is None:
            raise _not_owned("extend", self._lname)
        return True

    def do_reacquire(self) -> bool:
        """Resets the lease to ``timeout``."""
        return self.do_extend(self.timeout or 0, True)
