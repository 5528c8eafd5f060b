"""SimClock: the online simulated clock of a run trained for a budget of simulated time.

``fit(scenario=S, max_sim_time_s=T)`` replays the run in S while it trains: every step's
events are fed to an incremental ``Simulation`` as the nodes report them, and a node
starts step k only once the clock says step k−1 ended before T. Synchronous strategies
are gated by their slowest node, so the decision is global: every node is told the
same thing, does the same number of steps, and the collectives always match.

Compute must be deterministic for the clock to mean anything: the scenario's
``compute.mode`` must be "flops" (the FLOPs torch counts per step, divided by the device
rate, node speed, jitter and events). Then the same seed gives the same run, and
replaying the finished trace in S gives the same times as the clock did (the engine's
results do not depend on feed order).
"""

from __future__ import annotations

from collections.abc import Sequence

from exonet.netsim import SimResult, Simulation
from exonet.scenario import Scenario
from exonet.trace import Event, Step


class SimClock:
    """An incremental replay of a run, and the stop decisions it implies.

    Args:
        scenario: the network and devices the run is timed in.
        num_nodes: K.
        limit_s: the budget of simulated seconds (``max_sim_time_s``).
        max_steps: the run's cap on steps: no decision is made for a step beyond it.
    """

    def __init__(self, scenario: Scenario, num_nodes: int, limit_s: float, max_steps: int) -> None:
        resolved = scenario.resolve(num_nodes)
        if resolved.compute_mode != "flops":
            raise ValueError(f"fit: max_sim_time_s needs deterministic compute: scenario {scenario.name!r} has "
                             f"compute.mode {resolved.compute_mode!r}; set [compute] mode = \"flops\" with tflops and mfu")
        self.limit_s, self.max_steps = limit_s, max_steps
        self.sim = Simulation(resolved, name=scenario.name)
        self._decided = 0  # the last step decided (step 0 always runs)
        self._reported = [0] * num_nodes  # steps each node has reported
        self.stopped_at: int | None = None

    def feed(self, rank: int, events: Sequence[Event]) -> None:
        """Events a node reported (one step's, or its final ones); replays as far as they allow."""
        for e in events:
            self.sim.feed(rank, e)
            if type(e) is Step:
                self._reported[rank] += 1
        self.sim.run_until_blocked()

    def decisions(self) -> list[tuple[int, bool]]:
        """New (step, go) decisions: step k runs if step k−1 ended before the limit on its slowest node.

        A decision for step k is made once every node has finished step k−1 in the replay;
        after the first "stop" there are no more.
        """
        out: list[tuple[int, bool]] = []
        while self.stopped_at is None and self._decided + 1 < self.max_steps:
            end = self.sim.step_end(self._decided)
            if end is None:
                break
            k = self._decided + 1
            go = end < self.limit_s
            out.append((k, go))
            self._decided = k
            if not go:
                self.stopped_at = k
        if not out and self.stopped_at is None and self._decided + 1 < self.max_steps \
                and min(self._reported) > self._decided:
            raise RuntimeError(
                f"fit(max_sim_time_s=...): every node has reported step {self._decided}, but the online clock "
                f"cannot tell when it ended without the next step's traffic (a collective of a subgroup still "
                f"in flight); strategies whose subgroups change per round are not supported by the clock yet")
        return out

    def close(self, rank: int) -> None:
        """``rank`` will report nothing more."""
        self.sim.close(rank)

    def result(self, history: Sequence[float] | None = None) -> SimResult:
        """The replay of the whole run (every node closed)."""
        return self.sim.result(history)
