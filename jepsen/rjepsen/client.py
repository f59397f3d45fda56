"""One client process of a run: a workload loop against whichever server is master now,
recording every operation on the host's one monotonic clock.

Run as ``python -m rjepsen.client <spec-json>`` inside a client host's namespace. The spec names
the workload, the key, the client id, how to find the master (Sentinels, or cluster seeds), the
log path and the end time (``time.monotonic()``: the same clock in every namespace of this
host). Every line of the log is one JSON event:

- ``grant``: the client believes it holds ``n`` of ``key`` from ``t1`` (the reply) until
  ``min(t0 + lease, the release it sends)``; ``t0`` is when the acquire was sent, so the
  belief never outlasts the server's lease, wherever the server started it.
- ``release``: ``h`` (the grant's id) is given up at ``t0``.
- ``fail``: an operation answered with an error (``err``: its kind) or not granted.
- ``unknown`` / ``resolve``: an acquire whose reply was lost, and what resolving its
  ``REQUEST`` id later said about it.
- ``latch_*``: the count-down latch's set, count-downs and awaits.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

now = time.monotonic
# redis-py 6+ re-sends a command after a timeout by default; a lost reply must be seen as one
NO_RETRY = Retry(NoBackoff(), 0)


def error_kind(exc: BaseException) -> str:
    """A short, stable name for an error: the reply's code (``NOREPLICAS``), or ``ERR`` and its
    message with request ids left out; ``timeout``/``connection`` for a lost reply."""
    if isinstance(exc, redis.TimeoutError):
        return "timeout"
    # redis-py strips these codes from the message: name them by their class
    for cls, code in CODED:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, (redis.ConnectionError, OSError)):
        return "connection"
    if isinstance(exc, redis.ResponseError):
        msg = str(exc)
        word = msg.split(" ", 1)[0]
        if word.isupper() and word != "ERR":
            return word
        msg = re.sub(r"request \S+", "request <id>", msg.removeprefix("ERR ")).split(":")[0]
        return "ERR " + msg[:60]
    return type(exc).__name__


CODED: list[tuple[type[Exception], str]] = [
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.ClusterCrossSlotError, "CROSSSLOT"),
]


#: refusals that say "not here, not now" (no master, a stale one, replicas missing): a give-back
#: refused so is sent again
RETRIED = frozenset(
    {
        "NOREPLICAS",
        "READONLY",
        "LOADING",
        "no_master",
        "no_cluster",
        "connection_refused",
        "CLUSTERDOWN",
        "MOVED",
        "ASK",
        "TRYAGAIN",
        "MASTERDOWN",
    }
)


class Uncertain(Exception):
    """The command may or may not have run (its reply was lost)."""


class Refused(Exception):
    """The server answered with an error: the command changed nothing."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass
