"""LocalTrainer: validate a run, start K node processes, gather results, surface failures.

Nodes are started from a forkserver that has torch preloaded (torch is imported
once, not K times; the forkserver never touches CUDA, so CUDA stays safe).
Rendezvous uses a TCP store the parent opens on 127.0.0.1, port 0 (exonet.runtime.rendezvous),
so concurrent runs never collide and no other host can reach it. The parent watches every node:
the first failure (an exception, a death by signal, or no progress for ``progress_timeout_s``)
stops them all and raises NodeFailure naming the node; nothing is left running
(exonet.runtime.run, exonet.runtime.watchdog).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from exonet.estimate.pipeline import PipelineSpec
from exonet.runtime.batches import check_map_style, is_factory, resolve_dataset
from exonet.runtime.fit_config import configure, get_device
from exonet.runtime.fit_result import FitResult
from exonet.runtime.forkserver import complete_imports
from exonet.runtime.job import Job
from exonet.scenario import ScenarioLike
from exonet.strategies.base import Strategy
from exonet.strategies.gym_protocol import as_strategy

__all__ = ["LocalTrainer", "Trainer", "get_device"]


class LocalTrainer:
    """Train one model with K virtual nodes on this machine.

    Args:
        model: an ``nn.Module`` whose ``model(batch)`` returns a scalar loss.
        train_dataset: a ``Dataset`` (split across nodes) or a factory ``f(rank, num_nodes, train) -> Dataset``.
        val_dataset: the same kinds, or None.
        start_port: accepted for compatibility and ignored (rendezvous is race-free).
        device, devices: defaults for ``fit``'s arguments of the same names (the seed gym takes them here).
    """

    def __init__(self, model: torch.nn.Module, train_dataset: Any, val_dataset: Any = None,
                 start_port: int | None = None, device: str | None = None, devices: list[int] | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"LocalTrainer: model must be a torch.nn.Module, got {type(model).__name__}")
        for name, data in (("train_dataset", train_dataset), ("val_dataset", val_dataset)):
            if data is None and name == "val_dataset":
                continue
            if not is_factory(data):
                check_map_style(f"LocalTrainer: {name}", data)
        if start_port is not None:
            warnings.warn("LocalTrainer: start_port is ignored; exonet's rendezvous picks a free port itself",
                          stacklevel=2)
        self.model = model
        # A sharded dataset splits itself across nodes (exonet.data.S3Dataset: a block of whole shards each).
        split = getattr(train_dataset, "node_split", None)
        self.train_dataset = split if callable(split) else train_dataset
        self.val_dataset = val_dataset
        self.device, self.devices = device, devices

    def fit(
        self,
        strategy: Strategy | Any,
        num_nodes: int = 1,
        *,
        max_steps: int | None = None,
        num_epochs: int | None = None,
        batch_size: int = 16,
        minibatch_size: int | None = None,
        shuffle: bool = True,
        device: str | None = None,
        devices: list[int] | None = None,
        autocast: bool | str = False,
        val_interval: int = 100,
        val_size: int = 64,
        seed: int = 0,
        dataloader_kwargs: dict[str, Any] | None = None,
        count_flops: bool = True,
        profile: bool = False,
        progress: bool = True,
        run_dir: str | os.PathLike | None = None,
        scenario: ScenarioLike | None = None,
        max_sim_time_s: float | None = None,
        timeout_s: float = 1800.0,
        progress_timeout_s: float | None = 30.0,
        checkpoint_interval: int | None = None,
        resume_from: str | os.PathLike | None = None,
        follow_symlinks: bool = False,
        object_store: str | None = None,
        run_name: str | None = None,
        upload_to: str | None = None,
        wandb_project: str | None = None,
        wandb_run_name: str | None = None,
        on_divergence: str = "raise",
        divergence_factor: float = 10.0,
        pipeline: PipelineSpec | None = None,
        **legacy: Any,
    ) -> FitResult:
        """Run the training and return a FitResult.

        Args:
            strategy: how nodes communicate: an ``exonet.strategies.Strategy``, or an object with the seed gym's
                protocol (``_init_node``, ``step``, ``zero_grad``), whatever its base class, run as the gym ran it
                (``exonet.strategies.gym_protocol``).
            num_nodes: K, the number of node processes.
            max_steps: optimizer steps per node; with ``num_epochs`` the smaller wins.
            num_epochs: passes over each node's shard (default 1 when max_steps is None; with only
                ``max_sim_time_s``, as many as the budget holds).
            batch_size: per node, per step.
            minibatch_size: split each batch into micro-batches of this size (gradient accumulation).
            shuffle: deal each epoch's samples in a seeded random order (False: in order).
            device: "cpu", "cuda" or "mps"; auto-detected when None (or "", the older gym's default).
            devices: CUDA device indices to spread nodes over (default: all visible).
            autocast: False, True (bf16), "bf16" or "fp16".
            val_interval: evaluate at step 0, every this many steps and at the end (the seed gym's schedule);
                0 = never.
            val_size: validation samples per evaluation, a seeded random sample that is the same at every
                evaluation; 0 disables evaluation (the seed gym's meaning).
            seed: seeds model-side randomness and data order; same seed, same curves.
            dataloader_kwargs: further DataLoader arguments (``num_workers``, ``pin_memory``, ...); exonet sets
                the batch size, order and sampler itself.
            count_flops: count forward+backward FLOPs once, for FLOPs-based simulation.
            profile: run torch.profiler over every trainer's steps, on its own device; ``FitResult.profile``
                is rank 0's trace, for ``estimate(profile=...)`` (each gradient ready when it was measured).
            progress: draw a progress bar (in this process only).
            run_dir: create a run directory in this folder at the start of the run (config, metrics, trace,
                status, checkpoints; see exonet.rundir). ``save_dir`` is its seed-compatible alias.
            scenario: a scenario (name, path or Scenario) to simulate the run in at the end.
            max_sim_time_s: train until the simulated clock in ``scenario`` reaches this many seconds
                (``max_steps`` stays a cap): the run is replayed online as it trains, and step k starts
                only if step k−1 ended before the limit on its slowest node (exonet.runtime.clock). Needs a
                scenario whose ``compute.mode`` is "flops".
            timeout_s: a collective waiting longer than this fails the run.
            progress_timeout_s: a node that shows no progress for this long (computing, not waiting on a
                peer) fails the run, named; start-up may take max(120 s, 4x this). None disables the watchdog.
            checkpoint_interval: save a resumable checkpoint every this many steps under the run
                directory (needs ``run_dir``); see exonet.runtime.checkpoint for the layout.
            resume_from: a run directory with a checkpoint: continue that run (same arguments as the
                original fit), writing into that same directory. The result equals an uninterrupted run.
            follow_symlinks: with ``resume_from``, read through symbolic links in the run directory (a
                ``checkpoints/`` on another disk) instead of refusing them; only for a run directory you trust.
                The files a fit writes (metrics, trace, status, CSVs, run.lock, latest.json) are never links.
            object_store: where ``comm.put``/``comm.get`` keep their objects: None, a directory this fit makes and
                removes; or an ``s3://bucket/prefix`` URL (the ``s3`` extra), under a prefix of the fit's own, which
                nodes on several hosts (torchrun) share.
            run_name: names the run: its folder is ``<time>-<run_name>``, it is the default wandb run
                name, and the gym's ``train.csv``/``validation.csv`` also go to ``logs/<run_name>/`` (the
                seed gym's spelling and place).
            upload_to: an ``s3://bucket/prefix`` URL: copy the finished run directory there (needs
                ``run_dir`` and the ``s3`` extra).
            wandb_project: log config, losses, evaluations and (with ``scenario``) simulated time to
                this Weights & Biases project, from this process only (needs the ``wandb`` extra).
            wandb_run_name: the wandb run's name (default: ``run_name``).
            on_divergence: what a non-finite or runaway training loss does (exonet.runtime.divergence):
                "raise" stops the run with DivergenceError naming the rank and step, "warn" warns once per
                rank with its step and goes on, "ignore" trains on silently.
            divergence_factor: a loss above this many times a rank's first loss is runaway.
            pipeline: cut the model (an ``exonet.Staged``) into ``pipeline.stages`` stages on different nodes;
                ``num_nodes`` is stages × replicas, and the strategy keeps each stage's replicas in step
                (``exonet.runtime.pipeline``).
            **legacy: the seed gym's ``save_dir`` (alias of ``run_dir``), ``kwargs`` (a dict recorded in the
                run's config, as the gym recorded it) and ``log_x_axis`` ("step" or "examples", wandb's x-axis);
                its ``correlation_interval`` is accepted and ignored with a warning (exonet measures correlation
                at every evaluation).
        """
        called = time.monotonic()
        args = {name: value for name, value in locals().items() if name not in ("self", "strategy", "legacy")}
        complete_imports()  # what fit imports on its way, whole: Ctrl-C now cannot leave half a package behind
        imported = time.monotonic()
        args["device"] = device if device is not None else self.device
        args["devices"] = devices if devices is not None else self.devices
        strategy = as_strategy(strategy)  # an object with the seed gym's protocol runs as the gym ran it
        plan = configure(strategy, args, legacy, self._shard_len, has_val=self.val_dataset is not None,
                         model=self.model)
        if plan.node.pipeline is not None:  # a stage that cannot take the last one's output fails here, not in a node
            from exonet.runtime.pipeline import Staged, check_chain

            assert isinstance(self.model, Staged)  # configure checked it
            check_chain(self.model, plan.node.pipeline, self._sample(plan.node.num_nodes // plan.node.pipeline.stages))
        from exonet.runtime.run import launch

        job = Job(self.model, self.train_dataset, self.val_dataset, strategy, plan.node)
        configured = time.monotonic()
        result = launch(job, plan)
        marks = {"imported": imported, "configured": configured, **result.startup}
        result.startup = {part: at - called for part, at in marks.items()}
        if plan.node.profile_dir is not None:
            result.profile = Path(plan.node.profile_dir) / "rank0.json"
        return result

    def _sample(self, k: int) -> Any:
        """The first training sample of node 0's shard (of k), as a batch of one."""
        from torch.utils.data import default_collate

        return default_collate([resolve_dataset(self.train_dataset, 0, k, True)[0]])

    def _shard_len(self, k: int) -> int:
        """A node's share of the training data with k nodes."""
        data = self.train_dataset
        if is_factory(data):
            return len(resolve_dataset(data, 0, k, True))
        return len(data) // k


Trainer = LocalTrainer
