"""Communicator overhead: exonet's traced ``Communicator.all_reduce`` against a raw ``dist.all_reduce``.

K spawned gloo processes reduce the same fp32 buffer both ways, alternating call by call
(which side goes first alternates too), so drift and load hit both sides alike; with
``--blocks`` each side's calls of a round run back to back instead (the gap between
calls is then bare, which flatters the raw side: its threads never go idle). The exonet
side does all it does in a run: flushes the compute span, counts the bytes and appends
the Collective; events are handed over every round as ``mark_step`` would.

Reported per size, on the slowest rank: the median per-call time of each side; the
overhead as the median of the *paired* differences (each exonet call minus the raw call
beside it, which cancels drift that a difference of medians keeps) with its 95% interval,
and that median as a share of the raw call; and the calling thread's CPU time per call.
A first run with one process measures the bookkeeping alone: there the collective is
local and costs next to nothing, so the difference is what exonet adds to every call,
whatever the network. On a shared 2-core machine the K-process difference is mostly
scheduling noise around that figure.

    python -m exonet.bench communicator [--nodes 2] [--sizes 4096,1048576] [--rounds 21] [--calls 50] [--blocks]
    python -m exonet.bench communicator --profile   # cProfile of rank 0's exonet calls
    python -m exonet.bench communicator --quick     # tiny sizes, a smoke test
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from exonet.communicator import Communicator
from exonet.runtime.rendezvous import join_store, leave_without_teardown, loopback_store


def _time_block(fn: Any, calls: int) -> tuple[float, float]:
    """Wall and calling-thread CPU seconds per call (gloo works on its own threads: the CPU is the Python side)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls, (time.thread_time() - c0) / calls


