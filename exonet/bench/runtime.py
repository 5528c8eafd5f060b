"""Runtime overhead: exonet DDP against a bare-torch floor doing the same work.

Both sides train the bench MLP (64→256→256→10, batch 32 per node, AdamW) for the
same number of steps with K gloo processes and one flattened all-reduce per step.
The floor has nothing else: no tracing, no loss reporting, no evaluation. Times
include process start-up, as a user waits for it.

``--startup`` times where a first fit's start-up goes instead: each run a fresh Python process that imports
exonet, builds the bench MLP and runs one fit (DDP, or ``--strategy diloco``: H = 100), reading
``FitResult.startup`` (seconds from ``fit``'s call to each part: imports, checks, nodes started, then the last
node forked, joined, loaded, set up, first step), then when ``fit`` returned and when the process exited (its
interpreter's teardown, torch's included: what a script's user waits for).

    python -m exonet.bench runtime [--nodes 4] [--steps 200] [--repeat 1] [--startup] [--strategy diloco]
        [--no-warm-up]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from exonet.runtime.rendezvous import join_store, leave_without_teardown, loopback_store
from exonet.toy import bench_mlp, synthetic_classification


def _floor_node(rank: int, k: int, port: int, steps: int, batch: int) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // k))
    store = join_store(port, k)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=k)
    data = synthetic_classification(4096)
    x, y = data.tensors
    shard = torch.arange(rank, len(x), k)
    model = bench_mlp()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    per_epoch = len(shard) // batch
    for step in range(steps):
        idx = shard[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        opt.zero_grad(set_to_none=True)
        model((x[idx], y[idx])).backward()
        grads = cast(list[torch.Tensor], [p.grad for p in params])  # backward() gave every parameter one
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= k
        offset = 0
        for p, g in zip(params, grads):
            n = p.numel()
            g.copy_(flat[offset:offset + n].view_as(p))
            offset += n
        opt.step()
    dist.barrier()  # every peer has finished its work
    leave_without_teardown()  # teardown is not part of the work timed; skipping it only favours the floor


def run_floor(k: int, steps: int, batch: int) -> float:
    """Seconds for K bare spawned gloo processes to train ``steps`` steps (start-up included)."""
    t0 = time.perf_counter()
    store = loopback_store(k)
    mp.start_processes(_floor_node, args=(k, store.port, steps, batch), nprocs=k, start_method="spawn")
    return time.perf_counter() - t0


def run_exonet(k: int, steps: int, batch: int) -> float:
    """Seconds for exonet's DDP to train the same run (start-up included)."""
    from exonet import LocalTrainer
    from exonet.strategies import DDPStrategy, OptimSpec

    t0 = time.perf_counter()
    LocalTrainer(bench_mlp(), synthetic_classification(4096)).fit(
        DDPStrategy(OptimSpec("adamw", lr=1e-3)), num_nodes=k, max_steps=steps, batch_size=batch, device="cpu",
        progress=False)
    return time.perf_counter() - t0


# A first fit in a fresh process, as a script or a notebook's first cell runs it; prints its parts as JSON, with
# seconds since the process was started (``START``, the parent's clock: CLOCK_MONOTONIC is one clock system-wide).
_FIRST_FIT = """
import json, os, sys, time
t0 = {start!r}
import exonet
from exonet import LocalTrainer
from exonet.strategies import {strategy}Strategy, OptimSpec
from exonet.toy import bench_mlp, synthetic_classification
imported = time.monotonic()
trainer = LocalTrainer(bench_mlp(), synthetic_classification(4096))
strategy = {strategy}Strategy(OptimSpec("adamw", lr=1e-3){args})
built = time.monotonic()
result = trainer.fit(strategy, num_nodes={nodes}, max_steps={steps}, batch_size=32, device="cpu", progress=False)
print(json.dumps({{"import exonet": imported - t0, "model and strategy": built - t0,
                  **{{part: built - t0 + s for part, s in result.startup.items()}},
                  "fit returned": time.monotonic() - t0}}))
"""
STRATEGIES = {"ddp": ("DDP", ""), "diloco": ("DiLoCo", ", H=100")}


