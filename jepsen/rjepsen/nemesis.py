"""Faults, each a start and a heal, aimed at whichever server is master when it starts."""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import redis

from .cluster import Cluster
from .topology import Group


@dataclass
class Fault:
    name: str
    start: Callable[[], str]  # does the fault; returns what it did, for the log
    heal: Callable[[], str]
    length: float  # seconds between start and heal


def doing(action: Callable[[], object], what: str) -> Callable[[], str]:
    """A fault's start or heal: does ``action``, then returns ``what`` it did, for the log."""

    def run() -> str:
        action()
        return what

    return run


def for_group(name: str, group: Group, rng: random.Random) -> Callable[[], Fault] | None:
    """A factory of faults of kind ``name`` (``None`` for the control run, ``none``)."""
    net = group.net

    def master_and_replicas() -> tuple[str, list[str]]:
        m = group.master()
        return m, [h for h in group.nodes if h != m]

    if name == "none":
        return None

    if name == "partition":

        def make() -> Fault:
            m, reps = master_and_replicas()
            return Fault(
                name,
                doing(
                    lambda: net.partition([m, "c1"], [*reps, "c2"]),
                    f"isolated {m} with c1 from {reps} and c2",
                ),
                doing(net.heal, "healed"),
                12.0,
            )

        return make

    if name == "bridge":

        def make() -> Fault:
            m, reps = master_and_replicas()
            far = rng.choice(reps)
            return Fault(
                name,
                doing(lambda: net.cut(m, far), f"cut {m} from {far} only"),
                doing(net.heal, "healed"),
                12.0,
            )

        return make

    if name == "pause":

        def make() -> Fault:
            m, _ = master_and_replicas()
            srv = group.servers[m]
            return Fault(
                name,
                doing(lambda: srv.signal(signal.SIGSTOP), f"SIGSTOP {m}"),
                doing(lambda: srv.signal(signal.SIGCONT), f"SIGCONT {m}"),
                rng.choice([6.0, 9.0, 12.0]),
            )

        return make

    if name == "kill_restart":

        def make() -> Fault:
            m, _ = master_and_replicas()
            srv = group.servers[m]
            # around Sentinel's down-after (5 s): before it, at its edge, after it, long after
            delay = rng.choice([3.0, 4.6, 5.3, 9.0])
            return Fault(
                name,
                doing(srv.kill, f"kill -9 {m}"),
                doing(srv.start, f"restarted {m} from its AOF after {delay} s"),
                delay,
            )

        return make

    if name == "lossy":

        def make() -> Fault:
            m, _ = master_and_replicas()
            return Fault(
                name,
                doing(lambda: net.lossy(m, 0.25, 512), f"{m}: 25% loss, 512 kbit/s"),
                doing(net.heal, "healed"),
                15.0,
            )

        return make

    raise SystemExit(f"unknown nemesis {name}")


SENTINEL_NEMESES = ["none", "partition", "pause", "kill_restart", "lossy", "bridge"]


def for_cluster(name: str, cluster: Cluster, rng: random.Random) -> Callable[[], Fault] | None:
    """A factory of faults of kind ``name`` aimed at the master serving the workloads' slot
    when the fault starts (``None`` for the control run, ``none``)."""
    net = cluster.net

    def target() -> tuple[str, list[str]]:
        m = cluster.master()
        return m, [h for h in cluster.nodes if h != m]

    def isolate(m: str, rest: list[str]) -> str:
        net.partition([m, "c1"], [*rest, "c2"])
        return f"isolated {m} with c1 from {rest} and c2"

    def heal() -> str:
        net.heal()
        return "healed"

    def failover(replica: str, *how: str) -> str:
        what = " ".join(["CLUSTER FAILOVER", *how, "on", replica])
        try:
            cluster.command(replica, "CLUSTER", "FAILOVER", *how)
        except (redis.RedisError, OSError) as exc:
            return f"{what} refused: {exc}"
        return what

    if name == "none":
        return None

    if name == "partition":

        def make_partition() -> Fault:
            m, rest = target()
            return Fault(name, lambda: isolate(m, rest), heal, 12.0)

        return make_partition

    if name == "cluster_failover":
        # in turn (from a random first): a coordinated failover (the old master pauses its
        # clients until its replica caught up), and a forced one while the old master is cut
        # off with c1 and still serving it. The forced one comes FORCE_AFTER s after the cut,
        # as the cluster's own failover would (cluster-node-timeout): docs/safety.md's timing
        # assumption, that no replica is promoted sooner than the old master stops granting
        # (rlock.replica-max-lag + 2 s), which a promotion at the instant of the cut breaks
        forced = [rng.random() < 0.5]

        def cut_then_force(m: str, rest: list[str], replica: str) -> str:
            what = isolate(m, rest)
            time.sleep(FORCE_AFTER)
            return f"{what}, then after {FORCE_AFTER} s {failover(replica, 'FORCE')}"

        def make_failover() -> Fault:
            m, rest = target()
            replica = rng.choice(cluster.replicas_of(m) or rest)
            forced[0] = not forced[0]
            if not forced[0]:
                return Fault(name, lambda: failover(replica), lambda: "nothing to heal", 8.0)
            return Fault(name, lambda: cut_then_force(m, rest, replica), heal, 12.0)

        return make_failover

    if name == "cluster_kill":
        # around cluster-node-timeout (5 s): before it or at its edge (3, 4.6, 5.3 s: the
        # replica is not promoted, which takes the timeout plus the failure reports and the
        # election, about 6.5 s), and long after it (9 s: promoted), in turn from a random first
        long = [rng.random() < 0.5]

        def make_kill() -> Fault:
            m, _ = target()
            srv = cluster.servers[m]
            long[0] = not long[0]
            delay = 9.0 if long[0] else rng.choice([3.0, 4.6, 5.3])

            def kill() -> str:
                srv.kill()
                return f"kill -9 {m}"

            def restart() -> str:
                srv.start()
                return f"restarted {m} from its AOF after {delay} s"

            return Fault(name, kill, restart, delay)

        return make_kill

    raise SystemExit(f"unknown cluster nemesis {name}")


FORCE_AFTER = 5.0
CLUSTER_NEMESES = ["none", "cluster_failover", "cluster_kill", "partition"]


class Settles(Protocol):
    def settled(self) -> bool: ...


def settle(group: Settles, timeout: float = 60.0) -> tuple[float, bool]:
    """Waits (bounded) until the topology is settled (one master with both replicas in sync;
    in a cluster, every slot served and every master with its replica in sync); returns
    seconds waited and whether it settled."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        try:
            if group.settled():
                return time.monotonic() - t, True
        except Exception:
            pass
        time.sleep(0.2)
    return time.monotonic() - t, False
