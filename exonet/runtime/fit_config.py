"""``fit``'s arguments, checked in the parent, into the node's configuration.

Every check runs before any node starts, so a bad argument is one clear error naming it (not a
node's traceback minutes in). ``configure`` is the one entry: it takes ``fit``'s arguments as given
and returns a ``FitPlan``: the ``NodeConfig`` every node receives, plus what the parent alone uses
(the run folder, the divergence watch, the seed gym's extras). Each group of checks is its own function.
"""

from __future__ import annotations

import difflib
import inspect
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from exonet.arguments import check_int, check_range, one_of
from exonet.estimate.pipeline import PipelineSpec
from exonet.files import check_output
from exonet.runtime.divergence import DivergenceWatch
from exonet.runtime.node import NodeConfig
from exonet.scenario import Scenario
from exonet.strategies.base import Strategy

DEVICES = ("cpu", "cuda", "mps")
AUTOCAST = {True: "bfloat16", "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
# The seed gym's fit arguments that have no meaning here, and why.
IGNORED = {"correlation_interval": "exonet measures the nodes' correlation at every evaluation"}
# The seed gym's fit arguments that exonet honours under the gym's names (its ``**kwargs``).
GYM_EXTRAS = ("save_dir", "kwargs", "log_x_axis")
DEFAULT_VAL_INTERVAL = 100  # the seed gym's; set with no val_dataset it is not a request worth a warning
# A time budget without max_steps/num_epochs trains over as many epochs as the budget holds, up to this cap.
TIME_BUDGET_STEPS = 10**9
# DataLoader arguments exonet sets itself: the batch order must stay a pure function of (seed, rank, epoch).
RESERVED_LOADER_ARGS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")
SEED_LIMIT = 2**63  # torch seeds generators with 64-bit integers, and epochs are added to the seed
MAX_TIMEOUT_S = 1e12  # torch.distributed takes the timeout as a timedelta, which holds less than 8.64e13 s
# Warnings name the line that called fit: fit → configure → a check → warnings.warn.
CALLER = 4


@dataclass(frozen=True)
class FitPlan:
    """A checked ``fit``: what every node runs (``node``) and everything the parent does with the run, so that
    ``launch`` takes one value (the scenario coerced here, once; the seed gym's ``kwargs`` as ``extra_config``;
    ``x_axis`` wandb's; ``watch`` the divergence watch)."""

    node: NodeConfig
    run_dir: str | os.PathLike | None
    watch: DivergenceWatch
    extra_config: dict[str, Any] | None
    x_axis: str
    scenario: Scenario | None = None
    progress: bool = True
    progress_timeout_s: float | None = 30.0
    resume_from: str | os.PathLike | None = None
    run_name: str | None = None
    wandb_project: str | None = None
    wandb_run_name: str | None = None
    upload_to: str | None = None
    follow_symlinks: bool = False
    object_store: str | None = None


def _object_store(url: Any) -> str | None:
    """``fit(object_store=)``: None (a directory this fit makes) or an ``s3://bucket/prefix`` URL."""
    if url is None:
        return None
    from exonet.runtime.storage import parse_s3_url

    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"fit: object_store must be None or an s3://bucket/prefix URL, got {url!r}")
    parse_s3_url(url)
    return url


def get_device() -> str:
    """The best device on this machine: "cuda", else "mps", else "cpu" (the seed gym's ``get_device``)."""
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"


