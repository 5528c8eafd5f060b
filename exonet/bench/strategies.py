"""Strategies: DeMo's compression step against a per-tensor reference, and every strategy's step time.

Both parts run in the same K spawned gloo processes, on the bench MLP (64→256→256→10,
batch 32 per node), with one torch thread per process.

1. DeMo. ``DeMoStrategy.step()`` (blocks of the same shape transformed together, one
   all-gather of a uint8 buffer with int16 indices) against the straightforward reference
   written out below as the authors' code does it: per tensor, an einsum DCT, top-k, error
   feedback by decoding what was sent, one all-gather of that tensor's int64 indices and
   values, a ``scatter_reduce`` mean and an einsum inverse. Both sides do the whole step
   (momentum, compression, exchange, sign step) on the same gradients, through the same
   Communicator. They first run ``--check-steps`` steps from the same state and must agree
   within 1e-6 (parameters and momentum); then take ``--rounds`` × ``--calls`` steps each,
   alternating step by step (the first side alternates too); medians per step on the slowest rank.
2. Step time of DDP, FedAvg (H=20), DiLoCo (H=20), SPARTA and DeMo, each a block of
   ``--steps`` steps per round (forward, backward, ``strategy.step()``, the trace hand-over
   as a node does it), against a bare-torch DDP step in the same round (a flattened
   all-reduce and AdamW, no Communicator).

    python -m exonet.bench strategies [--nodes 4] [--rounds 5] [--calls 20] [--steps 40] [--only demo|strategies]
    python -m exonet.bench strategies --quick       # two nodes, tiny counts: a smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from exonet.communicator import Communicator
from exonet.runtime.rendezvous import join_store, leave_without_teardown, loopback_store
from exonet.toy import bench_mlp

BATCH, IN_DIM, CLASSES = 32, 64, 10
DEMO_LR = 1e-3
DEMO: dict[str, Any] = {"compression_decay": 0.999, "compression_topk": 32, "compression_chunk": 64,
                        "weight_decay": 0.01}


# ------------------------------------------------------------------ DeMo reference (per tensor)
class ReferenceDeMo:
    """DeMo step as the authors' reference writes it: every tensor on its own, int64 indices, one all-gather each."""

    def __init__(self, params: list[torch.Tensor], comm: Communicator, chunk: int, topk: int) -> None:
        from exonet.strategies.demo import dct_basis, largest_divisor, matrix_shape

        self.params, self.comm, self.topk = params, comm, topk
        self.momentum = [torch.zeros_like(p) for p in params]
        self.shapes = []
        for p in params:
            rows, cols = matrix_shape(p.shape)
            h, w = largest_divisor(rows, chunk), largest_divisor(cols, chunk)
            self.shapes.append((rows // h, h, cols // w, w, dct_basis(h, p.dtype), dct_basis(w, p.dtype)))

    @staticmethod
    def _encode(x: torch.Tensor, a: int, h: int, b: int, w: int, bh: torch.Tensor, bw: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ahbw,hi,wj->abij", x.reshape(a, h, b, w), bh, bw).reshape(a * b, h * w)

    @staticmethod
    def _decode(c: torch.Tensor, shape: torch.Size, a: int, h: int, b: int, w: int, bh: torch.Tensor,
                bw: torch.Tensor) -> torch.Tensor:
        return torch.einsum("abij,hi,wj->ahbw", c.reshape(a, b, h, w), bh, bw).reshape(shape)

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], lr: float, decay: float, weight_decay: float) -> None:
        for p, m, g, (a, h, b, w, bh, bw) in zip(self.params, self.momentum, grads, self.shapes):
            p.mul_(1.0 - lr * weight_decay)
            m.mul_(decay).add_(g, alpha=lr)
            coeffs = self._encode(m, a, h, b, w, bh, bw)
            k = min(self.topk, h * w)
            idx = torch.topk(coeffs.abs(), k, dim=-1, largest=True, sorted=False).indices
            val = torch.gather(coeffs, -1, idx)
            sent = torch.zeros_like(coeffs).scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)
            m.sub_(self._decode(sent, m.shape, a, h, b, w, bh, bw))
            gathered = self.comm.all_gather(torch.cat([idx.reshape(-1).view(torch.uint8),
                                                       val.reshape(-1).view(torch.uint8)]))
            n, split = gathered.shape[0], idx.numel() * 8
            all_idx = gathered[:, :split].clone().view(torch.int64).reshape(n, a * b, k)
            all_val = gathered[:, split:].clone().view(p.dtype).reshape(n, a * b, k)
            all_idx, all_val = (t.permute(1, 0, 2).reshape(a * b, n * k) for t in (all_idx, all_val))
            mean = torch.zeros_like(coeffs).scatter_reduce_(-1, all_idx, all_val, reduce="mean", include_self=False)
            p.add_(self._decode(mean, p.shape, a, h, b, w, bh, bw).sign_(), alpha=-lr)


