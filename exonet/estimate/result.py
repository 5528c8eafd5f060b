"""An estimated run (its trace and what was assumed), and its replay with the compute it was given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from exonet.scenario import Scenario, ScenarioLike
from exonet.trace import Trace

if TYPE_CHECKING:
    from exonet.netsim.result import SimResult


@dataclass
class Estimate:
    """An estimated run: its synthetic trace and what was assumed.

    ``rerun`` is set for a strategy that reacts to simulated time: its trace was decided in one
    scenario, and ``trace_in`` builds the trace another scenario gives.
    """

    trace: Trace
    params: int
    step_time_s: float
    assumptions: list[str]
    rerun: Callable[[Any], Trace] | None = field(default=None, repr=False)
    profile: dict | None = None  # a profiled estimate's step, the MFU it implies and the FLOPs-based figure
    retime: Callable[[float, float], Estimate] | None = field(default=None, repr=False)  # see on_device

    def on_device(self, tflops: float, mfu: float) -> Estimate:
        """The same run with its compute at ``tflops`` × ``mfu``, without running the strategy again: what
        ``estimate(..., tflops=tflops, mfu=mfu)`` gives, for an estimate made from ``tokens_per_step`` whose nodes
        all behave like rank 0 (a projection prices one run on each scenario's device this way).

        Raises:
            ValueError: the estimate was given its step time, measured by a profile, ran its ranks separately, or
                is of a model in stages (``pipeline=``).
        """
        if self.retime is None:
            raise ValueError("Estimate.on_device: this estimate cannot be re-timed (it was given step_time= or a "
                             "profile, its ranks ran separately, or its model is in stages); call estimate() with "
                             "tflops= and mfu=")
        return self.retime(tflops, mfu)

    def trace_in(self, scenario: ScenarioLike) -> Trace:
        """The trace to replay in ``scenario`` (re-run on the online clock when the strategy needs it)."""
        if self.rerun is None:
            return self.trace
        if scenario_for_estimate(scenario).fingerprint == self.trace.meta["decided_in"]["fingerprint"]:
            return self.trace
        return self.rerun(scenario)


def scenario_for_estimate(scenario: ScenarioLike) -> Scenario:
    """``scenario`` with its compute taken from the estimate's own spans (``mode = "wall"``).

    An estimate states its compute (a step time, or tokens at a device's TFLOP/s and MFU),
    so a preset's ``[compute]`` device does not apply; per-node speeds and jitter still do.
    """
    from exonet.netsim.replay import with_given_compute

    return with_given_compute(Scenario.coerce(scenario))


def simulate_estimate(trace: Trace | Estimate, scenario: ScenarioLike) -> SimResult:
    """Replay an estimate's trace in ``scenario`` (with the compute the estimate was given); an asynchronous
    Estimate is re-run there first."""
    from exonet.netsim import simulate

    chosen = scenario_for_estimate(scenario)
    if isinstance(trace, Estimate):
        trace = trace.trace_in(chosen)
    return simulate(trace, chosen)
