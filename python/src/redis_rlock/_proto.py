"""The module's commands and replies, as plain functions (no I/O): shared by sync and asyncio."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from redis.exceptions import DataError, ResponseError

Arg = Union[bytes, str, int]

#: Kinds of hold: a reentrant lock, a read-write lock's sides, leased and counted permits.
LOCK, READ, WRITE, LEASED, COUNTED = "lock", "read", "write", "leased", "counted"

#: How long the server remembers a counted release once it landed (the record says released;
#: module: CANCELLED_MS). A counted grant's own record lasts until it is released.
REQUEST_RECORD_S = 60.0

#: How long after its first send a counted release (``RSEM.RELEASE key n REQUEST id`` or
#: ``ONCE id``) is sent
#: again: while the server surely still remembers it (a release that landed is remembered
#: 60 s from then, so a resend is never a second give-back), 10 s of margin for one in flight.
COUNTED_RESEND_S = REQUEST_RECORD_S - 10
#: How long one check that a counted give-back reached every replica waits (``WAIT n ms``).
DURABLE_WAIT_MS = 1000
#: How long after its first send a lock's or read-write side's release (``REQUEST id``) is
#: sent again in the background: well inside the 10 s the server remembers the release by its
#: id, so a resend never ends a later hold of the same owner (the lease ends a hold whose
#: release was given up on).
RELEASE_RESEND_S = 6.0
#: How long a cancelled record stays (module: CANCELLED_MS).
CANCELLED_S = 60.0
#: Most permits one leased acquire may ask for (the module refuses more).
MAX_LEASED_PERMITS = 10_000


#: What a lock (or semaphore, latch) name may be: what redis-py sends as a key.
Name = Union[str, bytes, bytearray, memoryview, int, float]


def encoding_of(client: Any) -> tuple[str, str]:
    """``client``'s ``encoding`` and ``encoding_errors`` (its redis-py ``Encoder``'s, which
    encodes its keys and lock tokens); UTF-8, strict, when it has none."""
    sources: tuple[Any, ...] = (client, getattr(client, "connection_pool", None))
    for source in sources:
        try:
            enc = source.get_encoder()
            return str(enc.encoding), str(enc.encoding_errors)
        except Exception:
            continue
    return "utf-8", "strict"


def encode(value: Any, client: Any, what: str) -> bytes:
    """``value`` as redis-py's ``Encoder`` sends it: bytes-like as they are, int and float
    as their ``repr``, str in ``client``'s encoding. A bool, None or any other type is
    refused at once with redis-py's ``DataError``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(
            f"Invalid {what} of type: {type(value).__name__!r}. "
            "Convert to a bytes, string, int or float first."
        )
    if isinstance(value, (int, float)):
        return repr(value).encode()
    return value.encode(*encoding_of(client))


def name_bytes(name: Any, client: Any = None) -> bytes:
    """A lock (semaphore, latch) name as the bytes sent: as redis-py encodes a key."""
    return encode(name, client, "lock name")


def new_id() -> bytes:
    """A fresh request id: 16 random bytes, hex."""
    return uuid.uuid4().hex.encode()


#: The shortest lease taken, in seconds: one millisecond, the server's unit. A shorter one was
#: silently sent as 1 ms (or, with redis-py's own ``Lock``, as 0: refused by the server).
MIN_LEASE_S = 0.001

#: The shortest watchdog lease, in seconds. The watchdog renews a hold every third of it: at
#: 100 ms that is at most 30 renewals a second per hold, each with at least 66 ms to be
#: answered before the lease ends. Shorter, the watchdog turns into a busy loop of renewals
#: (2 ms: ~1,200 a second) and a hold is lost at the first hiccup; a hold that must end within
#: milliseconds of its holder's death takes a ``lease`` (or a session hold) instead.
MIN_WATCHDOG_S = 0.1


def to_ms(seconds: float, what: str) -> int:
    """A lease in seconds (float) as whole milliseconds, rounded up; refuses at once what
    cannot be held or what the server would refuse: zero, negative, NaN, below one millisecond
    (:data:`MIN_LEASE_S`), too large. (A lease shorter than the round trip may still be over
    when the acquire returns: its holder's ``owned()`` / ``valid_until`` say so, as a
    redis-py ``Lock(timeout=...)`` or a Redisson ``leaseTime`` that short.)"""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r}")
    if seconds < MIN_LEASE_S:
        raise ValueError(
            f"{what} must be at least {MIN_LEASE_S:g} s (one millisecond, the server's unit), "
            f"got {seconds!r}"
        )
    ms = math.ceil(seconds * 1000)
    if ms > 2**53:
        raise ValueError(f"{what} is too large: {seconds!r}")
    return max(1, ms)