class Master:
    """A connection to whichever server is master, as Sentinel-following clients do: the
    Sentinels are asked again at least once a second and after every error. With
    ``cluster_seeds``, a ``RedisCluster`` (slot map from the seeds, ``MOVED``/``ASK``
    followed, nothing re-sent after a lost reply); ``key`` is the workload's key, whose
    master answers the keyless commands (``WAIT``, ``INFO``)."""

    sentinels: list[tuple[str, int]]
    cluster_seeds: list[tuple[str, int]]
    timeout: float
    key: str = ""
    _conn: Any = None
    _addr: tuple[str, int] | None = None
    _asked: float = 0.0
    #: when the connection to the master was last closed (a session's holds end with it)
    dropped_at: float = 0.0
    _cluster: RedisCluster | None = None

    def _discover(self) -> tuple[str, int] | None:
        for host, port in random.sample(self.sentinels, len(self.sentinels)):
            try:
                s = redis.Redis(
                    host=host,
                    port=port,
                    socket_timeout=0.3,
                    socket_connect_timeout=0.3,
                    retry=NO_RETRY,
                )
                try:
                    addr: Any = s.sentinel_get_master_addr_by_name("mymaster")
                finally:
                    s.close()
                if addr:
                    return (
                        addr[0].decode() if isinstance(addr[0], bytes) else addr[0],
                        int(addr[1]),
                    )
            except (redis.RedisError, OSError):
                continue
        return None

    def conn(self) -> Any:
        if self.cluster_seeds:
            if self._cluster is None:
                try:
                    self._cluster = RedisCluster(
                        startup_nodes=[
                            ClusterNode(h, p)  # type: ignore[no-untyped-call]
                            for h, p in self.cluster_seeds
                        ],
                        socket_timeout=self.timeout,
                        socket_connect_timeout=0.5,
                        retry=NO_RETRY,
                    )
                except (redis.RedisError, RedisClusterException, OSError) as exc:
                    # no node gave a slot map: nothing was sent
                    raise Refused("no_cluster") from exc
            return self._cluster
        if self._conn is None or now() - self._asked > 1.0:
            self._asked = now()
            addr = self._discover()
            if addr is None and self._conn is None:
                raise Refused("no_master")
            if addr is not None and (addr != self._addr or self._conn is None):
                self.drop()
                self._addr = addr
                self._conn = redis.Redis(
                    host=addr[0],
                    port=addr[1],
                    socket_timeout=self.timeout,
                    socket_connect_timeout=0.5,
                    retry=NO_RETRY,
                )
        return self._conn

    def drop(self, cluster_too: bool = False) -> None:
        """Forgets the connection to the master (the next call asks the Sentinels again). A
        cluster client is kept unless ``cluster_too``: it re-reads the slot map itself after a
        connection error or a ``MOVED``, and building a new one needs the first master of its
        slot map up (it sends ``COMMAND`` there), which a killed master is not."""
        if self._conn is not None:
            self.dropped_at = now()
            try:
                self._conn.close()
            except Exception:
                pass
        self._conn = None
        self._asked = 0.0
        if self._cluster is not None and cluster_too:
            try:
                self._cluster.close()
            except Exception:
                pass
            self._cluster = None

    def where(self) -> str | None:
        """The server the next :meth:`call_here` would reach: the master's address, or the
        cluster node serving the key (``None``: no connection)."""
        if self._cluster is not None:
            try:
                return str(self._cluster.get_node_from_key(self.key).name)  # type: ignore[no-untyped-call]
            except (redis.RedisError, RedisClusterException):
                return None
        return f"{self._addr}" if self._conn is not None else None

    def call_here(self, *args: Any) -> Any:
        """One command on the server that answered the last one (no asking the Sentinels
        again): ``None`` when there is no connection, or it fails."""
        conn = self._cluster or self._conn
        if conn is None:
            return None
        try:
            return conn.execute_command(*args)
        except (redis.RedisError, RedisClusterException, OSError):
            self.drop()
            return None

    def call(self, *args: Any) -> Any:
        """One command. A reply lost raises :class:`Uncertain` (the connection is dropped, so
        the next call asks the Sentinels again); an error reply raises :class:`Refused`."""
        conn: Any = self.conn()
        kw: dict[str, Any] = {}
        try:
            if self.cluster_seeds and str(args[0]).upper() in ("WAIT", "INFO"):
                # keyless: RedisCluster would send it to its default node, not to the master
                # the workload's writes went to (whose replicas it must count)
                kw["target_nodes"] = conn.get_node_from_key(self.key)
            return conn.execute_command(*args, **kw)
        except redis.ResponseError as exc:
            kind = error_kind(exc)
            if kind in (
                "READONLY",
                "MOVED",
                "ASK",
                "CLUSTERDOWN",
                "TRYAGAIN",
                "LOADING",
                "MASTERDOWN",
            ):
                self.drop()
            raise Refused(kind) from exc
        except (redis.RedisError, OSError) as exc:
            self.drop()
            kind = error_kind(exc)
            if isinstance(exc, redis.ConnectionError) and "Connection refused" in str(exc):
                raise Refused("connection_refused") from exc
            raise Uncertain(kind) from exc
        except RedisClusterException as exc:
            # not a RedisError: no slot map, a slot not covered, redirections exhausted, or a
            # new slot map that failed after a lost reply (so: maybe sent)
            self.drop(cluster_too=True)
            raise Uncertain(type(exc).__name__) from exc


