"""estimate: how long would a run take, without training it.

A strategy's real step logic runs on meta-device tensors (shapes, no memory) with a
recording communicator that performs no communication but records every
collective it is asked for. Compute per step is given (seconds, or tokens with
device TFLOP/s and MFU), or measured: a torch.profiler trace of the model (``profile=``,
exonet.profile) is replayed with each gradient ready when it was (exonet.estimate_compute).
The resulting trace is simulated like a recorded one.

The model is a stack of layers: by default an embedding and a transformer-like stack of
``layers`` blocks of 12·d² parameters each (attention 4·d², MLP 8·d²; d a multiple of 128), or any ``nn.Module`` built
on the meta device (``--model module:factory``). Each step is a forward pass (a third
of the step's compute), then backward in reverse parameter order: each parameter
tensor's gradient arrives after backward compute proportional to its size (FLOPs of a
dense layer are proportional to its parameters), and its post-accumulate-grad hooks
run at that moment. So DDP's buckets and Streaming DiLoCo's fragments overlap the
remaining backward exactly as they do in a recorded run.

Assumptions (printed with every estimate):
* each step's compute is the same on every node (scenario speeds and jitter still apply), or node 0's
  times each node's share of ``tokens_per_step`` when it is given per node;
* compute inside ``strategy.step()`` (e.g. DeMo's transforms) is not counted, and the inner
  optimizer is not run (its numerics never change what goes on the wire);
* every node behaves like rank 0 unless the strategy uses subgroups or point-to-point messages, in which case
  every rank is run.

A strategy that reacts to simulated time (``Strategy.asynchronous``: a server, as asynchronous
DiLoCo and FedBuff have, or deadline rounds) cannot be estimated apart from a scenario: every
rank (servers too) runs in a thread of its own against the online clock of ``fit`` (exonet.runtime.clock),
which answers their questions in the scenario, so the trace is the one ``fit(scenario=...)`` would
record. Such an estimate is re-run for every scenario (and every bandwidth a solve tries).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import math
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from exonet.arguments import renamed
from exonet.communicator import Communicator, any_source_question
from exonet.estimate_compute import StepCompute, node_tokens, step_compute
from exonet.estimate_hub import OnlineHub, RankLink
from exonet.netsim.agenda import SCALE
from exonet.pipeline import PipelineSpec, pipeline_trace
from exonet.scenario import Scenario, ScenarioLike
from exonet.scenario.schema import did_you_mean
from exonet.strategies.base import NodeContext, Strategy
from exonet.trace import Collective, Step, Trace, coalesced
from exonet.units import plural

if TYPE_CHECKING:
    from exonet.netsim.result import SimResult

DEFAULT_LAYERS = 24
DEFAULT_MFU = 0.4  # model FLOPs utilisation when neither --mfu nor a scenario's device gives one
# What the model holds. The layer stack's largest tensor, at most a third of it, stays within the 2**63
# bytes torch can size (6.9e18 parameters of 4 bytes at one block); the replay's clock counts ticks of
# 2**-64 s and reads them back as floats, so a run's compute stays within half of what that holds,
# leaving the rest to communication.
MAX_PARAMS = 1e18
MAX_COMPUTE_S = sys.float_info.max / SCALE / 2
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


class RecordingCommunicator(Communicator):
    """A Communicator that records collectives and returns correctly shaped results, without a network."""

    def declare_groups(self, groups: Any) -> None:
        """No process groups exist without a network; remember whether the strategy uses subgroups
        (then ranks differ, as they do when it sends point-to-point)."""
        if any(len(set(group)) < self.world_size for group in groups):
            self.uses_groups = True

    def group_of(self, ranks: Any) -> Any:
        return None

    def _run(self, op: str, payload: torch.Tensor, group: Any, async_op: bool,
             launch: Callable[[bool], Any], finish: Callable[[], Any], key: str | None = None) -> Any:
        cid = self._next_cid
        self._next_cid += 1
        if op in ("send", "recv", "put", "get"):  # a peer or a key is chosen per rank: ranks differ
            self.uses_groups = True
        dtype = str(payload.dtype).removeprefix("torch.")
        self.events.append(Collective(cid, op, payload.numel() * payload.element_size(), self._members(group),
                                      async_op, dtype, key=key))
        if async_op:
            from exonet.communicator import Handle

            return Handle(self, cid, None, finish)
        return finish()

    def _flush_compute(self) -> float:
        """Compute is injected per step by the estimator, never measured here (now, as the base returns)."""
        return self.now()

    def recv_any(self, tensor: torch.Tensor | Callable[[int], torch.Tensor]) -> tuple[int, float] | None:
        """Ask the online clock who is received first (as ``Communicator.recv_any``); nothing is received."""
        if self.clock is None:
            return super().recv_any(tensor)  # its error: the online clock is needed
        cid = self._next_cid
        self._next_cid += 1
        events, self.events = self.events, []
        answer = self.clock.ask(any_source_question(cid, tensor), events)
        if answer is not None and callable(tensor):
            tensor(answer[0])  # the sender's buffer: the strategy reads which message it is
        return answer


class LayerStack(torch.nn.Module):
    """``params`` parameters as a token embedding and ``layers`` transformer-like blocks, on the meta device.

    Sized as real models are, so that strategies whose payload depends on shapes (DeMo's
    64 × 64 DCT blocks) see real shapes: the width d is the largest multiple of 128 (of 8
    below 128) with 12·d²·layers ≤ ``params``; each block holds four matrices, d×3d (QKV),
    d×d (output), d×4d and 4d×d (MLP); the remainder goes to an embedding of V×d, V a
    multiple of 128 (vocabularies are padded so), which keeps the total within 64·d of
    ``params``.
    """

    def __init__(self, params: int, layers: int, dtype: torch.dtype) -> None:
        super().__init__()
        raw = math.sqrt(params / (12 * layers))
        granule = 128 if raw >= 128 else 8 if raw >= 8 else 1
        d = max(1, int(raw // granule) * granule)
        vocab = max(0, round((params - 12 * layers * d * d) / (128 * d))) * 128
        self.width, self.vocab = d, vocab

        def param(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape, device="meta", dtype=dtype))

        self.embedding = torch.nn.ParameterList([param(vocab, d)] if vocab else [])
        shapes = ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d))
        self.blocks = torch.nn.ModuleList(torch.nn.ParameterList(param(*shape) for shape in shapes)
                                          for _ in range(layers))


def load_model(spec: str, dtype: torch.dtype) -> torch.nn.Module:
    """``"package.module:factory"`` → the module the factory returns, built on the meta device in ``dtype``."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"model={spec!r}: expected module:factory (e.g. mypkg.models:build)")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        hint = ("; it is looked for on the import path, which holds the current folder under python -m exonet (or "
                "PYTHONPATH=. exonet ...) but not under the bare exonet command"
                if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0] else "")
        raise ValueError(f"model={spec!r}: cannot import {module_name!r}: {exc}{hint}") from None
    except AttributeError:
        raise ValueError(f"model={spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory):
        raise TypeError(f"model={spec!r}: not callable")
    with torch.device("meta"):
        model = factory()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model={spec!r}: {spec}() returned {type(model).__name__}, expected a torch.nn.Module")
    return model.to(dtype=dtype)


@dataclass
class Estimate:
    """An estimated run: its synthetic trace and what was assumed.

    ``rerun`` is set for a strategy that reacts to simulated time: its trace was decided in one
    scenario, and ``trace_in`` builds the trace another scenario gives.
    """

    trace: Trace
    params: int
    step_time_s: float
    assumptions: list[str]
    rerun: Callable[[Any], Trace] | None = field(default=None, repr=False)
    profile: dict | None = None  # a profiled estimate's step, the MFU it implies and the FLOPs-based figure

    def trace_in(self, scenario: ScenarioLike) -> Trace:
        """The trace to replay in ``scenario`` (re-run on the online clock when the strategy needs it)."""
        if self.rerun is None:
            return self.trace
        if scenario_for_estimate(scenario).fingerprint == self.trace.meta["decided_in"]["fingerprint"]:
            return self.trace
        return self.rerun(scenario)


def parse_strategy(spec: str) -> Strategy:
    """``"diloco:H=500,outer_optim_spec=sgd"`` → a constructed strategy (values parsed as Python literals)."""
    from exonet.strategies import STRATEGIES

    name, _, args = spec.partition(":")
    key = name.strip().lower().replace("-", "_")
    if key not in STRATEGIES:
        raise ValueError(f"strategy={spec!r}: unknown strategy {name!r}; valid: {', '.join(sorted(STRATEGIES))}")
    cls = STRATEGIES[key]
    # a spec names the strategy's own arguments: the gym's spellings, which its constructor takes with a
    # warning for old code, are an error here
    names = [n for n, p in inspect.signature(cls).parameters.items() if p.kind is not p.VAR_KEYWORD]
    kwargs: dict[str, Any] = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"strategy={spec!r}: expected key=value in {item!r} (e.g. diloco:H=500)")
        k = k.strip()
        if k not in names:
            same = [n for n in names if n.lower() == k.lower()]
            hint = f" (did you mean {same[0]!r}?)" if same else did_you_mean(k, names)
            raise ValueError(f"strategy={name.strip()}: unknown argument {k!r}{hint}; "
                             f"{cls.__name__} takes {', '.join(names)}")
        try:
            kwargs[k] = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            kwargs[k] = v.strip()
    return cls(**kwargs)


