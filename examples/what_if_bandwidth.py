"""What if the network were slower? Time to a target loss against NIC bandwidth, from one run per strategy.

DDP, DiLoCo and SPARTA each train once on scikit-learn's digits. Their traces are then
replayed on a single-region network whose NIC bandwidth sweeps from 10 Mbit/s to
100 Gbit/s, latency, protocol efficiency and everything else held at the base preset's
values. DDP sends 4P bytes every step and DiLoCo 4P every H steps: with a fast NIC DDP
wins (it needs fewer steps), with a slow one DiLoCo does. The crossover is found by
bisection, still by simulation only.

Compute is charged by FLOPs (forward + backward, the same for every strategy) at
``--tflops``, so the curves differ only in what each strategy puts on the wire and in how
many steps it needs. Measured CPU time on a small shared host is noisy and carries
per-step overheads (flattening, the slowest of K nodes every synchronous step) that
would vanish beside a real model's compute; ``--measured`` replays it anyway.

    python examples/what_if_bandwidth.py [--steps 400] [--nodes 4] [--target-loss 0.25] [--tflops 0.002]
                                         [--measured] [--out what_if_bandwidth.png]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from exonet import FitResult, LocalTrainer, Scenario, simulate
from exonet.strategies import DDPStrategy, DiLoCoStrategy, OptimSpec, SPARTAStrategy, Strategy
from exonet.study.comparison import time_to_loss
from exonet.toy import digits, digits_mlp
from exonet.units import format_rate, format_time

H = 25
LOW_BITS, HIGH_BITS = 1e7, 1e11  # 10 Mbit/s to 100 Gbit/s


def strategies() -> dict[str, Strategy]:
    """DDP, DiLoCo and SPARTA with the settings of examples/compare_strategies.py."""
    inner = OptimSpec("adamw", lr=1e-3)
    return {
        "DDP": DDPStrategy(inner),
        f"DiLoCo H={H}": DiLoCoStrategy(inner, H=H,
                                        outer_optim_spec=OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)),
        "SPARTA p=0.005": SPARTAStrategy(inner, p_sparta=0.005),
    }


def time_to_target(run: FitResult, scenario: Scenario, bits_per_s: float, target: float) -> float | None:
    """Simulated seconds until ``run``'s validation loss reaches ``target`` with a NIC of ``bits_per_s``."""
    sim = simulate(run.trace, scenario.replace(bandwidth=f"{bits_per_s:.9g} bit/s"))
    return time_to_loss(run.history, sim.step_end_times, target)


def crossover(ddp: FitResult, diloco: FitResult, scenario: Scenario, target: float, grid: list[float],
              iterations: int = 30) -> float | None:
    """The bandwidth below which DiLoCo reaches ``target`` sooner than DDP; None if one wins across the grid.

    Both runs must reach the target. DDP's time falls faster with bandwidth than DiLoCo's
    (it sends H times more), so their difference changes sign at most once: bisection in
    log-bandwidth finds that point.
    """
    def diloco_sooner(bits: float) -> bool:
        return time_to_target(diloco, scenario, bits, target) < time_to_target(ddp, scenario, bits, target)

    if diloco_sooner(grid[-1]) or not diloco_sooner(grid[0]):
        return None
    low, high = math.log(grid[0]), math.log(grid[-1])
    for _ in range(iterations):
        mid = (low + high) / 2
        low, high = (mid, high) if diloco_sooner(math.exp(mid)) else (low, mid)
    return math.exp((low + high) / 2)


