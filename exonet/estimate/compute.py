"""What one node computes in one estimated step: forward, backward up to each gradient, then the rest.

``estimate`` replays a ``StepCompute`` on meta tensors: the forward span, then for each trainable
parameter in the order its gradient becomes ready the backward compute before it (and its hooks: DDP's
buckets, Streaming DiLoCo's fragments), then ``strategy.step()``, then the tail (the optimizer and the
rest of a measured step). It is either spread evenly (``even``: 6·P·tokens at a device's TFLOP/s and MFU,
or a given step time, forward a third and each tensor's backward by its size) or measured
(``measured``: a torch.profiler trace, exonet.profile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from exonet.profile import MeasuredStep, StepProfile, measure, read_profile
from exonet.trace import Compute

FORWARD_SHARE = 1 / 3  # forward 2·P FLOPs per token, backward 4·P (Kaplan et al. 2020)


@dataclass
class StepCompute:
    """One node's compute in one step: ``forward``, then ``backward`` as (trainable-parameter index, the
    compute before its gradient is ready) in the order gradients become ready, then ``tail`` after the
    strategy's step (None: nothing)."""

    forward: Compute
    backward: list[tuple[int, Compute]]
    tail: Compute | None = None

    def spans(self) -> list[Compute]:
        """Every span, in order."""
        return [self.forward, *(c for _, c in self.backward), *([self.tail] if self.tail else [])]

    @property
    def step_s(self) -> float:
        """Seconds of compute in the step."""
        return sum(c.wall_s for c in self.spans())

    def scaled(self, factor: float) -> StepCompute:
        """This step at ``factor`` times the work (a node with ``factor`` times the tokens)."""
        def times(c: Compute) -> Compute:
            return Compute(c.wall_s * factor, c.cpu_s * factor, c.flops * factor)

        return StepCompute(times(self.forward), [(i, times(c)) for i, c in self.backward],
                           times(self.tail) if self.tail else None)

    def swap_for(self, other: StepCompute) -> dict[int, Compute]:
        """Each span of this step (by identity) → the same span of ``other``: a copied rank's events, re-timed."""
        return {id(a): b for a, b in zip(self.spans(), other.spans())}


def even(step_time: float, flops: float, sizes: Sequence[int]) -> StepCompute:
    """``step_time`` (and ``flops``) split as estimate assumes without a profile: forward a third, then
    backward in reverse parameter order, each tensor's share by its size."""
    total = sum(sizes) or 1
    back = 1 - FORWARD_SHARE
    forward = Compute(step_time * FORWARD_SHARE, step_time * FORWARD_SHARE, flops * FORWARD_SHARE)
    return StepCompute(forward, [(i, Compute(step_time * back * n / total, step_time * back * n / total,
                                             flops * back * n / total)) for i, n in reversed(list(enumerate(sizes)))])


def measured(step: MeasuredStep, flops: float) -> StepCompute:
    """A measured step's spans; ``flops`` (6·P·tokens, 0 when unknown) shared out by time."""
    share = flops / step.step_s if step.step_s > 0 else 0.0

    def span(seconds: float) -> Compute:
        return Compute(seconds, seconds, seconds * share)

    return StepCompute(span(step.forward_s), [(i, span(s)) for i, s in zip(step.order, step.backward_s)],
                       span(step.tail_s))


def node_tokens(tokens_per_step: float | Sequence[float] | None, nodes: int) -> tuple[float | None, list[float]]:
    """Node 0's tokens per step and each node's work relative to node 0's (``tokens_per_step`` a number,
    the same on every node, or one per node: a slower site can take a smaller batch)."""
    if tokens_per_step is None or isinstance(tokens_per_step, (int, float)):
        return tokens_per_step, [1.0] * nodes
    tokens = list(tokens_per_step)
    if len(tokens) != nodes:
        raise ValueError(f"tokens_per_step=: {len(tokens)} per-node values for {nodes} nodes; give one per node "
                         "(or one number for all)")
    if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in tokens):
        raise ValueError(f"tokens_per_step=: each node's tokens must be a finite number > 0, got {tokens}")
    return float(tokens[0]), [t / tokens[0] for t in tokens]


def step_compute(net: Any, step_time: float | None, flops: float, profile: Any, scale_layers: int | None,
                 devices: tuple[Any, Any] | None, tflops: float | None, mfu: float | None
                 ) -> tuple[StepCompute, dict[str, Any] | None]:
    """One node's step on the model ``net``: ``step_time`` spread ``even``ly, or ``profile``'s (a trace path or a
    ``StepProfile``) as measured, with what the estimate reports beside it: the profiled step, the MFU it
    implies and the FLOPs-based step at ``mfu`` (with ``tflops``)."""
    if profile is None:
        if scale_layers is not None or devices is not None:
            raise ValueError("estimate: scale_layers= and devices= scale a profiled step; give profile= too")
        return even(step_time or 0.0, flops, [p.numel() for p in net.parameters() if p.requires_grad]), None
    given = profile if isinstance(profile, StepProfile) else read_profile(profile)
    step = measure(given, net, scale_layers=scale_layers, devices=devices)
    report: dict[str, Any] = {"path": given.path, "step_s": step.step_s, "profiled_step_s": given.step_s,
                              "steps_used": given.steps_used, "warmup_dropped": given.warmup_dropped,
                              "spread": given.spread, "profiler_overhead": given.overhead,
                              "optimizer_s": given.optimizer_s, "idle_s": given.idle_s, "device": given.device,
                              "notes": list(step.notes)}
    if flops and tflops and mfu:
        report.update(tflops=tflops, implied_mfu=flops / (step.step_s * tflops * 1e12), mfu=mfu,
                      flops_step_s=flops / (tflops * 1e12 * mfu))
    return measured(step, flops), report
