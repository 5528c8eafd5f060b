"""Engine: replay per-rank events through the network model, incrementally, on a SimPy event clock.

``Simulation`` consumes each rank's events as they are fed (``feed``), so a run can be
simulated while it is produced; ``simulate`` (exonet.netsim.replay) is the convenience
wrapper for a whole trace. How time passes:

* A rank runs its own events without waiting for the clock: compute spans only
  move its own cursor (their length depends on its speed, jitter and outages, all
  known in advance), so only collectives become SimPy events. This keeps a
  10,000-step, 64-node replay to a few events per step.
* The k-th collective a rank issues on a group matches the k-th of every other
  member on that group (group None = all ranks). It starts when the last member
  has issued it, and not before every member is up. Members normally pass the
  same ``nbytes``; if they differ, the largest is simulated. A sync collective blocks its
  rank until it ends; an async one lets the rank go on until a ``Wait`` on it.
* A collective that starts on an idle network (nothing else in flight) runs on the
  fast path: its end time comes from ``Planner.duration`` in one event. If another
  collective starts, or a member goes down, before it ends, the engine takes it
  over at that instant (``Planner.state_at``) and runs its flows through the shared
  ``FluidNetwork``: one SimPy event per rate change, one per batch of deliveries.
  In a scenario without outages, a collective whose links no flow in transit crosses at
  a phase boundary goes back to the fast path from that phase on (it *rests*). Under
  max-min sharing, collectives rest together on shared links while their bytes are on
  the wire at different times (``Planner.windows``: a latency-bound phase transmits for
  a fraction of its length): where two resting collectives' windows first meet, both
  are taken over (``_split``); a phase put on the network takes over the resting
  collectives on its links that transmit now, and guards the next window of the others
  (``_guard``: taken over then if flows in transit still cross their links).
* ``Step`` marks only record the time. A rank's step i ends at its cursor; step i of
  the run ends when its slowest rank ends it.

* A message (``send``/``recv``) flows as soon as its sender issues it: the receiver
  buffers it, and its ``recv`` ends when it has arrived (at once, if it already has).
  An any-source receive (``AnyRecv``, fed by the online clock) takes the message that
  arrived first, so a parameter server applies updates in simulated arrival order.
* The first collective (or message) on each distinct group (the set of its members) pays
  the scenario's ``network.setup`` seconds before it starts (communicator creation and
  connections), once per group per simulation; the time counts as communication.
* Collectives on one group run one at a time, in issue order (NCCL runs a
  communicator's collectives in order on one stream): the next starts when the
  previous ends, so overlapped DDP buckets queue rather than share links. Set
  ``network.group_concurrency`` to let more run at once (a gloo process group has
  two worker threads). Collectives on different groups run at once and share links.

* Failures (``[failures]``) are outages drawn per rank as the replay goes (exonet.netsim.outages).
  In an elastic run (``rewind=False``) a collective goes on without a member that is down when
  it starts or fails while it runs: it aborts and starts again on the others (exonet.netsim.outages).

Incremental feeding is safe because a rank that is waiting for input (open, not
blocked, nothing queued) holds the clock back: no event at or after its cursor is
processed until it is fed or closed, so nothing it will do can land in the past.

Time is integer ticks, and everything due at one instant runs in a fixed order
(exonet.netsim.agenda): that keeps a replay exact however long it runs and in whatever
order it is fed. The per-rank and per-collective records live in exonet.netsim.state; what
a trace that cannot finish is stuck on is worded in exonet.netsim.diagnose; the outcome of a
finished replay is read in exonet.netsim.outcome, the online clock's questions are
answered in exonet.netsim.queries, a collective's phases run as flows on the fluid network in
exonet.netsim.eventpath, and collectives move between the fast path and the event path in
exonet.netsim.handover.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import cast

import numpy as np

from exonet.errors import ScenarioError, TraceError
from exonet.netsim import tcp
from exonet.netsim.agenda import CLAIM, SCALE, START, TICK, Agenda, seconds, ticks
from exonet.netsim.collectives import algorithm_names
from exonet.netsim.compute import FAILED, ComputeModel
from exonet.netsim.eventpath import EventPath
from exonet.netsim.fastpath import Plan, Planner
from exonet.netsim.flows import SHARING, FluidNetwork
from exonet.netsim.handover import Handover
from exonet.netsim.messages import Messages
from exonet.netsim.outages import Outages
from exonet.netsim.outcome import Outcomes, kept
from exonet.netsim.queries import ClockQueries
from exonet.netsim.simstate import HandoverState, SimState
from exonet.netsim.spans import COMM, COMPUTE, IDLE
from exonet.netsim.state import AnyRecv, Instance, RankState
from exonet.netsim.topology import Topology
from exonet.scenario import Resolved
from exonet.trace import P2P_OPS, Collective, Compute, Discard, Event, Step, Trace, Wait


class Simulation(ClockQueries, Outcomes, Outages, EventPath, Handover, Messages, SimState):
    """An incremental replay of per-rank events in one scenario.

    Args:
        resolved: the scenario made concrete for the run's node count.
        fast_path: time lone collectives analytically (exact; off only to cross-check).
        name: the scenario's name, for the result.
        rewind: a failure during compute throws the work since the last sync away, to be redone
            (False for an elastic run: the failed node pauses, its strategy discards the work, and a
            collective goes on without a member that is down).

    Feed events with ``feed``/``feed_trace``, advance with ``run_until_blocked``, and
    collect the outcome with ``result`` (which closes the input and runs to the end).
    """

    def __init__(self, resolved: Resolved, *, fast_path: bool = True, name: str = "", rewind: bool = True) -> None:
        if resolved.sharing not in SHARING:
            raise ScenarioError(f"scenario: network.sharing must be one of {', '.join(SHARING)}, "
                                f"got {resolved.sharing!r}")
        concurrency = resolved.group_concurrency
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ScenarioError(f"scenario: network.group_concurrency must be an integer >= 1, got {concurrency!r}")
        n = resolved.num_nodes
        self.resolved = resolved
        self.name = name
        self._agenda = Agenda()
        self._topo = Topology(resolved)
        self._cm = ComputeModel(resolved)
        self._planner = Planner(self._topo, resolved.algorithms, resolved.sharing)
        self._algorithms = algorithm_names(resolved.algorithms)  # op -> the algorithm that runs it, for the spans
        self._net = FluidNetwork(self._topo.capacity, resolved.sharing, resolution=TICK)
        self._net_epoch = 0  # the tick at which the fluid network's clock reads 0
        self._net_token = 0
        self._fast = fast_path
        self._rewind = rewind
        self._ranks = [RankState(r) for r in range(n)]
        self._everyone = tuple(range(n))
        self._members = {None: self._everyone}
        self._open = {}  # issued by some members, not yet by all
        self._late = {}  # elastic: started without members yet to issue it
        self._concurrency = concurrency
        self._running = {}  # group -> collectives started or due to start
        self._queued = {}  # group -> issued by all, waiting their turn
        self._active = {}  # in flight on the event path
        # resting collectives may share links, apart in time (max-min only: FIFO's order is the order of entry,
        # which a take-over would change)
        self._handover = HandoverState(windowed=resolved.sharing == "max-min")
        failing = self._cm.failures is not None
        # nothing else stops a flow
        self._calm = not any(self._cm.gated_steps) and not any(self._cm.down) and not failing
        self._step_ends = []
        self._wire = [0.0] * n
        self._carried = {}  # plan -> how many collectives ran it (for the links' loads)
        self._alone = {}  # plan -> how many ran it whole on the fast path (for the links' busy time)
        self._busy = np.zeros(len(self._topo.capacity) + 1)  # busy seconds of fast-path parts of collectives
        self._ended = []  # every collective and message, in the order they ended
        self._last_end = 0
        self._events = 0
        self._horizon = math.inf  # the earliest cursor of a rank waiting for input
        self._lookahead = set()  # ranks waiting for input that do not hold the clock back (see overrun)
        self._gates = any(self._cm.gated_steps)
        self._mirror = False  # ranks 1.. mirror rank 0 (see feed_trace)
        self._inbox = {}  # receiver -> messages delivered that it has not received
        self._any = {}  # receivers waiting in an any-source receive
        self._rendezvous = resolved.backend == "gloo"  # a message waits for its receiver (see _post)
        self._unmatched = {}  # gloo: receiver -> messages sent that wait for its receive
        self._on_wire = {}  # gloo: (sender, receiver) -> messages started whose last byte has not left
        self._behind = {}  # gloo: message -> recv-ready notices queued behind its bytes
        self._received = {}  # receiver -> (sender, seconds) its AnyRecvs took
        self._group_end = {}  # members -> tick their latest collective ended
        self._rtos = {}  # members -> the RTO of their slowest pair
        self._set_up = set()  # groups whose one-time set-up is paid
        for r, outages in enumerate(self._cm.down):
            for t0, t1 in outages:
                self._schedule_outage(r, ticks(t0), ticks(t1))
            self._ranks[r].gate = 0 in self._cm.gated_steps[r]
        self._failing = 0  # failure calls on the agenda
        self._stalled = {}  # rank -> its next failure, while nothing else can move
        if failing:
            for r in range(n):
                if self._cm.process(r) is not None:
                    self._schedule_failure(r, 0)

    # ----------------------------------------------------------------- input
    def feed(self, rank: int, event: Event | AnyRecv) -> None:
        """Append one event to ``rank``'s input (processed by ``run_until_blocked``)."""
        rk = self._ranks[rank]
        if not rk.open:
            raise ValueError(f"Simulation.feed: rank {rank}'s input was closed")
        rk.queue.append(event)
        self._lookahead.discard(rank)

    def feed_trace(self, trace: Trace) -> None:
        """Feed every event of a whole trace.

        When every rank would replay alike (the same events, only world collectives, the same
        plain compute speed), only rank 0 is replayed and the others mirror it: the same
        numbers, n times fewer events (an ``estimate`` of 64 nodes is one rank's work).
        """
        for rk in self.replayed_ranks(trace):
            rk.queue.extend(trace.events[rk.rank])

    def replayed_ranks(self, trace: Trace) -> list[RankState]:
        """The ranks whose events of ``trace`` are replayed: rank 0 alone where the others mirror it (their input
        is then closed), else every rank."""
        if trace.num_ranks != len(self._ranks):
            raise ScenarioError(
                f"simulate: the trace has {trace.num_ranks} ranks but the scenario was resolved for {len(self._ranks)}"
            )
        if self._mirrorable(trace):
            self._mirror = True
            for rk in self._ranks[1:]:
                rk.open = False
            return self._ranks[:1]
        return self._ranks

    def _mirrorable(self, trace: Trace) -> bool:
        """Whether every rank's replay is rank 0's: identical events and compute, and world collectives only."""
        cm, n = self._cm, len(self._ranks)
        if (n == 1 or any(rk.queue or not rk.open for rk in self._ranks) or not cm.plain or any(cm.windowed)
                or self._gates or any(cm.down) or cm.failures is not None):
            return False
        if len(set(cm.scale)) != 1:
            return False
        first = trace.events[0]
        if any(events is not first and events != first for events in trace.events[1:]):
            return False
        return all((e.group is None or len(set(e.group)) == n) and e.op not in P2P_OPS
                   for e in first if type(e) is Collective)

    def close(self, rank: int | None = None) -> None:
        """Declare that ``rank`` (default: every rank) will be fed nothing more."""
        for rk in self._ranks if rank is None else [self._ranks[rank]]:
            rk.open = False

    def watch(self, call: Callable[[], None], every: int) -> None:
        """Call ``call`` after every ``every`` instants of simulated time replayed (agenda slots), so a progress bar
        can look at the wall clock now and then and not on every event."""
        self._agenda.on_slots, self._agenda.every = call, every

    @property
    def replayed(self) -> int:
        """Events replayed so far (under mirroring, rank 0's: the ones the replay runs)."""
        return self._events

    @property
    def queued(self) -> int:
        """Events fed and not yet replayed: with ``replayed``, the whole of a trace once it is fed."""
        return sum(len(rk.queue) for rk in self._ranks)

    def run_until_blocked(self) -> float:
        """Replay as far as the input allows; returns the simulated seconds reached."""
        self._horizon = math.inf
        if self._stalled:
            self._resume_failures()
        for rk in self._ranks:
            self._advance(rk)
        self._agenda.run_before(lambda: self._horizon)  # a rank released and left without input lowers it
        return seconds(self._agenda.now)

    # ----------------------------------------------------------------- ranks
    def _advance(self, rk: RankState) -> None:
        """Run ``rk``'s queued events until it blocks or runs out of input."""
        q, r = rk.queue, rk.rank
        while rk.blocked is None and (q or rk.gate):
            if rk.gate and not self._open_gate(rk):
                break
            if not q:
                break
            e = q.popleft()
            kind = type(e)
            self._events += 1
            if kind is Compute:
                self._compute(rk, cast(Compute, e))
            elif kind is Collective:
                self._issue(rk, cast(Collective, e))
            elif kind is Step:
                self._step(rk)
            elif kind is Wait:
                self._wait(rk, cast(Wait, e).cid)
            elif kind is Discard:
                self._discard(rk)
            elif kind is AnyRecv:
                # a placeholder until a message is taken
                rk.blocked, rk.block_t = Instance(((r,), -1), "any", (r,)), rk.t
                self._agenda.at(rk.t, self._claim, rk, order=(CLAIM, r))
            else:
                raise TraceError(f"trace: rank {r}: unknown event {e!r}")
        if rk.blocked is None and rk.open and rk.t < self._horizon and rk.rank not in self._lookahead:
            self._horizon = rk.t

    def _compute(self, rk: RankState, e: Compute) -> None:
        """Move ``rk``'s cursor over a compute span: its work at its speed, through any outage or failure."""
        cm, r, start = self._cm, rk.rank, rk.t
        work = cm.work(r, rk.step, e)
        if cm.windowed[r]:
            _, pieces = cm.run(r, rk.step, seconds(start), work, rk.since_work if self._rewind else None)
            end = start
            for a, b, what in pieces:
                if what == FAILED:
                    rk.lost += rk.compute - rk.mark
                    rk.mark = rk.compute
                a_t, end = max(end, ticks(a)), max(end, ticks(b))
                self._spend(rk, a_t, end, IDLE if what else COMPUTE)
            rk.since_work += work
        else:
            end = start + round(work * SCALE)
            self._spend(rk, start, end, COMPUTE)
        rk.t = end
        rk.kept = None

    def _wait(self, rk: RankState, cid: int) -> None:
        """``rk`` waits for the async collective it issued as ``cid``."""
        c = rk.async_ops.get(cid)
        if c is None:
            raise TraceError(f"trace: rank {rk.rank} waits for collective id {cid}, which it never issued as async")
        self._block(rk, c)

    def _discard(self, rk: RankState) -> None:
        """``rk`` adopts others' state: a sync point whose work since the last is lost."""
        rk.lost += rk.compute - rk.mark
        rk.mark, rk.since_work = rk.compute, 0.0
        rk.unsynced, rk.trained[1] = False, 0
        if rk.kept is None and self.was_down(rk.rank, seconds(rk.synced), seconds(rk.t)):
            rk.kept = rk.synced  # a node that failed sits out: the run need not wait for it

    def _spend(self, rk: RankState, a: int, b: int, kind: int) -> None:
        """Account ticks [a, b) of ``rk``'s time to ``kind`` and add them to its timeline."""
        if b <= a:
            return
        if kind == COMPUTE:
            rk.compute += b - a
        elif kind == COMM:
            rk.comm += b - a
        else:
            rk.idle += b - a
        kinds, times = rk.kinds, rk.times
        if kinds and kinds[-1] == kind and rk.span_end == a:
            times[-1] = b * TICK
        else:
            times.append(a * TICK)
            times.append(b * TICK)
            kinds.append(kind)
        rk.span_end = b

    def _step(self, rk: RankState) -> None:
        i, ends, t = rk.step, self._step_ends, kept(rk)  # a step it threw away ends the run's step no later
        if i < len(ends):
            ends[i] = max(ends[i], t)
        else:
            ends.append(t)
        rk.step = i + 1
        rk.step_ends.append(rk.t)
        trained = rk.trained
        if rk.compute > trained[2]:  # a step that computed (one sat out records none); kept once it syncs
            trained[1] += 1
            trained[2] = rk.compute
        if self._gates and rk.step in self._cm.gated_steps[rk.rank]:
            rk.gate = True

    def _group(self, rank: int, group: tuple[int, ...] | None) -> tuple[int, ...]:
        """The sorted members of ``group`` (None = every rank); the same tuple for every spelling of a group."""
        members = self._members.get(group)
        if members is self._everyone:
            return members
        if members is None:
            assert group is not None  # None, every rank, is always known
            members = tuple(sorted(set(group)))
            bad = [r for r in members if not 0 <= r < len(self._ranks)]
            if bad:
                raise TraceError(f"trace: rank {rank} issued a collective on group {list(group)}, "
                                 f"but rank {bad[0]} is not among the {len(self._ranks)} nodes")
            if len(members) == len(self._ranks):
                members = self._everyone
            self._members[group] = members
        if rank not in members:
            raise TraceError(f"trace: rank {rank} issued a collective on group {list(group or ())}, which it is not in")
        return members

    def _channel(self, rk: RankState, e: Collective) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
        """Where the message ``e`` queues and matches, its op and its members.

        (A collective queues on its group.) A message from a to b is op "p2p" with members
        (a, b), on channel (a, b, −1): never a group's name, so messages keep their own order.
        """
        members = self._group(rk.rank, e.group)
        if len(members) != 2:
            raise TraceError(f"trace: rank {rk.rank}'s {e.op} must name the pair (sender, receiver) as its group, "
                             f"got {list(members)}")
        peer = members[0] if members[1] == rk.rank else members[1]
        pair = (rk.rank, peer) if e.op == "send" else (peer, rk.rank)
        return (*pair, -1), "p2p", pair

    def _issue(self, rk: RankState, e: Collective) -> None:
        """``rk`` arrives at a collective; the last member to arrive queues it on its group."""
        if e.op in P2P_OPS:
            queue, op, members = self._channel(rk, e)
        else:
            queue = members = self._group(rk.rank, e.group)
            op = e.op
        k = rk.counts.get(queue, 0)
        rk.counts[queue] = k + 1
        key = (queue, k)
        c = self._open.get(key)
        if c is None:
            if key in self._late:  # an elastic collective went on without it
                return self._issue_late(rk, e, key)
            c = self._open[key] = Instance(key, op, members)
        elif c.op != op:
            raise TraceError(
                f"trace: collective #{k} on group {list(members) if members is not self._everyone else 'all ranks'} "
                f"is {c.op} on rank {c.ranks[0]} but {e.op} on rank {rk.rank}"
            )
        if self._mirror:
            c.ranks = list(members)
        else:
            c.ranks.append(rk.rank)
            c.arrivals.append(rk.t)
        c.nbytes = max(c.nbytes, e.nbytes)
        if e.op != "recv":  # a message starts with its sender alone
            c.last = max(c.last, rk.t)
        if e.async_op:
            rk.async_ops[e.cid] = c
            c.async_op = True
        else:
            self._block(rk, c)
        if op == "p2p":
            if e.op == "recv" and c.done:
                self._inbox[rk.rank].remove(c)
            if len(c.ranks) == 2:
                del self._open[key]
            self._post(rk, c, e.op)
        elif len(c.ranks) == len(members):
            del self._open[key]
            if not self._rewind:
                self._went_on(c)
            self._queue_start(c)
        elif not self._rewind:
            self._go_on(c, c.last)

    def _queue_start(self, c: Instance) -> None:
        """Start ``c`` at its last arrival, or queue it behind the collectives running on its group."""
        queue, k = c.key
        running = self._running.get(queue, 0)
        if running < self._concurrency:
            self._running[queue] = running + 1
            self._agenda.at(c.last, self._start, c, order=(START, queue, k))
        else:
            self._queued.setdefault(queue, deque()).append(c)

    def _block(self, rk: RankState, c: Instance) -> None:
        rk.blocked = c
        rk.block_t = rk.t
        if rk.rank in c.dropped:  # an elastic collective went on without it
            self._leave(rk, c, rk.t)
        elif c.done or (c.sent >= 0 and rk.rank == c.members[0]):
            self._release(rk, c)
        else:
            c.waiters.append(rk)

    def _release(self, rk: RankState, c: Instance) -> None:
        """``rk`` was blocked on ``c``, which has ended (for a gloo message's sender: whose bytes have left): idle
        until it started, then exposed comm."""
        tb = rk.block_t
        end = max(c.sent if c.sent >= 0 and rk.rank == c.members[0] else c.end, tb)
        start = min(max(c.start - c.setup, tb), end)
        self._spend_waiting(rk, c, tb, start)
        self._spend_comm(rk, c, start, end)
        rk.t = end
        rk.kept = None
        rk.blocked = None
        if not rk.unsynced:  # (elastic: when the data came, which a wait after a failure must not move past it)
            rk.synced = end if self._rewind else c.end
            rk.since_work, rk.mark = 0.0, rk.compute
            rk.trained[0] += rk.trained[1]
            rk.trained[1] = 0

    # ------------------------------------------------------------ collectives
    def _start(self, t: int, c: Instance) -> None:
        if not self._rewind and c.op != "p2p":
            self._go_without(t, c, self._down_now(t, c))
        up = self._cm.up_time(c.members, seconds(t))
        if up > seconds(t):
            self._agenda.at(max(t + 1, ticks(up)), self._start, c, order=(START, *c.key))
            return
        group = tuple(sorted(c.members))
        if self.resolved.setup > 0 and len(group) > 1 and group not in self._set_up:  # a group of one connects nothing
            self._set_up.add(group)
            c.setup = ticks(self.resolved.setup)
            self._agenda.at(t + c.setup, self._start, c, order=(START, *c.key))
            return
        c.start = t
        plan = c.plan = self._planner.plan(c.op, c.members, c.nbytes, self._halved(t, c.members))
        self._carry(plan)
        if not plan.phases:
            self._end(t, c)
        elif self._fast and self._handover.lone is None and not self._active:
            self._handover.lone = c
            end = t + ticks(self._planner.duration(plan))
            self._agenda.at(end, self._lone_end, c, c.token)
            self._sending_until(c, end)
        else:
            if self._handover.lone is not None:
                if self._calm:  # it goes on timed as alone, sharing only what its windows must (see _begin_phase)
                    self._rest(self._handover.lone, self._handover.lone.start, 0)
                else:
                    self._take_over(t, self._handover.lone)
            self._active[c] = None
            self._begin_phase(t, c, 0)

    def _carry(self, plan: Plan) -> None:
        """A collective starts on ``plan``: its members' wire bytes and the links' loads count it."""
        wire = self._wire
        for r, sent in plan.sent:
            wire[r] += sent
        self._carried[plan] = self._carried.get(plan, 0) + 1

    def _add_busy(self, busy: np.ndarray) -> None:
        """Add the links' busy seconds of a fast-path part of a collective."""
        self._busy += busy

    @property
    def lossy(self) -> bool:
        """Whether a phase so far lost packets to an overflowing queue (the range's stochastic term applies)."""
        return self._topo.lossy

    def _halved(self, t: int, members: tuple[int, ...]) -> int:
        """How cold a group's connections are at tick ``t`` (``tcp.halvings``): 0 unless the scenario restarts slow
        start after idle; a group's first collective opens new connections."""
        if not self.resolved.slow_start or len(members) < 2:
            return 0
        last = self._group_end.get(members)
        if last is None:
            return tcp.NEW
        rto = self._rtos.get(members)
        if rto is None:  # the slowest pair's: regions and hosts give at most a few distinct latencies
            rto = self._rtos[members] = tcp.rto(max(self._topo.rtt(members[0], b) for b in members[1:])
                                                if self._topo.hosts is None and not self.resolved.links
                                                else 2.0 * self.resolved.max_latency(members))
        return tcp.halvings(seconds(t - last), rto)

    def _end(self, t: int, c: Instance) -> None:
        if self._rendezvous and c.op == "p2p" and c.sent < 0:  # (a message of no bytes is sent as it ends)
            self._sent(t, c)
        c.end = t
        c.done = True
        self._ended.append(c)
        self._last_end = max(self._last_end, t)
        self._group_end[c.members] = t
        queued = self._queued.get(c.key[0])
        if queued:
            nxt = queued.popleft()
            self._agenda.at(max(t, nxt.last), self._start, nxt, order=(START, *nxt.key))
        else:
            self._running[c.key[0]] -= 1
        if c.op == "p2p" and c.members[1] not in c.ranks:  # delivered before its recv: the receiver buffers it
            receiver = c.members[1]
            self._inbox.setdefault(receiver, []).append(c)
            waiting = self._any.pop(receiver, None)
            if waiting is not None:
                self._agenda.at(t, self._claim, waiting, order=(CLAIM, receiver))
        waiters, c.waiters = c.waiters, []
        for rk in waiters:
            self._release(rk, c)
        for rk in waiters:
            self._advance(rk)
