"""The checkers against crafted histories: each accepts a clean one and flags each way it can
be broken, and randomized nets compare them with brute-force models.

Pure: no servers. Histories are the events ``client.py`` writes (``grant``, ``release``,
``fail``, ``latch_*``...), on one clock, in seconds.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from rjepsen import checker

Event = dict[str, Any]

# more rounds of the randomized nets: RJEPSEN_NET_ROUNDS=2000 python3 -m pytest tests
ROUNDS = int(os.environ.get("RJEPSEN_NET_ROUNDS", "150"))


def grant(
    c: str,
    h: str,
    t0: float,
    t1: float,
    *,
    w: str = "lock",
    lease: int = 3000,
    token: Optional[int] = None,
    n: int = 1,
    side: Optional[str] = None,
) -> Event:
    e: Event = {"ev": "grant", "c": c, "w": w, "h": h, "t0": t0, "t1": t1, "lease": lease}
    e.update(token=token, n=n)
    if side is not None:
        e["side"] = side
    return e


def release(c: str, h: str, t0: float, *, w: str = "lock") -> Event:
    return {"ev": "release", "c": c, "w": w, "h": h, "t0": t0}


def held(
    c: str,
    start: float,
    end: float,
    *,
    w: str = "lock",
    side: Optional[str] = None,
    n: int = 1,
    token: Optional[int] = None,
) -> list[Event]:
    """A hold believed over ``[start, end]``: sent 1 ms before its reply, released at ``end``."""
    h = f"{c}@{start}"
    return [
        grant(c, h, start - 0.001, start, w=w, side=side, n=n, token=token),
        release(c, h, end, w=w),
    ]


def meta(**kw: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"start": 0.0, "end": 100.0, "heals": [], "deaths": {}, "totals": {}}
    m.update(kw)
    return m


def row_of(events: list[Event], **kw: Any) -> checker.Row:
    rows = checker.check(events, meta(**kw))
    assert len(rows) == 1, rows
    return rows[0]


# --- mutual exclusion ----------------------------------------------------------------------


def test_lock_holds_handed_over_without_overlap_are_clean() -> None:
    events = held("a", 1.0, 2.0) + held("b", 2.0, 3.0) + held("c", 3.5, 4.0)
    row = row_of(events)
    assert row.grants == 3
    assert (row.anomalies, row.worst_ms, row.examples) == (0, 0.0, [])
    assert row.clean()


def test_holds_of_two_clients_overlapping_by_one_millisecond_are_flagged() -> None:
    events = held("a", 1.0, 2.0) + held("b", 1.999, 3.0)
    row = row_of(events)
    assert row.anomalies == 1
    assert row.anomaly_kind == "overlapping holds"
    assert row.worst_ms == pytest.approx(1.0)
    assert not row.clean()
    assert "a [1.000, 2.000] and b [1.999, 3.000]" in row.examples[0]


@pytest.mark.parametrize("workload", sorted(checker.LOCKS))
def test_every_lock_workload_is_checked_for_overlaps(workload: str) -> None:
    events = held("a", 1.0, 2.0, w=workload) + held("b", 1.5, 3.0, w=workload)
    row = row_of(events)
    assert (row.workload, row.anomalies) == (workload, 1)
    assert row.worst_ms == pytest.approx(500.0)


def test_the_same_clients_overlapping_holds_are_not_flagged() -> None:
    events = held("a", 1.0, 2.0) + held("a", 1.5, 3.0)
    assert row_of(events).anomalies == 0


def test_a_hold_ends_at_its_acquires_send_time_plus_the_lease() -> None:
    # sent at 1.0 with a 3 s lease: believed until 4.0 although released only at 9.0
    a = [grant("a", "a#1", 1.0, 1.2, lease=3000), release("a", "a#1", 9.0)]
    assert row_of(a + held("b", 4.0, 5.0)).anomalies == 0
    row = row_of(a + held("b", 3.99, 5.0))
    assert row.anomalies == 1
    assert row.worst_ms == pytest.approx(10.0)


def test_a_hold_never_released_ends_with_its_lease() -> None:
    a = [grant("a", "a#1", 1.0, 1.2, lease=2000)]
    assert row_of(a + held("b", 3.0, 5.0)).anomalies == 0
    assert row_of(a + held("b", 2.9, 5.0)).anomalies == 1


def test_a_hold_ends_when_its_process_is_killed() -> None:
    a = [grant("session0", "session0#1", 1.0, 1.1, w="session", lease=3000)]
    b = held("session1", 2.0, 2.5, w="session")
    assert row_of(a + b, deaths={"session0": 2.0}).anomalies == 0
    row = row_of(a + b, deaths={"session0": 2.2})
    assert row.anomalies == 1
    assert row.worst_ms == pytest.approx(200.0)
    # the death of another client ends nothing of this one's
    assert row_of(a + b, deaths={"session7": 1.5}).anomalies == 1


def test_a_hold_whose_reply_came_after_its_lease_is_believed_by_nobody() -> None:
    # sent at 1.0 with a 3 s lease, answered at 4.5: the client never believes it holds it
    late = [grant("a", "a#1", 1.0, 4.5, lease=3000), release("a", "a#1", 4.6)]
    row = row_of(late + held("b", 4.0, 5.0))
    assert row.grants == 2
    assert row.anomalies == 0, row.examples
    # but it is still a grant: its token is checked like any other
    tok = [grant("a", "a#1", 1.0, 4.5, lease=3000, token=7)]
    assert row_of(tok + held("b", 4.0, 5.0, token=7)).token_repeats == 1


# --- read-write lock -----------------------------------------------------------------------


def reenter(c: str, t0: float, **kw: Any) -> Event:
    return {"ev": "reenter", "c": c, "w": "lock", "t0": t0, "t1": t0 + 0.001, **kw}


def test_a_reentry_granted_with_a_larger_token_is_clean() -> None:
    events = [*held("a", 1.0, 2.0, token=5), reenter("a", 1.1, token=6, outer=5)]
    assert row_of(events).clean()


@pytest.mark.parametrize("got", [None, 5, 4])
def test_a_reentry_not_granted_or_without_a_larger_token_while_held_is_flagged(
    got: Optional[int],
) -> None:
    events = [*held("a", 1.0, 2.0, token=5), reenter("a", 1.1, token=got, outer=5)]
    row = row_of(events)
    assert row.anomalies == 1 and "re-entry" in row.anomaly_kind, row


def test_a_reentry_answered_after_the_holds_lease_says_nothing() -> None:
    # the outer grant's reply came late (t1 near t0 + lease): the re-entry, sent while the hold
    # was believed, was answered after its lease, when another client may rightly hold the lock
    late = grant("a", "a#1", 1.0, 3.9, lease=3000, token=5)
    events = [late, reenter("a", 3.95, token=None, outer=5) | {"t1": 4.2}]
    assert row_of(events).clean()
    # answered within the lease, the same refusal is a hold believed but not had
    events = [late, reenter("a", 3.95, token=None, outer=5) | {"t1": 3.99}]
    assert row_of(events).anomalies == 1


def test_a_reentry_refused_with_an_error_says_nothing() -> None:
    events = [*held("a", 1.0, 2.0, token=5), reenter("a", 1.1, err="NOREPLICAS")]
    assert row_of(events).clean()


def test_a_request_resolved_as_holding_nothing_that_left_a_hold_is_flagged() -> None:
    leak: Event = {"ev": "leak", "c": "a", "w": "lost_reply", "t0": 1.0, "t1": 1.001, "count": 1}
    row = row_of([leak])
    assert row.anomalies == 1 and "left a hold" in row.anomaly_kind, row


def test_readers_beside_readers_are_accepted() -> None:
    events = held("a", 1.0, 3.0, w="rwlock", side="READ") + held(
        "b", 2.0, 4.0, w="rwlock", side="READ"
    )
    assert row_of(events).anomalies == 0


@pytest.mark.parametrize(
    ("first", "second"), [("WRITE", "READ"), ("READ", "WRITE"), ("WRITE", "WRITE")]
)
def test_a_writer_beside_another_hold_is_flagged(first: str, second: str) -> None:
    events = held("a", 1.0, 3.0, w="rwlock", side=first) + held(
        "b", 2.0, 4.0, w="rwlock", side=second
    )
    row = row_of(events)
    assert row.anomalies == 1
    assert row.anomaly_kind == "writer beside another hold"
    assert row.worst_ms == pytest.approx(1000.0)


def test_the_same_owners_write_and_read_holds_may_overlap() -> None:
    events = held("a", 1.0, 3.0, w="rwlock", side="WRITE") + held(
        "a", 2.0, 4.0, w="rwlock", side="READ"
    )
    assert row_of(events).anomalies == 0


def test_a_writer_after_readers_and_before_the_next_is_clean() -> None:
    events = (
        held("a", 1.0, 2.0, w="rwlock", side="READ")
        + held("b", 1.5, 2.5, w="rwlock", side="READ")
        + held("c", 2.5, 3.0, w="rwlock", side="WRITE")
        + held("a", 3.0, 4.0, w="rwlock", side="READ")
    )
    assert row_of(events).anomalies == 0


# --- permits -------------------------------------------------------------------------------


def sem_row(events: list[Event], total: int = 3, w: str = "sem") -> checker.Row:
    return row_of(events, totals={w: total})


def test_three_permits_of_three_held_at_once_are_clean() -> None:
    events = (
        held("a", 1.0, 3.0, w="sem") + held("b", 1.5, 3.0, w="sem") + held("c", 2.0, 3.0, w="sem")
    )
    events += held("d", 3.0, 4.0, w="sem")  # taken as the others are given back
    row = sem_row(events)
    assert (row.grants, row.anomalies) == (4, 0)


@pytest.mark.parametrize("workload", sorted(checker.SEMAPHORES))
def test_four_permits_of_three_are_flagged(workload: str) -> None:
    events: list[Event] = []
    for i, c in enumerate("abcd"):
        events += held(c, 1.0 + i * 0.1, 3.0, w=workload)
    row = sem_row(events, w=workload)
    assert row.anomalies == 1
    assert row.anomaly_kind == "permits over the total"
    assert row.worst_ms == 1  # permits over the total, not milliseconds
    assert row.examples == ["4 of 3 permits held at 1.300"]


def test_permits_count_each_grants_n() -> None:
    two = held("a", 1.0, 3.0, w="sem", n=2)
    assert sem_row(two + held("b", 2.0, 3.0, w="sem")).anomalies == 0
    row = sem_row(two + held("b", 2.0, 3.0, w="sem", n=2))
    assert (row.anomalies, row.worst_ms) == (1, 1)


def test_the_same_clients_permits_count_too() -> None:
    events: list[Event] = []
    for i in range(4):
        events += held("a", 1.0 + i * 0.1, 3.0, w="sem")
    assert sem_row(events).anomalies == 1


def test_permits_end_with_their_lease_and_their_process() -> None:
    leased = [grant("a", "a#1", 1.0, 1.1, w="leased_sem", lease=1000)]  # believed until 2.0
    dead = [grant("b", "b#1", 1.0, 1.1, w="leased_sem", lease=3000)]  # killed at 2.0
    others = held("c", 1.5, 3.0, w="leased_sem") + held("d", 2.0, 3.0, w="leased_sem")
    assert sem_row(leased + dead + others, total=3, w="leased_sem").anomalies == 0
    # e taken at 2.0 too: four unless b's process died by then
    more = leased + dead + others + held("e", 2.0, 3.0, w="leased_sem")
    assert row_of(more, totals={"leased_sem": 3}).anomalies == 1
    assert row_of(more, totals={"leased_sem": 3}, deaths={"b": 2.0}).anomalies == 0
    # of two permits: c (1.5) beside a and b is one too many; d (2.0), as a and b end, is not
    row = row_of(leased + dead + others, totals={"leased_sem": 2}, deaths={"b": 2.0})
    assert row.anomalies == 1
    assert row.examples == ["3 of 2 permits held at 1.500"]


def test_a_permit_whose_reply_came_after_its_lease_is_believed_by_nobody() -> None:
    # four permits of three believed from 2.3 to 3.0, and a grant answered after its lease
    # ran out (sent at 0.0, 1 s lease, reply at 3.1, release sent at 3.5): no belief at all,
    # so it must neither count itself nor hide the fourth permit
    late = [grant("z", "z#1", 0.0, 3.1, w="sem", lease=1000), release("z", "z#1", 3.5, w="sem")]
    four: list[Event] = []
    for i, c in enumerate("abcd"):
        four += held(c, 2.0 + i * 0.1, 3.0, w="sem")
    assert sem_row(late + four[:6]).anomalies == 0
    row = sem_row(late + four)
    assert row.anomalies == 1, row.examples
    assert row.examples == ["4 of 3 permits held at 2.300"]


# --- fencing tokens ------------------------------------------------------------------------


def test_increasing_tokens_are_clean() -> None:
    events = (
        held("a", 1.0, 2.0, token=1) + held("b", 2.0, 3.0, token=2) + held("a", 3.0, 4.0, token=5)
    )
    row = row_of(events)
    assert (row.token_repeats, row.token_order) == (0, 0)
    assert row.clean()


def test_a_repeated_token_is_flagged() -> None:
    # concurrent grants (each sent before the other's reply): only the repeat is wrong
    events = [grant("a", "a#1", 1.0, 2.0, token=4), grant("b", "b#1", 1.5, 2.5, token=4)]
    row = row_of(events)
    assert (row.token_repeats, row.token_order) == (1, 0)
    assert not row.clean()
    row = row_of([*events, grant("c", "c#1", 1.2, 2.6, token=4)])
    assert row.token_repeats == 2


def test_a_token_not_larger_than_one_replied_before_its_send_is_flagged() -> None:
    # b is sent at 2.5, after a's reply with 9 arrived (2.0): b's token must be larger
    events = [grant("a", "a#1", 1.0, 2.0, token=9), grant("b", "b#1", 2.5, 3.0, token=8)]
    row = row_of(events)
    assert (row.token_repeats, row.token_order) == (0, 1)
    assert "token 8 sent at 2.500, after a reply with 9" in row.examples
    assert not row.clean()
    # an equal token is both a repeat and out of order
    events[1]["token"] = 9
    assert (row_of(events).token_repeats, row_of(events).token_order) == (1, 1)


def test_a_reply_at_the_very_instant_of_a_send_does_not_order_them() -> None:
    events = [grant("a", "a#1", 1.0, 2.0, token=9), grant("b", "b#1", 2.0, 3.0, token=8)]
    assert row_of(events).token_order == 0
    events[1]["t0"] = 2.0001
    assert row_of(events).token_order == 1


def test_concurrent_grants_may_carry_tokens_in_either_order() -> None:
    # b was sent (1.9) before a's reply arrived (2.0): the server may have granted b first
    events = [grant("a", "a#1", 1.0, 2.0, token=9), grant("b", "b#1", 1.9, 3.0, token=8)]
    row = row_of(events)
    assert (row.token_repeats, row.token_order) == (0, 0)


def test_reads_carry_no_token_and_are_not_checked_for_one() -> None:
    events = held("a", 1.0, 2.0, w="rwlock", side="WRITE", token=3)
    events += held("b", 2.0, 3.0, w="rwlock", side="READ")
    events += held("c", 3.0, 4.0, w="rwlock", side="READ")
    row = row_of(events)
    assert (row.grants, row.token_repeats, row.token_order) == (3, 0, 0)


# --- latch ---------------------------------------------------------------------------------


def latch_cycle(set_t1: float, n: int = 4, acked: bool = True, step: float = 0.1) -> list[Event]:
    """A delete, a set answered at ``set_t1`` and ``n`` count-downs sent ``step`` apart after it."""
    events: list[Event] = [
        {
            "ev": "latch_delete",
            "c": "latch0",
            "w": "latch",
            "t0": set_t1 - 0.2,
            "t1": set_t1 - 0.15,
        },
        {"ev": "latch_set", "c": "latch0", "w": "latch", "t0": set_t1 - 0.1, "t1": set_t1}
        | {"n": n, "acked": acked},
    ]
    for i in range(1, n + 1):
        t = set_t1 + i * step
        events.append(
            {
                "ev": "latch_down",
                "c": "latch0",
                "w": "latch",
                "t0": t,
                "t1": t + 0.01,
                "left": n - i,
            }
        )
    return events


def await_(c: str, t0: float, t1: float, is_open: bool = True) -> Event:
    return {"ev": "latch_await", "c": c, "w": "latch", "t0": t0, "t1": t1, "open": is_open}


def test_awaiters_answered_after_the_last_count_down_are_clean() -> None:
    # set at 1.0, count-downs sent at 1.1 .. 1.4
    events = [*latch_cycle(1.0), await_("latch1", 1.05, 1.41), await_("latch2", 1.2, 1.5)]
    events += [await_("latch1", 1.05, 1.3, is_open=False)]  # timed out before: fine
    row = row_of(events)
    assert (row.workload, row.grants, row.anomalies) == ("latch", 2, 0)
    assert row.clean()


def test_an_awaiter_told_open_before_the_last_count_down_is_flagged() -> None:
    events = [*latch_cycle(1.0), await_("latch1", 1.05, 1.39)]
    row = row_of(events)
    assert row.anomalies == 1
    assert row.anomaly_kind == "open before zero"
    assert row.examples == ["latch1 told open at 1.390; the count could reach zero from 1.400"]


def test_an_await_sent_before_the_set_was_answered_is_not_judged() -> None:
    # sent at 0.95, before the set's reply (1.0): it may have seen the deleted latch
    events = [*latch_cycle(1.0), await_("latch1", 0.95, 1.02)]
    assert row_of(events).anomalies == 0


@pytest.mark.parametrize("deleted_after", [False, True])
def test_a_cycle_whose_set_the_replicas_did_not_acknowledge_is_skipped(deleted_after: bool) -> None:
    # with or without a next cycle (whose delete ends this one) after it
    after = latch_cycle(5.0) if deleted_after else []
    events = [*latch_cycle(1.0, acked=False), *after, await_("latch1", 1.05, 1.2)]
    assert row_of(events).anomalies == 0
    events = [*latch_cycle(1.0, acked=True), *after, await_("latch1", 1.05, 1.2)]
    assert row_of(events).anomalies == 1


def test_a_latch_deleted_before_its_last_count_down_may_open_from_the_delete() -> None:
    events = latch_cycle(1.0, n=4)[:-2] + latch_cycle(
        2.0
    )  # two count-downs, then the next delete at 1.8
    events += [await_("latch1", 1.05, 1.81)]
    assert row_of(events).anomalies == 0
    events += [await_("latch2", 1.05, 1.79)]
    assert row_of(events).anomalies == 1


def test_a_set_never_counted_to_zero_never_opens() -> None:
    # the run ended after two of four count-downs: any open after the set is wrong
    events = [*latch_cycle(1.0)[:-2], await_("latch1", 1.05, 50.0)]
    assert row_of(events).anomalies == 1


@pytest.mark.parametrize("err", ["timeout", "connection", "ConnectionError"])
def test_a_count_down_whose_reply_was_lost_counts_as_sent(err: str) -> None:
    events = latch_cycle(1.0)
    events[-1] |= {"err": err}
    del events[-1]["left"]
    assert row_of([*events, await_("latch1", 1.05, 1.41)]).anomalies == 0


@pytest.mark.parametrize(
    "err", ["READONLY", "NOREPLICAS", "no_master", "connection_refused", "ERR unknown"]
)
def test_a_refused_count_down_does_not_count(err: str) -> None:
    # the fourth count-down (1.4) was refused: it changed nothing, so the fifth (1.5) is the one
    # that could take the count to zero
    events = latch_cycle(1.0, n=4)
    refused = {"ev": "latch_down", "c": "latch0", "w": "latch", "t0": 1.4, "t1": 1.41, "err": err}
    events[-1] = refused
    events.append(
        {"ev": "latch_down", "c": "latch0", "w": "latch", "t0": 1.5, "t1": 1.51, "left": 0}
    )
    assert row_of([*events, await_("latch1", 1.05, 1.51)]).anomalies == 0
    row = row_of([*events, await_("latch1", 1.05, 1.45)])
    assert row.anomalies == 1, "an open before the fourth count-down that counted is not flagged"


# --- liveness and errors -------------------------------------------------------------------


def test_liveness_reports_the_slowest_heal_to_grant_and_the_longest_gap() -> None:
    after, gap, open_ended = checker.liveness([2.0, 5.0, 9.0], [4.0, 8.5], 0.0, 10.0)
    assert after == pytest.approx(1.0)  # 4.0 -> 5.0; 8.5 -> 9.0 is faster
    assert gap == pytest.approx(4.0)  # 5.0 -> 9.0
    assert not open_ended
    # no grant after a heal: it waited until the end, and says so (a lower bound)
    assert checker.liveness([2.0], [4.0], 0.0, 10.0) == (6.0, 8.0, True)
    # a slower heal with a grant outranks a faster one without
    assert checker.liveness([9.5], [1.0, 9.9], 0.0, 10.0) == (8.5, 9.5, False)
    # no heal: nothing to report; no grant at all: the whole run is one gap
    assert checker.liveness([2.0], [], 0.0, 10.0) == (None, 8.0, False)
    assert checker.liveness([], [], 3.0, 10.0) == (None, 7.0, False)
    # grants outside the workload's time are not counted
    assert checker.liveness([-1.0, 11.0], [], 0.0, 10.0) == (None, 10.0, False)


def test_check_reports_liveness_per_workload() -> None:
    events = held("a", 10.0, 11.0) + held("b", 30.0, 31.0)
    row = row_of(events, heals=[20.0], start=0.0, end=40.0)
    assert row.heal_to_grant_s == pytest.approx(10.0)
    assert row.longest_gap_s == pytest.approx(20.0)


def test_a_read_write_locks_gap_counts_its_writers_only() -> None:
    events = held("w", 10.0, 11.0, w="rwlock", side="WRITE")
    for i in range(20):
        events += held(f"r{i}", 12.0 + i, 12.5 + i, w="rwlock", side="READ")
    row = row_of(events, heals=[5.0], start=0.0, end=40.0)
    assert row.longest_gap_s == pytest.approx(30.0)  # the writer's starvation, 10 -> 40
    assert row.heal_to_grant_s == pytest.approx(5.0)


def test_a_latchs_liveness_counts_its_opens() -> None:
    events = [*latch_cycle(1.0), await_("latch1", 1.05, 1.5), await_("latch1", 1.6, 9.0)]
    events += [await_("latch2", 1.6, 3.0, is_open=False)]
    row = row_of(events, heals=[2.0], start=0.0, end=10.0)
    assert row.heal_to_grant_s == pytest.approx(7.0)
    assert row.longest_gap_s == pytest.approx(7.5)


def test_errors_are_counted_by_kind_without_busy_replies() -> None:
    def fail(err: str) -> Event:
        return {"ev": "fail", "c": "a", "w": "lock", "t0": 1.0, "t1": 1.1, "err": err}

    events = [fail("NOREPLICAS"), fail("NOREPLICAS"), fail("busy"), fail("timeout")]
    events += [
        {
            "ev": "release_failed",
            "c": "a",
            "w": "lock",
            "t0": 3.0,
            "t1": 9.0,
            "h": "x",
            "err": "gave_up",
        }
    ]
    events += [
        {
            "ev": "unknown",
            "c": "a",
            "w": "lock",
            "t0": 2.0,
            "t1": 5.0,
            "err": "timeout",
            "req": "r1",
        }
    ]
    events += [
        {
            "ev": "resolve",
            "c": "a",
            "w": "lock",
            "t0": 5.0,
            "t1": 5.1,
            "req": "r1",
            "how": h,
            "reply": r,
        }
        for h, r in [("cancel", "1"), ("cancel", "1"), ("retry", "cancelled")]
    ]
    row = row_of(events)
    assert row.errors == {"NOREPLICAS": 2, "timeout": 1, "release gave_up": 1}
    assert row.unknown == 1
    assert row.resolved == {"cancel:1": 2, "retry:cancelled": 1}
    assert (row.grants, row.anomalies) == (0, 0)


def test_check_makes_one_row_per_workload() -> None:
    events = (
        held("a", 1.0, 2.0, w="lock")
        + held("b", 1.5, 2.5, w="setnx")
        + held("c", 1.5, 2.5, w="lock")
    )
    rows = checker.check(events, meta())
    assert [(r.workload, r.grants, r.anomalies) for r in rows] == [("lock", 2, 1), ("setnx", 1, 0)]


def test_load_skips_a_line_cut_by_a_kill(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"ev": "start", "t0": 1.0}) + "\n\n" + '{"ev": "gra')
    b.write_text(json.dumps({"ev": "stop", "t0": 2.0}) + "\n")
    assert checker.load([a, b]) == [{"ev": "start", "t0": 1.0}, {"ev": "stop", "t0": 2.0}]


# --- randomized nets against brute-force models --------------------------------------------


@dataclass
class Belief:
    """What the generator made a client believe, known from how it built the history."""

    client: str
    h: str
    start: float
    end: float  # end <= start: believed by nobody
    n: int = 1
    side: Optional[str] = None


def lock_timeline(
    rng: random.Random, prefix: str, grants: int, w: str, sides: bool = False
) -> tuple[list[Event], list[Belief], dict[str, float]]:
    """A clean history: the server grants one hold after the other (a write, or a group of
    reads, with ``sides``); each client sees its grant through a network delay and believes
    it until its release, its death or its lease's end, whichever comes first. Returns the
    events, what each client believed, and the deaths."""
    events: list[Event] = []
    beliefs: list[Belief] = []
    deaths: dict[str, float] = {}
    t = rng.uniform(0.0, 1.0)
    serial = 0
    for _ in range(grants):
        side = None
        group = 1
        if sides:
            side = rng.choice(["READ", "WRITE"])
            group = rng.randint(1, 3) if side == "READ" else 1
        server_end = t
        for _ in range(group):
            serial += 1
            g = t + rng.uniform(0.0, 0.02)  # the server grants this hold at g
            lease = rng.choice([500, 1000, 3000])
            t0 = g - rng.uniform(0.0, 0.4)
            t1 = g + rng.uniform(0.0, 0.01)
            c = f"{prefix}{rng.randrange(4)}"
            kind = rng.choice(
                ["release", "release", "release", "lease", "late_release", "death", "late_reply"]
            )
            if kind == "death":
                c = f"{prefix}dead{serial}"  # a killed process never comes back under its id
            h = f"{c}#{serial}"
            cap = t0 + lease / 1000
            token = None if side == "READ" else serial  # reads take no token
            e = grant(c, h, t0, t1, w=w, lease=lease, token=token, side=side)
            if kind == "release":
                rel = t1 + rng.uniform(0.0, 0.05)  # before the lease's end: t0 + 0.5 s at least
                events += [e, release(c, h, rel, w=w)]
                beliefs.append(Belief(c, h, t1, rel, side=side))
                end = rel + rng.uniform(0.0, 0.01)  # the release reaches the server
            elif kind in ("lease", "late_release"):
                events.append(e)
                if kind == "late_release":  # a stalled client releases after its lease ran out
                    events.append(release(c, h, cap + rng.uniform(0.0, 1.0), w=w))
                beliefs.append(Belief(c, h, t1, cap, side=side))
                end = g + lease / 1000  # the server's lease started at g, after t0
            elif kind == "death":
                d = t1 + rng.uniform(0.0, 0.05)
                deaths[c] = d
                events.append(e)
                beliefs.append(Belief(c, h, t1, d, side=side))
                end = d + rng.uniform(0.0, 0.01)  # the session closes after the process dies
            else:  # the reply arrives after the lease the client counts from its send
                t1 = cap + rng.uniform(0.0, 0.5)
                e["t1"] = t1
                events += [e, release(c, h, t1 + 0.01, w=w)]
                beliefs.append(Belief(c, h, t1, cap, side=side))
                end = g + lease / 1000
            server_end = max(server_end, end)
        t = server_end + rng.choice([0.0, rng.uniform(0.0, 0.05)])
    return events, beliefs, deaths


def model_overlaps(beliefs: list[Belief], exclusive: bool = True) -> tuple[int, float]:
    """Pairs of different clients' beliefs that share some time (one a writer, for a
    read-write lock), and the most time any pair shares, in ms."""
    count, worst = 0, 0.0
    for i, a in enumerate(beliefs):
        for b in beliefs[i + 1 :]:
            if a.client == b.client or a.end <= a.start or b.end <= b.start:
                continue
            if not exclusive and "WRITE" not in (a.side, b.side):
                continue
            shared = min(a.end, b.end) - max(a.start, b.start)
            if shared > 0:
                count += 1
                worst = max(worst, shared * 1000)
    return count, worst


def rewrite(events: list[Event], b: Belief, start: float, end: float, w: str) -> None:
    """Makes ``b``'s client believe it held from ``start`` to ``end`` instead."""
    events[:] = [e for e in events if e.get("h") != b.h]
    e = grant(b.client, b.h, start - 0.001, start, w=w, lease=10_000, n=b.n, side=b.side)
    events += [e, release(b.client, b.h, end, w=w)]
    b.start, b.end = start, end


