"""FitResult: what a training run returns (model, history, trace) and the door to simulation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from exonet.trace import Trace

if TYPE_CHECKING:
    from exonet.netsim import SimResult
    from exonet.scenario import ScenarioLike

# The older gym's fit returned the averaged model; a FitResult stands in for it through these (see FitResult).
MODEL_METHODS = frozenset({"state_dict", "load_state_dict", "parameters", "named_parameters", "buffers",
                           "named_buffers", "modules", "named_modules", "children", "eval", "train", "to", "cpu",
                           "cuda", "forward", "requires_grad_", "zero_grad"})


@dataclass(repr=False)
class FitResult:
    """The outcome of ``LocalTrainer.fit``.

    Attributes:
        model: the node-averaged model (floating parameters and buffers averaged; integer buffers from rank 0).
        history: ``train_loss`` (mean over nodes, one per step) and ``eval`` (dicts with step, loss,
            local_loss, drift, correlation).
        trace: every node's compute spans and collectives, for simulation.
        config: the resolved configuration of the run (also in the run directory's config.json).
        run_dir: where the run's artifacts were written, or None.
        real_time_s: wall-clock seconds the run took on this machine.
        sim: the SimResult when ``fit`` was given a scenario.
        sim_wall_clock_s: that simulation's wall-clock (with ``max_sim_time_s``, the online clock at the end).
        save_error: the OSError that stopped the run directory's final write (a full disk), naming the file,
            else None; the model, history and trace here are whole either way.
        profile: with ``fit(profile=True)``, rank 0's torch.profiler trace (Kineto JSON), which
            ``estimate(profile=...)`` replays with its measured per-layer times; else None.
        startup: seconds from ``fit``'s call to each part of the start-up: "imported" (what fit imports on its
            way), "configured" (the arguments checked), "nodes started" (every node asked of the server that forks
            them), then when the last trainer was "forked", had "joined" the process group, "loaded" the model,
            "set up" its strategy and ended its "first step" (``python -m exonet.bench runtime --startup``).

    The older gym's fit returned the model itself, so a FitResult stands in for it: ``result(batch)``,
    ``result.state_dict()``, ``result.parameters()``, ``result.eval()``, ``result.to(...)`` and the other
    ``MODEL_METHODS`` act on ``model`` (``eval``/``train``/``to`` return the model, as ``nn.Module``'s do).
    """

    model: torch.nn.Module
    history: dict[str, list]
    trace: Trace
    config: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None
    real_time_s: float = 0.0
    sim: "SimResult | None" = None
    sim_wall_clock_s: float | None = None
    startup: dict[str, float] = field(default_factory=dict)
    save_error: OSError | None = None
    profile: Path | None = None

    def __getattr__(self, name: str) -> Any:
        if name in MODEL_METHODS:
            return getattr(self.model, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        """One line: what ran and how it ended (the default printed every loss and the whole model)."""
        from exonet.units import format_bytes, format_time

        strategy = self.config.get("strategy", {})
        parts = [f"{strategy.get('strategy', '?') if isinstance(strategy, dict) else strategy}",
                 f"K={self.trace.num_nodes}", f"{self.trace.num_steps(0)} steps"]
        if self.history.get("eval"):
            last = self.history["eval"][-1]
            parts.append(f"val loss {last['loss']:.4g} at step {last.get('step', '?')}")
        elif self.history.get("train_loss"):
            parts.append(f"train loss {self.history['train_loss'][-1]:.4g}")
        parts.append(f"payload/node {format_bytes(self.payload_bytes(0))}")
        parts.append(f"real {format_time(self.real_time_s)}")
        if self.sim is not None:
            parts.append(f"simulated {format_time(self.sim.wall_clock_s)} in {self.sim.scenario_name!r}")
        if self.run_dir is not None:
            parts.append(f"run_dir={str(self.run_dir)!r}")
        return f"FitResult({', '.join(parts)})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the averaged model (the older gym's fit returned it)."""
        return self.model(*args, **kwargs)

    def payload_bytes(self, rank: int) -> int:
        """Total tensor payload bytes ``rank`` passed to the strategy's collectives."""
        return self.trace.payload_bytes(rank)

    def payload_bytes_per_step(self, rank: int) -> list[int]:
        """Payload bytes ``rank`` passed to the strategy's collectives, step by step."""
        return self.trace.payload_bytes_per_step(rank)

    def simulate(self, scenario: "ScenarioLike") -> "SimResult":
        """Replay this run's trace in ``scenario`` (a Scenario, preset name, path or dict)."""
        from exonet.netsim import simulate

        return simulate(self.trace, scenario, history=self.history.get("train_loss"))
