"""A small GPT in four stages on four sites: pipeline parallelism over slow links, trained for real and timed.

The character GPT of ``exonet.toy.staged_gpt`` (an embedding, two transformer blocks and a head, width 64;
text: a few standard-library modules of this interpreter, nothing downloaded) is cut into four stages, one
per node, and trained with 1F1B over eight micro-batches per step. Four runs, from the same weights:

* the activations (and their gradients) cross each boundary as they are;
* the same through ``LowRank(rank=8)``: the width-64 activations on a fixed basis of 8 columns, 1/8 of the bytes;
* two such pipelines (8 nodes), the replicas of each stage kept in step by DiLoCo every ``--H`` steps;
* the same with each micro-batch routed to either replica of every later stage (SWARM; ``routing="balanced"``,
  which runs GPipe).

Each trace is replayed on four sites at ``--bandwidth`` with ``--latency`` between them, the nodes filling them in
rank order (one stage per site; two pipelines' 8 nodes two by two, so each spans two sites), compute charged by
FLOPs at ``--tflops``, so the times are the same on every machine. It prints the validation loss, the bytes that
crossed a boundary per step, the simulated time and the bubble (the share of the stages' time not spent
computing: 1 − ``SimResult.utilization``), and plots validation loss against simulated time.

    python examples/pipeline_across_sites.py [--steps 60] [--H 10] [--bandwidth "100 Mbit/s"] [--latency "30 ms"]
                                             [--tflops 0.002] [--out examples/pipeline_across_sites.png]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from exonet import FitResult, LocalTrainer, PipelineSpec, Scenario, SimResult
from exonet.runtime.boundary import LowRank
from exonet.strategies import DDPStrategy, DiLoCoStrategy, OptimSpec, Strategy
from exonet.toy import CharWindows, staged_gpt, stdlib_text
from exonet.units import format_bytes, format_time

BLOCK, WIDTH, STAGES, MICRO = 64, 64, 4, 8
SITES = ("site-a", "site-b", "site-c", "site-d")


def four_sites(bandwidth: str, latency: str, nodes: int, tflops: float) -> Scenario:
    """Four sites, ``nodes`` split evenly over them in rank order, ``latency`` apart over links of ``bandwidth``."""
    links = [{"between": [a, b], "bandwidth": bandwidth, "latency": latency}
             for i, a in enumerate(SITES) for b in SITES[i + 1:]]
    return Scenario.from_dict({
        "name": "four-sites", "network": {"bandwidth": bandwidth, "latency": "1 ms"},
        "regions": [{"name": name, "share": 1 / len(SITES)} for name in SITES], "links": links,
        "compute": {"mode": "flops", "tflops": tflops}})


def boundary_bytes(run: FitResult, steps: int) -> float:
    """Bytes sent across stage boundaries per step, every boundary and both ways."""
    return sum(e.nbytes for r in range(run.trace.num_ranks) for e in run.trace.collectives(r)
               if e.op == "send") / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per node")
    parser.add_argument("--H", type=int, default=10, help="DiLoCo's inner steps between syncs of the replicas")
    parser.add_argument("--bandwidth", default="100 Mbit/s", help="each site's link rate")
    parser.add_argument("--latency", default="30 ms", help="one-way latency between two sites")
    parser.add_argument("--tflops", type=float, default=0.002,
                        help="simulated device speed in TFLOP/s (a weak device: each stage computes a while)")
    parser.add_argument("--out", type=Path, default=Path("pipeline_across_sites.png"), help="where to save the plot")
    args = parser.parse_args()

    start = time.perf_counter()
    text = stdlib_text()
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text])
    cut = int(len(ids) * 0.9)
    train, val = CharWindows(ids[:cut], BLOCK, stride=BLOCK // 2), CharWindows(ids[cut:], BLOCK, stride=BLOCK)
    inner = OptimSpec("adamw", lr=3e-3)
    runs: dict[str, tuple[Strategy, int, PipelineSpec]] = {
        "4 stages": (DDPStrategy(inner), STAGES, PipelineSpec(STAGES, MICRO, "1f1b")),
        "4 stages, LowRank(8)": (DDPStrategy(inner), STAGES, PipelineSpec(STAGES, MICRO, "1f1b",
                                                                          codec=LowRank(rank=8))),
        f"2 pipelines, DiLoCo H={args.H}": (DiLoCoStrategy(inner, H=args.H), 2 * STAGES,
                                            PipelineSpec(STAGES, MICRO, "1f1b")),
        f"2 pipelines, DiLoCo H={args.H}, routed": (DiLoCoStrategy(inner, H=args.H), 2 * STAGES,
                                                    PipelineSpec(STAGES, MICRO, "gpipe", routing="balanced")),
    }
    print(f"{len(text):,} characters, vocabulary {len(vocab)}; {STAGES} stages of a GPT of width {WIDTH}, "
          f"{MICRO} micro-batches of 4 windows of {BLOCK} characters per step")
    results: dict[str, tuple[FitResult, SimResult]] = {}
    for name, (strategy, nodes, spec) in runs.items():
        model = staged_gpt(len(vocab), BLOCK, width=WIDTH, layers=2, heads=4)
        run = LocalTrainer(model, train, val).fit(strategy, nodes, pipeline=spec, max_steps=args.steps,
                                                  batch_size=4 * MICRO, val_interval=max(1, args.steps // 6),
                                                  val_size=64, progress=False)
        results[name] = run, run.simulate(four_sites(args.bandwidth, args.latency, nodes, args.tflops))
    print("\n| run | val loss | boundary bytes / step | sim time | bubble |\n|---|---|---|---|---|")
    for name, (run, sim) in results.items():
        print(f"| {name} | {run.history['eval'][-1]['loss']:.4f} | {format_bytes(boundary_bytes(run, args.steps))} "
              f"| {format_time(sim.wall_clock_s)} | {1 - sim.utilization:.0%} |")
    plot(results, args.out)
    print(f"\nplot: {args.out}; {time.perf_counter() - start:.0f} s in all")


def plot(results: dict[str, tuple[FitResult, SimResult]], path: Path) -> None:
    """Validation loss against simulated time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (run, sim) in results.items():
        points = sim.loss_vs_time(run.history["eval"])
        ax.plot([t for t, _ in points], [loss for _, loss in points], marker="o", label=name)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("validation loss")
    ax.set_title("a GPT in four stages on four sites")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
