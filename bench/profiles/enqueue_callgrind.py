"""The enqueue profile of BENCHMARKS.md ("Enqueue with deadlock detection"): redis-server under
callgrind with MODULE loaded; N (default 200) clients queue RLOCK.ACQUIRE ... WAIT behind one
holder, 10 more are parked on 10 other locks held by a keeper (MODE nowhere: as owners of their
own; elsewhere: the lock's holder is one of them; none: no parked clients); HANDOFF=1 then hands
the lock down the queue. Read the result with
`callgrind_annotate --inclusive=yes OUTFILE | grep 'rlock::commands::acquire '`.

usage: enqueue_callgrind.py MODULE nowhere|elsewhere|none OUTFILE"""

import os
import sys

from _callgrind import Server

module, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(os.environ.get("N", "200"))
server = Server(out, [module])
call, park = server.call, server.park

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
server.wait_blocked(len(server.socks))
for j in range(N):
    park("RLOCK.ACQUIRE", "L", f"w{j}", 10000000, "WAIT", 10000000)
    if j % 20 == 19:
        call("PING")
server.wait_blocked(len(server.socks))
if os.environ.get("HANDOFF"):
    holder = "h"
    for j in range(N):
        call("RLOCK.RELEASE", "L", holder)
        holder = f"w{j}"
    call("PING")
print(call("RLOCK.INFO", "L")[:200])
server.shutdown()
