"""The servers of a run: a replicated group watched by Sentinels, or a Redis Cluster, each
server (and its Sentinel) alone in its host's namespace.

The suite talks to the servers over their Unix sockets (``<dir>/redis.sock``), which no
network fault touches; clients reach them only by their addresses in the namespaces.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import redis

from .net import Net

PORT = 6379
SENTINEL_PORT = 26379
MASTER_NAME = "mymaster"
DOWN_AFTER_MS = 5000


def module_path() -> str:
    path = os.environ.get("RLOCK_MODULE") or str(
        Path(__file__).resolve().parents[2] / "target/release/librlock.so"
    )
    if not Path(path).exists():
        raise SystemExit(f"the module is not built: {path} (cargo build --release -p rlock)")
    return path


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


@dataclass
class Server:
    """One redis-server with the module in host ``host``'s namespace."""

    net: Net
    host: str
    dir: Path
    binary: str
    extra: list[str]
    proc: subprocess.Popen[bytes] | None = None
    cluster: bool = False

    @property
    def addr(self) -> str:
        return self.net.hosts[self.host]

    @property
    def sock(self) -> str:
        return str(self.dir / "redis.sock")

    def write_config(self, replicaof: str | None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"port {PORT}",
            f"bind {self.addr}",
            "protected-mode no",
            f"dir {self.dir}",
            f"unixsocket {self.sock}",
            "unixsocketperm 700",
            f"logfile {self.dir / 'server.log'}",
            "appendonly yes",
            "appendfsync everysec",
            "save ''",
            f"loadmodule {module_path()}",
            *self.extra,
        ]
        if replicaof:
            lines.append(f"replicaof {replicaof} {PORT}")
        if self.cluster:
            lines += [
                "cluster-enabled yes",
                "cluster-node-timeout 5000",
                f"cluster-config-file {self.dir / 'nodes.conf'}",
            ]
        (self.dir / "redis.conf").write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.net.wrap(self.host, [self.binary, str(self.dir / "redis.conf")]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(f"{self.host} to answer", lambda: self.admin().ping())

    def admin(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.sock, socket_timeout=2, decode_responses=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def role(self) -> str:
        return str(self.admin().execute_command("ROLE")[0])  # type: ignore[no-untyped-call]

    def log_tail(self, lines: int = 40) -> str:
        path = self.dir / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class SentinelProc:
    net: Net
    host: str
    dir: Path
    binary: str
    master_addr: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def sock(self) -> str:
        return str(self.dir / "sentinel.sock")

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {SENTINEL_PORT}\nbind {self.net.hosts[self.host]}\nprotected-mode no\n"
            f"dir {self.dir}\nunixsocket {self.sock}\nlogfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER_NAME} {self.master_addr} {PORT} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 20000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 2\n"
        )
        self.proc = subprocess.Popen(
            self.net.wrap(self.host, [self.binary, str(conf), "--sentinel"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(f"sentinel on {self.host}", lambda: self.admin().ping())

    def admin(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.sock, socket_timeout=2, decode_responses=True)

    def master(self) -> str | None:
        try:
            addr: Any = self.admin().sentinel_get_master_addr_by_name(MASTER_NAME)
        except (redis.RedisError, OSError):
            return None
        return str(addr[0]) if addr else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Group:
    """A master and its replicas (``n1``..``n3``), a Sentinel beside each, and client hosts
    ``c1``, ``c2``. ``server_options`` are extra config lines (``rlock.min-replicas 2``)."""

    net: Net
    servers: dict[str, Server] = field(default_factory=dict)
    sentinels: dict[str, SentinelProc] = field(default_factory=dict)
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    clients: tuple[str, ...] = ("c1", "c2")

    @classmethod
    def start(cls, root: Path, binary: str, server_options: list[str]) -> Group:
        nodes = ("n1", "n2", "n3")
        net = Net.create([*nodes, "c1", "c2"])
        group = cls(net=net)
        sentinel_binary = binary
        for i, host in enumerate(nodes):
            srv = Server(net, host, root / host, binary, server_options)
            srv.write_config(None if i == 0 else net.hosts["n1"])
            group.servers[host] = srv
        for srv in group.servers.values():
            srv.start()
        master = group.servers["n1"]
        wait_for(
            "both replicas in sync",
            lambda: master.admin().info("replication").get("connected_slaves") == 2,
        )
        for host in nodes:
            s = SentinelProc(net, host, root / host / "sentinel", sentinel_binary, net.hosts["n1"])
            group.sentinels[host] = s
            s.start()
        wait_for(
            "the Sentinels to see each other",
            lambda: all(
                int(s.admin().sentinel_master(MASTER_NAME)["num-other-sentinels"])  # type: ignore[index]
                == 2
                for s in group.sentinels.values()
            ),
        )
        return group

    def host_of(self, addr: str) -> str:
        for host, a in self.net.hosts.items():
            if a == addr:
                return host
        raise KeyError(addr)

    def master(self) -> str:
        """The host most Sentinels name as master now."""
        votes: dict[str, int] = {}
        for s in self.sentinels.values():
            addr = s.master()
            if addr:
                votes[addr] = votes.get(addr, 0) + 1
        if not votes:
            return "n1"
        return self.host_of(max(votes, key=lambda a: votes[a]))

    def sentinel_addrs(self) -> list[str]:
        return [f"{self.net.hosts[h]}:{SENTINEL_PORT}" for h in self.nodes]

    def settled(self) -> bool:
        """One master the Sentinels agree on, with both replicas online and in sync."""
        addrs = {s.master() for s in self.sentinels.values()}
        if len(addrs) != 1 or None in addrs:
            return False
        master = self.servers[self.host_of(str(addrs.pop()))]
        if not master.alive() or master.role() != "master":
            return False
        info = master.admin().info("replication")
        return int(info.get("connected_slaves", 0)) == 2 and all(
            info[f"slave{i}"]["state"] == "online" for i in range(2)
        )

    def close(self) -> None:
        for s in self.sentinels.values():
            s.stop()
        for srv in self.servers.values():
            srv.stop()
        self.net.close()


def fresh_root(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
