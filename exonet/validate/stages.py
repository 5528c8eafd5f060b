"""A pipeline's stage boundary on a real delayed link: micro-batches' messages timed against the model.

Two namespaces joined by ``delayline.DelayLine`` (``delay`` one way, a deep tbf at ``rate``) run the two
stages of a pipeline as ``exonet.runtime.pipeline`` runs them, with compute as sleeps: each step is the
schedule of ``exonet.estimate.pipeline.order`` over M micro-batches, a forward ``forward_s`` and a
backward twice that, stage 0 posting each activation as an async gloo send and stage 1 receiving it
blocking, the gradients going back the same way, every send waited at the step's end. All of it goes
through exonet's ``Communicator``, so each node records its own trace.

What it asks: do M messages posted back to back on one pair cost one latency between them (a TCP stream
carries them one after another) or one each? The nodes' own traces, replayed on the scenario the case's
configuration describes (``windows.DelayCase.scenario`` with gloo, compute as measured), against the real
time of each repetition (from the last rank's exit from a barrier to the last rank's end).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from exonet.estimate.pipeline import order
from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Event, Trace
from exonet.validate.cases import launch_nodes, timed_node
from exonet.validate.delayline import DelayLine
from exonet.validate.netns import Shaper
from exonet.validate.windows import DelayCase


@dataclass(frozen=True)
class StageCase:
    """Two stages behind the delay line (``delay`` s one way, ``rate`` bytes/s): ``micro`` micro-batches of
    ``activation`` bytes each way per step, ``steps`` steps per repetition."""

    rate: float
    delay: float
    activation: int
    micro: int
    schedule: str = "1f1b"
    forward_s: float = 0.01
    steps: int = 3
    repeats: int = 3
    shaper: Shaper = field(default_factory=lambda: Shaper(latency=0.2))

    @property
    def name(self) -> str:
        size = f"{self.activation / 1e6:g} MB" if self.activation >= 1e6 else f"{self.activation / 1e3:g} kB"
        return (f"2 stages {self.rate * 8 / 1e6:g} Mbit/s RTT {2 * self.delay * 1e3:g} ms, {self.schedule} "
                f"M={self.micro} x {size}, forward {self.forward_s * 1e3:g} ms")

    def scenario(self, sysctls: dict[str, str]) -> Scenario:
        """The delay line's gloo scenario (``windows.DelayCase.scenario``), compute as the nodes measured it."""
        line = DelayCase(2, self.rate, self.delay, 4, shaper=self.shaper).scenario("gloo", sysctls)
        return Scenario.from_dict({**line.to_dict(), "compute": {"mode": "wall"}})


    def trace(self, repetitions: int) -> Trace:
        """Both stages' programs, ``repetitions`` times, with compute as asked (what the recorded medians replay)."""
        trace = Trace(2, {"case": self.name})
        for rank in range(2):
            for _ in range(repetitions):
                posted: list[int] = []
                for what, seconds in program(self, rank):
                    if what == "recv":
                        trace.add_collective(rank, "recv", self.activation, (0, 1))
                    elif what == "compute":
                        trace.add_compute(rank, seconds)
                    elif what == "send":
                        posted.append(trace.add_collective(rank, "send", self.activation, (0, 1), True))
                    elif what == "waits":
                        for cid in posted:
                            trace.add_wait(rank, cid)
                        posted = []
                    else:
                        trace.add_step(rank)
        return trace

    def predict(self, sysctls: dict[str, str]) -> float:
        """The model's time of a repetition after the warm-up, compute as asked: the replay of two, less one's."""
        scenario = self.scenario(sysctls)
        return simulate(self.trace(2), scenario).wall_clock_s - simulate(self.trace(1), scenario).wall_clock_s


@dataclass
class StageMeasurement:
    case: StageCase
    times: list[float]  # real seconds per repetition, warm-up dropped
    warm_up: list[list[Event]] = field(repr=False)  # each rank's events in the warm-up repetition
    repetitions: list[list[list[Event]]] = field(repr=False)  # each repetition's, rank by rank
    sysctls: dict[str, str] = field(default_factory=dict)

    @property
    def real(self) -> float:
        return statistics.median(self.times)

    def predict(self) -> float:
        """The median over repetitions of the replayed time of that repetition after the warm-up: the replay of
        the warm-up and the repetition, less the warm-up's (the real repetitions run on warm connections)."""
        scenario = self.case.scenario(self.sysctls)
        alone = simulate(Trace(2, {}, self.warm_up), scenario).wall_clock_s
        return statistics.median(
            simulate(Trace(2, {}, [w + r for w, r in zip(self.warm_up, rep)]), scenario).wall_clock_s - alone
            for rep in self.repetitions)


