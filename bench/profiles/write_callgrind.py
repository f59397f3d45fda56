"""The AOF-on write profile of BENCHMARKS.md ("AOF on: rlock's writes against the floor
module's"): redis-server under callgrind with `appendonly yes` (`appendfsync no`, as section 1),
rlock (MODULE) and the floor module (FLOOR) loaded; a set-up, then the counters are zeroed and N
(default 2000) calls of one kind are made, one at a time:
  acquire:   RLOCK.ACQUIRE l:<i> o 60000         (a fresh key)
  reenter:   RLOCK.ACQUIRE held o 60000          (held by o)
  release:   RLOCK.RELEASE l:<i> o               (held once by o: freed, published)
  hset:      FLOOR.HSET f:<i> o 1 60000          (a fresh key)
  hset-held: FLOOR.HSET held o 1 60000
  hdel:      FLOOR.HDEL f:<i> o <channel> 0      (the key deleted, published)
Read the result with `callgrind_annotate --inclusive=yes OUTFILE`: `processCommand` (the
command with its propagation to the AOF buffer), the handlers `rlock::commands::acquire` /
`release` and `rlock_floor::write::*`, `RM_Replicate`, `feedAppendOnlyFile`.

usage: write_callgrind.py MODULE FLOOR MODE OUTFILE"""

import os
import sys

from _callgrind import Server

module, floor, mode, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
N = int(os.environ.get("N", "2000"))
server = Server(out, [module, floor], aof=True)
call = server.call

if mode == "reenter":
    call("RLOCK.ACQUIRE", "held", "o", 60000)
elif mode == "release":
    for i in range(N):
        call("RLOCK.ACQUIRE", f"l:{i}", "o", 60000)
elif mode == "hset-held":
    call("FLOOR.HSET", "held", "o", 1, 60000)
elif mode == "hdel":
    for i in range(N):
        call("FLOOR.HSET", f"f:{i}", "o", 1, 60000)
server.zero()


def command(i: int) -> tuple[object, ...]:
    """The measured call number `i`."""
    return {
        "acquire": ("RLOCK.ACQUIRE", f"l:{i}", "o", 60000),
        "reenter": ("RLOCK.ACQUIRE", "held", "o", 60000),
        "release": ("RLOCK.RELEASE", f"l:{i}", "o"),
        "hset": ("FLOOR.HSET", f"f:{i}", "o", 1, 60000),
        "hset-held": ("FLOOR.HSET", "held", "o", 1, 60000),
        "hdel": ("FLOOR.HDEL", f"f:{i}", "o", f"redisson_lock__channel:{{f:{i}}}", 0),
    }[mode]


for i in range(N):
    reply = call(*command(i))
    assert not reply.startswith(b"-"), reply
server.shutdown()
