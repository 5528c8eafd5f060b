"""A run directory from someone else is opened, never followed: its links cannot make a fit write elsewhere.

Each attack plants a link (or a crafted line) in a copy of a checkpointed run and resumes it, or runs the
writer it targets; the victim file the link points at must keep its bytes, and the fit either refuses,
naming the file, or writes the run's own file safely.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from exonet import LocalTrainer, TraceError
from exonet.files import atomic_file
from exonet.rundir import MetricsLog, read_metrics
from exonet.runtime.checkpoint import LATEST, MAX_UNFINISHED, step_dir, wait_for_room
from exonet.runtime.gymlog import write_gym_csv
from exonet.runtime.runlock import RunLock
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

DATA = synthetic_classification(64, dim=8, classes=4)
KW = dict(num_nodes=2, max_steps=4, batch_size=8, val_size=0, seed=3, progress=False)
SECRET = b"export PATH=/usr/bin\n# the victim's own bytes\n"


def _fit(**kw):
    return LocalTrainer(tiny_mlp(), DATA).fit(DDPStrategy(OptimSpec("adamw", lr=1e-3)), **KW, **kw)


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A run of 4 steps, checkpointed at step 2."""
    root = tmp_path_factory.mktemp("runs")
    _fit(run_dir=root, checkpoint_interval=2)
    (run,) = root.iterdir()
    return run


@pytest.fixture
def run(original, tmp_path) -> Path:
    """A copy of the run, to plant links in."""
    return shutil.copytree(original, tmp_path / "run")


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the run (a ~/.bashrc) that a link in the run points at."""
    file = tmp_path / "home" / ".bashrc"
    file.parent.mkdir()
    file.write_bytes(SECRET)
    return file


def resume(run: Path, **kw):
    return _fit(resume_from=run, checkpoint_interval=2, **kw)


def _plant(link: Path, target: Path) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(target)


# ------------------------------------------------------------ links in the run directory, on resume
@pytest.mark.parametrize("name", ["run.lock", "train.csv", "validation.csv", "metrics.jsonl", "status.json"])
@pytest.mark.parametrize("follow", [False, True])
def test_a_file_the_fit_writes_planted_as_a_link_is_refused_on_resume(run, victim, name, follow):
    """The resumed fit wrote the lock holder's JSON, or the CSV, into the file the link pointed at."""
    link = run / name
    _plant(link, victim)
    with pytest.raises(TraceError, match=rf"^resume_from: {re.escape(str(link))} is a symbolic link "
                                         rf"\(to '{re.escape(str(victim))}'\): a resumed fit writes this file, and "
                                         "exonet never writes through a link"):
        resume(run, follow_symlinks=follow)
    assert victim.read_bytes() == SECRET


def test_a_link_under_checkpoints_is_refused_unless_the_run_is_trusted(run, tmp_path):
    """A node file may live elsewhere in a run the user trusts (follow_symlinks=True); otherwise it is named."""
    step = step_dir(run / "checkpoints", 2)
    elsewhere = shutil.copy(step / "node-1.pt", tmp_path / "node-1.pt")
    _plant(step / "node-1.pt", Path(elsewhere))
    with pytest.raises(TraceError, match=rf"^resume_from: {re.escape(str(step / 'node-1.pt'))} is a symbolic link"):
        resume(run)
    result = resume(run, follow_symlinks=True)
    assert len(result.history["train_loss"]) == 4


def test_follow_symlinks_must_be_a_bool(run):
    with pytest.raises(TypeError, match=r"^fit: follow_symlinks must be True or False, got 'yes'$"):
        resume(run, follow_symlinks="yes")


# ------------------------------------------------------------ the writers themselves (no scan in front)
def test_the_run_lock_is_never_opened_through_a_link(tmp_path, victim):
    """RunLock opens run.lock with O_NOFOLLOW: a fresh run's lock planted as a link is refused too."""
    _plant(tmp_path / "run.lock", victim)
    with pytest.raises(TraceError, match=rf"^{re.escape(str(tmp_path / 'run.lock'))}: is a symbolic link"):
        RunLock(tmp_path)
    assert victim.read_bytes() == SECRET


