"""Deadlock refusals (issue 27 §2): the server's ``-DEADLOCK ...`` reply to a wait that would
close a cycle becomes :class:`redis_rlock.Deadlock` carrying the cycle. The cycle is built with
raw commands (owners ``a`` and ``b``), so the reply is the real server's."""

from __future__ import annotations

import threading

import pytest
import redis
from _servers import Server, poll

import redis_rlock as rl
from redis_rlock.errors import translate


def test_a_deadlock_reply_becomes_deadlock_with_its_cycle(server: Server, r: redis.Redis) -> None:
    assert r.execute_command("RLOCK.ACQUIRE", "accounts", "a", 60000) is None
    assert r.execute_command("RLOCK.ACQUIRE", "ledger", "b", 60000) is None
    other = redis.Redis(port=server.port)
    waiter = threading.Thread(
        target=other.execute_command,
        args=("RLOCK.ACQUIRE", "accounts", "b", 60000, "WAIT", 3000),
    )
    waiter.start()
    try:
        poll("b to wait", 10, lambda: int(r.info("clients")["blocked_clients"]) == 1)
        with pytest.raises(redis.ResponseError) as refused:
            r.execute_command("RLOCK.ACQUIRE", "ledger", "a", 60000, "WAIT", 3000)
        found = translate(refused.value, "ledger")
        assert isinstance(found, rl.Deadlock) and isinstance(found, rl.LockError)
        assert found.cycle == ("a waits for ledger held by b; b waits for accounts held by a"), (
            found.cycle
        )
        assert r.execute_command("RLOCK.WAITERS", "ledger") == []
    finally:
        r.execute_command("RLOCK.RELEASE", "accounts", "a")
        waiter.join(5)
        other.close()
