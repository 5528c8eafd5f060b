"""The older gym's scripts run with only the import line changed (issue 20, item 8).

The slow tests are exonet-written equivalents of the code paths of the gym's ``example/mnist.py``
(three strategies given one shared set of keyword arguments, then its plotting code reading
``logs/<run>/validation.csv``) and ``example/nanogpt_train.py`` (its ``create_strategy`` spellings, a
dataset factory, ``device=""``, ``save_dir``, then ``torch.save(model.state_dict())``) and
``example/diloco_scaling.py`` (``get_device``, ``fit(kwargs=...)``, wandb with ``log_x_axis="examples"``), on
local stand-in data. Only their imports differ from the gym's.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from functools import partial

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from exonet import (
    FitResult,
    LocalTrainer,
    Trace,
    Trainer,  # the gym: from exogym.trainer import Trainer
)
from exonet.runtime.fit_config import resolve_device, resolve_steps
from exonet.runtime.gymlog import TRAIN_COLUMNS, VALIDATION_COLUMNS, write_gym_csv
from exonet.strategies import (
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    OptimSpec,
    SimpleReduceStrategy,
    SPARTADiLoCoStrategy,
    SPARTAStrategy,
)
from exonet.toy import synthetic_classification, tiny_mlp


# ---------------------------------------------------------------- stand-ins for the gym's data and models
class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


class ModelWrapper(nn.Module):  # the gym's mnist wrapper: model(batch) -> loss
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, batch):
        imgs, labels = batch
        return F.cross_entropy(self.backbone(imgs), labels)


def images(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


class TinyGPT(nn.Module):  # stands in for the gym's nanogpt GPT: model(batch) -> loss on (idx, targets)
    def __init__(self, vocab: int = 16, width: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, batch):
        idx, targets = batch
        logits = self.head(self.emb(idx))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def token_factory(block_size: int, rank: int, num_nodes: int, train_dataset: bool) -> TensorDataset:
    """The gym's owt_dataset_factory shape: each rank its own shard, a shared validation set."""
    g = torch.Generator().manual_seed(rank if train_dataset else 1000)
    data = torch.randint(0, 16, (64, block_size + 1), generator=g)
    return TensorDataset(data[:, :-1], data[:, 1:])


# ---------------------------------------------------------------- fast: each spelling
def test_the_gym_strategy_names_and_aliases_are_accepted():
    spec = OptimSpec(torch.optim.AdamW, lr=3e-4, weight_decay=1e-4)
    assert SimpleReduceStrategy(optim_spec=spec).optim_spec is spec
    assert FedAvgStrategy(inner_optim_spec=spec, H=3).optim_spec is spec
    assert SPARTADiLoCoStrategy(inner_optim_spec=spec).optim_spec is spec
    with pytest.warns(UserWarning, match="DeMo steps with its own sign-SGD, so AdamW is not used$"):
        demo = DeMoStrategy(optim_spec=spec, compression_topk=4)
    assert (demo.lr, demo.weight_decay) == (3e-4, 1e-4)
    # the gym's nanogpt call: weight_decay given to DeMo too, which wins over the spec's
    with pytest.warns(UserWarning, match=r"so AdamW is not used; the weight_decay passed to DeMoStrategy wins over "
                                         r"the spec's$"):
        demo = DeMoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-3, weight_decay=0.1), weight_decay=0.0)
    assert (demo.lr, demo.weight_decay) == (1e-3, 0.0)


def test_shared_keyword_arguments_are_ignored_with_a_warning_that_says_what_the_gym_did():
    spec = OptimSpec(torch.optim.AdamW, lr=3e-4)
    with pytest.warns(UserWarning) as caught:
        sparta = SPARTAStrategy(optim_spec=spec, H=20, p=0.05)
    messages = [str(w.message) for w in caught]
    assert any("p=0.05 is ignored: the gym ignored it silently, so its SPARTAStrategy ran at p_sparta=0.005; "
               "pass p_sparta=0.05" in m for m in messages), messages
    assert any("H=20 is ignored" in m and "DiLoCoStrategy" in m for m in messages), messages
    assert "p" not in vars(sparta) and sparta.config()["p_sparta"] == 0.005  # ignored, as the gym did
    with pytest.warns(UserWarning, match=r"DiLoCoStrategy: p=0.05 is ignored"):
        assert DiLoCoStrategy(optim_spec=spec, H=20, p=0.05).H == 20


