"""Codecs whose buffers are their wire format: bit-packed codes, so the bytes counted are the bytes sent.

A compressed payload held in a container tensor (one int8 per 2-bit code, int64 indices) would be
counted at the container's size: about 2x less than fp32 for "2-bit" values, where the encoding gives
16x. Here every codec packs its codes into one ``uint8`` buffer of exactly ``wire_nbytes`` bytes, so the
Communicator, the trace and the simulator all see what the encoding puts on the wire, and a codec's
byte count is a formula a test can check exactly.

* ``pack_bits`` / ``unpack_bits``: integer codes of 1-16 bits, little-endian bit order, zero-padded to a
  whole byte.
* ``StatQuantizer``: the statistical quantizer of SparseLoCo and MuLoCo (Templar's ``TopKCompressor._quantize``,
  facebookresearch/MuLoCo's ``QuantizationCompressor``): centre on the mean, bins ``range·σ/2^bits`` wide,
  deterministic rounding, and each code decoded as the mean of the values that fell in its bin (a table of
  ``2^bits`` fp32 values plus the fp32 mean).
* ``TopKChunks``: SparseLoCo's sparsifier for one tensor shape: tiles of at most ``chunk × chunk``, the
  ``k`` largest magnitudes of each, indices at ``⌈log2 tile⌉`` bits and values through a ``StatQuantizer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from exonet.strategies.base import check_int, check_range
from exonet.strategies.demo import Layout, largest_divisor, matrix_shape
from exonet.strategies.transport import exchange

FLOAT_BYTES = 4  # the quantizer's mean and table travel as fp32


def check_bits(name: str, bits: int) -> int:
    """``bits`` for an integer code: 1 to 16, else a ValueError naming ``name``."""
    return check_int(name, bits, low=1, high=16)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes of ``count`` codes of ``bits`` bits each, packed: ⌈count·bits / 8⌉."""
    return -(-count * bits // 8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes in ``[0, 2^bits)`` as ``packed_nbytes(codes.numel(), bits)`` bytes (bit i of code j is bit
    ``j·bits + i`` of the stream, least significant first)."""
    flat = codes.reshape(-1).to(torch.int32)
    shifts = torch.arange(bits, dtype=torch.int32, device=flat.device)
    stream = ((flat.unsqueeze(1) >> shifts) & 1).reshape(-1).to(torch.uint8)
    pad = -stream.numel() % 8
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=flat.device)
    return (stream.reshape(-1, 8) * weights).sum(dim=1, dtype=torch.int32).to(torch.uint8)


def unpack_bits(buffer: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The ``count`` codes (int64) that ``pack_bits`` put in ``buffer``."""
    shifts = torch.arange(8, dtype=torch.int32, device=buffer.device)
    stream = ((buffer.to(torch.int32).unsqueeze(1) >> shifts) & 1).reshape(-1)[:count * bits]
    weights = torch.tensor([1 << i for i in range(bits)], dtype=torch.int64, device=buffer.device)
    return (stream.reshape(count, bits).to(torch.int64) * weights).sum(dim=1)


