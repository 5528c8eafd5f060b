"""Scale: K node processes on one small machine; start-up, time per step and memory per node.

For each model and K, DDP (AdamW, batch 32 per node) runs once for 1 step and once for
``--steps`` steps: the time per step is the difference over the extra steps, start-up the
1-step fit (rendezvous, model, first batch, one step, teardown). The summed PSS of the
process tree (exonet.bench._procmem) is sampled during the long fit; its slope in K is
the memory per additional node. The fitted exponent b of time per step ~ K^b says how
the cost grows.

Side by side, start-up against ``torch.multiprocessing.spawn`` of K processes that
import torch (and nothing else), the floor for any torch program that starts K
processes: exonet's first fit in a fresh interpreter (``cold``, the forkserver imports
torch once) and a later one (``warm``), both a whole 1-step fit; and the first fit of a fresh
interpreter whose first line is ``exonet.warm_up()``, followed by the script's own imports (torch,
this module) and ``--setup-s`` seconds of CPU work on one core, as a caller's set-up would (``prepared``).

At the other end of scale, the worker model (exonet.netsim.workers) estimates goodput at
``--chips`` chips in ``--workers`` workers over ``--hours`` of simulated training (default: 2.4M
chips, M = 16, a day; chip MTBI a year, the decoupled_goodput example's timings): its seconds and
peak traced memory, whose targets are 60 s and 2 GiB.

    python -m exonet.bench scale [--nodes 8,16,32] [--steps 40] [--models mlp,cnn] [--startup-nodes 8] [--setup-s 0]
                                 [--chips 2400000] [--workers 16] [--hours 24]

Models: ``mlp`` is the bench MLP on synthetic blobs; ``cnn`` a two-layer CNN on
scikit-learn's 8×8 digits (bundled with scikit-learn, no download).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset

from exonet.bench import _spawned
from exonet.bench._procmem import MIB, TreeSampler


class DigitsCNN(nn.Module):
    """Conv 1→16 (3×3), ReLU, max-pool 2, conv 16→32 (3×3), ReLU, linear 512→10.

    ``model((x, y))`` is the loss, as exonet expects.
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.features(x)), y)


def digits() -> TensorDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    return TensorDataset(torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0, torch.tensor(d.target))


def workload(name: str) -> tuple[nn.Module, TensorDataset]:
    from exonet.toy import bench_mlp, synthetic_classification

    if name == "mlp":
        return bench_mlp(), synthetic_classification(4096)
    if name == "cnn":
        return DigitsCNN(), digits()
    raise ValueError(f"--models: unknown model {name!r} (mlp, cnn)")


def timed_fit(model: nn.Module, data: TensorDataset, k: int, steps: int) -> float:
    """Seconds for one DDP fit of ``steps`` steps on ``k`` nodes (processes started and stopped)."""
    from exonet import LocalTrainer
    from exonet.strategies import DDPStrategy, OptimSpec

    t0 = time.perf_counter()
    LocalTrainer(model, data).fit(DDPStrategy(OptimSpec("adamw", lr=1e-3)), num_nodes=k, max_steps=steps,
                                  batch_size=32, device="cpu", progress=False, val_size=0)
    return time.perf_counter() - t0


def spawn_import_torch(k: int) -> float:
    """Seconds for ``torch.multiprocessing.spawn`` to start ``k`` processes that import torch, and join them."""
    t0 = time.perf_counter()
    mp.spawn(_spawned.import_torch, nprocs=k, join=True)
    return time.perf_counter() - t0


def exponent(ks: list[int], ys: list[float]) -> float:
    """The least-squares b of y ~ a·K^b (nan when a time is not positive: too few steps to tell it from noise)."""
    if min(ys) <= 0:
        return math.nan
    lx, ly = [math.log(k) for k in ks], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def slope(ks: list[int], ys: list[float]) -> float:
    mx, my = statistics.fmean(ks), statistics.fmean(ys)
    return sum((a - mx) * (b - my) for a, b in zip(ks, ys)) / sum((a - mx) ** 2 for a in ks)


