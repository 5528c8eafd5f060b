"""DDP / AllReduce: average gradients every step with one flattened all-reduce."""

from __future__ import annotations

from exonet.strategies.base import Strategy, flatten, unflatten_into


class DDPStrategy(Strategy):
    """Data-parallel SGD: after backward, all nodes average their gradients, then step.

    One all-reduce of a single flattened fp-gradient buffer per step, so the payload
    is exactly ``P * itemsize`` bytes per node per step. Clipping (``max_norm``)
    applies to the averaged gradient, as in PyTorch DDP.
    """

    name = "ddp"

    def step(self) -> None:
        grads = [p.grad if p.grad is not None else p.detach().new_zeros(p.shape) for p in self.params]
        flat = flatten(grads)
        self.comm.all_reduce(flat, op="avg")
        for p, g in zip(self.params, grads):
            if p.grad is None:
                p.grad = g
        unflatten_into(flat, [p.grad for p in self.params])
        self.optimizer_step()
        self.local_step += 1


AllReduceStrategy = DDPStrategy
