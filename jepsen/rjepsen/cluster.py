"""A Redis Cluster of three masters with a replica each (hosts ``n1``..``n6``), every node
alone in its host's namespace, and client hosts ``c1``, ``c2``.

Every workload key carries the hash tag ``{j}`` (``{j}lock``, ``{j}sem``, ...): all of them
live in one slot, so whatever the nemesis does to that slot's master it does to every
workload. The suite reaches the nodes over their Unix sockets, which no network fault touches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from .net import Net, sh
from .topology import PORT, Server, wait_for

TAG = "{j}"
SLOT = key_slot(TAG.encode())
NODES = ("n1", "n2", "n3", "n4", "n5", "n6")
SLOTS = 16384


@dataclass
class Node:
    """One line of ``CLUSTER NODES`` as a node sees it."""

    id: str
    addr: str
    flags: set[str]
    master_id: str | None
    connected: bool
    slots: list[tuple[int, int]]

    @property
    def master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def parse_nodes(text: str) -> list[Node]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        slots = []
        for s in f[8:]:
            if s.startswith("["):
                continue  # a slot being migrated or imported
            lo, _, hi = s.partition("-")
            slots.append((int(lo), int(hi or lo)))
        out.append(
            Node(
                f[0],
                f[1].split("@")[0].rsplit(":", 1)[0],
                set(f[2].split(",")),
                None if f[3] == "-" else f[3],
                f[7] == "connected",
                slots,
            )
        )
    return out


@dataclass
class Cluster:
    """The six nodes of one run. ``server_options`` are extra config lines
    (``rlock.min-replicas 0``)."""

    net: Net
    servers: dict[str, Server] = field(default_factory=dict)
    nodes: tuple[str, ...] = NODES
    clients: tuple[str, ...] = ("c1", "c2")

    @classmethod
    def start(cls, root: Path, binary: str, server_options: list[str]) -> Cluster:
        net = Net.create([*NODES, "c1", "c2"])
        cl = cls(net=net)
        try:
            for host in NODES:
                srv = Server(net, host, root / host, binary, server_options, cluster=True)
                srv.write_config(None)
                cl.servers[host] = srv
                srv.start()
            addrs = [f"{net.hosts[h]}:{PORT}" for h in NODES]
            sh(
                net.wrap(
                    "c1",
                    [
                        cli_of(binary),
                        "--cluster",
                        "create",
                        *addrs,
                        "--cluster-replicas",
                        "1",
                        "--cluster-yes",
                    ],
                )
            )
            wait_for("the cluster to be stable", cl.settled, timeout=60.0)
        except BaseException:
            cl.close()
            raise
        return cl

    def key(self, workload: str) -> str:
        return TAG + workload

    def seeds(self) -> list[str]:
        return [f"{self.net.hosts[h]}:{PORT}" for h in self.nodes]

    def host_of(self, addr: str) -> str:
        for host, a in self.net.hosts.items():
            if a == addr:
                return host
        raise KeyError(addr)

    def command(self, host: str, *args: str) -> Any:
        """One command to ``host`` over its Unix socket."""
        return self.servers[host].admin().execute_command(*args)  # type: ignore[no-untyped-call]

    def view(self, host: str) -> list[Node]:
        return parse_nodes(str(self.command(host, "CLUSTER", "NODES")))

    def master(self, slot: int = SLOT) -> str:
        """The host most live nodes name as the master serving ``slot`` (``n1`` if none)."""
        votes: dict[str, int] = {}
        for host, srv in self.servers.items():
            if not srv.alive():
                continue
            try:
                nodes = self.view(host)
            except (redis.RedisError, OSError):
                continue
            for n in nodes:
                if n.master and not n.failing and any(lo <= slot <= hi for lo, hi in n.slots):
                    h = self.host_of(n.addr)
                    votes[h] = votes.get(h, 0) + 1
        return max(votes, key=lambda h: votes[h]) if votes else "n1"

    def replicas_of(self, master: str) -> list[str]:
        """The hosts ``master`` itself lists as its replicas."""
        nodes = self.view(master)
        me = next(n for n in nodes if "myself" in n.flags)
        return [self.host_of(n.addr) for n in nodes if n.master_id == me.id]

    def settled(self) -> bool:
        """Every node up and ``cluster_state:ok``, all agreeing on which three masters serve
        which slots (all 16384 covered), none flagged failing, and each master with one replica
        online and in sync with it."""
        if not all(srv.alive() for srv in self.servers.values()):
            return False
        maps = set()
        for host in self.servers:
            if "cluster_state:ok" not in str(self.command(host, "CLUSTER", "INFO")):
                return False
            nodes = self.view(host)
            if len(nodes) != len(self.nodes) or any(
                n.failing or (not n.connected and "myself" not in n.flags) for n in nodes
            ):
                return False
            masters = [n for n in nodes if n.master]
            if (
                len(masters) != 3
                or sum(hi - lo + 1 for m in masters for lo, hi in m.slots) != SLOTS
            ):
                return False
            if any(sum(1 for n in nodes if n.master_id == m.id) != 1 for m in masters):
                return False
            maps.add(frozenset((m.addr, tuple(sorted(m.slots))) for m in masters))
        if len(maps) != 1:
            return False
        for srv in self.servers.values():
            info = srv.admin().info("replication")
            if info.get("role") == "master":
                if int(info.get("connected_slaves", 0)) != 1 or info["slave0"]["state"] != "online":
                    return False
            elif info.get("master_link_status") != "up":
                return False
        return True

    def close(self) -> None:
        for srv in self.servers.values():
            srv.stop()
        self.net.close()


def cli_of(binary: str) -> str:
    """The ``redis-cli`` (or ``valkey-cli``) beside ``binary``, else the one on the PATH."""
    path = Path(binary)
    for name in ("redis-cli", "valkey-cli"):
        if path.parent != Path() and (path.parent / name).exists():
            return str(path.parent / name)
    return "redis-cli"
