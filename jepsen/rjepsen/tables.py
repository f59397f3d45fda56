"""The results' tables: one row per workload of a cell (``table``), one line per nemesis x
mode (``summary``, the one docs/safety.md publishes); ``run`` writes them after a run,
``publish`` into the docs."""

from __future__ import annotations

from typing import Any

# workload -> clients (alternating c1, c2)
RLOCK_WORKLOADS = {
    "lock": 3,
    "lock_ack": 2,
    "session": 3,
    "rwlock": 3,
    "sem": 4,
    "leased_sem": 4,
    "latch": 3,
    "lost_reply": 2,
}


def nemesis_label(r: dict[str, Any]) -> str:
    """The nemesis as tables name it: a cluster's cells say so."""
    cl = r.get("topology", "sentinel") == "cluster"
    return f"cluster {r['nemesis']}" if cl else str(r["nemesis"])


def cell_name(r: dict[str, Any]) -> str:
    return f"{nemesis_label(r)}/{r['mode']}/seed {r['seed']}"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| nemesis | mode | workload | grants | anomalies | token repeats / order "
        "| heal → grant (s) | longest gap (s) | at the end | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in results:
        for row in r["rows"]:
            errs = (
                ", ".join(
                    f"{k} {v}" for k, v in sorted(row["errors"].items(), key=lambda kv: -kv[1])[:3]
                )
                or "—"
            )
            anomalies = (
                f"**{row['anomalies']}** ({row['anomaly_kind']}, worst {row['worst_ms']:.0f})"
                if row["anomalies"]
                else "0"
            )
            tok = f"{row['token_repeats']} / {row['token_order']}"
            if row["token_repeats"] or row["token_order"]:
                tok = f"**{tok}**"
            h2g = "—" if row["heal_to_grant_s"] is None else f"{row['heal_to_grant_s']:.1f}"
            if row.get("no_grant_after_heal"):
                h2g = f"> {h2g}"  # no grant until the end: a lower bound
            lines.append(
                f"| {nemesis_label(r)} | {r['mode']} | {row['workload']} | {row['grants']} "
                f"| {anomalies} | {tok} | {h2g} | {row['longest_gap_s']:.1f} "
                f"| {row['at_end'] or '—'} | {errs} |"
            )
    return head + "\n".join(lines) + "\n"


def summary(results: list[dict[str, Any]]) -> str:
    """One line per nemesis x mode (summed over seeds): rlock's workloads together, each
    baseline apart; the table docs/safety.md publishes."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((nemesis_label(r), r["mode"]), []).append(r)
    head = (
        "| nemesis | mode | seeds | rlock grants | rlock anomalies | rlock token faults "
        "| rlock NOREPLICAS | lock heal → grant (s) | lock longest gap (s) "
        "| Redisson lock overlaps / token faults | Redisson semaphore over total "
        "| SET NX PX overlaps | counted permits at the end (rlock, Redisson) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for (nem, mode), rs in cells.items():
        rows = [row for r in rs for row in r["rows"]]

        def of(w: str, rows: list[dict[str, Any]] = rows) -> list[dict[str, Any]]:
            return [row for row in rows if row["workload"] == w]

        rl = [row for row in rows if row["workload"] in RLOCK_WORKLOADS]
        grants = sum(row["grants"] for row in rl)
        anomalies = sum(row["anomalies"] for row in rl)
        tokens = sum(row["token_repeats"] + row["token_order"] for row in rl)
        refusals = sum(row["errors"].get("NOREPLICAS", 0) for row in rl)
        h2g = [
            (row["heal_to_grant_s"], bool(row.get("no_grant_after_heal")))
            for row in of("lock")
            if row["heal_to_grant_s"] is not None
        ]
        slowest = "—"
        if h2g:
            worst, open_ended = max(h2g)
            slowest = f"> {worst:.1f}" if open_ended else f"{worst:.1f}"
        gap = max((row["longest_gap_s"] for row in of("lock")), default=0.0)
        rdl = of("redisson_lock")
        rdl_text = (
            f"{sum(r['anomalies'] for r in rdl)} / "
            f"{sum(r['token_repeats'] + r['token_order'] for r in rdl)}"
        )
        rds = sum(r["anomalies"] for r in of("redisson_sem"))
        snx = sum(r["anomalies"] for r in of("setnx"))
        left = ", ".join(
            "/".join(r["at_end"].split(" ")[0] for r in of(w)) or "—"
            for w in ("sem", "redisson_sem")
        )

        def bold(n: int) -> str:
            return f"**{n}**" if n else "0"

        lines.append(
            f"| {nem} | {mode} | {len(rs)} | {grants} | {bold(anomalies)} | {bold(tokens)} "
            f"| {refusals} | {slowest} | {gap:.1f} | {rdl_text} | {bold(rds)} "
            f"| {bold(snx)} | {left} of 3 |"
        )
    return head + "\n".join(lines) + "\n"