@pytest.mark.parametrize("w", ["lock", "rwlock"])
def test_random_clean_lock_histories_pass_and_one_hold_moved_into_another_is_flagged(
    w: str,
) -> None:
    sides = w == "rwlock"
    moved = 0
    for seed in range(ROUNDS):
        rng = random.Random(seed)
        events, beliefs, deaths = lock_timeline(rng, "c", rng.randint(2, 40), w, sides=sides)
        rng.shuffle(events)
        row = row_of(events, deaths=deaths)
        assert (row.anomalies, row.token_repeats, row.token_order) == (0, 0, 0), (
            seed,
            row.examples,
        )
        assert row.grants == len(beliefs)
        # move one hold (of a client that is not killed) so that it starts inside an earlier
        # one of another client (a writer's, for a read-write lock)
        pairs = [
            (a, b)
            for i, b in enumerate(beliefs)
            if "dead" not in b.client
            for a in beliefs[:i]
            if a.client != b.client
            and a.end > a.start
            and (not sides or "WRITE" in (a.side, b.side))
        ]
        if not pairs:
            continue
        a, b = rng.choice(pairs)
        into = rng.choice([0.001, rng.uniform(0.0, a.end - a.start)])
        start = a.end - min(into, a.end - a.start)
        rewrite(events, b, start, start + rng.uniform(0.0005, 0.2), w)
        want, worst = model_overlaps(beliefs, exclusive=not sides)
        assert want >= 1
        row = row_of(events, deaths=deaths)
        assert row.anomalies == want, (seed, row.examples)
        assert row.worst_ms == pytest.approx(worst)
        moved += 1
    assert moved >= ROUNDS // 2


