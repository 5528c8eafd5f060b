"""The predicted range of a replay: where the model has a stochastic term, the p10 and p90 of the wall-clock.

The one stochastic term is loss and recovery in an overflowing queue (``topology.Topology._recovery``):
a stream's losses cost it c = ``RECOVERY_BYTES`` of link time per queue share, but on real links the
cost is whole retransmission timeouts and tail-loss probes, a few more or fewer per run. The testbed's
repeats of one lossy case scatter by about ±30% around the rate the model gives them
(exonet/validate/README.md, "Real slow links"), so c is drawn from a lognormal around its median with
σ = ``RECOVERY_SIGMA`` = 0.25 (p10 and p90 at ×0.73 and ×1.38), once per run: a run that meets more
timeouts meets them in all its lossy phases.

The wall-clock only grows with c (a larger c lowers every lossy direction's rate and nothing else), so
its p10 and p90 are the replays at c's p10 and p90: two more replays, exactly, and only for a replay
that met a lossy phase. Everything else is deterministic; there the range has zero width and costs
nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from exonet.netsim.confidence import expected_range
from exonet.netsim.result import SimResult
from exonet.scenario import Resolved

RECOVERY_SIGMA = 0.25
Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def recovery_quantiles(sigma: float = RECOVERY_SIGMA) -> tuple[float, float]:
    """The recovery cost's p10 and p90, as multiples of its median."""
    return math.exp(-Z90 * sigma), math.exp(Z90 * sigma)


def with_range(result: SimResult, resolved: Resolved, lossy: bool,
               replay: Callable[[Resolved], SimResult]) -> SimResult:
    """``result`` with its ``wall_clock_range`` (the replays at the recovery cost's p10 and p90 when ``lossy``), and
    its ``expected_range``: that widened by the model's measured errors in its regime (confidence.py)."""
    wall = result.wall_clock_s
    if lossy:
        low, high = (replay(dataclasses.replace(resolved, recovery=q)).wall_clock_s for q in recovery_quantiles())
        result.wall_clock_range = (min(low, wall), max(high, wall))
    else:
        result.wall_clock_range = (wall, wall)
    result.regime, result.expected_range = expected_range(result, resolved, lossy)
    return result