@pytest.mark.parametrize("kwargs, message", [
    ({"h": 20}, r"DiLoCoStrategy: unexpected argument 'h'; did you mean 'H'\?"),
    ({"max_step": 5}, r"unexpected argument 'max_step'; did you mean fit's 'max_steps'\?"),
    ({"outer_optim_spc": None}, r"did you mean 'outer_optim_spec'\?"),
])
def test_a_misspelt_strategy_argument_says_did_you_mean(kwargs, message):
    with pytest.raises(TypeError, match=message):
        DiLoCoStrategy(**kwargs)


def test_a_misspelt_fit_argument_says_did_you_mean():
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4))
    with pytest.raises(TypeError, match=r"fit: unexpected argument\(s\) max_step \(did you mean 'max_steps'\?\)"):
        trainer.fit(SimpleReduceStrategy(), num_nodes=2, max_step=3)


def test_device_empty_string_is_the_gyms_auto_detect():
    assert resolve_device("", None, 2) == resolve_device(None, None, 2)


def test_a_fit_result_stands_in_for_the_model_the_gym_returned():
    model = tiny_mlp()
    result = FitResult(model=model, history={"train_loss": [], "eval": []}, trace=Trace(num_nodes=1))
    assert result.state_dict().keys() == model.state_dict().keys()
    assert list(result.parameters()) == list(model.parameters())
    assert result.eval() is model and not model.training
    batch = (torch.randn(3, 8), torch.tensor([0, 1, 2]))
    assert torch.equal(result(batch), model(batch))
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        result.bogus


