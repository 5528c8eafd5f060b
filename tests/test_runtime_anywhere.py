"""fit from wherever a researcher works, and the seed gym's habits.

Real interpreters run a study whose model, dataset, collate function and strategy are
all defined in ``__main__``: piped to ``python -``, passed to ``python -c``, as a script
with no main guard (which must not re-run itself in the nodes), and in the cells of a
notebook run by a real Jupyter kernel. Then the seed
gym's ``val_size=0`` and ``exonet simulate|compare`` on the folder given to ``fit(run_dir=...)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

from exonet import LocalTrainer, TraceError, compare
from exonet.cli import main as cli
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

# Everything the fit needs lives in __main__; no `if __name__ == "__main__":` guard.
STUDY = '''
import json, sys
import torch
from exonet import LocalTrainer
from exonet.strategies import OptimSpec, Strategy
from exonet.strategies.base import flatten, unflatten_into

print("STUDY STARTED", flush=True)
SCALE = 0.5  # a global the collate function reads: it travels with the function

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y)

class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return self.x[i], self.y[i]

def collate(rows):
    xs, ys = zip(*rows)
    return torch.stack(xs), torch.stack(ys) * SCALE

class MeanGradients(Strategy):
    def step(self):
        grad = flatten([p.grad for p in self.params])
        self.comm.all_reduce(grad)
        unflatten_into(grad / self.num_nodes, [p.grad for p in self.params])
        self.optimizer_step()

torch.manual_seed(0)
result = LocalTrainer(Net(), Data(128)).fit(
    MeanGradients(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=12, batch_size=8, device="cpu",
    progress=False, val_size=0, dataloader_kwargs={"collate_fn": collate})
print("RESULT " + json.dumps(result.history["train_loss"]), flush=True)
'''


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("STUDY STARTED") == 1, proc.stdout  # the nodes never re-ran the script
    losses = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert len(losses) == 12 and losses[-1] < 0.5 * losses[0], losses


def test_a_script_on_stdin_fits_with_its_own_classes(tmp_path):
    _check(subprocess.run([sys.executable, "-"], input=STUDY, capture_output=True, text=True, timeout=180,
                          cwd=tmp_path))


@pytest.mark.slow
def test_python_dash_c_fits_with_its_own_classes(tmp_path):
    _check(subprocess.run([sys.executable, "-c", STUDY], capture_output=True, text=True, timeout=180, cwd=tmp_path))


@pytest.mark.slow
def test_a_script_without_a_main_guard_fits_once(tmp_path):
    script = tmp_path / "study.py"
    script.write_text(STUDY)
    _check(subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path))


@pytest.mark.slow
def test_a_jupyter_notebook_fits_with_classes_from_its_cells(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    head, fit = STUDY.split("torch.manual_seed(0)")
    classes = head.split("class Net", 1)[1]
    cells = [head.split("class Net", 1)[0], "class Net" + classes.split("class Data", 1)[0],
             "class Data" + classes.split("class Data", 1)[1], "torch.manual_seed(0)" + fit,
             "losses = result.history['train_loss']\nassert len(losses) == 12 and losses[-1] < 0.5 * losses[0], losses"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()
    outputs = "".join(o.get("text", "") for cell in nb.cells for o in cell.get("outputs", []))
    assert outputs.count("STUDY STARTED") == 1 and "RESULT " in outputs


def test_lambdas_and_local_classes_travel_by_value():
    class Shift(torch.nn.Module):  # a local class: cloudpickle carries its code
        def __init__(self) -> None:
            super().__init__()
            self.inner = tiny_mlp()

        def forward(self, batch):
            return self.inner(batch)

    data = synthetic_classification(64, dim=8, classes=4)
    result = LocalTrainer(Shift(), lambda rank, k, train: data).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=3, batch_size=8, progress=False, device="cpu")
    assert len(result.history["train_loss"]) == 3


class Locked(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.data = synthetic_classification(64, dim=8, classes=4)
        self.guard = {"lock": threading.Lock()}

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return self.data[i]


def test_what_cannot_travel_is_named_with_the_reason():
    with pytest.raises(TypeError, match=r"train_dataset.guard\['lock'\] \(_thread.lock\) cannot be pickled "
                                        r"\(TypeError: cannot pickle '_thread.lock' object\)\. Open files, locks"):
        LocalTrainer(tiny_mlp(), Locked()).fit(DDPStrategy(), num_nodes=2, max_steps=2, batch_size=8, progress=False)


# ------------------------------------------------------------ seed-gym compatibility
def test_val_size_zero_means_no_evaluation(tmp_path):
    val = synthetic_classification(64, dim=8, classes=4, train=False)
    result = LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4), val).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=4, batch_size=8, val_interval=2, val_size=0,
        progress=False, device="cpu", run_dir=tmp_path)
    assert result.history["eval"] == [] and len(result.history["train_loss"]) == 4
    assert json.loads((result.run_dir / "config.json").read_text())["val_size"] == 0


def test_seed_gym_trainer_arguments():
    with pytest.warns(UserWarning, match="start_port is ignored"):
        trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4), None, start_port=12355,
                               device="tpu")
    with pytest.warns(UserWarning, match="correlation_interval is ignored"), \
            pytest.raises(ValueError, match="device must be one of cpu, cuda, mps .* got 'tpu'"):
        trainer.fit(DDPStrategy(), num_nodes=2, max_steps=2, batch_size=8, correlation_interval=10)


@pytest.fixture(scope="module")
def run_folders(tmp_path_factory):
    """Two folders as given to fit(run_dir=...): one run in ``a``, two in ``b`` (plus a stray file)."""
    root = tmp_path_factory.mktemp("runs")
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4))
    results = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # a run_name also writes the gym's logs/<run_name>/ in the working directory
        for folder, name in (("a", "ddp"), ("b", "sgd-1"), ("b", "sgd-2")):
            results[(folder, name)] = trainer.fit(DDPStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=3,
                                                  batch_size=8, progress=False, device="cpu", run_dir=root / folder,
                                                  run_name=name)
    (root / "b" / "notes.txt").write_text("not a run")
    return root, results


def test_compare_on_folders_of_runs_uses_every_complete_run(run_folders):
    root, results = run_folders
    table = compare({"a": root / "a", "b": root / "b"}, ["datacenter"])
    names = [row["run"] for row in table.rows]
    assert names == ["a", "b/sgd-1", "b/sgd-2"]  # by run name, not by folder
    direct = compare({"x": results[("a", "ddp")].run_dir}, ["datacenter"]).rows[0]
    assert table.rows[0]["wall_clock_s"] == direct["wall_clock_s"]


def test_cli_compare_and_simulate_accept_the_run_dir_folder(run_folders, capsys):
    root, results = run_folders
    assert cli(["compare", str(root / "a"), str(root / "b"), "--scenario", "datacenter"]) == 0
    out = capsys.readouterr().out
    assert out.count("| datacenter |") == 3 and "status.json" not in out
    assert cli(["simulate", str(root / "b"), "--scenario", "datacenter"]) == 0
    out = capsys.readouterr().out
    assert out.count("run b/") == 2


def test_an_incomplete_run_is_left_out_of_its_folder_and_reported(run_folders, tmp_path, capsys):
    root, results = run_folders
    import shutil

    folder = tmp_path / "c"
    shutil.copytree(results[("a", "ddp")].run_dir, folder / "done")
    shutil.copytree(results[("a", "ddp")].run_dir, folder / "failed")
    (folder / "failed" / "status.json").write_text(json.dumps({"complete": False, "real_time_s": 1.0}))
    shutil.copytree(results[("a", "ddp")].run_dir, folder / "running")
    (folder / "running" / "status.json").unlink()
    assert cli(["simulate", str(folder), "--scenario", "datacenter"]) == 0
    err = capsys.readouterr().err
    assert f"{folder / 'failed'}: left out: incomplete: it failed or was interrupted after 3 of 3 steps" in err
    assert f"{folder / 'running'}: left out: no status.json: the run is still going" in err
    assert cli(["simulate", str(folder / "failed"), "--scenario", "datacenter"]) == 0  # named itself: simulated
    captured = capsys.readouterr()
    assert "incomplete" in captured.err and "datacenter" in captured.out


def test_a_folder_with_no_run_says_what_it_holds(tmp_path, capsys):
    with pytest.raises(TraceError, match=rf"{tmp_path}: no run directory in this folder .* "
                                         r"it holds nothing \(it is empty\)"):
        compare({"x": tmp_path}, ["datacenter"])
    (tmp_path / "readme.txt").write_text("hi")
    (tmp_path / "plots").mkdir()
    assert cli(["simulate", str(tmp_path), "--scenario", "datacenter"]) == 2
    assert "it holds plots/, readme.txt" in capsys.readouterr().err
