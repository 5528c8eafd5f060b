"""A parameter server in a few lines: reduce the gradients to rank 0, step there, broadcast the weights back.

Every node waits at a barrier (``comm.barrier``) until all have built their state. Each step
every node reduces its flattened gradient to the server, rank 0 (``comm.reduce``, mean), which
steps its optimizer, then ``comm.broadcast`` sends the new weights to everyone: the same model as
DDP's (the same mean gradient, the same optimizer), twice DDP's payload. The classic server
(``--collect gather``) gathers every node's whole gradient instead (``comm.gather``) and averages
it there: the same model again, but the server's link receives n − 1 gradients per step where the
reduce's chain or ring sends it one.
Both runs are replayed on one 1 Gbit/s, 10 ms cluster stated three ways: NCCL (reduce and
broadcast are pipelined chains), gloo (a ring reduce-scatter then a gather to the root, and a
binomial broadcast) and exonet's phase model with a hub (``collective = "star"``, where a
parameter server and an all-reduce through the hub are the same messages). Counting, tracing
and simulation come for free.

    python examples/parameter_server.py [--steps 60] [--nodes 4] [--collect reduce|gather]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from exonet import LocalTrainer, Scenario, simulate
from exonet.communicator import Communicator
from exonet.scenario.units import format_bytes, format_time
from exonet.strategies import DDPStrategy, OptimSpec, Strategy
from exonet.strategies.base import NodeContext, flatten, unflatten_into
from exonet.toy import digits, digits_mlp
from exonet.trace import Collective

SERVER = 0


class ParameterServerStrategy(Strategy):
    """Gradients reduced (or gathered) to the server, which steps; its weights broadcast back. Only the server has
    an optimizer state that matters: the others' weights are overwritten every step."""

    def __init__(self, optim_spec: OptimSpec, collect: str = "reduce") -> None:
        super().__init__(optim_spec)
        if collect not in ("reduce", "gather"):
            raise ValueError(f"collect: expected 'reduce' or 'gather', got {collect!r}")
        self.collect = collect

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        self.comm.barrier()  # nobody starts until every node has its model and optimizer

    def step(self) -> None:
        grad = flatten([p.grad for p in self.params])
        if self.collect == "gather":
            every = self.comm.gather(grad, dst=SERVER)  # (n, P) on the server, None elsewhere
            if every is not None:
                grad = every.mean(dim=0)
        else:
            self.comm.reduce(grad, dst=SERVER, op="mean")
        if self.rank == SERVER:
            unflatten_into(grad, [p.grad for p in self.params])
            self.optimizer_step()
        weights = flatten([p.data for p in self.params])
        self.comm.broadcast(weights, src=SERVER)
        unflatten_into(weights, [p.data for p in self.params])


def scenarios() -> list[Scenario]:
    """The same 1 Gbit/s, 10 ms cluster stated three ways: NCCL, gloo, and exonet's phase model with a hub. Compute
    is timed by the FLOPs torch counts at 0.01 TFLOP/s, so the table is the same on every machine."""
    network = {"bandwidth": "1 Gbit/s", "latency": "10 ms"}
    compute = {"mode": "flops", "tflops": 0.01, "mfu": 1.0}
    return [Scenario.from_dict({"name": "nccl", "network": {**network, "backend": "nccl"}, "compute": compute}),
            Scenario.from_dict({"name": "gloo", "network": {**network, "backend": "gloo"}, "compute": compute}),
            Scenario.from_dict({"name": "star", "network": {**network, "collective": "star"}, "compute": compute})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--collect", choices=("reduce", "gather"), default="reduce",
                        help="how the server collects the gradients: one reduce, or every node's whole gradient")
    args = parser.parse_args()
    trainer = LocalTrainer(digits_mlp(), digits(train=True), digits(train=False))
    common = dict(num_nodes=args.nodes, max_steps=args.steps, batch_size=16, val_interval=args.steps, seed=0,
                  progress=False)
    server = ParameterServerStrategy(OptimSpec("adamw", lr=1e-3), collect=args.collect)
    runs = {"parameter server": trainer.fit(server, **common),
            "DDP": trainer.fit(DDPStrategy(OptimSpec("adamw", lr=1e-3), overlap=False), **common)}
    print(f"parameters: {sum(p.numel() for p in runs['DDP'].model.parameters())}")
    ops = Counter(e.op for e in runs["parameter server"].trace.events[1] if isinstance(e, Collective))
    print("the server's run, node 1's calls: " + ", ".join(f"{op} x{count}" for op, count in sorted(ops.items())))
    print("| strategy | val loss | payload/step/node | scenario | sim time | server sent | node 1 sent |")
    print("|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        payload = run.payload_bytes(1) / args.steps
        for scenario in scenarios():
            sim = simulate(run.trace, scenario)
            print(f"| {name} | {run.history['eval'][-1]['loss']:.4f} | {payload:,.0f} | {scenario.name} | "
                  f"{format_time(sim.wall_clock_s)} | {format_bytes(sim.wire_bytes[SERVER])} | "
                  f"{format_bytes(sim.wire_bytes[1])} |")


if __name__ == "__main__":
    main()
