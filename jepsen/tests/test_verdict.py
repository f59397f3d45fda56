"""The run's verdict over the checkers' rows: what makes ``python3 -m rjepsen`` exit 1."""

from __future__ import annotations

from typing import Any

from rjepsen import run, tables


def row(
    workload: str, anomalies: int = 0, repeats: int = 0, order: int = 0, grants: int = 100
) -> dict[str, Any]:
    return {
        "workload": workload,
        "grants": grants,
        "anomalies": anomalies,
        "token_repeats": repeats,
        "token_order": order,
        "anomaly_kind": "overlapping holds" if anomalies else "",
        "examples": [f"{workload} example"],
    }


def cell(nemesis: str, mode: str, rows: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    """A cell with a fault (unless ``none``) and every rlock workload granted (clean rows for
    those ``rows`` leave out)."""
    named = {r["workload"] for r in rows}
    full = rows + [row(w) for w in tables.RLOCK_WORKLOADS if w not in named]
    faults = [] if nemesis == "none" else [{"what": nemesis, "settled_after_s": 1.0}]
    return {"nemesis": nemesis, "mode": mode, "seed": 7, "faults": faults, "rows": full, **kw}


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
    # the control run with the guard off is reported, never judged
    assert run.verdict([cell("none", "guard_off", clean)]) == []
    # any faulted guard-off cell of the seed may show it
    assert (
        run.verdict([cell("partition", "guard_off", clean), cell("lossy", "guard_off", broken)])
        == []
    )


def test_in_a_cluster_either_split_brain_cell_of_a_seed_may_show_the_broken_setups_anomaly() -> (
    None
):
    clean = [row("lock"), row("sem")]
    broken = [row("session", anomalies=1)]

    def of(nemesis: str, rows: list[dict[str, Any]], seed: int = 7) -> dict[str, Any]:
        return {**cell(nemesis, "guard_off", rows), "topology": "cluster", "seed": seed}

    assert run.verdict([of("cluster_failover", clean), of("partition", broken)]) == []
    assert run.verdict([of("cluster_failover", broken), of("partition", clean)]) == []
    assert run.verdict([of("cluster_failover", clean), of("partition", clean)]) == [
        "cluster cluster_failover/guard_off/seed 7, cluster partition/guard_off/seed 7: "
        "the checkers found no anomaly in the broken setup"
    ]
    # each seed on its own: another seed's anomaly does not stand in
    assert run.verdict([of("cluster_failover", clean), of("partition", broken, seed=8)]) == [
        "cluster cluster_failover/guard_off/seed 7: the checkers found no anomaly in the broken "
        "setup"
    ]
    # the control run is not judged
    assert run.verdict([of("none", clean)]) == []


def test_a_cell_whose_nemesis_ran_no_fault_fails() -> None:
    # a 15 s lossy link did not fit a short run: the cell was the control run, passing as lossy
    assert run.verdict([cell("lossy", "defaults", [], faults=[])]) == [
        "lossy/defaults/seed 7: the nemesis lossy ran no fault"
    ]
    assert run.verdict([cell("none", "defaults", [])]) == []


def test_clients_killed_for_hanging_fail_the_cell() -> None:
    assert run.verdict([cell("pause", "defaults", [], hung=["lock1"])]) == [
        "pause/defaults/seed 7: client processes hung past the end and were killed: ['lock1']"
    ]


def test_an_rlock_workload_with_no_grant_or_no_row_fails_the_cell() -> None:
    dead = [row("latch", grants=0)]
    assert run.verdict([cell("pause", "defaults", dead)]) == [
        "pause/defaults/seed 7: rlock workloads with no grant: ['latch']"
    ]
    missing = [r for r in cell("pause", "defaults", [])["rows"] if r["workload"] != "sem"]
    assert run.verdict([{**cell("pause", "defaults", []), "rows": missing}]) == [
        "pause/defaults/seed 7: rlock workloads with no grant: ['sem']"
    ]
    # a dead baseline is reported, never judged
    assert run.verdict([cell("pause", "defaults", [row("setnx", grants=0)])]) == []
    # nor does a dead workload stand in for the anomaly the broken setup must show
    assert run.verdict([cell("partition", "guard_off", dead)]) == [
        "partition/guard_off/seed 7: rlock workloads with no grant: ['latch']",
        "partition/guard_off/seed 7: the checkers found no anomaly in the broken setup",
    ]


def test_an_error_of_the_suite_itself_fails_the_cell() -> None:
    # the session killer's thread died: the session workload ran without its kills
    failed = cell("pause", "defaults", [], suite_errors=["kill_sessions: Traceback ..."])
    assert run.verdict([failed]) == [
        "pause/defaults/seed 7: the suite failed: kill_sessions: Traceback ..."
    ]


def test_a_topology_that_never_settled_after_a_fault_fails_the_cell() -> None:
    faults = [
        {"what": "paused n1", "settled_after_s": 2.0, "settled": True},
        {"what": "paused n2", "settled_after_s": 60.0, "settled": False},
    ]
    assert run.verdict([cell("pause", "defaults", [], faults=faults)]) == [
        "pause/defaults/seed 7: the topology did not settle within 60 s after: ['paused n2']"
    ]


def test_a_heal_with_no_grant_after_it_is_shown_as_a_lower_bound() -> None:
    rows = [
        {
            **row("lock"),
            "heal_to_grant_s": 12.0,
            "no_grant_after_heal": True,
            "longest_gap_s": 12.0,
            "errors": {},
            "at_end": "",
            "worst_ms": 0.0,
        }
    ]
    c = cell("pause", "defaults", rows)
    for r in c["rows"]:
        r.setdefault("heal_to_grant_s", 0.5)
        r.setdefault("longest_gap_s", 1.0)
        r.setdefault("errors", {})
        r.setdefault("at_end", "")
        r.setdefault("worst_ms", 0.0)
    assert "| > 12.0 | 12.0 |" in tables.table([c])
    assert "| > 12.0 | 12.0 |" in tables.summary([c])
