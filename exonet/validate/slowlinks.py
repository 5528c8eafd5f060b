"""Real slow links: ring all-reduces over tbf/htb-shaped namespaces, timed, against the model.

Each case shapes every node's egress the way a real host is shaped (``netns.Shaper``: one
FIFO that the ACKs of the incoming flow share with the outgoing data, a queue bounded by
tbf's ``latency``, kernel TCP defaults), runs ``exonet.validate.streams`` in every namespace
(a ring all-reduce over ``streams`` TCP connections per neighbour pair), and records the
median wall time of the repeats after a warm-up, and the TCP losses: retransmissions,
retransmission timeouts, tail loss probes (each namespace's own MIBs) and the qdisc drops.
``scenario`` turns the case's shaper configuration (rate, burst, latency, streams) into the
scenario that describes it, nothing fitted; ``ideal`` is the same link without the real-link terms.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Trace
from exonet.validate.cases import launch_nodes
from exonet.validate.netns import Network, NodeLink, Shaper, network_losses

MSS_OVERHEAD = 66  # bytes per packet a shaper counts besides the TCP payload: Ethernet 14 + IP 20 + TCP 32 (timestamps)


def shaped_scenario(rate: float, shaper: Shaper, streams: int = 1, mtu: int = 1500, *, ideal: bool = False,
                    **extra: Any) -> Scenario:
    """The scenario a shaper's configuration describes: rate (bytes/s), queue, streams, MTU framing; nothing fitted.

    ``ideal``: the same link without the real-link terms (``queue``, ``streams``). ``extra``: more
    top-level scenario tables (e.g. ``compute``).
    """
    net: dict = {"bandwidth": f"{rate} B/s", "mss": mtu - 52, "header_bytes": MSS_OVERHEAD}
    if not ideal:
        net.update(queue=f"{shaper.limit(rate)} B", streams=streams)
    return Scenario.from_dict({"name": "netns-tbf", "network": net, **extra})


@dataclass(frozen=True)
class SlowCase:
    """One shaped ring: K nodes at ``rate`` (bytes/s) each way, an all-reduce of ``nbytes`` over ``streams``."""

    k: int
    rate: float
    streams: int
    nbytes: int
    shaper: Shaper = field(default_factory=Shaper)
    repeats: int = 3
    mtu: int = 1500
    slice_bytes: int = 0  # > 0: pipelined in slices as NCCL (see exonet.validate.streams); 0: step by step
    count: int = 1  # all-reduces of ``nbytes`` back to back per repeat (per-tensor, each blocking)

    @property
    def name(self) -> str:
        s = self.shaper
        mtu = f" MTU {self.mtu}" if self.mtu != 1500 else ""
        pipe = f" pipelined {self.slice_bytes // 1024} KiB" if self.slice_bytes else ""
        both = " both ways" if s.both else ""
        size = f"{self.nbytes / 1e6:g} MB"
        size = f"{self.count} x {size} back to back" if self.count > 1 else size
        return (f"K={self.k} {self.rate * 8 / 1e6:g} Mbit/s {s.kind} latency {s.latency * 1e3:g} ms{both} "
                f"x{self.streams} streams {size}{mtu}{pipe}")

    def scenario(self, *, ideal: bool = False) -> Scenario:
        return shaped_scenario(self.rate, self.shaper, self.streams, self.mtu, ideal=ideal)

    def trace(self) -> Trace:
        t = Trace(num_nodes=self.k)
        for r in range(self.k):
            for _ in range(self.count):
                t.add_collective(r, "all_reduce", self.nbytes)
        return t

    def predict(self, *, ideal: bool = False) -> float:
        return simulate(self.trace(), self.scenario(ideal=ideal)).wall_clock_s


@dataclass
class SlowMeasurement:
    case: SlowCase
    times: list[float]  # seconds per repeat, warm-up dropped (slowest rank's)
    losses: dict[str, int]  # netns.LOSS_COUNTERS over the whole case (warm-up included), summed over the nodes

    @property
    def real(self) -> float:
        return statistics.median(self.times)

    @property
    def retransmits(self) -> int:
        return self.losses["retransmits"]

    @property
    def drops(self) -> int:
        return self.losses["drops"]


def run_case(case: SlowCase, port: int = 29600) -> SlowMeasurement:
    """Shape K namespaces per ``case``, run the multi-stream ring in each and read the counters."""
    nodes = [NodeLink(case.rate, shaper=case.shaper)] * case.k
    job = {"streams": case.streams, "nbytes": case.nbytes, "repeats": case.repeats + 1,
           "slice_bytes": case.slice_bytes, "count": case.count}
    with Network(nodes, mtu=None if case.mtu == 1500 else case.mtu) as net:
        before = network_losses(net, case.k)
        outs = launch_nodes(net, case.k, "exonet.validate.streams", job, port)
        after = network_losses(net, case.k)
    per_repeat = [max(o["times"][i] for o in outs) for i in range(case.repeats + 1)][1:]  # drop the warm-up
    return SlowMeasurement(case, per_repeat, {name: after[name] - before[name] for name in after})


def matrix() -> list[SlowCase]:
    """The matrix the recovery constant was read from: streams, tbf latency, rate, K, payload, MTU."""
    mbit = 1e6 / 8
    cases = []
    for k, rate, nbytes in ((2, 50 * mbit, 4_000_000), (4, 50 * mbit, 8_000_000), (4, 200 * mbit, 32_000_000),
                            (2, 200 * mbit, 16_000_000)):
        for latency in (0.005, 0.05):
            for streams in (1, 4, 16):
                cases.append(SlowCase(k, rate, streams, nbytes, Shaper(latency=latency)))
    for k, rate, nbytes, streams in ((2, 50 * mbit, 4_000_000, 16), (4, 50 * mbit, 8_000_000, 16),
                                     (2, 200 * mbit, 16_000_000, 16), (2, 50 * mbit, 4_000_000, 1)):
        cases.append(SlowCase(k, rate, streams, nbytes, Shaper(latency=0.05), mtu=9001))
    return cases


def held_out() -> list[SlowCase]:
    """Cases the constant never saw: 100 Mbit/s, 1 to 12 MB, htb and ingress shaping, both MTUs, NCCL's pipelining."""
    mbit = 1e6 / 8
    cases = []
    for k, nbytes in ((2, 1_000_000), (4, 12_000_000)):
        for latency in (0.005, 0.05):
            for streams in (1, 4, 16):
                cases.append(SlowCase(k, 100 * mbit, streams, nbytes, Shaper(latency=latency),
                                      mtu=9001 if latency == 0.05 and k == 4 else 1500))
    for streams in (4, 16):
        cases.append(SlowCase(2, 100 * mbit, streams, 4_000_000, Shaper(kind="htb", latency=0.02)))
        cases.append(SlowCase(2, 100 * mbit, streams, 4_000_000, Shaper(latency=0.02, both=True)))
    for latency in (0.005, 0.05):  # NCCL's pipelined ring, 2 threads x 8 sockets, 512 KiB slices
        cases.append(SlowCase(4, 100 * mbit, 16, 12_000_000, Shaper(latency=latency), slice_bytes=512 * 1024))
    return cases


