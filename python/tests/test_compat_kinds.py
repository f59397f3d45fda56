"""The redis-py drop-in, read-write locks and semaphores (sync), interop with raw commands; the
drop-in against redis-py's own ``Lock`` expectations (its errors, ``extend``/``reacquire``,
``thread_local=False`` shared between threads)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from _servers import info, poll
from redis.exceptions import LockError, LockNotOwnedError

import redis_rlock as rl


def test_drop_in_keeps_redis_py_signature_and_errors(r: redis.Redis) -> None:
    lock = r.lock("resource", timeout=5, blocking_timeout=0.2, lock_class=rl.RLockCompat)
    assert isinstance(lock, redis.lock.Lock)
    assert lock.acquire()
    assert lock.owned() and lock.locked()
    ((owner, count),) = r.hgetall("resource").items()  # Redisson's layout
    assert count == b"1" and owner.startswith(lock.local.token + b":")
    other = r.lock("resource", blocking_timeout=0.2, lock_class=rl.RLockCompat)
    assert not other.acquire()
    assert not other.acquire(blocking=False)
    assert lock.extend(10) and r.pttl("resource") > 10_000
    assert lock.reacquire() and r.pttl("resource") <= 5000
    with pytest.raises(LockError):
        other.release()  # never acquired
    lock.release()
    assert not lock.locked()
    with pytest.raises(LockError):
        lock.release()
    held = r.lock("resource", lock_class=rl.RLockCompat)
    with pytest.raises(LockNotOwnedError), held:  # as redis-py: the exit's release raises
        r.delete("resource")
        assert not held.owned()
    assert isinstance(LockNotOwnedError(), LockError)


def test_drop_in_release_after_loss_raises_not_owned_unless_quiet(r: redis.Redis) -> None:
    lock = r.lock("gone", timeout=0.1, lock_class=rl.RLockCompat)
    lock.acquire()
    poll("lease over", 5, lambda: not r.exists("gone"))
    with pytest.raises(LockNotOwnedError):
        lock.release()
    quiet = r.lock("gone", timeout=0.1, lock_class=rl.RLockCompat, raise_on_release_error=False)
    quiet.acquire()
    poll("lease over", 5, lambda: not r.exists("gone"))
    quiet.release()


def test_drop_in_waits_fifo_in_the_server(r: redis.Redis) -> None:
    holder = r.lock("fifo", lock_class=rl.RLockCompat)
    holder.acquire()
    order: list[int] = []

    def waiter(i: int) -> None:
        lk = r.lock("fifo", lock_class=rl.RLockCompat, blocking_timeout=20)
        assert lk.acquire()
        order.append(i)
        lk.release()

    threads = []
    for i in range(3):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        threads.append(t)
        poll("queued", 10, lambda i=i: info(r, "fifo")["waiters"] == i + 1)
    holder.release()
    for t in threads:
        t.join(20)
    assert order == [0, 1, 2]


def test_rwlock_sides(r: redis.Redis) -> None:
    rw = rl.RWLock(r, "cfg", fencing=True)
    with rw.read:
        res: list[bool] = []
        other = rl.RWLock(r, "cfg")

        def writer() -> None:
            res.append(other.write.acquire(timeout=0.2))

        t = threading.Thread(target=writer)
        t.start()
        t.join(10)
        assert res == [False]
        with pytest.raises(rl.UpgradeRefused):
            rw.write.acquire()
        assert rw.read.acquire()  # re-entry
        rw.read.release()
    with rw.write:
        assert rw.write.token is not None
        with rw.read:
            pass
        assert r.hget("cfg", "mode") == b"write"
    assert not r.exists("cfg")


def test_counted_semaphore_guards_give_back_exactly(r: redis.Redis) -> None:
    sem = rl.Semaphore(r, "pool", timeout=0.2)
    assert sem.try_set_permits(3) and not sem.try_set_permits(9)
    with sem, sem:
        assert sem.available() == 1
        hold = sem.permits(1)
        assert hold is not None and sem.available() == 0
        assert sem.permits(1, blocking=False) is None
        with pytest.raises(rl.LockTimeout), sem:
            pass
        hold.release()
    assert sem.available() == 3
    assert sem.acquire(2) and sem.release(2) == 3
    assert sem.add_permits(-1) == 2
    with pytest.raises(ValueError):
        sem.acquire(0)


def test_leased_semaphore_watchdog_and_loss(r: redis.Redis) -> None:
    sem = rl.LeasedSemaphore(r, "lp", watchdog_timeout=0.6)
    sem.try_set_permits(2)
    hold = sem.acquire(2)
    assert hold is not None and len(hold.ids) == 2
    poll("renewed", 5, lambda: not hold.lost.is_set() and hold.valid_until > hold.sent_at + 0.7)
    hold.release()
    assert sem.available() == 2
    short = rl.LeasedSemaphore(r, "lp", lease=0.1).acquire(1)
    assert short is not None and short.lost.wait(5)
    with pytest.raises(rl.LockLost):
        short.release()
    poll("reclaimed", 5, lambda: sem.available() == 2)
    with pytest.raises(ValueError):
        sem.acquire(10_001)


def test_interop_with_raw_commands_and_redis_cli_layout(r: redis.Redis) -> None:
    lock = rl.Lock(r, "shared")
    lock.acquire()
    owner = lock.hold.owner
    assert r.hgetall("shared") == {owner: b"1"}  # visible as Redisson's hash
    assert r.execute_command("RLOCK.RELEASE", "shared", owner) == 1  # releasable raw
    r.execute_command("RLOCK.ACQUIRE", "shared", "cli-owner", 30000)  # a raw holder...
    assert not rl.Lock(r, "shared").acquire(timeout=0.1)  # ...excludes the package
    assert r.execute_command("RLOCK.RELEASE", "shared", "cli-owner") == 1
    with pytest.raises(rl.LockLost):  # the package's stale hold never releases anything
        lock.acquire()


def test_drop_in_extend_given_up_on_and_run_late_never_shortens_a_later_extend(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # extend(t) adds t to the lease left, as redis-py's: never a shorter lease, also when the
    # client gave up on it (a timeout) and the server ran it after a later, longer extend
    from redis_rlock._sync import SyncBackend

    real, ran = SyncBackend.call, threading.Event()
    first: list[bool] = []

    def late(args: list[Any]) -> None:
        time.sleep(0.3)
        r.execute_command(*args)
        ran.set()

    def call(self: Any, key: Any, args: list[Any], *a: Any, **kw: Any) -> Any:
        if args[0] == "RLOCK.RENEW" and not first:
            first.append(True)
            threading.Thread(target=late, args=(args,), daemon=True).start()
            raise redis.TimeoutError("no reply in time")
        return real(self, key, args, *a, **kw)

    lock = r.lock("resource", timeout=1, lock_class=rl.RLockCompat)
    assert lock.acquire()
    monkeypatch.setattr(SyncBackend, "call", call)
    with pytest.raises(redis.TimeoutError):
        lock.extend(0.5)  # about 1.5 s: sent, its reply never comes
    assert lock.extend(5)  # about 6.5 s
    assert ran.wait(2.0)
    assert r.pttl("resource") > 5000, "the later extend's lease stands"
    assert lock.extend(0.2, replace_ttl=True)  # the caller's explicit ask: exactly 0.2 s
    assert r.pttl("resource") <= 200
    lock.release()


# -- the drop-in against redis-py's own Lock expectations --------------------------------------


def test_drop_in_matches_redis_py_lock_expectations(r: redis.Redis) -> None:
    lock = r.lock("c", timeout=10, lock_class=rl.RLockCompat)
    with pytest.raises(LockError):
        lock.extend(5)  # "Cannot extend an unlocked lock"
    with pytest.raises(LockError):
        lock.release()  # "Cannot release an unlocked lock"
    assert not lock.locked() and not lock.owned()
    assert lock.acquire(blocking=False, token="tok")
    assert lock.local.token == b"tok"
    assert lock.locked() and lock.owned()
    assert not lock.acquire(blocking=False)  # not reentrant, as redis-py's
    other = r.lock("c", timeout=10, lock_class=rl.RLockCompat)
    t0 = time.monotonic()
    assert not other.acquire(blocking_timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2
    assert not other.owned()
    busy = r.lock("c", blocking_timeout=0.1, lock_class=rl.RLockCompat)
    with pytest.raises(LockError, match="Unable to acquire"), busy:
        pass
    assert lock.extend(10)  # adds to the remaining ~10 s
    assert 15_000 < int(r.execute_command("RLOCK.PTTL", "c")) <= 20_000
    assert lock.extend(5, replace_ttl=True)
    assert 4_000 < int(r.execute_command("RLOCK.PTTL", "c")) <= 5_000
    assert lock.reacquire()
    assert 9_000 < int(r.execute_command("RLOCK.PTTL", "c")) <= 10_000
    lock.release()
    assert not r.exists("c")
    with pytest.raises(LockError):
        lock.release()

    noexp = r.lock("c2", lock_class=rl.RLockCompat)  # timeout None
    assert noexp.acquire()
    with pytest.raises(LockError):
        noexp.extend(5)  # "Cannot extend a lock with no timeout"
    with pytest.raises(LockError):
        noexp.reacquire()
    noexp.release()

    lost = r.lock("c3", timeout=10, lock_class=rl.RLockCompat)
    assert lost.acquire()
    r.execute_command("RLOCK.FORCERELEASE", "c3")
    with pytest.raises(LockNotOwnedError):
        lost.extend(5)
    with pytest.raises(LockNotOwnedError):
        lost.reacquire()
    assert not lost.owned()


def test_drop_in_thread_local_false_is_shared_between_threads(r: redis.Redis) -> None:
    lock = r.lock("tl", timeout=10, thread_local=False, lock_class=rl.RLockCompat)
    assert lock.acquire()
    t = threading.Thread(target=lock.release)
    t.start()
    t.join(10)
    assert not r.exists("tl")
    local = r.lock("tl2", timeout=10, lock_class=rl.RLockCompat)
    assert local.acquire()
    err: list[BaseException] = []

    def other() -> None:
        try:
            local.release()
        except BaseException as e:
            err.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert err and isinstance(err[0], LockError) and r.exists("tl2")
    local.release()
