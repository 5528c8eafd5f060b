"""A profiled step laid onto a model's parameters: which gradient is ready when, at this depth, on this device.

The profiler names gradients only by their shape (``record_shapes=True``) and the order they become
ready in. ``measure`` matches them to the model's trainable parameters: each in turn takes, among the
parameters of its shape not yet taken, the one registered last (backward runs from the output back), so
a model whose parameters do not match the trace's is an error naming the first that does not. Without
shapes the order is taken as the reverse of registration, and only the count is checked.

A model's layers are its parameters grouped by the first indexed module on their path
(``blocks.3.attn.weight`` → ``blocks.3``); the container with the most indices (``blocks``) is the
stack ``scale_layers`` deepens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from exonet.errors import TraceError
from exonet.profile.kineto import StepProfile

# Dense BF16/FP16 tensor peak TFLOP/s of common devices (vendor sheets), for ``devices=``; any number works too.
DEVICE_TFLOPS = {"B200": 2250.0, "H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
                 "RTX4090": 165.0, "A10G": 125.0, "V100": 125.0}


@dataclass(frozen=True)
class MeasuredStep:
    """One node's step as measured: ``forward_s``, then ``backward_s[i]`` before trainable parameter
    ``order[i]`` (its index in ``model.parameters()``) has its gradient, then ``tail_s`` (optimizer and the
    rest of the step). ``notes`` say what was measured and how it was scaled."""

    forward_s: float
    order: tuple[int, ...]
    backward_s: tuple[float, ...]
    tail_s: float
    profiled_s: float
    notes: tuple[str, ...]

    @property
    def step_s(self) -> float:
        """The whole step's compute, as replayed."""
        return self.forward_s + sum(self.backward_s) + self.tail_s


def device_tflops(device: Any) -> float:
    """A device's peak TFLOP/s: a number, or a name of ``DEVICE_TFLOPS``."""
    if isinstance(device, (int, float)) and not isinstance(device, bool) and device > 0:
        return float(device)
    key = str(device).strip().upper().replace(" ", "").replace("-", "")
    try:
        return float(key) if key.replace(".", "", 1).isdigit() and float(key) > 0 else DEVICE_TFLOPS[key]
    except KeyError:
        raise ValueError(f"devices=: unknown device {device!r}: give its peak TFLOP/s as a number, or one of "
                         f"{', '.join(DEVICE_TFLOPS)}") from None


def layer_of(name: str) -> tuple[str, str | None, int | None]:
    """``blocks.3.attn.weight`` → ``("blocks.3", "blocks", 3)``; ``wte.weight`` → ``("wte", None, None)``."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i + 1]), ".".join(parts[:i]), int(part)
    return parts[0], None, None


def _block(stack: str, index: int) -> str:
    """The module path of block ``index`` of ``stack`` (``h.3``; ``3`` in a top-level Sequential)."""
    return f"{stack}.{index}" if stack else str(index)


def measure(profile: StepProfile, model: torch.nn.Module, *, scale_layers: int | None = None,
            devices: tuple[Any, Any] | None = None) -> MeasuredStep:
    """``profile``'s step on ``model``: per-parameter gradient-ready times, deepened and re-timed as asked.

    Args:
        profile: the profiled step (``read_profile``).
        model: the model to estimate (may be on the meta device).
        scale_layers: the trace profiled this many blocks of the model's stack: the rest are timed
            layer by layer as the profiled ones (block j as profiled block ⌊j·scale_layers/depth⌋).
        devices: ``(profiled, target)``, names or peak TFLOP/s: every time is scaled by their ratio.

    Raises:
        TraceError: the trace's gradients do not match the model's parameters (naming the file).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    index = {n: i for i, (n, _) in enumerate(named)}
    stacks: dict[str, list[int]] = {}
    for n, _ in named:
        _, container, k = layer_of(n)
        if container is not None and k is not None and k not in stacks.setdefault(container, []):
            stacks[container].append(k)
    stack = max(stacks, key=lambda c: len(stacks[c]), default=None)
    depth = sorted(stacks[stack]) if stack is not None else []
    notes = list(profile.notes)
    kept = depth
    if scale_layers is not None:
        if isinstance(scale_layers, bool) or not isinstance(scale_layers, int) or not 1 <= scale_layers <= len(depth):
            raise ValueError(f"scale_layers={scale_layers!r}: expected the blocks profiled, 1 to the model's "
                             f"{len(depth)} blocks of {stack!r}" if stack else
                             f"scale_layers={scale_layers!r}: the model has no indexed stack of blocks to scale")
        kept = depth[:scale_layers]
    profiled = [i for i, (n, _) in enumerate(named) if layer_of(n)[1] != stack or layer_of(n)[2] in kept]
    order = _match(profile, named, profiled, scale_layers)
    forward, gaps, tail = profile.forward_s, list(profile.backward_s), profile.tail_s
    if scale_layers is not None and len(kept) < len(depth) and stack is not None:
        order, gaps, forward, tail = _deepen(profile, model, named, index, order, gaps, stack, kept, depth)
        notes.append(f"scaled from {len(kept)} to {len(depth)} blocks of {stack!r}, layer by layer (block j timed "
                     f"as profiled block ⌊j·{len(kept)}/{len(depth)}⌋; the optimizer by parameter count)")
    if devices is not None:
        source, target = devices
        ratio = device_tflops(source) / device_tflops(target)
        forward, gaps, tail = forward * ratio, [g * ratio for g in gaps], tail * ratio
        notes.append(f"caution: compute scaled from {source} ({device_tflops(source):g} TFLOP/s) to {target} "
                     f"({device_tflops(target):g} TFLOP/s) by the ratio of peak FLOP/s; memory bandwidth, kernels "
                     "and shapes do not scale so: profile on the target device when you can")
    return MeasuredStep(forward, tuple(order), tuple(gaps), tail, profile.step_s, tuple(notes))


