"""Real servers for the tests: redis-server (or $REDIS_SERVER) with the built module, on a
free loopback port, in a temporary directory, started within a bound, killed on teardown; and
the readers the tests share (``poll``, ``apoll``, ``info``, blocked clients, session holds),
``raise_once_here``, the interrupt the tests inject, an ACL user whose releases the server
refuses, and ``cluster_of``, a Redis Cluster of them."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 20.0
#: seconds within which what should happen "at once" must have happened
PROMPT = 3.0


def module_path() -> Path:
    return Path(os.environ.get("RLOCK_MODULE", ROOT / "target" / "release" / "librlock.so"))


def server_binary() -> str:
    return os.environ.get("REDIS_SERVER", "redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(what: str, timeout: float, cond: Callable[[], bool], step: float = 0.01) -> None:
    """Waits until ``cond()`` is true, at most ``timeout`` s (then fails, naming ``what``)."""
    end = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except Exception:
            pass
        if time.monotonic() >= end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


async def apoll(what: str, timeout: float, cond: Callable[..., Any]) -> None:
    """``poll`` for asyncio tests: ``cond()`` may return a coroutine (awaited), and the wait
    is an ``asyncio.sleep``, so the test's tasks run meanwhile."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Server:
    """One redis-server process owned by a test."""

    def __init__(self, *args: str, module: bool = True, sentinel_conf: Optional[str] = None):
        self.dir = tempfile.mkdtemp(prefix="rlock-py-")
        self.args = list(args)
        self.module = module
        self.sentinel_conf = sentinel_conf
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.port = 0
        self.start()

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "redis.log")

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def start(self, port: Optional[int] = None) -> None:
        for _ in range(5):
            self.port = port or free_port()
            if self.sentinel_conf is not None:
                conf = os.path.join(self.dir, "sentinel.conf")
                Path(conf).write_text(
                    f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\n"
                    f"logfile {self.log_path}\n" + self.sentinel_conf
                )
                cmd = [server_binary(), conf, "--sentinel"]
            else:
                cmd = [
                    server_binary(),
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                    "--dir",
                    self.dir,
                    "--logfile",
                    self.log_path,
                    "--enable-debug-command",
                    "yes",
                    "--repl-diskless-sync-delay",
                    "0",
                ]
                if self.module:
                    if not module_path().exists():
                        raise RuntimeError(
                            f"{module_path()} is missing: cargo build --release -p rlock"
                        )
                    cmd += ["--loadmodule", str(module_path())]
                cmd += self.args
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            end = time.monotonic() + START_TIMEOUT
            while time.monotonic() < end and self.proc.poll() is None:
                try:
                    if redis.Redis(port=self.port, socket_timeout=1).ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
            self.kill()
            if port:
                break
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10, **kw)  # type: ignore[arg-type]

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart_same_port(self) -> None:
        self.kill()
        self.start(self.port)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def session_holds(r: redis.Redis) -> int:
    """The session holds the server has now (``INFO rlock``)."""
    return int(r.info("rlock")["rlock_session_holds"])


def blocked_clients(r: redis.Redis) -> int:
    """The clients blocked in the server now (``INFO clients``)."""
    return int(r.info("clients")["blocked_clients"])


def info(r: redis.Redis, name: object, cmd: str = "RLOCK.INFO") -> dict[str, object]:
    """``*.INFO`` as a dict with str keys (RESP2 or RESP3), {} when absent."""
    reply = r.execute_command(cmd, name)
    if reply is None:
        return {}
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        it = iter(reply)
        items = list(zip(it, it))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in items}


def user_who_cannot_release(admin: redis.Redis) -> str:
    """Makes the ACL user ``half`` (any password), who may take locks named ``ok:*`` (it may
    write their keys and its request records) but whose releases the server refuses (it may
    not publish on the unlock channel nor write the latch). Returns its name."""
    admin.execute_command(
        "ACL", "SETUSER", "half", "on", "nopass", "+@all", "~ok:*", "~rlock_request:*"
    )
    return "half"


def let_release(admin: redis.Redis, user: str) -> None:
    """Gives ``user`` every key and channel: its releases go through again."""
    admin.execute_command("ACL", "SETUSER", user, "&*", "~*")


def _here() -> tuple[int, Optional[asyncio.Task[Any]]]:
    """The calling thread and, under a running event loop, its task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), task


def raise_once_here(
    monkeypatch: pytest.MonkeyPatch, target: Any, name: str, exc: BaseException
) -> None:
    """Swaps ``target.name`` (a method of an object, or of a class) for one whose next call
    from the caller's own thread, and task under asyncio, raises ``exc`` instead, once: an
    interrupt landing there. Calls from anywhere else (a session's watcher pinging, the
    watchdog renewing, the releaser) go to the real one, so they can never take the interrupt
    meant for the test (and leave the test's own call uninterrupted). Undone at teardown."""
    real = getattr(target, name)
    here = _here()
    fired: list[bool] = []

    def swapped(*args: Any, **kwargs: Any) -> Any:
        if not fired and _here() == here:
            fired.append(True)
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, swapped)


# -- a Redis Cluster of such servers -------------------------------------------------------


def cli() -> list[str]:
    return [os.environ.get("REDIS_CLI", "redis-cli")]


def cluster_rows(node: Server) -> list[list[str]]:
    """``CLUSTER NODES`` as node ``node`` sees it: id, address, flags, master id, ..."""
    text = node.client().execute_command("CLUSTER", "NODES")
    text = text.decode() if isinstance(text, bytes) else text
    return [line.split() for line in text.splitlines() if line.strip()]


def cluster_of(request: Any, replicas: int) -> Iterator[list[Server]]:
    """Three masters with ``replicas`` replicas each (node timeout 2 s), healthy: every node
    sees all of them, none failed, every replica's link up. Prints their logs when the test
    (``request``) failed, and stops them."""
    nodes = [
        Server(
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        )
        for _ in range(3 * (1 + replicas))
    ]
    try:
        out = subprocess.run(
            [
                *cli(),
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in nodes],
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()

        def healthy() -> bool:
            for n in nodes:
                info = n.client().execute_command("CLUSTER", "INFO")
                info = info.decode() if isinstance(info, bytes) else info
                rows = cluster_rows(n)
                if "cluster_state:ok" not in info or len(rows) != len(nodes):
                    return False
                if any("fail" in r[2] for r in rows):
                    return False
                if sum("slave" in r[2] for r in rows) != 3 * replicas:
                    return False
                repl = n.client().info("replication")
                if repl["role"] == "master" and repl.get("connected_slaves", 0) != replicas:
                    return False
                if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                    return False
            return True

        poll("the cluster with its replicas", 30.0, healthy, step=0.05)
        yield nodes
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            for n in nodes:
                print(f"----- log (port {n.port}) -----\n{n.log()[-3000:]}")
    finally:
        for n in nodes:
            n.close()
