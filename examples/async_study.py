"""Asynchronous DiLoCo's toy setting: four workers at 0.58, 0.75, 1.51 and 3.33 s per step.

The setting of Liu et al. 2024 ("Asynchronous Local-SGD Training for Language Modeling",
arXiv 2401.09135), on scikit-learn's digits: the same simulated time for five ways to share
work between fast and slow workers, all on exonet's online clock (``max_sim_time_s``):

* synchronous DiLoCo: every round waits for the slowest worker;
* asynchronous DiLoCo, naive: the server takes an outer Nesterov step per arrival;
* asynchronous DiLoCo with Delayed Nesterov (momentum every 4 arrivals) and Dynamic Local
  Updates (local steps proportional to speed): the paper's fix;
* FedBuff: the server steps after every 2 arrivals, staleness-weighted;
* deadline DiLoCo: a round closes 32 s after it opens, leaving out whoever is late.

Compute is the FLOPs torch counts, scaled so a step takes exactly those times, and the
network is 1 Gbit/s with 10 ms latency; the table is the same on every machine.

    python examples/async_study.py [--budget 400] [--H 20] [--plot examples/async_study.png]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from exonet import LocalTrainer, Scenario
from exonet.strategies import AsyncDiLoCoStrategy, DiLoCoStrategy, FedBuffStrategy, OptimSpec
from exonet.toy import digits, digits_mlp

STEP_S = (0.58, 0.75, 1.51, 3.33)  # seconds per step of each worker (the paper's toy example)
BATCH = 16


def step_flops() -> float:
    """FLOPs of one training step (forward and backward of a batch), as the nodes count them."""
    from torch.utils.flop_counter import FlopCounterMode

    model, (x, y) = digits_mlp(), digits(train=True)[:BATCH]
    with FlopCounterMode(display=False) as counter:
        model((x, y)).backward()
    return float(counter.get_total_flops())


def scenario() -> Scenario:
    """1 Gbit/s, 10 ms; each worker's step takes STEP_S; the server (rank 4) has the default NIC."""
    tflops = step_flops() / STEP_S[0] / 1e12
    return Scenario.from_dict({
        "name": "async-toy", "network": {"bandwidth": "1 Gbit/s", "latency": "10 ms"},
        "compute": {"mode": "flops", "tflops": tflops, "mfu": 1.0},
        "nodes": [{"ranks": [r], "speed": STEP_S[0] / s} for r, s in enumerate(STEP_S) if r],
    })


def strategies(H: int) -> dict[str, Any]:
    inner = OptimSpec("adamw", lr=1e-3)
    outer = OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)  # as examples/time_budget.py: 0.9 diverges here
    return {
        "sync DiLoCo": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
        "async DiLoCo (naive)": AsyncDiLoCoStrategy(inner, outer_optim_spec=outer, H=H, delayed_nesterov=None),
        "async DiLoCo DN+DyLU": AsyncDiLoCoStrategy(inner, outer_optim_spec=OptimSpec("sgd", lr=0.7, momentum=0.5), H=H,
                                                    delayed_nesterov=len(STEP_S), dynamic_local_updates=True),
        "FedBuff B=2": FedBuffStrategy(inner, H=H, buffer_size=2),
        "deadline DiLoCo 32 s": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H, deadline_s=32.0),
    }


def loss_at(evals: list[dict], t: float) -> float | None:
    """The last evaluation at or before simulated time t."""
    before = [e["loss"] for e in evals if e["sim_time_s"] <= t]
    return before[-1] if before else None


def time_to(evals: list[dict], target: float) -> float | None:
    return next((e["sim_time_s"] for e in evals if e["loss"] <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=400.0, help="simulated seconds per strategy")
    parser.add_argument("--H", type=int, default=20, help="local steps per round (of the fastest worker)")
    parser.add_argument("--target", type=float, default=0.3, help="validation loss for the time-to-target column")
    parser.add_argument("--plot", default=None, help="write loss against simulated time to this PNG")
    args = parser.parse_args()
    torch.manual_seed(0)
    env = scenario()
    times = [args.budget / 4, args.budget / 2, args.budget]
    print(f"K=4 workers at {', '.join(f'{s:g}' for s in STEP_S)} s/step, {args.budget:g} s of simulated time, "
          f"H={args.H}\n")
    print("| strategy | steps per worker | outer updates | " + " | ".join(f"loss @ {t:g} s" for t in times)
          + f" | time to {args.target:g} | bytes sent |")
    print("|---|---|---|" + "---|" * len(times) + "---|---|")
    curves = {}
    for name, strategy in strategies(args.H).items():
        r = LocalTrainer(digits_mlp(), digits(train=True), digits(train=False)).fit(
            strategy, num_nodes=len(STEP_S), max_steps=100_000, batch_size=BATCH, val_interval=4, val_size=512,
            seed=0, scenario=env, max_sim_time_s=args.budget, progress=False)
        evals = r.history["eval"]
        curves[name] = [(e["sim_time_s"], e["loss"]) for e in evals]
        steps = "/".join(str(r.trace.num_steps(w)) for w in range(len(STEP_S)))
        server = r.trace.num_nodes - 1 if r.trace.num_nodes > len(STEP_S) else None
        updates = (sum(c.op == "recv" for c in r.trace.collectives(server)) if server is not None
                   else r.trace.num_steps(0) // args.H)  # outer steps: arrivals at the server, or rounds
        cells = [loss_at(evals, t) for t in times]
        reached = time_to(evals, args.target)
        sent = sum(r.trace.payload_bytes(q) for q in range(r.trace.num_nodes))
        print(f"| {name} | {steps} | {updates} | " + " | ".join("–" if c is None else f"{c:.4f}" for c in cells)
              + f" | {'–' if reached is None else f'{reached:.0f} s'} | {sent / 1e6:.1f} MB |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name, points in curves.items():
            ax.plot(*zip(*points), label=name)
        ax.set(xlabel="simulated time (s)", ylabel="validation loss", yscale="log",
               title="Four workers at 0.58 / 0.75 / 1.51 / 3.33 s per step")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
