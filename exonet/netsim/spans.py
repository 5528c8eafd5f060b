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
