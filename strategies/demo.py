"""DeMo: Decoupled Momentum Optimization (Peng, Quesnelle & Kingma, arXiv 2411.19870).

Each node keeps its own momentum and sends only its fast-moving part: the top-k
coefficients of a chunked DCT of the momentum. What was sent is removed from the
momentum (error feedback); the slow part stays behind and keeps accumulating.
Every node decodes every node's coefficients the same way and takes a sign step,
so the replicas stay identical without ever exchanging parameters.

This follows the authors' reference optimizer (github.com/bloc97/DeMo, ``demo.py``):

* weight decay ``θ ← θ·(1 − lr·wd)``; momentum ``m ← β·m + lr·g`` (lr folded in);
* ``c = DCT(m)`` in chunks; keep the ``topk`` largest ``|c|`` of every chunk;
  ``m ← m − iDCT(kept)``;
* all-gather (indices, values); coefficients of all nodes are scattered into one
  chunk, a coordinate sent by several nodes gets the *mean* of their values (the
  reference's ``scatter_reduce(..., "mean", include_self=False)``), coordinates
  nobody sent stay zero; ``q = iDCT(...)``;
* ``θ ← θ − lr·sign(q)``.

Chunking. A tensor is viewed as a matrix: 1-D as ``1 × n``, 2-D as is, and
higher-dimensional (conv) tensors as ``shape[0] × prod(shape[1:])`` (one row per
output channel). Each side is cut into blocks of the largest divisor of its length
that is at most ``compression_chunk`` (the reference's ``_get_smaller_split``), so
a 256 × 256 weight gives 64 × 64 blocks and a 1-D bias of 256 gives 1 × 64 blocks,
exactly as in the reference; nothing is padded. A prime length larger than the
chunk degenerates to blocks of 1 along that side (the reference does the same).

Wire format. One ``all_gather`` per step of a single ``uint8`` buffer. Parameters
whose blocks have the same shape and dtype form a group (in order of first
appearance), transformed and compressed in one batched call; for every group, the
indices of all its blocks (int16 when a block has at most 32768 entries, else
int32), parameter by parameter, followed by their values (in the group's dtype).
The layout is the same on every node, so no sizes travel; each block sends
``min(topk, block numel)`` pairs. A 64 × 64 block with topk 32 costs 32 · (2 + 4)
= 192 bytes for 4096 fp32 parameters: 0.047 bytes per parameter per step.

The momentum is kept as its DCT coefficients (the transform is linear and
orthogonal), so error feedback is zeroing the coefficients that were sent; the
result equals the reference's ``m ← m − iDCT(sent)`` up to rounding.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING, Any, Sequence

import einops
import torch

from exonet.strategies.base import NodeContext, OptimSpec, Strategy, check_int, check_range

if TYPE_CHECKING:
    from exonet.communicator import Communicator

INT16_LIMIT = 32768


@functools.lru_cache(maxsize=None)
def _dct_basis64(n: int) -> torch.Tensor:
    j = torch.arange(n, dtype=torch.float64)[:, None]
    k = torch.arange(n, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi * (2 * j + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[:, 0] = math.sqrt(1.0 / n)
    return basis


def dct_basis(n: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """The orthonormal DCT-II basis of size ``n`` as an ``n × n`` matrix ``B``.

    Coefficients of a signal ``x`` (last dimension) are ``x @ B``; the inverse is
    ``c @ B.T``, because ``B`` is orthogonal ("ortho" normalisation, as in the reference).
    """
    if n < 1:
        raise ValueError(f"dct_basis: n must be >= 1, got {n}")
    return _dct_basis64(n).to(dtype=dtype, device=device, copy=True)  # the caller's own: the cache stays intact


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (the reference's chunk-size rule)."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """How a tensor is chunked: 0-D and 1-D as one row, k-D as ``shape[0] × prod(shape[1:])``."""
    if len(shape) <= 1:
        return 1, math.prod(shape)
    return shape[0], math.prod(shape[1:])


class Layout:
    """An einops rearrangement, run in the hot loop as the plain reshape/permute it stands for.

    The pattern is the readable definition of a layout. It is compiled here once into a view
    shape, a permutation and a result shape, and checked against ``einops.rearrange`` on a small
    probe of the same axes (axis sizes capped at 3: a layout does not depend on them), so each call
    costs what the torch ops cost, without einops' per-call dispatch (about 30 us).

    Args:
        pattern: an einops pattern of named axes and parenthesised groups, e.g. "(a h) (b w) -> (a b) w h".
        sizes: every axis's size but at most one, which each call infers from the input's size.
    """

    def __init__(self, pattern: str, **sizes: int) -> None:
        left, right = (_groups(side) for side in pattern.split("->"))
        self.order = [axis for group in left for axis in group]
        self.perm = tuple(self.order.index(axis) for group in right for axis in group)
        self.right = right
        self.sizes = sizes
        self._shapes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        small = {axis: min(size, 3) for axis, size in sizes.items()}
        small.update({axis: 2 for axis in self.order if axis not in small})
        probe = torch.arange(math.prod(small.values())).reshape([math.prod(small[a] for a in g) for g in left])
        if not torch.equal(Layout._run(probe, small, self.order, self.perm, right), einops.rearrange(probe, pattern,
                                                                                                   **small)):
            raise AssertionError(f"Layout {pattern!r}: the compiled plan disagrees with einops")

    @staticmethod
    def _run(x: torch.Tensor, sizes: dict[str, int], order: list[str], perm: tuple[int, ...],
             right: list[list[str]]) -> torch.Tensor:
        view = [sizes[axis] for axis in order]
        out = [math.prod(sizes[axis] for axis in group) for group in right]
        return x.reshape(view).permute(perm).reshape(out)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shapes = self._shapes.get(x.numel())
        if shapes is None:
            known = math.prod(self.sizes.values())
            sizes = {axis: self.sizes.get(axis, x.numel() // known) for axis in self.order}
            shapes = self._shapes[x.numel()] = (tuple(sizes[a] for a in self.order),
                                                tuple(math.prod(sizes[a] for a in g) for g in self.right))
        return x.reshape(shapes[0]).permute(self.perm).reshape(shapes[1])


def _groups(side: str) -> list[list[str]]:
    """One side of a pattern as its groups of axes: "(a h) (b w)" -> [["a", "h"], ["b", "w"]]."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for token in side.replace("(", " ( ").replace(")", " ) ").split():
        if token == "(":
            current = []
        elif token == ")":
            groups.append(current or [])
            current = None
        elif current is not None:
            current.append(token)
        else:
            groups.append([token])
    return groups