def test_the_gym_csv_logs_have_its_columns_and_steps(tmp_path):
    history = {"train_loss": [2.0, 1.5], "eval": [{"step": 2, "loss": 1.25, "local_loss": 1.5}]}
    write_gym_csv(tmp_path, history, examples_per_step=32)
    with open(tmp_path / "train.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == TRAIN_COLUMNS
    assert [(r["step"], r["examples_trained"], float(r["train_loss"])) for r in rows] == [("0", "32", 2.0),
                                                                                         ("1", "64", 1.5)]
    assert float(rows[1]["train_perplexity"]) == pytest.approx(torch.exp(torch.tensor(1.5)).item())
    with open(tmp_path / "validation.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert tuple(row) == VALIDATION_COLUMNS
    assert (row["step"], float(row["global_loss"]), float(row["local_loss"])) == ("2", 1.25, 1.5)


# ---------------------------------------------------------------- slow: the two scripts' code paths
def _gym_plot_reads(run_name: str) -> tuple[list[int], list[float]]:
    """What the gym's mnist plot_validation_results_with_run_names reads for one run."""
    steps, losses = [], []
    with open(os.path.join("logs", run_name, "validation.csv")) as f:
        for row in csv.DictReader(f):
            if row.get("global_loss") and row["global_loss"].strip():
                steps.append(int(row["step"]))
                losses.append(float(row["global_loss"]))
    return steps, losses


@pytest.mark.slow
def test_the_gym_mnist_example_runs_with_only_its_imports_changed(tmp_path, monkeypatch, node_pids):
    monkeypatch.chdir(tmp_path)
    train_ds, val_ds = images(256, 0), images(64, 1)
    device = "mps" if torch.backends.mps.is_available() else "cuda" if torch.cuda.is_available() else "cpu"
    optim_spec = OptimSpec(torch.optim.AdamW, lr=3e-4, weight_decay=1e-4)
    run_names = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, Strat in [("ddp", SimpleReduceStrategy), ("diloco", DiLoCoStrategy), ("sparta", SPARTAStrategy)]:
            run_name = f"mnist_{name}"
            run_names.append(run_name)
            trainer = Trainer(ModelWrapper(SmallCNN()), train_ds, val_ds)
            strategy = Strat(optim_spec=optim_spec, H=20, p=0.05, lr_scheduler="lambda_cosine",
                             lr_scheduler_kwargs={"warmup_steps": 2, "cosine_anneal": True})
            trainer.fit(max_steps=6, num_epochs=5, strategy=strategy, num_nodes=4, device=device, batch_size=16,
                        val_size=len(val_ds), val_interval=4, wandb_project=None, run_name=run_name,
                        progress=False)
    assert any("ran at p_sparta=0.005" in str(w.message) for w in caught)
    for run_name in run_names:
        steps, losses = _gym_plot_reads(run_name)
        assert steps == [0, 4, 6] and all(0 < loss < 10 for loss in losses), (run_name, steps, losses)
        with open(os.path.join("logs", run_name, "train.csv")) as f:
            assert [int(r["step"]) for r in csv.DictReader(f)] == list(range(6))
    assert node_pids() == []


@pytest.mark.slow
def test_the_gym_nanogpt_example_runs_with_only_its_imports_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lr_scheduler_kwargs = {"warmup_steps": 2, "cosine_anneal": True}
    optim = OptimSpec(torch.optim.AdamW, lr=1e-3)
    outer = OptimSpec(torch.optim.SGD, lr=0.7, nesterov=True, momentum=0.9)
    strategies = {  # create_strategy's spellings, one per branch
        "ddp": SimpleReduceStrategy(optim_spec=optim, lr_scheduler="lambda_cosine",
                                    lr_scheduler_kwargs=lr_scheduler_kwargs, max_norm=1.0),
        "fedavg": FedAvgStrategy(inner_optim_spec=optim, H=2, island_size=2, lr_scheduler="lambda_cosine",
                                 lr_scheduler_kwargs=lr_scheduler_kwargs, max_norm=1.0),
        "sparta": SPARTAStrategy(optim_spec=optim, lr_scheduler="lambda_cosine",
                                 lr_scheduler_kwargs=lr_scheduler_kwargs, max_norm=1.0, p_sparta=0.005,
                                 async_sparta_delay=0),
        "diloco": DiLoCoStrategy(optim_spec=optim, outer_optim_spec=outer, H=2, lr_scheduler="lambda_cosine",
                                 lr_scheduler_kwargs=lr_scheduler_kwargs, max_norm=1.0),
        "diloco_sparta": SPARTADiLoCoStrategy(inner_optim_spec=optim, outer_optim_spec=outer, H=2, p_sparta=0.005,
                                              sparta_interval=1, lr_scheduler="lambda_cosine",
                                              lr_scheduler_kwargs=lr_scheduler_kwargs, max_norm=1.0),
    }
    with pytest.warns(UserWarning, match="DeMo steps with its own sign-SGD"):
        strategies["demo"] = DeMoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-3, weight_decay=0.0),
                                          compression_decay=0.999, compression_topk=4, compression_chunk=8,
                                          weight_decay=0.0, lr_scheduler="lambda_cosine",
                                          lr_scheduler_kwargs=lr_scheduler_kwargs, max_norm=1.0)
    dataset_factory = partial(token_factory, 8)
    for name in ("diloco", "demo"):
        trainer = Trainer(TinyGPT(), dataset_factory, dataset_factory, start_port=15000)
        with pytest.warns(UserWarning, match="correlation_interval is ignored"):
            model = trainer.fit(num_epochs=1, max_steps=4, strategy=strategies[name], num_nodes=2, device="",
                                batch_size=8, minibatch_size=None, shuffle=True, val_size=16, val_interval=2,
                                correlation_interval=None, save_dir="./checkpoints", wandb_project=None,
                                run_name=f"{name}_run", log_x_axis="step", progress=False)
        os.makedirs("checkpoints", exist_ok=True)
        model_path = os.path.join("checkpoints", f"{name}_run_model.pt")
        torch.save(model.state_dict(), model_path)
        saved = torch.load(model_path)
        assert all(torch.equal(saved[k], v) for k, v in model.model.state_dict().items())
        (run,) = [p for p in os.scandir("checkpoints") if p.is_dir() and p.name.endswith(f"{name}_run")]
        for folder in (run.path, os.path.join("logs", f"{name}_run")):  # its plots read logs/<run_name>/
            with open(os.path.join(folder, "validation.csv")) as f:
                assert [int(r["step"]) for r in csv.DictReader(f)] == [0, 2, 4]


class _FakeWandb:
    """Stands in for the wandb module: records init's config and every log call (no service, no network)."""

    def __init__(self):
        self.config, self.logged = None, []

    def init(self, project, name, config, dir, reinit):
        self.config = config
        return self

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def finish(self, exit_code=0):
        pass


