"""The redis-py drop-ins' rules, apart from I/O (``compat``'s classes, and their await-only
drivers in ``aio/_object_drivers.py``, use them): argument mapping, token/owner matching, the
commands of a release and a renewal, and the lease an ``extend`` confirmed."""

from __future__ import annotations

import math
import re
import uuid
from typing import Any, Callable, Optional, TypeVar, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _proto as P
from ._hold import Hold
from .errors import WrongType

T = TypeVar("T")

_WATCHDOG_MS = 30_000
#: a wait at least this long (ms) waits without limit: the server takes at most 2**63 - 1
_FOREVER_MS = 2**62


def _wait(blocking: bool, blocking_timeout: Any) -> Optional[float]:
    """redis-py's (blocking, blocking_timeout) as the engine's wait: 0.0 one try (not blocking,
    or a timeout of zero or less, as redis-py makes one try), None without limit (None, +inf,
    or longer than the server can count), else seconds. NaN or a non-number: refused."""
    if not blocking:
        return 0.0
    if blocking_timeout is None:
        return None
    if isinstance(blocking_timeout, bool) or not isinstance(blocking_timeout, (int, float)):
        raise TypeError(
            f"blocking_timeout must be a number of seconds or None, "
            f"not {type(blocking_timeout).__name__}"
        )
    if math.isnan(blocking_timeout):
        raise ValueError("blocking_timeout must not be NaN")
    if blocking_timeout * 1000 >= _FOREVER_MS:
        return None
    return max(0.0, float(blocking_timeout))


def _encode_token(redis: Any, token: Union[str, bytes, None]) -> bytes:
    """A token as redis-py's acquire makes it: a fresh uuid1 hex, or the given one encoded
    with the client's encoder (str, int, float; bytes as they are; anything else: DataError)."""
    if token is None:
        return uuid.uuid1().hex.encode()
    return P.encode(token, redis, "lock token")


def _owner_for(token: bytes) -> bytes:
    """A fresh owner id carrying ``token``: ``<token>:<32 hex digits>``."""
    return token + b":" + uuid.uuid4().hex.encode()


def _carries(owner: Any, token: Optional[bytes]) -> bool:
    """Whether the server's owner id ``owner`` is a hold taken with ``token``."""
    if token is None or not isinstance(owner, (bytes, str)):
        return False
    raw = owner if isinstance(owner, bytes) else owner.encode()
    return raw == token or re.fullmatch(re.escape(token) + rb":[0-9a-f]{32}", raw) is not None


def _lease(timeout: Optional[float]) -> tuple[int, bool]:
    """The lease of a grant: ``timeout`` (redis-py: a falsy one, None or 0, never expires;
    here it takes a watchdog-renewed lease)."""
    return (_WATCHDOG_MS, True) if not timeout else (P.to_ms(timeout, "timeout"), False)


def _is_wrongtype(e: BaseException) -> bool:
    return isinstance(e, WrongType) or (
        isinstance(e, ResponseError) and str(e).startswith("WRONGTYPE")
    )


def _renew_args(key: bytes, owner: Any, ms: int, replace_ttl: bool) -> list[P.Arg]:
    """``extend``'s ``RLOCK.RENEW``. As redis-py's: ``replace_ttl`` sets the lease to exactly
    ``ms`` (it may shorten it: the caller's explicit ask, as ``PEXPIRE``); otherwise ``ms`` is
    the lease left plus the time added, sent with ``GT`` (it never shortens the lease, even run
    after another extend or a renewal sent later)."""
    args: list[P.Arg] = ["RLOCK.RENEW", key, owner, ms]
    return args if replace_ttl else [*args, "GT"]


def _renewed(hold: Hold, sent: float, lease_ms: int, replace_ttl: bool) -> None:
    """The server confirmed ``extend``'s renewal of ``hold`` for ``lease_ms`` sent at
    ``sent``: exactly that lease (``replace_ttl``), or at least that long."""
    if replace_ttl:
        hold.reset(sent, lease_ms)
    else:
        hold.extend(sent + lease_ms / 1000.0)


def _extend_ms(additional_time: float, replace_ttl: bool) -> int:
    """``extend``'s time in whole ms: as redis-py, 0 added to the lease left is allowed (a
    check that the lock is still owned); a lease set to 0, or below, is refused."""
    if (
        not replace_ttl
        and not isinstance(additional_time, bool)
        and isinstance(additional_time, (int, float))
        and additional_time == 0
    ):
        return 0
    return P.to_ms(additional_time, "additional_time")


def _not_owned(what: str, name: str) -> LockNotOwnedError:
    return LockNotOwnedError(f"Cannot {what} a lock that's no longer owned", lock_name=name)


