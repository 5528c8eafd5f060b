"""The ``exonet`` command line: quickstart, simulate, timeline, compare, scenarios, estimate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from exonet.errors import NodeFailure, ScenarioError, TraceError
from exonet.files import check_output


def _cmd_quickstart(args: argparse.Namespace) -> int:
    import exonet

    check_output(args.out, "--out", folder=True)
    exonet.warm_up()  # the node server's imports run beside the quickstart's own
    from exonet.study.quickstart import quickstart

    quickstart(out_dir=Path(args.out), steps=args.steps, nodes=args.nodes, scenarios=args.scenario or None)
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from exonet.netsim import simulate
    from exonet.scenario import Scenario
    from exonet.study.comparison import Run, expand_runs

    if args.chrome_trace:
        check_output(args.chrome_trace, "--chrome-trace")
    runs, notes = expand_runs(Path(args.run).name, args.run)
    for note in notes:
        print(f"exonet simulate: note: {note}", file=sys.stderr)
    loaded = {run_name: Run.coerce(run_name, run_path) for run_name, run_path in runs.items()}
    scenarios = [Scenario.coerce(name) for name in args.scenario]
    for run in loaded.values():  # every scenario must fit every run before any result is printed
        for scenario in scenarios:
            scenario.resolve(run.trace.num_ranks, servers=run.trace.meta.get("servers", 0))
    for run_name, run in loaded.items():
        for scenario in scenarios:
            sim = simulate(run.trace, scenario, history=run.history.get("train_loss"))
            if len(runs) > 1:
                print(f"run {run_name}:")
            print(sim.summary())
            if args.chrome_trace:
                path = Path(args.chrome_trace)
                if len(args.scenario) > 1 or len(runs) > 1:
                    tag = "-".join(([Path(run_name).name] if len(runs) > 1 else []) + [sim.scenario_name])
                    path = path.with_name(f"{path.stem}-{tag}{path.suffix}")
                sim.to_chrome_trace(path)
                print(f"chrome trace: {path}")
    return 0


def _cmd_timeline(args: argparse.Namespace) -> int:
    from exonet.netsim import simulate
    from exonet.study import timeline
    from exonet.study.comparison import Run, expand_runs

    out = check_output(args.out, "--out")
    runs, notes = expand_runs(Path(args.run).name, args.run)
    for note in notes:
        print(f"exonet timeline: note: {note}", file=sys.stderr)
    for run_name, run_path in runs.items():
        sim = simulate(Run.coerce(run_name, run_path).trace, args.scenario)
        path = out if len(runs) == 1 else out.with_name(f"{out.stem}-{Path(run_name).name}{out.suffix}")
        print(f"run {run_name}:")
        print(timeline.text(sim, links=args.links))
        print(f"timeline: {timeline.draw(sim, path, links=args.links, title=f'{run_name} in {sim.scenario_name}')}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    import warnings

    from exonet.study.comparison import compare, run_names

    if args.plot:
        check_output(args.plot, "--plot")
    runs: dict[str, str] = {}
    for item in args.runs:
        name, eq, path = item.partition("=")
        name, path = (name, path) if eq else (run_names([Path(item)])[0], item)
        if name in runs:
            if eq:
                raise ValueError(f"compare: the name {name!r} is given twice; names must be unique")
            name = path  # two paths with the same basename: fall back to the path as given
        if name in runs:
            raise ValueError(f"compare: {path} is given twice")
        runs[name] = path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = compare(runs, args.scenario, target_loss=args.target_loss)
    for w in caught:
        print(f"exonet compare: note: {str(w.message).removeprefix('compare: ')}", file=sys.stderr)
    print(table.to_markdown())
    if args.plot:
        print(f"plot: {table.plot(args.plot)}")
    return 0


def _cmd_scenarios(args: argparse.Namespace) -> int:
    from exonet.scenario import Scenario, list_presets

    if args.name:
        print(Scenario.load(args.name).describe())
        return 0
    for name in list_presets():
        print(f"{name:18s} {Scenario.load(name).description}")
    return 0


# estimate()'s keywords as the CLI spells them: its errors name the keyword (``params=``), the CLI's the flag
ESTIMATE_FLAGS = {"params": "--model-params", "model": "--model", "layers": "--layers", "strategy": "--strategy",
                  "num_nodes": "--nodes", "max_steps": "--steps", "step_time": "--step-time",
                  "tokens_per_step": "--tokens-per-step", "tflops": "--tflops", "mfu": "--mfu", "dtype": "--dtype",
                  "scenario": "--scenario", "profile": "--profile", "scale_layers": "--scale-layers",
                  "devices": "--devices"}


def in_flags(message: str) -> str:
    """An error of ``exonet.estimate`` reworded in the CLI's flags: ``params=1e30:`` reads ``--model-params 1e30:``."""
    import re

    names = "|".join(ESTIMATE_FLAGS)
    message = re.sub(rf"\b({names})=(?=[^\s,;:)])", lambda m: ESTIMATE_FLAGS[m[1]] + " ", message)
    return re.sub(rf"\b({names})=", lambda m: ESTIMATE_FLAGS[m[1]], message)