def plot(times: dict[str, list[float | None]], grid: list[float], cross: float | None, target: float,
         base: str, path: Path) -> Path:
    """Time to target against bandwidth, log-log, one line per strategy; the crossover as a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, series in times.items():
        points = [(b, t) for b, t in zip(grid, series) if t is not None]
        ax.plot([b for b, _ in points], [t for _, t in points], marker="o", label=name)
    if cross is not None:
        ax.axvline(cross, color="grey", linestyle=":", label=f"crossover {format_rate(cross / 8)}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("NIC bandwidth (bit/s)")
    ax.set_ylabel(f"simulated time to val loss {target}")
    ax.set_title(f"time to target vs bandwidth ({base} otherwise)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per node")
    parser.add_argument("--nodes", type=int, default=4, help="K, the number of node processes")
    parser.add_argument("--target-loss", type=float, default=0.25, help="validation loss to reach")
    parser.add_argument("--points", type=int, default=9, help="bandwidths, log-spaced from 10 Mbit/s to 100 Gbit/s")
    parser.add_argument("--tflops", type=float, default=0.002,
                        help="simulated device speed in TFLOP/s (0.002: about 1 ms per step, as on one CPU core)")
    parser.add_argument("--measured", action="store_true",
                        help="replay the measured thread-CPU time of each step instead of FLOPs at --tflops")
    parser.add_argument("--base", default="datacenter",
                        help="single-region preset (or TOML path) whose NIC bandwidth is swept; its uplink/downlink "
                             "are dropped and per-node NICs set to each swept rate")
    parser.add_argument("--out", type=Path, default=Path("what_if_bandwidth.png"),
                        help="where to write the time-to-target vs bandwidth plot (PNG)")
    args = parser.parse_args()
    if args.points < 2:
        parser.error("--points must be at least 2")

    start = time.perf_counter()
    scenario = Scenario.load(args.base)
    if not args.measured:
        scenario = scenario.replace(compute={"mode": "flops", "tflops": args.tflops})
    train, val = digits(train=True), digits(train=False)
    runs: dict[str, FitResult] = {}
    for name, strategy in strategies().items():
        runs[name] = LocalTrainer(digits_mlp(), train, val).fit(
            strategy, num_nodes=args.nodes, max_steps=args.steps, batch_size=16, val_interval=min(H, args.steps),
            val_size=len(val), seed=0, progress=False)
        print(f"{name:16s} trained in {runs[name].real_time_s:5.1f} s, "
              f"val loss {runs[name].history['eval'][-1]['loss']:.4f}", flush=True)

    step = (math.log10(HIGH_BITS) - math.log10(LOW_BITS)) / (args.points - 1)
    grid = [10 ** (math.log10(LOW_BITS) + i * step) for i in range(args.points)]
    times = {name: [time_to_target(run, scenario, bits, args.target_loss) for bits in grid]
             for name, run in runs.items()}

    ddp, diloco = runs["DDP"], runs[f"DiLoCo H={H}"]
    step_s = simulate(ddp.trace, scenario).per_node[0].compute_s / args.steps
    compute = "measured CPU time" if args.measured else f"{args.tflops:g} TFLOP/s"
    print(f"\nSimulated time to val loss {args.target_loss} (K={args.nodes}, {args.steps} steps, {args.base} with "
          f"the NIC bandwidth replaced; compute {compute}, {format_time(step_s)} per DDP step):\n")
    print("| bandwidth | " + " | ".join(times) + " |")
    print("|" + "---|" * (len(times) + 1))
    for i, bits in enumerate(grid):
        cells = [format_time(t[i]) if t[i] is not None else "not reached" for t in times.values()]
        print(f"| {format_rate(bits / 8)} | " + " | ".join(cells) + " |")

    missed = [name for name in ("DDP", f"DiLoCo H={H}") if times[name][0] is None]
    cross = None if missed else crossover(ddp, diloco, scenario, args.target_loss, grid)
    if missed:
        print(f"\nNo crossover: {' and '.join(missed)} never reached val loss {args.target_loss} "
              f"(train longer or raise --target-loss).")
    elif cross is not None:
        print(f"\nCrossover: below {format_rate(cross / 8)} DiLoCo H={H} reaches the target sooner than DDP; "
              f"above it DDP does.")
    else:
        winner = "DiLoCo" if times[f"DiLoCo H={H}"][-1] < times["DDP"][-1] else "DDP"
        print(f"\nNo crossover between {format_rate(LOW_BITS / 8)} and {format_rate(HIGH_BITS / 8)}: "
              f"{winner} reaches the target first at every bandwidth.")
    if any(t is not None for series in times.values() for t in series):
        print(f"plot: {plot(times, grid, cross, args.target_loss, scenario.name, args.out)}")
    else:
        print("no plot: no strategy reached the target")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
