"""The lease-setting commands of one server hold (an owner's on one key): what each may set,
and what a reply confirms (the Rust client's ``Hold::renew`` rule, sync and asyncio alike).

The server *sets* the lease on every re-entry and renewal (Redisson semantics). Two commands
sent for one hold, from two connections (a watchdog's thread and the caller's, two handles of
one Owner) or after a stall, may run in either order; so:

- every command asks at least the latest end any earlier one asked (``asked``): none sent after
  it can end the hold before what it may have set;
- a reply confirms the least of what it asked and what the commands in flight when it was sent
  asked (any of them may run after it and set its own end): ``min`` over those ends.

A command given up on (a timeout) leaves the ledger: if the server runs it later it may still
set a shorter end than later replies confirmed. So locks and read-write sides send ``GT`` on
every acquire and renewal (a re-entry or renewal ends at the later of the current end and its
own): then nothing sent for the hold shortens it, and a reply confirms what it asked, uncapped.
Leased permits' renewals (one hold, no re-entry) keep the cap."""

from __future__ import annotations

import itertools
import math
import threading


class Ledger:
    """The lease-setting commands of one server hold: the latest end asked, those in flight."""

    def __init__(self) -> None:
        #: the latest end (``time.monotonic()`` value) any command for the hold asked for
        self.asked = float("-inf")
        self._in_flight: dict[int, float] = {}
        self._tickets = itertools.count(1)  # next() is atomic under the GIL
        # only short max()/min() updates inside, no wait: a ``with`` on a C lock releases it
        # whatever exception lands (see ``Hold._mutex``)
        self._mutex = threading.Lock()

    def ticket(self) -> int:
        """A ticket for a command about to be sent; :meth:`done` with it in a ``finally``."""
        return next(self._tickets)

    def send(self, ticket: int, sent_at: float, lease_ms: int, gt: bool) -> tuple[int, float]:
        """A command sent at ``sent_at`` asks ``lease_ms``: the lease to send (never ending
        before what an earlier one asked) and the end its confirmation proves: what it asked
        when every command for the hold carries ``gt`` (none run later can shorten it), else
        capped by the commands in flight now."""
        with self._mutex:
            if self.asked != float("inf") and self.asked > sent_at:
                lease_ms = max(lease_ms, math.ceil((self.asked - sent_at) * 1000))
            asked = sent_at + lease_ms / 1000.0
            confirms = asked if gt else min([asked, *self._in_flight.values()])
            self._in_flight[ticket] = asked
            self.asked = max(self.asked, asked)
        return lease_ms, confirms

    def reset(self, until: float) -> None:
        """An exact lease was set (the drop-in's ``extend(..., replace_ttl=True)``): the
        latest end asked is that one from now on."""
        with self._mutex:
            self.asked = until

    def in_flight_until(self) -> float:
        """The least end a command in flight now asked (inf: none)."""
        return min(list(self._in_flight.values()), default=float("inf"))

    def done(self, ticket: int) -> None:
        """The command of ``ticket`` was answered or given up on (idempotent)."""
        self._in_flight.pop(ticket, None)
