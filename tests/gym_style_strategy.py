"""A strategy written as the field writes them: the seed gym's base class (its own copy) and torch.distributed alone.

Nothing here imports exonet. ``Strategy`` is the seed gym's (exo-explore/gym, ``exogym/strategy/strategy.py``),
abridged; ``MasterCopyDiLoCo`` keeps a CPU master copy, builds a gloo group for it, gathers the replicas with the
list form of ``all_gather``, waits on an async handle and broadcasts the master copy back.
"""

from abc import ABC, abstractmethod

import torch
import torch.distributed as dist


class Strategy(ABC):
    def __init__(self, lr_scheduler=None, lr_scheduler_kwargs=None, **kwargs):
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_kwargs = lr_scheduler_kwargs
        self.kwargs = kwargs
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.scheduler = None
        self.lr_callbacks = []
        self.max_steps = 1

    def _init_node(self, model, rank, num_nodes):
        self.model = model
        self.rank = rank
        self.num_nodes = num_nodes
        self.local_step = 0

    @abstractmethod
    def step(self):
        if self.scheduler is not None:
            self.scheduler.step()
        self.local_step += 1

    def zero_grad(self):
        self.optim.zero_grad()


class MasterCopyDiLoCo(Strategy):
    def __init__(self, H=2, lr=0.1, outer_lr=0.7, **kwargs):
        super().__init__(**kwargs)
        self.H, self.lr, self.outer_lr = H, lr, outer_lr

    def _init_node(self, model, rank, num_nodes):
        super()._init_node(model, rank, num_nodes)
        self.optim = torch.optim.SGD(model.parameters(), lr=self.lr)
        self.cpu_group = dist.new_group(backend="gloo")
        self.master = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
        self.seen_steps = self.max_steps

    def step(self):
        self.optim.step()
        if (self.local_step + 1) % self.H == 0:
            flat = torch.cat([p.detach().reshape(-1).cpu() for p in self.model.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(self.num_nodes)]
            dist.all_gather(gathered, flat, group=self.cpu_group)
            mean = torch.stack(gathered).mean(0)
            self.master -= self.outer_lr * (self.master - mean)
            largest = torch.tensor([float(mean.abs().max())])
            work = dist.all_reduce(largest, op=dist.ReduceOp.MAX, async_op=True)
            work.wait()
            dist.broadcast(self.master, src=0, group=self.cpu_group)
            offset = 0
            for p in self.model.parameters():
                p.data.copy_(self.master[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        super().step()


class ObjectGather(MasterCopyDiLoCo):
    """Gathers Python objects, which exonet cannot count: refused, naming the call and this line."""

    def step(self):
        out = [None] * self.num_nodes
        dist.all_gather_object(out, {"rank": self.rank})
        super().step()


class EveryCall(Strategy):
    """One step that makes every torch.distributed call the door routes, checking each result; K = 2."""

    def _init_node(self, model, rank, num_nodes):
        super()._init_node(model, rank, num_nodes)
        self.optim = torch.optim.SGD(model.parameters(), lr=0.0)
        self.pair = dist.new_group([0, 1])

    def step(self):
        r, k = self.rank, self.num_nodes
        t = torch.full((4,), float(r + 1))
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.tolist() == [2.0] * 4
        out = [torch.empty(2) for _ in range(k)]
        dist.all_gather(out, torch.full((2,), float(r)), group=self.pair)
        assert [o.tolist() for o in out] == [[0.0, 0.0], [1.0, 1.0]]
        flat = torch.empty(2 * k)
        dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
        assert flat.tolist() == [0.0, 0.0, 1.0, 1.0]
        b = torch.full((3,), float(r))
        dist.broadcast(b, src=1)
        assert b.tolist() == [1.0] * 3
        red = torch.full((2,), float(r + 1))
        dist.reduce(red, dst=0)
        if r == 0:
            assert red.tolist() == [3.0, 3.0]
        gathered = [torch.empty(1) for _ in range(k)] if r == 0 else None
        dist.gather(torch.tensor([float(r)]), gathered, dst=0)
        if r == 0:
            assert [g.item() for g in gathered] == [0.0, 1.0]
        got = torch.empty(2)
        dist.scatter(got, [torch.full((2,), 5.0), torch.full((2,), 6.0)] if r == 0 else None, src=0)
        assert got.tolist() == [5.0 + r] * 2
        mine = torch.empty(2)
        dist.reduce_scatter_tensor(mine, torch.arange(4.0) + r)
        assert mine.tolist() == [2 * (2 * r) + 1, 2 * (2 * r + 1) + 1]
        swapped = torch.empty(2)
        dist.all_to_all_single(swapped, torch.tensor([10.0 * r, 10.0 * r + 1]))
        assert swapped.tolist() == [float(r), 10.0 + r]
        peer = 1 - r
        send = dist.isend(torch.full((2,), float(r)), peer)
        back = torch.empty(2)
        dist.recv(back, peer)
        send.wait()
        assert back.tolist() == [float(peer)] * 2
        box = torch.empty(1)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([7.0 + r]), peer),
                                        dist.P2POp(dist.irecv, box, peer)])
        for work in works:
            work.wait()
        assert box.item() == 7.0 + peer
        dist.barrier()
        self.optim.step()
        super().step()