def configure(strategy: Strategy, args: dict[str, Any], legacy: dict[str, Any], shard_len: Callable[[int], int],
              has_val: bool, model: torch.nn.Module | None = None) -> FitPlan:
    """Check ``fit``'s arguments (``args``, by name; ``legacy``, its ``**kwargs``) and resolve them.

    ``shard_len(k)`` is a node's share of the training data with k nodes; ``has_val`` whether there is
    validation data; ``model`` the model (a pipeline checks it can be cut). Raises TypeError/ValueError naming the
    argument at the first bad one.
    """
    _check_names(args, legacy)
    extra_config, x_axis = _check_gym_arguments(legacy, ["strategy", *args])
    k, servers = _check_strategy(strategy, args["num_nodes"])
    batch_size, minibatch = _check_batches(args["batch_size"], args["minibatch_size"])
    _check_evaluation(args["val_interval"], args["val_size"], has_val)
    seed = check_int("fit: seed", args["seed"], low=0)
    if seed >= SEED_LIMIT:
        raise ValueError(f"fit: seed must be below 2**63 (torch seeds with 64-bit integers), got {seed}")
    device_type, backend, device_ids = resolve_device(args["device"], args["devices"], k)
    autocast = args["autocast"]
    if autocast not in (False, None) and autocast not in AUTOCAST:
        raise ValueError(f"fit: autocast must be False, True, 'bf16' or 'fp16', got {autocast!r}")
    pipeline = _check_pipeline(args["pipeline"], model, strategy, k, batch_size, args["minibatch_size"])
    readers = k if pipeline is None else k // pipeline.stages  # a pipeline's stages read their replica's shard
    steps = resolve_steps(args["max_steps"], args["num_epochs"], shard_len(readers), batch_size, readers)
    if args["max_sim_time_s"] is not None and args["max_steps"] is None and args["num_epochs"] is None:
        steps = TIME_BUDGET_STEPS  # the budget ends the run; the data goes round for further epochs
    loader_args = check_loader_args(args["dataloader_kwargs"])
    _check_times_and_flags(args)
    run_dir = _check_run_folders(args, legacy)
    _check_clock(strategy, args)
    val_interval = args["val_interval"]
    node = NodeConfig(
        num_nodes=k, max_steps=steps, batch_size=batch_size, minibatch_size=minibatch, device_type=device_type,
        devices=device_ids, backend=backend, seed=seed, shuffle=args["shuffle"],
        autocast=AUTOCAST[autocast] if autocast not in (False, None) else None,
        val_interval=(val_interval or 0) if args["val_size"] else 0, val_size=args["val_size"],
        threads=max(1, _cores() // k), count_flops=args["count_flops"], dataloader_kwargs=loader_args,
        parent_pid=os.getpid(), timeout_s=args["timeout_s"], checkpoint_interval=args["checkpoint_interval"] or 0,
        max_sim_time_s=None if args["max_sim_time_s"] is None else float(args["max_sim_time_s"]), servers=servers,
        profile_dir=tempfile.mkdtemp(prefix="exonet-profile-") if args["profile"] else None, pipeline=pipeline,
    )
    return FitPlan(node, run_dir, DivergenceWatch(args["on_divergence"], args["divergence_factor"]), extra_config,
                   x_axis, None if args["scenario"] is None else Scenario.coerce(args["scenario"]), args["progress"],
                   args["progress_timeout_s"], args["resume_from"], args["run_name"], args["wandb_project"],
                   args["wandb_run_name"] or args["run_name"], args["upload_to"], args["follow_symlinks"],
                   _object_store(args["object_store"]))


def _check_gym_arguments(legacy: dict[str, Any], known: list[str]) -> tuple[dict[str, Any] | None, str]:
    """The seed gym's extra arguments: unknown ones are errors with a "did you mean" among ``known`` (fit's own),
    ignored ones warn, and its ``kwargs`` (extra configuration, recorded with the run) and ``log_x_axis`` are
    checked."""
    unknown = set(legacy) - {*GYM_EXTRAS, *IGNORED}
    if unknown:
        hints = [f"{n} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(n, known, n=1))
                 else n for n in sorted(unknown)]
        raise TypeError(f"fit: unexpected argument(s) {', '.join(hints)}")
    for name in sorted(set(legacy) & set(IGNORED)):
        warnings.warn(f"fit: {name} is ignored: {IGNORED[name]}", stacklevel=CALLER)
    extra = legacy.get("kwargs")
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"fit: kwargs must be a dict of extra configuration (the seed gym's), "
                        f"got {type(extra).__name__}")
    x_axis = legacy.get("log_x_axis", "step")
    if x_axis not in ("step", "examples"):
        raise ValueError(f"fit: log_x_axis must be 'step' or 'examples', got {x_axis!r}")
    return ({str(k): v if isinstance(v, (str, int, float, bool, type(None))) else repr(v) for k, v in extra.items()}
            if extra is not None else None), x_axis