@pytest.mark.parametrize("name", ["train.csv", "validation.csv"])
def test_the_gym_csvs_are_never_written_through_a_link(tmp_path, victim, name):
    _plant(tmp_path / name, victim)
    with pytest.raises(FileExistsError, match=rf"not a regular file .*: '{re.escape(str(tmp_path / name))}'$"):
        write_gym_csv(tmp_path, {"train_loss": [1.0], "eval": [{"step": 1, "loss": 1.0, "local_loss": 1.0}]}, 16)
    assert victim.read_bytes() == SECRET
    assert (tmp_path / name).is_symlink()


@pytest.mark.parametrize("name", ["metrics.jsonl", "status.json"])
def test_temporary_names_cannot_be_predicted_so_planted_links_catch_nothing(tmp_path, victim, name):
    """``.<name>.tmp-<pid>`` was opened with a plain open(): a link planted for each likely pid redirected the
    write, and the renamed link then carried the appended metrics too. Temporary files are now created
    exclusively under a random name: the planted links stay as they were, unused."""
    pid = os.getpid()
    planted = [tmp_path / f".{name}.tmp-{p}" for p in range(pid - 50, pid + 50)]
    for link in planted:
        link.symlink_to(victim)
    file = tmp_path / name
    if name == "metrics.jsonl":
        history: dict[str, list] = {"train_loss": [0.5], "eval": []}
        log = MetricsLog(file, history)
        log.sync()
        history["train_loss"].append(0.25)
        log.sync()
        log.close()
        assert file.read_text().splitlines() == [
            '{"step": 1, "train_loss": 0.5}', '{"step": 2, "train_loss": 0.25}']
    else:
        with atomic_file(file) as f:
            f.write(b"{}\n")
        assert file.read_bytes() == b"{}\n"
    assert victim.read_bytes() == SECRET
    assert not file.is_symlink() and all(link.is_symlink() for link in planted)


def test_the_metrics_log_never_appends_through_a_link(tmp_path, victim):
    """The live metrics file is reopened for appending with O_NOFOLLOW; a link there is warned about, not used."""
    file = tmp_path / "metrics.jsonl"
    _plant(file, victim)
    log = MetricsLog(file, {"train_loss": [0.5], "eval": []})
    with pytest.warns(UserWarning, match=rf"cannot write {re.escape(str(file))} as the run goes .*not a regular"):
        log.sync()
    assert victim.read_bytes() == SECRET


# ------------------------------------------------------------ what is read back is checked
def _add_eval_line(metrics: Path, entry: dict) -> None:
    """Insert an evaluation line before the closing line, keeping the count right (as a forger would)."""
    lines = metrics.read_text().splitlines()
    body = lines[:-1] + [json.dumps({"step": entry.get("step", 2), "eval": entry})]
    metrics.write_text("\n".join(body + [json.dumps({"end": True, "lines": len(body)})]) + "\n")


def test_a_planted_evaluation_key_is_refused_naming_the_file(run, tmp_path):
    """A key "$(touch PWNED)" in a checkpoint's metrics.jsonl travelled on and ran when bash read the file."""
    metrics = step_dir(run / "checkpoints", 2) / "metrics.jsonl"
    _add_eval_line(metrics, {"step": 2, "loss": 1.0, "$(touch PWNED)": 1})
    lineno = len(metrics.read_text().splitlines()) - 1
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(TraceError, match=rf"^{re.escape(str(metrics))}:{lineno}: bad metrics line \(evaluation key "
                                         r"'\$\(touch PWNED\)' is not an identifier"):
        resume(run)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


