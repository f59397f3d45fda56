"""Fork checks, one place for sync and asyncio: a process forked from another never uses its
parent's sockets, owner ids or holds (a parent thread may have held them at the fork)."""

from __future__ import annotations

import os
from typing import Protocol

from .errors import NotHeld


class Owned(Protocol):
    """What the fork checks read of a hold: the process that took it."""

    pid: int


def current_pid() -> int:
    """``os.getpid()``: the process a hold or a guard belongs to."""
    return os.getpid()


class ForkGuard:
    """Remembers the process it was made in, and says once, in a process forked from it, that
    it moved: the owner then drops what was its parent's (a socket, an owner id, a pool)."""

    __slots__ = ("_pid",)

    def __init__(self) -> None:
        self._pid = current_pid()

    def forked(self) -> bool:
        """True the first time it is asked in a process other than the one it last knew (that
        process becomes the one it knows); False otherwise."""
        pid = current_pid()
        if self._pid == pid:
            return False
        self._pid = pid
        return True


def inherited(hold: Owned) -> bool:
    """Whether ``hold`` was taken by another process (one this process was forked from): it is
    not this process's to re-enter, renew or release."""
    return hold.pid != current_pid()


def check_owner(hold: Owned) -> None:
    """Raises :class:`NotHeld` for a hold taken by the process this one was forked from."""
    if inherited(hold):
        raise NotHeld("the hold belongs to the process this one was forked from")