def _check_names(args: dict[str, Any], legacy: dict[str, Any]) -> None:
    """``run_name`` is a folder name; ``upload_to`` an S3 URL with a run directory to copy."""
    run_name = args["run_name"]
    if run_name is not None and (not isinstance(run_name, str) or not run_name or "/" in run_name
                                 or "\\" in run_name or run_name.startswith(".")):
        raise ValueError(f"fit: run_name must be a non-empty folder name (no path separators), got {run_name!r}")
    if args["upload_to"] is not None:
        from exonet.runtime.storage import parse_s3_url

        parse_s3_url(args["upload_to"])
        if args["run_dir"] is None and legacy.get("save_dir") is None and args["resume_from"] is None:
            raise ValueError("fit: upload_to copies the run directory, so it needs run_dir")


def _check_strategy(strategy: Strategy, num_nodes: Any) -> tuple[int, int]:
    """A built Strategy that works with ``num_nodes`` nodes; returns that number and the server ranks it adds."""
    if not isinstance(strategy, Strategy):
        raise TypeError("fit: strategy must be an exonet.strategies.Strategy instance, "
                        f"got {type(strategy).__name__}")
    if not hasattr(strategy, "optim_spec"):  # set by Strategy.__init__ alone
        raise TypeError(f"fit: {type(strategy).__name__}.__init__ did not call super().__init__(...): the base "
                        f"Strategy sets the optimizer, clipping and schedule there")
    k = check_int("fit: num_nodes", num_nodes, low=1)
    strategy.check_world(k)
    servers = strategy.servers
    if servers and type(strategy).serve is Strategy.serve:
        raise TypeError(f"strategy: {type(strategy).__name__} declares servers = {servers} but has no serve(); "
                        "subclass exonet.strategies.server.ServerStrategy")
    return k, servers


def _check_batches(batch_size: Any, minibatch_size: Any) -> tuple[int, int]:
    batch = check_int("fit: batch_size", batch_size, low=1)
    minibatch = batch if minibatch_size is None else check_int("fit: minibatch_size", minibatch_size, low=1)
    if minibatch > batch:
        raise ValueError(f"fit: minibatch_size ({minibatch}) must be <= batch_size ({batch})")
    return batch, minibatch


def _check_pipeline(pipeline: Any, model: torch.nn.Module | None, strategy: Strategy, k: int, batch_size: int,
                    minibatch_size: Any) -> PipelineSpec | None:
    """``fit(pipeline=)``: a PipelineSpec over a ``Staged`` model, its stages dividing the nodes and its
    micro-batches the batch, with a strategy that trains every stage's replicas in step."""
    if pipeline is None:
        return None
    from exonet.runtime.pipeline import Staged, stage_bounds

    if not isinstance(pipeline, PipelineSpec):
        raise TypeError(f"fit: pipeline must be an exonet.PipelineSpec, got {type(pipeline).__name__}")
    if not isinstance(model, Staged):
        raise TypeError(f"fit: pipeline= cuts an exonet.Staged(layers, loss) model, got {type(model).__name__}; "
                        "wrap the model's layers and its loss in one")
    for s, (start, end) in enumerate(stage_bounds(model, pipeline)):
        if not any(p.requires_grad for p in model.layers[start:end].parameters()):
            raise ValueError(f"fit: pipeline stage {s} (layers {start}..{end - 1}) has no trainable parameters; give "
                             "PipelineSpec(cuts=...) that put some in every stage, or fewer stages")
    if k % pipeline.stages:
        raise ValueError(f"fit: num_nodes={k} is not a multiple of pipeline.stages={pipeline.stages}: the nodes are "
                         "replicas of the whole pipeline")
    if batch_size % pipeline.micro_batches:
        raise ValueError(f"fit: batch_size={batch_size} does not divide into pipeline.micro_batches="
                         f"{pipeline.micro_batches} equal micro-batches")
    if minibatch_size is not None:
        raise ValueError("fit: minibatch_size splits a batch for gradient accumulation; under a pipeline, "
                         "pipeline.micro_batches does that")
    if strategy.servers or strategy.asynchronous or strategy.elastic:
        raise ValueError(f"fit: a pipeline's stage replicas train in step; {type(strategy).__name__} (with servers, "
                         "asynchronous or elastic) cannot keep them")
    return pipeline


