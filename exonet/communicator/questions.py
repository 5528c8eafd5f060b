"""Questions a time-aware strategy puts to the simulated clock through its Communicator.

Each needs the online clock, which runs whenever fit has a scenario, and is answered from the same replay
that times the run (so a replay of the finished trace gives the same times).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from exonet.communicator.core import CommCore, GroupArg, _dtype_name


def any_source_question(cid: int, tensor: torch.Tensor | Callable[[int], torch.Tensor]) -> tuple:
    """The online clock's ``recv_any`` question; a buffer chosen per sender is asked as 0 bytes (the send's count)."""
    if callable(tensor):
        return ("recv_any", cid, 0, "float32")
    return ("recv_any", cid, tensor.numel() * tensor.element_size(), _dtype_name(tensor.dtype))


class ClockQuestions(CommCore):
    """What a strategy may ask the online clock: now, speeds, a transfer's time, who is in a round."""

    def _ask(self, what: str, question: tuple) -> Any:
        if self.clock is None:
            raise RuntimeError(f"{what} needs the online clock: fit with a scenario (fit(..., scenario=S))")
        return self.clock.ask(question, self.take_events())

    @property
    def has_clock(self) -> bool:
        """Whether the simulated clock answers this node's questions (fit was given a scenario)."""
        return self.clock is not None

    def sim_now(self) -> float:
        """This rank's simulated time, in seconds, once its events so far have been replayed."""
        return self._ask("Communicator.sim_now", ("now",))

    def speeds(self) -> tuple[float, ...]:
        """Every rank's relative compute speed in the scenario (1 = the scenario's device)."""
        return tuple(self._ask("Communicator.speeds", ("speeds",)))

    def transfer_time(self, op: str, nbytes: int, group: GroupArg = None) -> float:
        """Simulated seconds that collective (or a ``send`` of ``nbytes``) would take on an idle network."""
        return self._ask("Communicator.transfer_time", ("transfer", op, nbytes, self._members(group)))

    def deadline_round(self, round_index: int, deadline_s: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(participants, late) of deadline round ``round_index``: who finished its local work in time.

        Every trainer asks once per round when its local work ends; the answer comes once every
        trainer has finished the round or stopped (exonet.runtime.clock, ``SimClock._deadline``).
        """
        participants, late = self._ask("deadline_s", ("deadline", round_index, deadline_s))
        return tuple(participants), tuple(late)

    def elastic_round(self, round_index: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(up, out, rejoin) for an elastic sync ``round_index``: who averages, who is down, who comes back.

        Under ``[failures]`` (or ``down`` events) the clock answers from the replay: the up nodes
        average among themselves, a node that is out sits the round out, and a rejoining node
        receives the current state (exonet.runtime.clock).
        """
        up, out, rejoin = self._ask("elastic=True", ("elastic", round_index))
        return tuple(up), tuple(out), tuple(rejoin)