def watchdog_ms(seconds: float) -> int:
    """A ``watchdog_timeout`` as whole milliseconds: a lease (:func:`to_ms`) of at least
    :data:`MIN_WATCHDOG_S`, refused at once otherwise."""
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if number and 0 < seconds < MIN_WATCHDOG_S:
        raise ValueError(
            f"watchdog_timeout must be at least {MIN_WATCHDOG_S:g} s (renewed every third of "
            f"it; for a shorter hold take a lease), got {seconds!r}"
        )
    return to_ms(seconds, "watchdog_timeout")


#: The longest response timeout (and session keepalive) accepted, in seconds: one day.
MAX_PERIOD_S = 86400.0


def check_period(seconds: float, what: str) -> float:
    """A response timeout or keepalive period: a positive, finite number of seconds, at most
    a day; refused at once (zero would wait forever for a reply, a negative, NaN or infinite
    one fail later with raw socket errors, a huge one kills the thread that sleeps on it)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_PERIOD_S:
        raise ValueError(
            f"{what} must be a positive number of seconds, at most {MAX_PERIOD_S:g}, "
            f"got {seconds!r}"
        )
    return float(seconds)


def check_permits(permits: int, leased: bool) -> int:
    """Validates a permit count (a positive int; at most 10,000 for leased permits)."""
    if isinstance(permits, bool) or not isinstance(permits, int) or permits <= 0:
        raise ValueError(f"permits must be a positive integer, got {permits!r}")
    if leased and permits > MAX_LEASED_PERMITS:
        raise ValueError(f"at most {MAX_LEASED_PERMITS} leased permits per acquire")
    if permits >= 2**63:
        raise ValueError("permits must fit in a signed 64-bit integer")
    return permits


#: How many ``MOVED``/``ASK`` redirections one call follows (a slot moving while it runs).
MAX_REDIRECTS = 5


def check_latch_count(n: int, what: str) -> int:
    """Validates a latch count or count-down amount: an int from 1 to 2**63 - 1 (the module's
    range), refused before anything is sent."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{what} must be an integer, not {type(n).__name__}")
    if n <= 0:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    if n >= 2**63:
        raise ValueError(f"{what} must fit in a signed 64-bit integer")
    return n


def latch_budget(timeout: Optional[float]) -> Optional[float]:
    """``threading.Event.wait``'s ``timeout`` as a wait in seconds: None (or +inf) no limit,
    0.0 a look without waiting; negative, NaN or beyond the server's range refused."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be a number of seconds or None")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
    if math.isinf(timeout):
        return None
    if timeout * 1000 > 2**53:
        raise ValueError(f"timeout is too large: {timeout!r}")
    return float(timeout)


#: The longest one server-side latch wait lasts, in seconds: a longer (or unlimited) wait is
#: sent again as each slice ends, so a connection that died without a word (a host gone, a cut
#: network) is noticed by the slice's response timeout, not after hours of TCP keepalive.
LATCH_SLICE = 30.0


def latch_await(key: bytes, end: Optional[float], now: float) -> tuple[list[Arg], float]:
    """``RLATCH.AWAIT key ms`` for a wait ending at ``end`` (monotonic; None: no limit) seen
    at ``now`` (before ``end``), at most :data:`LATCH_SLICE` of it, and how long its reply may
    take beyond the response timeout."""
    if end is None or end - now > LATCH_SLICE:
        ms = math.ceil(LATCH_SLICE * 1000)
    else:
        ms = max(1, math.ceil((end - now) * 1000))
    return ["RLATCH.AWAIT", key, ms], ms / 1000.0


def wait_budget(blocking: bool, timeout: float) -> Optional[float]:
    """threading.Lock's (blocking, timeout) as a wait in seconds: 0.0 one try, None no limit."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be a number of seconds")
    if math.isnan(timeout):
        raise ValueError("timeout must not be NaN")
    if not blocking:
        if timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return 0.0
    if timeout == -1 or (math.isinf(timeout) and timeout > 0):
        return None
    if timeout < 0:
        raise ValueError("timeout value must be a non-negative number (or -1)")
    if timeout * 1000 > MAX_WAIT_MS:
        # as threading.Lock.acquire refuses a timeout beyond what it can wait
        raise OverflowError(f"timeout value is too large: {timeout!r} (use -1 for no limit)")
    return float(timeout)


#: The longest timed wait sent, in milliseconds (2**53: about 285,000 years; the server's
#: own limit is 2**63 - 1).
MAX_WAIT_MS = 2**53


