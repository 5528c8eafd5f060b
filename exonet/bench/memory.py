"""Memory of an in-memory dataset: summed PSS of a fit with a large dataset against the same fit with a tiny one.

Each measurement is a fresh interpreter that builds the dataset, trains DDP on the
bench MLP (K nodes, AdamW, batch 32) and samples the summed PSS of itself, the
forkserver and the nodes (exonet.bench._procmem). The extra PSS of the large run over
the tiny run is what the dataset costs; K copies would cost K times its size. ``peak``
is the highest sample (start-up transients included), ``steady`` the median of the second
half of the samples taken while every node is up.

    python -m exonet.bench memory [--nodes 8] [--gib 1.0] [--kinds tensor,numpy,memmap] [--steps 40]

Kinds: ``tensor`` is a TensorDataset (moved into shared memory in place); ``numpy`` is a
Dataset holding numpy arrays (copied once into shared memory: the parent keeps its own);
``memmap`` the same arrays saved to a file and opened with ``np.load(mmap_mode="r")`` (the
nodes map the file: only the pages read are resident, in the page cache, counted once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from exonet.bench._procmem import MIB, TreeSampler

NOISE_BYTES = 100 * MIB  # run-to-run spread of the summed PSS of K node processes (seen: -83 MiB of 'extra')

DIM = 64
ROW_BYTES = DIM * 4 + 8  # float32 features and an int64 label


class ArrayDataset(Dataset):
    """Features and labels as numpy arrays, as a user's own Dataset often holds them."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.x[i]), int(self.y[i])


def make_dataset(kind: str, rows: int, folder: str) -> Dataset:
    """The dataset of ``kind``; a ``memmap`` one is written to ``folder`` and opened with np.load(mmap_mode="r")."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(rows, DIM, generator=g), torch.randint(0, 10, (rows,), generator=g)
    if kind == "tensor":
        return TensorDataset(x, y)
    if kind == "numpy":
        return ArrayDataset(x.numpy(), y.numpy())
    if kind == "memmap":
        np.save(Path(folder, "x.npy"), x.numpy())
        np.save(Path(folder, "y.npy"), y.numpy())
        x_map, y_map = (np.load(Path(folder, f"{name}.npy"), mmap_mode="r") for name in ("x", "y"))
        return ArrayDataset(x_map, y_map)
    raise ValueError(f"--kinds: unknown kind {kind!r} (tensor, numpy, memmap)")


def measure(kind: str, rows: int, nodes: int, steps: int) -> dict[str, Any]:
    """Train once in this process; the summed PSS peak and steady level, in bytes."""
    from exonet import LocalTrainer
    from exonet.strategies import DDPStrategy, OptimSpec
    from exonet.toy import bench_mlp

    with tempfile.TemporaryDirectory() as folder:
        data = make_dataset(kind, rows, folder)
        t0 = time.perf_counter()
        with TreeSampler() as sampler:
            LocalTrainer(bench_mlp(), data).fit(DDPStrategy(OptimSpec("adamw", lr=1e-3)), num_nodes=nodes,
                                                max_steps=steps, batch_size=32, device="cpu", progress=False)
    full = max(n for _, n in sampler.samples)
    up = [total for total, n in sampler.samples if n == full]
    steady = statistics.median(up[len(up) // 2:])  # past the nodes' start-up transients
    return {"peak": sampler.peak, "steady": steady, "procs": full, "seconds": time.perf_counter() - t0}


def measure_fresh(kind: str, rows: int, nodes: int, steps: int) -> dict[str, Any]:
    """``measure`` in a new interpreter, so that no earlier run's memory or forkserver is counted."""
    out = subprocess.run([sys.executable, "-m", "exonet.bench", "memory", "--measure", kind, str(rows),
                          "--nodes", str(nodes), "--steps", str(steps)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"memory bench: the {kind} run with {rows} rows failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict[str, Any]:
    """Print the figures and return them: ``dataset_bytes``, and per kind and level (``peak``, ``steady``) the
    summed PSS in bytes with the tiny and the large dataset and ``extra_ratio``, the extra over the dataset's
    size; with ``--measure``, that one run's ``measure`` figures."""
    parser = argparse.ArgumentParser(prog="python -m exonet.bench memory", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gib", type=float, default=1.0, help="size of the large dataset, GiB")
    parser.add_argument("--tiny-rows", type=int, default=4096)
    parser.add_argument("--kinds", default="tensor,numpy,memmap")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        one = measure(args.measure[0], int(args.measure[1]), args.nodes, args.steps)
        print(json.dumps(one))
        return one
    rows = int(args.gib * 2**30 / ROW_BYTES)
    size = rows * ROW_BYTES
    print(f"memory bench: K={args.nodes}, DDP on the bench MLP, {args.steps} steps; dataset {size / MIB:.0f} MiB "
          f"({rows} rows) against {args.tiny_rows} rows; summed PSS of parent, forkserver and nodes")
    if size < NOISE_BYTES * 5:
        print(f"  caution: K processes' memory varies by about {NOISE_BYTES / MIB:.0f} MiB from run to run, so below "
              f"{5 * NOISE_BYTES / 2**30:.1f} GiB (--gib) the extra and its ratio are mostly that noise")
    figures: dict[str, Any] = {"nodes": args.nodes, "dataset_bytes": size, "kinds": {}}
    for kind in args.kinds.split(","):
        tiny = measure_fresh(kind, args.tiny_rows, args.nodes, args.steps)
        big = measure_fresh(kind, rows, args.nodes, args.steps)
        figures["kinds"][kind] = {}
        for level in ("peak", "steady"):
            extra = big[level] - tiny[level]
            figures["kinds"][kind][level] = {"tiny_bytes": tiny[level], "large_bytes": big[level],
                                             "extra_ratio": extra / size}
            print(f"  {kind:6s} {level:6s}  tiny {tiny[level] / MIB:7.0f} MiB  large {big[level] / MIB:7.0f} MiB  "
                  f"extra {extra / MIB:7.0f} MiB = {extra / size:.2f}x the dataset (K copies: {args.nodes}x)")
    return figures
