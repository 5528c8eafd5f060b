"""Optional Weights & Biases logging, from the parent process only (one run per fit).

wandb is imported lazily, so it is needed only when ``fit(wandb_project=...)`` asks
for it; ``WANDB_MODE=offline`` works with no network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exonet.netsim import SimResult


class WandbLogger:
    """One wandb run: the config up front, the loss per step, evaluations, and simulated time at the end.

    Args:
        project: the wandb project.
        config: the run's resolved configuration.
        name: an optional run name.
        dir: where wandb writes its files (e.g. the run directory).
    """

    def __init__(self, project: str, config: dict[str, Any], name: str | None = None, dir: str | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("fit(wandb_project=...) needs wandb: pip install 'exonet[wandb]'") from None
        self._wandb = wandb
        self.run = wandb.init(project=project, name=name, config=config, dir=dir, reinit="finish_previous")

    def log_step(self, step: int, loss: float) -> None:
        self.run.log({"train/loss": loss}, step=step)

    def log_eval(self, ev: dict[str, Any]) -> None:
        self.run.log({f"eval/{k}": v for k, v in ev.items() if k != "step"}, step=ev["step"])

    def log_simulation(self, sim: "SimResult") -> None:
        """Loss against simulated wall-clock as a table, and the totals in the summary."""
        table = self._wandb.Table(columns=["step", "sim_time_s", "train_loss"],
                                  data=[[i + 1, t, loss] for i, (t, loss) in enumerate(sim.loss_vs_time())])
        self.run.log({"sim/loss_vs_time": table})
        self.run.summary.update({"sim/wall_clock_s": sim.wall_clock_s, "sim/utilization": sim.utilization,
                                 "sim/scenario": sim.scenario_name})

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)