def _fixed_grads(params: list[torch.Tensor], rank: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    return [torch.randn(p.shape, generator=gen) for p in params]


def _demo_part(rank: int, k: int, comm: Communicator, rounds: int, calls: int, check_steps: int) -> dict[str, float]:
    from exonet.strategies import DeMoStrategy, OptimSpec
    from exonet.strategies.base import NodeContext

    model = bench_mlp()
    ours = DeMoStrategy(OptimSpec("sgd", lr=DEMO_LR), **DEMO)
    ours.setup(model, comm, NodeContext(rank, k, 1 << 30, 0, torch.device("cpu")))
    ref = ReferenceDeMo([p.detach().clone() for p in ours.params], comm, DEMO["compression_chunk"],
                        DEMO["compression_topk"])
    grads = _fixed_grads(ours.params, rank, 0)

    def step_ours() -> None:
        for p, g in zip(ours.params, grads):
            p.grad = g.clone()
        ours.step()
        comm.mark_step()

    def step_ref() -> None:
        ref.step(grads, DEMO_LR, DEMO["compression_decay"], DEMO["weight_decay"])
        comm.mark_step()

    for _ in range(check_steps):
        step_ours()
        step_ref()
    diff = max(max((a - b).abs().max().item() for a, b in zip(ours.params, ref.params)),
               max((a - b).abs().max().item() for a, b in zip(ours.momentum(), ref.momentum)))
    t_ours: list[float] = []
    t_ref: list[float] = []
    for i in range(rounds * calls):  # step by step, alternating which side goes first
        for fn, out in (((step_ours, t_ours), (step_ref, t_ref)) if i % 2 == 0
                        else ((step_ref, t_ref), (step_ours, t_ours))):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return {"demo": statistics.median(t_ours), "reference": statistics.median(t_ref), "max_diff": diff}


# ------------------------------------------------------------------------ step time per strategy
def _strategies() -> dict[str, Any]:
    from exonet.strategies import DDPStrategy, DeMoStrategy, DiLoCoStrategy, FedAvgStrategy, OptimSpec, SPARTAStrategy

    adamw = OptimSpec("adamw", lr=1e-3)
    return {"DDP": DDPStrategy(adamw), "FedAvg": FedAvgStrategy(adamw, H=20), "DiLoCo": DiLoCoStrategy(adamw, H=20),
            "SPARTA": SPARTAStrategy(adamw), "DeMo": DeMoStrategy(OptimSpec("sgd", lr=DEMO_LR), **DEMO)}


def _bare_step(k: int) -> Callable[[tuple[torch.Tensor, torch.Tensor]], None]:
    """The floor: forward, backward, one flattened all-reduce straight through torch.distributed, AdamW."""
    model = bench_mlp()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        opt.zero_grad(set_to_none=True)
        model(batch).backward()
        grads = cast(list[torch.Tensor], [p.grad for p in params])  # backward() gave every parameter one
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= k
        offset = 0
        for p, g in zip(params, grads):
            g.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()

    return step


def _steps_part(rank: int, k: int, comm: Communicator, rounds: int, steps: int) -> dict[str, float]:
    from exonet.strategies.base import NodeContext

    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, IN_DIM, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
               for _ in range(8)]
    sides: dict[str, Callable[[tuple[torch.Tensor, torch.Tensor]], None]] = {"bare torch": _bare_step(k)}
    for name, strategy in _strategies().items():
        model = bench_mlp()
        strategy.setup(model, comm, NodeContext(rank, k, 1 << 30, 0, torch.device("cpu")))

        def step(batch: tuple[torch.Tensor, torch.Tensor], model: Any = model, strategy: Any = strategy) -> None:
            strategy.zero_grad()
            loss = model(batch)
            strategy.prepare_backward(True)
            loss.backward()
            strategy.step()
            comm.mark_step()

        sides[name] = step
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides.items())
    for r in range(rounds + 1):  # round 0 warms up
        for name, run in order if r % 2 else order[::-1]:
            t0 = time.perf_counter()
            for i in range(steps):
                run(batches[i % len(batches)])
            if r:
                times[name].append((time.perf_counter() - t0) / steps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _node(rank: int, k: int, port: int, args: dict[str, int], queue: Any) -> None:
    torch.set_num_threads(1)
    store = join_store(port, k)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=k)
    comm = Communicator(rank, k, torch.device("cpu"))
    comm.begin()
    demo = _demo_part(rank, k, comm, args["rounds"], args["calls"], args["check_steps"]) if args["demo"] else {}
    steps = _steps_part(rank, k, comm, args["rounds"], args["steps"]) if args["strategies"] else {}
    dist.barrier()
    queue.put((demo, steps))
    leave_without_teardown()