def _unless_wrongtype(e: ResponseError, value: T) -> T:
    """``value`` when the error reply ``e`` is ``WRONGTYPE`` (the key holds something else),
    else ``e`` raised."""
    if _is_wrongtype(e):
        return value
    raise e


def _owner_in(reply: Any) -> Any:
    """The owner id in an ``RLOCK.INFO`` reply (None: the lock is free)."""
    info = P.info_map(reply)
    return None if info is None else info.get(b"owner")


class _Common:
    """State shared by the sync and asyncio drop-ins: the encoded name, and which hold of
    this thread's (``thread_local``) or the object's state belongs to its token."""

    local: Any
    redis: Any
    timeout: Any
    blocking: Any
    blocking_timeout: Any
    _be: Any
    _key: bytes
    _lname: str

    def _attach(self, redis: Any, name: Any, engine: Any) -> None:
        """After redis-py's ``__init__``: a lease that cannot be held refused at once (not at
        acquire), the engine (``engine(client, response_timeout)``), the encoded name."""
        _lease(self.timeout)
        self._be = engine(redis, 2.0)
        self._key = P.name_bytes(name, redis)
        self._lname = name if isinstance(name, str) else self._key.decode(errors="replace")

    def _store(self, hold: Hold, token: bytes) -> None:
        # the grant is recorded with its token in one step: never a hold without a token
        self.local.hold, self.local.token = hold, token

    def _token(self) -> tuple[Any, Optional[bytes]]:
        """``local.token`` as set (by an acquire, or by hand) and as sent (encoded)."""
        raw = getattr(self.local, "token", None)
        return raw, (None if raw is None else P.encode(raw, self.redis, "lock token"))

    def _hold_of(self, token: bytes) -> Optional[Hold]:
        """The hold this object took with ``token`` (None: a token set by hand, or a hold
        taken by another object)."""
        hold = getattr(self.local, "hold", None)
        if hold is not None and _carries(hold.spec.owner, token):
            return hold  # type: ignore[no-any-return]
        return None

    def _forget(self, raw: Any) -> None:
        if getattr(self.local, "token", None) is raw:
            self.local.token = None
            self.local.hold = None

    def _acquiring(
        self, blocking: Optional[bool], blocking_timeout: Optional[float], token: Any
    ) -> tuple[P.Spec, Optional[float], bool, Callable[[Hold], None]]:
        """``acquire``'s arguments (None: the object's own) as the engine's: the spec (an
        owner id of its own carrying the token), the wait, whether a watchdog renews the
        hold, and where the grant is stored (with its token)."""
        blocking = self.blocking if blocking is None else blocking
        blocking_timeout = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        wait = _wait(blocking, blocking_timeout)
        tok = _encode_token(self.redis, token)
        lease_ms, watchdog = _lease(self.timeout)
        spec = P.Spec(P.LOCK, self._key, owner=_owner_for(tok), lease_ms=lease_ms)
        return spec, wait, watchdog, lambda h: self._store(h, tok)

    def _release_args(self, token: bytes, owner: Any) -> list[P.Arg]:
        """``do_release``'s ``RLOCK.RELEASE`` of ``owner`` (read from the server), with a
        request id; ``LockNotOwnedError`` when ``owner`` does not carry ``token``."""
        if not _carries(owner, token):
            raise _not_owned("release", self._lname)
        return ["RLOCK.RELEASE", self._key, owner, "REQUEST", P.new_id()]

    def _released(self, reply: Any) -> None:
        if reply is None:
            raise _not_owned("release", self._lname)

    def _releasing(self) -> tuple[Any, bytes]:
        """``release``'s token, as set and as sent; ``LockError`` when there is none."""
        raw, expected = self._token()
        if raw is None or expected is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self._lname)
        return raw, expected

    def _not_owned_at_release(self, e: Exception) -> None:
        """A release found the lock not owned (``e``; ``WrongType``: the key was overwritten):
        redis-py's ``LockNotOwnedError`` raised, unless ``raise_on_release_error=False``."""
        if getattr(self, "raise_on_release_error", True):
            if isinstance(e, WrongType):
                raise _not_owned("release", self._lname) from None
            raise e

    def _extending(
        self, additional_time: float, replace_ttl: bool
    ) -> tuple[Optional[bytes], int, Optional[Hold]]:
        """``extend``'s arguments checked (no lease of its own, redis-py's key without expiry:
        ``LockError``): the token, the time in ms, and the hold this object took with it."""
        if not self.timeout:  # 0: no lease of its own (redis-py: a key without expiry)
            raise LockError("Cannot extend a lock with no timeout", lock_name=self._lname)
        _, token = self._token()
        ms = _extend_ms(additional_time, replace_ttl)
        return token, ms, None if token is None else self._hold_of(token)
