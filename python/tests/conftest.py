from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from _ha import Group, group
from _servers import Server, cluster_of

sys.path.insert(0, __import__("os").path.dirname(__file__))


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _print_logs(request: Any, servers: list[Server]) -> None:
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for s in servers:
            print(f"----- server log (port {s.port}) -----\n{s.log()[-6000:]}")


@pytest.fixture
def server(request: Any) -> Iterator[Server]:
    s = Server()
    yield s
    _print_logs(request, [s])
    s.close()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


@pytest.fixture
async def ar(server: Server) -> AsyncIterator[aredis.Redis]:
    """A redis.asyncio client of the test's server."""
    c = aredis.Redis(port=server.port, socket_timeout=10)
    yield c
    await c.aclose()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line in the format CI sums (cargo's), so the totals include the Python suites."""
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    status = "ok" if failed == 0 else "FAILED"
    terminalreporter.write_line(
        f"test result: {status}. {passed} passed; {failed} failed; {skipped} ignored; "
        "0 measured; 0 filtered out (python)"
    )


@pytest.fixture
def quick_group(request: Any) -> Iterator[Group]:
    """A Sentinel group that fails over a master silent for about two seconds."""
    yield from group(request, 1000)


@pytest.fixture
def manual_group(request: Any) -> Iterator[Group]:
    """A Sentinel group that fails over only when asked (``SENTINEL FAILOVER``)."""
    yield from group(request, 5000)


@pytest.fixture
def paused(server: Server) -> Iterator[Server]:
    """The test's server, resumed at teardown (a test stops it with ``server.pause()``)."""
    yield server
    server.resume()


@pytest.fixture(scope="module")
def cluster(request: Any) -> Iterator[list[Server]]:
    """A Redis Cluster of three masters, no replicas, shared by a module's tests."""
    yield from cluster_of(request, 0)
