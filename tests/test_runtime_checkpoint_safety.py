"""What a run directory's files can do when read back: data only, checked against where they were found.

A shared run directory (``upload_to=``, a colleague's folder) is read by ``resume_from``, ``load_run``,
``exonet simulate`` and ``compare``. Nothing in it may run code, and a checkpoint is resumed only from
the files its run wrote, each where it belongs.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from exonet import LocalTrainer, TraceError
from exonet.communicator import Communicator
from exonet.files import plain_name
from exonet.rundir import create_run, load_run
from exonet.runtime.checkpoint import load_node, node_file, read_node, save_node
from exonet.runtime.testing import RunsCode
from exonet.strategies import DDPStrategy, NodeContext, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

DATA = synthetic_classification(64, dim=8, classes=4)
KW = dict(num_nodes=2, max_steps=4, batch_size=8, val_size=0, seed=3, progress=False)


def _fit(**kw):
    return LocalTrainer(tiny_mlp(), DATA).fit(DDPStrategy(OptimSpec("adamw", lr=1e-3)), **KW, **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two runs of the same fit, each checkpointed at step 2."""
    made = []
    for name in ("a", "b"):
        root = tmp_path_factory.mktemp(name)
        _fit(run_dir=root, checkpoint_interval=2)
        (run,) = root.iterdir()
        made.append(run)
    return made[0], made[1]


@pytest.fixture
def run(runs, tmp_path) -> Path:
    """A copy of run a, to damage."""
    return shutil.copytree(runs[0], tmp_path / "run")


def _step(run: Path) -> Path:
    return run / "checkpoints" / json.loads((run / "checkpoints" / "latest.json").read_text())["dir"]


def resume(run: Path):
    return _fit(resume_from=run, checkpoint_interval=2)


# ------------------------------------------------------------------ no code
def test_a_checkpoint_that_would_run_code_is_refused_and_runs_none(run, tmp_path):
    """A node-0.pt carrying a pickled os.system call ran it, and the resume then "succeeded"."""
    marker = tmp_path / "ran"
    node = node_file(_step(run), 0)
    state = torch.load(node, weights_only=True)
    state["model"]["inner.0.weight"] = RunsCode(marker)
    torch.save(state, node)
    with pytest.raises(TraceError, match=rf"^{node}: cannot read the checkpoint \(it names the Python object "
                                         r"posix.system, which loading would import or call"):
        resume(run)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "trace.jsonl", "status.json",
                                  "checkpoints/latest.json", "checkpoints/STEP/metrics.jsonl",
                                  "checkpoints/STEP/trace.jsonl", "checkpoints/STEP/node-1.pt"])
def test_every_file_read_back_from_a_run_directory_is_data_only(run, tmp_path, name):
    """Each file becomes a pickle whose loading would run code: each reader that reads it refuses it, naming it.

    load_run (behind ``exonet simulate`` and ``compare``) reads the run's own files; a resume reads config.json
    and the checkpoint (the history and trace it continues are the checkpoint's, so it overwrites the others).
    """
    marker = tmp_path / "ran"
    file = run / name.replace("STEP", _step(run).name)
    file.write_bytes(pickle.dumps(RunsCode(marker)))
    checkpoint = name.startswith("checkpoints/")
    for read, reads in ((load_run, not checkpoint), (resume, checkpoint or name == "config.json")):
        if reads:
            with pytest.raises(TraceError, match=rf"^(resume_from: )?{file}"):
                read(run)
        else:
            read(run)
    assert not marker.exists()


def test_save_names_a_value_a_checkpoint_cannot_hold(tmp_path):
    class Keeps(DDPStrategy):
        def state_dict(self):
            return {**super().state_dict(), "extra": {"when": [1, Path("x")]}}

    run = create_run(tmp_path, "r", {})
    model, strategy = tiny_mlp(), Keeps()
    strategy.setup(model, Communicator(0, 1, torch.device("cpu")), NodeContext(0, 1, 4, 0, torch.device("cpu")))
    with pytest.raises(TypeError, match=r"checkpoint: \['strategy'\]\['extra'\]\['when'\]\[1\] is a pathlib\."
                                        r"PosixPath; a checkpoint holds tensors and plain values only"):
        save_node(run / "checkpoints", 2, 0, model, strategy)



