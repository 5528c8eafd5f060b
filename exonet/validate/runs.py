"""Measurements from a recorded run: the timings of a user's own training, ready to calibrate a scenario.

A run directory's trace (``fit(run_dir=...)``, or a torchrun job on real hosts) records, for every
blocking collective, when each rank entered it and when it left, on that rank's own clock
(``Collective.start_s`` / ``end_s``). Clocks of different hosts need not agree: the rank that
entered last waited for nobody, so the shortest of the members' spans is the collective's own
time, and no span is compared across clocks. Async collectives end at their Wait, after compute
that overlaps them, so they carry no such time and are left out; so are messages.

Collectives of one kind (op, group size, bytes) are pooled into one row with the median of their
times; a group's first collective is kept apart (``first``), since it may pay the one-time set-up
that ``exonet validate --calibrate`` then fits as ``network.setup``.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Mapping

from exonet import units
from exonet.errors import ScenarioError, TraceError
from exonet.rundir import load_run
from exonet.trace import P2P_OPS, Collective, Trace
from exonet.validate.calibrate import LINK_COLUMNS, Measured, burst_trace, ideal
from exonet.validate.cases import Case


def timed_collectives(trace: Trace) -> dict[tuple[str, int, int, bool], list[float]]:
    """(op, group size, bytes, first on its group) -> the seconds of each blocking collective of that kind.

    A collective counts once every member recorded both ends of it; its time is the shortest member's span.
    """
    spans: dict[tuple[tuple[int, ...], int], list[Any]] = {}  # (members, k-th on them) -> [op, nbytes, spans]
    everyone = tuple(range(trace.num_ranks))
    for rank, events in enumerate(trace.events):
        counts: dict[tuple[int, ...], int] = {}
        for e in events:
            if type(e) is not Collective or e.op in P2P_OPS:
                continue
            members = tuple(sorted(set(e.group))) if e.group is not None else everyone
            k = counts.get(members, 0)
            counts[members] = k + 1
            entry = spans.setdefault((members, k), [e.op, e.nbytes, []])
            entry[1] = max(entry[1], e.nbytes)
            if not e.async_op and e.start_s is not None and e.end_s is not None:
                entry[2].append(e.end_s - e.start_s)
    out: dict[tuple[str, int, int, bool], list[float]] = {}
    for (members, k), (op, nbytes, times) in spans.items():
        if len(members) >= 2 and nbytes > 0 and len(times) == len(members):
            out.setdefault((op, len(members), nbytes, k == 0), []).append(min(times))
    return out


def measurements_from_run(path: str | os.PathLike, bandwidth: str,
                          link: Mapping[str, Any] | None = None) -> list[Measured]:
    """One measurement per kind of blocking collective in the run at ``path`` (median of its times).

    Args:
        path: a run directory.
        bandwidth: each NIC's rate during the run, e.g. "10 Gbit/s" (the trace does not know it).
        link: the link's own ``[network]`` keys (``latency``, ``streams``, ``queue``, ``tcp_window``), set, not fitted.

    Raises:
        TraceError: the run cannot be read, or it has no timed blocking collective.
        ValueError: a bad ``bandwidth`` or ``link`` key or value.
    """
    rate = units.parse_rate(bandwidth, "--bandwidth") * 8
    link = dict(link or {})
    unknown = sorted(set(link) - set(LINK_COLUMNS))
    if unknown:
        raise ValueError(f"--link: unknown key {unknown[0]!r}; expected one of {', '.join(LINK_COLUMNS)}")
    _, _, trace = load_run(path)
    timed = timed_collectives(trace)
    if not timed:
        raise TraceError(f"{path}: the run has no blocking collective timed by every member (async collectives "
                         "and messages carry no time of their own)")
    out = []
    for (op, nodes, nbytes, first), times in sorted(timed.items()):
        case = Case("collective", nodes, rate, op, nbytes, repeats=len(times))
        out.append(Measured(case, [statistics.median(times)], [burst_trace(op, nodes, nbytes, 1)], link, first))
    try:
        out[0].simulate(ideal())  # the link's values are checked as the scenario checks them
    except ScenarioError as exc:
        raise ValueError(f"--link: {exc}") from None
    return out
