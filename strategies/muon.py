"""Muon for the hidden matrices and AdamW for the rest, as one torch optimizer (``OptimSpec("muon")``).

Muon orthogonalises each 2-D weight's momentum (Newton-Schulz) and is defined for matrices only; the
embeddings, the output head and every 1-D or k-D parameter are trained by AdamW, as MuLoCo
(facebookresearch/MuLoCo, ``parameter_classification.py``) and Muon's authors do. The two halves are
torch's own ``torch.optim.Muon`` (torch 2.9 and later) and ``torch.optim.AdamW``, held in one optimizer
whose ``param_groups`` are theirs, so a learning-rate schedule scales both.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

MUON_KEY = "muon"  # a param group's flag: True for Muon, False for AdamW


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups flagged ``muon`` (or, given plain tensors, on every 2-D one), AdamW on the others.

    Args:
        params: tensors, or param groups each with ``"muon": True | False``.
        lr, momentum, nesterov, weight_decay: Muon's (``torch.optim.Muon``; momentum 0.95 and lr 0.02 as
            Keller Jordan's and MuLoCo-1's defaults).
        adamw_lr, adamw_betas, adamw_eps, adamw_weight_decay: AdamW's, for the parameters Muon does not take.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.01, adamw_lr: float = 1e-3, adamw_betas: tuple[float, float] = (0.9, 0.95),
                 adamw_eps: float = 1e-8, adamw_weight_decay: float = 0.01) -> None:
        if not hasattr(torch.optim, "Muon"):
            raise ValueError(f"optimizer 'muon' needs torch.optim.Muon (torch 2.9 or later); this is torch "
                             f"{torch.__version__}")
        muon: list[torch.Tensor] = []
        adamw: list[torch.Tensor] = []
        for item in params:
            if isinstance(item, dict):
                (muon if item.get(MUON_KEY) else adamw).extend(item["params"])
            else:
                (muon if item.dim() == 2 else adamw).append(item)
        bad = [tuple(p.shape) for p in muon if p.dim() != 2]
        if bad:
            raise ValueError(f"muon: Muon takes 2-D parameters only, got shapes {bad}")
        self._parts: list[torch.optim.Optimizer] = []
        if muon:
            self._parts.append(torch.optim.Muon(muon, lr=lr, momentum=momentum, nesterov=nesterov,
                                                weight_decay=weight_decay))
        if adamw:
            self._parts.append(torch.optim.AdamW(adamw, lr=adamw_lr, betas=adamw_betas, eps=adamw_eps,
                                                 weight_decay=adamw_weight_decay))
        super().__init__([g for part in self._parts for g in part.param_groups], {})
        self._share_groups()

    def _share_groups(self) -> None:
        """Hold the parts' own group dicts, so a schedule that sets an lr here sets it where the step reads it."""
        self.param_groups = [g for part in self._parts for g in part.param_groups]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for part in self._parts:
            part.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self._parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, saved in zip(self._parts, state_dict["parts"]):
            part.load_state_dict(saved)  # which builds new group dicts
        self._share_groups()
