"""An owner's holds of one name are one server hold: no acquire, re-entry or renewal sent for
one of them ends another's lease early; and a hold re-entered with a longer lease keeps it when
re-entered again with a shorter one (docs/clients.md: the lease is never shortened below what
any live guard of the hold was promised)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any, Optional

import pytest
import redis
import redis.asyncio as aredis
from _proxy import SlowProxy
from _servers import Server, apoll, poll, raise_once_here

import redis_rlock as rl
import redis_rlock.aio as ra
from redis_rlock import _proto as P
from redis_rlock._conn import Stalled
from redis_rlock._hold import kept_by_cancel, late_renewal

#: slack for the server's PTTL against a guard's valid_until (ms rounding, two clocks)
TOL_MS = 25


def _pttl_and_left(r: redis.Redis, key: Any, valid_until: float) -> tuple[int, float]:
    """The server's PTTL of ``key`` and how long a guard valid until ``valid_until`` has left,
    read after the PTTL's reply (the server answered before: a slow reply can only make the
    guard look shorter, never the server's lease)."""
    pttl = int(r.pttl(key))
    return pttl, (valid_until - time.monotonic()) * 1000


def _lease_covers(r: redis.Redis, key: str, hold: rl.Hold) -> None:
    pttl, left_ms = _pttl_and_left(r, key, hold.valid_until)
    assert not hold.is_lost()
    assert pttl >= left_ms - TOL_MS, f"guard valid {left_ms:.0f} ms more, server lease {pttl} ms"


def test_an_owners_nested_shorter_lease_never_shortens_its_outer_hold(
    r: redis.Redis,
) -> None:
    owner = rl.Owner(r)
    outer = owner.lock("k")
    assert outer.acquire()
    inner = owner.lock("k")
    assert inner.acquire(blocking=False, lease=0.3)
    _lease_covers(r, "k", outer.hold)
    inner.release()
    _lease_covers(r, "k", outer.hold)
    time.sleep(0.5)  # past the inner lease: the outer hold is still the server's
    _lease_covers(r, "k", outer.hold)
    assert not rl.Lock(r, "k").acquire(blocking=False)
    outer.release()
    assert r.exists("k") == 0


# a write side's renewal never shortens the hash (the server keeps the later expiry); a read
# side's resets every read hold key of the owner
@pytest.mark.parametrize("kind", ["lock", "read"])
def test_an_owners_watchdog_renewal_never_shortens_a_longer_lease_of_another_handle(
    r: redis.Redis, kind: str
) -> None:
    owner = rl.Owner(r)
    if kind == "lock":
        outer: Any = owner.lock("k", lease=5.0)
        inner: Any = owner.lock("k", watchdog_timeout=0.6)  # renewed every 0.2 s for 0.6 s
    else:
        outer = getattr(owner.rw_lock("k", lease=5.0), kind)
        inner = getattr(owner.rw_lock("k", watchdog_timeout=0.6), kind)
    assert outer.acquire()
    assert inner.acquire()
    time.sleep(0.5)  # two renewals of the inner hold
    _lease_covers(r, "k", outer.hold)
    if kind == "read":  # the outer read hold's own lease key too
        keys = r.keys("{k}:*:rwlock_timeout:1")
        assert len(keys) == 1
        pttl, left_ms = _pttl_and_left(r, keys[0], outer.hold.valid_until)
        assert pttl >= left_ms - TOL_MS
    inner.release()
    outer.release()


def test_a_hold_reentered_with_a_longer_lease_keeps_it_when_reentered_shorter(
    r: redis.Redis,
) -> None:
    lk = rl.Lock(r, "k", watchdog_timeout=1.5)
    assert lk.acquire()
    assert lk.acquire(lease=5.0)
    assert lk.acquire(lease=0.3)
    _lease_covers(r, "k", lk.hold)
    time.sleep(0.6)  # a watchdog renewal (every 0.5 s) happened meanwhile
    _lease_covers(r, "k", lk.hold)
    for _ in range(3):
        lk.release()


async def test_an_asyncio_owners_nested_shorter_lease_never_shortens_its_outer_hold(
    server: Server, ar: aredis.Redis, r: redis.Redis
) -> None:
    owner = ra.Owner(ar)
    outer = owner.lock("k")
    assert await outer.acquire()
    inner = owner.lock("k")
    assert await inner.acquire(blocking=False, lease=0.3)
    await inner.release()
    _lease_covers(r, "k", outer.hold)
    other = ra.Lock(ar, "k")
    assert not await other.acquire(blocking=False)
    await outer.release()
    assert r.exists("k") == 0


def test_an_owners_read_release_never_leaves_another_read_guard_a_shorter_lease_key(
    r: redis.Redis,
) -> None:
    # the server drops the owner's last read lease key on a release, whichever guard released
    owner = rl.Owner(r)
    first = owner.rw_lock("k").read
    assert first.acquire(lease=0.4)
    second = owner.rw_lock("k").read
    assert second.acquire(lease=5.0)
    first.release()
    _lease_covers(r, "k", second.hold)
    keys = r.keys("{k}:*:rwlock_timeout:*")
    assert len(keys) == 1
    pttl, left_ms = _pttl_and_left(r, keys[0], second.hold.valid_until)
    assert pttl >= left_ms - TOL_MS
    second.release()
    assert r.exists("k") == 0


def test_an_owners_read_release_refused_by_a_stale_master_raises_the_packages_error(
    r: redis.Redis,
) -> None:
    # the renewal before the release is refused (NOREPLICAS, as an old master's after a
    # failover): the package's NoReplicas, nothing released, not redis-py's ResponseError
    owner = rl.Owner(r, response_timeout=0.3)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert first.acquire() and second.acquire()
    r.config_set("rlock.min-replicas", 1)
    try:
        with pytest.raises(rl.NoReplicas):
            first.release()
        assert first.owned() and r.hlen("k") == 2  # mode and the owner's field: still held
    finally:
        r.config_set("rlock.min-replicas", -1)
    first.release()
    second.release()
    assert r.exists("k") == 0