def _estimate_scenarios(args: argparse.Namespace) -> dict:
    """Each --scenario (with --hosts) checked against --nodes before any trace is built, by name."""
    from exonet.estimate import parse_strategy, with_hosts
    from exonet.scenario import Scenario

    servers = parse_strategy(args.strategy).servers
    scenarios = {}
    for name in args.scenario:
        scenario = with_hosts(name, args.hosts, args.nodes) if args.hosts is not None else Scenario.coerce(name)
        scenario.resolve(args.nodes + servers, servers=servers)
        scenarios[name] = scenario
    return scenarios


def _pipeline(args: argparse.Namespace) -> Any:
    """``--stages``, ``--micro-batches``, ``--schedule``, ``--boundary-codec``, ``--routing`` and ``--skip`` as a
    PipelineSpec (None without --stages)."""
    if args.stages is None:
        for flag, value, does in (("--boundary-codec", args.boundary_codec, "compresses what crosses"),
                                  ("--routing", args.routing, "routes micro-batches between"),
                                  ("--skip", args.skip, "passes micro-batches over")):
            if value is not None:
                raise ValueError(f"{flag} {does} a pipeline's stage boundaries: give --stages")
        return None
    from exonet.estimate.pipeline import PipelineSpec

    codec = None if args.boundary_codec is None else boundary_codec(args.boundary_codec)
    return PipelineSpec(args.stages, args.micro_batches, args.schedule, codec=codec, routing=args.routing,
                        skip=args.skip or 0.0)


def boundary_codec(text: str) -> Any:
    """``quantized:BITS``, ``topk:TOP_K`` (per 64 × 64 tile, values at 8 bits) or ``lowrank:RANK`` as a codec."""
    from exonet.runtime.boundary import LowRank, Quantized, TopK

    kinds = {"quantized": lambda n: Quantized(n), "topk": lambda n: TopK(top_k=n), "lowrank": lambda n: LowRank(n)}
    kind, _, number = text.partition(":")
    if kind not in kinds or not number.isdigit():
        raise ValueError(f"--boundary-codec: expected quantized:BITS, topk:TOP_K or lowrank:RANK, got {text!r}")
    return kinds[kind](int(number))


def compute_per_step(sim: Any) -> float:
    """One training node's compute in one step, as simulated (the trainers' mean)."""
    trainers = sim.per_node[:sim.trainers]
    return sum(p.compute_s for p in trainers) / max(1, sum(p.steps for p in trainers))


def _cmd_estimate(args: argparse.Namespace) -> int:
    try:
        return _estimate(args)
    except (ValueError, TypeError) as exc:
        raise type(exc)(in_flags(str(exc))) from None


