"""The enqueue profile of BENCHMARKS.md ("Enqueue with deadlock detection"): redis-server under
callgrind with MODULE loaded; N (default 200) clients queue RLOCK.ACQUIRE ... WAIT behind one
holder, 10 more are parked on 10 other locks held by a keeper (MODE nowhere: as owners of their
own; elsewhere: the lock's holder is one of them; none: no parked clients); HANDOFF=1 then hands
the lock down the queue. Read the result with
`callgrind_annotate --inclusive=yes OUTFILE | grep 'rlock::commands::acquire '`.

usage: enqueue_callgrind.py MODULE nowhere|elsewhere|none OUTFILE"""

import os
import socket
import subprocess
import sys
import tempfile
import time

module, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(os.environ.get("N", "200"))
d = tempfile.mkdtemp()
port = 30000 + os.getpid() % 20000
args = [
    "valgrind",
    "--tool=callgrind",
    f"--callgrind-out-file={out}",
    "--dump-instr=no",
    "redis-server",
    "--port",
    str(port),
    "--save",
    "",
    "--appendonly",
    "no",
    "--dir",
    d,
    "--loadmodule",
    module,
]
srv = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cmd(*a):
    b = f"*{len(a)}\r\n".encode()
    for x in a:
        x = str(x).encode()
        b += f"${len(x)}\r\n".encode() + x + b"\r\n"
    return b


def conn():
    for _ in range(600):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.1)
    raise SystemExit("no server")


c = conn()


def call(*a):
    c.sendall(cmd(*a))
    return c.recv(65536)


for _ in range(100):
    if call("PING").startswith(b"+PONG"):
        break
    time.sleep(0.1)
socks = []


def park(*a):
    s = conn()
    s.sendall(cmd(*a))
    socks.append(s)


P = 10
for i in range(P):
    call("RLOCK.ACQUIRE", f"K{i}", "keeper", 10000000)
call("RLOCK.ACQUIRE", "L", "h", 10000000)
if mode == "nowhere":
    for i in range(P):
        park("RLOCK.ACQUIRE", f"K{i}", f"p{i}", 10000000, "WAIT", 10000000)
elif mode == "elsewhere":
    park("RLOCK.ACQUIRE", "K0", "h", 10000000, "WAIT", 10000000)
    for i in range(1, P):
        park("RLOCK.ACQUIRE", f"K{i}", f"p{i}", 10000000, "WAIT", 10000000)
time.sleep(1)
for j in range(N):
    park("RLOCK.ACQUIRE", "L", f"w{j}", 10000000, "WAIT", 10000000)
    if j % 20 == 19:
        call("PING")
call("PING")
if os.environ.get("HANDOFF"):
    holder = "h"
    for j in range(N):
        call("RLOCK.RELEASE", "L", holder)
        holder = f"w{j}"
    call("PING")
print(call("RLOCK.INFO", "L")[:200])
call("SHUTDOWN", "NOSAVE")
srv.wait()