@dataclass
class Ctx:
    spec: dict[str, Any]
    master: Master
    out: Any
    rng: random.Random
    cid: str
    key: str
    end: float
    _next: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    giver: Giver | None = None

    def log(self, ev: str, **kw: Any) -> None:
        kw.update(ev=ev, c=self.cid, k=self.key, w=self.spec["workload"])
        with self._lock:
            self.out.write(json.dumps(kw) + "\n")
            self.out.flush()

    def hold_id(self) -> str:
        self._next += 1
        return f"{self.cid}#{self._next}"

    def req(self) -> str:
        return uuid.uuid4().hex

    def running(self) -> bool:
        return now() < self.end

    def nap(self, lo: float, hi: float) -> None:
        time.sleep(self.rng.uniform(lo, hi))

    def until_answered(self, *args: Any) -> tuple[Any, float, float]:
        """Sends a command (an idempotent one: a cancel, a release by id) until some server
        answers it, for up to 30 s past the run's end. Returns (reply or error kind, t0, t1)."""
        give_up = self.end + 30
        while True:
            t0 = now()
            try:
                return self.master.call(*args), t0, now()
            except Refused as exc:
                if exc.kind not in RETRIED:
                    return "error:" + exc.kind, t0, now()
            except Uncertain:
                pass
            if now() > give_up:
                return "gave_up", t0, now()
            time.sleep(0.1)


def durable(ctx: Ctx, *args: Any) -> tuple[Any, float, float]:
    """An idempotent give-back (a release or a cancel by request id, a release of leased
    permits by id), sent until a master answers it AND every replica acknowledges it (``WAIT``).
    A give-back that a master answered and then lost with its role (it was cut off, or resumed
    from a stall already replaced) would be lost: counted permits for good (they have no
    lease), and a lock's count would stay with its owner, whose next acquire is then a
    re-entry that keeps it alive (a lock held by nobody for as long as the owner comes back).
    Sent again to whichever master is current, the request id makes it exact: the new
    master's record still says granted (given back now) or already released (nothing more)."""
    want = int(ctx.spec.get("replicas", 0))
    give_up = ctx.end + 30
    while True:
        r, t0, t1 = ctx.until_answered(*args)
        if isinstance(r, str) and (r.startswith("error:") or r == "gave_up"):
            return r, t0, t1
        try:
            if want == 0 or int(ctx.master.call("WAIT", want, 1000)) >= want:
                return r, t0, t1
        except (Refused, Uncertain):
            pass
        if now() > give_up:
            return "gave_up", t0, t1
        time.sleep(0.1)


class Giver:
    """The client's give-backs made durable in the background, on a connection of their own:
    a give-back the current master did not answer, or answered without its replicas'
    acknowledgement (the master is cut off, or stalled), is sent on with :func:`durable` while
    the workload goes on asking, as a client with several holders would. Every give-back
    names what it ends (a request id, a hold's own owner, a permit id), so a late one cannot
    end a later hold."""

    def __init__(self, ctx: Ctx) -> None:
        m = ctx.master
        self.ctx = Ctx(
            ctx.spec,
            Master(m.sentinels, m.cluster_seeds, m.timeout, m.key),
            ctx.out,
            random.Random(),
            ctx.cid,
            ctx.key,
            ctx.end,
            _lock=ctx._lock,
        )
        self.todo: queue.Queue[tuple[tuple[Any, ...], str | None, float] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, args: tuple[Any, ...], h: str | None, t0: float) -> None:
        self.todo.put((args, h, t0))

    def _run(self) -> None:
        while (item := self.todo.get()) is not None:
            args, h, t0 = item
            r, _, t1 = durable(self.ctx, *args)
            if h is not None and isinstance(r, str) and (r.startswith("error:") or r == "gave_up"):
                self.ctx.log("release_failed", t0=t0, t1=t1, h=h, err=r)
            self.todo.task_done()

    def close(self) -> None:
        """Waits (bounded: :func:`durable` gives up 30 s after the run's end) for every
        give-back handed over."""
        self.todo.put(None)
        self.thread.join(timeout=max(0.0, self.ctx.end + 36 - now()))


def give_back(ctx: Ctx, *args: Any, h: str | None = None) -> None:
    """A release sent once here (so the next holder need not wait for the lease); when its
    reply or the replicas' acknowledgement is missing, handed to the background
    :class:`Giver` to be made :func:`durable`. Give-backs need no order among themselves: each
    names the one hold or grant it ends."""
    t0 = now()
    try:
        ctx.master.call(*args)
        if acknowledged(ctx):
            return
    except Refused as exc:
        if exc.kind not in RETRIED:
            if h is not None:
                ctx.log("release_failed", t0=t0, t1=now(), h=h, err="error:" + exc.kind)
            return
    except Uncertain:
        pass
    in_background(ctx, args, h, t0)


