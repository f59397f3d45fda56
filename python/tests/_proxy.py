"""A TCP proxy for the tests: forwards a loopback port to a server until ``cut()``, after which
every connection open then (and any opened before ``heal()``) is a black hole: bytes are read
and dropped both ways, nothing is closed or reset (a host gone, a cut link). ``heal()`` lets new
connections through again; the cut ones stay dead, as after a link whose state was lost.

``hold()`` holds back the bytes of every connection open then, both ways, until the test lets
one direction of one connection go (``release_to_server``, ``release``) or closes it
(``sever``): an interleaving of replies and commands across connections, the same every run."""

from __future__ import annotations

import random
import selectors
import socket
import threading


class Proxy:
    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._cut = False
        self._socks: list[socket.socket] = []
        #: (client, server) of every connection, in the order accepted: its id is its index
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        #: bytes held back per socket they are for, while that direction is held
        self._held: dict[socket.socket, bytearray] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="test-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Stops forwarding silently, on every connection open now and new ones."""
        with self._lock:
            self._cut = True
            for s in self._socks:
                try:
                    self._sel.get_key(s).data[1] = True  # this pair is dead for good
                except KeyError:
                    pass

    def heal(self) -> None:
        """New connections are forwarded again (the cut ones stay dead)."""
        with self._lock:
            self._cut = False

    def retarget(self, port: int) -> None:
        """New connections go to ``port`` from now on (open ones stay where they are)."""
        with self._lock:
            self._target = port

    def hold(self) -> list[int]:
        """Holds back the bytes of every connection open now, both ways, until released or
        severed; returns their ids in the order accepted (the newest last)."""
        with self._lock:
            for pair in self._pairs:
                for s in pair:
                    self._held.setdefault(s, bytearray())
            return list(range(len(self._pairs)))

    def held_from_client(self, i: int) -> int:
        """How many bytes the client sent on connection ``i`` that are held back."""
        with self._lock:
            return len(self._held.get(self._pairs[i][1], b""))

    def release_to_server(self, i: int) -> None:
        """Passes on what the client sent on connection ``i``, and forwards it from then on
        (the server's bytes stay held)."""
        self._release(self._pairs[i][1])

    def release(self, i: int) -> None:
        """Passes on what connection ``i`` held, both ways, and forwards it from then on."""
        for s in self._pairs[i]:
            self._release(s)

    def sever(self, i: int) -> None:
        """Closes connection ``i`` at both ends, dropping what it held: the client sees its
        connection closed (a reply it waits for never comes)."""
        with self._lock:
            for s in self._pairs[i]:
                self._held[s] = bytearray()  # nothing more passes
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _release(self, to: socket.socket) -> None:
        with self._lock:
            data = self._held.pop(to, None)
            if data:
                try:
                    to.sendall(data)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        for s in [self._listener, *self._socks]:
            s.close()

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(0.05):
                if key.data is None:
                    self._accept()
                    continue
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                peer, dead = key.data
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    with self._lock:
                        if dead:  # nothing is passed on, not even a close
                            self._sel.unregister(sock)
                            continue
                        for s in (sock, peer):  # a real close is passed on while forwarding
                            if s in self._socks:
                                self._sel.unregister(s)
                                self._socks.remove(s)
                                s.close()
                    continue
                if not dead:
                    with self._lock:  # a release's flush and later bytes keep their order
                        held = self._held.get(peer)
                        if held is not None:
                            held += data
                            continue
                        try:
                            peer.sendall(data)
                        except OSError:
                            pass

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        with self._lock:
            target = self._target
        try:
            server = socket.create_connection(("127.0.0.1", target))
        except OSError:
            client.close()  # nothing listens there (a killed server): refused, as it would be
            return
        with self._lock:
            # one shared flag per pair: [peer, dead]
            a, b = [server, self._cut], [client, self._cut]
            self._sel.register(client, selectors.EVENT_READ, a)
            self._sel.register(server, selectors.EVENT_READ, b)
            self._socks += [client, server]
            self._pairs.append((client, server))


class SlowProxy:
    """A TCP proxy that passes every byte on ``delay`` seconds after it arrived, both ways (a
    distant server: a slow link, not a dead one); with probability ``spikes`` a chunk waits
    ``spike`` seconds more (bytes stay in order on each connection: those behind it wait too;
    two connections overtake each other). A thread
    per direction per connection."""

    def __init__(
        self, target_port: int, delay: float, spike: float = 0.0, spikes: float = 0.0
    ) -> None:
        self._target, self._delay = target_port, delay
        self._spike, self._spikes = spike, spikes
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, name="slow-proxy", daemon=True).start()

    def close(self) -> None:
        for s in [self._listener, *self._socks]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()  # nothing listens there any more: refused, as it would be
                continue
            self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        import queue
        import time

        q: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def out() -> None:
            while True:
                at, data = q.get()
                time.sleep(max(0.0, at - time.monotonic()))
                try:
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=out, daemon=True).start()
        last = 0.0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            last = max(
                last,
                time.monotonic()
                + self._delay
                + (self._spike if random.random() < self._spikes else 0),
            )
            q.put((last, data))
            if not data:
                return
