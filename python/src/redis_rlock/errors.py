"""Exceptions. Every one subclasses redis-py's ``LockError`` (catch that to catch them all)."""

from __future__ import annotations

from redis.exceptions import (
    LockError,
    LockNotOwnedError,
    NoPermissionError,
    ResponseError,
)

__all__ = [
    "Deadlock",
    "LockError",
    "LockLost",
    "LockNotOwnedError",
    "LockPermissionError",
    "LockTimeout",
    "ModuleMissing",
    "NoReplicas",
    "NotHeld",
    "RLockError",
    "SessionClosed",
    "UpgradeRefused",
    "WrongType",
]


class RLockError(LockError):
    """Base of this package's errors; also what an unexpected server error reply becomes."""


class LockTimeout(RLockError):
    """``with lock:`` (or ``acquire_or_raise``) could not take the lock within its timeout."""


class NotHeld(RLockError, LockNotOwnedError):
    """The caller (this thread, this task) holds nothing to release, renew or check."""


class LockLost(NotHeld):
    """The hold ended before its release: its lease ran out, or the lock was deleted or taken
    away (a ``FORCERELEASE``, a failover that lost it, a flush). Raised by ``check()``, by
    ``release()`` of such a hold (which then sends nothing) and by a re-entry of it."""


class NoReplicas(RLockError):
    """The master grants nothing: too few of its replicas are in sync (``NOREPLICAS``)."""


class ModuleMissing(RLockError):
    """The server does not know the rlock commands: load ``librlock.so`` (``--loadmodule``)."""


class WrongType(RLockError):
    """The key holds another kind of value (another kind of lock, or not a lock at all)."""


class UpgradeRefused(RLockError):
    """A write acquire by a thread or task that holds the read side: it would wait for itself."""


class Deadlock(RLockError):
    """The server refused the wait (``DEADLOCK``): queueing it would have closed a cycle of owners
    each waiting for a lock another one holds. Nothing was taken or queued. ``cycle`` is the
    server's description of it (``b waits for k1 held by a; a waits for k2 held by b``)."""

    cycle: str = ""


class SessionClosed(RLockError):
    """The session's connection closed (the server closed it, ``CLIENT KILL``, a restart, a
    keepalive unanswered, or ``close()``): its holds ended, and it takes no more. Open a new
    session."""

    #: Whether the command that raised it certainly ran nothing (refused before it was sent,
    #: or answered with a refusal): the engine then has nothing of this attempt to cancel.
    nothing_ran: bool = False


class LockPermissionError(RLockError):
    """The ACL user may not use a key or channel the command needs (``NOPERM``)."""


def translate(err: ResponseError, name: object = None) -> RLockError:
    """The package's exception for an error reply ``err`` of an rlock command on ``name``."""
    msg = str(err)
    low = msg.lower()
    lock_name = name if isinstance(name, str) else repr(name)
    if isinstance(err, NoPermissionError) or msg.startswith("NOPERM"):
        return LockPermissionError(msg, lock_name=lock_name)
    module_cmd = any(m in low for m in ("rlock.", "rwlock.", "rsem.", "rlatch."))
    if "unknown command" in low and module_cmd:
        return ModuleMissing(
            f"the server does not have the rlock module loaded ({msg})", lock_name=lock_name
        )
    if msg.startswith("WRONGTYPE"):
        return WrongType(msg, lock_name=lock_name)
    if msg.startswith("NOREPLICAS"):
        return NoReplicas(msg, lock_name=lock_name)
    if msg.startswith("DEADLOCK"):
        found = Deadlock(msg, lock_name=lock_name)
        found.cycle = msg.removeprefix("DEADLOCK ").removeprefix("this wait would close a cycle: ")
        return found
    if "upgrade refused" in low:
        return UpgradeRefused(msg, lock_name=lock_name)
    return RLockError(msg, lock_name=lock_name)