def check_delta(delta: int) -> int:
    """Validates a permit delta for ``add_permits``: an int in the module's signed 64-bit
    range, refused before anything is sent."""
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise TypeError("delta must be an integer")
    if not -(2**63) <= delta < 2**63:
        raise ValueError(f"delta must fit in a signed 64-bit integer, got {delta!r}")
    return delta


@dataclass(frozen=True)
class Spec:
    """What one acquire asks for: kind, key, owner (locks), permits, lease, token."""

    kind: str
    key: bytes
    owner: bytes = b""
    permits: int = 1
    lease_ms: int = 0
    token: bool = False
    #: a session's acquire: ``SESSION`` (and ``LOCKDELAY lock_delay_ms`` when above 0)
    session: bool = False
    lock_delay_ms: int = 0
    #: counted permits the caller gives back ownerless (``Semaphore.release(n)``, ``ONCE id``):
    #: ``OWNERLESS``, so the request's record lasts 60 s, not until a release names it
    ownerless: bool = False
    #: an owner's holds of this key (``_peers.Peers``; None: a hold of its own): the lease sent
    #: is never shorter than what any live one of them was promised
    peers: Any = field(default=None, compare=False, repr=False)
    #: a read acquire of a plain read-write lock under the write hold of the same thread or
    #: task (its owner): a weak reference to that write hold (``_hold.keep_kin``)
    under: Any = field(default=None, compare=False, repr=False)

    @property
    def gt(self) -> bool:
        """Whether its acquire and renewals carry ``GT`` (locks and read-write sides: the lease
        only grows while the owner holds; leased permits' renewals have none)."""
        return self.kind in (LOCK, READ, WRITE)

    def sent_lease_ms(self, now: Optional[float] = None) -> int:
        """The lease an acquire sends: the hold's own, or longer when another live hold of the
        owner on this key was promised more (the server's lease is one for all of them)."""
        if self.peers is None:
            return self.lease_ms
        now = time.monotonic() if now is None else now
        lease = max(self.lease_ms, int(self.peers.floor_ms(self.key, now)))
        self.peers.sending(self.key, now, lease)
        return lease

    def acquire(self, rid: bytes, wait_ms: Optional[int]) -> list[Arg]:
        """The acquire command; ``wait_ms`` None: no WAIT (one try), 0: WAIT without limit."""
        if self.kind in (LOCK, READ, WRITE):
            now = time.monotonic()
            lease = self.sent_lease_ms(now)
            if self.peers is not None:
                self.peers.sent(self.key, rid, now + lease / 1000.0)
        if self.kind == LOCK:
            args: list[Arg] = ["RLOCK.ACQUIRE", self.key, self.owner, lease]
        elif self.kind in (READ, WRITE):
            mode = "READ" if self.kind == READ else "WRITE"
            args = ["RWLOCK.ACQUIRE", self.key, self.owner, mode, lease]
        elif self.kind == LEASED:
            args = ["RSEM.ACQUIRE", self.key, self.permits, "LEASE", self.lease_ms]
        else:
            args = ["RSEM.ACQUIRE", self.key, self.permits]
        if wait_ms is not None:
            args += ["WAIT", wait_ms]
        if self.token and self.kind in (LOCK, WRITE):
            args.append("TOKEN")
        args += ["REQUEST", rid]
        if self.ownerless and self.kind == COUNTED:
            args.append("OWNERLESS")
        if self.session:
            args.append("SESSION")
            if self.lock_delay_ms:
                args += ["LOCKDELAY", self.lock_delay_ms]
        if self.gt:
            args.append("GT")  # a re-entry (an Owner's) never shortens the lease: see ``renew``
        return args

    def granted(self, reply: Any) -> tuple[bool, Optional[int], Optional[list[bytes]], bool]:
        """(granted, token, permit ids, retry at once) from an acquire's reply."""
        if self.kind == COUNTED:
            return reply == 1, None, None, False
        if self.kind == LEASED:
            if reply is None:
                return False, None, None, False
            return True, None, [bytes(x) for x in reply], False
        if self.token and self.kind in (LOCK, WRITE):
            ok = int(reply[0]) == 1
            return ok, int(reply[1]) if ok else None, None, (not ok and int(reply[1]) == 0)
        if reply is None:
            return True, None, None, False
        return False, None, None, int(reply) == 0

    def renew(self, lease_ms: int, ids: Optional[list[bytes]]) -> list[list[Arg]]:
        """The renewal command(s) of a hold (leased permits: one per id). A lock's or a side's
        carries ``GT``: the lease ends at the later of its current end and now + ``lease_ms``,
        so a renewal (or re-entry) the client gave up on and the server ran late never ends
        the owner's hold before what a later one confirmed (``_ledger``)."""
        if self.kind == LOCK:
            return [["RLOCK.RENEW", self.key, self.owner, lease_ms, "GT"]]
        if self.kind in (READ, WRITE):
            mode = "READ" if self.kind == READ else "WRITE"
            return [["RWLOCK.RENEW", self.key, self.owner, lease_ms, mode, "GT"]]
        return [["RSEM.RENEW", self.key, pid, lease_ms] for pid in ids or []]

    def release(self, rid: bytes, ids: Optional[list[bytes]]) -> list[Arg]:
        """The release command of a hold (``rid``: the release's own request id)."""
        if self.kind == LOCK:
            return ["RLOCK.RELEASE", self.key, self.owner, "REQUEST", rid]
        if self.kind in (READ, WRITE):
            mode = "READ" if self.kind == READ else "WRITE"
            return ["RWLOCK.RELEASE", self.key, self.owner, mode, "REQUEST", rid]
        if self.kind == LEASED:
            return ["RSEM.RELEASE", self.key, "ID", *(ids or [])]
        return ["RSEM.RELEASE", self.key, self.permits]

    def released(self, reply: Any, ids: Optional[list[bytes]]) -> bool:
        """Whether a release's reply says this hold was given back (False: not held)."""
        if self.kind == LEASED:
            return reply is not None and int(reply) == len(set(ids or []))
        if self.kind == COUNTED:
            return True
        return reply is not None


