"""The latch release profile (issue 29): redis-server under callgrind with rlock (MODULE); N
(default 1000) clients block in `RLATCH.AWAIT batch 0`, then one `RLATCH.COUNTDOWN batch` opens
the latch and answers them all. Read the result with `callgrind_annotate --inclusive=yes
OUTFILE`: the handler `rlock::commands::latch::count_down` (the broadcast: every awaiter
considered and unblocked) and the server's `moduleHandleBlockedClients` (their replies).

usage: latch_callgrind.py MODULE OUTFILE"""

import os
import sys

from _callgrind import Server

module, out = sys.argv[1], sys.argv[2]
N = int(os.environ.get("N", "1000"))
server = Server(out, [module])
call = server.call
call("RLATCH.SETCOUNT", "batch", 1)
for _ in range(N):
    server.park("RLATCH.AWAIT", "batch", 0)
server.wait_blocked(N)
server.zero()
call("RLATCH.COUNTDOWN", "batch")
for s in server.socks:
    s.settimeout(60)
    assert s.recv(100) == b":1\r\n"
server.shutdown()
