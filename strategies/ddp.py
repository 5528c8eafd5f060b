"""DDP / AllReduce: average gradients every step, in buckets that overlap the backward pass.

As in PyTorch DDP, parameters are grouped into buckets in reverse order of
``model.parameters()`` (roughly the order backward produces their gradients): the
first bucket holds up to 1 MiB, the others up to ``bucket_cap_mb`` MiB. A
post-accumulate-grad hook counts each bucket's gradients; once a bucket is complete,
and every bucket before it has been launched, it is flattened and all-reduced
asynchronously while backward goes on. ``step()`` launches any bucket left (a
parameter that got no gradient contributes zeros), waits for all of them in order,
then steps. Buckets launch in the same order on every node, so the k-th all-reduce
matches across nodes. With gradient accumulation only the last micro-batch's backward
launches buckets.

The payload is exactly ``P * itemsize`` bytes per node per step either way; the
trace shows each bucket's launch inside backward, so a replay knows how much compute
was left to hide it behind. ``overlap=False`` is one flattened all-reduce after backward.

``elastic=True`` (on the online clock: fit with a scenario) goes on without the nodes that
failed: each step, before its first bucket's all-reduce (at ``step()`` if none launched in
backward), each node asks the clock who stayed up since its last sync; those average their
gradients (the same buckets as without ``elastic``, on that subgroup) and step; a node that failed
loses its step's work, sits out (recording no work) while it is still down at a step's end,
and at the first step end that finds it up receives the parameters and optimizer state from the
lowest-ranked node that stayed up (a message on the wire, simulated like any other), so every
node taking part holds the same state after every step. If every node failed, nobody steps.
With no failure the trace is the blocking strategy's, event for event. A member that fails inside
an all-reduce is left out of it by the replay, which starts it again on the others
(exonet.netsim.outages); its real gradient was averaged, but it is found failed at the next step
and adopts the state like any failed node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from exonet.strategies.base import NodeContext, OptimSpec, Strategy, check_range, flatten, unflatten_into

if TYPE_CHECKING:
    from exonet.communicator import Communicator, Handle

FIRST_BUCKET_BYTES = 1 << 20  # torch DDP's first bucket: small, so communication starts early


def bucket_assignment(params: list[torch.Tensor], cap_bytes: int,
                      first_bytes: int = FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Parameter indices per bucket, in launch order: reverse parameter order, closed once a bucket reaches its cap."""
    buckets: list[list[int]] = [[]]
    size, limit = 0, min(first_bytes, cap_bytes)
    for i in reversed(range(len(params))):
        buckets[-1].append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= limit:
            buckets.append([])
            size, limit = 0, cap_bytes
    return [b for b in buckets if b]


