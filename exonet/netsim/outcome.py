"""The outcome of a replay: per-node times, the run's end, links' loads, collectives' spans, goodput.

Mixed into ``Simulation`` (exonet.netsim.engine), whose state these read once it has run;
kept apart because reading a finished replay is its own concern, off the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from exonet.errors import TraceError
from exonet.netsim.agenda import seconds, ticks
from exonet.netsim.diagnose import deadlock
from exonet.netsim.result import CollectiveSpan, LinkLoad, NodeTimes, SimResult
from exonet.netsim.simstate import SimState
from exonet.netsim.spans import COMM, COMPUTE, Timeline
from exonet.netsim.state import Instance, RankState


class Outcomes(SimState):
    """A ``Simulation``'s results: the whole run, one job of several, and the links' loads."""

    def result(self, history: Sequence[float] | None = None) -> SimResult:
        """Close the input, replay to the end and return the outcome.

        Args:
            history: per-step mean training losses, one per step, for ``loss_vs_time``.
        """
        self.close()
        self.run_until_blocked()
        if self._open:
            raise TraceError(deadlock(self._ranks, list(self._open.values()), self._everyone))
        if self._any:
            raise TraceError(f"trace: rank {min(self._any)} waits for a message from any rank, and none comes")
        ranks = self._ranks
        if self._mirror:
            ranks = [ranks[0]] * len(ranks)
            self._events *= len(ranks)
        wall = max(self._last_end, *(kept(rk) for rk in ranks))
        return self._outcome(ranks, wall, self._step_ends, self._wire, self._events, history, self.resolved.servers)

    def job_result(self, ranks: Sequence[int], events: int = 0, history: Sequence[float] | None = None,
                   servers: int = 0) -> SimResult:
        """The outcome of the job on ``ranks`` (global ranks, in the job's order, its last ``servers`` serving),
        once ``result`` has run.

        Its wall-clock is when its last rank or collective ended; its step i ends when its slowest rank
        ends it. Only valid when the job's collectives stay among its ranks (``simulate`` makes sure).
        """
        own = set(ranks)
        states = [self._ranks[0] if self._mirror else self._ranks[r] for r in ranks]
        ends = [max(rk.step_ends[i] for rk in states if i < len(rk.step_ends))
                for i in range(max(len(rk.step_ends) for rk in states))]
        last = max((t for members, t in self._group_end.items() if members[0] in own), default=0)
        wire = [self._wire[r] for r in ranks]
        return self._outcome(states, max(last, *(kept(rk) for rk in states)), ends, wire, events, history, servers)

    def link_loads(self, jobs: Sequence[Sequence[int]]) -> list[LinkLoad]:
        """Every link that carried bytes, in all and per job (each job a list of global ranks),
        once ``result`` has run."""
        owner = {r: j for j, ranks in enumerate(jobs) for r in ranks}
        carried: dict[int, list[float]] = {}
        for plan, count in self._carried.items():
            if not plan.phases:
                continue  # it carried nothing
            job = owner[plan.phases[0][0][0]]
            for phase in plan.phases:
                for src, dst, size, *_ in phase:
                    for link in self._topo.path(src, dst).links:
                        carried.setdefault(link, [0.0] * len(jobs))[job] += count * self._topo.wire_size(size)
        span = seconds(max(self._last_end, *(rk.t for rk in self._ranks)))
        return [replace(load, bytes=sum(carried[i]), by_job=tuple(carried[i]),
                        utilization=sum(carried[i]) / (load.capacity * span) if span > 0 else 0.0)
                for i, load in enumerate(self._links(span)) if i in carried]

    def _outcome(self, ranks: Sequence[RankState], wall: int, ends: Sequence[int], wire: Sequence[float], events: int,
                 history: Sequence[float] | None, servers: int = 0) -> SimResult:
        """The SimResult of ``ranks`` (each rank's state, in the result's order) ending at tick ``wall``.

        Utilisation and goodput are the trainers' (all but the last ``servers`` ranks): a parameter server
        waits for updates by design, and counting it would cap an asynchronous run at K/(K+1) with an
        idle network.
        """
        if history is not None and len(history) != len(ends):
            raise ValueError(f"simulate: history has {len(history)} losses but the trace has {len(ends)} steps")
        nodes, timelines, total, lost = [], [], 0, 0  # total and lost: the trainers' ticks
        trainers = len(ranks) - servers
        for r, rk in enumerate(ranks):
            trains = r < trainers
            timeline = Timeline(rk.times, bytes(rk.kinds), seconds(rk.t))
            if rk.t <= wall:
                times = NodeTimes(r, seconds(rk.compute), seconds(rk.comm), seconds(rk.idle + (wall - rk.t)), rk.step,
                                  seconds(rk.lost), _down(self._cm.down[rk.rank], seconds(rk.t)),
                                  seconds(rk.aborted), sum(rk.trained[:2]))
                if trains:
                    total, lost = total + rk.compute, lost + rk.lost
            else:  # an elastic node whose thrown-away time runs past the run's end: the run's part of it
                timeline = timeline.clipped(seconds(wall))
                compute, comm = timeline.seconds(COMPUTE), timeline.seconds(COMM)
                dropped = seconds(rk.compute) - compute  # all of it thrown away (see RankState.kept)
                times = NodeTimes(r, compute, comm, seconds(wall) - compute - comm, rk.step,
                                  max(0.0, seconds(rk.lost) - dropped), _down(self._cm.down[rk.rank], seconds(wall)),
                                  min(comm, seconds(rk.aborted)), sum(rk.trained[:2]))
                if trains:
                    total, lost = total + ticks(compute), lost + ticks(times.lost_s)
            nodes.append(times)
            timelines.append(timeline)
        return SimResult(
            wall_clock_s=seconds(wall),
            per_node=nodes,
            step_end_times=[seconds(t) for t in ends],
            wire_bytes=[round(b) for b in wire],
            utilization=total / (trainers * wall) if wall > 0 else 0.0,
            scenario_name=self.name,
            num_steps=len(ends),
            events=events,
            history=None if history is None else [float(x) for x in history],
            timelines=timelines,
            links=self._links(seconds(wall)),
            cost=self._topo.egress_cost(self._link_bytes()),
            collectives=[self._span(c) for c in self._ended],
            link_loads=[_load(c) for c in self._ended],
            failures=sum(len([t for t in self._cm.fail_starts(rk.rank) if t < seconds(min(rk.t, wall))])
                         for rk in ranks),
            goodput=(total - lost) / (trainers * wall) if wall > 0 else 0.0,
            cautions=self._topo.cautions(),
            servers=servers,
            wall_clock_range=(seconds(wall), seconds(wall)),
        )

    def _link_bytes(self) -> np.ndarray:
        """Bytes each link carried over the run, by link id."""
        return sum((count * plan.load for plan, count in self._carried.items()), np.zeros(len(self._topo.capacity)))

    def _links(self, wall: float) -> list[LinkLoad]:
        """Each link's bytes, busy time and utilisation over a run of ``wall`` seconds."""
        topo = self._topo
        load = self._link_bytes()
        busy = sum((count * self._planner.busy(plan) for plan, count in self._alone.items()),
                   self._busy + self._net.busy_s)
        return [LinkLoad(topo.link_name(i), cap, float(load[i]), (float(load[i]),),
                         float(load[i]) / (cap * wall) if wall > 0 else 0.0, float(busy[i]),
                         float(busy[i]) / wall if wall > 0 else 0.0)
                for i, cap in enumerate(topo.capacity)]

    def _span(self, c: Instance) -> CollectiveSpan:
        """``c`` as a record in seconds, with the algorithm that ran it."""
        op = "send" if c.op == "p2p" else c.op
        algorithm = "direct" if c.op == "p2p" else self._algorithms[c.op]
        return CollectiveSpan(seconds(c.start), seconds(c.end), op, c.nbytes, c.members, algorithm, c.async_op)


def _load(c: Instance) -> np.ndarray:
    """The bytes the ended collective ``c`` put on each link."""
    assert c.plan is not None  # every collective is planned when it starts
    return c.plan.load


def kept(rk: RankState) -> int:
    """The tick up to which ``rk``'s time is the run's (see RankState.kept)."""
    return rk.t if rk.kept is None else rk.kept


def _down(outages: Sequence[tuple[float, float]], end: float) -> float:
    """Seconds within [0, end) covered by ``outages`` (overlaps counted once)."""
    total, reach = 0.0, 0.0
    for t0, t1 in sorted(outages):
        lo, hi = max(t0, reach), min(t1, end)
        if hi > lo:
            total += hi - lo
        reach = max(reach, t1)
    return total
