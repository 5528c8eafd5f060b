"""Running the same fit under torchrun: this process is one node of a real multi-host run.

``trainer.fit(strategy, num_nodes=K, ...)`` in a script started with
``torchrun --nproc-per-node ... script.py`` runs this process as rank RANK of
WORLD_SIZE (MASTER_ADDR / MASTER_PORT rendezvous), with the same TrainNode, strategy
and Communicator as a local run. After training, every node's messages are gathered
(bookkeeping, once) so each process returns the same FitResult: history, trace and
averaged model. Rank 0 alone writes the run directory and logs. Checkpoints and the
progress watchdog are local-run features for now (torchrun's agent restarts failed
workers).
"""

from __future__ import annotations

import copy
import os
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from exonet.runtime.job import Job
from exonet.runtime.messages import NodeMessage
from exonet.runtime.pipeline import node_type
from exonet.runtime.record import RunRecord
from exonet.runtime.watchdog import Heartbeat

_fits = 0  # fits run in this process: each rendezvous under its own store prefix


def _store(rank: int, world: int, timeout_s: float) -> dist.Store:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT, as ``env://`` finds it, under a prefix of this fit's own.

    torchrun either hosts the store in its agent (``--standalone``) or has rank 0 host it
    (c10d rendezvous across hosts); rank 0's server is multi-tenant, so a later fit in the
    same process reuses it. Every rank runs the same fits in the same order, so the prefixes
    agree, and a second fit never meets the keys the first left behind (it hung in
    ``init_process_group`` without this).
    """
    global _fits
    _fits += 1
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=hosts,
                          timeout=timedelta(seconds=timeout_s), multi_tenant=True)
    return dist.PrefixStore(f"exonet-fit-{_fits}", store)


def _fit_id(store: dist.Store, rank: int) -> str:
    """A name no other fit has, the same on every rank: rank 0's pick, read through this fit's store.

    The object store's prefix needs it: torchrun's run id (in it already) is every fit's of the job, and
    "none" for any job started without ``--rdzv-id``, so a later fit would get the objects an earlier one
    left under the same keys (another fit's messages, or a size error when the shapes differ).
    """
    if rank == 0:
        store.set("fit-id", uuid.uuid4().hex[:12])
    return store.get("fit-id").decode()


def train_under_torchrun(job: Job, meta: dict[str, Any], progress: bool, logger: Any) -> tuple[RunRecord, float]:
    """Train this process's node, then gather every node's reports into one RunRecord."""
    cfg = job.cfg
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cfg.num_nodes != world:
        raise ValueError(f"fit: num_nodes={cfg.num_nodes} but torchrun started WORLD_SIZE={world} processes")
    if cfg.device_type == "cuda":  # one GPU per process: this host's LOCAL_RANK-th
        cfg = replace(cfg, devices=(int(os.environ.get("LOCAL_RANK", 0)),))
    messages: list[NodeMessage] = []
    t0 = time.perf_counter()
    store = _store(rank, world, cfg.timeout_s)
    if cfg.object_store is not None:  # this fit's objects in a folder of their own
        cfg = replace(cfg, object_store=f"{cfg.object_store}/fit-{_fit_id(store, rank)}")
    dist.init_process_group(cfg.backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout_s))
    try:
        node_type(cfg)(rank, cfg, copy.deepcopy(job.model), job.train_dataset, job.val_dataset,
                  copy.deepcopy(job.strategy), messages.append, Heartbeat(None, rank)).run()
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, messages)
    finally:
        dist.destroy_process_group()
    real_time = time.perf_counter() - t0
    record = RunRecord(world, cfg.max_steps, meta, progress=progress)
    record.logger = logger
    for node_messages in gathered:
        for msg in node_messages:
            record.handle(msg)
    record.close()
    return record, real_time
