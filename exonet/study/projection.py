"""Projection: what the strategies of a small real run would cost at a stated model size, per scenario.

A digits MLP trains in milliseconds on the devices the presets name, so its own simulated
times say little about the trade-off a researcher faces. A projection runs each strategy's
own step logic on a model of the stated size through ``exonet.estimate`` (meta tensors, the
real collectives and bytes), with compute from the scenario's device (``[compute]``
TFLOP/s x MFU at 6·P FLOPs per token), and replays it in the scenario. Deterministic: nothing
is measured on this machine.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exonet.estimate import Estimate, estimate, simulate_estimate
from exonet.scenario import Scenario
from exonet.strategies.base import Strategy
from exonet.units import format_bytes, format_time, plural


@dataclass(frozen=True)
class Scale:
    """The model and batch a projection is made at.

    Attributes:
        params: model parameters.
        dtype: parameter and transfer dtype ("bf16", "fp32", "fp16").
        tokens_per_node_step: tokens each node processes per optimizer step.
        steps: steps simulated; figures are reported per ``per_steps`` steps.
        per_steps: the step count the time and byte columns are given for.
    """

    params: float = 1e9
    dtype: str = "bf16"
    tokens_per_node_step: int = 131_072
    steps: int = 50
    per_steps: int = 1000

    def describe(self, nodes: int) -> str:
        """The one line that says how the projection is made."""
        return (f"projected to {self.params:.3g} parameters ({self.dtype}), {plural(nodes, 'node')}, "
                f"{self.tokens_per_node_step:,} tokens per node per step: each strategy's own step logic on meta "
                f"tensors (exonet estimate), compute = 6·P·tokens at the scenario's TFLOP/s x MFU, {self.steps} steps "
                f"simulated and scaled to {self.per_steps:,}")


def scenario_device(scenario: Scenario, nodes: int, who: str = "projection") -> tuple[float, float]:
    """The TFLOP/s and MFU of ``scenario``'s device, which a projection times compute at; ``who`` heads the error.

    Raises:
        ValueError: the scenario names no device (``[compute]`` mode "flops" with tflops).
    """
    resolved = scenario.resolve(nodes)
    if resolved.compute_mode != "flops" or resolved.tflops is None:
        raise ValueError(f"{who}: scenario {scenario.name!r} names no device (its [compute] needs "
                         f'mode = "flops" and tflops), so compute at scale is unknown')
    return resolved.tflops, resolved.mfu


def project(strategies: Mapping[str, Strategy], scenarios: Sequence[Scenario | str], *, nodes: int,
            scale: Scale = Scale()) -> list[dict[str, Any]]:
    """One row per (strategy, scenario): utilisation, time and payload per node per ``scale.per_steps`` steps.

    Args:
        strategies: name -> strategy (each is copied; the caller's objects are not touched).
        scenarios: scenarios that name a device in ``[compute]`` (presets do).
        nodes: K.
        scale: the model size and batch projected to.
    """
    factor = scale.per_steps / scale.steps
    rows = []
    made: dict[str, Estimate] = {}  # each strategy runs once on meta tensors; other devices re-time its spans
    for scenario in map(Scenario.coerce, scenarios):
        tflops, mfu = scenario_device(scenario, nodes)
        for name, strategy in strategies.items():
            if name in made and made[name].retime is not None:
                est = made[name].on_device(tflops, mfu)
            else:
                est = made[name] = estimate(copy.deepcopy(strategy), params=scale.params, num_nodes=nodes,
                                            max_steps=scale.steps, tokens_per_step=scale.tokens_per_node_step,
                                            tflops=tflops, mfu=mfu, dtype=scale.dtype)
            sim = simulate_estimate(est, scenario)
            rows.append({
                "run": name, "scenario": scenario.name, "utilization": sim.utilization,
                "time_per_steps_s": sim.wall_clock_s * factor,
                "payload_bytes_per_node": est.trace.payload_per_trainer() * factor,
                "step_compute_s": est.step_time_s,
            })
    return rows


def to_markdown(rows: Sequence[Mapping[str, Any]], scale: Scale,
                extra: Mapping[str, Sequence[str]] | None = None) -> str:
    """The projection as a table; ``extra`` maps a column title to one cell per row (e.g. the small run's loss)."""
    extra = extra or {}
    per = f"{scale.per_steps:,} steps"
    titles = ["run", "scenario", f"compute util @{scale.params:.3g}", f"time per {per}",
              f"payload/node per {per}", *extra]
    lines = ["| " + " | ".join(titles) + " |", "|" + "|".join("---" for _ in titles) + "|"]
    for i, row in enumerate(rows):
        cells = [row["run"], row["scenario"], f"{row['utilization']:.1%}", format_time(row["time_per_steps_s"]),
                 format_bytes(row["payload_bytes_per_node"]), *(column[i] for column in extra.values())]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