def model_excess(beliefs: list[Belief], total: int) -> tuple[int, int]:
    """Grants at whose reply the permits believed held (its own included) exceed ``total``,
    and by how many at most."""
    count, worst = 0, 0
    for b in beliefs:
        if b.end <= b.start:
            continue
        now = sum(x.n for x in beliefs if x.start <= b.start < x.end and x.end > x.start)
        if now > total:
            count += 1
            worst = max(worst, now - total)
    return count, worst


def test_random_clean_permit_histories_pass_and_one_permit_more_is_flagged() -> None:
    flagged = 0
    for seed in range(ROUNDS):
        rng = random.Random(seed)
        total = rng.randint(1, 4)
        events: list[Event] = []
        beliefs: list[Belief] = []
        deaths: dict[str, float] = {}
        for slot in range(total):  # each permit is handed from client to client, never shared
            evs, bs, ds = lock_timeline(rng, f"p{slot}c", rng.randint(2, 30), "sem")
            events += evs
            beliefs += bs
            deaths.update(ds)
        for e in events:
            e["token"] = None
        rng.shuffle(events)
        row = row_of(events, deaths=deaths, totals={"sem": total})
        assert row.anomalies == 0, (seed, row.examples)
        assert row.grants == len(beliefs)
        # one client more takes a permit when all of them are believed held
        full = [
            b.start + 1e-6
            for b in beliefs
            if sum(1 for x in beliefs if x.start <= b.start + 1e-6 < x.end and x.end > x.start)
            == total
        ]
        if not full:
            continue
        start = rng.choice(full)
        extra = Belief("extra", "extra#1", 0.0, 0.0)
        beliefs.append(extra)
        rewrite(events, extra, start, start + rng.uniform(0.0005, 0.2), "sem")
        want, worst = model_excess(beliefs, total)
        assert want >= 1
        row = row_of(events, deaths=deaths, totals={"sem": total})
        assert (row.anomalies, row.worst_ms) == (want, worst), (seed, row.examples)
        flagged += 1
    assert flagged >= ROUNDS // 3