def cancel(ctx: Ctx, req: str) -> tuple[Any, float, float]:
    """``RLOCK.CANCEL`` of request ``req``, sent here until a master answers it (its reply says
    what it undid), then made :func:`durable` in the background when the replicas did not
    acknowledge it. Returns (reply or error kind, t0, t1) as :meth:`Ctx.until_answered`."""
    args = ("RLOCK.CANCEL", ctx.key, req)
    r, t0, t1 = ctx.until_answered(*args)
    if isinstance(r, str) and (r.startswith("error:") or r == "gave_up"):
        return r, t0, t1
    try:
        if acknowledged(ctx):
            return r, t0, t1
    except (Refused, Uncertain):
        pass
    in_background(ctx, args, None, t0)
    return r, t0, t1


def acknowledged(ctx: Ctx) -> bool:
    """Whether every replica acknowledged what this client wrote last (``WAIT``, 100 ms)."""
    want = int(ctx.spec.get("replicas", 0))
    return want == 0 or int(ctx.master.call("WAIT", want, 100)) >= want


def in_background(ctx: Ctx, args: tuple[Any, ...], h: str | None, t0: float) -> None:
    if ctx.giver is None:
        ctx.giver = Giver(ctx)
    ctx.giver.put(args, h, t0)


# --- rlock workloads --------------------------------------------------------------------

LEASE = 3000
WAIT = 1000


def token_of(reply: Any) -> int | None:
    if isinstance(reply, list) and reply and int(reply[0]) == 1:
        return int(reply[1])
    return None


def acquire_once(
    ctx: Ctx,
    build: Callable[[str], list[Any]],
    granted: Callable[[Any], bool],
    token: Callable[[Any], int | None],
    release: Callable[[Any, str], list[Any]],
    n: int = 1,
    hold: tuple[float, float] = (0.0, 0.05),
    lease: int = LEASE,
    after_grant: Callable[[Any], bool] | None = None,
    during: Callable[[Any, str], None] | None = None,
    **tags: Any,
) -> None:
    """Acquire with a fresh REQUEST id (waiting in the server), hold, release. A lost reply is
    resolved with ``RLOCK.CANCEL`` until some master answers it, so the client never believes
    it holds what it does not, and never leaves its grant behind. Every give-back is made
    :func:`durable`, in the background when the master does not answer it with its replicas,
    so the client goes on asking: a :func:`cancel` (answered here first), a release
    (:func:`give_back`)."""
    req = ctx.req()
    t0 = now()
    try:
        reply = ctx.master.call(*build(req))
    except Refused as exc:
        ctx.log("fail", t0=t0, t1=now(), err=exc.kind)
        time.sleep(0.05)
        return
    except Uncertain as exc:
        ctx.log("unknown", t0=t0, t1=now(), err=str(exc), req=req)
        r, c0, c1 = cancel(ctx, req)
        ctx.log("resolve", t0=c0, t1=c1, req=req, how="cancel", reply=str(r))
        return
    t1 = now()
    if not granted(reply):
        ctx.log("fail", t0=t0, t1=t1, err="busy")
        return
    try:
        acked = after_grant is None or after_grant(reply)
    except (Refused, Uncertain):
        acked = False
    if not acked:
        # not acknowledged by the replicas: rolled back, believed by nobody
        r, _, _ = cancel(ctx, req)
        ctx.log("fail", t0=t0, t1=now(), err="not_acknowledged", undo=str(r))
        return
    h = ctx.hold_id()
    ctx.log("grant", t0=t0, t1=t1, lease=lease, token=token(reply), n=n, h=h, req=req, **tags)
    if during is not None:
        during(reply, req)
    ctx.nap(*hold)
    end = now()
    if tags.get("session") and ctx.master.dropped_at > t1:
        # the client closed the connection its session hold is bound to: the hold ended then
        # (a drop before t1 came before the acquire was sent: the hold is bound to the new one)
        end = min(end, ctx.master.dropped_at)
    ctx.log("release", t0=end, h=h)
    # releases by request id or permit id are idempotent: sent until some master answers, as
    # rlock's clients do, so a release cut off with an old master reaches the new one
    give_back(ctx, *release(reply, req), h=h)