class ChunkedDCT:
    """The blockwise 2-D DCT of one tensor shape, with its basis matrices built once.

    ``encode`` turns a tensor into ``(num_blocks, block_numel)`` coefficients, block by
    block in row-major block order, each block flattened row-major; ``decode`` inverts it.
    The two halves are public apart (``blocks``/``transform``, ``inverse``/``unblocks``) so
    that tensors whose blocks have the same shape are transformed in one batched call. The cut
    is an einops pattern, compiled once here (``Layout``), not dispatched on every step.

    Args:
        shape: the tensor's shape.
        chunk: the target block side (``compression_chunk``).
        dtype: dtype of the basis matrices (the parameter's).
        device: where they live.
    """

    def __init__(self, shape: Sequence[int], chunk: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.shape = torch.Size(shape)
        self.rows, self.cols = matrix_shape(self.shape)
        self.h = largest_divisor(self.rows, chunk)
        self.w = largest_divisor(self.cols, chunk)
        self.basis_h = dct_basis(self.h, dtype, device)
        self.basis_w = dct_basis(self.w, dtype, device)
        self.basis_h_t, self.basis_w_t = self.basis_h.T.contiguous(), self.basis_w.T.contiguous()
        self.num_blocks = (self.rows // self.h) * (self.cols // self.w)
        self.block_numel = self.h * self.w
        self.index_dtype = torch.int16 if self.block_numel <= INT16_LIMIT else torch.int32
        a, b = self.rows // self.h, self.cols // self.w
        self._cut = Layout("(a h) (b w) -> (a b) w h", a=a, h=self.h, b=b, w=self.w)
        self._join = Layout("(a b) w h -> (a h) (b w)", a=a, b=b, w=self.w, h=self.h)

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` cut into blocks in row-major block order, each block transposed: ``(num_blocks, w, h)``.

        Transposed because the DCT contracts ``h`` first: a batched matmul reads this layout
        without a copy of its own (the cut is a copy anyway).
        """
        return self._cut(x.reshape(self.rows, self.cols))

    def unblocks(self, blocks: torch.Tensor) -> torch.Tensor:
        """The tensor that ``blocks`` cut (the inverse of ``blocks``)."""
        return self._join(blocks).reshape(self.shape)

    def transform(self, blocks: torch.Tensor) -> torch.Tensor:
        """DCT of any number of ``(n, w, h)`` blocks of this block shape, as ``(n, block_numel)`` coefficients.

        ``c[n,i,j] = Σ x[n,w,h]·Bh[h,i]·Bw[w,j]`` as two batched matmuls, a third faster than
        the same contraction through ``einsum`` on CPU.
        """
        coeffs = (blocks @ self.basis_h).transpose(1, 2) @ self.basis_w
        return coeffs.reshape(coeffs.shape[0], self.block_numel)

    def inverse(self, coeffs: torch.Tensor) -> torch.Tensor:
        """The ``(n, w, h)`` blocks whose coefficients are ``coeffs`` (the inverse of ``transform``)."""
        return (coeffs.reshape(-1, self.h, self.w) @ self.basis_w_t).transpose(1, 2) @ self.basis_h_t

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.transform(self.blocks(x))

    def decode(self, coeffs: torch.Tensor) -> torch.Tensor:
        return self.unblocks(self.inverse(coeffs))


def compress(coeffs: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``topk`` largest-magnitude coefficients of every block (row).

    Returns ``(indices, values)``, each ``(num_blocks, min(topk, block_numel))``.
    """
    k = min(topk, coeffs.shape[-1])
    idx = torch.topk(coeffs.abs(), k, dim=-1, largest=True, sorted=False).indices
    return idx, torch.gather(coeffs, -1, idx)


def decompress(idx: torch.Tensor, val: torch.Tensor, block_numel: int) -> torch.Tensor:
    """Scatter ``(indices, values)`` back into dense blocks of ``block_numel`` coefficients.

    Several entries for the same coordinate (from different nodes) are averaged over
    the entries present; coordinates without an entry are zero. Sums and counts by
    ``scatter_add_`` are the reference's ``scatter_reduce(..., "mean", include_self=False)``
    at a third of its cost on CPU.
    """
    idx = idx.long()
    sums = val.new_zeros((idx.shape[0], block_numel)).scatter_add_(-1, idx, val)
    counts = val.new_zeros((idx.shape[0], block_numel)).scatter_add_(-1, idx, torch.ones_like(val))
    return sums.div_(counts.clamp_(min=1))


class _BlockGroup:
    """Parameters whose blocks share one shape and dtype: transformed, compressed and decoded together.

    Args:
        members: indices into the strategy's parameter list, in order.
        dcts: each member's ChunkedDCT (same ``h``, ``w`` and dtype).
        topk: coefficients kept per block.
    """

    def __init__(self, members: list[int], dcts: list[ChunkedDCT], topk: int) -> None:
        self.members, self.dcts = members, dcts
        self.dct = dcts[0]
        self.k = min(topk, self.dct.block_numel)
        self.splits = [d.num_blocks for d in dcts]
        self.num_blocks = sum(self.splits)
        self.side_by_side = Layout("(n b k) -> b (n k)", b=self.num_blocks, k=self.k)  # nodes' entries per block


DEFAULT_LR = 1e-3


def _warn_unused(spec: OptimSpec, weight_decay: float | None) -> None:
    """Say what of ``spec`` DeMo does not use: its class (DeMo is sign-SGD) and arguments other than lr and weight
    decay; a ``weight_decay`` given to DeMo wins over the spec's."""
    given = {"weight_decay"} if weight_decay is not None else set()
    taken = sorted(k for k in spec.kwargs if k in ("lr", "weight_decay") and k not in given)
    dropped = sorted(set(spec.kwargs) - set(taken))
    if spec.cls is torch.optim.SGD and not dropped:
        return
    unused = [k for k in dropped if k not in given]
    text = (f"DeMoStrategy: optim_spec gives DeMo its {', '.join(taken) or 'nothing'}; DeMo steps with its own "
            f"sign-SGD, so {spec.cls.__name__} is not used{', nor its ' + ', '.join(unused) if unused else ''}")
    if given & set(dropped):
        text += "; the weight_decay passed to DeMoStrategy wins over the spec's"
    warnings.warn(text, stacklevel=4)


def _block_groups(dcts: list[ChunkedDCT], dtypes: list[torch.dtype], topk: int) -> list[_BlockGroup]:
    """Group parameters by (block shape, dtype), in order of first appearance."""
    keys: dict[tuple[int, int, torch.dtype], list[int]] = {}
    for i, (dct, dtype) in enumerate(zip(dcts, dtypes)):
        keys.setdefault((dct.h, dct.w, dtype), []).append(i)
    return [_BlockGroup(members, [dcts[i] for i in members], topk) for members in keys.values()]


class DCTTopK:
    """DeMo's codec for a list of parameters: the chunked DCT of their momentum, its top-k per block on the wire.

    It keeps the error-feedback state, the momentum as DCT coefficients per block group (``coeffs``);
    ``accumulate`` adds a step's gradients to it, ``encode`` takes out and packs what is sent (one ``uint8``
    buffer of exactly ``wire_nbytes()`` bytes), and ``decode`` turns every node's buffer into each parameter's
    mean-decoded update (the wire format is the module docstring's).

    Args:
        params: the parameters (their shapes, dtypes and device).
        chunk: the target block side.
        topk: coefficients kept per block.
    """

    def __init__(self, params: Sequence[torch.Tensor], chunk: int, topk: int) -> None:
        self.dcts = [ChunkedDCT(p.shape, chunk, p.dtype, p.device) for p in params]
        self.dtypes = [p.dtype for p in params]
        self.groups = _block_groups(self.dcts, self.dtypes, topk)
        self.coeffs = [params[g.members[0]].new_zeros((g.num_blocks, g.dct.block_numel)) for g in self.groups]

    def wire_nbytes(self) -> int:
        """Bytes of one node's message: per group, every block's ``k`` indices and ``k`` values."""
        return sum(g.num_blocks * g.k * (_itemsize(g.dct.index_dtype) + _itemsize(self.dtypes[g.members[0]]))
                   for g in self.groups)

    def accumulate(self, grads: Sequence[torch.Tensor | None], lr: float, decay: float) -> None:
        """``m ← decay·m + lr·g`` on the coefficients (the DCT is linear); a missing gradient counts as zero."""
        for g, coeffs in zip(self.groups, self.coeffs):
            coeffs.mul_(decay)
            mine = [grads[i] for i in g.members]
            if any(grad is not None for grad in mine):
                blocks = [d.blocks(torch.zeros(d.shape, dtype=self.dtypes[i], device=coeffs.device) if grad is None
                                   else grad) for i, d, grad in zip(g.members, g.dcts, mine)]
                coeffs.add_(g.dct.transform(torch.cat(blocks)), alpha=lr)

    def encode(self) -> torch.Tensor:
        """The top-k coefficients of every block, packed; they leave the momentum (error feedback)."""
        parts: list[torch.Tensor] = []
        for g, coeffs in zip(self.groups, self.coeffs):
            idx, val = compress(coeffs, g.k)
            coeffs.scatter_(-1, idx, 0.0)
            parts += [idx.to(g.dct.index_dtype).reshape(-1).view(torch.uint8), val.reshape(-1).view(torch.uint8)]
        return torch.cat(parts)

    def decode(self, gathered: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's update from every node's message (``(nodes, wire_nbytes)``): per coordinate the mean
        of the values sent for it, inverse-transformed."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(self.dcts)
        offset = 0
        for g in self.groups:
            idx, offset = _take(gathered, offset, g.dct.index_dtype, g)
            val, offset = _take(gathered, offset, self.dtypes[g.members[0]], g)
            blocks = g.dct.inverse(decompress(idx, val, g.dct.block_numel))
            for i, d, rows in zip(g.members, g.dcts, blocks.split(g.splits)):
                out[i] = d.unblocks(rows)
        return out

    def momentum(self) -> list[torch.Tensor]:
        """Each parameter's momentum, in the parameter's shape (decoded from the kept coefficients)."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(self.dcts)
        for g, coeffs in zip(self.groups, self.coeffs):
            for i, d, rows in zip(g.members, g.dcts, coeffs.split(g.splits)):
                out[i] = d.decode(rows)
        return out


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class DeMoStrategy(Strategy):
    """DeMo: sign-SGD on the all-gathered top-k DCT components of each node's momentum.

    Args:
        optim_spec: DeMo's learning rate and weight decay, as the spec's ``lr`` (default 1e-3) and
            ``weight_decay``; the lr is used both inside the momentum (``m ← β·m + lr·g``) and for the
            sign step, and the lr schedule scales it. DeMo's update is its own sign-SGD, so another
            optimizer class (the gym passes AdamW) or other arguments are unused, with a warning.
        compression_decay: the momentum decay β, in [0, 1).
        compression_topk: coefficients kept per block, >= 1.
        compression_chunk: target block side (blocks are up to chunk × chunk), >= 1.
        weight_decay: decoupled weight decay, ``θ ← θ·(1 − lr·wd)`` every step; None takes the spec's (else 0).
        max_norm: clip each node's raw gradient norm before it enters the momentum.
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: as in ``Strategy``.
    """

    name = "demo"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        compression_decay: float = 0.999,
        compression_topk: int = 32,
        compression_chunk: int = 64,
        weight_decay: float | None = None,
    ) -> None:
        spec = OptimSpec.coerce(optim_spec, "optim_spec", OptimSpec("sgd", lr=DEFAULT_LR))
        _warn_unused(spec, weight_decay)
        lr = spec.kwargs.get("lr", DEFAULT_LR)
        weight_decay = spec.kwargs.get("weight_decay", 0.0) if weight_decay is None else weight_decay
        check_range("optim_spec's lr", lr, low=0, low_open=True)
        check_range("compression_decay", compression_decay, low=0)
        if compression_decay >= 1:
            raise ValueError(f"compression_decay must be < 1, got {compression_decay!r}")
        check_int("compression_topk", compression_topk, low=1)
        check_int("compression_chunk", compression_chunk, low=1)
        check_range("weight_decay", weight_decay, low=0)
        super().__init__(OptimSpec("sgd", lr=lr))
        self.compression_decay = compression_decay
        self.compression_topk = compression_topk
        self.compression_chunk = compression_chunk
        self.weight_decay = weight_decay

    @property
    def lr(self) -> float:
        """The base learning rate (``optim_spec``'s lr)."""
        return self.optim_spec.kwargs["lr"]

    def setup(self, model: torch.nn.Module, comm: "Communicator", ctx: NodeContext) -> None:
        """Group the parameters by block shape and keep each group's momentum as DCT coefficients.

        The DCT is linear, so ``DCT(β·m + lr·g) = β·DCT(m) + lr·DCT(g)``, and removing what
        was sent is zeroing those coefficients: one transform of the gradients per step
        instead of the reference's transform of the momentum and inverse of what was sent.
        The sign step is plain SGD.
        """
        super().setup(model, comm, ctx)
        self.codec = DCTTopK(self.params, self.compression_chunk, self.compression_topk)

    @torch.no_grad()
    def step(self) -> None:
        if self.max_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        if self.weight_decay:
            torch._foreach_mul_(self.params, 1.0 - lr * self.weight_decay)
        self.codec.accumulate([p.grad for p in self.params], lr, self.compression_decay)
        for p, update in zip(self.params, self.codec.decode(self.comm.all_gather(self.codec.encode()))):
            p.grad = update.sign_()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def momentum(self) -> list[torch.Tensor]:
        """Each parameter's momentum, in the parameter's shape."""
        return self.codec.momentum()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "momentum": [c.clone() for c in self.codec.coeffs]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for c, saved in zip(self.codec.coeffs, state["momentum"]):
            c.copy_(saved)


def _take(gathered: torch.Tensor, offset: int, dtype: torch.dtype, group: _BlockGroup) -> tuple[torch.Tensor, int]:
    """Every node's ``(blocks, k)`` array of ``dtype`` at byte ``offset``, side by side per block as
    ``(blocks, n·k)`` (what ``decompress`` scatters), and the next offset."""
    nbytes = group.num_blocks * group.k * torch.empty((), dtype=dtype).element_size()
    raw = gathered[:, offset : offset + nbytes].clone().view(dtype)
    return group.side_by_side(raw.reshape(-1)), offset + nbytes
