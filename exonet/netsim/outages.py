"""Outages on the replay's agenda: ``down`` windows, and failures drawn as the replay goes.

Mixed into ``Simulation`` (exonet.netsim.engine). Each failure puts the next on the agenda
while anything can still move, so a replay fed at once and one fed step by step see the same
outages (the failure process: exonet.netsim.failures; what a failure costs: exonet.netsim.compute).

A blocking run's collective waits for a member that is down. An elastic run's (``rewind=False``)
goes on without it, as torchft's quorum does: a collective that finds members down when it
starts runs on the others, and one in flight when a member fails is aborted and starts again,
at once, on the members still up. The time its members spent in the aborted attempt is lost work
(``RankState.aborted``, reported in ``SimResult.lost["lost_work"]``); its bytes stay counted. A
member left out goes on from the collective at once (down, its compute paused) but stays
unsynced: its next sync does not count as one, so the next elastic round finds it failed, it
discards its work and receives the state.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from operator import itemgetter

from exonet.netsim.agenda import OUTAGE, START, seconds, ticks
from exonet.netsim.simstate import SimState
from exonet.netsim.spans import COMM, IDLE
from exonet.netsim.state import Instance, RankState
from exonet.trace import Collective


class Outages(SimState):
    """Putting ranks down and up: scheduled windows and the failure process."""

    def _schedule_outage(self, rank: int, t0: int, t1: int) -> None:
        """Take ``rank`` down over ticks [t0, t1) (ticks: an outage starting at a rank's cursor, which may be
        now, must not round to before it)."""
        self._agenda.at(t0, self._outage, rank, True, order=(OUTAGE, rank))
        self._agenda.at(t1, self._outage, rank, False, order=(OUTAGE, rank))

    def _open_gate(self, rk: RankState) -> bool:
        """Start the outages by step that begin at ``rk``'s current step, once their length is known."""
        lengths = self._cm.outages_at(rk.rank, rk.step, rk.queue, complete=not rk.open)
        if lengths is None:
            return False
        rk.gate = False
        t0 = seconds(rk.t)
        for length in lengths:
            if length > 0:
                self._cm.add_down(rk.rank, t0, t0 + length)
                self._schedule_outage(rk.rank, rk.t, rk.t + ticks(length))
        return True

    def _members_down(self, c: Instance, end: int) -> list[tuple[float, float]]:
        """The outages of ``c``'s members up to tick ``end``, as disjoint sorted tick intervals (their union): while
        one is down, the others wait for it (idle), whether the outage began before the collective or inside it."""
        if c.down is None:  # only outages that end after the earliest tick booked here: [c.start - c.setup, end)
            lo, ticked = seconds(min(c.start - c.setup, end)), []
            for r in c.members:
                self._cm.failures_through(r, seconds(end))
                ticked += [(ticks(t0), ticks(t1)) for t0, t1 in self._cm.outages_between(r, lo, math.inf)]
            union: list[tuple[float, float]] = []
            for a, b in sorted(ticked):
                if union and a <= union[-1][1]:
                    union[-1] = (union[-1][0], max(union[-1][1], b))
                elif b > a:
                    union.append((a, b))
            c.down = union
        return c.down

    def _spend_comm(self, rk: RankState, c: Instance, start: int, end: int) -> None:
        """Book ``rk``'s ticks [start, end) in the collective ``c``: comm, but idle while a member is down."""
        union = self._members_down(c, end)
        cursor = start
        for i in range(bisect_right(union, start, key=itemgetter(1)), len(union)):
            a, b = union[i]
            if a >= end:
                break  # (sorted: the rest begin later still)
            lo, hi = max(int(a), cursor), min(int(b), end)
            if hi > lo:
                self._spend(rk, cursor, lo, COMM)
                self._spend(rk, lo, hi, IDLE)
                cursor = hi
        self._spend(rk, cursor, end, COMM)

    def _schedule_failure(self, rank: int, k: int) -> None:
        """Put ``rank``'s k-th failure on the agenda (drawn now if need be): its start (not before now), its end."""
        process = self._cm.process(rank)
        assert process is not None  # only a rank that fails has failures scheduled
        t0, t1 = process.outage(k)
        self._cm.failures_through(rank, t0)
        self._failing += 2
        self._agenda.at(max(ticks(t0), self._agenda.now), self._fail, rank, k, order=(OUTAGE, rank))
        self._agenda.at(ticks(t1), self._recover, rank, order=(OUTAGE, rank))

    def _fail(self, t: int, rank: int, k: int) -> None:
        """``rank``'s k-th failure strikes; its next one goes on the agenda while the run may go on."""
        self._failing -= 1
        self._outage(t, rank, True)
        # (paused flows schedule nothing)
        live = self._agenda.pending > self._failing or self._active or self._handover.lone is not None
        if live or any(rk.open and rk.blocked is None for rk in self._ranks):
            self._schedule_failure(rank, k + 1)
        else:  # nothing can move until more input comes: the chain waits for it (run_until_blocked resumes it)
            self._stalled[rank] = k + 1

    def _resume_failures(self) -> None:
        """Put each stalled rank's next failure that has not ended yet back on the agenda."""
        now = seconds(self._agenda.now)
        for rank, k in self._stalled.items():
            process = self._cm.process(rank)
            assert process is not None  # a stalled rank is one whose failures were scheduled
            while process.outage(k)[1] <= now:
                k += 1
            self._schedule_failure(rank, k)
        self._stalled.clear()

    def _recover(self, t: int, rank: int) -> None:
        self._failing -= 1
        self._outage(t, rank, False)

    def _outage(self, t: int, rank: int, down: bool) -> None:
        """``rank`` goes down (its flows stop) or comes back."""
        if down and not self._rewind:
            for c in [c for c in (self._handover.lone, *self._active) if c is not None and rank in c.members]:
                self._abort(t, c, rank)
            for c in [c for c in self._open.values() if rank in c.members and c.last <= t]:
                self._go_on(c, t)
        lone = self._handover.lone
        if down and lone is not None and rank in lone.members:
            self._take_over(t, lone)
        self._drain(t)
        self._net.pause(rank, down)
        self._net_changed(t)

    # ----------------------------------------------------------------- elastic collectives
    def _down_now(self, t: int, c: Instance) -> set[int]:
        """The members of ``c`` that are down at tick ``t``."""
        now = seconds(t)
        return {r for r in c.members if self.down_at(r, now)}

    def _go_on(self, c: Instance, t: int) -> None:
        """Start the elastic collective ``c`` at tick ``t`` (its members that issued it have all arrived) without
        its members yet to issue it, if they are all down then; they go on from it when they issue it."""
        missing = set(c.members) - set(c.ranks)
        if c.op == "p2p" or not c.ranks or missing != {r for r in missing if self.down_at(r, seconds(t))}:
            return
        del self._open[c.key]
        self._late[c.key] = (c, missing)
        c.members = tuple(sorted(c.ranks))
        self._drop(c, missing)
        c.last = t
        self._queue_start(c)

    def _went_on(self, c: Instance) -> None:
        """Every member has issued the elastic collective ``c``: leave out the latest arrivals if, once the others
        had all arrived, they were all down before arriving (whatever order the replay read them in)."""
        if c.op == "p2p" or len(c.arrivals) < 2:  # (a mirrored replay records no arrivals: nobody fails in it)
            return
        order = sorted(zip(c.arrivals, c.ranks))
        if not self.was_down(order[-1][1], seconds(order[0][0]), seconds(order[-1][0])):
            return  # the last to arrive, missing from every prefix, was up all along: nobody is left out
        for i in range(1, len(order)):
            lo, hi = order[i - 1][0], order[i][0]
            missing = {r for _, r in order[i:]}
            at = self._all_down(missing, lo, hi) if hi > lo else None
            if at is not None:
                c.last = at
                self._go_without(at, c, missing)
                return

    def _all_down(self, ranks: set[int], lo: int, hi: int) -> int | None:
        """The first tick in [lo, hi) at which every one of ``ranks`` is down, or None."""
        for r in ranks:
            self._cm.failures_through(r, seconds(hi))
        a, b = seconds(lo), seconds(hi)
        starts = sorted({lo} | {ticks(t0) for r in ranks for t0, _ in self._cm.outages_between(r, a, b)
                                if lo < ticks(t0) < hi})
        return next((t for t in starts if all(self.down_at(r, seconds(t)) for r in ranks)), None)

    def _issue_late(self, rk: RankState, e: Collective, key: tuple) -> None:
        """``rk`` issues an elastic collective that started without it: it goes on from it (when it waits)."""
        c, missing = self._late[key]
        missing.discard(rk.rank)
        if not missing:
            del self._late[key]
        if e.async_op:
            rk.async_ops[e.cid] = c
        else:
            self._block(rk, c)

    def _abort(self, t: int, c: Instance, rank: int) -> None:
        """``rank`` failed inside the elastic collective ``c``: stop it and start it again on the others."""
        plan = c.plan
        if c.op == "p2p" or plan is None or c.done:
            return
        down = self._down_now(t, c) | {rank}
        if len(down) == len(c.members):
            return  # nobody to go on with: it waits for them, as a blocking collective does
        if self._handover.lone is c or c in self._handover.resting:  # its fast-path part so far kept its links busy
            origin, first, _ = self._handover.resting.get(c) or (c.start, 0, None)
            assert plan.offsets is not None  # timed when it went on the fast path
            if origin + ticks(plan.offsets[-1]) <= t:
                return  # it ends now: its end event is due at this very time
            self._handover.resting.pop(c, None)
            self._add_busy(self._planner.busy(plan, max(seconds(t - origin), plan.offsets[first]))
                           - self._planner.busy(plan, plan.offsets[first]))
            if self._handover.lone is c:
                self._handover.lone = None
        else:
            self._drain(t)
            self._net.remove(c)
            self._net_changed(t)
        self._active.pop(c, None)
        c.token += 1  # its pending ends and deliveries lapse
        if c.began < 0:
            c.began = c.start - c.setup
        c.setup = 0
        self._go_without(t, c, down)
        self._agenda.at(t, self._start, c, order=(START, *c.key))

    def _go_without(self, t: int, c: Instance, down: set[int]) -> None:
        """Leave the ``down`` members out of ``c`` (unless that is all of them); those blocked in it go on."""
        if not down or len(down) == len(c.members):
            return
        c.members = tuple(r for r in c.members if r not in down)
        kept = [(r, a) for r, a in zip(c.ranks, c.arrivals) if r not in down]
        c.ranks, c.arrivals = [r for r, _ in kept], [a for _, a in kept]
        self._drop(c, down)
        left = [rk for rk in c.waiters if rk.rank in down]
        c.waiters = [rk for rk in c.waiters if rk.rank not in down]
        for rk in left:
            self._leave(rk, c, t)
        for rk in left:
            self._advance(rk)

    def _drop(self, c: Instance, ranks: set[int]) -> None:
        """``c`` goes on without ``ranks``: none of them syncs again until it discards its work."""
        c.dropped = c.dropped | ranks
        for r in ranks:
            self._ranks[r].unsynced = True

    def _leave(self, rk: RankState, c: Instance, t: int) -> None:
        """``rk``, blocked in ``c`` since ``rk.block_t``, goes on without it at tick ``t`` (>= its cursor)."""
        t = max(t, rk.t)
        self._spend_waiting(rk, c, rk.block_t, t)
        rk.t = t
        rk.blocked = None
        rk.unsynced = True

    def _spend_waiting(self, rk: RankState, c: Instance, a: int, b: int) -> None:
        """Book ``rk``'s ticks [a, b) before ``c``'s (latest) start: idle, except its time in aborted attempts."""
        began = c.began if c.began >= 0 else b
        cut = min(max(began, a), b)
        self._spend(rk, a, cut, IDLE)
        self._spend(rk, cut, b, COMM)
        rk.aborted += b - cut