@pytest.mark.parametrize("kept_as", ["tensors", "lists (an earlier exonet's format 2)"])
def test_rng_states_come_back_exactly_from_tensors_or_lists(tmp_path, kept_as):
    """A node file keeps Python's and numpy's 624-word RNG states as int64 tensors (a weights-only load reads a
    list of ints one opcode at a time); files that kept lists still resume, to the same states."""
    run = create_run(tmp_path, "r", {})
    model, strategy = tiny_mlp(), DDPStrategy()
    strategy.setup(model, Communicator(0, 1, torch.device("cpu")), NodeContext(0, 1, 4, 0, torch.device("cpu")))
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    save_node(run / "checkpoints", 2, 0, model, strategy)
    want = random.random(), np.random.rand(), torch.rand(1).item()
    file = node_file(run / "checkpoints" / "step-00000002", 0)
    state = torch.load(file, weights_only=True)
    assert state["rng"]["python"][1].dtype == torch.int64 and state["rng"]["numpy"]["state"]["key"].shape == (624,)
    if kept_as != "tensors":
        version, internal, gauss = state["rng"]["python"]
        state["rng"]["python"] = (version, tuple(internal.tolist()), gauss)
        state["rng"]["numpy"]["state"]["key"] = state["rng"]["numpy"]["state"]["key"].tolist()
        torch.save(state, file)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    load_node(file.parent, 0, model, strategy)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want

# ------------------------------------------------------------------ each file where it belongs
def test_swapped_node_files_are_refused_naming_both(run):
    step = _step(run)
    zero, one = node_file(step, 0), node_file(step, 1)
    zero.rename(step / "swap")
    one.rename(zero)
    (step / "swap").rename(one)
    with pytest.raises(TraceError, match=rf"^resume_from: {zero} holds rank 1's checkpoint, {one} holds rank 0's "
                                         r"checkpoint; node-<r>.pt must hold rank r's"):
        resume(run)


def test_a_node_file_from_another_run_is_refused(runs, run):
    other = node_file(_step(runs[1]), 1)
    shutil.copy(other, node_file(_step(run), 1))
    ours = json.loads((run / "config.json").read_text())["run_id"]
    theirs = read_node(other)["run"]
    assert ours != theirs
    with pytest.raises(TraceError, match=rf"^{node_file(_step(run), 1)}: holds run '{theirs}', but .*latest.json "
                                         rf"names run '{ours}': the file comes from another run"):
        resume(run)


def test_a_checkpoint_folder_from_another_run_is_refused(runs, run):
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(runs[1] / "checkpoints", run / "checkpoints")
    with pytest.raises(TraceError, match=r"latest.json: written by run \w+, but .* is run \w+ \(its config.json\): "
                                         r"the checkpoints come from another run"):
        resume(run)


def test_a_node_file_of_another_step_is_refused(run):
    node = node_file(_step(run), 0)
    state = torch.load(node, weights_only=True)
    torch.save({**state, "step": 3}, node)
    with pytest.raises(TraceError, match=rf"^{node}: holds step 3, but .*latest.json names step 2"):
        resume(run)


@pytest.mark.parametrize("where", ["outside", "absolute", "separator"])
def test_a_latest_json_pointing_outside_the_run_directory_is_refused(run, tmp_path, where):
    """A latest.json naming a checkpoint outside checkpoints/ was followed: here a copy of the run's own
    checkpoint moved out of the run directory, so the resume would otherwise succeed."""
    outside = shutil.copytree(_step(run), tmp_path / "elsewhere" / "step-00000002")
    shutil.rmtree(_step(run))
    latest = run / "checkpoints" / "latest.json"
    pointer = {"outside": os.path.relpath(outside, latest.parent), "absolute": str(outside),
               "separator": "x/../../../elsewhere/step-00000002"}[where]
    latest.write_text(json.dumps({**json.loads(latest.read_text()), "dir": pointer}))
    with pytest.raises(TraceError, match=rf"^{latest}: dir: '{pointer}' is not a plain name inside its folder"):
        resume(run)


# ------------------------------------------------------------------ names
@pytest.mark.parametrize("name", ["/etc/passwd", "../other", "..", ".", "", "a/b", "a\\b", "C:x", "x\0y", None, 3])
def test_a_name_read_from_a_file_stays_inside_its_folder(name):
    with pytest.raises(ValueError, match=r"^latest.json: dir: .* is not a plain name inside its folder"):
        plain_name(name, "latest.json: dir")


@pytest.mark.parametrize("name", ["step-00000004", "node-0.pt", "shard.bin", "...x", "a..b"])
def test_a_plain_name_passes(name):
    assert plain_name(name, "latest.json: dir") == name
