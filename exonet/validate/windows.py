"""TCP windows and slow start under real delay: collectives through the delay line against the backend models.

Each case runs K namespaces joined by ``delayline.DelayLine`` (``delay`` one way, every node's egress
shaped by a deep ``tbf`` at ``rate``, so the shaper, not the delay line, is the bottleneck and
nothing is lost), and in each namespace one node of a collective:

* ``transport = "gloo"``: torch.distributed's gloo all-reduce (``_node``), ``repeats`` + 1 of them on
  one process group, the first a warm-up on new connections (dropped), each of the rest either
  back to back or after ``idle`` seconds of sleep (longer than the RTO: slow start after idle).
* ``transport = "streams"``: ``exonet.validate.streams``, the ring over 16 TCP streams per pair,
  pipelined in 512 KiB slices as NCCL pipelines its ring (``slice_bytes = 0``: step by step).

A repetition's time runs from the last rank's entry to the last rank's exit (gloo), or is the
slowest rank's time between barriers (streams). The median and the p10–p90 of the repetitions are
kept.

The model's scenario is the case's configuration, nothing fitted (``scenario``): the rate, the
one-way delay as ``latency``, the tbf queue, IP framing on a TUN device (1448 payload bytes per
1500-byte packet, ``header_bytes = 52``), the backend, and the per-stream window that the sysctls
read inside the namespace imply for the transport (``window``); ``slow_start_after_idle`` follows the
congestion control: Reno and CUBIC restart the window after an idle RTO (``tcp_cwnd_restart``),
BBR skips it (``tcp_slow_start_after_idle_check`` returns for a congestion control with its own
``cong_control``). The trace replayed is the node's own sequence: the warm-up, then each repetition,
with the idle as compute between them, so the model sees the same cold and warm connections.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

from exonet.netsim import SimResult, simulate
from exonet.scenario import Scenario
from exonet.scenario.resolved import linux_window
from exonet.trace import Trace
from exonet.validate.cases import launch_nodes
from exonet.validate.delayline import DelayLine, DelayLink
from exonet.validate.netns import Shaper

MIB = 1 << 20
TUN_HEADER = 52  # bytes per packet besides the TCP payload on a TUN device: IP 20 + TCP 32 (timestamps), no Ethernet
# "phase": the window-less phase model; "window": the phase model with the Linux window on each of the transport's
# streams; "gloo" / "nccl": that backend.
MODELS = ("phase", "window", "gloo", "nccl")


def window(sysctls: dict[str, str]) -> int:
    """Bytes one stream may keep in flight, from the socket sysctls read in the namespace; nothing measured.

    Neither transport sets a socket buffer: gloo's ``Pair::send(Op&)`` sets ``SO_SNDBUF`` (which would turn
    autotuning off, capped by ``net.core.wmem_max``), but only on the bound-buffer path; torch's collectives
    send unbound buffers (``Pair::sendUnboundBuffer`` calls ``sendAsyncMode`` directly), and ``ss -tmi`` shows
    their send buffer autotuning from 46 kB to ``tcp_wmem`` max during a run. So the window is Linux's for these
    maxima (``exonet.scenario.resolved.linux_window``): what a send buffer of ``tcp_wmem`` max keeps in flight, or
    half of ``tcp_rmem`` max (``tcp_adv_win_scale = 1``), whichever is smaller.
    """
    wmem, rmem = (int(sysctls[f"net.ipv4.tcp_{side}"].split()[2]) for side in ("wmem", "rmem"))
    return int(linux_window(wmem, rmem))


def restarts(sysctls: dict[str, str]) -> bool:
    """Whether an idle connection restarts its window: ``tcp_slow_start_after_idle`` under a congestion control
    without its own ``cong_control`` (Reno, CUBIC); BBR has one, so Linux skips the restart for it."""
    return sysctls["net.ipv4.tcp_slow_start_after_idle"] == "1" and sysctls["net.ipv4.tcp_congestion_control"] != "bbr"


@dataclass(frozen=True)
class DelayCase:
    """K nodes behind the delay line (``delay`` s one way) at ``rate`` bytes/s, a collective of ``nbytes``."""

    k: int
    rate: float
    delay: float
    nbytes: int
    transport: str = "gloo"  # "gloo" | "streams"
    idle: float = 0.0  # gloo: seconds of sleep before each measured all-reduce (0: back to back)
    congestion: str = "reno"  # tcp_congestion_control in the namespaces (see the module docstring)
    repeats: int = 5
    streams: int = 16  # streams: TCP connections per neighbour pair
    slice_bytes: int = 512 * 1024  # streams: pipelined in slices of this size (0: step by step)
    shaper: Shaper = field(default_factory=lambda: Shaper(latency=0.2))
    calls: int = 1  # gloo: each repetition is this many blocking all-reduces of nbytes / calls, back to back

    def __post_init__(self) -> None:
        if self.calls < 1 or self.nbytes % (4 * self.calls) or (self.calls > 1 and self.transport != "gloo"):
            raise ValueError(f"DelayCase: calls={self.calls} must be >= 1, split nbytes={self.nbytes} into whole "
                             "floats, and be 1 unless the transport is gloo")

    @property
    def name(self) -> str:
        how = "pipelined" if self.slice_bytes else "step by step"
        what = "gloo" if self.transport == "gloo" else f"{self.streams} stream{'s' * (self.streams > 1)} {how}"
        idle = f", after {self.idle:g} s idle" if self.idle else ", back to back" if self.transport == "gloo" else ""
        size = f"{self.nbytes / MIB:g} MiB" if self.nbytes % MIB == 0 else f"{self.nbytes / 1e6:g} MB"
        split = f" as {self.calls} calls" if self.calls > 1 else ""
        return (f"K={self.k} {self.rate * 8 / 1e6:g} Mbit/s RTT {2 * self.delay * 1e3:g} ms {self.congestion}, "
                f"{what} all_reduce {size}{split}{idle}")

    @property
    def model(self) -> str:
        """The model of what the transport is: gloo's ring, NCCL's pipelined ring, or phases over windowed streams."""
        if self.transport == "gloo":
            return "gloo"
        return "nccl" if self.slice_bytes else "window"

    def link(self) -> DelayLink:
        return DelayLink(self.delay, self.rate, self.shaper, self.congestion)

    def scenario(self, model: str, sysctls: dict[str, str], restart: bool | None = None) -> Scenario:
        """The scenario this case's configuration describes under ``model`` (``MODELS``); nothing fitted.

        The rate, the delay as ``latency``, IP framing; with a backend or "window", the tbf queue and the window
        ``window`` reads from the sysctls; with a backend, slow start after idle as ``restarts`` says (or
        ``restart``). The streams transport's sockets are the scenario's ``streams`` (NCCL: one channel of
        2 threads x 8 sockets, the Simple ring).
        """
        if model not in MODELS:
            raise ValueError(f"DelayCase.scenario: model must be one of {MODELS}, got {model!r}")
        net: dict[str, Any] = {"bandwidth": f"{self.rate} B/s", "latency": f"{self.delay} s",
                               "mss": 1500 - TUN_HEADER, "header_bytes": TUN_HEADER}
        if model != "phase":
            net.update(queue=f"{self.shaper.limit(self.rate)} B", tcp_window=f"{window(sysctls)} B")
        if model in ("gloo", "nccl"):
            net.update(backend=model, slow_start_after_idle=restarts(sysctls) if restart is None else restart)
        if model == "nccl":
            net["nccl"] = {"channels": 1, "nic": "aws", "algorithm": "ring", "protocol": "simple"}
        elif model == "window" and self.transport == "streams":
            net["streams"] = self.streams
        return Scenario.from_dict({"name": "delay-line", "network": net})

    def trace(self) -> Trace:
        """The nodes' sequence: a warm-up repetition, then ``repeats``, each after ``idle`` s of compute; each
        repetition ``calls`` all-reduces of ``nbytes / calls``."""
        t = Trace(num_nodes=self.k)
        for r in range(self.k):
            for i in range(self.repeats + 1):
                if i and self.idle:
                    t.add_compute(r, self.idle)
                for _ in range(self.calls):
                    t.add_collective(r, "all_reduce", self.nbytes // self.calls)
        return t

    def replay(self, model: str, sysctls: dict[str, str], restart: bool | None = None) -> SimResult:
        """The case's trace replayed under ``model`` in the scenario its configuration describes."""
        return simulate(self.trace(), self.scenario(model, sysctls, restart))

    def predict(self, model: str, sysctls: dict[str, str], restart: bool | None = None) -> float:
        """The model's median time of the measured repetitions (the warm-up's left out, as in the measurement):
        from the first call's start to the last call's end."""
        return self.repetition_time(self.replay(model, sysctls, restart))

    def repetition_time(self, result: SimResult) -> float:
        """A replay's median repetition, the warm-up left out: from its first call's start to its last call's end."""
        spans = sorted((c for c in result.collectives if c.op == "all_reduce"), key=lambda c: c.start_s)
        reps = [spans[i:i + self.calls] for i in range(self.calls, len(spans), self.calls)]
        return statistics.median(rep[-1].end_s - rep[0].start_s for rep in reps)