def first_fit(k: int, steps: int, warm_up: bool, strategy: str = "ddp") -> dict[str, float]:
    """Seconds from a fresh process's start to each part of its first fit (``_FIRST_FIT``) and to its exit;
    ``warm_up`` False turns the default warm-up off (``EXONET_WARM_UP=0``)."""
    name, args = STRATEGIES[strategy]
    env = {**os.environ, "EXONET_WARM_UP": "1" if warm_up else "0"}
    start = time.monotonic()
    code = _FIRST_FIT.format(start=start, strategy=name, args=args, nodes=k, steps=steps)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    assert proc.stdout is not None  # stdout=PIPE
    out = proc.stdout
    chunks: list[str] = []
    # Read as it comes (a failing fit may print more than a pipe holds) until the end of the file, which comes
    # when the node server, holding a copy of the pipe, has exited after the process: the next run starts then.
    reader = threading.Thread(target=lambda: chunks.append(out.read()), daemon=True)
    reader.start()
    proc.wait()
    exited = time.monotonic() - start
    reader.join()
    printed = "".join(chunks)
    if proc.returncode != 0:
        raise RuntimeError(f"the first fit's process exited with {proc.returncode}:\n{printed[-4000:]}")
    parts = next(line for line in reversed(printed.splitlines()) if line.startswith("{"))  # warnings may follow
    return {**json.loads(parts), "process exited": exited}


def startup(k: int, steps: int, repeat: int, warm_up: bool, strategy: str = "ddp") -> dict[str, Any]:
    """Print the median of each part over ``repeat`` fresh processes, and return them with every run."""
    runs = [first_fit(k, steps, warm_up, strategy) for _ in range(repeat)]
    parts = {part: statistics.median(run[part] for run in runs) for part in runs[0]}
    how = "" if warm_up else ", no warm-up (EXONET_WARM_UP=0)"
    name, args = STRATEGIES[strategy]
    print(f"start-up of a first fit: K={k}, {steps} steps, bench MLP, {name}{args.replace(',', '')}, gloo{how}; "
          f"median of {repeat} fresh processes, seconds since the process started")
    previous = 0.0
    for part, at in parts.items():
        print(f"  {part:<16} {at:6.2f} s  (+{at - previous:.2f})")
        previous = at
    return {"parts": parts, "runs": runs}


def main(argv: list[str]) -> dict[str, Any]:
    """Print the figures and return them: ``exonet_s`` and ``floor_s`` (medians of whole runs, seconds),
    their ``ratio`` and every run's seconds (``exonet_runs``, ``floor_runs``); with ``--only``, that side's
    ``exonet_s`` or ``floor_s`` alone; with ``--startup``, each part's median (``parts``) and every run."""
    parser = argparse.ArgumentParser(prog="python -m exonet.bench runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1, help="alternate the two this many times, report medians")
    parser.add_argument("--only", choices=("exonet", "floor"), help="run one side only (to time whole processes)")
    parser.add_argument("--startup", action="store_true", help="time each part of a first fit's start-up instead")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="with --startup: EXONET_WARM_UP=0 (the server starts at the first fit)")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ddp",
                        help="with --startup: the strategy fitted (diloco: H = 100)")
    args = parser.parse_args(argv)
    if args.startup:
        return startup(args.nodes, args.steps, args.repeat, not args.no_warm_up, args.strategy)
    if args.only:
        run = run_exonet if args.only == "exonet" else run_floor
        seconds = run(args.nodes, args.steps, args.batch)
        print(f"{args.only}: {seconds:.2f} s")
        return {f"{args.only}_s": seconds}
    ours, floor = [], []
    for _ in range(args.repeat):
        ours.append(run_exonet(args.nodes, args.steps, args.batch))
        floor.append(run_floor(args.nodes, args.steps, args.batch))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"runtime bench: K={args.nodes}, {args.steps} steps, batch {args.batch}, bench MLP, AdamW, gloo")
    print(f"  exonet DDP        {med(ours):7.2f} s   (runs: {', '.join(f'{t:.2f}' for t in ours)})")
    print(f"  bare-torch floor  {med(floor):7.2f} s   (runs: {', '.join(f'{t:.2f}' for t in floor)})")
    print(f"  ratio exonet/floor {med(ours) / med(floor):.2f}")
    return {"exonet_s": med(ours), "floor_s": med(floor), "ratio": med(ours) / med(floor), "exonet_runs": ours,
            "floor_runs": floor}