def _estimate(args: argparse.Namespace) -> int:
    import json

    from exonet.estimate import estimate, simulate_estimate
    from exonet.estimate.solver import bandwidth_for_utilization, what_bounds
    from exonet.study.tokens import trained

    try:
        targets = [float(x) for x in args.solve_utilization.split(",")] if args.solve_utilization else []
    except ValueError:
        raise ValueError(f"--solve-utilization {args.solve_utilization!r}: expected compute utilisations as "
                         "numbers in (0, 1], comma-separated, such as 0.5,0.9") from None
    if args.solve_for is not None and not targets:
        raise ValueError(f"--solve-for {args.solve_for}: says what --solve-utilization varies; give that too")
    args.solve_for = args.solve_for or "nic"
    scenarios = _estimate_scenarios(args)
    profile = args.profile
    if profile is not None:  # read once, within its ceiling, for every scenario
        from exonet.profile.kineto import MAX_BYTES, read_profile

        profile = read_profile(profile, args.profile_max_size or MAX_BYTES)
    # --tokens-per-step without --tflops times compute on each scenario's own device: one estimate per scenario
    own_device = args.step_time is None and args.tflops is None
    estimates = {}
    for name in args.scenario if own_device else args.scenario[:1]:
        estimates[name] = estimate(
            args.strategy, params=args.model_params, num_nodes=args.nodes, max_steps=args.steps,
            step_time=args.step_time,
            tokens_per_step=args.tokens_per_step, tflops=args.tflops, mfu=args.mfu, dtype=args.dtype,
            layers=args.layers, model=args.model, scenario=name, profile=profile, scale_layers=args.scale_layers,
            devices=tuple(args.devices.split(":", 1)) if args.devices else None, pipeline=_pipeline(args))
    est = next(iter(estimates.values()))
    report: dict = {"strategy": args.strategy, "nodes": args.nodes, "steps": args.steps, "params": est.params,
                    "solve_for": args.solve_for, "assumptions": est.assumptions,
                    "payload_bytes_per_node": est.trace.payload_per_trainer(), "scenarios": []}
    if args.hosts is not None:
        report["hosts"] = args.hosts
    if est.trace.meta.get("servers"):
        report["servers"] = est.trace.meta["servers"]
    if est.profile is not None:
        report["profile"] = est.profile
    for name, scenario in scenarios.items():
        est = estimates.get(name, est)
        sim = simulate_estimate(est, scenario)
        row = {"scenario": sim.scenario_name, "wall_clock_s": sim.wall_clock_s,
               "wall_clock_range": list(sim.wall_clock_range), "expected_range": list(sim.expected_range),
               "regime": sim.regime, "time_per_1000_steps_s": 1000 * sim.wall_clock_s / max(1, sim.num_steps),
               "wire_bytes_per_level": sim.wire_by_level(),
               "utilization": sim.utilization,
               "compute_s_per_step": compute_per_step(sim), "wire_bytes_per_node": sim.wire_per_trainer(),
               "cost_usd": sim.cost, "cost_usd_per_1000_steps": 1000 * sim.cost / max(1, sim.num_steps),
               **trained(sim, est.trace)}  # what it trained beside its time: an elastic run may drop work
        failing = "failures" in scenario.to_dict()
        if failing or sim.failures or sim.lost["down"] or sim.lost["lost_work"]:  # work lost: goodput < utilisation
            row.update(failures=sim.failures, goodput=sim.goodput, lost_s=sim.lost)
        if est.assumptions != report["assumptions"]:  # this scenario's own device
            row["assumptions"] = est.assumptions
        if sim.cautions:
            row["cautions"] = list(sim.cautions)
        if targets:
            row["bandwidth_for_utilization"] = {
                f"{u:g}": bandwidth_for_utilization(est, scenario, u, solve_for=args.solve_for) for u in targets}
            row["bound_by"] = {u: what_bounds(est, scenario, float(u), args.solve_for)
                               for u, bw in row["bandwidth_for_utilization"].items() if bw is None}
        report["scenarios"].append(row)
    first = report["scenarios"][0]
    report.update({k: first[k] for k in ("wall_clock_s", "utilization", "compute_s_per_step",
                                         "bandwidth_for_utilization") if k in first})
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_estimate(args, report)
    return 0