def measure(k: int, **args: int) -> tuple[dict[str, float], dict[str, float]]:
    """(DeMo vs reference, step time per strategy): seconds per step on the slowest rank; DeMo's largest difference."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = loopback_store(k)
    mp.start_processes(_node, args=(k, store.port, args, queue), nprocs=k, start_method="spawn")
    results = [queue.get() for _ in range(k)]
    demo = {key: max(r[0][key] for r in results) for key in results[0][0]}
    steps = {key: max(r[1][key] for r in results) for key in results[0][1]}  # both empty for a part not run
    return demo, steps


def main(argv: list[str]) -> dict[str, Any]:
    """Print the figures and return them: ``demo`` (``exonet_s`` and ``reference_s`` per step, ``speedup``,
    ``max_diff``; absent with ``--only strategies``), ``step_s`` and ``ratio_to_bare`` per strategy name, and
    ``ok``: False when DeMo and the reference disagree by more than 1e-6."""
    parser = argparse.ArgumentParser(prog="python -m exonet.bench strategies", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="alternating blocks per side (medians over them)")
    parser.add_argument("--calls", type=int, default=20, help="DeMo steps per side per round")
    parser.add_argument("--steps", type=int, default=40, help="training steps per strategy per block")
    parser.add_argument("--check-steps", type=int, default=5, help="DeMo steps compared with the reference first")
    parser.add_argument("--only", choices=("demo", "strategies"), help="run one of the two parts")
    parser.add_argument("--quick", action="store_true", help="two nodes, tiny counts (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds, args.calls, args.steps, args.check_steps = 2, 1, 2, 20, 2
    demo, steps = measure(args.nodes, rounds=args.rounds, calls=args.calls, steps=args.steps,
                          check_steps=args.check_steps, demo=args.only != "strategies", strategies=args.only != "demo")
    print(f"strategies bench: K={args.nodes} gloo processes, bench MLP, batch {BATCH}, 1 thread each, "
          f"median per step over {args.rounds} rounds (slowest rank)")
    figures: dict[str, Any] = {"nodes": args.nodes, "ok": not demo or demo["max_diff"] <= 1e-6}
    if demo:
        figures["demo"] = {"exonet_s": demo["demo"], "reference_s": demo["reference"],
                           "speedup": demo["reference"] / demo["demo"], "max_diff": demo["max_diff"]}
        print(f"  DeMo compression step (topk {DEMO['compression_topk']}, chunk {DEMO['compression_chunk']}): "
              f"exonet {demo['demo'] * 1e3:.2f} ms   per-tensor reference {demo['reference'] * 1e3:.2f} ms   "
              f"speed-up {figures['demo']['speedup']:.2f}x   largest difference after {args.check_steps} steps "
              f"{demo['max_diff']:.1e}")
    if steps:
        figures["step_s"] = steps
        figures["ratio_to_bare"] = {name: t / steps["bare torch"] for name, t in steps.items()}
    for name, t in steps.items():
        print(f"  {name:10s} {t * 1e3:7.2f} ms/step   ratio to bare torch {figures['ratio_to_bare'][name]:.2f}")
    return figures
