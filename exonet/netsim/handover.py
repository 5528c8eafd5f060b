"""Handover: how a collective moves between the fast path and the event path.

Mixed into ``Simulation`` (exonet.netsim.engine). A collective on the fast path is timed as if
alone, one event for all its remaining phases: from its start while the network is idle (the
*lone* collective), or from a phase boundary at which no flow in transit crosses its links (a
*resting* one). It is taken over (``_take_over``) onto the event path, mid-phase if need be, as
soon as something could share a link's rate with it. Under max-min sharing that is judged in
time as well as in space: a phase has its bytes on the wire only until its last byte leaves
(``Planner.windows``), so collectives on shared links rest together while their transmit windows
are apart. Where two resting collectives' windows first meet, both are taken over (``_split``);
where event-path flows are put on a resting collective's links, it is taken over if it transmits
then and guarded otherwise (``_guard``: taken over at its next window if flows still cross its
links). Under FIFO sharing resting collectives never share a link, since the order in which
messages entered the links decides who goes first and a take-over would change it.
"""

from __future__ import annotations

import numpy as np

from exonet.netsim.agenda import seconds, ticks
from exonet.netsim.simstate import SimState
from exonet.netsim.state import Instance

# Seconds by which two resting collectives' transmit windows are taken to overlap early (rounding of their offsets)
_OVERLAP_MARGIN = 1e-9


