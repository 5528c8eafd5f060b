"""FedAvg: H local steps, then parameter averaging (McMahan et al. 2017, arXiv 1602.05629).

Also the round machinery DiLoCo builds on: who averages with whom in a round
(``participation``, ``island_size``) is drawn from the shared seed, so agreeing on it
costs no bytes (the seed gym broadcast a shuffled rank list, or all-gathered every
node's full parameters to form islands).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import (
    NodeContext,
    OptimSpec,
    Strategy,
    check_int,
    check_range,
    flatten,
    shared_generator,
    unflatten_into,
)

if TYPE_CHECKING:
    from exonet.communicator import Communicator


class FedAvgStrategy(Strategy):
    """Every node takes ``H`` local optimizer steps, then its round group averages parameters.

    One all-reduce (op "avg") of a single flattened parameter buffer per round, so each
    participant sends ``P * itemsize`` bytes every ``H`` steps and nothing in between.
    The inner optimizer keeps its state across rounds.

    Round groups (round r ends at step r·H), drawn on every node from ``(seed, r)``:

    - ``participation`` < 1: ⌈participation·K⌉ nodes take part; with K > 1 that must be at
      least two (else nothing is ever exchanged, a ValueError at setup). A node that sits a
      round out neither sends nor updates, and keeps training from its own parameters; it
      rejoins by averaging at the next round it is drawn for.
    - ``island_size``: the participants are shuffled and cut into islands of that size,
      each averaging only inside itself (an all-reduce on a subgroup). The remainder
      forms a smaller island, except that a single leftover node joins the previous
      island, so nobody is left alone. ``island_size`` >= the group size means one island;
      ``island_size`` = 1 means no averaging at all (a local-training baseline).

    A group of one (K = 1) sends nothing: averaging with oneself is the identity.

    Deadline rounds (``deadline_s``, on the online clock: fit with a scenario): a round closes
    ``deadline_s`` simulated seconds after it opens (when the previous round's average is
    complete). The nodes that finished their H local steps by then average among themselves
    (a subgroup all-reduce); a late node's work is discarded: it receives the round's result
    (the global state) from the lowest-ranked participant, a message that waits for nobody, and
    trains its next round from it. When nobody makes the deadline, everyone restarts from the
    previous global state and the next round opens at the missed deadline. Every node still
    takes H steps per round; a slow node just takes them later, so it can miss every deadline.

    Elastic rounds (``elastic=True``, on the online clock too): a node that was down (failed) at
    any time since its last sync is out of the round: the nodes that stayed up average among
    themselves without waiting for it, and its work of the round is discarded. While it is still
    down at a round's end it stays out and records no work; at the first round end that finds it
    up it receives the round's result as a late node does and takes part again (the clock's
    ``("elastic", r)`` answer; see strategies/README.md, "Failures and goodput").

    Args:
        optim_spec: the local optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        island_size: nodes per averaging island each round; None averages over all participants.
        H: local steps per round (the seed gym's default, 1, averages every step).
        max_norm: clip the local gradient norm before each local step.
        participation: fraction of nodes taking part in each round, in (0, 1].
        deadline_s: close each round this many simulated seconds after it opens (None: wait for everyone).
        elastic: rounds go on without the nodes that failed since their last sync (needs a scenario).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner learning-rate schedule,
            as in ``Strategy``.
    """

    name = "fedavg"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        island_size: int | None = None,
        H: int = 1,
        participation: float = 1.0,
        deadline_s: float | None = None,
        elastic: bool = False,
    ) -> None:
        super().__init__(optim_spec)
        if not isinstance(elastic, bool):
            raise TypeError(f"elastic must be True or False, got {elastic!r}")
        if elastic and (deadline_s is not None or participation != 1 or island_size is not None):
            raise ValueError("elastic: who takes part in a round is who stayed up; it cannot be combined with "
                             "deadline_s, participation < 1 or island_size")
        self.elastic = elastic
        if deadline_s is not None:
            check_range("deadline_s", deadline_s, low=0, low_open=True)
            if participation != 1 or island_size is not None:
                raise ValueError("deadline_s: the deadline decides who takes part in a round; it cannot be combined "
                                 "with participation < 1 or island_size")
        self.deadline_s = deadline_s
        check_int("H", H, low=1)
        if island_size is not None:
            check_int("island_size", island_size, low=1)
        check_range("participation", participation, low=0, low_open=True, high=1)
        self.H = H
        self.island_size = island_size
        self.participation = participation

    def check_world(self, num_nodes: int) -> None:
        k = num_nodes
        if k > 1 and self.round_size(k) < 2:
            raise ValueError(
                f"participation={self.participation} with K={k} nodes puts ⌈participation·K⌉ = 1 node in each round, "
                f"so no round ever exchanges anything; use participation > 1/K = {1 / k:.4g} (or 1.0)"
            )

    @property
    def asynchronous(self) -> bool:
        return self.deadline_s is not None or self.elastic

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        self.check_world(ctx.num_nodes)  # under torchrun no parent checked it
        super().setup(model, comm, ctx)
        self._hand_offs: list[Any] = []  # deadline rounds: the global state in flight to late nodes
        if self.asynchronous:
            with torch.no_grad():
                self._global = flatten(self.params)

    def round_size(self, k: int) -> int:
        """How many of ``k`` nodes take part in a round: ⌈participation·k⌉, at least one."""
        return max(1, math.ceil(self.participation * k - 1e-9))  # the epsilon keeps ⌈0.3·10⌉ at 3

    def step(self) -> None:
        self.optimizer_step()
        if (self.local_step + 1) % self.H == 0:  # this step ends a round
            self.deadline_round() if self.asynchronous else self.sync_round()

    def rounds_done(self) -> int:
        """Rounds completed, the one this step ends included (inside ``step()``, where ``local_step`` counts
        the steps before this one)."""
        return (self.local_step + 1) // self.H

    def deadline_round(self) -> None:
        """End of a deadline (or elastic) round: the clock says who made it (stayed up); they average,
        the rest adopt the result."""
        r = self.rounds_done() - 1
        if self.elastic:
            up, out, rejoin = self.comm.elastic_round(r)
            participants, late = up, rejoin  # only those rejoining receive
            self.comm.sitting_out = self.rank in out
        else:
            assert self.deadline_s is not None  # asynchronous and not elastic: a deadline round
            participants, late = self.comm.deadline_round(r, self.deadline_s)
        self.comm.declare_groups([participants])
        self._wait_hand_offs()  # the last round's, after the question: the clock reads this round's opening first
        with torch.no_grad():
            if self.rank in participants:
                mean = flatten(self.params)
                if len(participants) > 1:
                    self.comm.all_reduce(mean, op="avg", group=participants)
                self.apply_average(mean)
                self._global = flatten(self.params)
                if self.rank == participants[0] and late:
                    state = self.global_state()
                    self._hand_offs = [self.comm.send(state, q, async_op=True) for q in late]
            else:
                self.comm.discard()
                state = self.global_state()
                if participants and not self.comm.sitting_out:  # (an elastic node still down waits to rejoin)
                    # On the wire, but the replay does not wait for it: a node that is late or failed can lag the
                    # others in simulated time, and a wait for a message due after their time would hold the clock.
                    self.comm.recv(state, participants[0], async_op=True).wait(traced=False)
                self.adopt_global_state(state)  # with no participant: back to the last global state
                self._global = flatten(self.params)

    def global_state(self) -> torch.Tensor:
        """What a late node adopts: the global parameters (a buffer this node holds, never its live parameters)."""
        return self._global.clone()

    def adopt_global_state(self, state: torch.Tensor) -> None:
        """Continue from a buffer made by ``global_state`` (on any node)."""
        unflatten_into(state, self.params)

    def finish(self) -> None:
        self._wait_hand_offs()

    def _wait_hand_offs(self) -> None:
        for handle in self._hand_offs:
            handle.wait(traced=False)  # the sender goes on: the replay must not hold it for a node that is down
        self._hand_offs = []

    def round_partition(self, round_index: int) -> list[tuple[int, ...]]:
        """Every averaging group of round ``round_index`` (sorted ranks), identical on all nodes."""
        k = self.num_nodes
        g = shared_generator(self.ctx.seed, "round", round_index)
        members = torch.arange(k)
        if self.participation < 1:
            members = torch.randperm(k, generator=g)[:self.round_size(k)]
        islands = [members]
        if self.island_size is not None and self.island_size < len(members):
            islands = list(members[torch.randperm(len(members), generator=g)].split(self.island_size))
            if len(members) % self.island_size == 1:
                islands[-2:] = [torch.cat(islands[-2:])]
        return [tuple(sorted(island.tolist())) for island in islands]

    def round_group(self, round_index: int) -> tuple[int, ...] | None:
        """The sorted ranks this node averages with in round ``round_index``; None if it sits the round out."""
        return next((grp for grp in self.round_partition(round_index) if self.rank in grp), None)

    def sync_round(self) -> None:
        """End of a round: average parameters over this round's group, then let ``apply_average`` use the mean.

        Every node declares the round's groups (process groups are created collectively),
        including nodes that sit the round out.
        """
        partition = self.round_partition(self.rounds_done())
        self.comm.declare_groups(partition)
        group = next((grp for grp in partition if self.rank in grp), None)
        if group is None:
            return
        with torch.no_grad():
            self.apply_average(self.group_mean(group))

    def group_mean(self, group: tuple[int, ...]) -> torch.Tensor:
        """The mean of the group's flattened parameters (one all-reduce, op "avg")."""
        mean = flatten(self.params)
        if len(group) > 1:
            self.comm.all_reduce(mean, op="avg", group=group)
        return mean

    def apply_average(self, mean: torch.Tensor) -> None:
        """FedAvg adopts the group's mean parameters."""
        unflatten_into(mean, self.params)