async def test_an_asyncio_owners_read_release_refused_by_a_stale_master_raises_the_packages_error(
    server: Server,
) -> None:
    r = aredis.Redis(port=server.port, socket_timeout=10)
    c = server.client()
    owner = ra.Owner(r, response_timeout=0.3)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert await first.acquire() and await second.acquire()
    c.config_set("rlock.min-replicas", 1)
    try:
        with pytest.raises(rl.NoReplicas):
            await first.release()
        assert first.owned() and c.hlen("k") == 2
    finally:
        c.config_set("rlock.min-replicas", -1)
    await first.release()
    await second.release()
    assert c.exists("k") == 0
    await r.aclose()


def test_an_owners_read_release_asks_a_refused_renewal_again_within_its_response_timeout(
    r: redis.Redis,
) -> None:
    # a refusal that ends within the response timeout (an old master's, then the new one's
    # answer after a failover; here the setting lowered 0.1 s later): the release goes through
    owner = rl.Owner(r, response_timeout=2.0)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert first.acquire() and second.acquire()
    r.config_set("rlock.min-replicas", 1)
    timer = threading.Timer(0.1, lambda: r.config_set("rlock.min-replicas", -1))
    timer.start()
    try:
        first.release()
    finally:
        timer.join()
        r.config_set("rlock.min-replicas", -1)
    assert not first.owned() and second.owned()
    second.release()
    assert r.exists("k") == 0


async def test_an_asyncio_owners_read_release_asks_a_refused_renewal_again(
    server: Server,
) -> None:
    r = aredis.Redis(port=server.port, socket_timeout=10)
    c = server.client()
    owner = ra.Owner(r, response_timeout=2.0)
    first = owner.rw_lock("k", lease=30).read
    second = owner.rw_lock("k", lease=30).read
    assert await first.acquire() and await second.acquire()
    c.config_set("rlock.min-replicas", 1)
    timer = threading.Timer(0.1, lambda: server.client().config_set("rlock.min-replicas", -1))
    timer.start()
    try:
        await first.release()
    finally:
        timer.join()
        c.config_set("rlock.min-replicas", -1)
    assert not first.owned() and second.owned()
    await second.release()
    assert c.exists("k") == 0
    await r.aclose()


# -- an owner's write (or lock) hold has no lease of its own on the server -----------------------
# Its field lives as long as the key, and a hold of the same owner on that key (a read hold taken
# under the write, with a longer lease or a watchdog; a nested lock hold with a longer lease)
# keeps the key: past its own lease the field is still there. So its guard still holds (never
# promised past what the server has), and when it goes its release goes out: nothing stays held
# by nobody while the other hold lives on.

#: the write's own lease; the watchdog read's period (renewed every third of it)
SHORT, WATCHDOG = 0.3, 0.6


def _write_count(r: redis.Redis, key: str, owner: bytes) -> Optional[bytes]:
    return r.hget(key, owner + b":write")  # type: ignore[return-value]


@pytest.mark.parametrize(
    "handles,read_lease",
    [("one owner handle", 20.0), ("two owner handles", None), ("plain", 20.0), ("plain", None)],
)
def test_a_write_hold_kept_by_its_owners_read_hold_ends_when_its_guard_goes(
    r: redis.Redis, handles: str, read_lease: Optional[float]
) -> None:
    if handles == "plain":  # no Owner: the read side re-enters under the write's owner id
        write_rw = read_rw = rl.RWLock(r, "k", watchdog_timeout=WATCHDOG)
    else:
        owner = rl.Owner(r)
        write_rw = owner.rw_lock("k", watchdog_timeout=WATCHDOG)
        read_rw = write_rw
        if handles == "two owner handles":
            read_rw = owner.rw_lock("k", watchdog_timeout=WATCHDOG)
    write, read = write_rw.write, read_rw.read
    assert write.acquire(blocking=False, lease=SHORT)
    assert read.acquire(lease=read_lease)
    who = write.hold.owner
    time.sleep(2 * SHORT + 0.1)  # past the write's own lease (and the read watchdog's renewals)
    assert _write_count(r, "k", who) == b"1"
    assert not write.hold.is_lost(), "the write hold is still on the server"
    _lease_covers(r, "k", write.hold)
    write.release()  # downgrades to read
    poll("the owner's write field gone", 3.0, lambda: _write_count(r, "k", who) is None)
    other = rl.RWLock(r, "k").read
    assert other.acquire(blocking=False, lease=SHORT), "another reader joins the owner's read"
    other.release()
    read.release()
    assert r.exists("k") == 0


@pytest.mark.parametrize("handles,read_lease", [("owner", None), ("plain", 20.0)])
async def test_an_asyncio_write_hold_kept_by_its_owners_read_hold_ends_when_its_guard_goes(
    ar: aredis.Redis, r: redis.Redis, handles: str, read_lease: Optional[float]
) -> None:
    if handles == "plain":
        rw = ra.RWLock(ar, "k", watchdog_timeout=WATCHDOG)
    else:
        rw = ra.Owner(ar).rw_lock("k", watchdog_timeout=WATCHDOG)
    assert await rw.write.acquire(blocking=False, lease=SHORT)
    assert await rw.read.acquire(lease=read_lease)
    who = rw.write.hold.owner
    await asyncio.sleep(2 * SHORT + 0.1)  # past the write's own lease
    assert _write_count(r, "k", who) == b"1"
    assert not rw.write.hold.is_lost(), "the write hold is still on the server"
    _lease_covers(r, "k", rw.write.hold)
    async with rw.write:  # a re-entry (the hold is confirmed), then its last count released
        pass
    await rw.write.release()
    await apoll("the owner's write field gone", 3.0, lambda: _write_count(r, "k", who) is None)
    other = ra.RWLock(ar, "k").read
    assert await other.acquire(blocking=False, lease=SHORT), "another reader joins"
    await other.release()
    await rw.read.release()
    assert r.exists("k") == 0


