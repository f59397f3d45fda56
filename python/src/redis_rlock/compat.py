"""Drop-ins for redis-py's ``Lock``: ``r.lock(name, ..., lock_class=RLockCompat)`` (and
``AsyncRLockCompat`` for ``redis.asyncio``) keep redis-py's signature, attributes and
exceptions (``LockError``, ``LockNotOwnedError``) but wait in the server, FIFO, and release
exactly. Differences: ``timeout=None`` (redis-py: a key that never expires) takes a 30 s lease
renewed by a watchdog until release; ``sleep`` is accepted and unused (nobody polls).

Tokens work as redis-py's: ``acquire(token=...)`` (or a fresh uuid1 hex) is the lock object's
``local.token``; the server stores the hold under ``<token>:<32 hex digits>``, an owner id of
its own per acquire, so an acquire never re-enters a hold (redis-py's lock is not reentrant:
a second acquire with the holder's token waits or fails as any other). ``release``, ``extend``,
``reacquire`` and ``owned`` act on the hold whose owner id carries ``local.token``, whichever
lock object (or process) took it."""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from typing import Any, Callable, Optional, TypeVar, Union

import redis.asyncio.lock as alock
import redis.lock as slock
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


class RLockCompat(_Common, slock.Lock):
    """redis-py's ``Lock`` API on rlock (sync)."""

    def __init__(self, redis: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(redis, name, *args, **kwargs)
        from ._sync import backend_for

        self._attach(redis, name, backend_for)

    def register_scripts(self) -> None:
        """No Lua scripts: the module's commands do the work."""

    def acquire(
        self,
        sleep: Optional[float] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[str] = None,
    ) -> bool:
        """Takes the lock, waiting in the server (FIFO) up to ``blocking_timeout`` (None,
        +inf or beyond the server's range: without limit). Never re-enters: a lock held under
        the same token (by this object or another) is busy, as with redis-py."""
        spec, wait, watchdog, store = self._acquiring(blocking, blocking_timeout, token)
        return self._be.acquire(spec, wait, watchdog, None, store) is not None

    def do_acquire(self, token: Union[str, bytes]) -> bool:
        """One non-blocking try with ``token``."""
        return self.acquire(blocking=False, token=token)  # type: ignore[arg-type]

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

    def release(self) -> None:
        """Releases (exactly once, retried after connection errors); ``LockNotOwnedError``
        when the lock was no longer held under this object's token (unless
        ``raise_on_release_error=False``)."""
        raw, expected = self._releasing()
        hold = self._hold_of(expected)
        try:
            if hold is not None:
                try:
                    self._be.release(hold)
                except LockNotOwnedError:
                    # this object's hold is gone; as in redis-py, the token is the owner: a
                    # later hold taken with it (by another object) is the one released
                    self.do_release(expected)
                except WrongType:
                    hold.mark_lost()  # the key was overwritten: this hold is gone
                    hold.done = True
                    raise
            else:
                self.do_release(expected)
        except (LockNotOwnedError, WrongType) as e:
            self._forget(raw)
            self._not_owned_at_release(e)
            return
        except BaseException:
            if hold is not None and hold.done:
                self._forget(raw)  # sent, or left to the background sender
            raise
        self._forget(raw)

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

    def do_extend(self, additional_time: float, replace_ttl: bool) -> bool:  # type: ignore[override]
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

    def do_reacquire(self) -> bool:  # type: ignore[override]
        """Resets the lease to ``timeout``."""
        return self.do_extend(self.timeout or 0, True)


class AsyncRLockCompat(_Common, alock.Lock):
    """redis-py's ``redis.asyncio`` ``Lock`` API on rlock."""

    def __init__(self, redis: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(redis, name, *args, **kwargs)
        from .aio._engine import backend_for

        self._attach(redis, name, backend_for)

    def register_scripts(self) -> None:
        """No Lua scripts."""

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Union[str, bytes, None] = None,
    ) -> bool:
        """Takes the lock, waiting in the server (FIFO) up to ``blocking_timeout`` (None,
        +inf or beyond the server's range: without limit); never re-enters (see the sync one)."""
        spec, wait, watchdog, store = self._acquiring(blocking, blocking_timeout, token)
        return await self._be.acquire(spec, wait, watchdog, None, store) is not None

    async def do_acquire(self, token: Union[str, bytes]) -> bool:
        """One non-blocking try with ``token``."""
        return await self.acquire(blocking=False, token=token)

    async def _owner(self) -> Any:
        try:
            return _owner_in(await self._be.call(self._key, ["RLOCK.INFO", self._key]))
        except ResponseError as e:
            return _unless_wrongtype(e, None)

    async def locked(self) -> bool:
        """Whether anybody holds the lock (or the key holds another value)."""
        try:
            return bool(await self._be.call(self._key, ["RLOCK.PTTL", self._key]) != -2)
        except ResponseError as e:
            return _unless_wrongtype(e, True)

    async def owned(self) -> bool:
        """Whether the lock is held under this lock object's token."""
        _, token = self._token()
        return token is not None and _carries(await self._owner(), token)

    async def release(self) -> None:
        """Releases, as redis-py 8.1's: the token is cleared only once the release is done
        (or found the lock not owned). A release cancelled before it ran leaves the hold
        and token as they were (release again); one cancelled while running goes on in a
        shielded task, and a ``release()`` again waits for that one's outcome."""
        raw, expected = self._releasing()
        hold: Any = self._hold_of(expected)
        pending = getattr(self.local, "releasing", None)
        if pending is not None and pending[0] is raw and pending[1] is hold:
            task = pending[2]
        else:
            task = self._be.background(self._release(hold, expected))
            self.local.releasing = (raw, hold, task)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            raise  # the release goes on; the token stays for a release() again
        except (LockNotOwnedError, WrongType) as e:
            self._done_releasing(raw)
            self._not_owned_at_release(e)
            return
        except BaseException:
            self.local.releasing = None  # nothing changed (an error reply): release again
            raise
        self._done_releasing(raw)

    async def _release(self, hold: Any, token: bytes) -> None:
        if hold is None:
            await self.do_release(token)
            return
        try:
            await self._be.release(hold)
        except LockNotOwnedError:
            # this object's hold is gone: a later hold taken with the token (as the sync one)
            await self.do_release(token)
        except WrongType:
            hold.mark_lost()  # the key was overwritten: this hold is gone
            hold.done = True
            hold.stop()
            raise

    def _done_releasing(self, raw: Any) -> None:
        self.local.releasing = None
        self._forget(raw)

    async def do_release(self, expected_token: Union[str, bytes]) -> None:
        """Releases the hold taken with ``expected_token`` (whichever object took it)."""
        token = P.encode(expected_token, self.redis, "lock token")
        args = self._release_args(token, await self._owner())
        until = time.monotonic() + 3 * self._be.rt
        try:
            reply, _ = await self._be.call_until(self._key, args, until)
        except ResponseError as e:
            if _is_wrongtype(e):
                raise _not_owned("release", self._lname) from None
            raise
        self._released(reply)

    async def _renew(self, owner: Any, ms: int, replace_ttl: bool) -> Optional[int]:
        """As the sync one's: the lease set, None when ``owner`` does not hold the lock."""
        try:
            if not replace_ttl:
                ms += max(0, int(await self._be.call(self._key, ["RLOCK.PTTL", self._key])))
                if ms <= 0:  # extend(0) of a lease that just ended: nothing to keep
                    return None
            renewed = await self._be.call(self._key, _renew_args(self._key, owner, ms, replace_ttl))
        except ResponseError as e:
            return _unless_wrongtype(e, None)
        return ms if renewed == 1 else None

    async def do_extend(self, additional_time: float, replace_ttl: bool) -> bool:  # type: ignore[override]
        """Extends the lease (``replace_ttl``: sets it) of the hold under this object's
        token: its own hold, or (that one gone) whichever hold carries the token."""
        token, ms, hold = self._extending(additional_time, replace_ttl)
        if hold is not None:
            sent = time.monotonic()
            lease = await self._renew(hold.spec.owner, ms, replace_ttl)
            if lease is not None:
                _renewed(hold, sent, lease, replace_ttl)
                return True
        owner = await self._owner()
        if token is None or not _carries(owner, token):
            raise _not_owned("extend", self._lname)
        if await self._renew(owner, ms, replace_ttl) is None:
            raise _not_owned("extend", self._lname)
        return True

    async def do_reacquire(self) -> bool:  # type: ignore[override]
        """Resets the lease to ``timeout``."""
        return await self.do_extend(self.timeout or 0, True)
