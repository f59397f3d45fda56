"""What the profile scripts share: a redis-server under callgrind with modules loaded, and raw
RESP connections to it (nothing from PyPI: the scripts run with the system Python)."""

import os
import socket
import subprocess
import tempfile
import time


class Server:
    """redis-server under `valgrind --tool=callgrind`, writing its profile to `out`, with
    `modules` loaded; a control connection (`call`) and clients left waiting (`park`)."""

    def __init__(self, out: str, modules: list[str], aof: bool = False) -> None:
        self.port = 30000 + os.getpid() % 20000
        args = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--dump-instr=no",
        ]
        args += [
            "redis-server",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "yes" if aof else "no",
            "--appendfsync",
            "no",
        ]
        args += ["--dir", tempfile.mkdtemp()]
        for module in modules:
            args += ["--loadmodule", module]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.socks: list[socket.socket] = []
        self.control = self.connect()
        for _ in range(100):
            if self.call("PING").startswith(b"+PONG"):
                break
            time.sleep(0.1)

    def connect(self) -> socket.socket:
        """A new connection, once the server listens (a bounded wait: valgrind starts slowly)."""
        for _ in range(600):
            try:
                return socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                time.sleep(0.1)
        raise SystemExit("no server")

    def call(self, *args: object) -> bytes:
        """Sends a command on the control connection; its reply's first bytes."""
        self.control.sendall(encode(*args))
        return self.control.recv(65536)

    def park(self, *args: object) -> None:
        """Sends a command on a new connection without reading its reply (a waiter)."""
        s = self.connect()
        s.sendall(encode(*args))
        self.socks.append(s)

    def wait_blocked(self, n: int) -> None:
        """Waits (bounded) until `n` clients are blocked."""
        for _ in range(6000):
            info = self.call("INFO", "clients").decode()
            if int(info.split("blocked_clients:")[1].split()[0]) >= n:
                return
            time.sleep(0.01)
        raise SystemExit(f"fewer than {n} clients blocked")

    def zero(self) -> None:
        """Zeroes the profile's counters (what came before, a set-up, is left out of it)."""
        subprocess.run(
            ["callgrind_control", "-z", str(self.proc.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def shutdown(self) -> None:
        """Ends the server (the profile is written then)."""
        self.call("SHUTDOWN", "NOSAVE")
        self.proc.wait()


def encode(*args: object) -> bytes:
    """A command in RESP."""
    out = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = str(arg).encode()
        out += f"${len(data)}\r\n".encode() + data + b"\r\n"
    return out
