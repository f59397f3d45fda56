"""A fork while the package's threads run: the child's ``threading`` stays consistent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from _servers import Server


def test_a_fork_with_the_watchdog_alive_leaves_threading_consistent_in_the_child(
    server: Server,
) -> None:
    """The package's threads carry a ``Flag`` as their ``_started`` (``_flag.py``); CPython's
    ``threading._after_fork`` calls ``_at_fork_reinit`` on it. Without that method it raised
    AttributeError in every forked child and stopped half-way, leaving the parent's watchdog
    listed as alive in the child."""
    code = textwrap.dedent(
        f"""
        import os, threading, redis, redis_rlock as rl
        r = redis.Redis(port={server.port})
        lk = rl.Lock(r, 'fork:lock')
        assert lk.acquire()
        assert any(t.name == 'redis-rlock-watchdog' for t in threading.enumerate())
        pid = os.fork()
        if pid == 0:
            names = [t.name for t in threading.enumerate()]
            os.write(1, ("CHILD " + repr(names) + "\\n").encode())
            os._exit(0)
        os.waitpid(pid, 0)
        lk.release()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "AttributeError" not in out.stderr, out.stderr
    assert "CHILD" in out.stdout, out.stdout
    assert "redis-rlock-watchdog" not in out.stdout, out.stdout