def _print_estimate(args: argparse.Namespace, report: dict) -> None:
    """``exonet estimate``'s report as text."""
    from exonet.units import format_bytes, format_dollars, format_rate, format_time

    hosts = f" ({args.nodes // args.hosts} hosts of {args.hosts})" if args.hosts else ""
    print(f"estimate: {args.strategy} with K={args.nodes}{hosts}, {args.steps} steps, {report['params']:,} parameters")
    print("assumptions:")
    for a in report["assumptions"]:
        print(f"  - {a}")
    if "profile" in report:
        _print_profile(report["profile"])
    print(f"payload per node: {format_bytes(report['payload_bytes_per_node'])}")
    for row in report["scenarios"]:
        print(f"{row['scenario']}: simulated wall-clock {format_time(row['wall_clock_s'])}, "
              f"compute utilisation {row['utilization']:.1%}, "
              f"wire bytes per node {format_bytes(row['wire_bytes_per_node'])}")
        print(f"  {format_time(row['time_per_1000_steps_s'])} per 1,000 steps")
        if row["cost_usd"]:
            print(f"  egress {format_dollars(row['cost_usd'])} per run, "
                  f"{format_dollars(row['cost_usd_per_1000_steps'])} per 1,000 steps")
        levels = row["wire_bytes_per_level"]
        if levels["inter_region"] or levels["in_host"]:
            # each level's links carry the servers' sends too (theirs to the trainers): the total, per trainer
            whose = " (the servers' sends included)" if report.get("servers") else ""
            print(f"  wire bytes per node{whose}: " + ", ".join(f"{name.replace('_', '-')} {format_bytes(value)}"
                                                                for name, value in levels.items()))
        low, high = row["wall_clock_range"]
        if high > low:
            print(f"  range (p10-p90): {format_time(low)} to {format_time(high)}: losses in an overflowing queue")
        low, high = row["expected_range"]
        if high > low:
            print(f"  a real run (p10-p90): {format_time(low)} to {format_time(high)}, by the model's errors measured "
                  f"in the {row['regime']} regime")
        for a in row.get("assumptions", ()):
            if a not in report["assumptions"]:
                print(f"  - {a}")
        if row["tokens"] is not None or row["steps_trained"] < args.nodes * args.steps:
            said = f"{row['tokens']:.4g} tokens, {format_time(row['time_per_token_s'])} per token; " \
                if row["tokens"] is not None else ""
            print(f"  trained: {said}{row['steps_trained']} node-steps kept of {args.nodes * args.steps}")
        if "goodput" in row:
            lost = ", ".join(f"{k} {format_time(v)}" for k, v in row["lost_s"].items())
            print(f"  {row['failures']} failures, goodput {row['goodput']:.1%}; node-time lost: {lost}")
        for text in row.get("cautions", ()):
            print(f"  caution: {text}")
        for u, bw in row.get("bandwidth_for_utilization", {}).items():
            where = {"nic": "per NIC", "link": "on the inter-region link", "links": "on every inter-region link"}.get(
                args.solve_for, f"on the {args.solve_for.removeprefix('link:')} link")
            if bw is None:
                print(f"  compute utilisation {float(u):.0%} is out of reach: no bandwidth {where} gets there "
                      f"({row['bound_by'][u]})")
            else:
                print(f"  compute utilisation {float(u):.0%} needs {format_rate(bw / 8)} {where}")


def _print_profile(profile: dict) -> None:
    """A profiled estimate's step beside the FLOPs-based figure a guessed MFU would give."""
    from exonet.units import format_time

    used = f"median of {profile['steps_used']} steps" + ("; the first dropped as warm-up" if profile["warmup_dropped"]
                                                          else "") + f"; they spread {profile['spread']:.0%}"
    overhead = profile["profiler_overhead"]
    used += ("; the profiler's overhead not measured, so included" if overhead is None
             else f"; less the profiler's measured overhead, {overhead:.0%}")
    print(f"profiled step: {format_time(profile['profiled_step_s'])} on {profile['device']} ({used}); optimizer "
          f"{format_time(profile['optimizer_s'])}, device idle {format_time(profile['idle_s'])}; replayed as "
          f"{format_time(profile['step_s'])} per step")
    if "implied_mfu" in profile:
        print(f"  it implies MFU {100 * profile['implied_mfu']:.3g}% at {profile['tflops']:g} TFLOP/s; the FLOPs-based "
              f"figure at MFU {profile['mfu']:g} would be {format_time(profile['flops_step_s'])} per step")
    else:
        print("  give --tokens-per-step with --tflops (or a scenario with a device) for the MFU it implies")


