"""Outages on the replay's agenda: ``down`` windows, and failures drawn as the replay goes.

Mixed into ``Simulation`` (exonet.netsim.engine). Each failure puts the next on the agenda
while anything can still move, so a replay fed at once and one fed step by step see the same
outages (the failure process: exonet.netsim.failures; what a failure costs: exonet.netsim.compute).
"""

from __future__ import annotations

from exonet.netsim.agenda import OUTAGE, seconds, ticks


class Outages:
    """Putting ranks down and up: scheduled windows and the failure process."""

    def _schedule_outage(self, rank: int, t0: int, t1: int) -> None:
        """Take ``rank`` down over ticks [t0, t1) (ticks: an outage starting at a rank's cursor, which may be
        now, must not round to before it)."""
        self._agenda.at(t0, self._outage, rank, True, order=(OUTAGE, rank))
        self._agenda.at(t1, self._outage, rank, False, order=(OUTAGE, rank))

    def _schedule_failure(self, rank: int, k: int) -> None:
        """Put ``rank``'s k-th failure on the agenda (drawn now if need be): its start (not before now), its end."""
        t0, t1 = self._cm.failures[rank].outage(k)
        self._cm.failures_through(rank, t0)
        self._failing += 2
        self._agenda.at(max(ticks(t0), self._agenda.now), self._fail, rank, k, order=(OUTAGE, rank))
        self._agenda.at(ticks(t1), self._recover, rank, order=(OUTAGE, rank))

    def _fail(self, t: int, rank: int, k: int) -> None:
        """``rank``'s k-th failure strikes; its next one goes on the agenda while the run may go on."""
        self._failing -= 1
        self._outage(t, rank, True)
        # (paused flows schedule nothing)
        live = self._agenda.pending > self._failing or self._active or self._lone is not None
        if live or any(rk.open and rk.blocked is None for rk in self._ranks):
            self._schedule_failure(rank, k + 1)
        else:  # nothing can move until more input comes: the chain waits for it (run_until_blocked resumes it)
            self._stalled[rank] = k + 1

    def _resume_failures(self) -> None:
        """Put each stalled rank's next failure that has not ended yet back on the agenda."""
        now = seconds(self._agenda.now)
        for rank, k in self._stalled.items():
            while self._cm.failures[rank].outage(k)[1] <= now:
                k += 1
            self._schedule_failure(rank, k)
        self._stalled.clear()

    def _recover(self, t: int, rank: int) -> None:
        self._failing -= 1
        self._outage(t, rank, False)

    def _outage(self, t: int, rank: int, down: bool) -> None:
        """``rank`` goes down (its flows stop) or comes back."""
        lone = self._lone
        if down and lone is not None and rank in lone.members:
            self._take_over(t, lone)
        self._drain(t)
        self._net.pause(rank, down)
        self._net_changed(t)
