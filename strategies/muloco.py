"""MuLoCo: DiLoCo with Muon as the inner optimizer.

Thérien, Huang, Rish and Belilovsky, "MuLoCo: Muon is a practical inner optimizer for DiLoCo"
(arXiv 2505.23725). Defaults from the authors' single-file version (bentherien/muloco-1@33cc333,
``muloco/pytorch/muloco.py``): H = 30, Muon lr 0.02 and momentum 0.95 on the hidden matrices, AdamW
betas (0.9, 0.95) and weight decay 0.01 on the rest, outer Nesterov SGD lr 0.7 and momentum 0.6.
"""

from __future__ import annotations

from typing import Any

import torch

from exonet.strategies.base import OptimSpec
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.muon import MUON_KEY


def hidden_matrices(model: torch.nn.Module) -> set[int]:
    """``id``s of the parameters Muon trains: the 2-D weights of ``nn.Linear`` layers but the last (the output
    head), never an ``nn.Embedding``'s (an output head tied to the embedding is the embedding's)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return {id(m.weight) for m in linears[:-1] if m.weight.dim() == 2 and id(m.weight) not in embedded}


class MuLoCoStrategy(DiLoCoStrategy):
    """DiLoCo whose inner optimizer is Muon on the hidden matrices and AdamW on everything else.

    The inner optimizer's param groups are tagged by ``hidden_matrices`` (Muon's authors and MuLoCo keep the
    embeddings, the output head and every 1-D parameter on AdamW); the outer step and the bytes are DiLoCo's:
    one all-reduce of the parameters every H steps. An ``optim_spec`` other than ``"muon"`` gets the same
    groups and ignores the tag.

    Args:
        optim_spec: the inner optimizer. Default ``OptimSpec("muon")``: Muon lr 0.02, momentum 0.95, Nesterov,
            weight decay 0.01; AdamW lr 1e-3, betas (0.9, 0.95), weight decay 0.01.
        outer_optim_spec: the outer optimizer. Default SGD lr 0.7, momentum 0.6, Nesterov.
        H: inner steps per round.
        quantize_bits, error_decay, transport: the pseudo-gradient at that many bits with error feedback, and how
            it travels, as in ``DiLoCoStrategy`` (the paper's 2-bit variant: ``quantize_bits=2``).
        max_norm, lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: as in ``Strategy``.
    """

    name = "muloco"

    def __init__(self, optim_spec: OptimSpec | str | type | None = None, *,
                 outer_optim_spec: OptimSpec | str | type | None = None, H: int = 30,
                 quantize_bits: int | None = None, error_decay: float = 0.9, transport: str = "all_gather") -> None:
        super().__init__(OptimSpec("muon") if optim_spec is None else optim_spec,
                         outer_optim_spec=OptimSpec("sgd", lr=0.7, momentum=0.6, nesterov=True)
                         if outer_optim_spec is None else outer_optim_spec, H=H, quantize_bits=quantize_bits,
                         error_decay=error_decay, transport=transport)

    def inner_param_groups(self) -> list[Any]:
        hidden = hidden_matrices(self.model)
        groups = [{"params": [p for p in self.params if id(p) in hidden], MUON_KEY: True},
                  {"params": [p for p in self.params if id(p) not in hidden], MUON_KEY: False}]
        return [g for g in groups if g["params"]]