@pytest.mark.slow
def test_the_gym_diloco_scaling_calls_work(tmp_path, monkeypatch):
    """diloco_scaling.py's calls: get_device, fit(kwargs=...), wandb under the gym's names, x-axis in examples."""
    import sys

    from exonet import get_device  # the gym: from exogym.aux.utils import get_device

    monkeypatch.chdir(tmp_path)
    wandb = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    device = get_device()
    assert device in ("cuda", "mps", "cpu")
    dataset_factory = partial(token_factory, 8)
    trainer = Trainer(TinyGPT(), dataset_factory, dataset_factory)
    trainer.fit(num_epochs=1, max_steps=4, strategy=DiLoCoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-3),
                                                                   H=2, max_norm=1.0),
                num_nodes=2, device=device, batch_size=4, shuffle=True, val_size=8, val_interval=2,
                wandb_project="DiLoCo-Scaling", run_name="diloco-K2-batchsize8", log_x_axis="examples",
                kwargs={"dataset_name": "shakespeare"}, progress=False)
    assert wandb.config["kwargs"] == {"dataset_name": "shakespeare"}
    per_step = 4 * 2  # examples per step: batch_size x num_nodes, as the gym counted them
    train = [(step, sorted(d)) for step, d in wandb.logged if "train_loss" in d]
    assert train == [(per_step * s, ["train_loss", "train_perplexity"]) for s in (1, 2, 3, 4)]
    evals = [(step, {"global_loss", "global_perplexity", "local_loss", "local_perplexity"} <= set(d))
             for step, d in wandb.logged if "global_loss" in d]
    assert evals == [(per_step * s, True) for s in (0, 2, 4)]
    with open(os.path.join("logs", "diloco-K2-batchsize8", "validation.csv")) as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [0, 2, 4]


def test_num_epochs_that_cuts_max_steps_short_warns():
    shard = 64 // 2  # synthetic_classification(64) over 2 nodes
    with pytest.warns(UserWarning, match=r"num_epochs=1 ends the run after 2 steps, before max_steps=6"):
        assert resolve_steps(6, 1, shard, 16, 2) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_steps(2, 1, shard, 16, 2) == 2


def test_fit_defaults_are_the_gyms():
    import inspect

    params = inspect.signature(LocalTrainer.fit).parameters
    assert {k: params[k].default for k in ("batch_size", "val_size", "val_interval")} == {
        "batch_size": 16, "val_size": 64, "val_interval": 100}


class _MeanOfInputs(nn.Module):
    """Its loss is the mean of the batch's inputs: what an evaluation scores shows which samples it drew."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, batch):
        x, _ = batch
        return x.float().mean() + 0 * self.w.sum()


def test_validation_scores_one_seeded_random_sample():
    """On ordered data the first val_size samples are a biased estimate; exonet draws a seeded sample instead."""
    ordered = TensorDataset(torch.arange(1000).float().unsqueeze(1), torch.zeros(1000))
    result = LocalTrainer(_MeanOfInputs(), ordered, ordered).fit(
        SimpleReduceStrategy(), num_nodes=1, max_steps=4, val_size=64, val_interval=2, progress=False)
    losses = [e["loss"] for e in result.history["eval"]]
    assert [e["step"] for e in result.history["eval"]] == [0, 2, 4]
    assert len(set(losses)) == 1 and 350 < losses[0] < 650  # the first 64 would score 31.5


@pytest.mark.parametrize(("kwargs", "want"), [
    # the gym's defaults: one warm-up step from 0, then constant (no cosine unless asked)
    ({}, [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ({"warmup_steps": 4}, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    # cosine from the end of warm-up to max_steps, floored at 0.1 of the base lr
    ({"warmup_steps": 2, "cosine_anneal": True},
     [0.0, 0.5] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(2, 10)]),
    # max_steps in the kwargs ends the cosine sooner than the fit's
    ({"warmup_steps": 2, "cosine_anneal": True, "max_steps": 6},
     [0.0, 0.5] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 4)) for s in range(2, 10)]),
])
def test_lambda_cosine_is_the_gyms_schedule(kwargs, want):
    s = SimpleReduceStrategy(lr_scheduler="lambda_cosine", lr_scheduler_kwargs=kwargs)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = s._build_scheduler(opt, 10)
    got = []
    for _ in range(10):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert got == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="'lambda_cosine' takes warmup_steps, cosine_anneal, max_steps, not min_lr"):
        SimpleReduceStrategy(lr_scheduler="lambda_cosine", lr_scheduler_kwargs={"min_lr": 0.1})