def startup(k: int, repeat: int, setup_s: float) -> dict[str, float]:
    """Cold (fresh interpreter), prepared and warm exonet start-up and the spawn reference, medians of ``repeat``."""
    cold = [_fresh(["--cold", str(k)]) for _ in range(repeat)]
    prepared = [_fresh(["--cold", str(k), "--setup-s", str(setup_s)], warm_up=True) for _ in range(repeat)]
    model, data = workload("mlp")
    timed_fit(model, data, 2, 1)  # the forkserver is up from here on
    warm = [timed_fit(model, data, k, 1) for _ in range(repeat)]
    spawn = [spawn_import_torch(k) for _ in range(repeat)]
    return {"cold": statistics.median(cold), "prepared": statistics.median(prepared), "warm": statistics.median(warm),
            "spawn": statistics.median(spawn)}


def busy(seconds: float) -> None:
    """Spend ``seconds`` of CPU on this thread (a stand-in for a caller's own set-up)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


def _fresh(args: list[str], warm_up: bool = False) -> float:
    """The seconds a fit in a fresh interpreter printed; with ``warm_up``, the script's first line is
    ``exonet.warm_up()``, before torch is imported."""
    first = "import exonet; exonet.warm_up(); " if warm_up else ""
    script = f"import sys; {first}from exonet.bench.__main__ import main; sys.exit(main(['scale', *sys.argv[1:]]))"
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"scale bench: {' '.join(args)} failed:\n{out.stderr}")
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def scale(name: str, ks: list[int], steps: int) -> list[dict[str, Any]]:
    model, data = workload(name)
    timed_fit(model, data, 2, 1)  # warm the forkserver
    rows = []
    for k in ks:
        one = timed_fit(model, data, k, 1)
        with TreeSampler() as sampler:
            long = timed_fit(model, data, k, steps)
        full = max(n for _, n in sampler.samples)
        up = [total for total, n in sampler.samples if n == full]
        rows.append({"k": k, "startup_s": one, "step_s": (long - one) / (steps - 1),
                     "pss": statistics.median(up[len(up) // 2:]), "peak": sampler.peak})
    return rows


def report(name: str, rows: list[dict[str, Any]], steps: int, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Print one model's rows and return them with the fits over K (``pss_per_node``, bytes; ``step_exponent``
    and ``startup_exponent``; present with two K values or more)."""
    ks = [r["k"] for r in rows]
    figures: dict[str, Any] = {"rows": rows}
    out(f"scale bench: {name}, DDP AdamW batch 32, {steps} steps; summed PSS of parent, forkserver and nodes")
    for r in rows:
        out(f"  K={r['k']:3d}  start-up {r['startup_s']:6.2f} s  per step {r['step_s'] * 1e3:8.2f} ms  "
            f"PSS {r['pss'] / MIB:7.0f} MiB (peak {r['peak'] / MIB:.0f})")
    if len(rows) > 1:
        figures.update(pss_per_node=slope(ks, [r["pss"] for r in rows]),
                       step_exponent=exponent(ks, [r["step_s"] for r in rows]),
                       startup_exponent=exponent(ks, [r["startup_s"] for r in rows]))
        out(f"  per additional node: {figures['pss_per_node'] / MIB:.1f} MiB PSS; "
            f"time per step ~ K^{figures['step_exponent']:.2f}, start-up ~ K^{figures['startup_exponent']:.2f}")
    return figures


# The decoupled_goodput example's [failures]: a year per chip, and the timings it explains.
CHIP_FAILURES = {"mtbf": "8766 h", "restart": "75 s", "pause": "20 s", "slice": 64, "repair": "2 h"}


