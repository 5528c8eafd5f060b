"""What the online clock asks of a replay in progress: times, outages, messages, and running past askers.

Mixed into ``Simulation`` (exonet.netsim.engine), whose state these read; kept apart because
they are the replay's answers to the outside, not the way it advances.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from exonet.netsim.agenda import seconds
from exonet.netsim.simstate import SimState
from exonet.trace import P2P_OPS


class ClockQueries(SimState):
    """The questions ``exonet.runtime.clock.SimClock`` puts to a ``Simulation`` while it is fed."""

    @property
    def now(self) -> float:
        """Simulated seconds up to which the network has been replayed."""
        return seconds(self._agenda.now)

    def rank_time(self, rank: int) -> float:
        """Simulated seconds ``rank`` has reached in its own events."""
        return seconds(self._ranks[rank].t)

    def rank_steps(self, rank: int) -> tuple[int, float]:
        """How many steps ``rank`` has ended in the replay, and when (simulated seconds) the latest ended."""
        rk = self._ranks[rank]
        return rk.step, seconds(rk.step_ends[-1]) if rk.step_ends else 0.0

    def rank_step_ends(self, rank: int) -> list[float]:
        """Simulated seconds at which each of ``rank``'s steps ended (so far)."""
        return [seconds(t) for t in self._ranks[rank].step_ends]

    def settled(self, rank: int) -> tuple[float, float] | None:
        """``rank``'s time and the end of its latest blocking call (seconds), once it has replayed all its input."""
        rk = self._ranks[rank]
        if rk.blocked is not None or rk.queue or rk.gate:
            return None
        return seconds(rk.t), seconds(rk.synced)

    def idle_duration(self, op: str, group: Sequence[int] | None, nbytes: int) -> float:
        """Simulated seconds ``op`` of ``nbytes`` on ``group`` (None: every rank) takes on an otherwise idle network.

        ``op`` is a collective's name or "send"/"recv" (a message; ``group`` is the pair).
        """
        if op in P2P_OPS:
            members, op = tuple(group or ()), "p2p"  # (sender, receiver)
        else:
            members = self._everyone if group is None else tuple(sorted(set(group)))
        plan = self._planner.plan(op, members, nbytes)
        return self._planner.duration(plan) if plan.phases else 0.0

    def down_at(self, rank: int, t: float) -> bool:
        """Whether ``rank`` is down (failed, or a ``down`` event) at ``t`` seconds."""
        return self._cm.down_at(rank, t)

    def was_down(self, rank: int, a: float, b: float) -> bool:
        """Whether ``rank`` was down (failed, or a ``down`` event) at any time in (a, b) seconds."""
        self._cm.failures_through(rank, b)
        return bool(self._cm.outages_between(rank, a, b))

    def is_open(self, rank: int) -> bool:
        """Whether ``rank`` may still be fed."""
        return self._ranks[rank].open

    def received(self, rank: int) -> list[tuple[int, float]]:
        """(sender, arrival seconds) of each message ``rank``'s any-source receives have taken, in order."""
        return self._received.get(rank, [])

    def waits_for_any(self, rank: int) -> bool:
        """Whether ``rank`` is in an any-source receive that no delivered message can satisfy yet."""
        return rank in self._any

    def may_receive(self, rank: int) -> bool:
        """Whether a message to ``rank`` may still arrive: one is sent and unreceived, or another rank may send."""
        if any(c.op == "p2p" and c.members[1] == rank for c in self._open.values()):
            return True
        return any(rk.open or rk.queue or rk.blocked is not None for rk in self._ranks if rk.rank != rank)

    def cancel_any(self, rank: int) -> None:
        """End ``rank``'s any-source receive without a message (nothing can arrive any more); it goes on."""
        rk = self._any.pop(rank)
        rk.blocked = None
        self._advance(rk)

    def step_end(self, step: int) -> float | None:
        """Simulated end of ``step`` (its slowest rank's time) once every rank has finished it, else None."""
        if min(rk.step for rk in self._ranks) <= step:
            return None
        return seconds(self._step_ends[step])

    def overrun(self, ranks: Iterable[int]) -> bool:
        """Run the next due instant even if it lies past ``ranks``, which wait for input; False if none is due.

        Until ``hold`` (or until fed), those ranks do not hold the clock back.

        For an answer that needs the others to go on first (an elastic round whose end waits for a
        rank still inside the previous round's collective, while a rank that already asked holds the
        clock at its own time): the caller steps until it can answer, then holds. Whatever those
        ranks are fed next that would be due before the clock's time runs at that time, so the
        online timing may differ from a replay of the recorded trace by that much; the replay,
        which has every event in advance, is the exact one.
        """
        if not (self._agenda.pending > self._failing or self._active or self._handover.lone is not None):
            return False  # only failures are due: nothing the answer waits for can happen
        self._lookahead.update(ranks)
        self._agenda.overrun = True
        return self._agenda.step()

    def hold(self) -> None:
        """End an overrun: every rank waiting for input holds the clock back again."""
        self._lookahead.clear()
