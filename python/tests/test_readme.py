"""Every Python example of python/README.md, README.md and docs/*.md, run as written.

Each fenced ``python`` block is run on its own in a fresh interpreter (a newcomer copies one
block at a time), against a test server: the only change made to the text is `make run`'s port,
6390, replaced by the test server's. A block must therefore be self-contained (its imports and
its client) and connect to port 6390, run without an error or any output on stderr, and leave
nothing held. A block that opens a ``RedisCluster`` connects to port 7000 instead, and runs
against a 3-master cluster this module starts (port 7000 replaced by one of its nodes').
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from _servers import ROOT, Server

MAKE_RUN_PORT = "6390"
CLUSTER_PORT = "7000"


def _blocks(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    rel = path.relative_to(ROOT)
    return [(f"{rel}#{i + 1}", code) for i, code in enumerate(blocks)]


PAGES = [ROOT / "python" / "README.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ALL = [block for page in PAGES for block in _blocks(page)]
BLOCKS = [(name, code) for name, code in ALL if "RedisCluster(" not in code]
CLUSTER_BLOCKS = [(name, code) for name, code in ALL if "RedisCluster(" in code]


def test_the_pages_have_python_examples() -> None:
    names = [name for name, _ in ALL]
    assert sum(n.startswith("python/README.md") for n in names) >= 3, names
    assert sum(n.startswith("README.md") for n in names) >= 1, names
    assert sum(n.startswith("docs/clients.md") for n in names) >= 3, names
    assert CLUSTER_BLOCKS, names


def _held(r: redis.Redis) -> dict[bytes, object]:
    """Every lock hash (a held lock or read-write lock) and leased-permit zset on the server."""
    held: dict[bytes, object] = {}
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        if kind == b"hash":
            held[key] = r.hgetall(key)
        elif kind == b"zset":
            held[key] = r.zrange(key, 0, -1)
    return held


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_readme_example_runs_as_written(
    server: Server, r: redis.Redis, name: str, code: str
) -> None:
    if sys.version_info < (3, 11) and "asyncio.timeout(" in code:
        pytest.skip("asyncio.timeout needs Python 3.11")
    assert MAKE_RUN_PORT in code, f"{name} does not connect to `make run`'s port {MAKE_RUN_PORT}"
    _run(name, code.replace(MAKE_RUN_PORT, str(server.port)), server.dir)
    assert _held(r) == {}, f"{name} left holds behind"


def _run(name: str, code: str, cwd: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python" / "src"))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", (
        f"{name} failed (exit {done.returncode}):\n{done.stderr}\n--- code ---\n{code}"
    )


@pytest.mark.parametrize(("name", "code"), CLUSTER_BLOCKS, ids=[n for n, _ in CLUSTER_BLOCKS])
def test_cluster_example_runs_as_written(
    request: pytest.FixtureRequest, name: str, code: str
) -> None:
    nodes: list[Server] = request.getfixturevalue("cluster")
    assert CLUSTER_PORT in code, f"{name} does not connect to port {CLUSTER_PORT}"
    _run(name, code.replace(CLUSTER_PORT, str(nodes[0].port)), nodes[0].dir)
    for node in nodes:
        c = node.client()
        try:
            assert _held(c) == {}, f"{name} left holds behind on port {node.port}"
        finally:
            c.close()
