"""SimResult: what a replay produced: wall-clock, per-node time split, step times, bytes, timeline.

Per node, ``compute_s + comm_s + idle_s == wall_clock_s`` (to rounding):

* ``compute_s``: time computing (stretched by speed, jitter and slowdowns);
* ``comm_s``: exposed communication, time blocked in a collective or a wait after
  the collective has started (the network is working for the node);
* ``idle_s``: time blocked before a collective could start (waiting for the other
  members to arrive, or for a member to come back), time down, and the time from
  the node's last event to the end of the run (waiting for the slowest node).

Per link (``links``: each NIC's uplink and downlink, each direction of each inter-region
link): ``bytes`` it carried (wire bytes, headers included), ``busy_s`` (time at least one
flow moved bytes on it), ``utilization = bytes / (capacity × wall_clock_s)`` (the share
of its capacity the run used) and ``busy_fraction = busy_s / wall_clock_s`` (the share of
the run it was in use). A link used at full rate whenever busy has the two equal; a
shared or capped link has utilization below its busy fraction.

Under failures (``[failures]``) ``compute_s`` includes work a failure threw away
(``lost_s``: the node's compute since its last sync when the failure struck, which it
redoes after the outage), and ``down_s`` is the part of ``idle_s`` the node spent down
before its last event. Goodput is the useful compute over the machine time:

    goodput = Σ (compute_s − lost_s) / (nodes × wall_clock_s)

and the rest of the machine time, node-seconds summed over nodes, is ``SimResult.lost``:
``lost_work`` (Σ lost_s + aborted_s), ``down`` (Σ down_s), ``waiting`` (Σ idle_s − down_s: for
others, for a member to come back, for the run to end) and ``comm`` (Σ comm_s − aborted_s, exposed
communication, recovery transfers included), so that
goodput · nodes · wall_clock_s + Σ lost == nodes · wall_clock_s. Without failures, outages or
thrown-away work (a deadline round's late nodes discard theirs) goodput equals utilization.
``aborted_s`` (part of ``comm_s``) is an elastic node's time in collectives that a member's
failure aborted (exonet.netsim.outages): the collective started again without that member.
``trained_steps`` counts the steps whose work the run kept (``SimResult.steps_trained`` over the
trainers): an elastic run's failed nodes discard theirs, so it may train fewer than a blocking run.
Here, and in ``utilization``, nodes are the trainers: the ``servers`` last ranks of a
parameter-server run wait for updates by design and are left out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from exonet.netsim.spans import Timeline
from exonet.units import format_dollars


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
    aborted_s: float = 0.0  # time in collectives a member's failure aborted, elastic runs (included in comm_s)
    trained_steps: int = 0  # steps whose work the run kept (not discarded, not sat out)


@dataclass(frozen=True, slots=True)
class LinkLoad:
    """What one link (one direction) carried over the run, and how long it was busy."""

    name: str  # "uplink 3", "downlink 3", "us->eu", "fabric up 3", "fabric down 3"
    capacity: float  # bytes/s
    bytes: float  # on the wire (headers included)
    by_job: tuple[float, ...]  # the same, per job: (bytes,) for one trace
    utilization: float  # bytes / (capacity × wall_clock_s)
    busy_s: float  # seconds at least one flow moved bytes on it
    busy_fraction: float  # busy_s / wall_clock_s


@dataclass(frozen=True, slots=True)
class CollectiveSpan:
    """One collective (or point-to-point message) as the network ran it, in simulated seconds.

    ``op`` is the trace's op, or "send" for a message, whose ``group`` is (sender, receiver);
    ``nbytes`` is the payload a member passed in (the largest, if they differed);
    ``algorithm`` is how the scenario ran the op; ``async_op`` is whether a member issued it
    asynchronously (so it may overlap that member's compute).
    """

    start_s: float
    end_s: float
    op: str
    nbytes: int
    group: tuple[int, ...]
    algorithm: str
    async_op: bool


@dataclass
class SimResult:
    """The outcome of replaying a trace in a scenario.

    Attributes:
        wall_clock_s: simulated time at which the last node finished.
        per_node: by rank, each node's compute_s / comm_s / idle_s.
        step_end_times: simulated time at which step i ended on its slowest node.
        wire_bytes: bytes each node sent on the wire under the chosen algorithms.
        utilization: total compute ÷ (nodes × wall clock), over the trainers (a server's waiting is its job).
        goodput: useful compute ÷ (nodes × wall clock), compute less the work failures threw away.
        failures: how many failures struck nodes before their last event.
        scenario_name: the scenario's name ("" when it had none).
        num_steps: how many steps the run had (the most any node took).
        events: how many trace events were replayed.
        jobs: with several traces (``simulate([a, b], ...)``), each job's own result, its ranks numbered as
            in its trace; empty otherwise.
        links: per link (with several traces: every link that carried bytes, and each job's share), its bytes,
            busy time and utilisation (see the module's docstring).
        collectives: every collective and message, in the order they ended.
        wall_clock_range: (p10, p90) of the wall-clock in seconds, ``wall_clock_s`` being the median: where
            phases lose packets to an overflowing queue, the spread of the loss-recovery cost measured on the
            testbed; (wall_clock_s, wall_clock_s) where nothing is stochastic.
        expected_range: (p10, p90) seconds a real run of the trace on the described cluster is expected to take:
            ``wall_clock_range`` widened by the model's own errors measured on the testbed in this replay's
            ``regime`` ("library", "phase", "lossy" or "lossy-streams"; exonet/netsim/confidence.py).
        cost: dollars of egress: the wire bytes (headers included) that crossed each inter-region link times the
            scenario's ``egress`` price for that direction (``[[links]]``, else the source ``[[regions]]``); 0 where
            nothing is priced.
        cautions: sentences naming where this replay sits in a regime the real-links testbed measured
            the model optimistic in (several TCP streams overflowing a shaped queue), with the measured
            bound, or that a FLOPs scenario timed a trace without FLOPs by its seconds; empty elsewhere.
            ``summary`` prints them.
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
    jobs: list[SimResult] = field(default_factory=list, repr=False)
    links: list[LinkLoad] = field(default_factory=list, repr=False)
    collectives: list[CollectiveSpan] = field(default_factory=list, repr=False)
    # per collective (as ``collectives``): the bytes it put on each link, by index into ``links``
    link_loads: list[np.ndarray] = field(default_factory=list, repr=False)
    failures: int = 0  # failures that struck nodes before their last event
    goodput: float = 0.0  # useful compute ÷ (nodes × wall clock): compute less the work failures threw away
    cautions: tuple[str, ...] = ()  # regimes real links were measured slower than modelled in; compute timing changed
    servers: int = 0  # the last ranks serve (a parameter server): utilisation, goodput and lost count the others
    # (p10, p90) seconds around wall_clock_s (the median); zero width where nothing is stochastic (see spread.py)
    wall_clock_range: tuple[float, float] = (0.0, 0.0)
    # (p10, p90) seconds a real run is expected in: wall_clock_range widened by the model's measured errors in its
    # regime ("library", "phase", "lossy", "lossy-streams"; see confidence.py)
    expected_range: tuple[float, float] = (0.0, 0.0)
    regime: str = ""
    # how the replay went: {"memo": {"steps", "played_back", "hit_rate", "boundaries"}} where it was fed in steps
    # (exonet.netsim.memo: steps that repeat one already replayed are played back, exactly)
    stats: dict[str, Any] = field(default_factory=dict)
    cost: float = 0.0  # dollars of egress (see Attributes)
    stages: int = 0  # a pipeline's stages (ranks q·S + s; ``exonet.runtime.pipeline``), 0 for whole-model nodes

    @property
    def trainers(self) -> int:
        """How many ranks train: all but the ``servers`` (utilisation, goodput and ``lost`` are theirs)."""
        return len(self.per_node) - self.servers

    def wire_per_trainer(self) -> float:
        """Wire bytes (headers included) per training rank: the mean over the ranks before the servers."""
        return sum(self.wire_bytes[:self.trainers]) / self.trainers

    def wire_by_level(self) -> dict[str, float]:
        """Wire bytes per trainer at each level, the wide area first (the bytes that cost money): across the
        inter-region links, out of the NICs (every message between hosts, the inter-region ones included), and
        over the in-host fabric. Totals over the run's links, divided by its trainers."""
        levels = {"inter_region": 0.0, "nic": 0.0, "in_host": 0.0}
        for link in self.links:
            level = ("nic" if link.name.startswith("uplink") else "in_host" if link.name.startswith("fabric up")
                     else "inter_region" if "->" in link.name else None)
            if level is not None:
                levels[level] += link.bytes
        return {level: total / max(1, self.trainers) for level, total in levels.items()}

    @property
    def lost(self) -> dict[str, float]:
        """Trainer-seconds not spent on useful compute, by cause: lost_work, down, waiting, comm."""
        nodes = self.per_node[:self.trainers]
        return {
            "lost_work": sum(p.lost_s + p.aborted_s for p in nodes),
            "down": sum(p.down_s for p in nodes),
            "waiting": sum(p.idle_s - p.down_s for p in nodes),
            "comm": sum(p.comm_s - p.aborted_s for p in nodes),
        }

    @property
    def steps_trained(self) -> int:
        """Node-steps whose work the run kept, over the trainers: ``nodes × steps`` unless work was discarded
        (an elastic or deadline run's failed or late nodes) or a node sat steps out."""
        return sum(p.trained_steps for p in self.per_node[:self.trainers])

    def stage_utilization(self) -> list[float]:
        """A pipeline's stages (``stages`` > 0): each stage's compute ÷ wall clock, averaged over its replicas;
        what is missing from 1 is its share of the bubble and of the waits on its boundaries."""
        S, nodes = self.stages, self.per_node[:self.trainers]
        if not S or not self.wall_clock_s:
            return []
        return [sum(n.compute_s for n in nodes[s::S]) / (len(nodes[s::S]) * self.wall_clock_s) for s in range(S)]

    def boundary_bytes(self) -> list[int]:
        """A pipeline's boundaries: the bytes of every message between stage s and s + 1, both ways, the run
        over (S − 1 of them; empty for whole-model nodes), within a replica or, routed, across replicas."""
        S = self.stages
        sent = [0] * max(0, S - 1)
        for c in self.collectives:
            if S and c.op == "send" and len(c.group) == 2:
                a, b = sorted(r % S for r in c.group)
                if b == a + 1:
                    sent[a] += c.nbytes
        return sent

    def busiest_links(self, k: int | None = None) -> list[LinkLoad]:
        """The links by utilisation, most loaded first (ties: by busy time); the first ``k`` of them."""
        ranked = sorted(self.links, key=lambda link: (-link.utilization, -link.busy_s, link.name))
        return ranked if k is None else ranked[:k]

    def loss_vs_time(self, evals: Sequence[Mapping[str, Any]] | None = None) -> list[tuple[float, float]]:
        """Each step's training loss paired with the simulated time the step ended (needs ``history``).

        With ``evals`` (a FitResult's ``history["eval"]``), the validation loss instead: an evaluation after
        step s at the time step s ended here; a server's (counted in ``updates``) at the ``sim_time_s`` it
        carries, which is the time in the scenario its run was clocked in.
        """
        if evals is not None:
            ends = self.step_end_times
            points = [(e["sim_time_s"] if "updates" in e else ends[e["step"] - 1], e["loss"]) for e in evals
                      if ("updates" in e and "sim_time_s" in e) or 1 <= e["step"] <= len(ends)]
            return sorted(points, key=lambda p: p[0])
        if self.history is None:
            raise ValueError("SimResult.loss_vs_time: no loss history was given to simulate(..., history=...)")
        return list(zip(self.step_end_times, self.history))

    def to_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write the run as Chrome trace JSON (ui.perfetto.dev, chrome://tracing); see exonet.netsim.chrome.

        A track per node (compute / comm / idle), its collectives and messages as slices with
        their op, bytes, group and algorithm, arrows for messages, and a utilisation counter per link.
        """
        from exonet.netsim import chrome

        return chrome.write(self, path)

    def link_series(self, windows: int = 200, links: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each link's utilisation over time: ``windows`` equal windows of the run.

        Returns the windows' edges (seconds, ``windows + 1`` of them) and, per link of ``links``
        (indices into ``links``; default all), bytes in each window ÷ (capacity × window). A
        collective's bytes on a link are spread evenly over its span, start to end, so the
        windows' mean is the link's ``utilization`` exactly; within a span the profile is flat.
        """
        chosen = np.arange(len(self.links)) if links is None else np.asarray(links, dtype=np.intp)
        edges = np.linspace(0.0, self.wall_clock_s, windows + 1)
        out = np.zeros((len(chosen), windows))
        if self.wall_clock_s <= 0 or not len(chosen):
            return edges, out
        cumulative = np.zeros((windows + 1, len(chosen)))
        for lo in range(0, len(self.collectives), 4096):  # chunks bound the (collectives × edges) matrix
            spans = self.collectives[lo:lo + 4096]
            start = np.array([c.start_s for c in spans])[:, None]
            length = np.array([c.end_s - c.start_s for c in spans])[:, None]
            loads = np.array([np.asarray(load)[chosen] for load in self.link_loads[lo:lo + 4096]])
            with np.errstate(divide="ignore", invalid="ignore"):
                spread = np.clip((edges[None, :] - start) / length, 0.0, 1.0)
            share = np.where(length > 0, spread, edges[None, :] > start)  # a span of no length: all at its start
            share[:, 0], share[:, -1] = 0.0, 1.0
            cumulative += share.T @ loads
        capacity = np.array([self.links[i].capacity for i in chosen])
        out[:] = (np.diff(cumulative, axis=0) / (capacity[None, :] * np.diff(edges)[:, None])).T
        return edges, out

    def summary(self) -> str:
        """A readable table: the run, then one row per node."""
        head = (
            f"scenario {self.scenario_name or '(unnamed)'}: {self.trainers} nodes"
            f"{f' and {self.servers} server' + ('s' if self.servers > 1 else '') if self.servers else ''}, "
            f"{self.num_steps} steps, "
            f"simulated wall-clock {_duration(self.wall_clock_s)}, compute utilization {self.utilization:.1%}"
        )
        low, high = self.wall_clock_range
        if high > low:
            head += f"\nwall-clock range (p10-p90): {_duration(low)} to {_duration(high)}"
        low, high = self.expected_range
        if high > low:
            head += (f"\na real run, by the model's measured errors in the {self.regime} regime (p10-p90): "
                     f"{_duration(low)} to {_duration(high)}")
        if self.cost:
            head += f"\negress cost {format_dollars(self.cost)}"
        if self.failures or self.lost["lost_work"] or self.lost["down"]:  # goodput is not the utilisation
            lost = ", ".join(f"{k} {v:.4g} s" for k, v in self.lost.items())
            head += f"\n{self.failures} failures, goodput {self.goodput:.1%}; node-seconds lost: {lost}"
        rows = [f"{'node':>5} {'compute s':>12} {'comm s':>12} {'idle s':>12} {'wire MB':>12}"]
        for node, sent in zip(self.per_node, self.wire_bytes):
            rows.append(f"{node.rank:>5} {node.compute_s:>12.3f} {node.comm_s:>12.3f} {node.idle_s:>12.3f} "
                        f"{sent / 1e6:>12.3f}" + ("  server" if node.rank >= self.trainers else ""))
        levels = self.wire_by_level()
        if levels["inter_region"] or levels["in_host"]:
            whose = " (the servers' sends included)" if self.servers else ""
            rows.append(f"wire bytes per trainer{whose}: " + ", ".join(
                f"{name.replace('_', '-')} {value / 1e6:.3f} MB" for name, value in levels.items()))
        top = self.busiest_links(1)
        if top and top[0].bytes > 0:
            link = top[0]
            rows.append(f"most loaded link: {link.name}, {link.bytes / 1e6:.3f} MB, busy {link.busy_s:.3f} s "
                        f"({link.busy_fraction:.1%} of the run), utilization {link.utilization:.1%}")
        if self.stages:
            each = ", ".join(f"{u:.1%}" for u in self.stage_utilization())
            crossing = ", ".join(f"{b / 1e6:.3f}" for b in self.boundary_bytes())
            rows.append(f"pipeline: {self.stages} stages, bubble {1 - self.utilization:.1%}; stage utilization "
                        f"{each}; MB per boundary {crossing or 'none'}")
        rows += [f"caution: {text}" for text in self.cautions]
        return "\n".join([head, *rows])


def _duration(seconds: float) -> str:
    """Seconds as "1h 02m 03.4s" (plus the raw seconds), for people."""
    if seconds < 60:
        return f"{seconds:.4g} s"
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    text = f"{int(h)}h {int(m):02d}m {s:04.1f}s" if h else f"{int(m)}m {s:04.1f}s"
    return f"{text} ({seconds:.1f} s)"