@dataclass(frozen=True)
class StatQuantizer:
    """Statistical quantization to ``bits`` bits per value, with a per-tensor table of bin means.

    ``shift = mean(v)``, ``c = v − shift``, ``σ = ‖c‖ / √(n−1)``, ``scale = range_sigmas·σ / 2^bits`` (1 where
    that is 0 or not finite), code ``q = clamp(round(c/scale + 2^bits/2), 0, 2^bits − 1)``; the table holds the
    mean of ``c`` over each code's values (0 for an empty bin), and a code decodes to ``table[q] + shift``.
    On the wire: the packed codes, then ``shift`` and the table as fp32.

    Args:
        bits: bits per value, 1 to 16 (SparseLoCo and MuLoCo use 2).
        range_sigmas: the span of the bins in standard deviations (the references' 6).
    """

    bits: int = 2
    range_sigmas: float = 6.0

    def __post_init__(self) -> None:
        check_bits("bits", self.bits)
        check_range("range_sigmas", self.range_sigmas, low=0, low_open=True)

    @property
    def bins(self) -> int:
        return 1 << self.bits

    def wire_nbytes(self, count: int) -> int:
        """Bytes of ``count`` quantized values: the packed codes plus ``(1 + 2^bits)`` fp32 values."""
        return packed_nbytes(count, self.bits) + FLOAT_BYTES * (1 + self.bins)

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, header)``: int64 codes of ``values`` and the fp32 ``[shift, table...]`` that decode them."""
        v = values.reshape(-1)
        shift = v.mean()
        centred = v - shift
        std = centred.norm() / math.sqrt(v.numel() - 1) if v.numel() > 1 else centred.new_zeros(())
        scale = self.range_sigmas * std / self.bins
        if scale == 0 or not torch.isfinite(scale):
            scale = torch.ones((), dtype=centred.dtype)
        codes = (centred.float() / scale + self.bins // 2).round().clamp(0, self.bins - 1).long()
        sums = torch.zeros(self.bins).scatter_add_(0, codes, centred.float())
        counts = torch.zeros(self.bins).scatter_add_(0, codes, torch.ones(v.numel()))
        table = torch.where(counts > 0, sums / counts.clamp(min=1), 0.0)
        return codes, torch.cat([shift.float().reshape(1), table])

    @staticmethod
    def dequantize(codes: torch.Tensor, header: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values ``codes`` stand for under ``header`` (``table[q] + shift``)."""
        return (header[1:][codes] + header[0]).to(dtype)

    def encode(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(wire, decoded)``: the ``wire_nbytes(values.numel())`` bytes, and what a receiver decodes from them."""
        codes, header = self.quantize(values)
        wire = torch.cat([pack_bits(codes, self.bits), header.view(torch.uint8)])
        return wire, self.dequantize(codes, header, values.dtype)

    def decode(self, wire: torch.Tensor, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``count`` values a buffer made by ``encode`` carries."""
        split = packed_nbytes(count, self.bits)
        header = wire[split:split + FLOAT_BYTES * (1 + self.bins)].clone().view(torch.float32)
        return self.dequantize(unpack_bits(wire[:split], self.bits, count), header, dtype)


class TopKChunks:
    """SparseLoCo's codec for one tensor shape: tiles, the top ``k`` of each, packed indices and quantized values.

    The tensor is viewed as a matrix (``matrix_shape``) and cut into ``h × w`` tiles, ``h`` and ``w`` the largest
    divisors of its sides not above ``chunk`` (a 1-D tensor: chunks of its largest divisor not above ``chunk``),
    each tile flattened row-major. Each tile keeps ``k = max(1, round(tile · top_k / chunk²))`` entries, the
    largest in magnitude (``top_k`` of every full ``chunk × chunk`` tile), as the reference does
    (QErywan/RobustDiLoCo@276fa59, the first SparseLoCo commit, ``src/tplr/sparseloco.py``). Indices go on the
    wire at ``⌈log2 tile⌉`` bits, values through ``quantizer`` (statistics over the whole tensor).

    Args:
        shape: the tensor's shape.
        top_k: entries kept per full ``chunk × chunk`` tile, 1 to ``chunk²``.
        chunk: the tile side.
        quantizer: how the kept values are coded; None sends them as fp32.
    """

    def __init__(self, shape: Sequence[int], top_k: int = 64, chunk: int = 64,
                 quantizer: StatQuantizer | None = None) -> None:
        check_int("chunk", chunk, low=1)
        check_int("top_k", top_k, low=1, high=chunk * chunk)
        self.shape = torch.Size(shape)
        self.quantizer = quantizer
        rows, cols = matrix_shape(self.shape)
        self.h = largest_divisor(rows, chunk) if len(self.shape) > 1 else 1
        self.w = largest_divisor(cols, chunk)
        self.tiles = (rows // self.h) * (cols // self.w)
        self.tile = self.h * self.w
        self.k = max(1, min(self.tile, round(self.tile * top_k / chunk ** 2)))
        self.index_bits = max(1, math.ceil(math.log2(self.tile)))
        self.rows, self.cols = rows, cols
        a, b = rows // self.h, cols // self.w
        self._cut = Layout("(a h) (b w) -> (a b) (h w)", a=a, h=self.h, b=b, w=self.w)
        self._join = Layout("(a b) (h w) -> (a h) (b w)", a=a, b=b, h=self.h, w=self.w)

    @property
    def kept(self) -> int:
        """Entries sent for the whole tensor."""
        return self.tiles * self.k

    def wire_nbytes(self) -> int:
        """Bytes one encoding puts on the wire: packed indices, then the values (quantized, or fp32)."""
        values = self.quantizer.wire_nbytes(self.kept) if self.quantizer else FLOAT_BYTES * self.kept
        return packed_nbytes(self.kept, self.index_bits) + values

    def tiles_of(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as ``(tiles, tile)`` rows."""
        return self._cut(x.reshape(self.rows, self.cols))

    def untile(self, rows: torch.Tensor) -> torch.Tensor:
        """The tensor whose ``tiles_of`` is ``rows``."""
        return self._join(rows).reshape(self.shape)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(wire, decoded)``: the bytes sent for ``x``, and the dense tensor a receiver decodes from them."""
        rows = self.tiles_of(x)
        idx = torch.topk(rows.abs(), self.k, dim=-1, largest=True, sorted=False).indices
        values = torch.gather(rows, -1, idx)
        if self.quantizer is None:
            sent_values, wire_values = values, values.reshape(-1).float().view(torch.uint8)
        else:
            wire_values, sent_values = self.quantizer.encode(values)
        wire = torch.cat([pack_bits(idx, self.index_bits), wire_values])
        dense = torch.zeros_like(rows).scatter_(-1, idx, sent_values.reshape(idx.shape).to(rows.dtype))
        return wire, self.untile(dense)

    def decode_sparse(self, wire: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
        """``(indices, values)``, each ``(tiles, k)``, from a buffer made by ``encode``."""
        split = packed_nbytes(self.kept, self.index_bits)
        idx = unpack_bits(wire[:split], self.index_bits, self.kept).reshape(self.tiles, self.k)
        rest = wire[split:]
        if self.quantizer is None:
            values = rest[:FLOAT_BYTES * self.kept].clone().view(torch.float32).to(dtype)
        else:
            values = self.quantizer.decode(rest, self.kept, dtype)
        return idx, values.reshape(self.tiles, self.k)


class QuantizedMean:
    """The group mean of a flat vector sent at ``bits`` bits per value, each tensor quantized on its own, with
    error feedback: MuLoCo's quantized outer exchange (facebookresearch/MuLoCo@475bbf4,
    ``quantized_outer_sgd.py``, ``QuantizedOuterSGD``; its "statistical" compressor).

    ``e ← error_decay·e + x``, ``e`` is quantized per tensor (``StatQuantizer``), ``e ← e −`` what was sent, the
    group all-gathers the packed messages and each node averages what they decode to. Each node sends
    ``wire_nbytes()`` bytes to each of the others: ⌈n·bits/8⌉ + 4·(1 + 2^bits) per tensor of n values.

    Args:
        sizes: the tensors' sizes, in the order they lie in the flat vector.
        bits: bits per value, 1 to 16.
        error_decay: how much of the unsent error carries to the next exchange, in [0, 1].
        dtype, device: the flat vector's.
    """

    def __init__(self, sizes: Sequence[int], bits: int, error_decay: float, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.sizes = list(sizes)
        self.quantizer = StatQuantizer(bits)
        self.error_decay = error_decay
        self.error = torch.zeros(sum(self.sizes), dtype=dtype, device=device)

    def wire_nbytes(self) -> int:
        return sum(self.quantizer.wire_nbytes(n) for n in self.sizes)

    def mean(self, x: torch.Tensor, comm: Any, group: tuple[int, ...], transport: str = "all_gather",
             key: str = "") -> torch.Tensor:
        """The mean over ``group`` of what each member's ``x`` (error-fed) decodes to; the messages travel by
        ``transport`` (``exonet.strategies.transport``; ``key`` names a store exchange)."""
        if x.is_meta:  # an estimate: only the message's size matters
            if len(group) > 1:
                exchange(comm, torch.empty(self.wire_nbytes(), dtype=torch.uint8, device="meta"), group, transport,
                         key)
            return x
        self.error.mul_(self.error_decay).add_(x)
        parts = []
        for e in self.error.split(self.sizes):
            wire, sent = self.quantizer.encode(e)
            e.sub_(sent)
            parts.append(wire)
        message = torch.cat(parts)
        gathered = exchange(comm, message, group, transport, key) if len(group) > 1 else message.unsqueeze(0)
        out = torch.zeros_like(x)
        for row in gathered:
            offset = 0
            for part, n in zip(out.split(self.sizes), self.sizes):
                nbytes = self.quantizer.wire_nbytes(n)
                part.add_(self.quantizer.decode(row[offset:offset + nbytes], n, x.dtype))
                offset += nbytes
        return out.div_(len(gathered))
