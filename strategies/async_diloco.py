"""Asynchronous DiLoCo (Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling", arXiv 2401.09135).

Each trainer runs its local steps and sends its pseudo-gradient when it finishes in
simulated time; the server takes an outer step per arrival, in arrival order, and sends
the trainer the current global parameters (exonet.strategies.server).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from exonet.strategies.base import NodeContext, OptimSpec, check_int, check_range, outer_spec
from exonet.strategies.server import ServerStrategy

DN_OPTIONS = frozenset({"lr", "momentum", "nesterov"})  # what of the outer SGD Delayed Nesterov's step reads

if TYPE_CHECKING:
    from exonet.communicator import Communicator


class AsyncDiLoCoStrategy(ServerStrategy):
    """DiLoCo without rounds: the outer optimizer steps on each trainer's Δ as it arrives.

    Naive (``delayed_nesterov=None``, opt-in): every arrival is one step of the outer optimizer
    (``outer_optim_spec``, by default the DiLoCo paper's SGD lr 0.7, momentum 0.9, Nesterov).
    Momentum then acts on stale pseudo-gradients, which the paper finds worse per update than
    synchronous DiLoCo; with momentum 0.9 a fast trainer's repeated arrivals compound it, and a
    small GPT diverged so.

    The default is therefore Delayed Nesterov with N = the number of trainers (``"trainers"``):
    momentum moves once per K arrivals, about once per round of every trainer, which is the
    setting Liu et al. recommend for asynchronous Local-SGD on language models.

    Delayed Nesterov (``delayed_nesterov=N``, the paper's DN): arrivals are buffered and the
    momentum is applied only every N-th arrival, to the buffer's mean d:
    m ← β·m + d, θ ← θ − η·(β·m + d) (Nesterov; θ ← θ − η·m when the SGD says
    ``nesterov=False``). In between, each arrival's Δ is applied at once without momentum, scaled by
    ``grad_scale`` c: θ ← θ − η·c·Δ (c = 0: the global parameters move only at the momentum
    steps). η, β and the Nesterov flag are the outer optimizer's ``lr``, ``momentum`` and
    ``nesterov`` (it must be SGD; its other options have no place in this step and are errors).

    With ``dynamic_local_updates`` (the paper's DyLU) each trainer's local steps per round are
    proportional to its speed, so that fast trainers do not arrive many times per slow arrival.

    Args:
        optim_spec: the trainers' optimizer. Default AdamW lr 1e-3.
        outer_optim_spec: the server's outer optimizer. Default SGD(lr=0.7, momentum=0.9, nesterov=True).
        H: local steps per round (the fastest trainer's, with DyLU).
        max_norm: clip the local gradient norm.
        delayed_nesterov: N, the arrivals per momentum step; "trainers" (the default): N = K; None: naive,
            momentum at every arrival.
        grad_scale: c, the scale of the arrivals applied between momentum steps (Delayed Nesterov only).
        dynamic_local_updates: DyLU (see ``ServerStrategy``).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner schedule.
    """

    name = "async_diloco"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        outer_optim_spec: OptimSpec | str | type | None = None,
        H: int = 100,
        delayed_nesterov: int | str | None = "trainers",
        grad_scale: float = 0.0,
        dynamic_local_updates: bool = False,
    ) -> None:
        super().__init__(optim_spec, H=H, dynamic_local_updates=dynamic_local_updates)
        self.outer_optim_spec = outer_spec(outer_optim_spec)
        if delayed_nesterov is not None:
            if delayed_nesterov != "trainers":
                check_int("delayed_nesterov", delayed_nesterov, low=1)
            if self.outer_optim_spec.cls is not torch.optim.SGD or self.outer_optim_spec.lr is None:
                raise ValueError("delayed_nesterov: the outer optimizer must be SGD with an lr (and momentum), "
                                 f"got {self.outer_optim_spec!r}; pass delayed_nesterov=None for a naive outer step")
            outer = self.outer_optim_spec.kwargs
            unused = sorted(k for k, v in outer.items() if k not in DN_OPTIONS and v not in (0, None))
            if unused:
                raise ValueError(f"outer_optim_spec: Delayed Nesterov's step takes the SGD's lr, momentum and "
                                 f"nesterov; {', '.join(unused)} would be ignored; pass delayed_nesterov=None for "
                                 "torch's SGD at every arrival")
        check_range("grad_scale", grad_scale, low=0)
        if grad_scale and delayed_nesterov is None:
            raise ValueError(f"grad_scale={grad_scale!r} scales the arrivals between Delayed Nesterov's momentum "
                             "steps; with delayed_nesterov=None every arrival is a whole outer step and it would be "
                             "ignored")
        self.delayed_nesterov = delayed_nesterov
        self.grad_scale = grad_scale

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        if self.rank != self.server:
            return
        if self.delayed_nesterov == "trainers":
            self.delayed_nesterov = ctx.num_nodes
        if self.delayed_nesterov is None:
            self.outer_optimizer = self.outer_optim_spec.build([self.global_params])
        else:
            self.momentum = torch.zeros_like(self.global_params)
            self.buffer = torch.zeros_like(self.global_params)
            self.arrivals = 0

    def apply(self, delta: torch.Tensor, trainer: int) -> None:
        if self.delayed_nesterov is None:
            self.global_params.grad = delta
            self.outer_optimizer.step()
            self.global_params.grad = None
            return
        lr = self.outer_optim_spec.kwargs["lr"]
        beta = self.outer_optim_spec.kwargs.get("momentum", 0.0)
        every = self.delayed_nesterov
        assert isinstance(every, int)  # setup made "trainers" the number of trainers
        self.buffer += delta
        self.arrivals += 1
        if self.arrivals % every:
            if self.grad_scale:
                self.global_params.sub_(delta, alpha=lr * self.grad_scale)
            return
        mean = self.buffer.div_(every)
        self.momentum.mul_(beta).add_(mean)
        if self.outer_optim_spec.kwargs.get("nesterov", True):  # the method's name: Nesterov unless told nesterov=False
            self.global_params.sub_(mean.add_(self.momentum, alpha=beta), alpha=lr)
        else:
            self.global_params.sub_(self.momentum, alpha=lr)
        self.buffer.zero_()
