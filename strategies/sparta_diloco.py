"""SPARTA + DiLoCo: sparse averaging keeps the nodes close between DiLoCo's outer steps.

Beton et al. 2025 (SPARTA) report that this combination tolerates a much larger DiLoCo
interval H than DiLoCo alone. The strategy is DiLoCo's rounds plus SPARTA's exchange,
composed from ``DiLoCoStrategy`` and SPARTA's ``SparseAveraging``.
"""

from __future__ import annotations

from exonet.strategies.base import OptimSpec, check_int
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.sparta import SparseAverager, SparseAveraging


class SPARTADiLoCoStrategy(SparseAveraging, DiLoCoStrategy):
    """DiLoCo's outer step every ``H`` steps; SPARTA's sparse averaging every ``sparta_interval`` steps.

    On a step where the outer sync runs, the sparse exchange is skipped: averaging a few
    coordinates over all nodes leaves their mean unchanged, so it could not change the
    outer step when the round's group is every node, and its bytes would be wasted.

    Args:
        optim_spec: the inner optimizer (name, class or OptimSpec); the gym spells it ``inner_optim_spec``.
            Default AdamW lr 1e-3.
        outer_optim_spec: the outer optimizer over θ_global. Default SGD(lr=0.7, momentum=0.9, nesterov=True).
        p_sparta: fraction of the parameters averaged per sparse exchange, in (0, 1].
        sparta_interval: steps between sparse exchanges.
        H: inner steps per DiLoCo round.
        max_norm: clip the inner gradient norm before each inner step.
        participation: fraction of nodes taking part in each DiLoCo round, in (0, 1].
        island_size: nodes per DiLoCo averaging island; None averages over all participants.
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner learning-rate schedule,
            as in ``Strategy``.
    """

    name = "sparta_diloco"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        outer_optim_spec: OptimSpec | str | type | None = None,
        p_sparta: float = 0.005,
        sparta_interval: int = 1,
        H: int = 100,
        participation: float = 1.0,
        island_size: int | None = None,
    ) -> None:
        super().__init__(optim_spec, outer_optim_spec=outer_optim_spec, H=H, participation=participation,
                         island_size=island_size)
        check_int("sparta_interval", sparta_interval, low=1)
        self.sparse = SparseAverager(p_sparta)
        self.p_sparta = p_sparta
        self.sparta_interval = sparta_interval

    def step(self) -> None:
        self.optimizer_step()
        t = self.local_step + 1  # this step's number
        if t % self.H == 0:
            self.sync_round()
        elif t % self.sparta_interval == 0:
            self.sparse.average(t)
