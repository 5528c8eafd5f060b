"""DiLoCo: Distributed Low-Communication training (Douillard et al. 2023, arXiv 2311.08105).

FedAvg's rounds with an outer optimizer on the shared parameters, i.e. FedOpt
(Reddi et al. 2020) with AdamW inside and Nesterov momentum outside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import NodeContext, OptimSpec, base_options, flatten, outer_spec, unflatten_into
from exonet.strategies.fedavg import FedAvgStrategy

if TYPE_CHECKING:
    from exonet.communicator import Communicator


class DiLoCoStrategy(FedAvgStrategy):
    """H inner steps, then every node applies the same outer step to θ_global.

    Each node keeps θ_global, a flat copy of the parameters at the last sync, and the
    outer optimizer over it. At the end of a round the group all-reduces (one flattened
    buffer, op "avg") its inner parameters θ_local, sets the outer gradient
    Δ = θ_global − mean(θ_local), steps the outer optimizer and restarts from the new
    θ_global. There is no master copy on rank 0 and no broadcast back: each participant
    sends ``P * itemsize`` bytes per round. K = 1 still takes the outer step; the first
    sync comes after exactly H inner steps; the inner optimizer keeps its state.

    Δ = θ_global − mean(θ_local) is the paper's averaged pseudo-gradient mean(θ_global − θ_local)
    whenever the nodes share θ_global, which they always do at full participation. Averaging
    θ_local rather than the pseudo-gradients is what keeps partial participation and islands
    sound: a node that sat a round out still holds the old θ_global, and averaging
    pseudo-gradients would leave it (and everyone it later meets) offset from the others
    forever; averaging parameters pulls it back in its next round. Rounds, ``participation``
    and ``island_size`` follow ``FedAvgStrategy``; a node that sits a round out leaves its
    θ_global and outer state as they are.

    Defaults: the outer optimizer is the paper's SGD lr 0.7, momentum 0.9, Nesterov;
    H = 100 and the inner AdamW lr 1e-3 are the seed gym's (the paper uses H = 500 and
    AdamW lr 4e-4, weight decay 0.1 for its 150M-parameter language models).

    Args:
        inner_optim: the inner optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        outer_optim: the outer optimizer over θ_global. Default SGD(lr=0.7, momentum=0.9, nesterov=True).
        H: inner steps per round.
        max_norm: clip the inner gradient norm before each inner step.
        participation: fraction of nodes taking part in each round, in (0, 1].
        island_size: nodes per averaging island each round; None averages over all participants.
        optim_spec: alias of ``inner_optim`` (seed gym spelling).
        outer_optim_spec: alias of ``outer_optim`` (seed gym spelling).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner learning-rate schedule,
            as in ``Strategy``.
    """

    name = "diloco"

    def __init__(
        self,
        inner_optim: OptimSpec | str | type | None = None,
        outer_optim: OptimSpec | str | type | None = None,
        H: int = 100,
        max_norm: float | None = None,
        *,
        participation: float = 1.0,
        island_size: int | None = None,
        optim_spec: OptimSpec | str | type | None = None,
        outer_optim_spec: OptimSpec | str | type | None = None,
        lr_scheduler: str | type | None = None, lr_scheduler_kwargs: dict[str, Any] | None = None,
        warmup_steps: int = 0, cosine_min_ratio: float = 0.0,
    ) -> None:
        super().__init__(inner_optim, island_size, H, participation=participation, optim_spec=optim_spec,
                         **base_options(locals()))
        self.outer_optim = outer_spec(outer_optim, outer_optim_spec)

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        with torch.no_grad():
            self.global_params = flatten(self.params)
        self.outer_optimizer = self.outer_optim.build([self.global_params])

    def apply_average(self, mean: torch.Tensor) -> None:
        """Outer step on θ_global with gradient θ_global − mean(θ_local); restart the inner steps from it."""
        self.global_params.grad = mean.sub_(self.global_params).neg_()  # Δ in the received buffer: no new P floats
        self.outer_optimizer.step()
        self.global_params.grad = None
        unflatten_into(self.global_params, self.params)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_params": self.global_params.detach().clone(),
                "outer_optimizer": self.outer_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.global_params.copy_(state["global_params"])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
