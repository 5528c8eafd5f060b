"""The online simulated clock: the parent's replay of a run while it trains (a node's link to it is ``clock_link``).

Whenever ``fit`` has a scenario the clock runs, so that a strategy can ask it the time or what a
transfer would take (``decides=False``: it stops nothing, and the run's SimResult is the replay of
its trace as without it). ``fit(scenario=S, max_sim_time_s=T)`` also decides with it: every step's
events are fed to an incremental ``Simulation`` as the nodes report them, and a node
starts step k only once the clock says step k−1 ended before T.

* Synchronous strategies are gated by their slowest node, so the decision is global:
  every node is told the same thing, does the same number of steps, and the collectives
  always match.
* A strategy with a server (``Strategy.servers``, e.g. asynchronous DiLoCo, FedBuff) is
  decided per node: each trainer does as many steps as fit into T at its own simulated
  speed. Its server asks the clock which message it receives next (``recv_any``): the one
  that arrives first in simulated time, whatever order the real processes reach it in.
  Such a run is always clocked (T may be infinite), and its nodes report their events
  before every blocking call, so the clock always has what it needs to answer.

Compute must be deterministic for the clock to mean anything: the scenario's
``compute.mode`` must be "flops" (the FLOPs torch counts per step, divided by the device
rate, node speed, jitter and events). Then the same seed gives the same run, and
replaying the finished trace in S gives the same times as the clock did (the engine's
results do not depend on feed order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from exonet.netsim import SimResult, Simulation
from exonet.netsim.engine import AnyRecv
from exonet.scenario import Scenario
from exonet.trace import Collective, Event, Step

Decision = tuple[int | None, int, bool]  # (rank, or None for every node; step; whether it runs)
Elastic = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (up, out, rejoin) of an elastic round


class SimClock:
    """An incremental replay of a run, its stop decisions, and answers to the nodes' questions.

    Args:
        scenario: the network and devices the run is timed in.
        world: every rank of the run (trainers, then servers).
        limit_s: the budget of simulated seconds (``max_sim_time_s``; inf: no limit).
        max_steps: the run's cap on steps: no decision is made for a step beyond it.
        trainers: ranks 0 .. trainers−1 train (the rest serve).
        synchronous: decide for every node at once (else for each trainer on its own).
        what: the fit argument that needs the clock, for errors.
        given_compute: the compute spans are stated, not measured (``exonet.estimate``), so they are
            deterministic in any ``compute.mode``.
        rewind: whether a failure makes the replay redo the work since the last sync (not for elastic runs).
    """

    def __init__(self, scenario: Scenario, world: int, limit_s: float, max_steps: int, *, trainers: int | None = None,
                 synchronous: bool = True, what: str = "max_sim_time_s", decides: bool = True,
                 given_compute: bool = False, rewind: bool = True) -> None:
        resolved = scenario.resolve(world, servers=world - (world if trainers is None else trainers))
        self.decides = decides  # False: it only answers a strategy's questions ("now", "transfer"), in any compute mode
        if decides and resolved.compute_mode != "flops" and not given_compute:
            raise ValueError(f"fit: {what} needs deterministic compute: scenario {scenario.name!r} has "
                             f"compute.mode {resolved.compute_mode!r}; "
                             "set [compute] mode = \"flops\" with tflops and mfu")
        self.limit_s, self.max_steps, self.synchronous = limit_s, max_steps, synchronous
        self.gated = math.isfinite(limit_s)  # nodes wait for step decisions only under a limit
        self.speeds = tuple(resolved.speed)
        self.sim = Simulation(resolved, name=scenario.name, rewind=rewind)
        self._trainers = range(world if trainers is None else trainers)
        self._decided = [0] * world  # per rank: the last step decided (step 0 always runs)
        self._stopped: set[int] = set()
        self._reported = [0] * world  # steps each node has reported
        self._asked: dict[int, tuple[tuple, int]] = {}  # rank -> its open question, messages it had taken
        self.stopped_at: int | None = None  # a synchronous run's first step not run
        self._rounds: dict[int, tuple[tuple[int, ...], dict[int, float]]] = {}  # deadline rounds decided
        self._opened: dict[int, float] = {0: 0.0}  # when each deadline round opened
        self._elastic_rounds: dict[int, Elastic] = {}  # per elastic round
        self._elastic_arrived: dict[int, float] = {}  # each trainer's arrival at the latest elastic round's end
        self._out: set[int] = set()  # elastic trainers still down at the latest round's end

    def feed(self, rank: int, events: Sequence[Event]) -> None:
        """Events a node reported (a step's, those before a blocking call, or its final ones); replays them."""
        for e in events:
            self.sim.feed(rank, e)
            if type(e) is Step:
                self._reported[rank] += 1
        self.sim.run_until_blocked()

    def ask(self, rank: int, question: tuple) -> None:
        """``rank`` asks ``question`` (after its events so far were fed); ``answers`` gives the reply when known.

        Questions: ``("recv_any", cid, nbytes, dtype)``, which message ``rank`` receives next:
        answered (sender, simulated seconds it was received), or None once no message can
        come; ``("speeds",)``, every rank's relative compute speed in the scenario; ``("now",)``,
        the asker's simulated time once its events are replayed; ``("transfer", op, nbytes, group)``,
        how long that collective or message would take on an idle network;
        ``("deadline", r, seconds)``, asked by every trainer that finished its local work of
        round r: who finished it by the round's deadline (see ``_deadline``); ``("elastic", r)``, asked
        by every trainer at the end of elastic round r: who stayed up since its last sync (see ``_elastic``).
        """
        if rank in self._asked:
            raise RuntimeError(f"online clock: rank {rank} asked {question[0]!r} before its last question was answered")
        taken = len(self.sim.received(rank))
        self._asked[rank] = (question, taken)
        if question[0] == "recv_any":
            self.sim.feed(rank, AnyRecv(question[2]))
            self.sim.run_until_blocked()
        elif question[0] not in ("speeds", "deadline", "elastic", "now", "transfer"):
            del self._asked[rank]
            raise ValueError(f"online clock: unknown question {question[0]!r}")

    def answers(self) -> list[tuple[int, tuple, Any]]:
        """(rank, question, answer) for every open question the replay can now answer.

        If none can be answered while every rank that may still report has asked (so no input can
        come), and some ask about an elastic round, the replay runs on past the askers' own times
        (``Simulation.overrun``): the round's end can wait on ranks still inside the previous round's
        collective, which the askers would otherwise hold back.
        """
        out = self._answerable()
        waiting = [q for q in range(len(self._decided)) if self.sim.is_open(q)]
        if (not out and waiting and all(q in self._asked for q in waiting)
                and any(question[0] == "elastic" for question, _ in self._asked.values())):
            try:
                while not out and self.sim.overrun(waiting):
                    out = self._answerable()
            finally:
                self.sim.hold()
        return out

    def _answerable(self) -> list[tuple[int, tuple, Any]]:
        out: list[tuple[int, tuple, Any]] = []
        for rank, (question, taken) in list(self._asked.items()):
            if question[0] == "speeds":
                out.append((rank, question, self.speeds))
            elif question[0] == "transfer":
                out.append((rank, question, self.sim.idle_duration(question[1], question[3], question[2])))
            elif question[0] == "now":
                times = self.sim.settled(rank)
                if times is None:
                    continue
                out.append((rank, question, times[0]))
            elif question[0] in ("deadline", "elastic"):
                answer = (self._deadline(question[1], question[2]) if question[0] == "deadline"
                          else self._elastic(question[1]))
                if answer is None:
                    continue
                out.append((rank, question, answer))
            elif len(self.sim.received(rank)) > taken:
                out.append((rank, question, self.sim.received(rank)[taken]))
            elif self.sim.waits_for_any(rank) and not self.sim.may_receive(rank):
                self.sim.cancel_any(rank)
                out.append((rank, question, None))
            else:
                continue
            del self._asked[rank]
        return out

    def _deadline(self, r: int, deadline_s: float) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(participants, late) of deadline round r, once every trainer has finished it or stopped; else None.

        Round r opens when round r−1's average is complete (0 for the first): its participants'
        all-reduce ends, or the lone participant's local work does (a round nobody made, or whose
        participants all stopped, closed at its deadline: the next opens then). A trainer takes part if it
        finished its local work of round r (the moment it asked) by the opening plus
        ``deadline_s``; those that finished later are late; those that stopped are neither.
        """
        if r in self._rounds:
            return self._answer(r)
        finished: dict[int, float] = {}
        for q in self._trainers:
            asked = self._asked.get(q)
            if asked is not None and asked[0][0] == "deadline" and asked[0][1] == r:
                times = self.sim.settled(q)
                if times is None:
                    return None
                finished[q] = times[0]
                if r - 1 in self._rounds and q in self._rounds[r - 1][0] and r not in self._opened:
                    self._opened[r] = max(self._rounds[r - 1][1][q], times[1])
            elif self.sim.is_open(q) or self.sim.settled(q) is None:
                return None  # still on its way to the end of round r (or to stopping)
        if r not in self._opened:  # no participant of round r−1 got here: it closed at its deadline, unanswered
            self._opened[r] = self._opened[r - 1] + deadline_s
        close = self._opened[r] + deadline_s
        self._rounds[r] = (tuple(q for q in sorted(finished) if finished[q] <= close), finished)
        return self._answer(r)

    def _elastic(self, r: int) -> Elastic | None:
        """(up, out, rejoin) of elastic round r, once every trainer has reached its end or stopped; else None.

        A trainer failed in the round if it was down at any time between its last sync (the end of
        its latest blocking call: the previous round's all-reduce, or the state it received; at least
        its arrival at the previous round's end) and its arrival at this round's end. The others,
        except those still out from earlier rounds, are up: they average, and the round ends at
        their latest arrival T. A failed or out trainer that is up again at T rejoins (it receives
        the state); one still down at T stays out, doing no traced work, until a round whose T
        finds it up. If nobody is up, nobody averages and every trainer is back in for the next
        round (which waits for them all). Trainers that stopped are in none of the three.
        """
        if r in self._elastic_rounds:
            return self._elastic_rounds[r]
        arrived: dict[int, tuple[float, float]] = {}
        for q in self._trainers:
            asked = self._asked.get(q)
            if asked is not None and asked[0][0] == "elastic" and asked[0][1] == r:
                times = self.sim.settled(q)
                if times is None:
                    return None
                arrived[q] = times
            elif self.sim.is_open(q) or self.sim.settled(q) is None:
                return None
        since = {q: max(synced, self._elastic_arrived.get(q, 0.0)) for q, (_, synced) in arrived.items()}
        up = tuple(q for q in sorted(arrived)
                   if q not in self._out and not self.sim.was_down(q, since[q], arrived[q][0]))
        rest = [q for q in sorted(arrived) if q not in up]
        if up:
            end = max(arrived[q][0] for q in up)
            out = tuple(q for q in rest if self.sim.down_at(q, end))
        else:
            out = ()
        answer = up, out, tuple(q for q in rest if q not in out)
        self._out = set(out)
        self._elastic_arrived.update({q: t for q, (t, _) in arrived.items()})
        self._elastic_rounds[r] = answer
        return answer

    def _answer(self, r: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        participants, finished = self._rounds[r]
        return participants, tuple(q for q in sorted(finished) if q not in participants)

    def decisions(self) -> list[Decision]:
        """New step decisions: step k runs if step k−1 ended before the limit.

        Synchronous: on its slowest node, once every node has finished step k−1 in the replay,
        for every node at once; after the first "stop" there are no more. Per node: on that
        trainer, once it has finished step k−1.
        """
        if not self.gated:
            return []
        return self._global() if self.synchronous else self._per_node()

    def _global(self) -> list[Decision]:
        out: list[Decision] = []
        decided = self._decided[0]
        while self.stopped_at is None and decided + 1 < self.max_steps:
            end = self.sim.step_end(decided)
            if end is None:
                break
            decided += 1
            go = end < self.limit_s
            out.append((None, decided, go))
            if not go:
                self.stopped_at = decided
        if not out and self.stopped_at is None and decided + 1 < self.max_steps and min(self._reported) > decided:
            raise RuntimeError(
                f"fit(max_sim_time_s=...): every node has reported step {decided}, but the online clock "
                f"cannot tell when it ended without the next step's traffic (a collective of a subgroup still "
                f"in flight); strategies whose subgroups change per round are not supported by the clock yet")
        self._decided[0] = decided
        return out

    def _per_node(self) -> list[Decision]:
        out: list[Decision] = []
        for r in self._trainers:
            k = self._decided[r] + 1
            if r in self._stopped or k >= self.max_steps:
                continue
            steps, end = self.sim.rank_steps(r)
            if steps >= k:
                go = end < self.limit_s
                out.append((r, k, go))
                self._decided[r] = k
                if not go:
                    self._stopped.add(r)
        return out

    def close(self, rank: int) -> None:
        """``rank`` will report nothing more (it no longer holds the replay back)."""
        self.sim.close(rank)
        self.sim.run_until_blocked()

    def result(self, history: Sequence[float] | None = None) -> SimResult:
        """The replay of the whole run (every node closed)."""
        return self.sim.result(history)


def received_event(rank: int, question: tuple, answer: tuple[int, float]) -> Collective:
    """The trace's record of an answered ``recv_any``: a plain recv from the sender the clock chose."""
    _, cid, nbytes, dtype = question
    return Collective(cid, "recv", nbytes, tuple(sorted((answer[0], rank))), False, dtype)
