"""Failures in simulated time: goodput of six ways to train 8 nodes when nodes break.

Eight real nodes train scikit-learn's digits MLP on exonet's online clock, in a scenario whose
nodes fail at random (``[failures]``: up for Exp(mtbf), then down for the repair and the
restart), each strategy for the same number of steps:

* DDP, blocking: every step waits for a failed node to come back and redo its step;
* elastic DDP: the nodes that stayed up average and go on; a failed node sits out until it is
  back, then receives the parameters and optimizer state;
* DiLoCo (H local steps per round), blocking, and elastic DiLoCo, the same per round;
* asynchronous DiLoCo: a server (a ninth node, which can fail too) applies each worker's update
  as it arrives; a down worker simply stops sending;
* deadline DiLoCo: a round closes ``--deadline`` seconds after it opens; a node that is down
  misses it and adopts the result.

Compute is the FLOPs torch counts, scaled so a step takes 1 s; the network is 1 Gbit/s with
10 ms latency; the table is the same on every machine (failures are drawn from the seed).

    python examples/failures_study.py [--steps 40] [--mtbf 120] [--plot examples/failures_study.png]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from exonet import LocalTrainer, Scenario
from exonet.strategies import AsyncDiLoCoStrategy, DDPStrategy, DiLoCoStrategy, OptimSpec
from exonet.toy import digits, digits_mlp

K, BATCH, STEP_S = 8, 16, 1.0


def step_flops() -> float:
    """FLOPs of one training step (forward and backward of a batch), as the nodes count them."""
    from torch.utils.flop_counter import FlopCounterMode

    model, (x, y) = digits_mlp(), digits(train=True)[:BATCH]
    with FlopCounterMode(display=False) as counter:
        model((x, y)).backward()
    return float(counter.get_total_flops())


def scenario(mtbf: float, repair: float, restart: float, seed: int) -> Scenario:
    """1 Gbit/s, 10 ms; a step takes STEP_S; every node fails at the given rate."""
    return Scenario.from_dict({
        "name": "failing-8", "network": {"bandwidth": "1 Gbit/s", "latency": "10 ms"},
        "compute": {"mode": "flops", "tflops": step_flops() / STEP_S / 1e12, "mfu": 1.0},
        "failures": {"mtbf": f"{mtbf} s", "repair": f"{repair} s", "restart": f"{restart} s", "seed": seed},
    })


def strategies(H: int, deadline: float) -> dict[str, Any]:
    inner = OptimSpec("adamw", lr=1e-3)
    outer = OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)
    return {
        "DDP (blocking)": DDPStrategy(inner, overlap=False),
        "elastic DDP": DDPStrategy(inner, elastic=True),
        "DiLoCo (blocking)": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
        "elastic DiLoCo": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H, elastic=True),
        "async DiLoCo": AsyncDiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
        f"deadline DiLoCo {deadline:g} s": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H, deadline_s=deadline),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps per node")
    parser.add_argument("--H", type=int, default=10, help="local steps per DiLoCo round")
    parser.add_argument("--mtbf", type=float, default=120.0, help="per-node mean time between failures, seconds")
    parser.add_argument("--repair", type=float, default=10.0, help="seconds a failed node is down")
    parser.add_argument("--restart", type=float, default=5.0, help="seconds to rejoin after the repair")
    parser.add_argument("--deadline", type=float, default=12.0, help="deadline DiLoCo's round deadline, seconds")
    parser.add_argument("--seed", type=int, default=0, help="the failure draws' seed")
    parser.add_argument("--plot", default=None, help="write loss against simulated time to this PNG")
    args = parser.parse_args()
    torch.manual_seed(0)
    env = scenario(args.mtbf, args.repair, args.restart, args.seed)
    print(next(line.strip() for line in env.describe(K).splitlines() if "expected failures" in line), "\n")
    print(f"K={K} nodes, {args.steps} steps of {STEP_S:g} s, H={args.H}, failures: mtbf {args.mtbf:g} s, "
          f"down {args.repair:g} s + restart {args.restart:g} s\n")
    print("| strategy | wall-clock | failures | goodput | lost work | down | waiting | comm | final loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for name, strategy in strategies(args.H, args.deadline).items():
        r = LocalTrainer(digits_mlp(), digits(train=True), digits(train=False)).fit(
            strategy, num_nodes=K, max_steps=args.steps, batch_size=BATCH, val_interval=args.H, val_size=512,
            seed=0, scenario=env, progress=False)
        sim, evals = r.sim, r.history["eval"]
        curves[name] = [(e["sim_time_s"], e["loss"]) for e in evals]
        machine = sim.wall_clock_s * sim.trainers  # the trainers' time (a server waits by design)
        lost = {k: v / machine for k, v in sim.lost.items()}
        print(f"| {name} | {sim.wall_clock_s:.1f} s | {sim.failures} | {sim.goodput:.1%} | {lost['lost_work']:.1%} | "
              f"{lost['down']:.1%} | {lost['waiting']:.1%} | {lost['comm']:.1%} | {evals[-1]['loss']:.4f} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name, points in curves.items():
            ax.plot(*zip(*points), label=name, marker=".")
        ax.set(xlabel="simulated time (s)", ylabel="validation loss", yscale="log",
               title=f"{K} nodes failing at mtbf {args.mtbf:g} s (down {args.repair + args.restart:g} s)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