@functools.lru_cache(maxsize=4096)
def _meta_grad(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A meta gradient of this shape, shared by every rank and step: it has no storage to share, and building one
    costs as much as a rank's step (a thousand ranks of a hundred tensors took 4.5 s)."""
    return torch.empty(shape, dtype=dtype, device="meta")


def _given_model(model: str | Callable[[], torch.nn.Module],
                 dtype: torch.dtype) -> tuple[Callable[[], torch.nn.Module], str]:
    """``estimate(model=...)``: a factory of the model on the meta device in ``dtype``, and its description."""
    if isinstance(model, str):
        spec = model
        return (lambda: load_model(spec, dtype)), f"{spec}()"
    factory = model

    def make_model() -> torch.nn.Module:
        with torch.device("meta"):
            return factory().to(dtype=dtype)

    return make_model, f"{getattr(factory, '__name__', repr(factory))}()"


def _pipelined(spec: PipelineSpec, strategy: Strategy, params: int, width: int | None, nodes: int, steps: int,
               step_time: float | None, tokens: float | None, dtype: torch.dtype, described: str, *,
               uniform: bool) -> Estimate:
    """``estimate`` of a pipeline: ``nodes`` ranks as replicas of ``spec.stages`` stages (``exonet.pipeline``);
    ``uniform``: every replica computes alike (no profile, no per-node tokens)."""
    if step_time is None or not uniform:
        raise ValueError("estimate: pipeline= takes one step_time or tokens_per_step for every replica, not a "
                         "profile or per-node tokens")
    if nodes % spec.stages:
        raise ValueError(f"estimate: num_nodes={nodes} is not a multiple of stages={spec.stages}: the ranks are "
                         "replicas of the whole pipeline")
    replicas = nodes // spec.stages
    sync_every = {"ddp": 1, "diloco": getattr(strategy, "H", 0)}.get(strategy.name)
    if sync_every is None:
        raise ValueError(f"estimate: with a pipeline, the strategy says what a stage's replicas exchange: ddp (every "
                         f"step) or diloco:H=... (every H steps), not {strategy.name}")
    size = torch.empty((), dtype=dtype).element_size()
    activation = spec.activation_bytes
    if activation is None:
        if tokens is None or width is None:
            raise ValueError("estimate: a pipeline's activations are tokens per micro-batch × the model's width; give "
                             "tokens_per_step= and params= (or the PipelineSpec's activation_bytes=)")
        activation = tokens / spec.micro_batches * width * size
    trace = pipeline_trace(spec, replicas=replicas, steps=steps, step_time=step_time, activation_bytes=activation,
                           stage_bytes=params * size / spec.stages, sync_every=sync_every,
                           dtype=str(dtype).removeprefix("torch."))
    trace.meta.update(estimate=True, strategy=type(strategy).__name__, params=params, steps=steps,
                      compute={"step_time_s": step_time, "tflops": None, "mfu": None})
    exchange = ("none" if replicas == 1 else f"every {plural(sync_every, 'step')} an all-reduce of the stage's "
                f"{params * size / spec.stages:.4g} bytes among its {replicas} replicas")
    assumptions = [
        f"model: {params:,} parameters: {described}",
        f"pipeline: {plural(spec.stages, 'stage')} × {plural(replicas, 'replica')}, "
        f"{spec.micro_batches} micro-batch{'' if spec.micro_batches == 1 else 'es'} per step, "
        f"{spec.schedule}; {activation:.4g} bytes of activations per micro-batch and boundary, each way; {exchange}",
        f"compute: {step_time:.4g} s per step for a replica's whole model, 1/{spec.stages} of it per stage, a forward "
        "a third and a backward two thirds of each micro-batch's share",
    ]
    return Estimate(trace, params, step_time, assumptions)


def _fire_grad_hooks(p: torch.nn.Parameter) -> None:
    """Run ``p``'s post-accumulate-grad hooks, as autograd does once its gradient is accumulated.

    Meta tensors have no real backward pass worth its cost (milliseconds per step), so the
    estimator fires the hooks itself in backward order.
    """
    hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
    for hook in hooks.values():
        hook(p)


def _run_rank(strategy: Strategy, make_model: Callable[[], torch.nn.Module], rank: int, nodes: int, steps: int,
              compute: StepCompute, hub: OnlineHub | None = None, merge: bool = False) -> tuple[list, bool]:
    """One rank's events, and whether its strategy declared subgroups (then ranks differ).

    With ``hub`` (an asynchronous strategy) each step's events are reported to the online clock
    instead (the hub keeps them), and a server rank serves instead of training. ``merge``: when no gradient
    has a hook (nothing happens between the spans), the forward and backward go in as one span (``coalesced``).
    """
    strat = copy.deepcopy(strategy)
    model = make_model()  # a model of its own: the strategy registers hooks on it
    world = nodes + (strategy.servers if hub is not None else 0)
    comm = RecordingCommunicator(rank, world, torch.device("meta"))
    if hub is not None:
        comm.clock = RankLink(hub, rank)
    strat.setup(model, comm, NodeContext(rank, nodes, steps, 0, torch.device("meta")))
    if rank >= nodes:  # a server: its own work takes no simulated time
        strat.serve(lambda updates, sim_time_s: None)
        assert hub is not None  # only an asynchronous run has servers (ranks from nodes on)
        hub.report(rank, comm.events, done=True)
        return [], True
    # local numerics never change what goes on the wire
    strat.optimizer.step = lambda *a, **k: None  # type: ignore[method-assign, assignment]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [_meta_grad(tuple(p.shape), p.dtype) for p in params]
    # the hooks a strategy registered in setup (DDP's buckets ...): the only gradients whose arrival does anything
    hooked = [bool(getattr(p, "_post_accumulate_grad_hooks", None)) for p in params]
    whole = coalesced([compute.forward, *(span for _, span in compute.backward)]) if merge and not any(hooked) else None
    events: list = []
    for _ in range(steps):
        strat.zero_grad()
        strat.prepare_backward(True)
        traced = not comm.sitting_out  # an elastic node that is down: its work is not the run's (as in fit)
        if whole is not None:
            if traced:
                comm.events.extend(whole)
            for p, grad in zip(params, grads):
                p.grad = grad
        else:
            if traced:
                comm.events.append(compute.forward)
            for i, span in compute.backward:
                if traced:
                    comm.events.append(span)
                params[i].grad = grads[i]
                if hooked[i]:
                    _fire_grad_hooks(params[i])
        strat.step()
        if traced and compute.tail is not None:  # a measured step's optimizer and the rest, after the strategy's
            comm.events.append(compute.tail)
        comm.events.append(Step())
        if hub is not None:
            hub.report(rank, comm.events)
        else:
            events.extend(comm.events)
        comm.events = []
    strat.finish()
    if hub is not None:
        hub.report(rank, comm.events, done=True)
        return [], True
    events.extend(comm.events)
    return events, getattr(comm, "uses_groups", False)


def _run_online(strategy: Strategy, make_model: Callable[[], torch.nn.Module], nodes: int, steps: int,
                computes: list[StepCompute], scenario: ScenarioLike) -> Trace:
    """Every rank (trainers, then servers) in a thread against the online clock in ``scenario``; their trace."""
    from exonet.runtime.clock import SimClock

    chosen = scenario_for_estimate(scenario)
    world = nodes + strategy.servers
    elastic = strategy.elastic  # its failed nodes discard their own work, as in fit
    hub = OnlineHub(SimClock(chosen, world, math.inf, steps, trainers=nodes, synchronous=False,
                             what=type(strategy).__name__, given_compute=True, rewind=not elastic), world)

    def run(rank: int) -> None:
        hub.enter()
        try:
            _run_rank(strategy, make_model, rank, nodes, steps, computes[min(rank, nodes - 1)], hub)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            hub.fail(exc)
        finally:
            hub.leave()

    threads = [threading.Thread(target=run, args=(r,), name=f"estimate-rank-{r}", daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if hub.error is not None:
        raise hub.error
    meta = {"estimate": True, "strategy": type(strategy).__name__, "servers": strategy.servers,
            "decided_in": {"scenario": chosen.name, "fingerprint": chosen.fingerprint}}
    if elastic:
        meta["elastic"] = True
    return Trace(meta=meta, events=hub.events, num_ranks=world)


def estimate(strategy: Strategy | str, *, params: float | None = None, num_nodes: int | None = None,
             max_steps: int | None = None, step_time: float | None = None, tokens_per_step: float | None = None,
             tflops: float | None = None, mfu: float | None = None, dtype: str = "fp32", layers: int | None = None,
             model: str | Callable[[], torch.nn.Module] | None = None, scenario: ScenarioLike | None = None,
             nodes: int | None = None, steps: int | None = None, profile: Any = None,
             scale_layers: int | None = None, devices: tuple[Any, Any] | None = None,
             pipeline: PipelineSpec | None = None) -> Estimate:
    """Build the trace a run would produce, from the strategy's own logic on meta tensors.

    Args:
        strategy: a Strategy or a spec such as "diloco:H=500".
        params: model parameters (e.g. 7e9), for the default layer stack.
        num_nodes: K (``fit``'s name; the CLI's ``--nodes``).
        max_steps: optimizer steps per node (``fit``'s name; the CLI's ``--steps``).
        step_time: compute seconds per step per node; or give tokens_per_step, tflops and mfu.
        tokens_per_step: tokens per node per step (compute = 6 · params · tokens FLOPs), or one per node: node
            r's compute is node 0's times its tokens over node 0's (a slower site can take a smaller batch).
        tflops: device peak TFLOP/s; without it, the scenario's device (``[compute]`` tflops and mfu).
        mfu: model FLOPs utilisation (default 0.4, or the scenario's with its device).
        dtype: parameter/transfer dtype: fp32, bf16 or fp16.
        layers: blocks in the default stack (default 24; a ``model`` has its own).
        model: instead of ``params``, a model: "module:factory", or a factory, built on the meta device.
        scenario: where a strategy that reacts to simulated time (``Strategy.asynchronous``) is run on the
            online clock; required for those, unused by the others.
        nodes, steps: the old spellings of ``num_nodes`` and ``max_steps``, deprecated (one release).
        profile: a torch.profiler trace of ``model`` (path or ``exonet.profile.StepProfile``): node 0's
            step is replayed as measured, each gradient ready when it was (exonet.profile); tflops= and mfu=
            (or the scenario's device) then only give the FLOPs-based figure printed beside it.
        scale_layers: with ``profile``, the blocks of the model's stack the trace profiled (4 of 32).
        devices: with ``profile``, (profiled device, target device): names or peak TFLOP/s.
        pipeline: the model in stages over ``num_nodes`` = stages × replicas ranks (``exonet.pipeline``); the
            strategy is then what the replicas of each stage do with its parameters: "ddp" (every step) or
            "diloco:H=..." (every H steps).
    """
    nodes = renamed("estimate", "num_nodes", num_nodes, "nodes", nodes)
    steps = renamed("estimate", "max_steps", max_steps, "steps", steps)
    if isinstance(strategy, str):
        strategy = parse_strategy(strategy)
    _check_stack(params, layers, dtype)
    torch_dtype = DTYPES[dtype]
    if model is not None:
        if params is not None:
            raise ValueError("estimate: give params= or model=, not both")
        if layers is not None:
            raise ValueError("estimate: layers= shapes the params= stack; a model= has its own layers")
        make_model, described = _given_model(model, torch_dtype)
        net = make_model()
        params = float(sum(p.numel() for p in net.parameters()))
    elif params is None:
        raise ValueError("estimate: give params= (a parameter count) or model= (module:factory)")
    if not (params >= 1 and nodes >= 1 and steps >= 1) or not math.isfinite(params):
        raise ValueError(f"estimate: params=, num_nodes= and max_steps= must be finite and >= 1, got {params}, "
                         f"{nodes}, {steps}")
    chosen = None if scenario is None else Scenario.coerce(scenario)  # the door: a Scenario from here on
    if chosen is not None:  # a scenario that cannot hold the nodes fails now, not after the trace is built
        chosen.resolve(nodes + strategy.servers, servers=strategy.servers)
    tokens_per_step, ratios = node_tokens(tokens_per_step, nodes)
    flops = 6.0 * params * (tokens_per_step or 0.0)
    step_time, tflops, mfu, device = (
        _compute(flops, steps, step_time, tokens_per_step, tflops, mfu, chosen, nodes) if profile is None
        else _profile_device(step_time, model, tflops, mfu, chosen, nodes))
    if model is None:
        count, layers = int(params), layers or DEFAULT_LAYERS
        make_model = lambda: LayerStack(count, layers, torch_dtype)  # noqa: E731
        net = make_model()
        blocks = plural(layers, "transformer-like block")
        described = f"{blocks} of 12·d² parameters, d = {net.width}, and a {net.vocab}×{net.width} embedding"
    real_params = sum(p.numel() for p in net.parameters())
    if model is None and not params / 2 <= real_params <= 2 * params:
        raise ValueError(f"params={params:g}: {blocks} cannot hold about that many parameters (the nearest "
                         f"stack has {real_params:,}); give a count such as 1.5e9, or other layers=")
    if pipeline is not None:
        return _pipelined(pipeline, strategy, real_params, getattr(net, "width", None), nodes, steps, step_time,
                          tokens_per_step, torch_dtype, described, uniform=profile is None and len(set(ratios)) == 1)
    strategy.check_world(nodes)
    compute, profiled = step_compute(net, step_time, flops, profile, scale_layers, devices, tflops, mfu)
    step_time = profiled["step_s"] if profiled else step_time
    assert step_time is not None  # given (checked by _compute), or measured by the profile
    computes = [compute if ratio == 1 else compute.scaled(ratio) for ratio in ratios]
    rerun = None
    if strategy.asynchronous:
        if scenario is None:
            raise ValueError(f"estimate: {type(strategy).__name__} decides who syncs when by simulated time; give "
                             f"the scenario to run it in (scenario=)")
        rerun = lambda s: _run_online(strategy, make_model, nodes, steps, computes, s)  # noqa: E731
        trace = rerun(scenario)
        trace.meta.update(params=real_params, steps=steps)
        uses_groups = True
    else:
        first, uses_groups = _run_rank(strategy, make_model, 0, nodes, steps, compute)
        if uses_groups:  # every rank its own events; adjacent spans merged (the replay's cost is its events)
            per_rank = [coalesced(first)] + [
                _run_rank(strategy, make_model, r, nodes, steps, computes[r], merge=True)[0] for r in range(1, nodes)]
        else:  # every rank rank 0's events (re-timed by its own compute): the replay mirrors them at no cost
            per_rank = [first] + [list(first) if computes[r] is compute
                                  else [compute.swap_for(computes[r]).get(id(e), e) for e in first]
                                  for r in range(1, nodes)]
        trace = Trace(nodes, meta={"estimate": True, "strategy": type(strategy).__name__, "params": real_params,
                                   "steps": steps}, events=per_rank)
    # the compute it was given travels with the trace: simulate times it so on any scenario (exonet.netsim.replay)
    timed = tflops is not None and profile is None
    trace.meta["compute"] = {"step_time_s": step_time, "tflops": tflops if timed else None,
                             "mfu": mfu if timed else None}
    if tokens_per_step is not None:  # what each node-step trains (exonet.tokens)
        trace.meta["tokens_per_step"] = [tokens_per_step * q for q in ratios]
    every = "on every node" if set(ratios) == {1.0} else f"on node 0, node r's times its tokens ({ratios[-1]:.3g} last)"
    assumptions = [
        f"model: {real_params:,} parameters ({dtype}): {described}",
        (f"compute: {step_time:.4g} s per step {every}"
         + (f" (6·P·{tokens_per_step:g} tokens at {tflops:g} TFLOP/s × MFU {mfu:g}{device})" if timed else "")
         + "; forward a third, backward two thirds, in reverse parameter order, each tensor's share by its size")
        if profiled is None else
        (f"compute: {step_time:.4g} s per step {every}, measured by torch.profiler ({profiled['path']}): the "
         "forward pass, then backward with each gradient ready when it was measured, then the optimizer and the "
         f"rest of the step; {'; '.join(profiled['notes'])}"),
        "compute inside strategy.step() (e.g. transforms, quantisation) is not counted; a scenario's [compute] "
        "device is replaced by this compute (its per-node speeds and jitter still apply)",
        ("every rank (and server) is run on the online clock in the scenario (the strategy reacts to simulated time)"
         if rerun is not None
         else "every rank is run separately (the strategy uses subgroups or messages)" if uses_groups
         else "every node behaves like rank 0"),
    ]
    return Estimate(trace, real_params, step_time, assumptions, rerun, profiled)


def _profile_device(step_time: float | None, model: Any, tflops: float | None, mfu: float | None,
                    scenario: Scenario | None, nodes: int) -> tuple[None, float | None, float, str]:
    """A profiled estimate's device for the FLOPs-based figure beside it: tflops=, else the scenario's if it
    names one (else none); mfu= or the default. Its step time is None: the profile measures it."""
    if step_time is not None:
        raise ValueError("estimate: give profile= or step_time=, not both (the profile measures the step)")
    if model is None:
        raise ValueError("estimate: profile= needs model= (the profiled model: its parameters say which gradient "
                         "in the trace is which)")
    device = ""
    if tflops is None and scenario is not None:
        if scenario.resolve(nodes).compute_mode == "flops":
            tflops, own_mfu, device = _scenario_device(scenario, nodes)
            mfu = own_mfu if mfu is None else mfu
    return None, tflops, DEFAULT_MFU if mfu is None else mfu, device


def _check_stack(params: float | None, layers: int | None, dtype: str) -> None:
    """``estimate``'s model size, blocks and dtype, checked before anything is built."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ValueError(f"layers= must be an integer >= 1, got {layers!r}")
    if params is not None and math.isfinite(params) and params > MAX_PARAMS:
        raise ValueError(f"params={params:g}: more than the layer stack holds ({MAX_PARAMS:g} parameters: "
                         "torch sizes a tensor up to 2**63 bytes)")
    if params is not None and layers is not None and layers > params / 12:
        raise ValueError(f"layers={layers}: more blocks than {params:g} parameters fill (a block holds at least "
                         "12 parameters, 12·d² with d >= 1)")


def _compute(flops: float, steps: int, step_time: float | None, tokens_per_step: float | None, tflops: float | None,
             mfu: float | None, scenario: Scenario | None, nodes: int) -> tuple[float, float | None, float | None, str]:
    """The compute ``estimate`` was given, checked: (seconds per step, TFLOP/s, MFU, words naming the device).

    Given as ``step_time`` seconds, or as ``flops`` per step (``tokens_per_step``) at ``tflops`` x ``mfu``,
    or at the scenario's device when ``tflops`` is not given.
    """
    device = ""
    if step_time is not None:
        if tflops is not None or mfu is not None or tokens_per_step is not None:
            raise ValueError("estimate: give step_time=, or tokens_per_step= with tflops= and mfu=, not both "
                             "(step_time= is the compute time itself)")
        if step_time < 0 or not math.isfinite(step_time):
            raise ValueError(f"step_time= must be a finite number >= 0, got {step_time}")
    else:
        if tokens_per_step is None:
            raise ValueError("estimate: give step_time=, or tokens_per_step= (with tflops= and mfu=, or a "
                             "scenario whose [compute] names a device)")
        if not (tokens_per_step > 0 and math.isfinite(tokens_per_step)):
            raise ValueError(f"tokens_per_step= must be a finite number > 0, got {tokens_per_step}")
        if tflops is None:
            tflops, scenario_mfu, device = _scenario_device(scenario, nodes)
            mfu = scenario_mfu if mfu is None else mfu
        mfu = DEFAULT_MFU if mfu is None else mfu
        if not (tflops > 0 and math.isfinite(tflops)):
            raise ValueError(f"tflops= must be a finite number > 0, got {tflops}")
        if not 0 < mfu <= 1:
            raise ValueError(f"mfu= must be in (0, 1], got {mfu}")
        step_time = flops / (tflops * 1e12 * mfu)
    if not steps * step_time <= MAX_COMPUTE_S:
        given = (f"step_time={step_time:g}" if tokens_per_step is None else
                 f"tokens_per_step={tokens_per_step:g} at {tflops:g} TFLOP/s and MFU {mfu:g} (a step of "
                 f"{step_time:g} s)")
        raise ValueError(f"{given}: {steps} steps of it are {steps * step_time:g} s of compute, more than the "
                         f"simulated clock holds ({MAX_COMPUTE_S:.3g} s)")
    return step_time, tflops, mfu, device


def _scenario_device(scenario: Scenario | None, nodes: int) -> tuple[float, float, str]:
    """The device of ``scenario``'s ``[compute]`` (TFLOP/s, MFU, and words saying so), for ``--tokens-per-step``
    without ``--tflops``."""
    if scenario is None:
        raise ValueError("estimate: tokens_per_step= needs tflops= (and mfu=), or a scenario whose [compute] "
                         "names a device")
    r = scenario.resolve(nodes)
    if r.compute_mode != "flops" or not r.tflops:
        raise ValueError(f"estimate: tokens_per_step= without tflops= takes the scenario's device, but scenario "
                         f"{scenario.name!r} times compute by {r.compute_mode!r}, not by FLOPs; give tflops=")
    return r.tflops, r.mfu, f", the device of scenario {scenario.name!r}"


def scenario_for_estimate(scenario: ScenarioLike) -> Scenario:
    """``scenario`` with its compute taken from the estimate's own spans (``mode = "wall"``).

    An estimate states its compute (a step time, or tokens at a device's TFLOP/s and MFU),
    so a preset's ``[compute]`` device does not apply; per-node speeds and jitter still do.
    """
    from exonet.netsim.replay import with_given_compute

    return with_given_compute(Scenario.coerce(scenario))


def simulate_estimate(trace: Trace | Estimate, scenario: ScenarioLike) -> SimResult:
    """Replay an estimate's trace in ``scenario`` (with the compute the estimate was given); an asynchronous
    Estimate is re-run there first."""
    from exonet.netsim import simulate

    chosen = scenario_for_estimate(scenario)
    if isinstance(trace, Estimate):
        trace = trace.trace_in(chosen)
    return simulate(trace, chosen)


HOST_FABRIC = {"bandwidth": "450 GB/s", "latency": "1 us"}  # --hosts: NVLink-class, per device, each direction


def with_hosts(scenario: ScenarioLike, devices: int, nodes: int | None = None) -> Scenario:
    """``scenario`` with its ranks in hosts of ``devices`` (``--hosts G``), unless it has ``[hosts]`` already.

    The hosts get an NVLink-class fabric (``HOST_FABRIC``: 450 GB/s per device each way, H100 SXM's
    NVLink 4 being 900 GB/s both ways together; 1 us) and per-device NICs at the scenario's
    ``network.bandwidth``. With a ``backend`` the library's own algorithms run over the hosts (NCCL's
    rails and trees, gloo's ring); without one, exonet's phase model runs its hierarchical algorithms
    (a ``collective`` chosen for flat nodes is replaced). A scenario with ``[hosts]`` keeps its own
    table and collective; asking for other ``devices`` than it has is an error.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"--hosts: expected an integer >= 1 (devices per host), got {devices!r}")
    if nodes is not None and nodes % devices:
        raise ValueError(f"--hosts {devices} does not divide --nodes {nodes}: every host holds {devices} devices")
    chosen = Scenario.coerce(scenario)
    own = chosen.to_dict().get("hosts")
    if own is None:
        hosted = chosen.replace(hosts={"devices": devices, **HOST_FABRIC})
        return hosted if "backend" in hosted.to_dict()["network"] else hosted.replace(collective="hierarchical")
    if own.get("devices") != devices:
        raise ValueError(f"--hosts {devices}: scenario {chosen.name!r} already has [hosts] "
                         f"devices = {own.get('devices')}")
    return chosen