def _tokens(text: str) -> float | list[float]:
    """``--tokens-per-step``: one number for every node, or one per node, comma-separated."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected tokens per step, one number or one per node comma-separated "
                                         f"(65536,65536,32768), got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _size(text: str) -> int:
    """``--profile-max-size``: a size such as "4 GiB"."""
    from exonet.units import parse_size

    try:
        return int(parse_size(text, "--profile-max-size", allow_zero=False))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_validate(args: argparse.Namespace) -> int:
    from exonet.validate.command import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exonet",
                                     description="Low-communication distributed training, simulated networks.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("quickstart",
                       help="train DDP, DiLoCo, SPARTA and DeMo on digits (K=4) and compare them on three networks")
    p.add_argument("--out", default="exonet_quickstart", help="folder for the runs, plot and traces")
    p.add_argument("--steps", type=int, default=400, help="optimizer steps per node (default 400)")
    p.add_argument("--nodes", type=int, default=4, help="K, the node processes each strategy trains with (default 4)")
    p.add_argument("--scenario", action="append", help="scenario to compare in (repeatable); default: three presets")
    p.set_defaults(func=_cmd_quickstart)

    p = sub.add_parser("simulate", help="replay a run directory or trace file in a scenario")
    p.add_argument("run",
                   help="run directory, trace.jsonl, or the folder given to fit(run_dir=...) (its complete runs)")
    p.add_argument("--scenario", action="append", required=True, help="preset name or TOML path (repeatable)")
    p.add_argument("--chrome-trace", help="also write a Perfetto/chrome://tracing JSON here")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("timeline", help="draw a run's replay as a Gantt chart (compute, comm, idle, async "
                                        "collectives, busiest links) and print it as text")
    p.add_argument("run",
                   help="run directory, trace.jsonl, or the folder given to fit(run_dir=...) (its complete runs)")
    p.add_argument("--scenario", required=True, help="preset name or TOML path")
    p.add_argument("--out", default="timeline.png", help="image to write (default timeline.png; one per run when "
                                                         "the folder holds several)")
    p.add_argument("--links", type=int, default=3, help="busiest links to show (default 3)")
    p.set_defaults(func=_cmd_timeline)

    p = sub.add_parser("compare", help="compare runs across scenarios")
    p.add_argument("runs", nargs="+", help="run directories, traces or folders of runs (fit's run_dir), "
                                           "optionally NAME=PATH")
    p.add_argument("--scenario", action="append", required=True, help="preset name or TOML path (repeatable)")
    p.add_argument("--target-loss", type=float, help="report the simulated time to reach this loss")
    p.add_argument("--plot", help="write loss vs simulated time to this PNG")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("scenarios", help="list the preset scenarios, or describe one")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=_cmd_scenarios)

    p = sub.add_parser("estimate", help="estimate a run's time without training (strategy logic on meta tensors)")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-params", type=float, help="parameter count of a transformer-like stack, e.g. 7e9")
    model.add_argument("--model", metavar="MOD:FN",
                       help="module:factory returning an nn.Module (built on the meta device). This imports MOD and "
                            "calls FN: it runs that code with your rights, so name only code you trust. MOD is found "
                            "on the import path: PYTHONPATH=. or python -m exonet for a module in this folder")
    p.add_argument("--layers", type=int, help="blocks in the --model-params stack (default 24)")
    p.add_argument("--strategy", required=True, help="e.g. ddp, diloco:H=500, sparta:p_sparta=0.005")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--scenario", action="append", required=True, help="preset name or TOML path (repeatable)")
    p.add_argument("--step-time", type=float, help="compute seconds per step per node")
    p.add_argument("--tokens-per-step", type=_tokens,
                   help="tokens per node per step (with --tflops and --mfu, or the scenario's device); or one per "
                        "node, comma-separated, node r's compute being node 0's times its share")
    p.add_argument("--tflops", type=float, help="device peak TFLOP/s (default: the scenario's device)")
    p.add_argument("--mfu", type=float,
                   help="model FLOPs utilisation (default 0.4, or the scenario's with its device)")
    p.add_argument("--dtype", default="fp32", help="parameter/transfer dtype: fp32, bf16, fp16")
    p.add_argument("--stages", type=int, metavar="S",
                   help="cut the model into S pipeline stages: --nodes is S x replicas (exonet.estimate.pipeline)")
    p.add_argument("--micro-batches", type=int, default=1, metavar="M", help="with --stages: micro-batches per step")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b", help="with --stages: the pipeline schedule")
    p.add_argument("--boundary-codec", metavar="quantized:BITS|topk:K|lowrank:R",
                   help="with --stages: what crosses each boundary, compressed (exonet.runtime.boundary)")
    p.add_argument("--routing", choices=("random", "balanced"),
                   help="with --stages and --schedule gpipe: route each micro-batch between stage replicas (SWARM)")
    p.add_argument("--skip", type=float, metavar="P",
                   help="with --stages and --schedule gpipe: each micro-batch passes over each middle stage with "
                        "probability P (SkipPipe)")
    p.add_argument("--hosts", type=int, metavar="G",
                   help="G consecutive nodes per host (NVLink-class fabric, 450 GB/s and 1 us per device, hierarchical "
                        "collectives), unless the scenario has [hosts]")
    p.add_argument("--solve-utilization", metavar="U,U,...",
                   help="find the NIC bandwidth (within 1%%) at which compute utilisation reaches each U, e.g. 0.5,0.9")
    p.add_argument("--solve-for", metavar="nic|link|link:A/B[,C/D]|links",
                   help="what --solve-utilization varies: every NIC (default), the scenario's only inter-region link, "
                        "the link between regions A and B (a comma-separated set: set alike), or every inter-region "
                        "link alike")
    p.add_argument("--profile", metavar="TRACE.json",
                   help="a torch.profiler trace (Kineto JSON) of --model's training steps: replay its measured step")
    p.add_argument("--profile-max-size", type=_size, metavar="SIZE",
                   help="with --profile: the largest trace read, on disk and decompressed (default 1 GiB)")
    p.add_argument("--scale-layers", type=int, metavar="N",
                   help="with --profile: the trace profiled N blocks of --model's stack; time the rest as those")
    p.add_argument("--devices", metavar="FROM:TO",
                   help="with --profile: rescale from the profiled device to another by peak FLOP/s (names such as "
                        "A100:H100, or TFLOP/s)")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(func=_cmd_estimate)

    from exonet.validate.command import add_arguments

    p = sub.add_parser("validate", help="measure real gloo traffic between shaped network namespaces (root) "
                                        "against the simulator; --calibrate fits the model")
    add_arguments(p)
    p.set_defaults(func=_cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ScenarioError, TraceError, NodeFailure, ValueError, TypeError, ImportError) as exc:
        print(f"exonet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the command reads or writes: name it, and why, on one line
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"exonet {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except (OverflowError, RecursionError, MemoryError) as exc:
        kind = ("a number too large to compute with" if isinstance(exc, OverflowError) else
                "nesting too deep to follow" if isinstance(exc, RecursionError) else "more memory than there is")
        print(f"exonet {args.command}: error: {_inputs(args)} needs {kind}" + (f": {exc}" if str(exc) else ""),
              file=sys.stderr)
        return 2


def _inputs(args: argparse.Namespace) -> str:
    """The inputs the command was given, for an error that no reader of one of them could pin on it."""
    given = []
    for key in ("run", "runs", "scenario", "profile", "model", "model_params"):
        value = getattr(args, key, None)
        if value:
            text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
            given.append(text if key in ("run", "runs") else f"--{key.replace('_', '-')} {text}")
    return "an input (" + ", ".join(given) + ")" if given else "the command line"


if __name__ == "__main__":
    sys.exit(main())
