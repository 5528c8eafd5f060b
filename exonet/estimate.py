"""estimate: how long would a run take, without training it.

A strategy's real step logic runs on meta-device tensors (shapes, no memory) with a
recording communicator that performs no communication but records every
collective it is asked for. Compute per step is given (seconds, or tokens with
device TFLOP/s and MFU). The resulting trace is simulated like a recorded one.

Assumptions (printed with every estimate):
* the model is a stack of equal 2-D weight matrices holding ``params`` parameters;
* each step's compute is the same on every node (scenario speeds and jitter still apply);
* compute inside ``strategy.step()`` (e.g. DeMo's transforms) is not counted, and the inner
  optimizer is not run (its numerics never change what goes on the wire);
* every node behaves like rank 0 unless the strategy uses subgroups, in which case every rank is run.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from exonet.communicator import Communicator
from exonet.strategies.base import NodeContext, Strategy
from exonet.trace import Collective, Compute, Step, Trace

ROW = 4096
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


class RecordingCommunicator(Communicator):
    """A Communicator that records collectives and returns correctly shaped results, without a network."""

    def declare_groups(self, groups: Any) -> None:
        """No process groups exist without a network; remember that the strategy uses them."""
        self.uses_groups = True

    def group_of(self, ranks: Any) -> Any:
        return None

    def _run(self, op: str, payload: torch.Tensor, group: Any, async_op: bool,
             launch: Callable[[bool], Any], finish: Callable[[], Any]) -> Any:
        cid = self._next_cid
        self._next_cid += 1
        dtype = str(payload.dtype).removeprefix("torch.")
        self.events.append(Collective(cid, op, payload.numel() * payload.element_size(), self._members(group),
                                      async_op, dtype))
        if async_op:
            from exonet.communicator import Handle

            return Handle(self, cid, None, finish)
        return finish()

    def _flush_compute(self) -> None:
        """Compute is injected per step by the estimator, never measured here."""


class MetaModel(torch.nn.Module):
    """``params`` parameters as equal (rows × 4096) matrices on the meta device."""

    def __init__(self, params: int, dtype: torch.dtype, tensors: int = 8) -> None:
        super().__init__()
        rows = max(1, round(params / (tensors * ROW)))
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.empty(rows, ROW, device="meta", dtype=dtype)) for _ in range(tensors))


@dataclass
class Estimate:
    """An estimated run: its synthetic trace and what was assumed."""

    trace: Trace
    params: int
    step_time_s: float
    assumptions: list[str]


def parse_strategy(spec: str) -> Strategy:
    """``"diloco:H=500,outer_optim=sgd"`` → a constructed strategy (values parsed as Python literals)."""
    from exonet.strategies import STRATEGIES

    name, _, args = spec.partition(":")
    key = name.strip().lower().replace("-", "_")
    if key not in STRATEGIES:
        raise ValueError(f"--strategy: unknown strategy {name!r}; valid: {', '.join(sorted(STRATEGIES))}")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"--strategy: expected key=value in {item!r} (e.g. diloco:H=500)")
        try:
            kwargs[k.strip()] = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            kwargs[k.strip()] = v.strip()
    return STRATEGIES[key](**kwargs)


def _run_rank(strategy: Strategy, rank: int, nodes: int, steps: int, dtype: torch.dtype, params: int,
              step_time: float, flops: float) -> tuple[list, bool]:
    """One rank's events, and whether its strategy declared subgroups (then ranks differ)."""
    import copy

    strat = copy.deepcopy(strategy)
    model = MetaModel(params, dtype)
    comm = RecordingCommunicator(rank, nodes, torch.device("meta"))
    strat.setup(model, comm, NodeContext(rank, nodes, steps, 0, torch.device("meta")))
    strat.optimizer.step = lambda *a, **k: None  # local numerics never change what goes on the wire
    grads = [torch.empty_like(p) for p in model.parameters()]
    events: list = []
    for _ in range(steps):
        strat.zero_grad()
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        comm.events.append(Compute(step_time, step_time, flops))
        strat.step()
        comm.events.append(Step())
        events.extend(comm.events)
        comm.events = []
    strat.finish()
    events.extend(comm.events)
    return events, getattr(comm, "uses_groups", False)


def estimate(strategy: Strategy | str, *, params: float, nodes: int, steps: int, step_time: float | None = None,
             tokens_per_step: float | None = None, tflops: float | None = None, mfu: float = 0.4,
             dtype: str = "fp32") -> Estimate:
    """Build the trace a run would produce, from the strategy's own logic on meta tensors.

    Args:
        strategy: a Strategy or a spec such as "diloco:H=500".
        params: model parameters (e.g. 7e9).
        nodes: K.
        steps: optimizer steps per node.
        step_time: compute seconds per step per node; or give tokens_per_step, tflops and mfu.
        tokens_per_step: tokens per node per step (compute = 6 · params · tokens FLOPs).
        tflops: device peak TFLOP/s.
        mfu: model FLOPs utilisation.
        dtype: parameter/transfer dtype: fp32, bf16 or fp16.
    """
    if isinstance(strategy, str):
        strategy = parse_strategy(strategy)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if not (params >= 1 and nodes >= 1 and steps >= 1):
        raise ValueError(f"estimate: params, nodes and steps must be >= 1, got {params}, {nodes}, {steps}")
    flops = 6.0 * params * (tokens_per_step or 0.0)
    if step_time is None:
        if not (tokens_per_step and tflops):
            raise ValueError("estimate: give --step-time, or --tokens-per-step with --tflops (and --mfu)")
        if not 0 < mfu <= 1:
            raise ValueError(f"--mfu must be in (0, 1], got {mfu}")
        step_time = flops / (tflops * 1e12 * mfu)
    if step_time < 0 or not math.isfinite(step_time):
        raise ValueError(f"--step-time must be a finite number >= 0, got {step_time}")
    torch_dtype = DTYPES[dtype]
    n_params = MetaModel(int(params), torch_dtype).weights
    real_params = sum(p.numel() for p in n_params)
    first, uses_groups = _run_rank(strategy, 0, nodes, steps, torch_dtype, int(params), step_time, flops)
    per_rank = [first] + [
        _run_rank(strategy, r, nodes, steps, torch_dtype, int(params), step_time, flops)[0] if uses_groups
        else list(first)
        for r in range(1, nodes)
    ]
    trace = Trace(nodes, meta={"estimate": True, "strategy": type(strategy).__name__, "params": real_params,
                               "steps": steps}, events=per_rank)
    assumptions = [
        f"model: {real_params:,} parameters as 8 equal 2-D matrices of width {ROW} ({dtype})",
        f"compute: {step_time:.4g} s per step on every node"
        + (f" (6·P·{tokens_per_step:g} tokens at {tflops:g} TFLOP/s × MFU {mfu:g})" if tokens_per_step and tflops else ""),
        "compute inside strategy.step() (e.g. transforms, quantisation) is not counted",
        "every rank is run separately (the strategy uses subgroups)" if uses_groups else "every node behaves like rank 0",
    ]
    return Estimate(trace, real_params, step_time, assumptions)