def counted_release(key: bytes, permits: int) -> list[Arg]:
    """An ownerless release of ``permits`` counted permits under an id of its own
    (``RSEM.RELEASE key n ONCE id``): the server gives them back once for that id, so the
    same command sent again (a lost reply, a dropped connection) gives back nothing more.
    (``REQUEST id`` names an acquire's grant, and gives nothing where there is none.)"""
    return ["RSEM.RELEASE", key, permits, "ONCE", new_id()]


def replicas_of(info: Any) -> Optional[int]:
    """The replicas a master has (``connected_slaves`` of ``INFO replication``); None when the
    server that answered is not a master (a demoted one: a give-back there is not known)."""
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    fields = dict(
        line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#")
    )
    if fields.get("role", "").strip() != "master":
        return None
    return int(fields.get("connected_slaves", "0").strip() or 0)


def cancel_args(key: bytes, rid: bytes) -> list[Arg]:
    """``RLOCK.CANCEL key id``."""
    return ["RLOCK.CANCEL", key, rid]


def is_retriable_reply(err: ResponseError) -> bool:
    """Error replies after which the same idempotent command is worth sending again."""
    msg = str(err)
    return msg.startswith(
        ("LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "MASTERDOWN")
    ) or is_waiting_reply(err)


def _request_reply(err: ResponseError, ending: str) -> bool:
    """Whether ``err`` is the module's ``ERR request <id> <ending>`` (redis-py strips the
    ``ERR `` of an error reply: both spellings are matched)."""
    msg = str(err)
    msg = msg[4:] if msg.startswith("ERR ") else msg
    return msg.startswith("request ") and msg.endswith(ending)


def is_waiting_reply(err: ResponseError) -> bool:
    """``ERR request <id> is already waiting``: the request still waits in the server (a wait
    sent again before the server saw its old connection go)."""
    return _request_reply(err, " is already waiting")


def is_noreplicas(err: ResponseError) -> bool:
    """``NOREPLICAS ...``: this master grants nothing now (too few replicas in sync); the same
    acquire may be sent again (on the current master)."""
    return str(err).startswith("NOREPLICAS")


def is_cancelled_reply(err: ResponseError) -> bool:
    """``ERR request <id> was cancelled``: the request holds nothing and never will."""
    return _request_reply(err, " was cancelled")


def is_unblocked(err: ResponseError) -> bool:
    """``UNBLOCKED ...``: the server ended a blocked command without answering it (a master
    turned replica at a failover, ``CLIENT UNBLOCK ... ERROR``); a latch wait is sent again."""
    return str(err).startswith("UNBLOCKED")


def info_map(reply: Any) -> Optional[dict[bytes, Any]]:
    """An ``*.INFO`` reply (RESP3 map or RESP2 flat array) as a dict, None when absent."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        return {bytes(k) if not isinstance(k, str) else k.encode(): v for k, v in reply.items()}
    it = iter(reply)
    return {bytes(k) if not isinstance(k, str) else k.encode(): v for k, v in zip(it, it)}


def resend_end(kind: str, first: float, end: float) -> float:
    """Until when a hold's release first sent at ``first`` may be sent (again), given ``end``
    (its lease, or the caller's bound): a lock's or side's at most ``RELEASE_RESEND_S`` after
    ``first``; counted and leased permits' releases are idempotent for longer."""
    return end if kind in (COUNTED, LEASED) else min(end, first + RELEASE_RESEND_S)
