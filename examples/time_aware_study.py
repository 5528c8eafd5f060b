"""A time-aware study: which strategy trains a small GPT best in T simulated seconds across two regions?

K = 4 nodes, two in "us" and two in "eu" joined by a 100 Mbit/s, 40 ms link, train the
character-level GPT of ``examples/char_lm.py`` (text: a few standard-library modules of this
interpreter, nothing downloaded) with DDP, DiLoCo, Streaming DiLoCo and asynchronous DiLoCo
(its parameter server lives in "us", as the scenario's ``[server]`` table says) for the same
budget of simulated time (``fit(scenario=..., max_sim_time_s=T)``; with no ``max_steps`` the
data goes round as often as the budget allows). Compute is the FLOPs torch counts at
``--tflops``, so the table is the same on every machine. ``compare`` draws the validation
loss of each run's model against simulated time and prints the table.

    python examples/time_aware_study.py [--budget 3] [--H 25] [--tflops 0.01] [--out time_aware_study.png]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/ is not a package: reuse char_lm's model and data
from char_lm import CharGPT, CharWindows, stdlib_text  # noqa: E402

from exonet import LocalTrainer, Scenario, compare  # noqa: E402
from exonet.strategies import AsyncDiLoCoStrategy, DDPStrategy, DiLoCoStrategy, OptimSpec, StreamingDiLoCoStrategy  # noqa: E402


def two_regions(tflops: float) -> Scenario:
    return Scenario.from_dict({
        "name": "us-eu-100M", "description": "two regions of two nodes each, a 100 Mbit/s 40 ms link between",
        "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
        "compute": {"mode": "flops", "tflops": tflops, "mfu": 1.0},
        "regions": [{"name": "us", "share": 0.5}, {"name": "eu", "share": 0.5}],
        "links": [{"between": ["us", "eu"], "bandwidth": "100 Mbit/s", "latency": "40 ms"}],
        "server": {"region": "us"},
    })


def strategies(H: int) -> dict:
    inner = OptimSpec("adamw", lr=3e-3)
    outer = OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)  # as examples/async_study.py: 0.9 diverges here
    return {
        "DDP": DDPStrategy(inner),
        f"DiLoCo H={H}": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
        f"Streaming DiLoCo H={H}": StreamingDiLoCoStrategy(inner, outer_optim_spec=outer, H=H, num_fragments=2),
        # Delayed Nesterov, N = K by default
        f"async DiLoCo H={H} (DN)": AsyncDiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=3.0, help="simulated seconds per strategy")
    parser.add_argument("--H", type=int, default=25, help="inner steps per round (DiLoCo family)")
    parser.add_argument("--tflops", type=float, default=0.01, help="simulated device speed in TFLOP/s")
    parser.add_argument("--block", type=int, default=32, help="context length in characters")
    parser.add_argument("--width", type=int, default=32, help="embedding width")
    parser.add_argument("--out", type=Path, default=Path("time_aware_study.png"))
    args = parser.parse_args()
    start = time.perf_counter()
    text = stdlib_text(("functools", "textwrap", "heapq", "dataclasses"))
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text])
    cut = int(len(ids) * 0.9)
    train, val = CharWindows(ids[:cut], args.block, args.block // 2), CharWindows(ids[cut:], args.block, args.block)
    scenario = two_regions(args.tflops)
    print(scenario.describe(4, servers=1))  # four trainers and async DiLoCo's server
    runs = {}
    for name, strategy in strategies(args.H).items():
        torch.manual_seed(0)
        model = CharGPT(len(vocab), args.block, args.width, layers=2, heads=4)
        runs[name] = LocalTrainer(model, train, val).fit(
            strategy, num_nodes=4, batch_size=8, seed=0, scenario=scenario, max_sim_time_s=args.budget,
            val_interval=args.H, val_size=128, progress=False)
        r = runs[name]
        print(f"{name}: {r.trace.num_steps(0)} steps on rank 0, final val loss {r.history['eval'][-1]['loss']:.3f}, "
              f"real {r.real_time_s:.1f} s", flush=True)
    table = compare(runs, [scenario], target_loss=2.6)
    print(f"\nCharGPT, K=4 in {scenario.name}, {args.budget:g} s of simulated time each (loss: {table.loss}):\n")
    print(table.to_markdown())
    print(f"\nplot: {table.plot(args.out)}; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
