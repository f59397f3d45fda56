"""Faults, each a start and a heal, aimed at whichever server is master when it starts."""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from typing import Callable

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


def settle(group: Group, timeout: float = 60.0) -> float:
    """Waits (bounded) until one master with both replicas in sync; returns seconds waited."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        try:
            if group.settled():
                return time.monotonic() - t
        except Exception:
            pass
        time.sleep(0.2)
    return time.monotonic() - t
