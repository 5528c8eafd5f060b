"""``simulate``: replay a whole trace in a scenario (the incremental engine is exonet.netsim.engine).

Besides resolving the scenario for the trace's node count, it checks where the trace's order
came from: an asynchronous run's order was chosen by the online clock in one scenario, for the
traffic as recorded, and replaying it elsewhere keeps that order; that deserves a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from exonet.netsim.engine import Simulation
from exonet.netsim.result import SimResult
from exonet.scenario import Resolved, Scenario
from exonet.trace import Trace


def simulate(trace: Trace, scenario: object, *, history: Sequence[float] | None = None, fast_path: bool = True) -> SimResult:
    """Replay ``trace`` in ``scenario`` and return the simulated outcome.

    Args:
        trace: the run's per-node events.
        scenario: a ``Resolved`` scenario, or anything ``Scenario.coerce`` accepts
            (a Scenario, a preset name, a path to a TOML file, a dict).
        history: per-step mean training losses, for ``SimResult.loss_vs_time``.
        fast_path: time lone collectives analytically (exact; off only to cross-check).
    """
    if isinstance(scenario, Resolved):
        resolved, name = scenario, scenario.name
    else:
        chosen = Scenario.coerce(scenario)
        resolved, name = chosen.resolve(trace.num_nodes), chosen.name
        _warn_if_decided_elsewhere(trace, chosen)
    sim = Simulation(resolved, fast_path=fast_path, name=name, rewind=not trace.meta.get("elastic", False))
    sim.feed_trace(trace)
    return sim.result(history)


def _warn_if_decided_elsewhere(trace: Trace, scenario: Scenario) -> None:
    """An asynchronous run's order (arrivals, who made a deadline) was chosen by the online clock in
    the scenario it ran in (``meta["decided_in"]``), for the trace as recorded; replayed in another
    scenario, or scaled (``Trace.scaled``), that order stays. (A ``Resolved`` scenario is exonet's
    own, made for this trace: it is not checked.)"""
    decided = trace.meta.get("decided_in")
    if not isinstance(decided, dict):
        return
    scaled = "scaled" in trace.meta
    if scaled or decided.get("fingerprint") != scenario.fingerprint:
        where = f"scenario {decided.get('scenario')!r}" + (" before the trace was scaled" if scaled else "")
        warnings.warn(f"simulate: this trace is of an asynchronous run whose order (arrivals at the server, who made "
                      f"each deadline) the online clock chose in {where}; replayed in {scenario.name!r} it keeps "
                      f"that order, so the times are that order's on this network, not what the run would have done "
                      f"here (fit it with scenario={scenario.name!r} for that)", stacklevel=3)