@dataclass
class DelayMeasurement:
    """A case's repetitions, pooled over ``runs`` fresh networks (a run's repetitions share its connections)."""

    case: DelayCase
    times: list[float]  # seconds per repetition, warm-ups dropped, all runs
    runs: list[float]  # each run's median
    sysctls: dict[str, str]  # delayline.SOCKET_SYSCTLS as read in rank 0's namespace
    late_p99: float  # the worst run's p99 of how late the delay line forwarded (seconds)
    load: float  # the highest 1-minute load average at the end of a run

    @property
    def real(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> tuple[float, float]:
        """The repetitions' p10 and p90 (linear between order statistics)."""
        q = statistics.quantiles(self.times, n=10, method="inclusive")
        return q[0], q[-1]

    def predict(self, model: str | None = None, restart: bool | None = None) -> float:
        """The model's time for this case (``model`` None: the case's own, ``DelayCase.model``)."""
        return self.case.predict(model or self.case.model, self.sysctls, restart)


def run_case(case: DelayCase, runs: int = 1, port: int = 29900) -> DelayMeasurement:
    """``runs`` times: build the delay line for ``case``, run its nodes, read the sysctls and the line's counters."""
    times, medians, late, load = [], [], 0.0, 0.0
    for _ in range(runs):
        with DelayLine(case.k, case.link()) as net:
            sysctls = net.sysctls()
            if case.transport == "gloo":
                outs = launch_nodes(net, case.k, "exonet.validate.windows", asdict(case), port)
                run = [max(o["ends"][i] for o in outs) - max(o["starts"][i] for o in outs)
                       for i in range(1, case.repeats + 1)]
            else:
                job = {"streams": case.streams, "nbytes": case.nbytes, "repeats": case.repeats + 1,
                       "slice_bytes": case.slice_bytes, "count": 1}
                outs = launch_nodes(net, case.k, "exonet.validate.streams", job, port)
                run = [max(o["times"][i] for o in outs) for i in range(1, case.repeats + 1)]
        times += run
        medians.append(statistics.median(run))
        late = max(late, float(net.stats.get("late_p99_s", float("nan"))))
        load = max(load, os.getloadavg()[0])
    return DelayMeasurement(case, times, medians, sysctls, late, load)


def window_limited() -> list[DelayCase]:
    """gloo's ring where its two segments in flight, not the link, set the rate: RTT 20-100 ms, K = 2 to 4."""
    mbit = 1e6 / 8
    cases = [DelayCase(2, rate * mbit, rtt / 2, 16 * MIB) for rate in (100, 200) for rtt in (0.02, 0.05, 0.1)]
    return cases + [DelayCase(3, 150 * mbit, 0.05, 16 * MIB), DelayCase(4, 100 * mbit, 0.05, 16 * MIB)]


def tcp_window() -> list[DelayCase]:
    """One plain TCP stream per pair, step by step, where Linux's window caps it (RTT 100 ms) and where not (50 ms)."""
    return [DelayCase(2, 400e6 / 8, delay, 64 * MIB, transport="streams", streams=1, slice_bytes=0)
            for delay in (0.025, 0.05)]


def slow_start() -> list[DelayCase]:
    """gloo's all-reduce at K = 3 back to back and after 1 s idle (over the RTO): Reno at RTT 50 and 100 ms, BBR at
    100 ms (K = 3: a rank's notices and data leave on different connections, see the README)."""
    mbit = 1e6 / 8
    return [DelayCase(3, 150 * mbit, delay, 16 * MIB, idle=idle, congestion=cc)
            for cc, delay in (("reno", 0.025), ("reno", 0.05), ("bbr", 0.05)) for idle in (0.0, 1.0)]


def pipelined() -> list[DelayCase]:
    """The NCCL-like transport (16 streams per pair), pipelined and step by step: K = 4, 100 Mbit/s, RTT 50, 100 ms."""
    mbit = 1e6 / 8
    return [DelayCase(4, 100 * mbit, delay, 12_000_000, transport="streams", slice_bytes=s)
            for delay in (0.025, 0.05) for s in (512 * 1024, 0)]


def sequences() -> list[DelayCase]:
    """One gloo all-reduce of 16 MiB against the same bytes as 8 and 32 blocking calls back to back (a gradient
    synced tensor by tensor): K = 3, 150 Mbit/s, RTT 50 and 100 ms. What a call costs besides its bytes shows here."""
    mbit = 1e6 / 8
    return [DelayCase(3, 150 * mbit, delay, 16 * MIB, calls=calls) for delay in (0.025, 0.05) for calls in (1, 8, 32)]


def report(ms: Sequence[DelayMeasurement], log: Callable[[str], None] = print) -> None:
    """A markdown table: measured median, p10-p90 and each run's median; the case's model and the phase model."""
    log("| case | measured median s (p10-p90) | runs' medians | model s (err) | inside p10-p90 | phase model s (err) "
        "| load |")
    log("|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"model": [], "phase": []}
    for m in ms:
        model, phase = m.predict(), m.predict("phase")
        lo, hi = m.spread
        errors["model"].append(abs(model - m.real) / m.real)
        errors["phase"].append(abs(phase - m.real) / m.real)
        log(f"| {m.case.name} | {m.real:.3f} ({lo:.3f}-{hi:.3f}) | {', '.join(f'{r:.3f}' for r in m.runs)} | "
            f"{m.case.model} {model:.3f} ({(model - m.real) / m.real:+.1%}) | {'yes' if lo <= model <= hi else 'no'} | "
            f"{phase:.3f} ({(phase - m.real) / m.real:+.1%}) | {m.load:.1f} |")
    for which, errs in errors.items():
        log(f"{which}: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}")


def idle_report(ms: Sequence[DelayMeasurement], log: Callable[[str], None] = print) -> None:
    """Pairs of (back to back, after idle): the measured cost of the idle against the model's, restart on and off."""
    log("| case | back to back s (p10-p90) | after idle s (p10-p90) | measured cost s | model cost s, restart on "
        "| off |")
    log("|---|---|---|---|---|---|")
    warm = {dataclasses.replace(m.case, idle=0.0): m for m in ms if not m.case.idle}
    for m in ms:
        w = warm.get(dataclasses.replace(m.case, idle=0.0))
        if not m.case.idle or w is None:
            continue
        on, off = (m.predict(restart=r) - w.predict(restart=r) for r in (True, False))
        (wl, wh), (il, ih) = w.spread, m.spread
        log(f"| {m.case.name} | {w.real:.3f} ({wl:.3f}-{wh:.3f}) | {m.real:.3f} ({il:.3f}-{ih:.3f}) | "
            f"{m.real - w.real:+.3f} | {on:+.3f} | {off:+.3f} |")


@dataclass(frozen=True)
class Recorded:
    """A case measured earlier: its median and p10-p90 (``delay_medians.json``), to judge a revised model by."""

    case: DelayCase
    median: float
    spread: tuple[float, float]
    sysctls: dict[str, str]
    run: int  # which measurement run of the file (0: the first)

    @property
    def deterministic(self) -> bool:
        """Whether its repetitions agreed within 5% (p90 − p10 over the median): judged on the median alone."""
        return self.spread[1] - self.spread[0] <= DETERMINISTIC * self.median


DETERMINISTIC = 0.05  # the bound on a deterministic case's spread of repeats
RECORDED = Path(__file__).with_name("delay_medians.json")


def recorded(path: Path = RECORDED) -> list[Recorded]:
    """The delay-line cases as measured, run by run (no root, no network: the medians the validate README shows)."""
    import json

    out = []
    for run, data in enumerate(json.loads(path.read_text())["runs"]):
        for row in data["cases"]:
            row = dict(row)
            median, lo, hi = row.pop("median"), row.pop("p10"), row.pop("p90")
            case = DelayCase(rate=row.pop("mbit") * 1e6 / 8, **row)
            sysctls = {**data["sysctls"], "net.ipv4.tcp_congestion_control": case.congestion}
            out.append(Recorded(case, median, (lo, hi), sysctls, run))
    return out


def recorded_report(log: Callable[[str], None] = print) -> dict[str, list[float]]:
    """Today's model against the recorded medians: a table per run, then the |errors| of deterministic and noisy
    cases over all runs (``"run N deterministic"`` keys hold each run's)."""
    errors: dict[str, list[float]] = {"deterministic": [], "noisy": []}
    cases = recorded()
    for run in sorted({r.run for r in cases}):
        log(f"\nrun {run}\n| case | measured median s (p10-p90) | model s (err) | phase model s (err) |")
        log("|---|---|---|---|")
        for r in (r for r in cases if r.run == run):
            model, phase = r.case.predict(r.case.model, r.sysctls), r.case.predict("phase", r.sysctls)
            kind = "deterministic" if r.deterministic else "noisy"
            err = abs(model - r.median) / r.median
            errors[kind].append(err)
            errors.setdefault(f"run {run} {kind}", []).append(err)
            log(f"| {r.case.name} | {r.median:.3f} ({r.spread[0]:.3f}-{r.spread[1]:.3f}) | {r.case.model} {model:.3f} "
                f"({(model - r.median) / r.median:+.1%}) | {phase:.3f} ({(phase - r.median) / r.median:+.1%}) |")
    for which, errs in errors.items():
        log(f"{which} ({len(errs)}): median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}")
    return errors


# ---------------------------------------------------------------- the node side
def _node(spec: dict[str, Any], out: Path) -> None:
    """One gloo node: ``repeats`` + 1 repetitions of ``calls`` blocking all-reduces, each repetition measured on the
    clock the namespaces share."""
    import pickle

    import torch
    import torch.distributed as dist

    from exonet.runtime.rendezvous import leave_without_teardown

    rank, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=k, timeout=timedelta(seconds=600))
    calls = spec.get("calls", 1)
    xs = [torch.zeros(spec["nbytes"] // 4 // calls) for _ in range(calls)]
    dist.barrier()
    starts, ends = [], []
    for i in range(spec["repeats"] + 1):
        if i and spec["idle"]:
            time.sleep(spec["idle"])
        starts.append(time.monotonic())
        for x in xs:
            dist.all_reduce(x)
        ends.append(time.monotonic())
    dist.barrier()
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps({"starts": starts, "ends": ends}))
    leave_without_teardown()


if __name__ == "__main__":
    import json

    _node(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
