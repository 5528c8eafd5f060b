"""SimResult: what a replay produced: wall-clock, per-node time split, step times, bytes, timeline.

Per node, ``compute_s + comm_s + idle_s == wall_clock_s`` (to rounding):

* ``compute_s``: time computing (stretched by speed, jitter and slowdowns);
* ``comm_s``: exposed communication, time blocked in a collective or a wait after
  the collective has started (the network is working for the node);
* ``idle_s``: time blocked before a collective could start (waiting for the other
  members to arrive, or for a member to come back), time down, and the time from
  the node's last event to the end of the run (waiting for the slowest node).

Under failures (``[failures]``) ``compute_s`` includes work a failure threw away
(``lost_s``: the node's compute since its last sync when the failure struck, which it
redoes after the outage), and ``down_s`` is the part of ``idle_s`` the node spent down
before its last event. Goodput is the useful compute over the machine time:

    goodput = Σ (compute_s − lost_s) / (nodes × wall_clock_s)

and the rest of the machine time, node-seconds summed over nodes, is ``SimResult.lost``:
``lost_work`` (Σ lost_s), ``down`` (Σ down_s), ``waiting`` (Σ idle_s − down_s: for others,
for a member to come back, for the run to end) and ``comm`` (Σ comm_s, exposed
communication, recovery transfers included), so that
goodput · nodes · wall_clock_s + Σ lost == nodes · wall_clock_s. Without failures goodput
equals utilization.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("compute", "comm", "idle")
COMPUTE, COMM, IDLE = range(3)


@dataclass(frozen=True, slots=True)
class NodeTimes:
    """One node's simulated time, split three ways (seconds)."""

    rank: int
    compute_s: float
    comm_s: float
    idle_s: float
    steps: int
    lost_s: float = 0.0  # compute thrown away by failures (included in compute_s)
    down_s: float = 0.0  # time down (included in idle_s)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One node's spans: ``times`` holds (start, end) pairs, ``kinds`` an index into KINDS per span."""

    times: array
    kinds: bytes
    end: float  # the node's last event; the run goes on to wall_clock_s


@dataclass
class SimResult:
    """The outcome of replaying a trace in a scenario.

    Attributes:
        wall_clock_s: simulated time at which the last node finished.
        per_node: by rank, each node's compute_s / comm_s / idle_s.
        step_end_times: simulated time at which step i ended on its slowest node.
        wire_bytes: bytes each node sent on the wire under the chosen algorithms.
        utilization: total compute ÷ (nodes × wall clock).
        goodput: useful compute ÷ (nodes × wall clock), compute less the work failures threw away.
        failures: how many failures struck nodes before their last event.
        scenario_name: the scenario's name ("" when it had none).
        num_steps: how many steps the run had (the most any node took).
        events: how many trace events were replayed.
    """

    wall_clock_s: float
    per_node: list[NodeTimes]
    step_end_times: list[float]
    wire_bytes: list[int]
    utilization: float
    scenario_name: str = ""
    num_steps: int = 0
    events: int = 0
    history: list[float] | None = None
    timelines: list[Timeline] = field(default_factory=list, repr=False)
    failures: int = 0  # failures that struck nodes before their last event
    goodput: float = 0.0  # useful compute ÷ (nodes × wall clock): compute less the work failures threw away

    @property
    def lost(self) -> dict[str, float]:
        """Node-seconds not spent on useful compute, by cause: lost_work, down, waiting, comm."""
        nodes = self.per_node
        return {
            "lost_work": sum(p.lost_s for p in nodes),
            "down": sum(p.down_s for p in nodes),
            "waiting": sum(p.idle_s - p.down_s for p in nodes),
            "comm": sum(p.comm_s for p in nodes),
        }

    def loss_vs_time(self) -> list[tuple[float, float]]:
        """Each step's loss paired with the simulated time the step ended (needs ``history``)."""
        if self.history is None:
            raise ValueError("SimResult.loss_vs_time: no loss history was given to simulate(..., history=...)")
        return list(zip(self.step_end_times, self.history))

    def to_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write the timeline as Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one track per node.

        The file is strict JSON: a time that is not finite raises ValueError instead of writing
        ``nan`` or ``inf``, which JSON lacks and viewers reject.
        """
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
                name = self.scenario_name or "exonet simulation"
                f.write(json.dumps({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": name}}))
                for rank, line in enumerate(self.timelines):
                    f.write(",\n" + json.dumps({"ph": "M", "name": "thread_name", "pid": 0, "tid": rank, "args": {"name": f"node {rank}"}}))
                    spans = [(line.times[2 * i], line.times[2 * i + 1], line.kinds[i]) for i in range(len(line.kinds))]
                    if self.wall_clock_s > line.end:
                        spans.append((line.end, self.wall_clock_s, IDLE))
                    f.writelines(
                        f',\n{{"ph": "X", "pid": 0, "tid": {rank}, "name": "{KINDS[kind]}", "cat": "{KINDS[kind]}", '
                        f'"ts": {_microseconds(start, rank)}, "dur": {_microseconds(end - start, rank)}}}'
                        for start, end, kind in spans
                    )
                f.write("\n]}\n")
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    def summary(self) -> str:
        """A readable table: the run, then one row per node."""
        head = (
            f"scenario {self.scenario_name or '(unnamed)'}: {len(self.per_node)} nodes, {self.num_steps} steps, "
            f"simulated wall-clock {_duration(self.wall_clock_s)}, compute utilization {self.utilization:.1%}"
        )
        if self.failures:
            lost = ", ".join(f"{k} {v:.4g} s" for k, v in self.lost.items())
            head += f"\n{self.failures} failures, goodput {self.goodput:.1%}; node-seconds lost: {lost}"
        rows = [f"{'node':>5} {'compute s':>12} {'comm s':>12} {'idle s':>12} {'wire MB':>12}"]
        for node, sent in zip(self.per_node, self.wire_bytes):
            rows.append(f"{node.rank:>5} {node.compute_s:>12.3f} {node.comm_s:>12.3f} {node.idle_s:>12.3f} {sent / 1e6:>12.3f}")
        return "\n".join([head, *rows])


def _microseconds(seconds: float, rank: int) -> str:
    """``seconds`` in microseconds as a JSON number (Python's repr, which round-trips)."""
    us = seconds * 1e6
    if not math.isfinite(us):
        raise ValueError(f"SimResult.to_chrome_trace: node {rank} has a span of {seconds!r} s; a Chrome trace needs finite times")
    return repr(us)


def _duration(seconds: float) -> str:
    """Seconds as "1h 02m 03.4s" (plus the raw seconds), for people."""
    if seconds < 60:
        return f"{seconds:.4g} s"
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    text = f"{int(h)}h {int(m):02d}m {s:04.1f}s" if h else f"{int(m)}m {s:04.1f}s"
    return f"{text} ({seconds:.1f} s)"
