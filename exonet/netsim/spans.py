"""The kinds of time a node spends, and a node's timeline of spans (what a replay records per rank).

Kept apart from ``result`` so the exporters that read a result (``chrome``) need not import it.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

KINDS = ("compute", "comm", "idle")
COMPUTE, COMM, IDLE = range(3)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One node's spans: ``times`` holds (start, end) pairs, ``kinds`` an index into KINDS per span."""

    times: array
    kinds: bytes
    end: float  # the node's last event; the run goes on to wall_clock_s

    def clipped(self, end: float) -> Timeline:
        """The spans before ``end`` (a node whose thrown-away time runs past the run's end)."""
        times, kinds = array("d"), bytearray()
        for i, kind in enumerate(self.kinds):
            a, b = self.times[2 * i], min(self.times[2 * i + 1], end)
            if b > a:
                times.extend((a, b))
                kinds.append(kind)
        return Timeline(times, bytes(kinds), min(self.end, end))

    def seconds(self, kind: int) -> float:
        """Seconds spent in ``kind``."""
        return sum(self.times[2 * i + 1] - self.times[2 * i] for i, k in enumerate(self.kinds) if k == kind)
