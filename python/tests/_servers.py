"""Real servers for the tests: redis-server (or $REDIS_SERVER) with the built module, on a
free loopback port, in a temporary directory, started within a bound, killed on teardown; and
the readers the tests share (``poll``, ``apoll``, ``info``, blocked clients, session holds), and
``raise_once_here``, the interrupt the tests inject."""

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