def _check_evaluation(val_interval: Any, val_size: Any, has_val: bool) -> None:
    check_int("fit: val_interval", val_interval or 0, low=0)
    if val_interval and val_interval != DEFAULT_VAL_INTERVAL and not has_val:
        warnings.warn(f"fit: val_interval={val_interval} but this LocalTrainer has no val_dataset, so nothing is "
                      f"evaluated; pass one as LocalTrainer(model, train_dataset, val_dataset)", stacklevel=CALLER)
    check_int("fit: val_size", val_size, low=0)


def _check_times_and_flags(args: dict[str, Any]) -> None:
    if args["progress_timeout_s"] is not None:
        check_range("fit: progress_timeout_s", args["progress_timeout_s"], low=0, low_open=True)
    check_range("fit: timeout_s", args["timeout_s"], low=0, low_open=True, high=MAX_TIMEOUT_S)
    for name in ("shuffle", "count_flops", "profile", "progress", "follow_symlinks"):
        if not isinstance(args[name], bool):  # "no" is truthy: a string would silently mean True
            raise TypeError(f"fit: {name} must be True or False, got {args[name]!r}")


def _check_run_folders(args: dict[str, Any], legacy: dict[str, Any]) -> str | os.PathLike | None:
    """The run directory (``run_dir`` or the gym's ``save_dir``), checkpoints and resumption; returns the folder."""
    run_dir = one_of(run_dir=args["run_dir"], save_dir=legacy.get("save_dir"))
    resume_from = args["resume_from"]
    if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ValueError(f"fit: run_dir must be a folder (runs are created inside it), got the file {run_dir!r}")
    if run_dir is not None:
        check_output(run_dir, "fit: run_dir", folder=True)
    if args["checkpoint_interval"] is not None:
        check_int("fit: checkpoint_interval", args["checkpoint_interval"], low=1)
        if run_dir is None and resume_from is None:
            raise ValueError("fit: checkpoint_interval needs run_dir (the folder in which checkpoints are saved)")
    if resume_from is not None:
        if run_dir is not None:
            raise ValueError("fit: pass either run_dir or resume_from: a resumed run continues in its own "
                             "run directory")
        if not os.path.isdir(resume_from):
            raise ValueError(f"fit: resume_from must be an existing run directory, got {resume_from!r}")
    return run_dir


def _check_clock(strategy: Strategy, args: dict[str, Any]) -> None:
    """A time budget or an asynchronous strategy runs on the simulated clock: it needs a scenario."""
    max_sim_time_s, scenario = args["max_sim_time_s"], args["scenario"]
    if max_sim_time_s is not None:
        check_range("fit: max_sim_time_s", max_sim_time_s, low=0, low_open=True)
        if scenario is None:
            raise ValueError("fit: max_sim_time_s is simulated time in a scenario: pass scenario= too")
    if max_sim_time_s is not None or strategy.asynchronous:
        what = "max_sim_time_s" if max_sim_time_s is not None else f"{type(strategy).__name__} (asynchronous)"
        if scenario is None:
            raise ValueError(f"fit: {what} runs on the simulated clock, which decides what each node hears "
                             f"and when (arrivals, deadlines, failures): pass scenario= too")
        if args["resume_from"] is not None or args["checkpoint_interval"] or not args["count_flops"]:
            raise ValueError(f"fit: {what} needs count_flops=True and cannot checkpoint or resume a run yet")


def check_loader_args(kwargs: Any) -> dict[str, Any]:
    """``dataloader_kwargs`` checked against DataLoader's own arguments and values, so that a misspelt key is
    named before any node starts (not as a node's traceback)."""
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
        # DataLoader's own checks of the values (no worker starts before iterating; torch's stubs want a Dataset)
        DataLoader([0], batch_size=1, **kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"fit: dataloader_kwargs: {exc}") from None
    return dict(kwargs)


def resolve_device(device: str | None, devices: list[int] | None, k: int) -> tuple[str, str, tuple[int, ...] | None]:
    """(device type, backend, CUDA device ids) for k nodes; None or "" (the older gym's default) auto-detects."""
    if device is None or device == "":
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


def resolve_steps(max_steps: int | None, num_epochs: int | None, shard: int, batch_size: int, k: int) -> int:
    """Steps per node: ``max_steps``, ``num_epochs`` passes over a node's ``shard`` samples, or the smaller."""
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
                      stacklevel=CALLER)
    return max_steps if by_epochs is None else min(max_steps, by_epochs)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
