"""SparseLoCo: DiLoCo's pseudo-gradient through top-k per tile, 2-bit values and error feedback.

Sarfi, Thérien, Lidin and Belilovsky, "Communication Efficient LLM Pre-training with SparseLoCo"
(arXiv 2508.15706), the method behind Templar's permissionless runs. Written from the reference's first
commit (QErywan/RobustDiLoCo@276fa59977f84a601fb81f3a7e9379b204b4e91c, ``src/tplr/sparseloco.py``,
``SparseLoCo.step``, lines 393-452) and checked against a plain re-derivation of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import NodeContext, OptimSpec, check_int, check_range
from exonet.strategies.codecs import StatQuantizer, TopKChunks, check_bits
from exonet.strategies.demo import decompress
from exonet.strategies.fedavg import FedAvgStrategy
from exonet.strategies.transport import check_transport, exchange

if TYPE_CHECKING:
    from exonet.communicator import Communicator


class SparseLoCoStrategy(FedAvgStrategy):
    """H inner steps, then every node sends the top entries of its error-fed pseudo-gradient, at 2 bits.

    Per parameter tensor, at the end of each round, with θ_old the parameters at the last sync:

    1. error feedback: ``e ← error_decay·e + outer_lr·(θ_old − θ)``;
    2. ``e`` is cut into tiles of at most ``chunk × chunk`` (``TopKChunks``) and each tile keeps its ``top_k``
       largest entries (scaled for smaller tiles); the kept values are quantized to ``bits`` bits with one
       table per tensor (``StatQuantizer``), indices packed at ⌈log2 tile⌉ bits;
    3. ``e ← e −`` what was sent (decoded as a receiver decodes it);
    4. one all-gather of every node's packed message; each coordinate takes the mean over the nodes that sent
       it (not the sum over K: the reference's ``scatter_reduce(..., "mean", include_self=False)``);
    5. ``θ ← θ_old − outer_lr·mean`` (plain SGD, no momentum), the new θ_old.

    As in the reference, ``outer_lr`` scales both the error buffer and the step (so the update is
    ``outer_lr²`` times the mean); at the default 1.0 it is the paper's method exactly. The inner optimizer keeps
    its state across rounds. What goes on the wire per node and round is ``sum(TopKChunks.wire_nbytes())`` over
    the tensors: for 64×64 tiles, k = 64, 2 bits, 14 bits per kept entry (≈ 0.027 bytes per parameter, about
    146x less than DiLoCo's fp32 all-reduce payload) plus 20 bytes per tensor.

    Defaults are Templar's production run (``hparams.json``): H = 30, top_k = 64 of each 64×64 tile, 2 bits,
    error_decay 0.95, outer lr 1.0; the inner optimizer is exonet's AdamW lr 1e-3 (the paper's 512M runs use
    AdamW lr 1e-3, top_k = 128, H = 15).

    Args:
        optim_spec: the inner optimizer. Default AdamW lr 1e-3.
        H: inner steps per round.
        top_k: entries kept per full ``chunk × chunk`` tile, 1 to ``chunk²``.
        chunk: the tile side.
        bits: bits per kept value (1 to 16), or None to send them as fp32.
        error_decay: how much of the unsent error carries to the next round, in [0, 1].
        outer_lr: the outer SGD learning rate.
        transport: "all_gather" (one collective) or "store": each node puts its message in the object store once
            and gets the others' (``comm.put``/``comm.get``; a replay times it by the scenario's ``[store]``).
        max_norm, lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner steps' clipping
            and schedule, as in ``Strategy``.
    """

    name = "sparseloco"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        H: int = 30,
        top_k: int = 64,
        chunk: int = 64,
        bits: int | None = 2,
        error_decay: float = 0.95,
        outer_lr: float = 1.0,
        transport: str = "all_gather",
    ) -> None:
        super().__init__(optim_spec, H=H)
        check_int("chunk", chunk, low=1)
        check_int("top_k", top_k, low=1, high=chunk * chunk)
        self.top_k, self.chunk = top_k, chunk
        self.bits = None if bits is None else check_bits("bits", bits)
        check_range("error_decay", error_decay, low=0, high=1)
        check_range("outer_lr", outer_lr, low=0, low_open=True)
        self.error_decay, self.outer_lr = error_decay, outer_lr
        self.transport = check_transport(transport)

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        quantizer = None if self.bits is None else StatQuantizer(self.bits)
        self.codecs = [TopKChunks(p.shape, self.top_k, self.chunk, quantizer) for p in self.params]
        with torch.no_grad():
            self._anchor = [p.detach().clone() for p in self.params]
        self._error = [torch.zeros_like(p) for p in self.params]

    def wire_nbytes(self) -> int:
        """Bytes each node puts in a round's all-gather: every tensor's packed message."""
        return sum(c.wire_nbytes() for c in self.codecs)

    def exchange(self, message: torch.Tensor) -> torch.Tensor:
        """Every node's message, one row per rank (``transport.exchange``; through the store, as Templar's peers
        swap through a bucket)."""
        return exchange(self.comm, message, tuple(range(self.num_nodes)), self.transport,
                        f"sparseloco/round{self.rounds_done()}")

    @torch.no_grad()
    def sync_round(self) -> None:
        if self.params[0].is_meta:  # an estimate: only the message's size matters
            self.exchange(torch.empty(self.wire_nbytes(), dtype=torch.uint8, device="meta"))
            return
        parts = []
        for p, anchor, error, codec in zip(self.params, self._anchor, self._error, self.codecs):
            error.mul_(self.error_decay).add_(anchor - p, alpha=self.outer_lr)
            wire, sent = codec.encode(error)
            error.sub_(sent)
            parts.append(wire)
        gathered = self.exchange(torch.cat(parts))
        offset = 0
        for p, anchor, codec in zip(self.params, self._anchor, self.codecs):
            n = codec.wire_nbytes()
            sparse = [codec.decode_sparse(row[offset:offset + n], p.dtype) for row in gathered]
            offset += n
            mean = decompress(torch.cat([i for i, _ in sparse], -1), torch.cat([v for _, v in sparse], -1),
                              codec.tile)
            anchor.sub_(codec.untile(mean), alpha=self.outer_lr)
            p.copy_(anchor)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "anchor": [a.clone() for a in self._anchor],
                "error": [e.clone() for e in self._error]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            for mine, saved in zip(self._anchor + self._error, state["anchor"] + state["error"]):
                mine.copy_(saved)
