"""Hostile tests of issue 27's Python sessions: a session is one connection, bound once; it
must never be silently re-made (a new connection is a new binding: the holds of the old one
ended on the server while their objects would still say held), and a forked child must never
use its parent's session socket."""

from __future__ import annotations

import asyncio
import os

import pytest
import redis
import redis.asyncio as aredis
from _servers import PROMPT, apoll, poll, raise_once_here, session_holds

import redis_rlock as rl
import redis_rlock.aio as ra


def test_an_interrupt_while_reading_a_session_reply_closes_the_session(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing inside redis-py's read of a session reply makes redis-py drop the socket
    (it disconnects on any BaseException there): the server ends every hold of the session. The
    session must see it (holds lost, closed) and refuse further acquires, never reconnect."""
    s = rl.Session(r)
    first = s.lock("a", lease=60)
    assert first.acquire()
    hold = first.hold
    # Only this thread's read: the watcher's ping (it wakes on the acquire's reply) reads too.
    raise_once_here(monkeypatch, s._conn._parser, "read_response", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        s.lock("b", lease=60).acquire(blocking=False)
    poll("the server ends the session's hold", PROMPT, lambda: r.exists("a") == 0)
    assert hold.is_lost(), "the server ended it: the hold must say lost"
    assert s.closed.is_set()
    with pytest.raises(rl.SessionClosed):
        s.lock("c", lease=60).acquire(blocking=False)
    assert r.exists("b", "c") == 0 and session_holds(r) == 0
    s.close()


def test_a_forked_child_never_uses_its_parent_s_session_socket(r: redis.Redis) -> None:
    """A child forked with a live session shares its socket: an acquire there would be bound to
    the parent's connection (and its reply read by whichever process reads first). The child
    must see the session as closed, and leave the parent's session and holds alone."""
    s = rl.Session(r)
    parent = s.lock("a", lease=60)
    assert parent.acquire()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            try:
                s.lock("child", lease=60).acquire(blocking=False)
                code = 1  # acquired through the parent's socket
            except rl.SessionClosed:
                code = 0 if s.closed.is_set() else 2
            s.close()
        except BaseException as e:
            print(f"the child failed: {e!r}", flush=True)
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child used the parent's session"
    assert r.exists("child") == 0, "nothing taken for the child"
    assert not s.closed.is_set() and not parent.hold.is_lost()
    assert s.lock("b", lease=60).acquire(blocking=False), "the parent's session still works"
    assert session_holds(r) == 2
    s.close()


async def test_async_a_cancel_while_sending_on_a_session_closes_it(
    r: redis.Redis, ar: aredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled inside redis-py's send of a session command makes redis-py drop the
    connection: the session must close (its holds lost), never reconnect on the next acquire."""
    s = ra.Session(ar)
    first = s.lock("a", lease=60)
    assert await first.acquire()
    hold = first.hold
    # Only this task's send: the watcher task's ping sends too.
    raise_once_here(monkeypatch, s._conn._writer, "writelines", asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await s.lock("b", lease=60).acquire(blocking=False)
    await apoll("the server to end the hold", PROMPT, lambda: not r.exists("a"))
    assert hold.is_lost(), "the server ended it: the hold must say lost"
    with pytest.raises(rl.SessionClosed):
        await s.lock("c", lease=60).acquire(blocking=False)
    assert r.exists("b", "c") == 0 and session_holds(r) == 0
    await s.close()


async def test_async_a_forked_child_sees_the_session_closed(
    r: redis.Redis, ar: aredis.Redis
) -> None:
    """As the sync session: in a forked child the asyncio session is closed, without touching
    the parent's socket; the parent's session goes on."""
    s = ra.Session(ar)
    parent = s.lock("a", lease=60)
    assert await parent.acquire()
    pid = os.fork()
    if pid == 0:  # the child: no event loop of its own to run, only what needs none
        code = 0
        try:
            if not s.closed.is_set():
                code = 1
        except BaseException as e:
            print(f"the child failed: {e!r}", flush=True)
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child saw the parent's session open"
    assert not s.closed.is_set() and not parent.hold.is_lost()
    assert await s.lock("b", lease=60).acquire(blocking=False), "the parent's session works"
    assert session_holds(r) == 2
    await s.close()
