"""Optional Weights & Biases logging, from the parent process only (one run per fit).

wandb is imported lazily, so it is needed only when ``fit(wandb_project=...)`` asks
for it; ``WANDB_MODE=offline`` works with no network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exonet.runtime.gymlog import perplexity as _perplexity
from exonet.runtime.gymlog import replicas

if TYPE_CHECKING:
    from exonet.netsim import SimResult


class WandbLogger:
    """One wandb run under the seed gym's metric names: the config up front, ``train_loss`` and
    ``train_perplexity`` per step, ``local_*``/``global_*`` per evaluation, simulated time at the end.

    Args:
        project: the wandb project.
        config: the run's resolved configuration (its batch_size × replicas counts examples).
        name: an optional run name.
        dir: where wandb writes its files (e.g. the run directory).
        x_axis: "step" (steps done) or "examples" (examples trained), the gym's ``log_x_axis``.
    """

    def __init__(self, project: str, config: dict[str, Any], name: str | None = None, dir: str | None = None,
                 x_axis: str = "step") -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("fit(wandb_project=...) needs wandb: pip install 'exonet[wandb]'") from None
        self._wandb = wandb
        self._examples = config["batch_size"] * replicas(config) if x_axis == "examples" else 0
        self.run = wandb.init(project=project, name=name, config=config, dir=dir, reinit="finish_previous")

    def log_step(self, step: int, loss: float) -> None:
        """Step ``step`` (counted from 1) is done; logged as the gym did, before its step counter moved on."""
        at = step * self._examples if self._examples else step - 1  # the gym's examples count it, its steps not yet
        self.run.log({"train_loss": loss, "train_perplexity": _perplexity(loss)}, step=at)

    def log_eval(self, ev: dict[str, Any]) -> None:
        data = {"global_loss": ev["loss"], "global_perplexity": _perplexity(ev["loss"])}
        if "local_loss" in ev:
            data.update(local_loss=ev["local_loss"], local_perplexity=_perplexity(ev["local_loss"]))
        data.update({k: v for k, v in ev.items() if k not in ("step", "loss", "local_loss")})
        self.run.log(data, step=ev["step"] * self._examples if self._examples else ev["step"])

    def log_simulation(self, sim: "SimResult") -> None:
        """Loss against simulated wall-clock as a table, and the totals in the summary."""
        table = self._wandb.Table(columns=["step", "sim_time_s", "train_loss"],
                                  data=[[i + 1, t, loss] for i, (t, loss) in enumerate(sim.loss_vs_time())])
        self.run.log({"sim/loss_vs_time": table})
        self.run.summary.update({"sim/wall_clock_s": sim.wall_clock_s, "sim/utilization": sim.utilization,
                                 "sim/scenario": sim.scenario_name})

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)