def worker_estimate(chips: int, workers: int, hours: float) -> dict[str, Any]:
    """Goodput of ``chips`` chips in ``workers`` elastic workers over ``hours``, with the seconds it took and the
    peak memory it allocated (tracemalloc; numpy reports there too)."""
    from exonet import Scenario
    from exonet.netsim.workers import worker_goodput

    scenario = Scenario.from_dict({"name": "chips", "network": {"bandwidth": "100 Gbit/s"}, "failures": CHIP_FAILURES})
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        r = worker_goodput(scenario, chips, workers, horizon_s=hours * 3600)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"worker model: {chips:,} chips in {workers} workers, {hours:g} h simulated: {r.failures:,} failures, "
          f"goodput {r.goodput:.1%}, in {seconds:.2f} s, peak {peak / MIB:.1f} MiB (targets: 60 s, 2 GiB)")
    return {"chips": chips, "workers": workers, "hours": hours, "failures": r.failures, "goodput": r.goodput,
            "seconds": seconds, "peak_bytes": peak}


def main(argv: list[str]) -> dict[str, Any]:
    """Print the figures and return them: ``workers`` (``worker_estimate``'s; absent with ``--chips 0``),
    ``startup`` (seconds: ``cold``, ``prepared``, ``warm``, ``spawn``; absent with ``--startup-nodes 0``) and
    ``models``, ``report``'s figures per model name (none with ``--models ""``)."""
    parser = argparse.ArgumentParser(prog="python -m exonet.bench scale", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,16,32", help="comma-separated K values")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--startup-nodes", type=int, default=8, help="K for the start-up comparison (0: skip)")
    parser.add_argument("--repeat", type=int, default=3, help="start-up runs per side (medians)")
    parser.add_argument("--setup-s", type=float, default=0.0,
                        help="CPU seconds of set-up after exonet.warm_up() and the script's imports, "
                             "before its first fit (prepared start-up)")
    parser.add_argument("--chips", type=int, default=2_400_000, help="chips for the worker-model estimate (0: skip)")
    parser.add_argument("--workers", type=int, default=16, help="workers for the worker-model estimate")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours for the worker-model estimate")
    parser.add_argument("--learners", type=int, help=argparse.SUPPRESS)  # --workers' old name, for one release
    parser.add_argument("--cold", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.learners is not None:
        warnings.warn("python -m exonet.bench scale: --learners is now --workers (the same number); the old "
                      "spelling goes in the next release", DeprecationWarning, stacklevel=2)
        args.workers = args.learners
    if args.cold:
        busy(args.setup_s)
        model, data = workload("mlp")
        seconds = timed_fit(model, data, args.cold, 1)
        print(json.dumps(seconds))
        return {"cold_s": seconds}
    figures: dict[str, Any] = {}
    if args.chips:
        figures["workers"] = worker_estimate(args.chips, args.workers, args.hours)
    if args.startup_nodes:
        s = figures["startup"] = startup(args.startup_nodes, args.repeat, args.setup_s)
        print(f"start-up bench: K={args.startup_nodes}, a whole 1-step exonet fit against mp.spawn of "
              f"{args.startup_nodes} processes that import torch (medians of {args.repeat}; prepared: the first fit "
              f"{args.setup_s:g} CPU s after exonet.warm_up())")
        print(f"  exonet cold {s['cold']:6.2f} s   prepared {s['prepared']:6.2f} s   warm {s['warm']:6.2f} s   "
              f"mp.spawn {s['spawn']:6.2f} s")
        print(f"  ratio spawn/exonet: cold {s['spawn'] / s['cold']:.1f}x, prepared {s['spawn'] / s['prepared']:.1f}x, "
              f"warm {s['spawn'] / s['warm']:.1f}x")
    ks = [int(k) for k in args.nodes.split(",")]
    figures["models"] = {name: report(name, scale(name, ks, args.steps), args.steps)
                         for name in args.models.split(",") if name}
    return figures
