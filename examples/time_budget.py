"""Equal simulated time, not equal steps: which strategy learns most in 15 s of home broadband?

DDP, DiLoCo and Streaming DiLoCo (4-bit) each train on scikit-learn's digits with
``fit(scenario=..., max_sim_time_s=T)``: the online clock replays every step in the
scenario as the nodes train, and the run stops once the simulated clock passes T. A
strategy that talks less takes more steps in the same budget. Compute is the FLOPs torch
counts, on the preset's devices, so the table is the same on every machine.

    python examples/time_budget.py [--budget 15] [--nodes 4] [--scenario home-broadband] [--max-steps 3000]
"""

from __future__ import annotations

import argparse

from exonet import LocalTrainer
from exonet.strategies import DDPStrategy, DiLoCoStrategy, OptimSpec, StreamingDiLoCoStrategy
from exonet.toy import digits, digits_mlp


def strategies() -> dict:
    inner, outer = OptimSpec("adamw", lr=1e-3), OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)
    return {
        "DDP": DDPStrategy(inner),
        "DiLoCo H=25": DiLoCoStrategy(inner, outer_optim_spec=outer, H=25),
        "Streaming DiLoCo 4-bit": StreamingDiLoCoStrategy(inner, outer_optim_spec=outer, H=25, num_fragments=2,
                                                          quantize_bits=4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=15.0, help="simulated seconds per strategy")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--scenario", default="home-broadband")
    parser.add_argument("--max-steps", type=int, default=3000, help="a cap, should the budget allow more")
    args = parser.parse_args()
    print(f"{args.budget:g} s of simulated time in {args.scenario!r}, K={args.nodes}")
    print(f"{'strategy':24s} {'steps':>6s} {'sim time':>10s} {'val loss':>9s} {'payload/node':>13s}")
    for name, strategy in strategies().items():
        r = LocalTrainer(digits_mlp(), digits(train=True), digits(train=False)).fit(
            strategy, num_nodes=args.nodes, max_steps=args.max_steps, batch_size=16, val_interval=50, val_size=512,
            seed=0, scenario=args.scenario, max_sim_time_s=args.budget, progress=False)
        print(f"{name:24s} {len(r.history['train_loss']):>6d} {r.sim_wall_clock_s:>9.2f}s "
              f"{r.history['eval'][-1]['loss']:>9.4f} {r.payload_bytes(0):>13,d}")


if __name__ == "__main__":
    main()
