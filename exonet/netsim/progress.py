"""A progress bar for a long replay: nothing for the many short ones, a tqdm bar on stderr for the rest.

Most replays take milliseconds (a test, a sweep's points, ``estimate``), so the bar is drawn only
once a replay has run ``DELAY_S`` of wall-clock time, and only where someone watches: when stderr
is a terminal, or when the caller asks (``simulate(..., progress=True)``). It counts the events
replayed, over every replay one ``simulate`` call makes (a lossy replay makes two more for its
range). The engine calls it every ``EVERY`` instants of simulated time, not on every event, so
watching costs the hot path one subtraction per instant and a clock read per ``EVERY``.
As the runtime's bar, it is drawn by this process only and is gone when the replay ends.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from exonet.netsim.engine import Simulation

DELAY_S = 2.0  # a replay that ends sooner draws nothing
EVERY = 256  # agenda slots between looks at the wall clock: about 10 ms of a long replay


def wanted(progress: bool | None) -> bool:
    """Whether to watch for a bar: ``progress`` when given; None (auto) when stderr is a terminal."""
    if progress is None:
        return sys.stderr is not None and sys.stderr.isatty()
    if not isinstance(progress, bool):
        raise TypeError(f"simulate: progress must be True, False or None (a bar when stderr is a terminal), "
                        f"got {progress!r}")
    return progress


class ReplayBar:
    """The bar of one ``simulate`` call, over the replays it makes, drawn once they have run ``DELAY_S``."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._sim: Simulation | None = None
        self._before = 0  # events of the replays already finished
        self._total = 0  # events of every replay attached so far
        self._bar: Any = None  # the tqdm bar, once drawn

    def attach(self, sim: Simulation, events: int | None = None) -> None:
        """Count ``sim``'s replay after the ones before it: its ``events``, or (None) those fed and not yet run."""
        if self._sim is not None:
            self._before = self._total
        self._sim = sim
        self._total += sim.replayed + sim.queued if events is None else events
        if self._bar is not None:
            self._bar.total = self._total
        sim.watch(self._look, EVERY)

    def _look(self) -> None:
        """Draw or move the bar: called by the engine every ``EVERY`` slots."""
        assert self._sim is not None  # the engine calls only a bar attached to it
        done = min(self._before + self._sim.replayed, self._total)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif time.monotonic() - self._t0 >= DELAY_S:
            from tqdm.auto import tqdm  # imported only for a replay this long

            self._bar = tqdm(total=self._total, initial=done, desc=f"simulate {self._sim.name}", unit=" events",
                             file=sys.stderr, leave=False)

    def close(self) -> None:
        """Take the bar off the screen (a replay that ended before ``DELAY_S`` drew none)."""
        if self._bar is not None:
            self._bar.update(self._total - self._bar.n)
            self._bar.close()
            self._bar = None