def acquire_loop(ctx: Ctx, *args: Any, **kw: Any) -> None:
    while ctx.running():
        acquire_once(ctx, *args, **kw)


def owner(ctx: Ctx, req: str = "1") -> str:
    """The owner id of the hold acquired with request ``req``: one per hold, so a give-back
    still being sent in the background (it names the owner) can never end a later hold of
    the same client."""
    return f"{ctx.spec['run']}-{ctx.cid}:{req}"


def w_lock(ctx: Ctx, session: bool = False, ack: int = 0) -> None:
    lease = 10000 if ack else LEASE
    hold = (0.0, 1.0) if ack else ((0.0, 0.3) if session else (0.0, 0.05))

    def build(req: str) -> list[Any]:
        cmd: list[Any] = [
            "RLOCK.ACQUIRE",
            ctx.key,
            owner(ctx, req),
            lease,
            "WAIT",
            WAIT,
            "TOKEN",
            "REQUEST",
            req,
            "GT",
        ]
        return cmd + (["SESSION"] if session else [])

    tags = {"session": True} if session else {}

    def acked(_reply: Any) -> bool:
        return int(ctx.master.call("WAIT", ack, 1000)) >= ack

    def reenter(outer: Any, outer_req: str) -> None:
        """Sometimes re-enters the lock it holds (the count goes to 2 and back): granted
        at once (a new, larger token), as the holder still holds it."""
        if ctx.rng.random() > 0.3:
            return
        own = owner(ctx, outer_req)
        req = ctx.req()
        t0 = now()
        try:
            reply = ctx.master.call(
                "RLOCK.ACQUIRE", ctx.key, own, lease, "TOKEN", "REQUEST", req, "GT"
            )
        except Refused as exc:
            ctx.log("reenter", t0=t0, t1=now(), err=exc.kind)
            return
        except Uncertain as exc:
            ctx.log("reenter", t0=t0, t1=now(), err=exc.kind if hasattr(exc, "kind") else str(exc))
            cancel(ctx, req)
            return
        ctx.log("reenter", t0=t0, t1=now(), token=token_of(reply), outer=token_of(outer))
        if token_of(reply) is not None:
            ctx.nap(0.0, 0.01)
            give_back(ctx, "RLOCK.RELEASE", ctx.key, own, "REQUEST", req)

    acquire_loop(
        ctx,
        build,
        lambda r: token_of(r) is not None,
        token_of,
        lambda _r, req: ["RLOCK.RELEASE", ctx.key, owner(ctx, req), "REQUEST", req],
        hold=hold,
        lease=lease,
        after_grant=acked if ack else None,
        during=reenter,
        **tags,
    )


def w_rwlock(ctx: Ctx) -> None:
    while ctx.running():
        rw_once(ctx, "WRITE" if ctx.rng.random() < 0.4 else "READ")


def rw_once(ctx: Ctx, side: str) -> None:
    write = side == "WRITE"
    acquire_once(
        ctx,
        lambda req: (
            [
                *("RWLOCK.ACQUIRE", ctx.key, owner(ctx, req), side, LEASE),
                *("WAIT", WAIT, "REQUEST", req, "GT"),
            ]
            + (["TOKEN"] if write else [])
        ),
        lambda r: token_of(r) is not None if write else r is None,
        lambda r: token_of(r) if write else None,
        lambda _r, req: ["RWLOCK.RELEASE", ctx.key, owner(ctx, req), side, "REQUEST", req],
        side=side,
    )


def w_sem(ctx: Ctx) -> None:
    acquire_loop(
        ctx,
        lambda req: ["RSEM.ACQUIRE", ctx.key, 1, "WAIT", WAIT, "REQUEST", req],
        lambda r: r == 1,
        lambda _r: None,
        lambda _r, req: ["RSEM.RELEASE", ctx.key, 1, "REQUEST", req],
        lease=10**9,
    )


