"""DDP's traffic on real shaped links: concurrent bucket all-reduces and a per-step broadcast, timed against the model.

Every step of the node program is what overlapped PyTorch DDP puts on the wire, through exonet's
``Communicator`` on gloo (one process group, one TCP connection per pair): a broadcast of the
module buffers from rank 0 (DDP's ``broadcast_buffers``, before the forward), the forward, then the
backward in one span per bucket, each followed by the async all-reduce of the bucket it filled (the
first bucket small, as DDP's 1 MiB), then a wait on every bucket. gloo runs an async collective on a
worker thread as soon as it is posted, so the buckets of one step are on the wire together.
Compute is a sleep, so the two cores stay free for the network; its spans are measured and replayed
as they were (``compute.mode = "wall"``).

The nodes' own trace is replayed on the scenario the shaper's configuration describes (rate,
queue, MTU framing, one stream: ``slowlinks.shaped_scenario``), nothing fitted, and on the ideal
link. A repetition's real time runs from the last rank's exit from a barrier to the last rank's end
of its final step; the warm-up repetition is dropped and the median of the rest kept.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Event, Trace
from exonet.validate.cases import launch_nodes, timed_node
from exonet.validate.netns import Network, NodeLink, Shaper, network_losses
from exonet.validate.slowlinks import error_table, shaped_scenario

MIB = 1 << 20


@dataclass(frozen=True)
class BucketCase:
    """K shaped nodes at ``rate`` (bytes/s) each way running ``steps`` DDP steps per repetition.

    ``buckets``: each bucket's bytes in launch order; ``broadcast``: the buffers' bytes broadcast from
    rank 0 every step; ``forward_s`` / ``backward_s``: the compute spans (the backward split evenly
    over the buckets).
    """

    k: int
    rate: float
    buckets: tuple[int, ...] = (MIB, 2 * MIB, 2 * MIB, 2 * MIB)
    broadcast: int = MIB // 4
    forward_s: float = 0.03
    backward_s: float = 0.06
    steps: int = 3
    repeats: int = 3
    shaper: Shaper = field(default_factory=Shaper)

    @property
    def name(self) -> str:
        s = self.shaper
        sizes = "+".join(f"{b / MIB:g}" for b in self.buckets)
        return (f"DDP K={self.k} {self.rate * 8 / 1e6:g} Mbit/s {s.kind} latency {s.latency * 1e3:g} ms, "
                f"buckets {sizes} MiB + broadcast {self.broadcast / MIB:g} MiB")

    def scenario(self, *, ideal: bool = False) -> Scenario:
        return shaped_scenario(self.rate, self.shaper, streams=1, ideal=ideal, compute={"mode": "wall"})


@dataclass
class BucketMeasurement:
    case: BucketCase
    times: list[float]  # real seconds per repetition, warm-up dropped
    traces: list[Trace] = field(repr=False)
    losses: dict[str, int] = field(default_factory=dict)  # netns.LOSS_COUNTERS over the case, summed over nodes

    @property
    def real(self) -> float:
        return statistics.median(self.times)

    def predict(self, *, ideal: bool = False) -> float:
        """The median over repetitions of the replayed time of that repetition's own trace."""
        scenario = self.case.scenario(ideal=ideal)
        return statistics.median(simulate(t, scenario).wall_clock_s for t in self.traces)

    def predicted_range(self) -> tuple[float, float]:
        """The model's p10 and p90 (``SimResult.wall_clock_range``), each the median over the repetitions' traces."""
        ranges = [simulate(t, self.case.scenario()).wall_clock_range for t in self.traces]
        return statistics.median(r[0] for r in ranges), statistics.median(r[1] for r in ranges)


def run_case(case: BucketCase, port: int = 29700) -> BucketMeasurement:
    """Shape K namespaces per ``case``, run the DDP steps in each and read the counters."""
    with Network([NodeLink(case.rate, shaper=case.shaper)] * case.k) as net:
        before = network_losses(net, case.k)
        reports = launch_nodes(net, case.k, "exonet.validate.buckets", asdict(case), port)
        after = network_losses(net, case.k)
    times, traces = [], []
    for rep in range(1, case.repeats + 1):  # 0 is the warm-up
        times.append(max(r["ends"][rep] for r in reports) - max(r["starts"][rep] for r in reports))
        traces.append(Trace(case.k, {"case": case.name}, [r["events"][rep] for r in reports]))
    return BucketMeasurement(case, times, traces, {name: after[name] - before[name] for name in after})


def matrix() -> list[BucketCase]:
    """K = 2 and 4 at 50 and 100 Mbit/s behind tbf queues of 5 and 50 ms."""
    mbit = 1e6 / 8
    return [BucketCase(k, rate * mbit, shaper=Shaper(latency=latency))
            for k in (2, 4) for rate in (50, 100) for latency in (0.005, 0.05)]


def report(ms: Sequence[BucketMeasurement], log: Callable[[str], None] = print) -> None:
    """A markdown table: real, ideal and model per case, with errors and the counters; then median and worst."""
    error_table([(m.case.name, m.real, m.predict(ideal=True), m.predict(), m.losses) for m in ms], log)


# ---------------------------------------------------------------- the node side
def _node(spec: dict[str, Any], out: Path) -> None:
    """One node: ``repeats`` + 1 repetitions of ``steps`` DDP steps between barriers; pickles times and events."""
    import torch

    case = BucketCase(**{**spec, "buckets": tuple(spec["buckets"]), "shaper": Shaper(**spec["shaper"])})
    grads = [torch.ones(n // 4) for n in case.buckets]
    buffers = torch.ones(case.broadcast // 4)
    per_bucket = case.backward_s / len(case.buckets)

    def repetition(comm: Any, rank: int) -> list[Event]:
        rep: list[Event] = []
        for _ in range(case.steps):
            comm.broadcast(buffers, src=0)
            time.sleep(case.forward_s)
            handles = []
            for g in grads:
                time.sleep(per_bucket)
                handles.append(comm.all_reduce(g, async_op=True))
            for h in handles:
                h.wait()
            rep += comm.mark_step()
        return rep

    timed_node(case.repeats, repetition, out)


if __name__ == "__main__":
    import json

    _node(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
