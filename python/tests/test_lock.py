"""Sync Lock: every API path against a real server with the module, ownership per thread (another
thread can neither release nor renew a thread's hold), a restart that makes a watchdog hold
lost, and typed errors (an ACL user limited to a key pattern gets ``LockPermissionError`` and
holds nothing)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from _servers import Server, info, poll

import redis_rlock as rl


def test_acquire_release_and_reentry(r: redis.Redis) -> None:
    lock = rl.Lock(r, "orders:42")
    assert not lock.locked() and not lock.owned()
    assert lock.acquire()
    assert lock.locked() and lock.owned()
    fields = r.hgetall("orders:42")
    assert list(fields.values()) == [b"1"]  # Redisson's layout: owner -> count
    assert lock.acquire(timeout=1)  # re-entry, confirmed by RLOCK.RENEW
    assert lock.hold.count == 2
    lock.release()
    assert lock.owned() and r.exists("orders:42")
    lock.release()
    assert not lock.owned() and not r.exists("orders:42")
    with pytest.raises(rl.NotHeld):
        lock.release()


def test_with_block_and_timeout_on_entry(r: redis.Redis) -> None:
    lock = rl.Lock(r, "w")
    with lock:
        assert lock.owned()
        blocked = rl.Lock(r, "w", timeout=0.2)
        errs: list[BaseException] = []

        def other() -> None:
            try:
                with blocked:
                    pass
            except BaseException as e:
                errs.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert len(errs) == 1 and isinstance(errs[0], rl.LockTimeout)
        assert isinstance(errs[0], redis.exceptions.LockError)
    assert not r.exists("w")


def test_ownership_is_per_thread(r: redis.Redis) -> None:
    lock = rl.Lock(r, "t")
    assert lock.acquire()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)))
    t.start()
    t.join(10)
    assert got == [False]  # another thread does not re-enter this thread's hold
    t = threading.Thread(target=lambda: got.append(lock.owned()))
    t.start()
    t.join(10)
    assert got == [False, False]
    lock.release()


def test_waiting_is_in_the_server_and_fifo(r: redis.Redis) -> None:
    holder = rl.Lock(r, "fifo")
    holder.acquire()
    order: list[int] = []

    def waiter(i: int) -> None:
        lk = rl.Lock(r, "fifo")
        assert lk.acquire(timeout=20)
        order.append(i)
        lk.release()

    threads = []
    for i in range(4):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        threads.append(t)
        poll("waiter queued", 10, lambda i=i: info(r, "fifo")["waiters"] == i + 1)
    holder.release()
    for t in threads:
        t.join(20)
    assert order == [0, 1, 2, 3]
    assert not r.exists("fifo")


def test_timeout_and_non_blocking_leave_nothing(r: redis.Redis) -> None:
    holder = rl.Lock(r, "busy")
    holder.acquire()
    res: list[object] = []

    def other() -> None:
        lk = rl.Lock(r, "busy")
        t0 = time.monotonic()
        res.append(lk.acquire(timeout=0.3))
        res.append(time.monotonic() - t0)
        res.append(lk.acquire(blocking=False))
        res.append(lk.acquire(timeout=0))

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert res[0] is False and 0.25 < float(res[1]) < 3  # type: ignore[arg-type]
    assert res[2] is False and res[3] is False
    i = info(r, "busy")
    assert i["count"] == 1 and i["waiters"] == 0  # still one holder, nobody waiting
    holder.release()


def test_lease_loss_signal_check_callback(r: redis.Redis) -> None:
    seen: list[rl.Hold] = []
    lock = rl.Lock(r, "lease", lease=0.2, on_lost=seen.append)
    assert lock.acquire()
    assert not lock.lost.is_set()
    lock.check()
    assert lock.lost.wait(5)
    poll("callback", 5, lambda: len(seen) == 1)
    with pytest.raises(rl.LockLost):
        lock.check()
    with pytest.raises(rl.LockLost):  # a re-entry of a lost hold
        lock.acquire()
    with pytest.raises(redis.exceptions.LockNotOwnedError):  # nothing is sent
        lock.release()
    assert not lock.owned()


def test_watchdog_renews_until_release(r: redis.Redis) -> None:
    lock = rl.Lock(r, "wd", watchdog_timeout=0.6)
    lock.acquire()
    time.sleep(1.5)  # the subject: time passing beyond the lease (renewed every 0.2 s)
    assert lock.owned() and not lock.lost.is_set()
    assert 0 < r.pttl("wd") <= 600
    lock.release()
    assert not r.exists("wd")


def test_watchdog_wakes_for_an_earlier_renewal_only(r: redis.Redis) -> None:
    # the watchdog thread is woken only when a new entry becomes its earliest: a short-lease
    # hold scheduled while it sleeps until a long one's renewal must still be renewed in time,
    # and later holds (not its earliest entry) must not delay it
    slow = rl.Lock(r, "wd-slow", watchdog_timeout=30)
    slow.acquire()  # the thread now sleeps ~10 s
    fast = rl.Lock(r, "wd-fast", watchdog_timeout=0.6)
    fast.acquire()  # renewed every 0.2 s: must wake the thread
    for i in range(20):  # later entries: no wake-up needed, none may disturb the schedule
        extra = rl.Lock(r, f"wd-extra:{i}", watchdog_timeout=30)
        extra.acquire()
        extra.release()
    time.sleep(1.5)  # the subject: time passing beyond fast's lease
    assert fast.owned() and not fast.lost.is_set()
    assert 0 < r.pttl("wd-fast") <= 600
    fast.release()
    slow.release()
    assert not r.exists("wd-fast") and not r.exists("wd-slow")


def test_watchdog_reports_a_lock_taken_away(r: redis.Redis) -> None:
    lost = threading.Event()
    lock = rl.Lock(r, "gone", watchdog_timeout=0.6, on_lost=lambda h: lost.set())
    lock.acquire()
    old_owner = lock.hold.owner
    r.execute_command("RLOCK.FORCERELEASE", "gone")
    assert lost.wait(5)
    assert lock.lost.is_set()
    # the stale hold never touches a later holder
    other = rl.Lock(r, "gone")
    t = threading.Thread(target=other.acquire)
    t.start()
    t.join(10)
    with pytest.raises(rl.LockLost):
        lock.release()
    assert r.exists("gone")
    assert info(r, "gone")["owner"] != old_owner and info(r, "gone")["count"] == 1


def test_reentry_never_shortens_the_lease(r: redis.Redis) -> None:
    lock = rl.Lock(r, "short", lease=10)
    lock.acquire()
    lock.acquire(lease=0.05)
    assert r.pttl("short") > 5000
    lock.release()
    lock.release()


def test_fencing_tokens_grow(r: redis.Redis) -> None:
    lock = rl.Lock(r, "fence", fencing=True)
    tokens = []
    for _ in range(3):
        with lock:
            tokens.append(lock.token)
            assert lock.acquire()
            assert lock.token == tokens[-1]  # a re-entry shares its token
            lock.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert rl.Lock(r, "nofence").acquire()


def test_release_is_retried_with_its_request_id(r: redis.Redis) -> None:
    lock = rl.Lock(r, "retry")
    lock.acquire()
    # kill the package's connections: the release reconnects and still releases once
    for c in r.client_list():
        if c["id"] != str(r.client_id()):
            r.client_kill_filter(_id=c["id"])
    lock.release()
    assert not r.exists("retry")
    assert r.keys("redisson_unlock_latch:{retry}:*")


def test_errors_are_lock_errors(r: redis.Redis) -> None:
    r.set("str", "x")
    with pytest.raises(rl.WrongType) as e:
        rl.Lock(r, "str").acquire()
    assert isinstance(e.value, redis.exceptions.LockError)
    rw = rl.RWLock(r, "kind")
    rw.write.acquire()
    with pytest.raises(rl.WrongType):
        rl.Lock(r, "kind").acquire(blocking=False)
    rw.write.release()
    with pytest.raises(ValueError):
        rl.Lock(r, "x", lease=0)
    with pytest.raises(ValueError):
        rl.Lock(r, "x").acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError):
        rl.Lock(r, "x").acquire(timeout=-5)
    with pytest.raises(redis.exceptions.DataError):
        rl.Lock(r, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rl.Lock(object(), "x")


def test_binary_names_and_decode_responses() -> None:
    s = Server()
    try:
        r = s.client(decode_responses=True, protocol=3)
        name = b"bin\x00\xff{x}"
        lock = rl.Lock(r, name, fencing=True)
        with lock:
            assert lock.token == 1
            assert r.execute_command("RLOCK.PTTL", name) > 0
        sem = rl.LeasedSemaphore(r, "ids")
        sem.try_set_permits(1)
        with sem as hold:
            assert len(hold.ids[0]) == 16  # raw bytes, whatever the user's decoding
    finally:
        s.close()


def test_module_missing_is_named() -> None:
    s = Server(module=False)
    try:
        with pytest.raises(rl.ModuleMissing):
            rl.Lock(s.client(), "x").acquire()
    finally:
        s.close()


# -- threads sharing one Lock object -----------------------------------------------------------


def test_another_thread_cannot_release_or_renew_a_threads_hold(r: redis.Redis) -> None:
    lock = rl.Lock(r, "shared")
    assert lock.acquire()
    out: dict[str, Any] = {}

    def other() -> None:
        try:
            lock.release()
        except BaseException as e:
            out["release"] = e
        out["owned"] = lock.owned()
        out["try"] = lock.acquire(timeout=0.1)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert isinstance(out["release"], rl.NotHeld)
    assert out["owned"] is False and out["try"] is False
    assert lock.owned() and info(r, "shared")["owner"] == lock.hold.owner
    lock.release()
    assert not r.exists("shared")


# -- a restart under the watchdog --------------------------------------------------------------


RT = 0.5  # the package's response timeout in these tests


def test_restart_makes_a_watchdog_hold_lost(server: Server) -> None:
    r = server.client()
    lost = threading.Event()
    lock = rl.Lock(
        r, "restart", watchdog_timeout=0.9, response_timeout=RT, on_lost=lambda h: lost.set()
    )
    lock.acquire()
    server.restart_same_port()
    assert lost.wait(10)
    with pytest.raises(rl.LockLost):
        lock.release()
    assert not r.exists("restart")


# -- an ACL user limited to a key pattern ------------------------------------------------------


def test_acl_user_limited_to_a_key_pattern_gets_typed_errors_and_holds_nothing(
    server: Server,
) -> None:
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "narrow", "on", "nopass", "+@all", "~mine:*")
    r = server.client(username="narrow", password="x")
    for attempt in (
        lambda: rl.Lock(r, "other").acquire(timeout=0.2),
        lambda: rl.Lock(r, "mine:x").acquire(timeout=0.2),  # its request record is not allowed
        lambda: rl.RWLock(r, "mine:rw").read.acquire(timeout=0.2),
        lambda: rl.Semaphore(r, "mine:s").acquire(1, timeout=0.2),
        lambda: rl.LeasedSemaphore(r, "mine:l").acquire(1, timeout=0.2),
    ):
        with pytest.raises(rl.LockPermissionError):
            attempt()
    assert admin.keys("*") == [] or all(not k.startswith(b"mine:") for k in admin.keys("*"))
    assert admin.dbsize() == 0