def run_case(case: StageCase, port: int = 29650) -> StageMeasurement:
    """Build the delay line, run both stages in it, and keep each repetition's time and traces."""
    with DelayLine(2, DelayCase(2, case.rate, case.delay, 4, shaper=case.shaper).link()) as net:
        sysctls = net.sysctls()
        reports = launch_nodes(net, 2, "exonet.validate.stages", asdict(case), port)
    reps = range(1, case.repeats + 1)  # 0 is the warm-up
    times = [max(r["ends"][rep] for r in reports) - max(r["starts"][rep] for r in reports) for rep in reps]
    return StageMeasurement(case, times, [r["events"][0] for r in reports],
                            [[r["events"][rep] for r in reports] for rep in reps], sysctls)


RECORDED = Path(__file__).with_name("stage_medians.json")


def record(ms: Sequence[StageMeasurement], path: Path = RECORDED) -> None:
    """Keep each case's measured median, repetitions and sysctls, for ``recorded`` (no root needed to judge)."""
    import json

    rows = [{"case": asdict(m.case), "median": m.real, "times": m.times, "sysctls": m.sysctls} for m in ms]
    path.write_text(json.dumps(rows, indent=1) + "\n")


def recorded(path: Path = RECORDED) -> list[tuple[StageCase, float, dict[str, str]]]:
    """The recorded cases: (case, measured median, sysctls)."""
    import json

    rows = json.loads(path.read_text())
    return [(StageCase(**{**r["case"], "shaper": Shaper(**r["case"]["shaper"])}), r["median"], r["sysctls"])
            for r in rows]


def recorded_report(log: Callable[[str], None] = print) -> None:
    """Today's model against the recorded medians: each case's program replayed, compute as asked."""
    log("| case | measured median s | model s (err) |")
    log("|---|---|---|")
    errors = []
    for case, median, sysctls in recorded():
        model = case.predict(sysctls)
        errors.append(abs(model - median) / median)
        log(f"| {case.name} | {median:.3f} | {model:.3f} ({(model - median) / median:+.1%}) |")
    log(f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")


def matrix() -> list[StageCase]:
    """RTT 50 and 100 ms at 100 Mbit/s: small activations (latency-bound) and 1 MB ones (bandwidth-bound),
    one micro-batch and eight, GPipe and 1F1B."""
    mbit = 1e6 / 8
    return [StageCase(100 * mbit, delay, size, micro, schedule)
            for delay in (0.025, 0.05) for size in (4096, 1_000_000) for micro in (1, 8)
            for schedule in (("gpipe", "1f1b") if micro > 1 else ("1f1b",))]


def report(ms: Sequence[StageMeasurement], log: Callable[[str], None] = print) -> None:
    """A markdown table: measured median (and spread), the model's time and its error; then median and worst."""
    log("| case | measured median s (min-max) | model s (err) |")
    log("|---|---|---|")
    errors = []
    for m in ms:
        model = m.predict()
        errors.append(abs(model - m.real) / m.real)
        log(f"| {m.case.name} | {m.real:.3f} ({min(m.times):.3f}-{max(m.times):.3f}) | {model:.3f} "
            f"({(model - m.real) / m.real:+.1%}) |")
    log(f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")


# ---------------------------------------------------------------- one stage's program
def program(case: StageCase, rank: int) -> Iterator[tuple[str, float]]:
    """Stage ``rank``'s steps of one repetition, as ("recv" | "send" | "compute", seconds) and ("waits" | "step",
    0): what the node runs and what the recorded medians replay."""
    first = rank == 0
    for _ in range(case.steps):
        for kind, _ in order(case.schedule, rank, 2, case.micro):
            forward = kind == "F"
            if forward != first:  # stage 1's forward and stage 0's backward start with a receive
                yield "recv", 0.0
            yield "compute", case.forward_s if forward else 2 * case.forward_s
            if forward == first:
                yield "send", 0.0
        yield "waits", 0.0
        yield "step", 0.0


def _node(spec: dict[str, Any], out: Path) -> None:
    """One stage: ``repeats`` + 1 repetitions of its program, between barriers, through a Communicator."""
    import torch

    case = StageCase(**{**spec, "shaper": Shaper(**spec["shaper"])})

    def repetition(comm: Any, rank: int) -> list[Event]:
        rep: list[Event] = []
        posted = []
        for what, seconds in program(case, rank):
            if what == "recv":
                comm.recv(torch.empty(case.activation // 4), 1 - rank)
            elif what == "compute":
                time.sleep(seconds)
            elif what == "send":
                posted.append(comm.send(torch.ones(case.activation // 4), 1 - rank, async_op=True))
            elif what == "waits":
                for handle in posted:
                    handle.wait()
                posted = []
            else:
                rep += comm.mark_step()
        return rep

    timed_node(case.repeats, repetition, out)


if __name__ == "__main__":
    import json

    _node(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
