"""What crosses a stage boundary: codecs for a pipeline's activations and their gradients.

``PipelineSpec(codec=...)`` puts one on every boundary, both ways: a stage sends ``encode(x)``, a
``uint8`` buffer of exactly ``wire_nbytes`` bytes (so the Communicator, the trace and the simulator
count what the encoding puts on the wire, as for data-parallel codecs), and the next stage computes on
``decode(buffer)``. The backward sends the gradient of that decoded input, encoded the same way, and
the previous stage back-propagates the decoded gradient (a straight-through estimator).

* ``Quantized(bits)``: every value at ``bits`` bits, SparseLoCo's statistical quantizer (a per-message
  table of bin means).
* ``TopK(top_k, chunk, bits)``: the ``top_k`` largest magnitudes of every ``chunk × chunk`` tile,
  indices packed, values at ``bits`` bits (None: fp32).
* ``LowRank(rank, seed)``: the last dimension projected on a fixed random basis of ``rank`` columns, the
  same on every rank (the simplest form of the subspace idea); the receiver lifts it back.

There is no error feedback: consecutive messages on a boundary are different micro-batches' tensors,
so a residual kept from one would be added to another sample's activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from exonet.arguments import check_int
from exonet.strategies.codecs import FLOAT_BYTES, StatQuantizer, TopKChunks, check_bits


class Coder(Protocol):
    """A codec fixed to one tensor shape."""

    wire_nbytes: int

    def encode(self, x: torch.Tensor) -> torch.Tensor: ...

    def decode(self, wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...


class BoundaryCodec(Protocol):
    """What ``PipelineSpec(codec=...)`` takes: a coder for each shape that crosses a boundary."""

    def coder(self, shape: torch.Size) -> Coder: ...


class _Quantize:
    def __init__(self, shape: torch.Size, bits: int) -> None:
        self.shape, self.quantizer = shape, StatQuantizer(bits)
        self.wire_nbytes = self.quantizer.wire_nbytes(shape.numel())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantizer.encode(x.float())[0]

    def decode(self, wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.quantizer.decode(wire, self.shape.numel(), dtype).reshape(self.shape)


@dataclass(frozen=True)
class Quantized:
    """Every value at ``bits`` bits (1-16)."""

    bits: int = 8

    def __post_init__(self) -> None:
        check_bits("Quantized: bits", self.bits)

    def coder(self, shape: torch.Size) -> Coder:
        return _Quantize(torch.Size(shape), self.bits)


class _TopK:
    def __init__(self, shape: torch.Size, top_k: int, chunk: int, bits: int | None) -> None:
        self.codec = TopKChunks(shape, top_k, chunk, None if bits is None else StatQuantizer(bits))
        self.wire_nbytes = self.codec.wire_nbytes()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.codec.encode(x.float())[0]

    def decode(self, wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        idx, values = self.codec.decode_sparse(wire, torch.float32)
        dense = torch.zeros(self.codec.tiles, self.codec.tile).scatter_(-1, idx, values)
        return self.codec.untile(dense).to(dtype)


@dataclass(frozen=True)
class TopK:
    """The ``top_k`` largest magnitudes of every ``chunk × chunk`` tile; values at ``bits`` bits (None: fp32)."""

    top_k: int = 64
    chunk: int = 64
    bits: int | None = 8

    def __post_init__(self) -> None:
        check_int("TopK: chunk", self.chunk, low=1)
        check_int("TopK: top_k", self.top_k, low=1, high=self.chunk * self.chunk)
        if self.bits is not None:
            check_bits("TopK: bits", self.bits)

    def coder(self, shape: torch.Size) -> Coder:
        return _TopK(torch.Size(shape), self.top_k, self.chunk, self.bits)


class _Project:
    def __init__(self, shape: torch.Size, rank: int, seed: int) -> None:
        self.shape = shape
        width = shape[-1]
        generator = torch.Generator().manual_seed(seed * 1_000_003 + width)
        # entries N(0, 1/rank): E[P Pᵀ] = I, so lifting back is unbiased
        self.basis = torch.randn(width, rank, generator=generator) / math.sqrt(rank)
        self.rows = shape.numel() // width
        self.wire_nbytes = FLOAT_BYTES * self.rows * rank

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        codes = x.detach().float().reshape(self.rows, -1) @ self.basis.to(x.device)
        return codes.reshape(-1).view(torch.uint8)

    def decode(self, wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        codes = wire.clone().view(torch.float32).reshape(self.rows, -1)
        return (codes @ self.basis.to(wire.device).T).reshape(self.shape).to(dtype)


@dataclass(frozen=True)
class LowRank:
    """The last dimension on a fixed random basis of ``rank`` columns (drawn from ``seed``), lifted back."""

    rank: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("LowRank: rank", self.rank, low=1)
        check_int("LowRank: seed", self.seed, low=0)

    def coder(self, shape: torch.Size) -> Coder:
        if len(shape) < 1 or self.rank >= shape[-1]:
            raise ValueError(f"LowRank: rank={self.rank} must be below the activations' last dimension "
                             f"({shape[-1] if len(shape) else 'none'}) to compress them")
        return _Project(torch.Size(shape), self.rank, self.seed)