class DDPStrategy(Strategy):
    """Data-parallel SGD: gradients averaged over all nodes every step, then one optimizer step.

    Clipping (``max_norm``) applies to the averaged gradient, as in PyTorch DDP.

    Args:
        optim_spec: the optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        max_norm: clip the averaged gradient norm before each step.
        bucket_cap_mb: the largest bucket in MiB (torch DDP's default 25).
        overlap: all-reduce buckets from backward hooks as they fill (True), or one flat
            all-reduce after backward (False).
        elastic: each step, only the nodes that stayed up average; failed nodes receive the state
            (needs a scenario; the buckets and their overlap are as without it).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the learning-rate schedule,
            as in ``Strategy``.
    """

    name = "ddp"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        bucket_cap_mb: float = 25,
        overlap: bool = True,
        elastic: bool = False,
    ) -> None:
        super().__init__(optim_spec)
        check_range("bucket_cap_mb", bucket_cap_mb, low=0, low_open=True)
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap must be True or False, got {overlap!r}")
        if not isinstance(elastic, bool):
            raise TypeError(f"elastic must be True or False, got {elastic!r}")
        self.bucket_cap_mb = bucket_cap_mb
        self.overlap = overlap
        self.elastic = elastic

    @property
    def asynchronous(self) -> bool:
        return self.elastic

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        self._buckets = bucket_assignment(self.params, round(self.bucket_cap_mb * (1 << 20)))
        self._bucket_of = {i: b for b, members in enumerate(self._buckets) for i in members}
        self._armed = False
        self._hand_offs: list[Handle] = []  # elastic: the state in flight to nodes that failed
        self._round: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None  # elastic: this step's
        self._reset()
        if self.overlap:
            for i, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(lambda _, i=i: self._grad_ready(i))

    def _reset(self) -> None:
        self._missing = [len(members) for members in self._buckets]
        self._launched: list[tuple[torch.Tensor, Handle | None]] = []  # None: a bucket this node keeps

    def prepare_backward(self, sync: bool) -> None:
        self._armed = sync and self.overlap

    def _grad_ready(self, i: int) -> None:
        """Hook: parameter ``i`` has its gradient; launch every complete bucket that is next in line."""
        if not self._armed:
            return
        self._missing[self._bucket_of[i]] -= 1
        while len(self._launched) < len(self._buckets) and self._missing[len(self._launched)] == 0:
            self._launch(len(self._launched))

    def _launch(self, b: int) -> None:
        members = [self.params[i] for i in self._buckets[b]]
        flat = flatten(p.grad if p.grad is not None else p.detach().new_zeros(p.shape) for p in members)
        group = None
        if self.elastic:
            up = self._elastic_round()[0]
            if self.rank not in up or len(up) < 2:
                self._launched.append((flat, None))  # it does not average this step (or has nobody to average with)
                return
            group = up
        self._launched.append((flat, self.comm.all_reduce(flat, op="avg", group=group, async_op=True)))

    def _elastic_round(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """This step's (up, out, rejoin), asked once, before its first all-reduce."""
        if self._round is None:
            self._round = self.comm.elastic_round(self.local_step)
            self.comm.declare_groups([self._round[0]])
            self.finish()  # the previous step's hand-offs, after the question (the clock reads this step's first)
        return self._round

    def step(self) -> None:
        if self.elastic and self.rank not in self._elastic_round()[0]:
            self._sit_out()
        else:
            self._average()
            self.optimizer_step()
            up, _, rejoin = self._round or ((), (), ())
            if rejoin and self.rank == up[0]:  # the state after this step, to the nodes coming back
                self._hand_offs = [self.comm.send(self._state(), q, async_op=True) for q in rejoin]
        self._round = None

    def _average(self) -> None:
        """Average the gradients: every bucket (launched in backward, or now), or one flat buffer."""
        if self.overlap:
            self._armed = False
            while len(self._launched) < len(self._buckets):
                self._launch(len(self._launched))
            for b, (flat, handle) in enumerate(self._launched):
                if handle is not None:
                    handle.wait()
                self._write_grads([self.params[i] for i in self._buckets[b]], flat)
            self._reset()
        else:
            flat = flatten(p.grad if p.grad is not None else p.detach().new_zeros(p.shape) for p in self.params)
            up = self._elastic_round()[0] if self.elastic else None
            if up is None or len(up) > 1:
                self.comm.all_reduce(flat, op="avg", group=up)
            self._write_grads(self.params, flat)

    def _sit_out(self) -> None:
        """A node that failed this step discards its work; once up, it receives the state from the lowest up node."""
        up, out, _ = self._elastic_round()  # asked already, by step
        self._armed = False
        self._reset()
        self.comm.discard()
        self.comm.sitting_out = self.rank in out
        if up and not self.comm.sitting_out:
            state = self._state()
            self.comm.recv(state, up[0], async_op=True).wait(traced=False)  # see FedAvgStrategy.deadline_round
            self._load_state(state)
        if self.scheduler is not None:  # the schedule goes on alike everywhere
            self.scheduler.step()

    def _optimizer_values(self) -> list[torch.Tensor]:
        """Every tensor of the optimizer's state, per parameter in key order (created by a zero step if none yet)."""
        if any(not self.optimizer.state[p] for p in self.params):
            with torch.no_grad():
                saved = [p.detach().clone() for p in self.params]
                for p in self.params:
                    p.grad = torch.zeros_like(p)
                self.optimizer.step()  # creates the state's keys and shapes; the caller overwrites them
                for p, v in zip(self.params, saved):
                    p.copy_(v)
        values = []
        for p in self.params:
            state = self.optimizer.state[p]
            values += [state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor)]
        return values

    def _state(self) -> torch.Tensor:
        """The parameters and the optimizer's state as one flat buffer (what a node that failed receives)."""
        values = [p.detach() for p in self.params] + self._optimizer_values()
        return torch.cat([v.reshape(-1).to(self.params[0].dtype) for v in values])

    def _load_state(self, buffer: torch.Tensor) -> None:
        """Adopt a buffer made by ``_state`` on another node."""
        offset = 0
        with torch.no_grad():
            for v in [p.data for p in self.params] + self._optimizer_values():
                v.copy_(buffer[offset : offset + v.numel()].view_as(v))
                offset += v.numel()

    def finish(self) -> None:
        for handle in self._hand_offs:
            handle.wait(traced=False)  # the sender goes on: the replay must not hold it for a node that is down
        self._hand_offs = []

    @staticmethod
    def _write_grads(params: list[torch.Tensor], flat: torch.Tensor) -> None:
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = p.detach().new_zeros(p.shape)
            grads.append(p.grad)
        unflatten_into(flat, grads)


AllReduceStrategy = DDPStrategy
# The older gym's name: it averaged the gradients every step too (one all-reduce per tensor, same mean).
SimpleReduceStrategy = DDPStrategy
