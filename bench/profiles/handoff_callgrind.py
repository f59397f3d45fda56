"""The hand-off profile of BENCHMARKS.md ("Hand-off against the floor module"): redis-server
under callgrind with rlock (MODULE) and the floor module (FLOOR) loaded; N (default 200)
clients queue behind one holder, then the main connection hands the lock (or the turn) down the
whole queue, one call per hand-off:
  rlock:     RLOCK.ACQUIRE L w<j> ... WAIT 0, then RLOCK.RELEASE L <holder> N times
  floor:     FLOOR.BLOCK F 0, then FLOOR.UNBLOCK F N times (RedisModule_UnblockClient)
  floorkeys: FLOOR.BLOCKK F 0 on an existing key, then FLOOR.SIGNAL F N times
Read the result with `callgrind_annotate --inclusive=yes OUTFILE`, e.g. the handlers
`rlock::commands::release`, `rlock_floor::wait::unblock`, and the server's
`moduleHandleBlockedClients` (the woken clients' replies) and `call`.

usage: handoff_callgrind.py MODULE FLOOR rlock|floor|floorkeys OUTFILE"""

import os
import sys

from _callgrind import Server

module, floor, mode, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
N = int(os.environ.get("N", "200"))
server = Server(out, [module, floor])
call, park = server.call, server.park


if mode == "rlock":
    call("RLOCK.ACQUIRE", "L", "h", 10000000)
    for j in range(N):
        park("RLOCK.ACQUIRE", "L", f"w{j}", 10000000, "WAIT", 0)
else:
    call("SET", "F", "1")
    for _ in range(N):
        park("FLOOR.BLOCK" if mode == "floor" else "FLOOR.BLOCKK", "F", 0)
server.wait_blocked(N)
holder = "h"
for j in range(N):
    if mode == "rlock":
        call("RLOCK.RELEASE", "L", holder)
        holder = f"w{j}"
    else:
        call("FLOOR.UNBLOCK" if mode == "floor" else "FLOOR.SIGNAL", "F")
for s in server.socks:
    s.settimeout(60)
    s.recv(100)
print(call("INFO", "commandstats")[:600])
server.shutdown()
