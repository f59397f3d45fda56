"""Checkers over a run's history, every time on the host's one monotonic clock.

A hold is what a client believes: from the grant's reply (``t1``) to the earliest of the
release it sent, its process's death, and ``t0 + lease`` (the acquire's send time plus the
lease: the server started the lease no earlier, so a client that respects it never believes
past the server's end). A hold whose reply arrived after that end (``t1 >= t0 + lease``) is
believed by nobody: it takes part in no overlap and no permit count (its token is still
checked). Since every process reads the same clock, any overlap the checkers find is a real
one, with no tolerance.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

LOCKS = {"lock", "lock_ack", "session", "lost_reply", "redisson_lock", "setnx"}
SEMAPHORES = {"sem", "leased_sem", "redisson_sem"}


@dataclass
class Hold:
    client: str
    start: float
    end: float
    t0: float
    token: int | None
    n: int
    side: str | None


@dataclass
class Row:
    workload: str
    grants: int = 0
    anomalies: int = 0
    anomaly_kind: str = ""
    worst_ms: float = 0.0
    token_repeats: int = 0
    token_order: int = 0
    heal_to_grant_s: float | None = None
    #: no grant came after the slowest heal before the end (heal_to_grant_s is a lower bound)
    no_grant_after_heal: bool = False
    longest_gap_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    unknown: int = 0
    resolved: dict[str, int] = field(default_factory=dict)
    at_end: str = ""
    examples: list[str] = field(default_factory=list)

    def clean(self) -> bool:
        return self.anomalies == 0 and self.token_repeats == 0 and self.token_order == 0


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    events = []
    for p in paths:
        for line in p.read_text().splitlines():
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a kill -9
    return events


def holds_of(events: list[dict[str, Any]], deaths: dict[str, float]) -> list[Hold]:
    released = {e["h"]: e["t0"] for e in events if e["ev"] == "release"}
    out = []
    for e in events:
        if e["ev"] != "grant":
            continue
        end = min(
            e["t0"] + e["lease"] / 1000.0,
            released.get(e["h"], float("inf")),
            deaths.get(e["c"], float("inf")),
        )
        out.append(
            Hold(e["c"], e["t1"], end, e["t0"], e.get("token"), int(e.get("n", 1)), e.get("side"))
        )
    return out


def believed(holds: list[Hold]) -> list[Hold]:
    """The holds some client believed for a while: not those that ended (their lease, their
    process) before their reply arrived."""
    return [h for h in holds if h.end > h.start]


def mutual_exclusion(
    holds: list[Hold], exclusive: Any = lambda a, b: True
) -> tuple[int, float, list[str]]:
    """Pairs of holds of different clients that overlap (and ``exclusive(a, b)`` says must not)."""
    holds = sorted(believed(holds), key=lambda h: h.start)
    active: list[Hold] = []
    count, worst = 0, 0.0
    examples: list[str] = []
    for h in holds:
        active = [a for a in active if a.end > h.start]
        for a in active:
            if a.client != h.client and exclusive(a, h):
                count += 1
                ms = (min(a.end, h.end) - h.start) * 1000
                worst = max(worst, ms)
                if len(examples) < 3:
                    examples.append(
                        f"{a.client} [{a.start:.3f}, {a.end:.3f}] and "
                        f"{h.client} [{h.start:.3f}, {h.end:.3f}]: {ms:.1f} ms"
                    )
        active.append(h)
    return count, worst, examples


def permits(holds: list[Hold], total: int) -> tuple[int, float, list[str]]:
    """Grants that made the permits believed held exceed ``total``."""
    holds = believed(holds)
    points = sorted(
        [(h.start, h.n) for h in holds] + [(h.end, -h.n) for h in holds], key=lambda p: (p[0], p[1])
    )
    held, count, worst = 0, 0, 0.0
    examples: list[str] = []
    for t, d in points:
        held += d
        if d > 0 and held > total:
            count += 1
            worst = max(worst, held - total)
            if len(examples) < 3:
                examples.append(f"{held} of {total} permits held at {t:.3f}")
    return count, worst, examples


def tokens(holds: list[Hold]) -> tuple[int, int, list[str]]:
    """Repeated tokens, and grants that certainly came after another (sent after its reply
    arrived) with a token not larger."""
    with_token = [h for h in holds if h.token is not None]
    repeats = sum(c - 1 for c in Counter(h.token for h in with_token).values() if c > 1)
    by_reply = sorted(with_token, key=lambda h: h.start)
    replies = [h.start for h in by_reply]
    prefix_max: list[int] = []
    best = -(2**63)
    for h in by_reply:
        best = max(best, int(h.token))  # type: ignore[arg-type]
        prefix_max.append(best)
    order = 0
    examples: list[str] = []
    for h in with_token:
        i = bisect.bisect_left(replies, h.t0)  # grants whose reply arrived before h was sent
        if i and int(h.token) <= prefix_max[i - 1]:  # type: ignore[arg-type]
            order += 1
            if len(examples) < 3:
                examples.append(
                    f"token {h.token} sent at {h.t0:.3f}, after a reply with {prefix_max[i - 1]}"
                )
    return repeats, order, examples


def refused(err: str | None) -> bool:
    """Whether an error ``client.py`` logged says the command certainly changed nothing: an
    error reply (``READONLY``, ``NOREPLICAS``, ``ERR ...``: see ``client.error_kind``) or a
    command never sent (no master known, connection refused). Any other error is a lost
    reply (``timeout``, ``connection``, an exception's class name): the command may have run."""
    if err is None:
        return False
    return (
        err in ("no_master", "connection_refused")
        or err.startswith("ERR ")
        or err.split(" ", 1)[0].isupper()
    )


def latch(events: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """An awaiter answered "open" before the count could have reached zero: after a set
    (acknowledged by every replica) and before the N-th count-down of that cycle was sent
    (count-downs whose reply was lost count as sent, refused ones do not) or the next delete."""
    ev = sorted(events, key=lambda e: e["t0"])
    cycles: list[tuple[float, float]] = []  # (set acknowledged at, could open from)
    cur: dict[str, Any] | None = None
    for e in ev:
        if e["ev"] == "latch_set":
            cur = {"set": e["t1"], "n": e["n"], "downs": 0, "open": None, "acked": e["acked"]}
        elif e["ev"] == "latch_down" and cur is not None:
            if refused(e.get("err")):
                continue
            cur["downs"] += 1
            if cur["downs"] == cur["n"] and cur["open"] is None:
                cur["open"] = e["t0"]
        elif e["ev"] == "latch_delete" and cur is not None:
            if cur["acked"]:
                cycles.append((cur["set"], cur["open"] if cur["open"] is not None else e["t0"]))
            cur = None
    if cur is not None and cur["acked"]:
        cycles.append((cur["set"], cur["open"] if cur["open"] is not None else float("inf")))
    count = 0
    examples: list[str] = []
    for e in ev:
        if e["ev"] != "latch_await" or not e["open"]:
            continue
        for set_at, open_from in cycles:
            if e["t0"] > set_at and e["t1"] < open_from:
                count += 1
                if len(examples) < 3:
                    examples.append(
                        f"{e['c']} told open at {e['t1']:.3f}; "
                        f"the count could reach zero from {open_from:.3f}"
                    )
                break
    return count, examples


def reentries(events: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """A holder that re-enters the lock it believes it holds must be granted at once, with a
    token larger than its hold's (every grant that asks for one gets a new one, re-entries
    too): "held by another" means it believed a hold it no longer had. A re-entry refused
    with an error (``NOREPLICAS``, a lost reply) says nothing, nor one answered after its
    hold's lease (``t0 + lease`` of the client's last grant before it): the lock may rightly
    be another's by then."""
    count, examples = 0, list[str]()
    lease_end: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e["t0"]):
        if e["ev"] == "grant":
            lease_end[e["c"]] = e["t0"] + e["lease"] / 1000.0
        if e["ev"] != "reenter" or "err" in e:
            continue
        if e["t1"] > lease_end.get(e["c"], float("inf")):
            continue
        if e.get("token") is None or e.get("outer") is None or e["token"] <= e["outer"]:
            count += 1
            if len(examples) < 3:
                examples.append(
                    f"{e['c']} re-entered at {e['t0']:.3f} holding token {e.get('outer')}: "
                    f"got {e.get('token')}"
                )
    return count, examples


def liveness(
    grant_times: list[float], heals: list[float], start: float, end: float
) -> tuple[float | None, float, bool]:
    """The slowest heal → next grant (a heal with no grant after it counts until the end, and
    the third value says so: the time is a lower bound), and the longest time without a grant."""
    times = sorted(t for t in grant_times if start <= t <= end)
    gaps = [b - a for a, b in zip([start, *times], [*times, end])]
    after: list[tuple[float, bool]] = []
    for h in heals:
        i = bisect.bisect_left(times, h)
        after.append((times[i] - h, False) if i < len(times) else (end - h, True))
    slowest = max(after) if after else None
    return (
        None if slowest is None else slowest[0],
        max(gaps) if gaps else end - start,
        slowest is not None and slowest[1],
    )


def check(events: list[dict[str, Any]], meta: dict[str, Any]) -> list[Row]:
    """One row per workload. ``meta``: ``totals`` (permits per semaphore workload), ``heals``
    (times each fault ended), ``deaths`` (client id -> when its process was killed),
    ``start``/``end`` of the workload."""
    by_w: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if "w" in e:
            by_w[e["w"]].append(e)
    rows = []
    deaths = meta.get("deaths", {})
    for w in sorted(by_w):
        evs = by_w[w]
        row = Row(w)
        holds = holds_of(evs, deaths)
        row.grants = len(holds)
        if w in LOCKS:
            row.anomalies, row.worst_ms, ex = mutual_exclusion(holds)
            row.anomaly_kind = "overlapping holds"
            leaks = [e for e in evs if e["ev"] == "leak"]
            if leaks:
                row.anomalies += len(leaks)
                row.anomaly_kind += "; a request resolved as holding nothing left a hold"
                ex += [f"{e['c']} at {e['t0']:.3f}: count {e['count']}" for e in leaks[:3]]
            lost, lost_ex = reentries(evs)
            if lost:
                row.anomalies += lost
                row.anomaly_kind += "; re-entry not granted while held"
                ex += lost_ex
        elif w == "rwlock":
            row.anomalies, row.worst_ms, ex = mutual_exclusion(
                holds, lambda a, b: "WRITE" in (a.side, b.side)
            )
            row.anomaly_kind = "writer beside another hold"
        elif w in SEMAPHORES:
            row.anomalies, row.worst_ms, ex = permits(holds, int(meta["totals"][w]))
            row.anomaly_kind = "permits over the total"
        elif w == "latch":
            row.anomalies, ex = latch(evs)
            row.grants = sum(1 for e in evs if e["ev"] == "latch_await" and e["open"])
            row.anomaly_kind = "open before zero"
        else:
            ex = []
        row.examples += ex
        row.token_repeats, row.token_order, ex = tokens(holds)
        row.examples += ex
        # a read-write lock's readers hide a starved writer: its gap counts write grants only
        gap_holds = [h for h in holds if h.side == "WRITE"] if w == "rwlock" else holds
        grant_times = [h.start for h in gap_holds] or [
            e["t1"] for e in evs if e["ev"] == "latch_await" and e["open"]
        ]
        row.heal_to_grant_s, row.longest_gap_s, row.no_grant_after_heal = liveness(
            grant_times, meta.get("heals", []), meta["start"], meta["end"]
        )
        errors = Counter(e["err"] for e in evs if e["ev"] == "fail" and e["err"] != "busy")
        # a release given up on (an error reply, or unanswered until the end)
        errors += Counter(f"release {e['err']}" for e in evs if e["ev"] == "release_failed")
        row.errors = dict(errors)
        row.unknown = sum(1 for e in evs if e["ev"] == "unknown")
        row.resolved = dict(
            Counter(f"{e['how']}:{e['reply']}" for e in evs if e["ev"] == "resolve")
        )
        rows.append(row)
    return rows
