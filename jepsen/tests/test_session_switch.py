"""A session hold granted by the call that moves its client to a new master (the Sentinel
now names another server) is counted from its grant: ``Master.conn()`` closes the old
connection before it sends the acquire on the new one, and that drop must not end the new
hold's belief (it did, dated before the grant's reply, and the checker then dropped the hold:
a split brain right after a switch went unreported). Real servers and a real Sentinel, no
namespaces."""

from __future__ import annotations

import io
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))

from _servers import Server, poll  # type: ignore[import-not-found]

from rjepsen import checker, client


def ctx_for(sentinel: Server, cid: str, out: io.StringIO) -> client.Ctx:
    master = client.Master(
        sentinels=[("127.0.0.1", sentinel.port)], cluster_seeds=[], timeout=3.0, key="session"
    )
    spec = {"workload": "session", "run": "review", "replicas": 0}
    return client.Ctx(spec, master, out, random.Random(1), cid, "session", time.monotonic() + 60)


def session_once(ctx: client.Ctx, hold: float) -> None:
    client.acquire_once(
        ctx,
        lambda req: [
            *("RLOCK.ACQUIRE", "session", client.owner(ctx, req), client.LEASE),
            *("WAIT", client.WAIT, "TOKEN", "REQUEST", req, "GT", "SESSION"),
        ],
        lambda r: client.token_of(r) is not None,
        client.token_of,
        lambda _r, req: ["RLOCK.RELEASE", "session", client.owner(ctx, req), "REQUEST", req],
        hold=(hold, hold),
        session=True,
    )


def events(*outs: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for o in outs for line in o.getvalue().splitlines()]


def test_a_split_brain_right_after_a_session_client_moves_to_a_new_master_is_reported() -> None:
    a, b = Server(), Server()
    s = Server(module=False, sentinel_conf=f"sentinel monitor mymaster 127.0.0.1 {a.port} 1\n")
    try:
        ox, oy = io.StringIO(), io.StringIO()
        x, y = ctx_for(s, "session0", ox), ctx_for(s, "session1", oy)
        y.master.call("PING")  # y is connected to a (the Sentinel's master now)
        # x holds the lock on a (an old master that does not know it was replaced) for 2 s
        tx = threading.Thread(target=session_once, args=(x, 2.0))
        tx.start()
        poll("x granted on a", 3.0, lambda: any(e["ev"] == "grant" for e in events(ox)))
        # the Sentinel now names b (a failover x has not noticed yet)
        sc = s.client()
        sc.execute_command("SENTINEL", "REMOVE", "mymaster")
        sc.execute_command("SENTINEL", "MONITOR", "mymaster", "127.0.0.1", b.port, 1)
        time.sleep(1.1)  # y asks the Sentinels again at its next call
        session_once(y, 0.3)  # y's acquire moves it to b, where the lock is free: granted
        tx.join()
        evs = events(ox, oy)
        for e in evs:
            print(e)
        gy = next(e for e in evs if e["ev"] == "grant" and e["c"] == "session1")
        ry = next(e for e in evs if e["ev"] == "release" and e["h"] == gy["h"])
        holds = checker.holds_of(evs, {})
        # both clients held the lock at once (two masters): the checker must say so
        count, _worst, ex = checker.mutual_exclusion(holds)
        print("y grant t1", gy["t1"], "y release t0", ry["t0"], "overlaps", count, ex)
        assert count == 1, (
            f"split brain not reported: y's release is dated {ry['t0']:.3f}, "
            f"before its grant's reply {gy['t1']:.3f} (the drop came before the send)"
        )
    finally:
        for srv in (s, a, b):
            srv.close()
