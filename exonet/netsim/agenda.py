"""Agenda: the replay's clock, in integer ticks, with a fixed order for everything due at one instant.

Two rules make a replay exact however long it runs and in whatever order it is fed:

* Time is an integer count of ticks of 2**-64 s, so a nanosecond collective after a
  year of simulated time is still timed to 1e-10 relative; durations are summed
  exactly and converted to seconds only in the result. (The fluid network keeps its
  clock relative to the last rate change for the same reason.)
* Everything due at one instant runs in a fixed order, whatever order it was
  scheduled in: outages first, then network progress, then collective starts sorted
  by (group, index), then any-source receives claiming a message. So FIFO sharing and
  the online clock do not depend on which rank was fed first.

The SimPy environment sees one event per distinct tick; the calls due then wait in a
heap of that tick's slot.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import cast

import simpy

SCALE = 2**64  # ticks per second: simulated time is an integer number of ticks
TICK = 1.0 / SCALE

# The order of things due at the same instant.
OUTAGE, NETWORK, START, CLAIM = 0, 1, 2, 3


def ticks(seconds: float) -> int:
    """Seconds as a whole number of ticks (exact scaling by a power of two, then rounding)."""
    return round(seconds * SCALE)


def seconds(t: int) -> float:
    """Ticks as seconds, correctly rounded (int to float rounds; scaling by 2**-64 is exact)."""
    return t * TICK


def _nothing() -> None:
    """``Agenda.on_slots`` when nobody watches."""


class Agenda:
    """Calls scheduled at ticks, run by a SimPy environment in (tick, order, scheduling) order."""

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self._slots: dict[int, list] = {}  # tick -> heap of (order, seq, fn, args) due then
        self._seq = 0
        self.pending = 0  # calls scheduled and not yet run
        # set once the clock ran past a rank that waits for an answer (Simulation.overrun): that rank's
        # later calls, due before now, run now
        self.overrun = False
        # ``on_slots`` is called after every ``every``-th slot ``run_before`` runs (a progress bar looking at the wall
        # clock); ``every`` 0 never calls it, at the cost of one subtraction per slot
        self.every = 0
        self.on_slots: Callable[[], None] = _nothing

    @property
    def now(self) -> int:
        # SimPy types its clock int | float; here it starts at 0 and only moves by whole ticks
        return cast(int, self.env.now)

    def at(self, t: int, fn: Callable[..., None], *args: object, order: tuple = (NETWORK,)) -> None:
        """Call ``fn(t, *args)`` at tick ``t``; calls due at one tick run sorted by ``order``, then by scheduling."""
        if self.overrun and t < self.env.now:
            t = self.now
        slot = self._slots.get(t)
        if slot is None:
            slot = self._slots[t] = []
            self.env.timeout(t - self.env.now).callbacks.append(lambda _: self._run(t))
        self._seq += 1
        self.pending += 1
        heapq.heappush(slot, (order, self._seq, fn, args))

    def run_before(self, horizon: Callable[[], float]) -> None:
        """Run every slot due before ``horizon()`` (ticks, or inf), asked again after each slot (it may fall)."""
        env, every = self.env, self.every
        left = every  # counts down to 0 once per ``every`` slots; from 0 it goes negative and never returns
        while env.peek() < horizon():
            env.step()
            left -= 1
            if left == 0:
                left = every
                self.on_slots()

    def step(self) -> bool:
        """Run the next due slot, whatever the horizon; False if nothing is due."""
        if self.env.peek() == float("inf"):
            return False
        self.env.step()
        return True

    def _run(self, t: int) -> None:
        slot = self._slots[t]
        while slot:
            _, _, fn, args = heapq.heappop(slot)
            self.pending -= 1
            fn(t, *args)
        del self._slots[t]