def model_tokens(grants: list[Event]) -> tuple[int, int]:
    repeats = sum(c - 1 for c in Counter(e["token"] for e in grants).values())
    order = sum(
        1
        for h in grants
        if any(g is not h and g["t1"] < h["t0"] and g["token"] >= h["token"] for g in grants)
    )
    return repeats, order


def test_random_token_histories_pass_and_a_swap_or_a_repeat_is_flagged_when_it_is_certain() -> None:
    flagged = 0
    for seed in range(ROUNDS):
        rng = random.Random(seed)
        # the server grants in the order of g, with growing tokens; requests and replies
        # travel for up to a second, so many grants are concurrent
        grants: list[Event] = []
        g, tok = 0.0, 0
        for i in range(rng.randint(2, 40)):
            g += rng.uniform(0.0, 0.3)
            tok += rng.randint(1, 3)
            t0, t1 = g - rng.uniform(0.0, 1.0), g + rng.uniform(0.0, 1.0)
            grants.append(grant(f"c{i % 5}", f"h{i}", t0, t1, lease=10_000, token=tok))
        row = row_of(grants)
        assert (row.token_repeats, row.token_order) == (0, 0), (seed, row.examples)
        i, j = rng.sample(range(len(grants)), 2)
        if rng.random() < 0.5:
            grants[i]["token"], grants[j]["token"] = grants[j]["token"], grants[i]["token"]
        else:
            grants[j]["token"] = grants[i]["token"]
        want = model_tokens(grants)
        row = row_of(grants)
        assert (row.token_repeats, row.token_order) == want, seed
        flagged += want != (0, 0)
    assert flagged >= ROUNDS // 3
