"""Rings: the member order a ring follows and its phases, and the mirror of a plan, shared by the phase model and
the libraries' models."""

from __future__ import annotations

from collections.abc import Sequence

from exonet.netsim.topology import Phase, Topology


def ring_phases(g: Sequence[int], size: float, count: int) -> list[Phase]:
    """``count`` phases in which every member sends ``size`` to the next, g[i] → g[i+1 mod n]."""
    n = len(g)
    phase = tuple((g[i], g[(i + 1) % n], size) for i in range(n))
    return [phase] * count


def ordered(g: Sequence[int], topo: Topology) -> list[int]:
    """``g`` with each region's members together (regions in the order their lowest member comes), by rank within,
    so a ring crosses each inter-region link once each way; for contiguous regions this is ``g`` itself."""
    first: dict[str, int] = {}
    for r in g:
        first.setdefault(topo.region(r), len(first))
    return sorted(g, key=lambda r: (first[topo.region(r)], r))


def mirrored(phases: Sequence[Phase]) -> list[Phase]:
    """``phases`` run backwards with every message reversed: a broadcast's tree becomes the reduce towards its root
    (the same links carry the same bytes the other way, so alone it takes the same time)."""
    return [tuple((m[1], m[0], *m[2:]) for m in phase) for phase in reversed(phases)]
