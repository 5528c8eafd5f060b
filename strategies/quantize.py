"""Blockwise symmetric integer quantization for the wire, and the quantized all-reduce built on it.

Streaming DiLoCo (Douillard et al., arXiv 2501.18512) sends its outer gradients in
4 bits (a 4-bit float there; symmetric integer codes with per-block scales here) and
accumulates them in fp32. A flat fp32 buffer is cut
into blocks of ``BLOCK`` values; each block has one fp32 scale ``s = max|x| / qmax``
(``qmax`` = 7 for 4 bits, 127 for 8 bits) and codes ``q = round(x / s)`` in
``[-qmax, qmax]``, so the error of every value is at most ``s / 2``.

Wire layout of a packed buffer (``uint8``): the codes (8-bit: one int8 per value;
4-bit: two per byte, code + 8 in the low nibble for the even value and the high
nibble for the odd one), followed by the block scales as fp32 bytes. A buffer of
``m`` values therefore takes ``m·bits/8 + 4·m/BLOCK`` bytes: for 4 bits and
``BLOCK = 128``, 0.53125 bytes per value.

A plain all-reduce of integer codes would overflow and mix scales, so
``QuantizedAllReduce`` is a reduce-scatter done as one ``all_to_all`` of packed
chunks (each node dequantizes and sums its chunk in fp32), then one ``all_gather``
of the re-quantized reduced chunks. Each node puts ``2(n−1)/n`` of the quantized
size Q on the wire, as a ring all-reduce of the quantized buffer would. The trace's
payload (what each rank passes in) is ``Q + Q/n``: the all_to_all's whole input
plus this node's all_gather chunk. The buffer is zero-padded so that it splits into
n chunks of whole blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from exonet.communicator import Communicator, Handle

BITS = (4, 8)
BLOCK = 128
SCALE_BYTES = 4


def _check_bits(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"quantize_bits must be one of {BITS}, got {bits!r}")
    return (1 << (bits - 1)) - 1


def padded_length(numel: int, parts: int = 1, block: int = BLOCK) -> int:
    """``numel`` rounded up so it splits into ``parts`` chunks of whole blocks."""
    unit = parts * block
    return -(-numel // unit) * unit


def packed_nbytes(numel: int, bits: int, block: int = BLOCK) -> int:
    """Bytes of ``pack`` for ``numel`` values (a multiple of ``block``)."""
    return numel * bits // 8 + numel // block * SCALE_BYTES


def pack(x: torch.Tensor, bits: int, block: int = BLOCK) -> torch.Tensor:
    """Quantize a 1-D float tensor (length a multiple of ``block``) to one ``uint8`` buffer."""
    qmax = _check_bits(bits)
    if x.dim() != 1 or x.numel() % block or block % 2:
        raise ValueError(f"pack: expected a 1-D tensor whose length divides into blocks of {block} (even), "
                         f"got shape {tuple(x.shape)}")
    blocks = x.detach().float().reshape(-1, block)
    scales = blocks.abs().amax(dim=1) / qmax
    codes = torch.round(blocks / torch.where(scales > 0, scales, 1.0)[:, None]).clamp_(-qmax, qmax)
    codes = codes.to(torch.int8).reshape(-1)
    if bits == 8:
        code_bytes = codes.view(torch.uint8)
    else:
        nibbles = (codes + 8).to(torch.uint8)
        code_bytes = nibbles[0::2] | (nibbles[1::2] << 4)
    return torch.cat([code_bytes, scales.view(torch.uint8)])


def unpack(buf: torch.Tensor, bits: int, block: int = BLOCK) -> torch.Tensor:
    """Dequantize a buffer made by ``pack`` back to fp32 values."""
    _check_bits(bits)
    numel = buf.numel() * 8 * block // (bits * block + 8 * SCALE_BYTES)
    code_len = numel * bits // 8
    if buf.dim() != 1 or buf.dtype != torch.uint8 or packed_nbytes(numel, bits, block) != buf.numel():
        raise ValueError(f"unpack: {tuple(buf.shape)} {buf.dtype} is not a packed {bits}-bit buffer "
                         f"of blocks of {block}")
    scales = buf[code_len:].clone().view(torch.float32)
    if bits == 8:
        codes = buf[:code_len].view(torch.int8).float()
    else:
        nibbles = buf[:code_len]
        codes = torch.stack([nibbles & 0xF, nibbles >> 4], dim=1).reshape(-1).float() - 8
    return (codes.reshape(-1, block) * scales[:, None]).reshape(-1)


class QuantizedAllReduce:
    """An average of a flat fp32 buffer over all nodes, sent quantized, in two phases.

    ``start`` packs one chunk per destination and issues the ``all_to_all``;
    ``reduce`` receives this node's chunk from everyone, sums it in fp32, divides by
    n, re-quantizes and issues the ``all_gather``; ``wait`` dequantizes all chunks.
    Each phase's collective is async, so a caller may let compute run between them.

    Args:
        comm: this node's Communicator.
        flat: the values to average (1-D, any float dtype; read at ``start``).
        bits: 4 or 8.
        block: values per scale.
    """

    def __init__(self, comm: "Communicator", flat: torch.Tensor, bits: int, block: int = BLOCK) -> None:
        self.comm, self.bits, self.block = comm, bits, block
        self.numel = flat.numel()
        n = comm.world_size
        padded = flat.new_zeros(padded_length(self.numel, n, block), dtype=torch.float32)
        padded[: self.numel] = flat
        chunks = [pack(c, bits, block) for c in padded.chunk(n)]
        self._handle: "Handle" = comm.all_to_all(torch.stack(chunks), async_op=True)
        self._phase = 1

    def reduce(self) -> None:
        """Phase 2: wait for the all_to_all, reduce this node's chunk, start the all_gather."""
        if self._phase != 1:
            return
        received = self._handle.wait()
        reduced = torch.stack([unpack(row, self.bits, self.block) for row in received]).sum(0)
        reduced /= received.shape[0]
        self._handle = self.comm.all_gather(pack(reduced, self.bits, self.block), async_op=True)
        self._phase = 2

    def wait(self) -> torch.Tensor:
        """Finish both phases and return the averaged fp32 values (length of the input)."""
        self.reduce()
        gathered = self._handle.wait()
        return torch.cat([unpack(row, self.bits, self.block) for row in gathered])[: self.numel]

    def state_dict(self) -> dict[str, Any]:
        """Its phase and the result of the phase's collective, for a checkpoint (``Handle.state_dict``)."""
        return {"phase": self._phase, "numel": self.numel, "bits": self.bits, "block": self.block,
                "handle": self._handle.state_dict()}

    @classmethod
    def restore(cls, comm: "Communicator", state: dict[str, Any]) -> "QuantizedAllReduce":
        """The reduction ``state_dict`` kept, at the same phase: what is left of it is issued and traced as before."""
        kept = cls.__new__(cls)
        kept.comm, kept.bits, kept.block, kept.numel = comm, state["bits"], state["block"], state["numel"]
        kept._phase, kept._handle = state["phase"], comm.restore_handle(state["handle"])
        return kept
