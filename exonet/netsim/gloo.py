"""gloo's collectives as torch's ProcessGroupGloo runs them: a segmented ring, two segments in flight.

Read from gloo (``gloo/allreduce.cc``, ``gloo/allgather.cc``, ``gloo/transport/tcp/pair.cc``) and
torch's ``ProcessGroupGlooDetail.hpp``; the netsim README cites the lines.

torch never picks gloo's algorithm, so every all-reduce is gloo's ring: the buffer is cut into
``m = roundUp(max(⌈S / 1 MiB⌉, 2n), n)`` segments (at most 1 MiB each), and every rank streams its
(n−1)·m/n segments of the reduce-scatter and as many of the all-gather to its neighbour, forwarding
a segment as soon as it is reduced: one stream per phase, not 2(n−1) steps with a barrier between
them. A rank keeps at most two sends and two receives in flight, and a send waits for the receiver's
"ready to receive", posted when the receiver finished the receive two segments before. A segment
of x = seg / R seconds on the wire therefore follows the one two before it by at least 2α + x, and
the link needs x per segment:

    T = 2α + 2(n−1)·(m/n)·max(x, α + x/2)          (all-reduce)

All-gather is a ring with each rank's block in two halves, two in flight, 2(n−1) halves per rank:
T = α + 2(n−1)·max(x_h, α + x_h/2), x_h = (s/2) / R. One TCP connection joins each pair.

At n = 2 a rank's neighbours are one peer, so its "ready" notices leave on the connection that
carries its own data and queue behind the segment it is sending: a segment then follows the one
before it by its own time plus the notice's crossing, and the pipeline's fill and drain hide in it:

    T = 2(n−1)·(m/n)·(x + α)     (all-reduce, n = 2; all-gather likewise, 2(n−1)·(x_h + α))

On the delay line (validate README, "gloo's window") that is within 1% of five of six K = 2 cases;
in the sixth the runs split between this and the n ≥ 3 form. On a
network whose latency is small next to a segment's time (the netns testbed), both are the phase
model's bandwidth term, as measured there.

As NCCL's, these are phases of messages (the ring's steps, so each link's bytes are exact) with a
latency shift that makes them take T when they run alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from exonet.netsim.rings import ordered, ring_phases
from exonet.netsim.topology import Phase, Topology

SEGMENT = 1024 * 1024  # kMaxSegmentSize


def segments(nbytes: float, n: int) -> int:
    """How many segments gloo's ring cuts ``nbytes`` into across ``n`` ranks."""
    m = max(math.ceil(nbytes / SEGMENT), 2 * n)
    return math.ceil(m / n) * n


def all_reduce_time(nbytes: float, n: int, rate: float, latency: float) -> float:
    """Seconds of gloo's ring all-reduce on an idle network (module docstring)."""
    m = segments(nbytes, n)
    x = nbytes / m / rate
    if n == 2:  # the notices queue behind the rank's own data (module docstring)
        return 2 * (n - 1) * (m // n) * (x + latency)
    return 2 * latency + 2 * (n - 1) * (m // n) * max(x, latency + x / 2)


def all_gather_time(nbytes: float, n: int, rate: float, latency: float) -> float:
    """Seconds of gloo's ring all-gather of ``nbytes`` per rank on an idle network (module docstring)."""
    x = nbytes / 2 / rate
    if n == 2:
        return 2 * (n - 1) * (x + latency)
    return latency + 2 * (n - 1) * max(x, latency + x / 2)


def plan(op: str, g: Sequence[int], nbytes: float, topo: Topology) -> list[Phase]:
    """``op`` (all_reduce, all_gather or reduce) among ``g`` as gloo runs it, as ring phases timed as gloo's ring.

    gloo's reduce (``gloo/reduce.cc``) is the first half of its all-reduce, the segmented ring reduce-scatter with
    two segments in flight (so half the all-reduce's time), then every rank sends its reduced S/n to the root at once.
    """
    n = len(g)
    ring = ordered(g, topo)
    hops = [topo.path(ring[i], ring[(i + 1) % n]) for i in range(n)]
    rate = min(p.rate for p in hops)
    alpha = max(p.latency for p in hops)
    if op == "all_reduce":
        phases, target = ring_phases(ring, nbytes / n, 2 * (n - 1)), all_reduce_time(nbytes, n, rate, alpha)
    elif op == "reduce":
        phases, target = ring_phases(ring, nbytes / n, n - 1), all_reduce_time(nbytes, n, rate, alpha) / 2
    else:
        phases, target = ring_phases(ring, nbytes, n - 1), all_gather_time(nbytes, n, rate, alpha)
    ideal = sum(alpha + phase[0][2] / rate for phase in phases)
    shift = (target - ideal) / len(phases)
    shifted = [tuple((*m, shift) for m in phase) for phase in phases]
    if op == "reduce":
        shifted.append(tuple((r, g[0], nbytes / n) for r in g[1:]))
    return shifted