def w_leased(ctx: Ctx) -> None:
    acquire_loop(
        ctx,
        lambda req: ["RSEM.ACQUIRE", ctx.key, 1, "LEASE", LEASE, "WAIT", WAIT, "REQUEST", req],
        lambda r: isinstance(r, list) and len(r) == 1,
        lambda _r: None,
        lambda r, _req: ["RSEM.RELEASE", ctx.key, "ID", r[0]],
    )


def owner_count(ctx: Ctx, own: str) -> tuple[str | None, int | None]:
    """Where the owner's count was read, and the count (``None``: not read)."""
    where = ctx.master.where()
    info = ctx.master.call_here("RLOCK.INFO", ctx.key)
    if where is None or ctx.master.where() != where:
        return None, None
    if not info:
        return where, 0
    fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else dict(info)
    return where, int(fields.get(b"count", 0)) if fields.get(b"owner") == own.encode() else 0


def holds_nothing(ctx: Ctx, own: str, req: str, before: tuple[str | None, int | None]) -> None:
    """After a resolution that says the request holds nothing, the owner's count on the server
    that said so must be no more than it was there before the acquire was sent (a count left
    by an earlier hold may still be there, until its release reaches it): more is a ``leak``."""
    t0 = now()
    where, count = owner_count(ctx, own)
    if where is None or where != before[0] or count is None or before[1] is None:
        return
    if count > before[1]:
        ctx.log("leak", t0=t0, t1=now(), req=req, count=count, before=before[1])


def w_lost_reply(ctx: Ctx) -> None:
    """Acquires whose replies are thrown away unread (the connection closed after sending),
    then resolved exactly through their ``REQUEST`` id: half by a retry with the same id (its
    reply is the first one's grant, or a new acquire), half by ``RLOCK.CANCEL``."""
    while ctx.running():
        req = ctx.req()
        own = owner(ctx, req)
        cmd = ["RLOCK.ACQUIRE", ctx.key, own, LEASE, "WAIT", WAIT, "TOKEN", "REQUEST", req, "GT"]
        before = owner_count(ctx, own)
        t0 = now()
        try:
            conn: Any = ctx.master.conn()
            if ctx.master.cluster_seeds:
                conn = conn.get_redis_connection(conn.get_node_from_key(ctx.key))
            c = conn.connection_pool.get_connection()
            c.send_command(*cmd)
            time.sleep(ctx.rng.uniform(0, 0.02))
            c.disconnect()
            conn.connection_pool.release(c)
        except (Refused, redis.RedisError, RedisClusterException, OSError) as exc:
            ctx.log(
                "fail",
                t0=t0,
                t1=now(),
                err=exc.kind if isinstance(exc, Refused) else error_kind(exc),
            )
            ctx.master.drop()
            time.sleep(0.05)
            continue
        ctx.log("unknown", t0=t0, t1=now(), req=req, err="dropped")
        if ctx.rng.random() < 0.5:
            r, c0, c1 = cancel(ctx, req)
            ctx.log("resolve", t0=c0, t1=c1, req=req, how="cancel", reply=str(r))
            holds_nothing(ctx, own, req, before)
            continue
        # retry with the same id: the first grant's reply if it stands, else a fresh acquire
        while ctx.running():
            r0 = now()
            try:
                reply = ctx.master.call(*cmd)
            except Refused as exc:
                if exc.kind == "ERR request <id> was cancelled":
                    # the server rolled the grant back when the connection closed: nothing held
                    ctx.log("resolve", t0=r0, t1=now(), req=req, how="retry", reply="cancelled")
                    holds_nothing(ctx, own, req, before)
                    break
                if exc.kind == "ERR request <id> is already waiting":
                    time.sleep(0.02)  # the dropped wait is still being taken out of the queue
                    continue
                ctx.log("fail", t0=r0, t1=now(), err=exc.kind)
                time.sleep(0.05)
                continue
            except Uncertain:
                r, c0, c1 = cancel(ctx, req)
                ctx.log("resolve", t0=c0, t1=c1, req=req, how="cancel", reply=str(r))
                holds_nothing(ctx, own, req, before)
                break
            r1 = now()
            tok = token_of(reply)
            ctx.log("resolve", t0=r0, t1=r1, req=req, how="retry", reply=str(reply))
            if tok is None:
                holds_nothing(ctx, own, req, before)
            else:
                h = ctx.hold_id()
                # the lease may have started with the first send: count it from there
                ctx.log("grant", t0=t0, t1=r1, lease=LEASE, token=tok, n=1, h=h, req=req)
                ctx.nap(0.0, 0.05)
                ctx.log("release", t0=now(), h=h)
                give_back(ctx, "RLOCK.RELEASE", ctx.key, own, "REQUEST", req, h=h)
            break


