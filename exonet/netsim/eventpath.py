"""Event path: a collective's phases as flows on the shared fluid network, one event per change.

Mixed into ``Simulation`` (exonet.netsim.engine). A collective that is not on the fast path
(exonet.netsim.handover) runs phase by phase: each phase's messages are put on the
``FluidNetwork`` as one batch of flows (``_begin_phase``), the network drains at its current
rates up to each event (``_drain``), and after every change (flows added, paused, drained) the
finished flows are delivered a latency later, one event per distinct tick, and the next finish
is put on the agenda (``_net_changed``). A collective whose phase has all its messages delivered
begins the next phase or ends (``_phase_done``). At a phase boundary a collective may instead go
back to the fast path (rest) while nothing shares its links; the rules are in handover.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

from exonet.netsim.agenda import seconds, ticks
from exonet.netsim.simstate import SimState
from exonet.netsim.state import Instance


class EventPath(SimState):
    """Phases on the fluid network: begin, drain, deliver, and the next phase."""

    def _begin_phase(self, t: int, c: Instance, p: int) -> None:
        """Put phase ``p`` of ``c`` on the network, or hand ``c`` back to the fast path while nothing shares its links.

        A collective handed back (resting) is timed as if alone from this phase on, which is
        exact while no flow of another collective shares a link with it: no flow in transit
        crosses its links, and each other resting collective that does has its bytes on the
        wire at other times (``Planner.windows``). Where two resting collectives' windows first
        overlap, both are taken over (``_split``). A phase that cannot rest is put on the
        network only after taking every resting collective it touches over.
        """
        plan = c.plan
        assert plan is not None
        c.phase = p
        # one taken over in its previous phase stays on the event path for this one: it is likely locked in
        # step with another collective, and resting would only be taken over again
        handover = self._handover
        if self._fast and self._calm and t != handover.taken_at and handover.lone is None and c.taken != p - 1:
            links = self._topo.reach(plan.phases)
            if links.isdisjoint(self._net.busy()):
                self._planner.duration(plan)
                assert plan.offsets is not None
                origin = t - ticks(plan.offsets[p])
                splits = self._overlaps(t, c, origin, p, links)
                if splits is not None:
                    self._rest(c, origin, p)
                    for at, other in splits:
                        self._agenda.at(at, self._split, c, c.token, other, other.token)
                    return
        batch = self._topo.batch(plan.phases[p], c)
        if self._handover.lone is not None:
            self._take_over(t, self._handover.lone, settle=False)
        self._take_over_touching(t, batch.shape.reach)  # first: under FIFO the earlier messages go first
        c.pending = len(batch)
        self._drain(t)
        self._net.add(batch)
        self._net_changed(t)

    def _drain(self, t: int) -> None:
        """Let the flows in transit drain at their current rates up to tick ``t``.

        An empty network's clock restarts at ``t``: nothing drained meanwhile, so what follows does not depend on
        how long it sat idle (the rounding tolerance of its next update is that of a fresh clock), and a replay
        is the same shifted in time (exonet.netsim.memo relies on it)."""
        if not self._net.batches:
            self._net_epoch = t
            self._net.rebase()
        self._net.advance(seconds(t - self._net_epoch))

    def _net_changed(self, t: int) -> None:
        """After flows were added, paused or drained to ``t``: deliver finished ones, reschedule the next."""
        net = self._net
        done = net.update()
        if done:
            # the network's batches are the collectives' (tagged with their Instance)
            self._deliver_later((t + ticks(latency), cast(Instance, b.tag), k)
                                for b, rows in done for latency, k in b.arrivals(rows))
            if self._rendezvous:  # a gloo message's sender is done when its bytes have left (Engine._sending_until)
                for b, _ in done:
                    c = cast(Instance, b.tag)
                    if c.op == "p2p" and c.plan is not None and c.phase == len(c.plan.phases) - 1:
                        self._sent(t, c)
        net.rebase()
        self._net_epoch = t
        self._net_token += 1
        nxt = net.next_finish()
        if nxt < math.inf:
            self._agenda.at(t + max(1, ticks(nxt)), self._flows_due, self._net_token)

    def _deliver_later(self, timed: Iterable[tuple[int, Instance, int]]) -> None:
        """Deliver (tick, collective, how many messages) at each tick, one event per distinct tick."""
        by_time: dict[int, list[tuple[Instance, int, int]]] = {}
        for at, c, k in timed:
            by_time.setdefault(at, []).append((c, k, c.token))  # an abort changes the token: its deliveries lapse
        for at, batch in by_time.items():
            self._agenda.at(at, self._deliver, batch)

    def _flows_due(self, t: int, token: int) -> None:
        if token == self._net_token:
            self._drain(t)
            self._net_changed(t)

    def _deliver(self, t: int, arrivals: list[tuple[Instance, int, int]]) -> None:
        for c, k, token in arrivals:
            if c.token != token:
                continue
            c.pending -= k
            if c.pending == 0:
                self._phase_done(t, c)

    def _phase_done(self, t: int, c: Instance) -> None:
        assert c.plan is not None
        if c.phase + 1 < len(c.plan.phases):
            self._begin_phase(t, c, c.phase + 1)
        else:
            del self._active[c]
            self._end(t, c)
