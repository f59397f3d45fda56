"""``rjepsen publish``: which result stands for a cell, in what order, and where it is written."""

from __future__ import annotations

from typing import Any

import pytest

from rjepsen import publish


def result(
    nemesis: str, mode: str, seed: int, topology: str = "sentinel", **kw: Any
) -> dict[str, Any]:
    return {"nemesis": nemesis, "mode": mode, "seed": seed, "topology": topology, **kw}


def test_a_cell_run_again_replaces_the_earlier_run() -> None:
    first = result("pause", "defaults", 1, grants=1)
    again = result("pause", "defaults", 1, grants=2)
    assert publish.collect([first, again]) == [again]


def test_cells_are_ordered_by_topology_mode_nemesis_and_seed() -> None:
    cells = [
        result("partition", "defaults", 1, topology="cluster"),
        result("pause", "guard_off", 1),
        result("partition", "defaults", 2),
        result("partition", "defaults", 1),
        result("none", "defaults", 1),
    ]
    got = [(r["topology"], r["nemesis"], r["mode"], r["seed"]) for r in publish.collect(cells)]
    assert got == [
        ("sentinel", "none", "defaults", 1),
        ("sentinel", "partition", "defaults", 1),
        ("sentinel", "partition", "defaults", 2),
        ("sentinel", "pause", "guard_off", 1),
        ("cluster", "partition", "defaults", 1),
    ]


def test_the_summary_goes_between_the_markers_and_nowhere_else() -> None:
    doc = f"intro\n{publish.BEGIN}old table\n{publish.END}\nrest\n"
    assert (
        publish.between_markers(doc, "new\n") == f"intro\n{publish.BEGIN}new\n{publish.END}\nrest\n"
    )
    with pytest.raises(ValueError):
        publish.between_markers("no markers", "new\n")
