"""estimate: how long would a run take, without training it.

A strategy's real step logic runs on meta-device tensors (shapes, no memory) with a
recording communicator that performs no communication but records every
collective it is asked for. Compute per step is given (seconds, or tokens with
device TFLOP/s and MFU), or measured: a torch.profiler trace of the model (``profile=``,
exonet.profile) is replayed with each gradient ready when it was (exonet.estimate.compute).
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

Modules: ``models`` (the layer stack, or the user's model, on the meta device), ``compute`` (one step's
spans), ``meta`` (a rank's steps on meta tensors), ``hub`` (the online clock's threads), ``result``
(``Estimate`` and its replay), ``pipeline`` (a model in stages), ``solver`` (the bandwidth that reaches
a utilisation).
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from exonet.arguments import renamed
from exonet.estimate.compute import StepCompute, node_tokens, step_compute
from exonet.estimate.meta import run_online, run_rank
from exonet.estimate.models import DEFAULT_LAYERS, DTYPES, LayerStack, check_stack, given_model
from exonet.estimate.pipeline import PipelineSpec, pipelined
from exonet.estimate.result import Estimate, scenario_for_estimate, simulate_estimate
from exonet.netsim.agenda import SCALE
from exonet.scenario import Scenario, ScenarioLike
from exonet.scenario.schema import did_you_mean
from exonet.strategies.base import Strategy
from exonet.trace import Trace, coalesced
from exonet.units import plural

__all__ = ["DTYPES", "HOST_FABRIC", "Estimate", "LayerStack", "estimate", "parse_strategy", "scenario_for_estimate",
           "simulate_estimate", "with_hosts"]

DEFAULT_MFU = 0.4  # model FLOPs utilisation when neither --mfu nor a scenario's device gives one
# The replay's clock counts ticks of 2**-64 s and reads them back as floats, so a run's compute stays within
# half of what that holds, leaving the rest to communication.
MAX_COMPUTE_S = sys.float_info.max / SCALE / 2


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
            # an lr lives in its optimizer's spec: outer_lr is outer_optim_spec's, lr optim_spec's
            spec = k.lower().removesuffix("lr") + "optim_spec" if k.lower().endswith("lr") else ""
            same = [n for n in names if n.lower() in (k.lower(), spec)]
            hint = f" (did you mean {same[0]!r}?)" if same else did_you_mean(k, names)
            raise ValueError(f"strategy={name.strip()}: unknown argument {k!r}{hint}; "
                             f"{cls.__name__} takes {', '.join(names)}")
        try:
            kwargs[k] = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            kwargs[k] = v.strip()
    return cls(**kwargs)


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
        pipeline: the model in stages over ``num_nodes`` = stages × replicas ranks (``exonet.estimate.pipeline``); the
            strategy is then what the replicas of each stage do with its parameters: "ddp" (every step) or
            "diloco:H=..." (every H steps).
    """
    nodes = renamed("estimate", "num_nodes", num_nodes, "nodes", nodes)
    steps = renamed("estimate", "max_steps", max_steps, "steps", steps)
    if isinstance(strategy, str):
        strategy = parse_strategy(strategy)
    check_stack(params, layers, dtype)
    torch_dtype = DTYPES[dtype]
    if model is not None:
        if params is not None:
            raise ValueError("estimate: give params= or model=, not both")
        if layers is not None:
            raise ValueError("estimate: layers= shapes the params= stack; a model= has its own layers")
        make_model, described = given_model(model, torch_dtype)
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
        return pipelined(pipeline, strategy, real_params, getattr(net, "width", None), nodes, steps, step_time,
                          tokens_per_step, torch_dtype, described, uniform=profile is None and len(set(ratios)) == 1)
    strategy.check_world(nodes)
    compute, profiled = step_compute(net, step_time, flops, profile, scale_layers, devices, tflops, mfu)
    step_time = profiled["step_s"] if profiled else step_time
    assert step_time is not None  # given (checked by _compute), or measured by the profile
    computes = [compute if ratio == 1 else compute.scaled(ratio) for ratio in ratios]
    rerun = None
    first: list = []
    if strategy.asynchronous:
        if scenario is None:
            raise ValueError(f"estimate: {type(strategy).__name__} decides who syncs when by simulated time; give "
                             f"the scenario to run it in (scenario=)")
        rerun = lambda s: run_online(strategy, make_model, nodes, steps, computes, s)  # noqa: E731
        trace = rerun(scenario)
        trace.meta.update(params=real_params, steps=steps)
        uses_groups = True
    else:
        first, uses_groups = run_rank(strategy, make_model, 0, nodes, steps, compute)
        if uses_groups:  # every rank its own events; adjacent spans merged (the replay's cost is its events)
            per_rank = [coalesced(first)] + [
                run_rank(strategy, make_model, r, nodes, steps, computes[r], merge=True)[0] for r in range(1, nodes)]
        else:  # every rank rank 0's events (re-timed by its own compute): the replay mirrors them at no cost
            per_rank = _mirrored(first, compute, computes)
        trace = Trace(nodes, meta={"estimate": True, "strategy": type(strategy).__name__, "params": real_params,
                                   "steps": steps}, events=per_rank)
    run = uses_groups, rerun is not None
    result = _stated(trace, real_params, dtype, described, step_time, tflops, mfu, device, tokens_per_step, ratios,
                     profiled, run)
    result.rerun = rerun
    if not uses_groups and profiled is None and tokens_per_step is not None:
        result.retime = _OnDevice(first, compute, net, flops, steps, nodes, tokens_per_step, ratios, dict(trace.meta),
                                  (real_params, dtype, described, run))
    return result


