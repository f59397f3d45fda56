"""``python3 -m rjepsen publish DIR [DIR ...]``: the published tables from runs' results.

Reads every ``*/result.json`` under the given result directories (a cell run again in a later
directory replaces the earlier one), and writes the summary between the markers of
docs/safety.md and the per-workload table to docs/jepsen-results.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import tables

BEGIN, END = "<!-- BEGIN jepsen summary -->\n", "<!-- END jepsen summary -->"
NEMESES = ["none", "partition", "pause", "kill_restart", "lossy", "bridge"]
CLUSTER = ["cluster none", "cluster cluster_failover", "cluster cluster_kill", "cluster partition"]
MODES = ["defaults", "min_replicas_2", "guard_off"]

INTRO = """# Fault-injection results, per workload

The per-workload table behind the summary in
[safety.md](safety.md#under-network-faults-the-fault-injection-suite): every cell of the runs
published there (`make jepsen`, then `python3 -m rjepsen publish` on its result directories;
the suite is described in [jepsen/README.md](../jepsen/README.md)). *anomalies* counts every
kind the checkers report for the workload (the kind and the worst case in parentheses:
milliseconds of overlap, or permits over the total); *token repeats / order*: repeated tokens,
and tokens not larger than one whose reply arrived before the acquire was sent; *heal →
grant*: the longest time from the end of a fault to the workload's next grant (a read-write
lock: its next write grant); *longest gap*: the longest time without one; *at the end*: what
the key held 12 s after the last client stopped; *errors*: the three most frequent errors by
kind (`busy` not counted).

"""


def collect(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per cell (topology, nemesis, mode, seed), the last given winning, in the
    published order: Sentinel before cluster, then mode, nemesis, seed."""
    cells: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for r in results:
        r.setdefault("crashed", [])
        r.setdefault("topology", "sentinel")
        cells[(r["topology"], r["nemesis"], r["mode"], r["seed"])] = r
    order = {n: i for i, n in enumerate(NEMESES + CLUSTER)}

    def key(r: dict[str, Any]) -> tuple[bool, int, int, int]:
        label = tables.nemesis_label(r)
        return (r["topology"] == "cluster", MODES.index(r["mode"]), order[label], r["seed"])

    return sorted(cells.values(), key=key)


def between_markers(doc: str, text: str) -> str:
    """``doc`` with what stands between its summary markers replaced by ``text``."""
    a = doc.index(BEGIN) + len(BEGIN)
    b = doc.index(END, a)
    return doc[:a] + text + doc[b:]


def load(dirs: list[Path]) -> list[dict[str, Any]]:
    results = []
    for d in dirs:
        for p in sorted(d.glob("*/result.json")):
            r = json.loads(p.read_text())
            r.setdefault(
                "topology", "cluster" if p.parent.name.startswith("cluster-") else "sentinel"
            )
            results.append(r)
    return collect(results)


def publish(dirs: list[Path], docs: Path) -> list[dict[str, Any]]:
    """Writes the tables of the runs in ``dirs`` into ``docs``; returns the cells."""
    cells = load(dirs)
    if not cells:
        raise SystemExit(f"no */result.json under {[str(d) for d in dirs]}")
    safety = docs / "safety.md"
    safety.write_text(between_markers(safety.read_text(), tables.summary(cells)))
    (docs / "jepsen-results.md").write_text(INTRO + tables.table(cells))
    return cells
