"""The run's verdict over the checkers' rows: what makes ``python3 -m rjepsen`` exit 1."""

from __future__ import annotations

from typing import Any

from rjepsen import run


def row(workload: str, anomalies: int = 0, repeats: int = 0, order: int = 0) -> dict[str, Any]:
    return {
        "workload": workload,
        "anomalies": anomalies,
        "token_repeats": repeats,
        "token_order": order,
        "anomaly_kind": "overlapping holds" if anomalies else "",
        "examples": [f"{workload} example"],
    }


def cell(nemesis: str, mode: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nemesis": nemesis, "mode": mode, "seed": 7, "rows": rows}


def test_clean_rlock_rows_and_anomalous_baselines_pass() -> None:
    rows = [row("lock"), row("sem"), row("redisson_lock", anomalies=3), row("setnx", repeats=2)]
    assert run.verdict([cell("partition", "defaults", rows)]) == []


def test_any_rlock_anomaly_or_token_fault_with_the_guard_on_fails_the_run() -> None:
    for bad in (row("lock", anomalies=1), row("rwlock", repeats=1), row("session", order=1)):
        for mode in ("defaults", "min_replicas_2"):
            problems = run.verdict([cell("pause", mode, [row("sem"), bad])])
            assert problems == [
                f"pause/{mode}/seed 7: {bad['workload']}: {bad['anomaly_kind']} {bad['examples']}"
            ]


def test_the_guard_off_under_a_partition_must_show_an_anomaly() -> None:
    clean = [row("lock"), row("sem"), row("redisson_lock", anomalies=4)]
    assert run.verdict([cell("partition", "guard_off", clean)]) == [
        "partition/guard_off/seed 7: the checkers found no anomaly in the broken setup"
    ]
    broken = [row("lock", anomalies=2), row("sem")]
    assert run.verdict([cell("partition", "guard_off", broken)]) == []
    # other nemeses with the guard off are reported, never judged
    assert run.verdict([cell("pause", "guard_off", clean)]) == []
    assert run.verdict([cell("pause", "guard_off", broken)]) == []
