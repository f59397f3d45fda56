"""What the failover tests share (``test_failover.py``, ``test_session_ha.py``,
``test_session_ha_aio.py``, ``test_latch.py``, ``test_client_model.py``): a Sentinel group, a
cluster with replicas, and small probes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
from _servers import Server, cluster_rows, poll, session_holds
from redis.crc import key_slot

PROMPT = 3.0  # seconds within which what should happen "at once" must have happened
LIMIT = 30.0  # the bound of a failover, a promotion, a demotion
QUICK = 0.3  # a response timeout for refusals retried within it (MOVED)

holds = session_holds  # the session holds a server counts (INFO rlock)


def is_master(s: Server) -> bool:
    try:
        role = redis.Redis(port=s.port, socket_timeout=1).execute_command("ROLE")
    except redis.RedisError:
        return False
    return bool(role[0] == b"master")


def replicated(master: Server, replica: Server) -> None:
    """Waits until everything ``master`` wrote reached ``replica`` (a ``WAIT`` from a new
    connection would not: it waits only for that connection's own writes)."""
    offset = int(master.client().info("replication")["master_repl_offset"])
    poll(
        "the replica to have the grants",
        LIMIT,
        lambda: int(replica.client().info("replication")["slave_repl_offset"]) >= offset,
    )


class Group:
    """A master, one replica and one Sentinel (quorum 1) that knows the replica."""

    def __init__(self, down_after_ms: int) -> None:
        self.master = Server()
        self.replica = Server("--replicaof", "127.0.0.1", str(self.master.port))
        poll(
            "the replica link",
            LIMIT,
            lambda: self.replica.client().info("replication")["master_link_status"] == "up",
        )
        self.sentinel = Server(
            sentinel_conf=(
                f"sentinel monitor mymaster 127.0.0.1 {self.master.port} 1\n"
                f"sentinel down-after-milliseconds mymaster {down_after_ms}\n"
                "sentinel failover-timeout mymaster 10000\n"
            )
        )
        self.s = redis.Redis(port=self.sentinel.port, socket_timeout=5)
        poll("the sentinel to know the replica", LIMIT, lambda: self._replicas() == 1)

    def _replicas(self) -> int:
        return len(self.s.sentinel_slaves("mymaster"))

    def masterport(self) -> int:
        return int(self.s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")[1])

    def wait_promoted(self) -> None:
        """Waits until the failover ended: the Sentinel names the replica in ``SENTINEL
        MASTERS`` too, which redis-py asks (``GET-MASTER-ADDR-BY-NAME`` names it a little
        earlier, from the promotion on)."""

        def promoted() -> bool:
            state = self.s.sentinel_masters()["mymaster"]
            return bool(
                self.masterport() == self.replica.port
                and int(state["port"]) == self.replica.port
                and is_master(self.replica)
            )

        poll("the promotion", LIMIT, promoted)

    def failover(self) -> None:
        """``SENTINEL FAILOVER`` (refused with NOGOODSLAVE until the Sentinel has had a reply to
        INFO from the replica), then the promotion."""
        poll(
            "the sentinel to accept a failover",
            LIMIT,
            lambda: self.s.execute_command("SENTINEL", "FAILOVER", "mymaster") is not None,
            step=0.1,
        )
        self.wait_promoted()

    def close(self) -> None:
        for s in (self.sentinel, self.replica, self.master):
            s.close()


def group(request: Any, down_after_ms: int) -> Iterator[Group]:
    """A [`Group`] whose Sentinel fails over a master silent for ``down_after_ms``; prints the
    logs when the test (``request``) failed."""
    g = Group(down_after_ms)
    yield g
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for s in (g.master, g.replica, g.sentinel):
            print(f"----- log (port {s.port}) -----\n{s.log()[-4000:]}")
    g.close()


# -- a cluster of three masters with a replica each ---------------------------------------


def row_port(row: list[str]) -> int:
    return int(row[1].split("@")[0].rsplit(":", 1)[1])


def replica_of(nodes: list[Server], master: Server) -> Server:
    rows = cluster_rows(master)
    mid = next(r[0] for r in rows if row_port(r) == master.port)
    port = next(row_port(r) for r in rows if r[3] == mid)
    return next(n for n in nodes if n.port == port)


def owner(via: Server, slot: int) -> int:
    for row in via.client().execute_command("CLUSTER", "SLOTS"):
        if int(row[0]) <= slot <= int(row[1]):
            return int(row[2][1])
    return 0


def key_on(via: Server, port: int, prefix: str) -> str:
    return next(
        k
        for k in (f"{prefix}{i}" for i in range(10_000))
        if owner(via, key_slot(k.encode())) == port
    )
