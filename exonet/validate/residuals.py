"""The model's own measured errors, per regime: what ``SimResult.expected_range`` is built from.

Every recorded testbed case (the delay line's medians, ``delay_medians.json``; the shaped links',
``slowlinks_medians.json``) is replayed by today's model, and its real median divided by the
prediction. The ratios are grouped by the regime the replay is in, as a replay of a user's trace
can tell it (exonet/netsim/confidence.py):

- ``library``: a backend's model (gloo, NCCL, a window-limited transfer), no queue overflowing: the
  delay line's cases, which model the library's pipelining, windows and slow start; ``library-calls``:
  those whose replay spends most of its collective time in latency-bound calls (confidence.py), as the
  delay line's gloo sequences of 8 and 32 calls;
- ``phase``: exonet's phase model (no backend) and no queue overflowing: the delay line's cases
  replayed without their library, and the shaped links' cases that lose nothing;
- ``lossy``: a queue overflows, one TCP stream per transfer; ``lossy-streams``: several streams
  share the overflowing queue (NCCL's sockets, split transfers). Both from the shaped links.

The shaped-link cases at 1 Gbit/s measured the testbed (two cores saturated moving the bytes), not
the link, and are left out (``testbed_bound``). ``python -m exonet.validate --bands`` writes each
regime's p10 and p90 ratio to ``exonet/netsim/bands.json``; a test holds that file to this module.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from exonet import simulate
from exonet.netsim import confidence
from exonet.validate.slowlinks import (
    SlowCase,
    back_to_back,
    corners,
    held_out,
    matrix,
    stream_held_out,
    stream_sweep,
)
from exonet.validate.windows import recorded

SLOW_MEDIANS = Path(__file__).with_name("slowlinks_medians.json")
BANDS = Path(__file__).resolve().parents[1] / "netsim" / "bands.json"
REGIMES = ("library", "library-calls", "phase", "lossy", "lossy-streams")


def residuals() -> dict[str, list[float]]:
    """Real median ÷ model, per regime, over every recorded case."""
    out: dict[str, list[float]] = {regime: [] for regime in REGIMES}
    for r in recorded():
        sim = r.case.replay(r.case.model, r.sysctls)
        resolved = r.case.scenario(r.case.model, r.sysctls).resolve(r.case.k)
        calls = confidence.latency_bound(sim, resolved)  # a windowed transfer is the library's regime too
        out["library-calls" if calls else "library"].append(r.median / r.case.repetition_time(sim))
        out["phase"].append(r.median / r.case.predict("phase", r.sysctls))
    medians = json.loads(SLOW_MEDIANS.read_text())
    bound = set(medians["testbed_bound"])
    cases: list[SlowCase] = [*matrix(), *held_out(), *corners(), *back_to_back(), *stream_sweep(), *stream_held_out()]
    for case in cases:
        if case.name in bound:
            continue
        sim = simulate(case.trace(), case.scenario())
        lossy = sim.wall_clock_range[1] > sim.wall_clock_range[0]
        which = confidence.regime(case.scenario().resolve(case.k), lossy, sim)
        out[which].append(medians["cases"][case.name] / sim.wall_clock_s)
    return out


def bands() -> dict[str, dict[str, float]]:
    """Each regime's p10 and p90 ratio of real to model, and how many cases they rest on."""
    out = {}
    for regime, ratios in residuals().items():
        deciles = statistics.quantiles(ratios, n=10, method="inclusive")
        out[regime] = {"p10": round(deciles[0], 4), "p90": round(deciles[-1], 4), "cases": len(ratios)}
    return out


def write_bands(path: Path = BANDS) -> dict[str, dict[str, float]]:
    """Write ``bands()`` where the simulator reads it, with where it came from."""
    table = bands()
    source = ("python -m exonet.validate --bands: real ÷ model over the recorded testbed cases "
              "(exonet/validate/residuals.py), p10 and p90 per regime")
    path.write_text(json.dumps({"source": source, "regimes": table}, indent=1) + "\n")
    return table