class Handover(SimState):
    """Lone and resting collectives, and taking them over onto the event path."""

    def _lone_end(self, t: int, c: Instance, token: int) -> None:
        if c.token != token:
            return
        if self._handover.lone is c:
            self._handover.lone = None
        assert c.plan is not None  # planned when it started
        self._alone[c.plan] = self._alone.get(c.plan, 0) + 1
        self._end(t, c)

    def _take_over(self, t: int, c: Instance, settle: bool = True) -> None:
        """Move the fast-path collective ``c`` onto the event path at tick ``t``, mid-phase if need be.

        ``settle=False`` leaves updating the network to the caller, who adds flows at this tick too.
        """
        if self._handover.lone is c:
            self._handover.lone = None
        self._handover.taken_at = t
        plan = c.plan
        assert plan is not None and plan.offsets is not None
        origin, first, _ = self._handover.resting.get(c) or (c.start, 0, None)
        if origin + ticks(plan.offsets[-1]) <= t:
            return  # it ends now: its end event is due at this very time and it has no flows left
        self._handover.resting.pop(c, None)
        c.token += 1
        tau = max(seconds(t - origin), plan.offsets[first])
        self._add_busy(self._planner.busy(plan, tau) - self._planner.busy(plan, plan.offsets[first]))
        p, p_start, done, rest = self._planner.state_at(plan, tau, c)
        c.phase = c.taken = p
        c.pending = len(plan.phases[p])
        later: list[tuple[int, Instance, int]] = []
        for batch, rows, at in done:
            for latency, k in batch.arrivals(rows):
                arrive = origin + ticks(p_start + at + latency)
                if arrive <= t:
                    c.pending -= k
                else:
                    later.append((arrive, c, k))
        self._active[c] = None
        self._deliver_later(later)
        if rest:
            self._drain(t)
            for batch in rest:
                self._net.add(batch)
            # resting collectives may share its links (their windows only were apart): they join the event path too
            self._take_over_touching(t, frozenset().union(*(batch.shape.reach for batch in rest)))
            if settle:
                self._net_changed(t)
        if c.pending == 0:
            self._phase_done(t, c)

    def _take_over_touching(self, t: int, links: frozenset[int]) -> None:
        """Flows were put on ``links``: take over the resting collectives on them that transmit now, and guard
        the next window of those that do not (the caller settles the network)."""
        for other in [r for r, (_, _, reach) in self._handover.resting.items() if not reach.isdisjoint(links)]:
            if other not in self._handover.resting:  # already taken over through another
                continue
            if not self._handover.windowed:
                self._take_over(t, other, settle=False)
                continue
            origin = self._handover.resting[other][0]
            assert other.plan is not None
            starts, ends = self._planner.windows(other.plan)
            tau = seconds(t - origin)
            i = int(np.searchsorted(ends, tau - _OVERLAP_MARGIN, side="right"))
            if i == len(ends):
                continue  # its bytes have all left: only propagation is left
            if starts[i] - _OVERLAP_MARGIN <= tau:
                self._take_over(t, other, settle=False)
            else:
                self._agenda.at(origin + ticks(starts[i] - _OVERLAP_MARGIN), self._guard, other, other.token)

    def _guard(self, t: int, c: Instance, token: int) -> None:
        """The resting ``c`` is about to transmit: it joins the event path if flows in transit share its links."""
        resting = self._handover.resting
        if c.token == token and c in resting and not resting[c][2].isdisjoint(self._net.busy()):
            self._take_over(t, c, settle=False)
            self._drain(t)
            self._net_changed(t)

    def _rest(self, c: Instance, origin: int, p: int) -> None:
        """Time ``c`` as if alone from its phase ``p`` on, its phase 0 counted from tick ``origin``."""
        plan = c.plan
        assert plan is not None and plan.offsets is not None
        if self._handover.lone is c:
            self._handover.lone = None
            c.token += 1  # its end comes from the rest's event now
        self._active[c] = None
        self._handover.resting[c] = (origin, p, self._topo.reach(plan.phases))
        self._agenda.at(origin + ticks(plan.offsets[-1]), self._rest_end, c, c.token)
        self._sending_until(c, origin + ticks(plan.offsets[-1]))

    def _overlaps(self, t: int, c: Instance, origin: int, p: int,
                  links: frozenset[int]) -> list[tuple[int, Instance]] | None:
        """Where ``c``, resting from phase ``p`` at tick ``t``, would first transmit at once with each resting
        collective that shares its links: (tick, that collective) for those that ever do; None if one does now.

        Windows are compared in seconds from ``t``, and an overlap is taken ``_OVERLAP_MARGIN`` early:
        taking two collectives over early is exact (the event path is the reference), late would not be.
        """
        plan = c.plan
        assert plan is not None
        starts, ends = self._planner.windows(plan)
        shift = seconds(origin - t)
        mine_s, mine_e = starts[p:] + shift, ends[p:] + shift
        splits = []
        for other, (o_origin, _, reach) in self._handover.resting.items():
            if reach.isdisjoint(links):
                continue
            if not self._handover.windowed:
                return None
            assert other.plan is not None
            o_starts, o_ends = self._planner.windows(other.plan)
            o_shift = seconds(o_origin - t)
            j = np.searchsorted(o_ends + o_shift, mine_s - _OVERLAP_MARGIN, side="right")
            inside = j < len(o_ends)
            j = np.minimum(j, len(o_ends) - 1)
            hit = inside & (o_starts[j] + o_shift < mine_e + _OVERLAP_MARGIN)
            if not hit.any():
                continue
            i = int(np.argmax(hit))
            at = max(float(mine_s[i]), float(o_starts[j[i]] + o_shift)) - _OVERLAP_MARGIN
            if at <= 0.0:
                return None
            splits.append((t + ticks(at), other))
        return splits

    def _split(self, t: int, c: Instance, token: int, other: Instance, other_token: int) -> None:
        """Two resting collectives are about to transmit at once: both go on the event path."""
        resting = self._handover.resting
        if c.token == token and other.token == other_token and c in resting and other in resting:
            self._take_over(t, c, settle=False)
            if other in self._handover.resting:
                self._take_over(t, other, settle=False)
            self._drain(t)
            self._net_changed(t)

    def _rest_end(self, t: int, c: Instance, token: int) -> None:
        if c.token == token:
            plan, first = c.plan, self._handover.resting[c][1]
            assert plan is not None and plan.offsets is not None  # timed when it came to rest
            self._add_busy(self._planner.busy(plan) - self._planner.busy(plan, plan.offsets[first]))
            del self._handover.resting[c], self._active[c]
            self._end(t, c)