def test_an_owners_lock_hold_kept_by_a_longer_nested_one_releases_its_count(
    r: redis.Redis,
) -> None:
    owner = rl.Owner(r)
    short, long = owner.lock("k"), owner.lock("k")
    assert short.acquire(blocking=False, lease=SHORT)
    assert long.acquire(blocking=False, lease=20.0)
    time.sleep(2 * SHORT)  # past the short hold's own lease: the longer one keeps the key
    assert r.hget("k", owner.id) == b"2"
    _lease_covers(r, "k", short.hold)
    short.release()
    assert r.hget("k", owner.id) == b"1"
    long.release()
    assert r.exists("k") == 0


# A read acquire under the write, interrupted (or cancelled) after the server granted it: its
# cancel gives the read back, but its grant had already set the key's expiry to its lease, which
# the give-back never shortens while the owner holds the write. The write guard learns that from
# the cancel's reply ("granted, given back"): still valid, its release still goes out.


@pytest.mark.parametrize("handles", ["owner", "plain"])
def test_a_write_hold_outliving_its_lease_by_a_cancelled_read_grant_is_still_released(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, handles: str
) -> None:
    rw = rl.Owner(r).rw_lock("k") if handles == "owner" else rl.RWLock(r, "k")
    assert rw.write.acquire(blocking=False, lease=SHORT)
    who = rw.write.hold.owner
    raise_once_here(monkeypatch, P.Spec, "granted", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # the reply read, before the caller is told
        rw.read.acquire(blocking=False, lease=20.0)
    assert not rw.read.owned()
    poll("the cancelled read given back", 3.0, lambda: r.hget("k", who) is None)
    time.sleep(2 * SHORT)  # past the write's own lease: the read's grant kept the key
    assert _write_count(r, "k", who) == b"1"
    _lease_covers(r, "k", rw.write.hold)
    rw.write.release()
    assert r.exists("k") == 0


@pytest.mark.parametrize("handles", ["owner", "plain"])
async def test_an_asyncio_write_hold_outliving_its_lease_by_a_cancelled_read_grant_is_released(
    ar: aredis.Redis, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, handles: str
) -> None:
    rw = ra.Owner(ar).rw_lock("k") if handles == "owner" else ra.RWLock(ar, "k")
    assert await rw.write.acquire(blocking=False, lease=SHORT)
    who = rw.write.hold.owner
    # a cancellation landing at the reply's await, after the server ran the acquire
    raise_once_here(monkeypatch, P.Spec, "granted", asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await rw.read.acquire(blocking=False, lease=20.0)
    assert not rw.read.owned()
    await apoll("the cancelled read given back", 3.0, lambda: r.hget("k", who) is None)
    await asyncio.sleep(2 * SHORT)
    assert _write_count(r, "k", who) == b"1"
    _lease_covers(r, "k", rw.write.hold)
    await rw.write.release()
    assert r.exists("k") == 0


# A cancel that gave a granted acquire back ("2") keeps the owner's other holds of the key
# valid until that grant's lease ends: only the holds that were on the server on the terms it
# extends. A hold whose acquire was sent after the cancelled one (its lease not floored by it:
# it may have reset the key's expiry to its own, shorter one after that grant) or whose grant
# was read only after the cancel was sent (it may have been made after the give-back deleted
# the key) was granted on its own terms, and keeps its own deadline.


def test_a_cancelled_grant_keeps_only_the_owners_holds_granted_before_it_was_sent(
    r: redis.Redis,
) -> None:
    owner = rl.Owner(r)
    older, newer = owner.lock("k"), owner.lock("k")
    assert older.acquire(blocking=False, lease=SHORT)
    t0 = time.monotonic()  # the cancelled acquire was sent from here on
    time.sleep(0.01)
    assert newer.acquire(blocking=False, lease=SHORT)
    spec = P.Spec(P.LOCK, b"k", owner=owner.id, lease_ms=20_000, peers=owner._id.peers)
    own = {"older": older.hold.valid_until, "newer": newer.hold.valid_until}
    kept_by_cancel(spec, t0, 2)
    assert older.hold.valid_until >= t0 + 20.0  # on the server before it: kept
    assert newer.hold.valid_until == own["newer"], "a hold sent after it kept by its grant"
    # a grant read after the cancel was sent: not kept either, however early it was sent
    asked_at = time.monotonic()
    late = owner.lock("k")
    assert late.acquire(blocking=False, lease=SHORT)
    late.hold.sent_at = t0 - 1.0  # sent long before (its reply read after the cancel went out)
    late_own = late.hold.valid_until
    kept_by_cancel(spec, t0, 2, asked_at)
    assert late.hold.valid_until == late_own
    for lk in (late, newer, older):
        lk.release()
    assert r.exists("k") == 0


# A read acquire under the owner's own write, sent just before the write guard's deadline: the
# server grants it (a re-entry: the key's expiry becomes the read's long lease, the write's
# field lives on), its reply read after the guard declared itself lost (it cannot tell that
# grant from a read granted on an expired key). The guard stays lost, and its write count,
# kept on the server, is released by the read's acquire: never held by nobody for the read's
# lease.


@pytest.mark.parametrize("handles", ["owner", "plain"])
def test_a_write_lost_while_its_owners_read_was_granted_late_leaves_no_write_count(
    server: Server, handles: str
) -> None:
    proxy = SlowProxy(server.port, 0.15)
    c, r = redis.Redis(port=proxy.port), server.client()
    try:
        rw = rl.Owner(c).rw_lock("k") if handles == "owner" else rl.RWLock(c, "k")
        assert not rw.write.locked()  # the package's connection opened (a slow handshake)
        assert rw.write.acquire(blocking=False, lease=0.8)
        w = rw.write.hold
        time.sleep(max(0.0, w.valid_until - time.monotonic() - 0.05))  # sent just before
        assert rw.read.acquire(blocking=False, lease=20.0)
        assert w.is_lost()  # its reply came after the write's deadline
        with pytest.raises(rl.LockLost):
            rw.write.release()  # lost: it sends nothing
        assert _write_count(r, "k", w.owner) is None
        assert rw.read.owned()
        rw.read.release()
        assert r.exists("k") == 0
    finally:
        c.close()
        r.close()
        proxy.close()


@pytest.mark.parametrize("handles", ["owner", "plain"])
async def test_an_asyncio_write_lost_while_its_owners_read_was_granted_late_leaves_no_count(
    server: Server, handles: str
) -> None:
    proxy = SlowProxy(server.port, 0.15)
    c, r = aredis.Redis(port=proxy.port), server.client()
    try:
        rw = ra.Owner(c).rw_lock("k") if handles == "owner" else ra.RWLock(c, "k")
        assert not await rw.write.locked()
        assert await rw.write.acquire(blocking=False, lease=0.8)
        w = rw.write.hold
        await asyncio.sleep(max(0.0, w.valid_until - time.monotonic() - 0.05))
        assert await rw.read.acquire(blocking=False, lease=20.0)
        assert w.is_lost()
        with pytest.raises(rl.LockLost):
            await rw.write.release()
        assert _write_count(r, "k", w.owner) is None
        assert rw.read.owned()
        await rw.read.release()
        assert r.exists("k") == 0
    finally:
        await c.aclose()
        r.close()
        proxy.close()


def test_a_late_read_grant_never_releases_a_newer_write_of_the_same_owner(
    r: redis.Redis,
) -> None:
    """The release above is exact only when no other write count of the owner can be there:
    with a newer write hold of the owner live on the key (granted on a fresh key after the lost
    one's field expired), a read granted after the loss releases nothing."""
    owner = rl.Owner(r)
    old, new = owner.rw_lock("k"), owner.rw_lock("k")
    assert old.write.acquire(blocking=False, lease=SHORT)
    gone = old.write.hold
    poll("the old write lost", 3.0, gone.is_lost)
    poll("its field expired", 3.0, lambda: _write_count(r, "k", owner.id) is None)
    assert new.write.acquire(blocking=False, lease=20.0)
    assert new.read.acquire(blocking=False, lease=20.0)
    assert _write_count(r, "k", owner.id) == b"1"
    assert new.write.owned()
    new.read.release()
    new.write.release()
    assert r.exists("k") == 0


# -- a renewal in flight while a longer lease is confirmed ---------------------------------------
# The server SETS the lease on every renewal and re-entry: a watchdog renewal sent before a longer
# re-entry (or an Owner's other handle's acquire) but run by the server after it (another
# connection, a slow link) sets its own, shorter end. A guard's valid_until counts only what every
# command still in flight then leaves (the Rust client's rule), and the next renewal asks the
# longer lease again.

#: how long the server sees the watchdog's renewal after it was sent (a slow link)
STALL = 0.3


class _StalledRenewal:
    """Delays the next watchdog renewal (a lease under 1 s) by ``STALL`` before it is sent."""

    def __init__(self) -> None:
        self.armed = False
        self.sent = threading.Event()
        self.answered = threading.Event()

    def wants(self, args: list[Any]) -> bool:
        if self.armed and args[0] in ("RLOCK.RENEW", "RWLOCK.RENEW") and int(args[3]) < 1000:
            self.armed = False
            return True
        return False


def _stall_sync(monkeypatch: pytest.MonkeyPatch) -> _StalledRenewal:
    from redis_rlock._sync import SyncBackend

    st, real = _StalledRenewal(), SyncBackend.call_until

    def call_until(
        self: Any, key: bytes, args: list[Any], until: Optional[float], *rest: Any
    ) -> Any:
        if not st.wants(args):
            return real(self, key, args, until, *rest)
        st.sent.set()
        time.sleep(STALL)
        try:
            return real(self, key, args, None, *rest)
        finally:
            st.answered.set()

    monkeypatch.setattr(SyncBackend, "call_until", call_until)
    return st


@pytest.mark.parametrize("how", ["re-entry", "owner handle"])
def test_a_longer_lease_confirmed_while_a_watchdog_renewal_is_in_flight_is_not_overpromised(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    owner = rl.Owner(r)
    outer = owner.lock("k", watchdog_timeout=0.6)  # renewed every 0.2 s for 0.6 s
    assert outer.acquire()
    st = _stall_sync(monkeypatch)
    st.armed = True
    assert st.sent.wait(2.0), "the watchdog renewed"
    inner = outer if how == "re-entry" else owner.lock("k")
    assert inner.acquire(blocking=False, lease=5.0)
    assert st.answered.wait(2.0)
    # the stalled renewal ran after the 5 s lease was set: the server's lease is its 0.6 s
    _lease_covers(r, "k", inner.hold)
    _lease_covers(r, "k", outer.hold)
    # the next renewals ask the 5 s again: the guard is valid that long once confirmed
    poll("the 5 s lease confirmed", 2.0, lambda: inner.hold.valid_until - time.monotonic() > 4.0)
    _lease_covers(r, "k", inner.hold)
    assert r.pttl("k") > 4000
    inner.release()
    outer.release()  # its own count (the re-entry's was the first release)
    assert r.exists("k") == 0


async def test_an_asyncio_longer_re_entry_while_a_watchdog_renewal_is_in_flight_is_not_overpromised(
    ar: aredis.Redis, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis_rlock.aio._engine import AsyncBackend

    st, real = _StalledRenewal(), AsyncBackend.call_until

    async def call_until(
        self: Any, key: bytes, args: list[Any], until: Optional[float], *rest: Any
    ) -> Any:
        if not st.wants(args):
            return await real(self, key, args, until, *rest)
        st.sent.set()
        await asyncio.sleep(STALL)
        try:
            return await real(self, key, args, None, *rest)
        finally:
            st.answered.set()

    monkeypatch.setattr(AsyncBackend, "call_until", call_until)
    owner = ra.Owner(ar)
    outer = owner.lock("k", watchdog_timeout=0.6)
    assert await outer.acquire()
    st.armed = True
    await apoll("the watchdog renewed", 2.0, st.sent.is_set)
    assert await outer.acquire(blocking=False, lease=5.0)
    await apoll("the stalled renewal answered", 2.0, st.answered.is_set)
    _lease_covers(r, "k", outer.hold)
    await apoll("5 s confirmed", 2.0, lambda: outer.hold.valid_until - time.monotonic() > 4.0)
    _lease_covers(r, "k", outer.hold)
    await outer.release()
    await outer.release()
    assert r.exists("k") == 0


# -- a renewal the client gave up on, run by the server later ------------------------------------
# The client's response timeout ends its wait, not the command: the server may still run it (a
# slow link, a stall), after a re-entry the client sent later asked (and was confirmed) a longer
# lease. Every renewal and re-entry of a lock or a side carries GT: run late, it never shortens.


def _late_sync(monkeypatch: pytest.MonkeyPatch, r: redis.Redis) -> _StalledRenewal:
    """The next watchdog renewal: its caller is told it timed out, the server runs it ``STALL``
    later (sent then, exactly as built, from the test's own connection)."""
    from redis_rlock._sync import SyncBackend

    st, real = _StalledRenewal(), SyncBackend.call_until

    def late(args: list[Any]) -> None:
        time.sleep(STALL)
        r.execute_command(*args)
        st.answered.set()

    def call_until(
        self: Any, key: bytes, args: list[Any], until: Optional[float], *rest: Any
    ) -> Any:
        if not st.wants(args):
            return real(self, key, args, until, *rest)
        threading.Thread(target=late, args=(args,), daemon=True).start()
        st.sent.set()
        raise redis.TimeoutError("no reply in time")

    monkeypatch.setattr(SyncBackend, "call_until", call_until)
    return st


# (a write side's renewal never shortened the hash; its read side's lease keys it did)
@pytest.mark.parametrize("kind", ["lock", "read"])
def test_a_renewal_given_up_on_and_run_late_never_shortens_a_longer_re_entry(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    owner = rl.Owner(r)
    if kind == "lock":
        held: Any = owner.lock("k", watchdog_timeout=0.6)
    else:
        held = getattr(owner.rw_lock("k", watchdog_timeout=0.6), kind)
    assert held.acquire()
    st = _late_sync(monkeypatch, r)
    st.armed = True
    assert st.sent.wait(2.0), "the watchdog renewed (and gave up)"
    assert held.acquire(blocking=False, lease=5.0)
    assert st.answered.wait(2.0), "the server ran the renewal given up on"
    _lease_covers(r, "k", held.hold)
    assert r.pttl("k") > 4000, "the re-entry's 5 s lease stands"
    for key in r.keys("{k}:*:rwlock_timeout:*"):  # the read side's lease keys, each
        assert r.pttl(key) > 4000, f"{key!r}: the re-entry's 5 s lease stands"
    held.release()
    held.release()
    assert r.exists("k") == 0


async def test_an_asyncio_renewal_given_up_on_and_run_late_never_shortens_a_longer_re_entry(
    ar: aredis.Redis, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis_rlock.aio._engine import AsyncBackend

    st, real = _StalledRenewal(), AsyncBackend.call_until

    def late(args: list[Any]) -> None:
        time.sleep(STALL)
        r.execute_command(*args)
        st.answered.set()

    async def call_until(
        self: Any, key: bytes, args: list[Any], until: Optional[float], *rest: Any
    ) -> Any:
        if not st.wants(args):
            return await real(self, key, args, until, *rest)
        threading.Thread(target=late, args=(args,), daemon=True).start()
        st.sent.set()
        raise redis.TimeoutError("no reply in time")

    monkeypatch.setattr(AsyncBackend, "call_until", call_until)
    held = ra.Owner(ar).lock("k", watchdog_timeout=0.6)
    assert await held.acquire()
    st.armed = True
    await apoll("the watchdog renewed (and gave up)", 2.0, st.sent.is_set)
    assert await held.acquire(blocking=False, lease=5.0)
    await apoll("the server ran the renewal given up on", 2.0, st.answered.is_set)
    _lease_covers(r, "k", held.hold)
    assert r.pttl("k") > 4000, "the re-entry's 5 s lease stands"
    await held.release()
    await held.release()
    assert r.exists("k") == 0


# -- a net: an owner's guards are never promised more than the server holds ---------------------
# One Owner's handles of one lock, each re-entered and released at random with mixed leases (a
# watchdog's, short, long), behind a slow link with spikes (``SlowProxy``: replies now and then
# after the response timeout, so renewals and re-entries are given up on and run late, and the
# watchdog's connection and the caller's overtake each other). After every step, every guard
# that says held has the server's lease last at least as long as its ``valid_until``.

NET_SECS = float(os.environ.get("RLOCK_PY_OWNER_NET_SECS", "5"))
NET_SEED = int(os.environ.get("RLOCK_PY_OWNER_NET_SEED", str(random.randrange(1 << 30))))
NET_LEASES = [None, None, 0.3, 1.0, 3.0]
NET_RT = 0.3  # the response timeout: the link's slowest round trips pass it


def _guards_covered(r: redis.Redis, holds: list[Any], log: list[str]) -> None:
    for h in holds:
        if h is None or h.done or h.is_lost():
            continue
        pttl, left_ms = _pttl_and_left(r, "k", h.valid_until)
        if pttl < left_ms - TOL_MS and not h.is_lost():
            tail = "\n".join(log[-int(os.environ.get("RLOCK_PY_OWNER_NET_TAIL", "25")) :])
            pytest.fail(
                f"seed {NET_SEED}: a guard valid {left_ms:.0f} ms more, server lease {pttl} ms"
                f"\n{tail}"
            )


def _net_step(rng: random.Random, held: list[bool]) -> tuple[int, str, Optional[float]]:
    """The net's next step: (handle, "release" | "acquire" | "sleep", lease or sleep time)."""
    i = rng.randrange(len(held))
    if held[i] and rng.random() < 0.4:
        return i, "release", None
    if rng.random() < 0.8:
        return i, "acquire", rng.choice(NET_LEASES)
    return i, "sleep", rng.uniform(0, 0.3)


def _net_summary(log: list[str]) -> None:
    steps = sum(not line.startswith((" ", "sleep")) for line in log)
    errors = sum(line.startswith("  ") and "->" not in line for line in log)
    print(f"owner net: {steps} steps, {errors} errors (timeouts, stalls)")


def _net_proxy(server: Server) -> SlowProxy:
    return SlowProxy(server.port, 0.005, 0.25, 0.2)  # a chunk in five: 0.25 s late


def test_an_owners_guards_are_never_promised_more_than_the_server_holds_over_a_slow_link(
    server: Server, r: redis.Redis
) -> None:
    print(f"RLOCK_PY_OWNER_NET_SEED={NET_SEED}")
    rng = random.Random(NET_SEED)
    proxy = _net_proxy(server)
    owner = rl.Owner(redis.Redis(port=proxy.port, socket_timeout=10), response_timeout=NET_RT)
    handles = [owner.lock("k", watchdog_timeout=0.6) for _ in range(3)]
    log: list[str] = []
    end = time.monotonic() + NET_SECS
    try:
        while time.monotonic() < end:
            i, what, arg = _net_step(rng, [lk.owned() for lk in handles])
            lk = handles[i]
            log.append(f"{what} {i} {arg}")
            try:
                if what == "sleep":
                    time.sleep(arg or 0)
                elif what == "release":
                    lk.release()
                else:
                    log.append(f"  -> {lk.acquire(blocking=False, lease=arg)}")
            except (rl.RLockError, redis.RedisError) as e:
                log.append(f"  {type(e).__name__}")
            _guards_covered(r, [h.hold if h.owned() else None for h in handles], log)
    finally:
        _net_summary(log)
        for lk in handles:
            while lk.owned():
                try:
                    lk.release()
                except (rl.RLockError, redis.RedisError):
                    break
        proxy.close()


async def test_an_asyncio_owners_guards_are_never_promised_more_than_the_server_holds_slow_link(
    server: Server, r: redis.Redis
) -> None:
    print(f"RLOCK_PY_OWNER_NET_SEED={NET_SEED}")
    rng = random.Random(NET_SEED)
    proxy = _net_proxy(server)
    slow = aredis.Redis(port=proxy.port, socket_timeout=10)
    owner = ra.Owner(slow, response_timeout=NET_RT)
    handles = [owner.lock("k", watchdog_timeout=0.6) for _ in range(3)]
    log: list[str] = []
    end = time.monotonic() + NET_SECS
    try:
        while time.monotonic() < end:
            i, what, arg = _net_step(rng, [lk.owned() for lk in handles])
            lk = handles[i]
            log.append(f"{what} {i} {arg}")
            try:
                if what == "sleep":
                    await asyncio.sleep(arg or 0)
                elif what == "release":
                    await lk.release()
                else:
                    log.append(f"  -> {await lk.acquire(blocking=False, lease=arg)}")
            except (rl.RLockError, redis.RedisError) as e:
                log.append(f"  {type(e).__name__}")
            _guards_covered(r, [h.hold if h.owned() else None for h in handles], log)
    finally:
        _net_summary(log)
        for lk in handles:
            while lk.owned():
                try:
                    await lk.release()
                except (rl.RLockError, redis.RedisError):
                    break
        await slow.aclose()


# A renewal (here a re-entry's) of a lock or write hold sent just before the guard's deadline,
# its reply "renewed" read after the guard declared itself lost: the server holds the count for
# the renewal's lease. The guard stays lost (the re-entry raises LockLost, its release sends
# nothing), and the lost hold's own idempotent release goes out in the background: the count is
# never held by nobody for the renewal's lease.

KINDS = ["lock", "write", "owner lock", "owner write"]


def _guard(mod: Any, client: Any, kind: str) -> Any:
    if kind.startswith("owner"):
        owner = mod.Owner(client)
        return owner.lock("k") if kind == "owner lock" else owner.rw_lock("k").write
    return mod.Lock(client, "k") if kind == "lock" else mod.RWLock(client, "k").write


@pytest.mark.parametrize("kind", KINDS)
def test_a_renewal_confirmed_after_its_guard_was_lost_leaves_no_count(
    server: Server, kind: str
) -> None:
    proxy = SlowProxy(server.port, 0.15)
    c, r = redis.Redis(port=proxy.port), server.client()
    try:
        guard = _guard(rl, c, kind)
        assert not guard.locked()  # the package's connection opened (a slow handshake)
        assert guard.acquire(blocking=False, lease=0.8)
        h = guard.hold
        time.sleep(max(0.0, h.valid_until - time.monotonic() - 0.05))  # sent just before
        with pytest.raises(rl.LockLost):  # its reply came after the deadline
            guard.acquire(blocking=False, lease=20.0)
        assert h.is_lost()
        poll("the lost hold's count released", 3.0, lambda: r.exists("k") == 0)
    finally:
        c.close()
        r.close()
        proxy.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_an_asyncio_renewal_confirmed_after_its_guard_was_lost_leaves_no_count(
    server: Server, kind: str
) -> None:
    proxy = SlowProxy(server.port, 0.15)
    c, r = aredis.Redis(port=proxy.port), server.client()
    try:
        guard = _guard(ra, c, kind)
        assert not await guard.locked()
        assert await guard.acquire(blocking=False, lease=0.8)
        h = guard.hold
        await asyncio.sleep(max(0.0, h.valid_until - time.monotonic() - 0.05))
        with pytest.raises(rl.LockLost):
            await guard.acquire(blocking=False, lease=20.0)
        assert h.is_lost()
        await apoll("the lost hold's count released", 3.0, lambda: r.exists("k") == 0)
    finally:
        await c.aclose()
        r.close()
        proxy.close()


def test_a_late_renewal_never_releases_a_newer_count_of_the_same_owner(r: redis.Redis) -> None:
    """The release above is exact only when no other count of that kind of the owner can be
    there: with another lock hold of the owner live on the key, a lost hold's late renewal
    releases nothing (its count ends with the key's expiry, never taken from the live one)."""
    owner = rl.Owner(r)
    old, new = owner.lock("k"), owner.lock("k")
    assert old.acquire(blocking=False, lease=20.0)
    assert new.acquire(blocking=False, lease=20.0)
    old.hold.mark_lost()  # as at its deadline, its renewal's "1" still to come
    assert late_renewal(old.hold) == []
    lone = rl.Lock(r, "k2")
    assert lone.acquire(blocking=False, lease=20.0)
    lone.hold.mark_lost()
    assert late_renewal(lone.hold) == [lone.hold], "an owner id of its own: exact"
    assert late_renewal(lone.hold) == [], "claimed once"
    new.release()
    assert r.hget("k", owner.id) == b"1"


# An Owner's re-entry through a second handle, sent just before the first handle's deadline and
# granted (count + 1, the key's expiry now the new lease) with its reply read after the first
# guard declared itself lost: both counts share the owner's one field, so the lost one's release
# is not blind. The acquire reads the owner's count right after the grant (nothing else of the
# owner can change it then) and releases the lost hold's count when it is there: after the new
# hold's release nothing is held by nobody.


def _owner_count(r: redis.Redis, owner: Any, kind: str) -> Optional[bytes]:
    field = owner.id + b":write" if kind == "write" else owner.id
    return r.hget("k", field)  # type: ignore[return-value]


def _handles(mod: Any, client: Any, kind: str) -> tuple[Any, Any, Any]:
    owner = mod.Owner(client)
    if kind == "lock":
        return owner, owner.lock("k"), owner.lock("k")
    return owner, owner.rw_lock("k").write, owner.rw_lock("k").write


@pytest.mark.parametrize("kind", ["lock", "write"])
def test_an_owners_second_handle_granted_after_the_first_was_lost_takes_its_count_back(
    server: Server, kind: str
) -> None:
    proxy = SlowProxy(server.port, 0.15)
    c, r = redis.Redis(port=proxy.port), server.client()
    try:
        owner, first, second = _handles(rl, c, kind)
        assert not first.locked()  # the package's connection opened (a slow handshake)
        assert first.acquire(blocking=False, lease=0.8)
        h = first.hold
        time.sleep(max(0.0, h.valid_until - time.monotonic() - 0.05))  # sent just before
        assert second.acquire(blocking=False, lease=20.0)
        assert h.is_lost()  # its reply came after the first hold's deadline
        with pytest.raises(rl.LockLost):
            first.release()  # lost: it sends nothing
        poll("the lost hold's count released", 3.0, lambda: _owner_count(r, owner, kind) == b"1")
        assert second.owned()
        second.release()
        assert r.exists("k") == 0
    finally:
        c.close()
        r.close()
        proxy.close()


@pytest.mark.parametrize("kind", ["lock", "write"])
async def test_an_asyncio_owners_second_handle_granted_after_the_first_was_lost_takes_its_count(
    server: Server, kind: str
) -> None:
    proxy = SlowProxy(server.port, 0.15)
    c, r = aredis.Redis(port=proxy.port), server.client()
    try:
        owner, first, second = _handles(ra, c, kind)
        assert not await first.locked()
        assert await first.acquire(blocking=False, lease=0.8)
        h = first.hold
        await asyncio.sleep(max(0.0, h.valid_until - time.monotonic() - 0.05))
        assert await second.acquire(blocking=False, lease=20.0)
        assert h.is_lost()
        with pytest.raises(rl.LockLost):
            await first.release()
        await apoll(
            "the lost hold's count released", 3.0, lambda: _owner_count(r, owner, kind) == b"1"
        )
        assert second.owned()
        await second.release()
        assert r.exists("k") == 0
    finally:
        await c.aclose()
        r.close()
        proxy.close()


@pytest.mark.parametrize("kind", ["lock", "write"])
def test_an_owners_grant_on_a_fresh_key_never_releases_its_own_count_for_a_lost_hold(
    r: redis.Redis, kind: str
) -> None:
    """The count read after the grant says whether the lost hold's count is there: a grant made
    after that count expired (a fresh key: count 1) releases nothing."""
    owner, first, second = _handles(rl, r, kind)
    assert first.acquire(blocking=False, lease=SHORT)
    gone = first.hold
    poll("the first hold lost", 3.0, gone.is_lost)
    poll("its count expired", 3.0, lambda: _owner_count(r, owner, kind) is None)
    assert second.acquire(blocking=False, lease=20.0)
    assert rl.flush_all(3.0)  # a release, had one been sent, has reached the server
    assert _owner_count(r, owner, kind) == b"1"
    assert second.owned()
    second.release()
    assert r.exists("k") == 0


async def test_an_asyncio_watchdog_renewal_in_flight_when_its_lost_hold_is_released_is_undone(
    server: Server,
) -> None:
    """A watchdog renewal sent before the deadline, its reply due after it: the caller finds
    the hold lost and releases it (LockLost, nothing sent) while the renewal is in flight. The
    release must not cancel the watchdog task mid-renewal: its late "renewed" sends the lost
    hold's release, long before the renewal's lease would end on its own."""
    d, w = 0.6, 3.0  # one-way delay; watchdog lease (renewed every w / 3 = 1 s)
    proxy = SlowProxy(server.port, d)
    c, r = aredis.Redis(port=proxy.port), server.client()
    try:
        lk = ra.Lock(c, "k", watchdog_timeout=w, response_timeout=8.0)  # a slow handshake
        assert not await lk.locked()
        t0 = time.monotonic()
        assert await lk.acquire(blocking=False)
        h = lk.hold
        # the first renewal goes at ~t0 + 2d + w/3 (before the deadline t0 + w), its reply
        # at ~t0 + 4d + w/3, after it
        await asyncio.sleep(max(0.0, h.valid_until - time.monotonic() + 0.05))
        assert h.is_lost()
        with pytest.raises(rl.LockLost):
            await lk.release()
        # the renewal set the key's lease to w at ~t0 + 3d + w/3 (ends ~t0 + 5.8 s); the late
        # reply's release reaches the server at ~t0 + 5d + w/3 (~4 s)
        end = t0 + 3 * d + w / 3 + w - 0.6
        await apoll(
            "the lost hold's count released", end - time.monotonic(), lambda: r.exists("k") == 0
        )
    finally:
        await c.aclose()
        r.close()
        proxy.close()


# -- a release still on its way when the owner's server hold ends ---------------------------------
# An Owner's holds of one key are one count in one field, which no command tells apart. A
# release whose copies get no answer (a slow link) may reach the server after the owner's hold
# there ended (its lease over) and a new hold of the same owner began (another handle's fresh
# acquire): it would give back the new hold's count, the key deleted under a guard that says
# held (another client could take the lock). So an Owner's acquire of a key waits until every
# release and cancel of its holds there was answered or given up on; the release is sent again
# until answered (past the hold's deadline: no new hold of the owner can start meanwhile).


class _LateRelease:
    """The next ``RLOCK.RELEASE``: reaches the server late (run from the test's own connection
    once the key is gone and has come back, or ``LATE_S`` after it went), and no copy of it is
    answered before that (each one raises as a reply that did not come in time)."""

    LATE_S = 1.0

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.args: Optional[list[Any]] = None
        self.ran = threading.Event()

    def wants(self, args: list[Any]) -> bool:
        if self.args is None and args[0] == "RLOCK.RELEASE":
            self.args = list(args)
            threading.Thread(target=self._late, daemon=True).start()
            return True
        return self.args == list(args) and not self.ran.is_set()

    def _late(self) -> None:
        assert self.args is not None
        poll("the owner's hold there ended", 5.0, lambda: self.r.exists("k") == 0)
        try:
            poll("a new hold", self.LATE_S, lambda: self.r.exists("k") == 1)
        except AssertionError:
            pass  # nothing came back: the release finds nothing
        self.r.execute_command(*self.args)
        self.ran.set()


def _late_release_sync(monkeypatch: pytest.MonkeyPatch, r: redis.Redis) -> _LateRelease:
    from redis_rlock._sync import SyncBackend

    late, real = _LateRelease(r), SyncBackend.call

    def call(self: Any, key: bytes, args: list[Any], *rest: Any) -> Any:
        if late.wants(args):
            raise Stalled("no reply in time")
        return real(self, key, args, *rest)

    monkeypatch.setattr(SyncBackend, "call", call)
    return late


def test_an_owners_release_reaching_the_server_after_its_hold_ended_never_ends_a_new_hold(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = rl.Owner(r)
    first, second = owner.lock("k"), owner.lock("k")
    assert first.acquire(blocking=False, lease=SHORT)
    late = _late_release_sync(monkeypatch, r)
    first.release()  # unanswered while the hold lasts: it goes on in the background
    assert not first.owned()
    poll("the first hold's lease over on the server", 3.0, lambda: r.exists("k") == 0)
    assert second.acquire(timeout=5.0, lease=20.0)
    assert late.ran.wait(5.0), "the late release reached the server"
    _lease_covers(r, "k", second.hold)
    assert r.hget("k", owner.id) == b"1"
    second.release()
    assert r.exists("k") == 0


async def test_an_asyncio_owners_release_reaching_the_server_after_its_hold_ended_is_harmless(
    ar: aredis.Redis, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis_rlock.aio._engine import AsyncBackend

    late, real = _LateRelease(r), AsyncBackend.call

    async def call(self: Any, key: bytes, args: list[Any], *rest: Any) -> Any:
        if late.wants(args):
            raise Stalled("no reply in time")
        return await real(self, key, args, *rest)

    monkeypatch.setattr(AsyncBackend, "call", call)
    owner = ra.Owner(ar)
    first, second = owner.lock("k"), owner.lock("k")
    assert await first.acquire(blocking=False, lease=SHORT)
    await first.release()
    assert not first.owned()
    await apoll("the first hold's lease over on the server", 3.0, lambda: r.exists("k") == 0)
    assert await second.acquire(timeout=5.0, lease=20.0)
    await apoll("the late release reached the server", 5.0, late.ran.is_set)
    _lease_covers(r, "k", second.hold)
    assert r.hget("k", owner.id) == b"1"
    await second.release()
    assert r.exists("k") == 0