def _node(rank: int, k: int, port: int, sizes: list[int], rounds: int, calls: int, blocks: bool, profile: bool,
          queue: Any) -> None:
    torch.set_num_threads(1)
    store = join_store(port, k)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=k)
    comm = Communicator(rank, k, torch.device("cpu"))
    comm.begin()
    results: dict[int, tuple[list[tuple[float, float]], list[tuple[float, float]]]] = {}
    profiles: list[str] = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4))  # zeros: repeated sums stay finite
        raw = lambda: dist.all_reduce(buf)  # noqa: E731
        ours = lambda: comm.all_reduce(buf)  # noqa: E731
        _time_block(raw, calls)  # warm-up: gloo pairs, allocator
        _time_block(ours, calls)
        comm.take_events()
        raw_s: list[tuple[float, float]] = []
        ours_s: list[tuple[float, float]] = []
        per_side, repeats = (calls, rounds) if blocks else (1, rounds * calls)
        for r in range(repeats):
            for side in ((raw, ours) if r % 2 == 0 else (ours, raw)):
                (raw_s if side is raw else ours_s).append(_time_block(side, per_side))
            if (r + 1) % (repeats // rounds) == 0:
                comm.take_events()  # as mark_step does once a step
        results[nbytes] = (raw_s, ours_s)
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            _time_block(ours, calls * 4)
            prof.disable()
            comm.take_events()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            profiles.append(f"--- cProfile, rank {rank}, {nbytes} B, {calls * 4} calls\n{text.getvalue()}")
    dist.barrier()
    queue.put((rank, results, profiles if rank == 0 else []))
    leave_without_teardown()


@dataclass(frozen=True)
class Overhead:
    """One size on one rank, seconds per call: both sides' medians, the paired overhead and its 95% interval."""

    raw: float
    ours: float
    raw_cpu: float
    ours_cpu: float
    paired: float
    low: float
    high: float

    @property
    def share(self) -> float:
        """The paired overhead as a fraction of the raw call."""
        return self.paired / self.raw

    def figures(self) -> dict[str, float]:
        """The fields (seconds per call) and ``ratio``, exonet over raw by the paired overhead."""
        return {**asdict(self), "ratio": 1 + self.share}


def median_ranks(n: int) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the distribution-free 95% interval of the median of n sorted values.

    The exact binomial rule: with m the largest count such that P(Binomial(n, 1/2) ≤ m) ≤ 2.5%,
    the interval runs from the (m+1)-th smallest value to the (m+1)-th largest; (0, n-1) when
    n is too small for any such m.
    """
    below, m = 0, -1
    while 40 * (below + math.comb(n, m + 1)) <= 2**n:  # P(B ≤ m+1) ≤ 1/40, in exact integers
        m += 1
        below += math.comb(n, m)
    return (m, n - 1 - m) if m >= 0 else (0, n - 1)


def overhead(raw: list[tuple[float, float]], ours: list[tuple[float, float]]) -> Overhead:
    """Medians of each side and the median of the paired differences ``ours[i] - raw[i]``, with the
    distribution-free 95% interval of that median (``median_ranks``; it takes the pairs as independent)."""
    diffs = sorted(o[0] - r[0] for r, o in zip(raw, ours))
    low, high = median_ranks(len(diffs))
    med = statistics.median
    return Overhead(med(t[0] for t in raw), med(t[0] for t in ours), med(t[1] for t in raw), med(t[1] for t in ours),
                    med(diffs), diffs[low], diffs[high])


def measure(k: int, sizes: list[int], rounds: int, calls: int, blocks: bool = False,
            profile: bool = False) -> tuple[dict[int, Overhead], list[str]]:
    """Per size, the Overhead on the slowest rank (largest raw median); and rank 0's profiles."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = loopback_store(k)
    procs = mp.start_processes(_node, args=(k, store.port, sizes, rounds, calls, blocks, profile, queue), nprocs=k,
                               start_method="spawn", join=False)
    per_rank: list[Any] = []
    while len(per_rank) < k:  # read while they run: a result larger than the pipe waits for its reader
        if queue.empty():
            procs.join(timeout=0.1)  # raises if a process failed, which would never put its result
        else:
            per_rank.append(queue.get())
    procs.join()
    worst = {n: max((overhead(*r[1][n]) for r in per_rank), key=lambda o: o.raw) for n in sizes}
    return worst, [p for r in per_rank for p in r[2]]


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB" if n >= 2**10 else f"{n} B"


def main(argv: list[str]) -> dict[str, Any]:
    """Print the figures and return them: per buffer size in bytes, ``alone`` (1 process) and ``k_nodes``
    (K processes) as ``Overhead.figures()``, and ``bookkeeping_share`` (alone's overhead over K's raw call)."""
    parser = argparse.ArgumentParser(prog="python -m exonet.bench communicator", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--sizes", default="4096,1048576", help="buffer sizes in bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=21, help="rounds (trace handed over after each)")
    parser.add_argument("--calls", type=int, default=50, help="all-reduces per side per round")
    parser.add_argument("--blocks", action="store_true",
                        help="time each side's calls back to back in a round, not alternating call by call")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of rank 0's exonet calls")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and counts (a smoke test)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes, args.rounds, args.calls = [4096], 2, 3
    alone, _ = measure(1, sizes, args.rounds, args.calls, args.blocks)
    results, profiles = measure(args.nodes, sizes, args.rounds, args.calls, args.blocks, args.profile)
    print(f"communicator bench: all_reduce fp32, {args.rounds} rounds x {args.calls} calls per side "
          f"{'in back-to-back blocks' if args.blocks else 'alternating call by call'}; medians per call, overhead "
          f"= median of paired differences [95% interval]")
    for label, table in (("bookkeeping alone, 1 gloo process (the collective is local)", alone),
                         (f"K={args.nodes} gloo processes (slowest rank)", results)):
        print(f"  {label}:")
        for nbytes, o in table.items():
            print(f"    {_size(nbytes):>9}  raw dist.all_reduce {o.raw * 1e6:9.1f} us   exonet Communicator "
                  f"{o.ours * 1e6:9.1f} us   overhead {o.paired * 1e6:+.1f} us [{o.low * 1e6:+.1f}, "
                  f"{o.high * 1e6:+.1f}]   ratio exonet/raw {1 + o.share:.3f} (paired)  (calling-thread CPU "
                  f"{o.raw_cpu * 1e6:.1f} vs {o.ours_cpu * 1e6:.1f} us)")
    shares = {nbytes: alone[nbytes].paired / results[nbytes].raw for nbytes in sizes}
    for nbytes, share in shares.items():
        print(f"  {_size(nbytes)}: exonet's bookkeeping ({alone[nbytes].paired * 1e6:.1f} us) is "
              f"{share:.1%} of a K={args.nodes} all-reduce")
    for text in profiles:
        print(text)
    return {"nodes": args.nodes, "alone": {n: o.figures() for n, o in alone.items()},
            "k_nodes": {n: o.figures() for n, o in results.items()}, "bookkeeping_share": shares}
