"""Hosts in Linux network namespaces joined by one bridge, and the faults cut between them.

Every host is a namespace ``rj-<name>`` with one interface ``eth0`` on ``10.77.0.0/24``,
joined through a veth pair to a bridge that lives in its own namespace (``rj-br``). No
namespace has a default route: nothing the suite starts can reach beyond these addresses.
Faults are iptables rules inside the hosts' namespaces (``DROP`` for a cut link, ``-m
statistic`` for a lossy one; this kernel has no ``sch_netem``) and a ``tbf`` rate queue for a
slow one. :meth:`Net.close` deletes every namespace, and :func:`delete_stale` removes what a
killed run left behind before a new one starts.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Sequence

PREFIX = "rj-"
BRIDGE_NS = PREFIX + "br"
SUBNET = "10.77.0"
LOCK_PATH = "/run/rjepsen.lock"


def sh(argv: Sequence[str], check: bool = True) -> str:
    """Runs a command, returns its stdout; raises with its stderr when it fails and ``check``."""
    p = subprocess.run(list(argv), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def namespaces() -> list[str]:
    return [line.split()[0] for line in sh(["ip", "netns", "list"]).splitlines() if line.strip()]


def delete_stale() -> None:
    """Deletes every namespace a previous run of the suite left (a run killed with -9)."""
    for ns in namespaces():
        if ns.startswith(PREFIX):
            sh(["ip", "netns", "del", ns], check=False)


@dataclass
class Net:
    """The hosts of one run. ``hosts`` maps a host name to its address."""

    hosts: dict[str, str] = field(default_factory=dict)
    _closed: bool = False
    _lock: int = -1

    @classmethod
    def create(cls, names: Sequence[str]) -> Net:
        # one run at a time on a machine: the namespace names are fixed
        lock = os.open(LOCK_PATH, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        delete_stale()
        net = cls(_lock=lock)
        _register(net)
        sh(["ip", "netns", "add", BRIDGE_NS])
        sh(["ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", BRIDGE_NS, "link", "set", "br0", "up"])
        sh(["ip", "-n", BRIDGE_NS, "link", "set", "lo", "up"])
        for i, name in enumerate(names, start=1):
            ns = PREFIX + name
            addr = f"{SUBNET}.{i}"
            sh(["ip", "netns", "add", ns])
            sh(["ip", "link", "add", f"rjv{i}", "type", "veth", "peer", "name", f"rjb{i}"])
            sh(["ip", "link", "set", f"rjv{i}", "netns", ns])
            sh(["ip", "link", "set", f"rjb{i}", "netns", BRIDGE_NS])
            sh(["ip", "-n", ns, "link", "set", f"rjv{i}", "name", "eth0"])
            sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            sh(["ip", "-n", BRIDGE_NS, "link", "set", f"rjb{i}", "master", "br0"])
            sh(["ip", "-n", BRIDGE_NS, "link", "set", f"rjb{i}", "up"])
            net.hosts[name] = addr
        return net

    def ns(self, host: str) -> str:
        return PREFIX + host

    def wrap(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def iptables(self, host: str, *rule: str) -> None:
        sh(self.wrap(host, ["iptables", "-w", *rule]))

    def cut(self, a: str, b: str) -> None:
        """Drops every packet between hosts ``a`` and ``b``, both ways, in both namespaces."""
        for src, dst in ((a, b), (b, a)):
            peer = self.hosts[dst]
            self.iptables(src, "-A", "INPUT", "-s", peer, "-j", "DROP")
            self.iptables(src, "-A", "OUTPUT", "-d", peer, "-j", "DROP")

    def partition(self, *sides: Sequence[str]) -> None:
        """Cuts every link between hosts on different sides."""
        for i, side in enumerate(sides):
            for other in sides[i + 1 :]:
                for a in side:
                    for b in other:
                        self.cut(a, b)

    def lossy(self, host: str, probability: float, rate_kbit: int) -> None:
        """Drops ``probability`` of ``host``'s packets both ways and queues what it sends
        behind a ``rate_kbit`` token bucket (a slow link)."""
        p = f"{probability:.3f}"
        for chain in ("INPUT", "OUTPUT"):
            self.iptables(
                host,
                "-A",
                chain,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                p,
                "-j",
                "DROP",
            )
        sh(
            self.wrap(
                host,
                [
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    f"{rate_kbit}kbit",
                    "burst",
                    "16kbit",
                    "latency",
                    "400ms",
                ],
            )
        )

    def heal(self) -> None:
        """Removes every fault: all iptables rules and rate queues of every host."""
        for host in self.hosts:
            self.iptables(host, "-F")
            sh(self.wrap(host, ["tc", "qdisc", "del", "dev", "eth0", "root"]), check=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in self.hosts:
            sh(["ip", "netns", "del", self.ns(host)], check=False)
        sh(["ip", "netns", "del", BRIDGE_NS], check=False)
        if self._lock >= 0:
            os.close(self._lock)  # releases the run lock
            self._lock = -1


_LIVE: list[Net] = []


def _register(net: Net) -> None:
    if not _LIVE:
        atexit.register(_close_all)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _on_signal)
    _LIVE.append(net)


def _close_all() -> None:
    while _LIVE:
        _LIVE.pop().close()


def _on_signal(signum: int, _frame: object) -> None:
    _close_all()
    sys.exit(128 + signum)
