"""Bad input gets a clear error naming the argument, field or file and what was expected.

Scenario files are covered in tests/test_scenario.py and tests/test_scenario_inputs.py; strategy-specific
hyperparameters beside each strategy. Here: fit, LocalTrainer, the Strategy base, OptimSpec, Trace, and
run-directory artifacts.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from exonet import LocalTrainer, NodeFailure, Trace, TraceError
from exonet.rundir import load_run
from exonet.runtime.testing import BadLossModel
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

DATA = synthetic_classification(64, dim=8, classes=4)


def fit(model: torch.nn.Module | None = None, train: Any = DATA, strategy: Any = None, **kwargs: Any) -> Any:
    trainer = LocalTrainer(model if model is not None else tiny_mlp(), train)
    return trainer.fit(strategy if strategy is not None else DDPStrategy(), progress=False,
                       **{"num_nodes": 2, "max_steps": 2, "batch_size": 8, **kwargs})


class Stream(IterableDataset):
    """Samples by iteration only: they cannot be dealt to nodes by index."""

    def __iter__(self):
        return iter(DATA)


class LockHolder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_mlp()
        self.inner.lock = threading.Lock()

    def forward(self, batch: Any) -> torch.Tensor:
        return self.inner(batch)


class OpenFileDataset(Dataset):
    def __init__(self, path: Path) -> None:
        self.log = open(path, "w")  # noqa: SIM115 - the point is an open handle

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return DATA[i]


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
NO_MPS = pytest.mark.skipif(torch.backends.mps.is_available(), reason="needs a machine without MPS")

# (id, call, error type, regex the message must match)
CASES: list[Any] = [
    # fit: counts and sizes
    ("num_nodes=0", lambda: fit(num_nodes=0), ValueError, r"num_nodes must be >= 1, got 0"),
    ("num_nodes<0", lambda: fit(num_nodes=-3), ValueError, r"num_nodes must be >= 1, got -3"),
    ("num_nodes float", lambda: fit(num_nodes=2.0), TypeError, r"num_nodes must be an integer, got 2.0"),
    ("num_nodes str", lambda: fit(num_nodes="2"), TypeError, r"num_nodes must be an integer, got '2'"),
    ("num_nodes bool", lambda: fit(num_nodes=True), TypeError, r"num_nodes must be an integer, got True"),
    ("batch_size=0", lambda: fit(batch_size=0), ValueError, r"batch_size must be >= 1, got 0"),
    ("batch_size float", lambda: fit(batch_size=8.5), TypeError, r"batch_size must be an integer"),
    ("minibatch>batch", lambda: fit(minibatch_size=16), ValueError,
     r"minibatch_size \(16\) must be <= batch_size \(8\)"),
    ("minibatch=0", lambda: fit(minibatch_size=0), ValueError, r"minibatch_size must be >= 1"),
    ("max_steps=0", lambda: fit(max_steps=0), ValueError, r"max_steps must be >= 1, got 0"),
    ("max_steps str", lambda: fit(max_steps="10"), TypeError, r"max_steps must be an integer"),
    ("num_epochs=0", lambda: fit(max_steps=None, num_epochs=0), ValueError, r"num_epochs must be >= 1"),
    ("dataset < one batch per node", lambda: fit(batch_size=64), ValueError,
     r"train_dataset gives each of the 2 nodes 32 samples, fewer than one batch \(batch_size=64\)"),
    ("val_interval<0", lambda: fit(val_interval=-1), ValueError, r"val_interval must be >= 0"),
    ("val_interval float", lambda: fit(val_interval=2.5), TypeError, r"val_interval must be an integer"),
    ("val_size<0", lambda: fit(val_size=-1), ValueError, r"val_size must be >= 0"),
    ("seed<0", lambda: fit(seed=-1), ValueError, r"seed must be >= 0"),
    ("seed float", lambda: fit(seed=1.5), TypeError, r"seed must be an integer"),
    ("seed=2**70", lambda: fit(seed=2**70), ValueError,  # was a node's OverflowError from torch.manual_seed
     r"^fit: seed must be below 2\*\*63 \(torch seeds with 64-bit integers\), got 1180591620717411303424$"),
    ("seed=2**63", lambda: fit(seed=2**63), ValueError, r"^fit: seed must be below 2\*\*63"),
    ("timeout_s=1e300", lambda: fit(timeout_s=1e300), ValueError,  # was a node's OverflowError from timedelta
     r"^fit: timeout_s must be <= 1000000000000.0, got 1e\+300$"),
    # fit: devices and precision
    ("unknown device", lambda: fit(device="tpu"), ValueError, r"device must be one of cpu, cuda, mps .* got 'tpu'"),
    pytest.param("cuda without CUDA", lambda: fit(device="cuda"), ValueError,
                 r"device='cuda' but CUDA is not available", marks=NO_CUDA),
    pytest.param("mps without MPS", lambda: fit(device="mps"), ValueError,
                 r"device='mps' but MPS is not available", marks=NO_MPS),
    ("devices on cpu", lambda: fit(device="cpu", devices=[0]), ValueError,
     r"devices is only meaningful with device='cuda'"),
    ("bad autocast", lambda: fit(autocast="fp8"), ValueError,
     r"autocast must be False, True, 'bf16' or 'fp16', got 'fp8'"),
    # fit: reliability options
    ("progress_timeout_s=0", lambda: fit(progress_timeout_s=0), ValueError, r"progress_timeout_s must be > 0"),
    ("progress_timeout_s str", lambda: fit(progress_timeout_s="30"), TypeError, r"progress_timeout_s must be a number"),
    ("checkpoint_interval=0", lambda: fit(checkpoint_interval=0), ValueError, r"checkpoint_interval must be >= 1"),
    ("checkpoint without run_dir", lambda: fit(checkpoint_interval=5), ValueError,
     r"checkpoint_interval needs run_dir"),
    ("resume_from missing", lambda: fit(resume_from="/nonexistent/run"), ValueError,
     r"resume_from must be an existing run directory, got '/nonexistent/run'"),
    ("resume_from and run_dir", lambda: fit(resume_from=".", run_dir="."), ValueError,
     r"pass either run_dir or resume_from"),
    ("dataloader_kwargs clash", lambda: fit(dataloader_kwargs={"shuffle": True, "num_workers": 0}), ValueError,
     r"dataloader_kwargs may not set shuffle"),
    # checked in the parent, before nodes start; were each node's TypeError/ValueError from DataLoader
    ("dataloader_kwargs misspelt", lambda: fit(dataloader_kwargs={"num_workrs": 0}), TypeError,
     r"^fit: dataloader_kwargs: DataLoader takes no argument 'num_workrs' \(did you mean 'num_workers'\?\)$"),
    ("dataloader_kwargs unknown", lambda: fit(dataloader_kwargs={"zzz": 1}), TypeError,
     r"^fit: dataloader_kwargs: DataLoader takes no argument 'zzz'; it takes num_workers, collate_fn, "),
    ("dataloader_kwargs bad value", lambda: fit(dataloader_kwargs={"num_workers": -1}), ValueError,
     r"^fit: dataloader_kwargs: num_workers option should be non-negative"),
    ("dataloader_kwargs dataset", lambda: fit(dataloader_kwargs={"dataset": DATA}), ValueError,
     r"^fit: dataloader_kwargs may not set dataset: exonet sets dataset, batch_size"),
    ("dataloader_kwargs a list", lambda: fit(dataloader_kwargs=[("num_workers", 0)]), TypeError,
     r"^fit: dataloader_kwargs must be a dict of DataLoader arguments, got list$"),
    ("run_dir inside a file", lambda: fit(run_dir=Path(__file__) / "runs"), ValueError,  # was FileExistsError
     r"^fit: run_dir: cannot write .*/runs: .*test_runtime_inputs.py is a file, not a folder$"),
    ("unknown fit argument", lambda: fit(bogus=1), TypeError, r"unexpected argument\(s\) bogus"),
    ("run_dir and save_dir", lambda: fit(run_dir="a", save_dir="b"), TypeError, r"run_dir and save_dir are aliases"),
    # fit: strategy
    ("strategy a string", lambda: fit(strategy="ddp"), TypeError,
     r"strategy must be an exonet.strategies.Strategy instance, got str"),
    ("strategy a class", lambda: fit(strategy=DDPStrategy), TypeError, r"strategy must be .* instance, got ABCMeta"),
    # LocalTrainer
    ("model not a Module", lambda: LocalTrainer("mlp", DATA), TypeError, r"model must be a torch.nn.Module, got str"),
    ("train_dataset neither", lambda: LocalTrainer(tiny_mlp(), 5), TypeError,
     r"train_dataset must be a map-style Dataset .* or a factory f\(rank, num_nodes, train\) returning one, got int"),
    ("val_dataset neither", lambda: LocalTrainer(tiny_mlp(), DATA, 5), TypeError,
     r"val_dataset must be a map-style Dataset"),
    ("train_dataset iterable", lambda: LocalTrainer(tiny_mlp(), Stream()), TypeError,
     r"LocalTrainer: train_dataset must be a map-style Dataset \(with __len__ and __getitem__: nodes are dealt "
     r"samples by index\).*got Stream"),
    ("val_dataset iterable", lambda: LocalTrainer(tiny_mlp(), DATA, Stream()), TypeError,
     r"LocalTrainer: val_dataset must be a map-style Dataset"),
    ("factory with one argument", lambda: LocalTrainer(tiny_mlp(), lambda rank: DATA).fit(DDPStrategy(), 2), TypeError,
     r"train_dataset: the factory must take \(rank, num_nodes, train\)"),
    ("factory returning None", lambda: LocalTrainer(tiny_mlp(), lambda r, k, t: None).fit(DDPStrategy(), 2), TypeError,
     r"train_dataset \(built by its factory for rank 0\) must be a map-style Dataset .* got NoneType"),
    # what cannot travel to the node processes is named (lambdas and local classes travel by value)
    ("model holding a lock", lambda: fit(model=LockHolder()), TypeError,
     r"model.inner.lock \(_thread.lock\) cannot be pickled .*open them inside the node"),
    ("dataset holding an open file", lambda: fit(train=OpenFileDataset(Path("/dev/null"))), TypeError,
     r"train_dataset.log \(_io.TextIOWrapper\) cannot be pickled \(.*not opened for reading"),
    # model misbehaving inside a node
    ("loss not a scalar", lambda: fit(model=BadLossModel("vector")), NodeFailure,
     r"model\(batch\) must return a scalar loss tensor, got \(8,\)"),
    ("loss without grad", lambda: fit(model=BadLossModel("detached")), NodeFailure,
     r"model\(batch\) returned a loss with no grad"),
    # OptimSpec
    ("unknown optimizer", lambda: OptimSpec("adamm"), ValueError, r"unknown optimizer 'adamm'; valid names: .*adamw"),
    ("unknown optimizer kwarg", lambda: OptimSpec("sgd", lr=0.1, momentumm=0.9), TypeError,
     r"SGD has no argument momentumm; valid: .*momentum"),
    ("optimizer not a class", lambda: OptimSpec(42), TypeError,
     r"expected an optimizer name or torch.optim.Optimizer subclass, got 42"),
    # Strategy base (DDP)
    ("max_norm=0", lambda: DDPStrategy(max_norm=0), ValueError, r"max_norm must be > 0"),
    ("max_norm<0", lambda: DDPStrategy(max_norm=-1.0), ValueError, r"max_norm must be > 0"),
    ("max_norm str", lambda: DDPStrategy(max_norm="1"), TypeError, r"max_norm must be a number"),
    ("lr_scheduler unknown", lambda: DDPStrategy(lr_scheduler="linear"), ValueError,
     r"lr_scheduler must be None, 'cosine', 'lambda_cosine' or a torch LRScheduler class, got 'linear'"),
    ("warmup_steps<0", lambda: DDPStrategy(warmup_steps=-1), ValueError, r"warmup_steps must be >= 0"),
    ("warmup_steps float", lambda: DDPStrategy(warmup_steps=1.5), TypeError, r"warmup_steps must be an integer"),
    ("cosine_min_ratio>1", lambda: DDPStrategy(cosine_min_ratio=2.0), ValueError, r"cosine_min_ratio must be <= 1"),
    ("scheduler kwargs for cosine", lambda: DDPStrategy(lr_scheduler="cosine", lr_scheduler_kwargs={"T_max": 3}),
     ValueError, r"lr_scheduler_kwargs=\{'T_max': 3\} are for a scheduler class or 'lambda_cosine'"),
    ("warmup_steps for a class", lambda: DDPStrategy(lr_scheduler=torch.optim.lr_scheduler.StepLR, warmup_steps=8,
                                                     lr_scheduler_kwargs={"step_size": 2}),
     ValueError, r"warmup_steps and cosine_min_ratio shape lr_scheduler=None or 'cosine', not <class"),
    ("warmup_steps for lambda_cosine", lambda: DDPStrategy(lr_scheduler="lambda_cosine", warmup_steps=8), ValueError,
     r"give its warm-up in lr_scheduler_kwargs=\{'warmup_steps': ...\}"),
    ("cosine_min_ratio alone", lambda: DDPStrategy(cosine_min_ratio=0.5), ValueError,
     r"cosine_min_ratio=0.5 is the cosine schedule's floor; pass lr_scheduler='cosine' too"),
    ("optim_spec misspelt", lambda: DDPStrategy(optim_spec="adamm"), ValueError,
     r"optim_spec: .*unknown optimizer 'adamm'"),
    # Trace builder
    ("trace num_nodes=0", lambda: Trace(0), ValueError, r"num_nodes must be an integer >= 1, got 0"),
    ("trace bad rank", lambda: Trace(2).add_compute(2, 1.0), ValueError, r"rank must be in \[0, 2\), got 2"),
    ("trace negative seconds", lambda: Trace(2).add_compute(0, -1.0), ValueError,
     r"seconds, cpu_s and flops must be >= 0"),
    ("trace bad op", lambda: Trace(2).add_collective(0, "allreduce", 4), ValueError,
     r"op must be one of all_reduce, .* got 'allreduce'"),
    ("trace negative bytes", lambda: Trace(2).add_collective(0, "all_reduce", -4), ValueError,
     r"nbytes must be a non-negative integer, got -4"),
    ("trace group out of range", lambda: Trace(2).add_collective(0, "all_reduce", 4, group=(0, 5)), ValueError,
     r"group must be distinct ranks in \[0, 2\)"),
    ("trace wait unknown id", lambda: Trace(2).add_wait(0, 7), ValueError, r"rank 0 has no async collective with id 7"),
]


def _case_id(case: Any) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.mark.parametrize("name, call, error, pattern", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_is_named(name: str, call: Callable[[], Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        call()


def test_resume_from_a_folder_that_is_no_run_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"config.json: missing from the run directory"):
        fit(resume_from=tmp_path)


# ---------------------------------------------------------------- artifacts
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    return fit(run_dir=tmp_path_factory.mktemp("runs"), max_steps=3).run_dir


def _truncate(text: str) -> str:
    return text[: len(text) // 2]


def _drop_last_line(text: str) -> str:
    return "".join(text.splitlines(keepends=True)[:-1])


ARTIFACTS = [
    ("trace.jsonl", _truncate, r"trace.jsonl"),
    ("trace.jsonl", _drop_last_line, r"trace.jsonl: truncated trace"),
    ("trace.jsonl", lambda t: t.replace('["x"', '["?"', 1), r"trace.jsonl:\d+: bad event"),
    ("metrics.jsonl", _truncate, r"metrics.jsonl"),
    ("metrics.jsonl", _drop_last_line, r"metrics.jsonl: truncated"),
    ("metrics.jsonl", lambda t: t.replace("train_loss", "tran_loss", 1), r"metrics.jsonl:1: bad metrics line"),
    ("config.json", _truncate, r"config.json: cannot read"),
    ("config.json", lambda t: "[1, 2]", r"config.json: expected a JSON object"),
    ("status.json", _truncate, r"status.json: cannot read"),
    ("status.json", lambda t: json.dumps({"complete": "yes"}),
     r"status.json: expected an object with a boolean 'complete'"),
]


@pytest.mark.parametrize("name, damage, pattern", ARTIFACTS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(ARTIFACTS)])
def test_a_damaged_artifact_raises_trace_error_naming_the_file(finished_run: Path, tmp_path: Path, name: str,
                                                               damage: Callable[[str], str], pattern: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for f in finished_run.iterdir():
        if f.is_file():
            (run / f.name).write_text(f.read_text())
    (run / name).write_text(damage((run / name).read_text()))
    with pytest.raises(TraceError, match=pattern):
        load_run(run)


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "trace.jsonl", "status.json"])
def test_a_missing_artifact_is_named(finished_run: Path, tmp_path: Path, name: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for f in finished_run.iterdir():
        if f.is_file() and f.name != name:
            (run / f.name).write_text(f.read_text())
    with pytest.raises(TraceError, match=name):
        load_run(run)


def test_a_finished_run_loads(finished_run: Path) -> None:
    config, history, trace = load_run(finished_run)
    assert config["num_nodes"] == 2 and len(history["train_loss"]) == 3 and trace.num_steps(0) == 3


def test_val_interval_without_a_val_dataset_warns_that_nothing_is_evaluated():
    with pytest.warns(UserWarning, match=r"fit: val_interval=3 but this LocalTrainer has no val_dataset"):
        result = LocalTrainer(tiny_mlp(), DATA).fit(DDPStrategy(), 1, max_steps=3, batch_size=8, val_interval=3,
                                                    progress=False)
    assert result.history["eval"] == []


def test_fits_checks_warn_at_the_line_that_called_fit_and_stop_before_any_node_starts():
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4))
    with pytest.warns(UserWarning) as caught, pytest.raises(TypeError, match="DataLoader takes no argument 'bogus'"):
        trainer.fit(DDPStrategy(), num_nodes=2, max_steps=6, num_epochs=1, val_interval=3, correlation_interval=5,
                    dataloader_kwargs={"bogus": 1}, progress=False, device="cpu")
    assert [str(w.message).split(" ")[1] for w in caught] == ["correlation_interval", "val_interval=3", "num_epochs=1"]
    assert {w.filename for w in caught} == {__file__}
