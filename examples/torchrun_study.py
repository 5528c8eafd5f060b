"""One study, two launchers: K node processes on this machine, or torchrun on one or many hosts.

DDP, DiLoCo (H=5) or SparseLoCo (H=4, its messages through the object store) trains a small classifier
on a synthetic task with a fixed seed.
Under torchrun each process is one node (num_nodes = WORLD_SIZE) and rank 0 prints the
summary and writes the run directory; run locally, exonet starts the K nodes itself.
The loss curve and payload bytes are the same either way.

    python examples/torchrun_study.py --strategy diloco --nodes 4
    torchrun --standalone --nproc-per-node 2 examples/torchrun_study.py --strategy diloco
    # two hosts with 2 processes each: run this on both, HOST being the first host's address
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        examples/torchrun_study.py --strategy diloco

Options: ``--steps``, ``--runs DIR`` (run directories, for ``exonet compare``), ``--json FILE``
(loss per step and payload bytes per node, for scripts and tests), ``--object-store s3://bucket/prefix``
(fit's ``object_store``, where SparseLoCo's nodes swap their messages: run locally, a directory by default;
under torchrun SparseLoCo needs it, a bucket every host reaches through the AWS environment, such as
``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

import argparse
import json
import os

from exonet import LocalTrainer
from exonet.strategies import DDPStrategy, DiLoCoStrategy, OptimSpec, SparseLoCoStrategy
from exonet.toy import synthetic_classification, tiny_mlp

STRATEGIES = {
    "ddp": lambda: DDPStrategy(OptimSpec("adamw", lr=3e-3)),
    "diloco": lambda: DiLoCoStrategy(OptimSpec("adamw", lr=3e-3),
                                     outer_optim_spec=OptimSpec("sgd", lr=0.7, momentum=0.9), H=5),
    "sparseloco": lambda: SparseLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=4, top_k=8, chunk=8, transport="store"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ddp")
    parser.add_argument("--nodes", type=int, default=2, help="K when run without torchrun (torchrun: WORLD_SIZE)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", help="write the run directory under this folder")
    parser.add_argument("--json", help="write the loss per step and payload bytes per node to this file (rank 0)")
    parser.add_argument("--object-store", help="an s3://bucket/prefix URL for comm.put/get (SparseLoCo's messages)")
    args = parser.parse_args()
    nodes = int(os.environ.get("WORLD_SIZE", args.nodes))
    result = LocalTrainer(tiny_mlp(), synthetic_classification(1024, dim=8, classes=4)).fit(
        STRATEGIES[args.strategy](), num_nodes=nodes, max_steps=args.steps, batch_size=16, shuffle=False, seed=0,
        device="cpu", progress=False, run_dir=args.runs, object_store=args.object_store)
    if os.environ.get("RANK", "0") != "0":
        return
    loss = result.history["train_loss"]
    print(f"{args.strategy} K={nodes}: loss {loss[0]:.3f} -> {loss[-1]:.3f}, payload per node "
          f"{result.payload_bytes(0):,} bytes, {result.real_time_s:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"train_loss": loss, "payload_bytes": [result.payload_bytes(r) for r in range(nodes)]}, f)


if __name__ == "__main__":
    main()