@pytest.mark.parametrize("entry, why", [
    ({"step": 2, "loss": "1; rm -rf ~"}, r"'loss' must be a number, got '1; rm -rf ~'"),
    ({"step": 2, "loss": {"nested": 1}}, r"'loss' must be a number"),
    ({"step": "2", "loss": 1.0}, r"an evaluation must be an object with an integer 'step'"),
])
def test_evaluation_values_read_back_are_numbers(tmp_path, entry, why):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"end": True, "lines": 0}) + "\n")
    _add_eval_line(metrics, entry)
    with pytest.raises(TraceError, match=rf"^{re.escape(str(metrics))}:1: bad metrics line \({why}"):
        read_metrics(metrics)


def test_a_training_loss_read_back_is_a_number(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "train_loss": "0.5"}\n{"end": true, "lines": 1}\n')
    with pytest.raises(TraceError, match=r"metrics.jsonl:1: bad metrics line \('train_loss' must be a number"):
        read_metrics(metrics)


def test_a_fifo_in_place_of_the_metrics_is_refused_not_waited_on(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    os.mkfifo(metrics)
    with pytest.raises(TraceError, match=rf"^{re.escape(str(metrics))}: not a regular file"):
        read_metrics(metrics)


@pytest.mark.parametrize("text, why", [
    ("[]", r"expected a JSON object, got list"),
    ('{"num_nodes": 2, "$(id)": 1}', r"key '\$\(id\)' is not an identifier"),
])
def test_config_json_must_be_an_object_of_identifiers(run, text, why):
    """A config.json of [] was read as a config on resume (and failed with an AttributeError)."""
    (run / "config.json").write_text(text)
    with pytest.raises(TraceError, match=rf"^{re.escape(str(run / 'config.json'))}: {why}"):
        resume(run)


# ------------------------------------------------------------ crash leftovers
def test_a_resume_cleans_what_a_killed_fit_left(run, victim):
    """Temporary files of a killed fit (a stale ``.latest.json.tmp-*`` among them) and its unfinished checkpoint
    folders are gone after the next resume; planted temporary links (in a run trusted with follow_symlinks)
    are removed, not followed."""
    checkpoints = run / "checkpoints"
    stale = [checkpoints / ".latest.json.tmp-4242", run / ".status.json.tmp-4242",
             step_dir(checkpoints, 2) / ".node-0.pt.tmp-4242"]
    for file in stale:
        file.write_bytes(b"half")
    links = [run / f".metrics.jsonl.tmp-{pid}" for pid in range(4000, 4100)]
    for link in links:
        link.symlink_to(victim)
    unfinished = step_dir(checkpoints, 4)
    unfinished.mkdir()
    (unfinished / "node-0.pt").write_bytes(b"from the killed fit")
    resume(run, follow_symlinks=True)
    assert [p for p in run.rglob("*") if ".tmp-" in p.name] == []
    assert sorted(p.name for p in checkpoints.iterdir()) == [LATEST, "step-00000002"]
    assert victim.read_bytes() == SECRET


def test_a_run_killed_before_its_first_checkpoint_says_so(run):
    (run / "checkpoints" / LATEST).unlink()
    with pytest.raises(TraceError, match=r"latest.json is missing: the run was stopped before its first checkpoint "
                                         r"was complete \(checkpoint_interval=2: the first is committed after step "
                                         r"2\), so there is nothing to resume: start it again$"):
        resume(run)


def test_a_new_checkpoint_waits_while_the_parent_is_behind(tmp_path):
    """Unfinished checkpoint folders piled up (43 at once) when the parent fell behind; a node now waits."""
    root = tmp_path / "checkpoints"
    for step in range(2, 2 + 2 * MAX_UNFINISHED, 2):  # written by nodes, not committed yet
        step_dir(root, step).mkdir(parents=True)
    beats: list[float] = []
    waiter = threading.Thread(target=wait_for_room, args=(root, 10, lambda: beats.append(time.monotonic())))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and beats  # waiting, and beating for the watchdog meanwhile
    wait_for_room(root, 2, lambda: None)  # a slower node completing an existing one never waits
    (root / LATEST).write_text(json.dumps({"step": 2 * MAX_UNFINISHED, "dir": "x", "run": "r"}))  # committed
    waiter.join(timeout=5)
    assert not waiter.is_alive()