def _match(profile: StepProfile, named: list, profiled: list[int], scale_layers: int | None) -> list[int]:
    """The trainable-parameter index of each gradient of the trace, in the order they become ready."""
    shapes = profile.grad_shapes
    if len(shapes) != len(profiled):
        hint = "" if scale_layers is not None else " (or give scale_layers=, the blocks the trace profiled)"
        raise TraceError(f"{profile.path}: the profiled step has {len(shapes)} gradients (AccumulateGrad ops) but "
                         f"the model has {len(profiled)} trainable parameter tensors"
                         f"{' in the blocks profiled' if scale_layers is not None else ''}: profile the model "
                         f"given{hint}")
    known = [s for s in shapes if s is not None]
    if len(known) < len(shapes):
        return profiled[::-1]
    pool: dict[tuple[int, ...], list[int]] = {}
    for i in profiled:
        pool.setdefault(tuple(named[i][1].shape), []).append(i)
    order = []
    for k, shape in enumerate(known):
        free = pool.get(tuple(shape))
        if not free:
            left = sorted({named[i][0] + str(list(s)) for s, rest in pool.items() for i in rest})[:4]
            raise TraceError(f"{profile.path}: gradient {k} of the profiled step has shape {list(shape)}, which no "
                             f"parameter of the model left unmatched has (left: {', '.join(left) or 'none'}): "
                             "profile the model given")
        order.append(free.pop())
    return order


def _deepen(profile: StepProfile, model: torch.nn.Module, named: list, index: dict[str, int], order: list[int],
            gaps: list[float], stack: str, kept: list[int], depth: list[int]) -> tuple:
    """The profiled blocks' timings laid over the whole stack: (order, gaps, forward, tail)."""
    source = {j: kept[pos * len(kept) // len(depth)] for pos, j in enumerate(depth)}
    runs: list[tuple[int | None, list[tuple[int, float]]]] = []
    for i, gap in zip(order, gaps):
        _, container, k = layer_of(named[i][0])
        block = k if container == stack else None
        if not runs or runs[-1][0] != block or block is None:
            runs.append((block, []))
        runs[-1][1].append((i, gap))
    new_order, new_gaps = [], []
    for block, run in runs:
        for j in (sorted((j for j in depth if source[j] == block), reverse=True) if block is not None else [None]):
            for i, gap in run:
                name = (named[i][0] if j is None or block is None
                        else _block(stack, j) + named[i][0][len(_block(stack, block)):])
                new_order.append(index[name])
                new_gaps.append(gap)
    backward = {b: sum(g for i, g in zip(order, gaps) if layer_of(named[i][0])[1:] == (stack, b)) for b in kept}
    forward_of = _block_forward(profile, model, stack, kept, backward)
    forward = profile.forward_s + sum(forward_of[source[j]] for j in depth) - sum(forward_of.values())
    sizes = [sum(p.numel() for n, p in named if layer_of(n)[1] != stack or layer_of(n)[2] in blocks)
             for blocks in (kept, depth)]
    tail = profile.tail_s + profile.optimizer_s * (sizes[1] / max(sizes[0], 1) - 1)
    return new_order, new_gaps, forward, tail


def _block_forward(profile: StepProfile, model: torch.nn.Module, stack: str, kept: list[int],
                   backward: dict[int, float]) -> dict[int, float]:
    """Each profiled block's forward seconds: from its ``record_function`` (named as its path) or its
    ``nn.Module: Class_i`` annotation, else the forward pass shared out as the blocks' backward is."""
    counts: dict[str, int] = {}
    labels = {}
    for name, module in model.named_modules():
        cls = type(module).__name__
        labels[name] = f"{cls}_{counts.get(cls, 0)}"
        counts[cls] = counts.get(cls, 0) + 1
    found = {}
    for b in kept:
        path = _block(stack, b)
        found[b] = profile.modules.get(path, profile.modules.get(labels.get(path, "")))
    if all(v is not None for v in found.values()):
        return found  # type: ignore[return-value]
    total = sum(profile.backward_s) or 1.0
    return {b: profile.forward_s * backward[b] / total for b in kept}
