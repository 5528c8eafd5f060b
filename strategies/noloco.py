"""NoLoCo: no all-reduce; each outer step averages with one random peer, with a momentum that pulls replicas together.

Kolehmainen, Blagoev, Donaghy, Ersoy and Nies, "NoLoCo: No-all-reduce Low Communication Training Method for
Large Models" (arXiv 2506.10911). Written from the reference (gensyn-ai/noloco@ec51a2020ac8552186d47d7b026deb4b093e4160,
``src/noloco/sparse_optimizer_c.py``: ``create_random_permutation``, ``outer_step``, ``SparseOptimizerC``) and
checked against a plain re-derivation of it. The paper's random routing of activations between pipeline stages
is a pipeline matter, separate from this update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from exonet.strategies.base import NodeContext, OptimSpec, check_range, flatten, unflatten_into
from exonet.strategies.fedavg import FedAvgStrategy
from exonet.strategies.transport import TRANSPORTS, check_transport, exchange

if TYPE_CHECKING:
    from exonet.communicator import Communicator


def gossip_pairs(num_nodes: int, inner_steps: int) -> list[tuple[int, int]]:
    """Every pair of the outer step after ``inner_steps`` inner steps (``gossip_peer``'s matching)."""
    pairs = ((r, gossip_peer(r, num_nodes, inner_steps)) for r in range(num_nodes))
    return sorted({(min(pair), max(pair)) for pair in pairs})


def gossip_peer(rank: int, num_nodes: int, inner_steps: int) -> int:
    """The one node ``rank`` averages with after ``inner_steps`` inner steps.

    The reference's pairing: every node draws ``numpy.random.default_rng(inner_steps + 1).permutation(K)``
    and pairs ``perm[j]`` with ``perm[j + K/2]``, a random perfect matching redrawn at every outer step. It
    does not depend on ``fit``'s seed, as in the reference. A lone node is its own peer.
    """
    if num_nodes == 1:
        return rank
    perm = np.random.default_rng(inner_steps + 1).permutation(num_nodes).tolist()
    half = num_nodes // 2
    at = perm.index(rank)
    return perm[at + half] if at < half else perm[at - half]


class NoLoCoStrategy(FedAvgStrategy):
    """H inner steps, then each node exchanges its outer weights and pseudo-gradient with one random peer.

    With φ a node's outer weights (its parameters at the last outer step) and θ its parameters after the
    inner steps, the node sends ``[φ, θ − φ]`` (fp32) to its peer (``gossip_peer``) and receives the peer's;
    with φ̄ and d̄ the pair's means,

        m ← outer_momentum·m + outer_lr·(d̄ + φ̄ − φ),   φ ← φ + m,   θ ← φ.

    The term φ̄ − φ pulls diverging replicas together; no collective runs, so each node sends 8 bytes per
    parameter to one peer and receives as many, whatever K. K must be even (or 1: a lone node sends nothing).

    Defaults are the reference's ``c4_noloco_mean`` runs: H = 50, outer_lr 0.7, outer_momentum 0.5, and
    the inner optimizer Adam (no weight decay) lr 6e-4.

    Args:
        optim_spec: the inner optimizer. Default Adam lr 6e-4.
        H: inner steps per outer step.
        outer_lr: α, the weight of the pair's mean update.
        outer_momentum: β, the momentum of the outer update, in [0, 1).
        transport: "p2p" (a send and a receive with the peer, as the reference), "all_gather" (one all-gather on the
            pair's group) or "store" (each puts its message in the object store and gets its peer's).
        max_norm, lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner steps' clipping
            and schedule, as in ``Strategy``.
    """

    name = "noloco"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        H: int = 50,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.5,
        transport: str = "p2p",
    ) -> None:
        super().__init__(OptimSpec("adam", lr=6e-4) if optim_spec is None else optim_spec, H=H)
        check_range("outer_lr", outer_lr, low=0, low_open=True)
        check_range("outer_momentum", outer_momentum, low=0)
        if outer_momentum >= 1:
            raise ValueError(f"outer_momentum must be < 1, got {outer_momentum!r}")
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.transport = check_transport(transport, ("p2p", *TRANSPORTS))

    def check_world(self, num_nodes: int) -> None:
        super().check_world(num_nodes)
        if num_nodes % 2 and num_nodes > 1:
            raise ValueError(f"num_nodes: NoLoCo pairs every node with one peer each outer step, so it needs an "
                             f"even number of nodes (or one), got {num_nodes}")

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        with torch.no_grad():
            meta = self.params[0].is_meta  # an estimate: sizes only (a cat of meta tensors costs as much as a step)
            self._outer = (torch.empty(sum(p.numel() for p in self.params), device="meta") if meta
                           else flatten(self.params).float())
        self._momentum = torch.zeros_like(self._outer)

    @torch.no_grad()
    def sync_round(self) -> None:
        peer = gossip_peer(self.rank, self.num_nodes, self.local_step + 1)
        n = self._outer.numel()
        mine = (torch.empty(2 * n, device="meta") if self._outer.is_meta
                else torch.cat([self._outer, flatten(self.params).float() - self._outer]))
        theirs = mine if peer == self.rank else self._swap(mine, peer)  # K = 1: the pair's means are its own
        if mine.is_meta:  # an estimate: the exchange is all that matters
            return
        pair = (mine + theirs) / 2
        update = pair[n:] + pair[:n] - self._outer
        self._momentum.mul_(self.outer_momentum).add_(update, alpha=self.outer_lr)
        self._outer.add_(self._momentum)
        unflatten_into(self._outer, self.params)

    def _swap(self, mine: torch.Tensor, peer: int) -> torch.Tensor:
        """The peer's ``[φ, θ − φ]``: a send and a receive (the reference's), or ``transport.exchange`` on the pair."""
        if self.transport == "p2p":
            sending = self.comm.send(mine, peer, async_op=True)
            theirs = self.comm.recv(torch.empty_like(mine), peer)
            sending.wait()
            return theirs
        pair = tuple(sorted((self.rank, peer)))
        if self.transport == "all_gather":  # every pair of the round is a group, made by every rank alike
            self.comm.declare_groups(gossip_pairs(self.num_nodes, self.local_step + 1))
        rows = exchange(self.comm, mine, pair, self.transport, f"noloco/round{self.rounds_done()}")
        return rows[pair.index(peer)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "outer": self._outer.clone(), "momentum": self._momentum.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._outer.copy_(state["outer"])
        self._momentum.copy_(state["momentum"])