def corners() -> list[SlowCase]:
    """The issue matrix's far corners, one stream against NCCL's 16: K = 8, a 200 ms queue, 10 Mbit/s, 1 Gbit/s
    with 128 MB (each small enough to run on two cores in about a minute)."""
    mbit = 1e6 / 8
    cases = []
    for k, rate, latency, nbytes in ((8, 100 * mbit, 0.05, 16_000_000), (4, 100 * mbit, 0.2, 12_000_000),
                                     (4, 10 * mbit, 0.05, 2_000_000), (4, 1000 * mbit, 0.005, 128_000_000)):
        cases += [SlowCase(k, rate, streams, nbytes, Shaper(latency=latency)) for streams in (1, 16)]
    return cases


def stream_sweep() -> list[SlowCase]:
    """Many streams through one shallow queue: 1, 8, 16, 24 and 32 TCP streams per pair (32 is NCCL's on AWS: 2
    channels x 16 sockets) at 50, 100 and 200 Mbit/s, behind tbf queues of rate x 50 ms + 32 KB. K = 2, each
    case about 1.3 s of bytes at the link's rate, so throughput and losses can be read against the stream count."""
    mbit = 1e6 / 8
    return [SlowCase(2, rate * mbit, streams, int(rate * mbit * 1.3), Shaper(latency=0.05))
            for rate in (50, 100, 200) for streams in (1, 8, 16, 24, 32)]