@dataclass
class _OnDevice:
    """An estimate whose nodes all behave like rank 0, on another device (``Estimate.on_device``): rank 0's events
    as recorded once, each compute span swapped for the same span at that device's speed, so the strategy does not
    run again; the result is the estimate ``estimate(..., tflops=, mfu=)`` makes, span for span."""

    first: list
    compute: StepCompute
    net: Any
    flops: float
    steps: int
    nodes: int
    tokens_per_step: float
    ratios: list[float]
    meta: dict[str, Any]
    stated: tuple[int, str, str, tuple[bool, bool]]  # real_params, dtype, described, run (as ``_stated`` takes them)

    def __call__(self, tflops: float, mfu: float) -> Estimate:
        step_time, _, _, _ = _compute(self.flops, self.steps, None, self.tokens_per_step, tflops, mfu, None,
                                      self.nodes)
        other = step_compute(self.net, step_time, self.flops, None, None, None, tflops, mfu)[0]
        swap = self.compute.swap_for(other)
        computes = [other if q == 1 else other.scaled(q) for q in self.ratios]
        trace = Trace(self.nodes, meta=dict(self.meta),
                      events=_mirrored([swap.get(id(e), e) for e in self.first], other, computes))
        real_params, dtype, described, run = self.stated
        result = _stated(trace, real_params, dtype, described, step_time, tflops, mfu, "", self.tokens_per_step,
                         self.ratios, None, run)
        result.retime = self
        return result


def _mirrored(first: list, compute: StepCompute, computes: list[StepCompute]) -> list[list]:
    """Every rank's events when each behaves like rank 0 (``first``): rank r's own spans (``computes[r]``) in place
    of ``compute``'s; the same list objects where they are the same, so the replay mirrors them at no cost."""
    return [first] + [list(first) if computes[r] is compute
                      else [compute.swap_for(computes[r]).get(id(e), e) for e in first]
                      for r in range(1, len(computes))]


def _stated(trace: Trace, real_params: int, dtype: str, described: str, step_time: float, tflops: float | None,
            mfu: float | None, device: str, tokens_per_step: float | None, ratios: list[float],
            profiled: dict[str, Any] | None, run: tuple[bool, bool]) -> Estimate:
    """The estimate of ``trace``: the compute it was given in its meta (which ``simulate`` times it by, on any
    scenario), and the assumptions printed with it. ``run``: (every rank run separately, on the online clock)."""
    timed = tflops is not None and profiled is None
    trace.meta["compute"] = {"step_time_s": step_time, "tflops": tflops if timed else None,
                             "mfu": mfu if timed else None}
    if tokens_per_step is not None:  # what each node-step trains (exonet.study.tokens)
        trace.meta["tokens_per_step"] = [tokens_per_step * q for q in ratios]
    every = "on every node" if set(ratios) == {1.0} else f"on node 0, node r's times its tokens ({ratios[-1]:.3g} last)"
    separately, online = run
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
         if online
         else "every rank is run separately (the strategy uses subgroups or messages)" if separately
         else "every node behaves like rank 0"),
    ]
    return Estimate(trace, real_params, step_time, assumptions, profile=profiled)


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