def w_latch(ctx: Ctx) -> None:
    """One client (``latch_setter``, drawn per run: clients alternate between the two client
    hosts, so the setter is on either side of a partition) sets the latch to N (acknowledged
    by every replica before it counts it as set), then counts it down N times; the others
    await it."""
    n = 4
    if ctx.spec["index"] == ctx.spec.get("latch_setter", 0):
        while ctx.running():
            t0 = now()
            try:
                ctx.master.call("RLATCH.DELETE", ctx.key)
                ctx.log("latch_delete", t0=t0, t1=now())
                t0 = now()
                if ctx.master.call("RLATCH.SETCOUNT", ctx.key, n) != 1:
                    continue
                t1 = now()
                acked = int(
                    ctx.master.call("WAIT", ctx.spec.get("replicas", 0), 1000)
                ) >= ctx.spec.get("replicas", 0)
            except (Refused, Uncertain) as exc:
                ctx.log("latch_delete", t0=t0, t1=now(), err=getattr(exc, "kind", str(exc)))
                time.sleep(0.1)
                continue
            ctx.log("latch_set", t0=t0, t1=t1, n=n, acked=acked)
            for _ in range(n):
                ctx.nap(0.05, 0.3)
                t0 = now()
                try:
                    left = ctx.master.call("RLATCH.COUNTDOWN", ctx.key)
                    ctx.log("latch_down", t0=t0, t1=now(), left=int(left))
                except (Refused, Uncertain) as exc:
                    ctx.log("latch_down", t0=t0, t1=now(), err=getattr(exc, "kind", str(exc)))
            ctx.nap(0.1, 0.3)
    else:
        while ctx.running():
            t0 = now()
            try:
                r = ctx.master.call("RLATCH.AWAIT", ctx.key, 2000)
            except (Refused, Uncertain) as exc:
                ctx.log("fail", t0=t0, t1=now(), err=getattr(exc, "kind", str(exc)))
                time.sleep(0.05)
                continue
            ctx.log("latch_await", t0=t0, t1=now(), open=int(r) == 1)
            if int(r) == 1:
                time.sleep(0.02)


# --- baselines: Redisson's Lua and SET NX PX, polling as their clients do ------------------

REDISSON_LOCK = """
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return {1, redis.call('incr', KEYS[2])};
end;
return {0, redis.call('pttl', KEYS[1])};
"""
REDISSON_UNLOCK = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil; end;
local c = redis.call('hincrby', KEYS[1], ARGV[1], -1);
if c > 0 then return 0; end;
redis.call('del', KEYS[1]); return 1;
"""
REDISSON_SEM = """
local v = redis.call('get', KEYS[1]);
if v ~= false and tonumber(v) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1]); return 1;
end;
return 0;
"""
CAS_DEL = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


def poll(
    ctx: Ctx, attempt: Callable[[], Any], ok: Callable[[Any], bool]
) -> tuple[Any, float, float] | None:
    """Tries every 10 ms for up to ``WAIT`` ms, as Redisson's and SET NX clients poll."""
    t0 = now()
    while True:
        reply = attempt()
        if ok(reply):
            return reply, t0, now()
        if now() - t0 > WAIT / 1000:
            return None
        time.sleep(0.01)


def replicas_ok(ctx: Ctx) -> bool:
    """Redisson since 3.17: after a grant, ``WAIT`` for the replicas it knows of, for 1 s (and
    roll the grant back when fewer answer). Redisson learns its master's replicas from the
    Sentinels and the master; here, the replicas the master reports connected now (none: no
    check), so a restarted old master that got one replica back checks only that one."""
    info = ctx.master.call("INFO", "replication")  # redis-py parses it into a dict
    want = int(info.get("connected_slaves", 0)) if isinstance(info, dict) else 0
    return want == 0 or int(ctx.master.call("WAIT", want, 1000)) >= want