def stream_held_out() -> list[SlowCase]:
    """The stream sweep's question on rings it did not see: K = 4 at 50, 100 and 200 Mbit/s behind the same 50 ms
    queues, and K = 2 at 100 Mbit/s behind a 20 ms queue, with 1, 8, 16 and 32 streams per pair."""
    mbit = 1e6 / 8
    return [*(SlowCase(4, rate * mbit, streams, int(rate * mbit * 1.3), Shaper(latency=0.05))
              for rate in (50, 100, 200) for streams in (1, 8, 16, 32)),
            *(SlowCase(2, 100 * mbit, streams, int(100 * mbit * 1.3), Shaper(latency=0.02))
              for streams in (1, 8, 16, 32))]


def back_to_back() -> list[SlowCase]:
    """Per-tensor all-reduces back to back, as the outer sync of issue 19's cluster (57 blocking all-reduces):
    K = 4, MTU 9001, eight tensors per repeat, over gloo's one stream, 16 streams step by step and NCCL's
    pipelined ring over 16 streams. 1.5 MB tensors at 100 Mbit/s behind tbf queues of 5 and 50 ms, and the
    cluster's mean tensor (123 MB / 57 = 2.16 MB) at 50 Mbit/s behind 50 ms, where a ring step overflows the queue."""
    cases = []
    for rate, nbytes, latency in ((100, 1_500_000, 0.005), (100, 1_500_000, 0.05), (50, 123_000_000 // 57, 0.05)):
        for streams, slice_bytes in ((1, 0), (16, 0), (16, 512 * 1024)):
            cases.append(SlowCase(4, rate * 1e6 / 8, streams, nbytes, Shaper(latency=latency), mtu=9001, count=8,
                                  slice_bytes=slice_bytes))
    return cases


def report(ms: Sequence[SlowMeasurement], log: Callable[[str], None] = print) -> None:
    """A markdown table: real, ideal and new model per case, with errors and the counters; then median and worst."""
    error_table([(m.case.name, m.real, m.case.predict(ideal=True), m.case.predict(), m.losses) for m in ms], log)


def error_table(rows: Sequence[tuple[str, float, float, float, dict[str, int]]],
                log: Callable[[str], None] = print) -> None:
    """Rows of (case, real s, ideal s, model s, loss counters) as a markdown table, then each model's median and
    worst |error|. The counters cover the whole case, warm-up included (``netns.LOSS_COUNTERS``)."""
    log("| case | real s | ideal s (err) | model s (err) | retrans | timeouts | probes | drops |")
    log("|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"ideal": [], "model": []}
    for name, real, ideal, model, losses in rows:
        errors["ideal"].append(abs(ideal - real) / real)
        errors["model"].append(abs(model - real) / real)
        log(f"| {name} | {real:.3f} | {ideal:.3f} ({(ideal - real) / real:+.1%}) | "
            f"{model:.3f} ({(model - real) / real:+.1%}) | {losses['retransmits']} | {losses['timeouts']} | "
            f"{losses['probes']} | {losses['drops']} |")
    for which, errs in errors.items():
        log(f"{which}: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}")
