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

import difflib
import inspect
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from exonet.arguments import check_int, check_range, one_of
from exonet.files import check_output
from exonet.fit_result import FitResult
from exonet.runtime.forkserver import complete_imports
from exonet.runtime.job import Job
from exonet.runtime.node import NodeConfig, check_map_style, is_factory, resolve_dataset
from exonet.strategies.base import Strategy

DEVICES = ("cpu", "cuda", "mps")
AUTOCAST = {True: "bfloat16", "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
# DataLoader arguments exonet sets itself: the batch order must stay a pure function of (seed, rank, epoch).
# The seed gym's fit arguments that have no meaning here, and why.
IGNORED = {"correlation_interval": "exonet measures the nodes' correlation at every evaluation"}
# The seed gym's fit arguments that exonet honours under the gym's names (its ``**kwargs``).
GYM_EXTRAS = ("save_dir", "kwargs", "log_x_axis")
DEFAULT_VAL_INTERVAL = 100  # the seed gym's; set with no val_dataset it is not a request worth a warning
# A time budget without max_steps/num_epochs trains over as many epochs as the budget holds, up to this cap.
TIME_BUDGET_STEPS = 10**9
RESERVED_LOADER_ARGS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")
SEED_LIMIT = 2**63  # torch seeds generators with 64-bit integers, and epochs are added to the seed
MAX_TIMEOUT_S = 1e12  # torch.distributed takes the timeout as a timedelta, which holds less than 8.64e13 s


def _check_loader_args(kwargs: Any) -> dict[str, Any]:
    """``dataloader_kwargs`` checked here, in the parent, against DataLoader's own arguments and values, so that a
    misspelt key is named before any node starts (not as a node's traceback)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"fit: dataloader_kwargs must be a dict of DataLoader arguments, got {type(kwargs).__name__}")
    clash = sorted(set(kwargs) & set(RESERVED_LOADER_ARGS))
    if clash:
        raise ValueError(f"fit: dataloader_kwargs may not set {', '.join(clash)}: exonet sets "
                         f"{', '.join(RESERVED_LOADER_ARGS)} itself (use batch_size, shuffle and seed)")
    known = [n for n in inspect.signature(DataLoader).parameters if n not in RESERVED_LOADER_ARGS]
    for name in kwargs:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            raise TypeError(f"fit: dataloader_kwargs: DataLoader takes no argument {name!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else f"; it takes {', '.join(known)}"))
    try:
        DataLoader([0], batch_size=1, **kwargs)  # its own checks of the values; no worker starts before iterating
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"fit: dataloader_kwargs: {exc}") from None
    return dict(kwargs)


def get_device() -> str:
    """The best device on this machine: "cuda", else "mps", else "cpu" (the seed gym's ``get_device``)."""
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"


def _gym_extras(legacy: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The seed gym's ``kwargs`` (extra configuration, recorded with the run) and ``log_x_axis``, checked."""
    extra = legacy.get("kwargs")
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"fit: kwargs must be a dict of extra configuration (the seed gym's), "
                        f"got {type(extra).__name__}")
    x_axis = legacy.get("log_x_axis", "step")
    if x_axis not in ("step", "examples"):
        raise ValueError(f"fit: log_x_axis must be 'step' or 'examples', got {x_axis!r}")
    return ({str(k): v if isinstance(v, (str, int, float, bool, type(None))) else repr(v) for k, v in extra.items()}
            if extra is not None else None), x_axis


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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
        strategy: Strategy,
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
        scenario: Any = None,
        max_sim_time_s: float | None = None,
        timeout_s: float = 1800.0,
        progress_timeout_s: float | None = 30.0,
        checkpoint_interval: int | None = None,
        resume_from: str | os.PathLike | None = None,
        run_name: str | None = None,
        upload_to: str | None = None,
        wandb_project: str | None = None,
        wandb_run_name: str | None = None,
        on_divergence: str = "raise",
        divergence_factor: float = 10.0,
        **legacy: Any,
    ) -> FitResult:
        """Run the training and return a FitResult.

        Args:
            strategy: how nodes communicate (a ``exonet.strategies.Strategy``).
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
            **legacy: the seed gym's ``save_dir`` (alias of ``run_dir``), ``kwargs`` (a dict recorded in the
                run's config, as the gym recorded it) and ``log_x_axis`` ("step" or "examples", wandb's x-axis);
                its ``correlation_interval`` is accepted and ignored with a warning (exonet measures correlation
                at every evaluation).
        """
        complete_imports()  # what fit imports on its way, whole: Ctrl-C now cannot leave half a package behind
        if run_name is not None and (not isinstance(run_name, str) or not run_name or "/" in run_name
                                     or "\\" in run_name or run_name.startswith(".")):
            raise ValueError(f"fit: run_name must be a non-empty folder name (no path separators), got {run_name!r}")
        if upload_to is not None:
            from exonet.storage import parse_s3_url

            parse_s3_url(upload_to)
            if run_dir is None and legacy.get("save_dir") is None and resume_from is None:
                raise ValueError("fit: upload_to copies the run directory, so it needs run_dir")
        unknown = set(legacy) - {*GYM_EXTRAS, *IGNORED}
        if unknown:
            known = [n for n in inspect.signature(LocalTrainer.fit).parameters if n not in ("self", "legacy")]
            hints = [f"{n} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(n, known, n=1))
                     else n for n in sorted(unknown)]
            raise TypeError(f"fit: unexpected argument(s) {', '.join(hints)}")
        for name in sorted(set(legacy) & set(IGNORED)):
            warnings.warn(f"fit: {name} is ignored: {IGNORED[name]}", stacklevel=2)
        extra_config, x_axis = _gym_extras(legacy)
        if not isinstance(strategy, Strategy):
            raise TypeError("fit: strategy must be an exonet.strategies.Strategy instance, "
                            f"got {type(strategy).__name__}")
        if not hasattr(strategy, "optim_spec"):  # set by Strategy.__init__ alone
            raise TypeError(f"fit: {type(strategy).__name__}.__init__ did not call super().__init__(...): the base "
                            f"Strategy sets the optimizer, clipping and schedule there")
        k = check_int("fit: num_nodes", num_nodes, low=1)
        strategy.check_world(k)
        batch_size = check_int("fit: batch_size", batch_size, low=1)
        minibatch = batch_size if minibatch_size is None else check_int("fit: minibatch_size", minibatch_size, low=1)
        if minibatch > batch_size:
            raise ValueError(f"fit: minibatch_size ({minibatch}) must be <= batch_size ({batch_size})")
        check_int("fit: val_interval", val_interval or 0, low=0)
        if val_interval and val_interval != DEFAULT_VAL_INTERVAL and self.val_dataset is None:
            warnings.warn(f"fit: val_interval={val_interval} but this LocalTrainer has no val_dataset, so nothing is "
                          f"evaluated; pass one as LocalTrainer(model, train_dataset, val_dataset)", stacklevel=2)
        check_int("fit: val_size", val_size, low=0)
        check_int("fit: seed", seed, low=0)
        if seed >= SEED_LIMIT:
            raise ValueError(f"fit: seed must be below 2**63 (torch seeds with 64-bit integers), got {seed}")
        device_type, backend, device_ids = self._resolve_device(device if device is not None else self.device,
                                                                devices if devices is not None else self.devices, k)
        if autocast not in (False, None) and autocast not in AUTOCAST:
            raise ValueError(f"fit: autocast must be False, True, 'bf16' or 'fp16', got {autocast!r}")
        steps = self._resolve_steps(max_steps, num_epochs, k, batch_size)
        if max_sim_time_s is not None and max_steps is None and num_epochs is None:
            steps = TIME_BUDGET_STEPS  # the budget ends the run; the data goes round for further epochs
        dataloader_kwargs = _check_loader_args(dataloader_kwargs)
        if progress_timeout_s is not None:
            check_range("fit: progress_timeout_s", progress_timeout_s, low=0, low_open=True)
        check_range("fit: timeout_s", timeout_s, low=0, low_open=True, high=MAX_TIMEOUT_S)
        for name, flag in (("shuffle", shuffle), ("count_flops", count_flops), ("profile", profile),
                           ("progress", progress)):
            if not isinstance(flag, bool):  # "no" is truthy: a string would silently mean True
                raise TypeError(f"fit: {name} must be True or False, got {flag!r}")
        run_dir = one_of(run_dir=run_dir, save_dir=legacy.get("save_dir"))
        if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
            raise ValueError(f"fit: run_dir must be a folder (runs are created inside it), got the file {run_dir!r}")
        if run_dir is not None:
            check_output(run_dir, "fit: run_dir", folder=True)
        if checkpoint_interval is not None:
            check_int("fit: checkpoint_interval", checkpoint_interval, low=1)
            if run_dir is None and resume_from is None:
                raise ValueError("fit: checkpoint_interval needs run_dir (the folder in which checkpoints are saved)")
        if resume_from is not None:
            if run_dir is not None:
                raise ValueError("fit: pass either run_dir or resume_from: a resumed run continues in its own "
                                 "run directory")
            if not os.path.isdir(resume_from):
                raise ValueError(f"fit: resume_from must be an existing run directory, got {resume_from!r}")
        servers = getattr(strategy, "servers", 0)
        if servers and not callable(getattr(strategy, "serve", None)):
            raise TypeError(f"strategy: {type(strategy).__name__} declares servers = {servers} but has no serve(); "
                            "subclass exonet.strategies.server.ServerStrategy")
        if max_sim_time_s is not None:
            check_range("fit: max_sim_time_s", max_sim_time_s, low=0, low_open=True)
            if scenario is None:
                raise ValueError("fit: max_sim_time_s is simulated time in a scenario: pass scenario= too")
        if max_sim_time_s is not None or getattr(strategy, "asynchronous", False):
            what = "max_sim_time_s" if max_sim_time_s is not None else f"{type(strategy).__name__} (asynchronous)"
            if scenario is None:
                raise ValueError(f"fit: {what} runs on the simulated clock, which decides what each node hears "
                                 f"and when (arrivals, deadlines, failures): pass scenario= too")
            if resume_from is not None or checkpoint_interval or not count_flops:
                raise ValueError(f"fit: {what} needs count_flops=True and cannot checkpoint or resume a run yet")

        from exonet.runtime.divergence import DivergenceWatch

        watch = DivergenceWatch(on_divergence, divergence_factor)
        cfg = NodeConfig(
            num_nodes=k, max_steps=steps, batch_size=batch_size, minibatch_size=minibatch, device_type=device_type,
            devices=device_ids, backend=backend, seed=seed, shuffle=shuffle,
            autocast=AUTOCAST[autocast] if autocast not in (False, None) else None,
            val_interval=(val_interval or 0) if val_size else 0, val_size=val_size, threads=max(1, _cores() // k),
            count_flops=count_flops, dataloader_kwargs=dataloader_kwargs, parent_pid=os.getpid(),
            timeout_s=timeout_s, checkpoint_interval=checkpoint_interval or 0,
            max_sim_time_s=None if max_sim_time_s is None else float(max_sim_time_s), servers=servers,
            profile_dir=tempfile.mkdtemp(prefix="exonet-profile-") if profile else None,
        )
        from exonet.runtime.run import launch

        job = Job(self.model, self.train_dataset, self.val_dataset, strategy, cfg)
        result = launch(job, progress=progress, scenario=scenario, run_dir=run_dir,
                        progress_timeout_s=progress_timeout_s, resume_from=resume_from,
                        wandb_project=wandb_project, wandb_run_name=wandb_run_name or run_name, run_name=run_name,
                        upload_to=upload_to, watch=watch, extra_config=extra_config, x_axis=x_axis)
        if cfg.profile_dir is not None:
            result.profile = Path(cfg.profile_dir) / "rank0.json"
        return result

    # ------------------------------------------------------------ resolution
    @staticmethod
    def _resolve_device(device: str | None, devices: list[int] | None,
                        k: int) -> tuple[str, str, tuple[int, ...] | None]:
        if device is None or device == "":  # "" is the older gym's default: auto-detect, as it did
            device = get_device()
        if device not in DEVICES:
            raise ValueError(f"fit: device must be one of {', '.join(DEVICES)} "
                             f"(or None to auto-detect), got {device!r}")
        if device == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("fit: device='cuda' but CUDA is not available on this machine")
            ids = tuple(devices) if devices else tuple(range(torch.cuda.device_count()))
            bad = [i for i in ids if not 0 <= i < torch.cuda.device_count()]
            if bad:
                raise ValueError(f"fit: devices {bad} do not exist (this machine has {torch.cuda.device_count()} GPUs)")
            backend = "nccl" if len(set(ids)) >= k and dist.is_nccl_available() else "gloo"
            return device, backend, ids
        if devices:
            raise ValueError(f"fit: devices is only meaningful with device='cuda', got devices={devices!r}")
        if device == "mps" and not torch.backends.mps.is_available():
            raise ValueError("fit: device='mps' but MPS is not available on this machine")
        return device, "gloo", None

    def _resolve_steps(self, max_steps: int | None, num_epochs: int | None, k: int, batch_size: int) -> int:
        shard = self._shard_len(k)
        per_epoch = shard // batch_size
        if per_epoch < 1:
            raise ValueError(f"fit: train_dataset gives each of the {k} nodes {shard} samples, fewer than one batch "
                             f"(batch_size={batch_size}); use a smaller batch_size or fewer nodes")
        if max_steps is not None:
            check_int("fit: max_steps", max_steps, low=1)
        if num_epochs is not None:
            check_int("fit: num_epochs", num_epochs, low=1)
        by_epochs = per_epoch * num_epochs if num_epochs is not None else None
        if max_steps is None:
            return by_epochs if by_epochs is not None else per_epoch
        if by_epochs is not None and by_epochs < max_steps:
            warnings.warn(f"fit: num_epochs={num_epochs} ends the run after {by_epochs} steps, before "
                          f"max_steps={max_steps} ({per_epoch} batches of {batch_size} per node per epoch); the seed "
                          "gym ignored num_epochs when max_steps was given: drop num_epochs to train max_steps",
                          stacklevel=3)
        return max_steps if by_epochs is None else min(max_steps, by_epochs)

    def _shard_len(self, k: int) -> int:
        data = self.train_dataset
        if is_factory(data):
            return len(resolve_dataset(data, 0, k, True))
        return len(data) // k


Trainer = LocalTrainer