def baseline_loop(
    ctx: Ctx,
    attempt: Callable[[], Any],
    ok: Callable[[Any], bool],
    give_back: Callable[[], Any],
    token: Callable[[Any], int | None],
    lease: int,
    check_replicas: bool,
) -> None:
    """A baseline's loop: poll ``attempt`` until ``ok`` (as its clients do), optionally
    Redisson's replica check (the grant given back when it fails), hold, ``give_back`` once
    (no retry: as those clients release)."""
    while ctx.running():
        try:
            got = poll(ctx, attempt, ok)
            if got is None:
                ctx.log("fail", t0=now(), t1=now(), err="busy")
                continue
            reply, t0, t1 = got
            if check_replicas and not replicas_ok(ctx):
                give_back()
                ctx.log("fail", t0=t0, t1=now(), err="not_acknowledged")
                continue
        except (Refused, Uncertain) as exc:
            ctx.log("fail", t0=now(), t1=now(), err=getattr(exc, "kind", str(exc)))
            time.sleep(0.05)
            continue
        h = ctx.hold_id()
        ctx.log("grant", t0=t0, t1=t1, lease=lease, token=token(reply), n=1, h=h)
        ctx.nap(0.0, 0.05)
        ctx.log("release", t0=now(), h=h)
        try:
            give_back()
        except (Refused, Uncertain):
            pass


def w_redisson_lock(ctx: Ctx) -> None:
    own = owner(ctx)
    # in the key's slot: a name with its own hash tag (a cluster's) keeps it
    tkey = ctx.key + ":token" if "{" in ctx.key else "{" + ctx.key + "}:token"
    baseline_loop(
        ctx,
        lambda: ctx.master.call("EVAL", REDISSON_LOCK, 2, ctx.key, tkey, LEASE, own),
        lambda r: int(r[0]) == 1,
        lambda: ctx.master.call("EVAL", REDISSON_UNLOCK, 1, ctx.key, own),
        lambda r: int(r[1]),
        LEASE,
        check_replicas=True,
    )


def w_redisson_sem(ctx: Ctx) -> None:
    baseline_loop(
        ctx,
        lambda: ctx.master.call("EVAL", REDISSON_SEM, 1, ctx.key, 1),
        lambda r: int(r) == 1,
        lambda: ctx.master.call("INCRBY", ctx.key, 1),
        lambda _r: None,
        10**9,
        check_replicas=True,
    )


def w_setnx(ctx: Ctx) -> None:
    val = owner(ctx)
    baseline_loop(
        ctx,
        lambda: ctx.master.call("SET", ctx.key, val, "NX", "PX", LEASE),
        lambda r: r is not None and r is not False,
        lambda: ctx.master.call("EVAL", CAS_DEL, 1, ctx.key, val),
        lambda _r: None,
        LEASE,
        check_replicas=False,
    )


WORKLOADS: dict[str, Callable[[Ctx], None]] = {
    "lock": w_lock,
    "lock_ack": lambda ctx: w_lock(ctx, ack=int(ctx.spec.get("replicas", 2))),
    "session": lambda ctx: w_lock(ctx, session=True),
    "rwlock": w_rwlock,
    "sem": w_sem,
    "leased_sem": w_leased,
    "latch": w_latch,
    "lost_reply": w_lost_reply,
    "redisson_lock": w_redisson_lock,
    "redisson_sem": w_redisson_sem,
    "setnx": w_setnx,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    master = Master(
        sentinels=[(a.split(":")[0], int(a.split(":")[1])) for a in spec.get("sentinels", [])],
        cluster_seeds=[(a.split(":")[0], int(a.split(":")[1])) for a in spec.get("cluster", [])],
        timeout=(WAIT + 2000) / 1000,
        key=spec["key"],
    )
    with open(spec["out"], "a", buffering=1) as out:
        ctx = Ctx(
            spec,
            master,
            out,
            random.Random(spec["seed"]),
            spec["cid"],
            spec["key"],
            float(spec["end"]),
        )
        ctx.log("start", t0=now(), pid=os.getpid())
        while now() < float(spec["start"]):
            time.sleep(0.01)
        WORKLOADS[spec["workload"]](ctx)
        if ctx.giver is not None:
            ctx.giver.close()
        ctx.log("stop", t0=now())


if __name__ == "__main__":
    main()
