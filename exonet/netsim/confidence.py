"""How far a real run may fall from a replay: the model's own measured errors, for the regime the replay is in.

``SimResult.wall_clock_range`` covers what the model draws at random (loss and recovery, spread.py), so it
has zero width wherever nothing is stochastic, even where the model is known to miss real runs by a few
percent. ``SimResult.expected_range`` adds what the model does not know: every recorded testbed case
(exonet/validate/residuals.py) replayed by today's model gives a ratio of real to predicted time, and a
replay takes the p10 and p90 of the ratios of its own regime (``bands.json``, written by
``python -m exonet.validate --bands``):

- ``library``: a ``backend`` and no queue overflowing, its collectives' time mostly their bytes' (the delay
  line's gloo, NCCL-like and windowed cases);
- ``library-calls``: the same, but most of the collectives' time is in calls that take more than twice their
  bytes' time at the NIC's rate (``latency_bound``): small calls back to back, where what each call costs
  besides its bytes (fill, notices, windows) decides, and where gloo's back-to-back calls overlap one call's
  tail with the next call's start, which the model does not;
- ``phase``: exonet's phase model, nothing overflowing (the same cases without their library, and the
  shaped links that lose nothing: 1.01 to 1.65, the phase model pays no library's pipelining);
- ``lossy``: a queue overflows with one stream per transfer (0.98 to 1.12);
- ``lossy-streams``: several streams share an overflowing queue (0.84 to 2.19: timeouts and resends
  the fluid model does not have).

The ratios are of communication-bound cases, so the band scales the part of the wall-clock that is not
compute: the replay's wall-clock less the busiest trainer's compute. The range is then
``(low − (1 − p10)·comm, high + (p90 − 1)·comm)`` around the stochastic ``(low, high)``, never narrower
than it. A replay of pure compute has no width.
"""

from __future__ import annotations

import json
from importlib import resources

from exonet.netsim.result import SimResult
from exonet.scenario import Resolved

_BANDS: dict[str, dict[str, float]] = json.loads(
    resources.files("exonet.netsim").joinpath("bands.json").read_text())["regimes"]


LATENCY_BOUND = 2.0  # a call is latency-bound past this many times its bytes' time at the NIC rate


def latency_bound(result: SimResult, resolved: Resolved) -> bool:
    """Whether most of a replay's collective time is in latency-bound calls (module docstring)."""
    rate = min(resolved.uplink)
    spent = bound = 0.0
    for span in result.collectives:
        took = span.end_s - span.start_s
        spent += took
        if took > LATENCY_BOUND * span.nbytes / rate:
            bound += took
    return bound > spent / 2


def regime(resolved: Resolved, lossy: bool, result: SimResult) -> str:
    """The regime a replay is in, as the testbed's cases were grouped (module docstring)."""
    if lossy:
        return "lossy" if resolved.streams == 1 else "lossy-streams"
    if resolved.backend is None:
        return "phase"
    return "library-calls" if latency_bound(result, resolved) else "library"


def band(name: str) -> tuple[float, float]:
    """The p10 and p90 of real ÷ model in regime ``name``."""
    entry = _BANDS[name]
    return entry["p10"], entry["p90"]


def expected_range(result: SimResult, resolved: Resolved, lossy: bool) -> tuple[str, tuple[float, float]]:
    """The regime of ``result`` and where a real run is expected to fall (p10, p90 seconds; module docstring)."""
    name = regime(resolved, lossy, result)
    p10, p90 = band(name)
    trainers = result.per_node[:result.trainers] or result.per_node
    compute = max((node.compute_s for node in trainers), default=0.0)
    comm = max(0.0, result.wall_clock_s - compute)
    low, high = result.wall_clock_range
    return name, (low - max(0.0, 1.0 - p10) * comm, high + max(0.0, p90 - 1.0) * comm)
