"""Test doubles: models and strategies that fail, stall or check the runtime on purpose.

They live in the package (not in tests/) because node processes unpickle them by module
path, and a node can import ``exonet.runtime.testing`` but not a test file. The demo data and
models are in ``exonet.toy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from exonet.strategies.base import Strategy
from exonet.toy import tiny_mlp


class FailingModel(nn.Module):
    """Raises on ``fail_rank`` at step ``fail_step`` (counting forward calls): for failure tests."""

    def __init__(self, fail_rank: int, fail_step: int, message: str = "boom", how: str = "raise") -> None:
        super().__init__()
        self.inner = tiny_mlp()
        self.fail_rank, self.fail_step, self.message, self.how = fail_rank, fail_step, message, how
        self.calls = 0

    def forward(self, batch: Any) -> torch.Tensor:
        if self.training:
            self.calls += 1
            _fail_on(self.fail_rank, self.calls == self.fail_step, self.how, self.message)
        return self.inner(batch)


class FailingLayer(nn.Module):
    """An identity layer that fails as ``FailingModel`` does on its ``call``-th training forward on ``fail_rank``:
    a stage of a pipeline that dies (``exonet.runtime.pipeline``)."""

    def __init__(self, fail_rank: int, call: int, how: str = "kill") -> None:
        super().__init__()
        self.fail_rank, self.call, self.how = fail_rank, call, how
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            _fail_on(self.fail_rank, self.calls == self.call, self.how, "boom")
        return x


def _fail_on(rank: int, now: bool, how: str, message: str) -> None:
    """Fail ``how`` ("raise", "kill", "hang" or "exit": dying without a word, as a C extension's exit() would)
    when ``now`` on global rank ``rank``."""
    import os
    import signal
    import time

    import torch.distributed as dist

    if not (now and dist.is_initialized() and dist.get_rank() == rank):
        return
    if how == "raise":
        raise RuntimeError(message)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        time.sleep(3600)
    if how == "exit":
        os._exit(3)


class ProbeStrategy(Strategy):
    """Exercises every Communicator operation once per step and checks the results (for tests).

    Each rank contributes tensors filled with its rank, so every result is known in
    closed form; a wrong result raises inside the node and fails the run.
    """

    name = "probe"

    def step(self) -> None:
        n, r = self.num_nodes, self.rank
        world = float(sum(range(n)))
        x = torch.full((n * 2,), float(r))
        _expect("all_reduce sum", self.comm.all_reduce(x.clone()), torch.full((n * 2,), world))
        _expect("all_reduce avg", self.comm.all_reduce(x.clone(), op="avg"), torch.full((n * 2,), world / n))
        gathered = self.comm.all_gather(torch.full((3,), float(r)))
        _expect("all_gather", gathered, torch.arange(n, dtype=torch.float32)[:, None].expand(n, 3))
        b = self.comm.broadcast(torch.full((5,), float(r)), src=n - 1)
        _expect("broadcast", b, torch.full((5,), float(n - 1)))
        rs = self.comm.reduce_scatter(torch.arange(n * 2, dtype=torch.float32) + r)
        _expect("reduce_scatter", rs, torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * n + world)
        a2a = self.comm.all_to_all(torch.arange(n, dtype=torch.float32) + 10 * r)
        _expect("all_to_all", a2a, torch.arange(n, dtype=torch.float32) * 10 + r)
        reduced = self.comm.reduce(x.clone(), dst=n - 1)
        if r == n - 1:
            _expect("reduce", reduced, torch.full((n * 2,), world))
        on_root = self.comm.gather(torch.full((3,), float(r)), dst=0)
        if r == 0:
            _expect("gather", on_root, torch.arange(n, dtype=torch.float32)[:, None].expand(n, 3))
        part = self.comm.scatter(torch.arange(n * 2, dtype=torch.float32) * (1 if r == 1 else -1), src=1)
        _expect("scatter", part, torch.arange(2 * r, 2 * r + 2, dtype=torch.float32))
        self.comm.barrier()
        handle = self.comm.all_reduce(torch.ones(4), async_op=True)
        _expect("async all_reduce", handle.wait(), torch.full((4,), float(n)))
        self.comm.declare_groups([[0, 1]])
        if n >= 3 and r < 2:
            _expect("subgroup all_reduce", self.comm.all_reduce(torch.ones(2), group=[0, 1]), torch.full((2,), 2.0))
        sent, got = self.comm.batch_isend_irecv([("send", torch.full((6,), float(r)), (r + 1) % n),
                                                 ("recv", torch.empty(6), (r - 1) % n)])
        _expect("batch_isend_irecv", got.wait(), torch.full((6,), float((r - 1) % n)))
        sent.wait()
        self.optimizer_step()


class RingPassStrategy(Strategy):
    """Each step, every rank sends ``numel`` floats filled with its rank to the next rank and receives
    from the previous.

    Exercises ``send``/``recv`` (for tests): the send is async, the receive blocks, and the
    received values are checked.
    """

    name = "ring-pass"

    def __init__(self, numel: int = 1000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.numel = numel

    def step(self) -> None:
        n, r = self.num_nodes, self.rank
        sent = self.comm.send(torch.full((self.numel,), float(r)), (r + 1) % n, async_op=True)
        got = self.comm.recv(torch.empty(self.numel), (r - 1) % n)
        sent.wait()
        _expect("recv", got, torch.full((self.numel,), float((r - 1) % n)))
        self.optimizer_step()


class RunsCode:
    """Unpickling this calls ``os.system``, creating ``marker``: a file holding it proves that loading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return os.system, (f"touch {self.marker}",)


def write_checkpoint(root: Path, num_nodes: int = 2, steps: int = 4,
                     references: dict[int, float] | None = None) -> Path:
    """A new run directory under ``root`` holding a committed checkpoint of ``steps`` steps, made by exonet's
    own writers without a fit (DDP on ``tiny_mlp`` after one AdamW step, one all-reduce per step and rank):
    for tests of what a resume reads back."""
    from exonet.communicator import Communicator
    from exonet.rundir import create_run
    from exonet.runtime.checkpoint import CheckpointBook, save_node
    from exonet.strategies import DDPStrategy, NodeContext
    from exonet.trace import Trace

    run = create_run(root, "checkpoint", {"num_nodes": num_nodes, "max_steps": 2 * steps})
    book = CheckpointBook(run / "checkpoints", num_nodes)
    trace = Trace(num_nodes)
    for rank in range(num_nodes):
        for _ in range(steps):
            trace.add_compute(rank, 0.01)
            trace.add_collective(rank, "all_reduce", 1024)
            trace.add_step(rank)
        comm = Communicator(rank, num_nodes, torch.device("cpu"))
        comm.next_cid = steps
        model, strategy = tiny_mlp(), DDPStrategy()
        strategy.setup(model, comm, NodeContext(rank, num_nodes, 2 * steps, 0, torch.device("cpu")))
        for p in strategy.params:
            p.grad = torch.ones_like(p)
        strategy.optimizer_step()
        save_node(book.root, steps, rank, model, strategy)
        book.report(rank, steps)
    book.commit(steps, {"train_loss": [1.0] * steps, "eval": []}, trace, references)
    return run


def _expect(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.allclose(got, want):
        raise AssertionError(f"{what}: got {got.tolist()}, expected {want.tolist()}")


class SlowEvalModel(nn.Module):
    """``tiny_mlp`` that sleeps ``seconds`` per evaluation batch: a long evaluation is not a hang (watchdog tests)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.inner = tiny_mlp()
        self.seconds = seconds

    def forward(self, batch: Any) -> torch.Tensor:
        import time

        if not self.training:
            time.sleep(self.seconds)
        return self.inner(batch)


class SleepyModel(nn.Module):
    """``tiny_mlp`` that sleeps ``seconds`` per training forward on global rank ``rank``: a node that is slow in
    reality but not in the scenario (the simulated order must win over the real one)."""

    def __init__(self, seconds: float, rank: int) -> None:
        super().__init__()
        self.inner = tiny_mlp()
        self.seconds, self.rank = seconds, rank

    def forward(self, batch: Any) -> torch.Tensor:
        import time

        import torch.distributed as dist

        if self.training and dist.is_initialized() and dist.get_rank() == self.rank:
            time.sleep(self.seconds)
        return self.inner(batch)


class BadLossModel(nn.Module):
    """Returns a loss exonet must reject: ``kind`` "vector" (not a scalar) or "detached" (no grad)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.inner = tiny_mlp()
        self.kind = kind

    def forward(self, batch: Any) -> torch.Tensor:
        x, y = batch
        if self.kind == "vector":
            return nn.functional.cross_entropy(self.inner.net(x), y, reduction="none")
        return self.inner(batch).detach()


def _grads(strategy: Strategy) -> list[torch.Tensor]:
    """Each parameter's gradient: these test models give every parameter one in backward."""
    grads = []
    for p in strategy.params:
        assert p.grad is not None, "a test strategy's model left a parameter without a gradient"
        grads.append(p.grad)
    return grads


class DyingStrategy(Strategy):
    """DDP-like gradient averaging whose ``kill_rank`` is SIGKILLed at step ``kill_step`` (1-based) with
    its all-reduce in flight: a node dying in the middle of a collective (fault tests)."""

    name = "dying"

    def __init__(self, kill_rank: int, kill_step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kill_rank, self.kill_step = kill_rank, kill_step

    def step(self) -> None:
        import os
        import signal

        from exonet.strategies.base import flatten, unflatten_into

        grads = _grads(self)
        flat = flatten(grads)
        handle = self.comm.all_reduce(flat, op="avg", async_op=True)
        if self.rank == self.kill_rank and self.local_step + 1 == self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        handle.wait()
        unflatten_into(flat, grads)
        self.optimizer_step()


class ClockProbeStrategy(Strategy):
    """Averages gradients every step and asks the simulated clock what it knows (for tests).

    After each step it records ``comm.sim_now()``; once, ``comm.speeds()`` and the idle-network
    time of its own all-reduce; at the end of ``max_steps`` it writes them to
    ``<out_dir>/rank<r>.json`` for the test to read.
    """

    name = "clock-probe"

    def __init__(self, optim_spec: Any, out_dir: str) -> None:
        super().__init__(optim_spec)
        self.out_dir = out_dir
        self._seen: dict[str, Any] = {"now": []}

    def step(self) -> None:
        from exonet.strategies.base import flatten, unflatten_into

        grads = flatten(_grads(self))
        if "transfer" not in self._seen:
            self._seen["speeds"] = list(self.comm.speeds())
            self._seen["bytes"] = grads.numel() * grads.element_size()
            self._seen["transfer"] = self.comm.transfer_time("all_reduce", self._seen["bytes"])
        self.comm.all_reduce(grads, op="avg")
        unflatten_into(grads, _grads(self))
        self.optimizer_step()
        self._seen["now"].append(self.comm.sim_now())
        if self.local_step + 1 == self.ctx.max_steps:  # the last step (the count goes up as step() returns)
            import json
            from pathlib import Path

            Path(self.out_dir, f"rank{self.rank}.json").write_text(json.dumps(self._seen))
