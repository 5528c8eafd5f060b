"""20 SIGKILLs at random moments, each resume bit-identical or refused with the right message (issue 42).

One run (tests/kill_fit.py: DDP, K = 2, a tiny MLP, 30 steps, a checkpoint every 2 steps, so that checkpoint
writes fill much of its time) is killed and resumed over and over, three ways, in an order and at moments drawn
from a seeded RNG (SEED), so that a failure replays:

- **a node** of an in-process fit, SIGKILLed a random time after the nodes start: the parent ends the fit with
  NodeFailure and keeps the run;
- **the whole fit** (a subprocess in its own session: the fit, its forkserver and its nodes), SIGKILLed as a power
  cut would, a random time after its run directory appears;
- **the whole fit inside a checkpoint write**: the fit kills its session itself between writing its n-th
  ``checkpoints/latest.json`` and renaming it into place.

After each kill the run resumes. A run killed before its first checkpoint was committed must be refused, saying
so, and starts again; every run that reaches its last step (a resume the next kill missed, or the last one) must
end with the model and history of an uninterrupted run, bit for bit. Each resume continues from the checkpoint
the last kill left, so a resume that went wrong anywhere shows in the next run to finish.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from exonet import LocalTrainer, NodeFailure, TraceError
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import tiny_mlp

SEED = 42
KILLS = 20
PLAN = ["node"] * 14 + ["fit"] * 4 + ["commit"] * 2  # shuffled by the seeded RNG
SCRIPT = Path(__file__).with_name("kill_fit.py")
_spec = importlib.util.spec_from_file_location("kill_fit", SCRIPT)
assert _spec is not None and _spec.loader is not None
kill_fit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kill_fit)
REFUSED = r"latest\.json is missing: the run was stopped before its first checkpoint was complete"


def _fit(**place: Any) -> Any:
    """kill_fit.py's fit, in this process."""
    return LocalTrainer(tiny_mlp(), kill_fit.DATA, kill_fit.VAL).fit(
        DDPStrategy(OptimSpec("adamw", lr=3e-3, weight_decay=0.01)), **place, **kill_fit.KW)


def _same(model: dict[str, torch.Tensor], history: dict, want: tuple[dict[str, torch.Tensor], dict]) -> None:
    """The model and history of an uninterrupted run, bit for bit."""
    assert list(model) == list(want[0]) and all(torch.equal(model[k], want[0][k]) for k in model)
    assert json.loads(json.dumps(history)) == want[1]


def _nodes(descendants: Callable[[int], set[int]]) -> set[int]:
    """This process's nodes: the forkserver's children (conftest's node_pids finds none on Python 3.11, where a
    forked node keeps the forkserver's command line)."""
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return set() if server is None else descendants(server)


def _only_run(root: Path) -> Path:
    (run,) = root.iterdir()
    return run


class Killer:
    """Kills and resumes one run at a time, counting what happened."""

    def __init__(self, tmp: Path, rng: random.Random, want: tuple[dict[str, torch.Tensor], dict],
                 node_pids: Callable[[], list[int]], descendants: Callable[[int], set[int]],
                 left_running: Callable[..., list[int]], ceiling_s: float) -> None:
        self.tmp, self.rng, self.want = tmp, rng, want
        self.node_pids, self.descendants, self.left_running, self.ceiling_s = (node_pids, descendants, left_running,
                                                                               ceiling_s)
        self.run: Path | None = None  # the run being killed and resumed; None: start one
        self.seen: Counter[str] = Counter()

    def _fresh(self) -> Path:
        root = self.tmp / f"root-{sum(self.seen.values())}"
        root.mkdir()
        return root

    def prepare(self) -> None:
        """A run killed before its first checkpoint is refused, saying so: then it starts again."""
        if self.run is not None and not (self.run / "checkpoints" / "latest.json").exists():
            with pytest.raises(TraceError, match=REFUSED):
                _fit(resume_from=self.run)
            self.seen["refused"] += 1
            self.run = None

    def finished(self, model: dict[str, torch.Tensor], history: dict) -> None:
        """A run reached its last step: as an uninterrupted run, and (resumed) with no crash leftovers."""
        _same(model, history, self.want)
        if self.run is not None:
            assert [p.name for p in self.run.rglob("*") if ".tmp-" in p.name] == []
        self.seen["finished" if self.run is None else "resumed to the end"] += 1
        self.run = None

    def node(self) -> bool:
        """Fit in this process and SIGKILL one of its nodes a random time after they start; whether it did."""
        delay, victim = self.rng.uniform(0.0, 0.3), self.rng.randrange(2)
        ended, killed = threading.Event(), []

        def kill() -> None:
            deadline = time.monotonic() + self.ceiling_s
            while len(pids := _nodes(self.descendants)) < 2 and not ended.is_set() and time.monotonic() < deadline:
                time.sleep(0.002)
            if not ended.wait(delay) and len(pids) == 2:
                with contextlib.suppress(ProcessLookupError):  # (it has just ended: the kill missed)
                    os.kill(sorted(pids)[victim], signal.SIGKILL)
                    killed.append(True)

        where = self.run or self._fresh()
        thread = threading.Thread(target=kill)
        thread.start()
        try:
            result = _fit(resume_from=where) if self.run is not None else _fit(run_dir=where)
        except NodeFailure as exc:
            assert killed and "SIGKILL" in str(exc), exc
            self.run = self.run or _only_run(where)
            return True
        finally:
            ended.set()
            thread.join()
        self.finished(result.model.state_dict(), result.history)
        return False

    def whole_fit(self, inside_commit: bool) -> bool:
        """Fit in a subprocess and SIGKILL its session: a random time after its run directory appears, or inside
        its n-th commit of latest.json; whether it was killed (else it finished)."""
        out = self.tmp / f"out-{sum(self.seen.values())}"
        where = self.run or self._fresh()
        commit = [str(self.rng.randint(1, 4))] if inside_commit else []
        delay = self.rng.uniform(0.0, 4.0)
        proc = subprocess.Popen([sys.executable, str(SCRIPT), str(where), str(out), *commit],
                                start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if not inside_commit:
                deadline = time.monotonic() + self.ceiling_s
                while not list(where.glob("**/config.json")) and proc.poll() is None:
                    assert time.monotonic() < deadline, "the fit never created its run directory"
                    time.sleep(0.01)
                time.sleep(delay)
                family = self.descendants(proc.pid)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                assert self.left_running(family) == []
            _, err = proc.communicate(timeout=self.ceiling_s)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        self.run = self.run or _only_run(where)
        if proc.returncode == 0:
            self.finished(torch.load(f"{out}.pt"), json.loads(Path(f"{out}.json").read_text()))
            return False
        assert proc.returncode == -signal.SIGKILL, err
        if inside_commit:
            assert [p.name for p in (self.run / "checkpoints").glob(".latest.json.tmp-*")] != [], \
                "killed inside the commit: the new pointer's temporary file is left"
        return True


@pytest.mark.slow
def test_twenty_sigkills_each_resume_bit_identical_or_refused(tmp_path, node_pids, descendants, left_running,
                                                              ceiling_s):
    reference = _fit(run_dir=tmp_path / "reference")
    want = (reference.model.state_dict(), json.loads(json.dumps(reference.history)))
    rng = random.Random(SEED)
    plan = list(PLAN)
    rng.shuffle(plan)
    killer = Killer(tmp_path, rng, want, node_pids, descendants, left_running, ceiling_s)
    kills: Counter[str] = Counter()
    for attempt in range(3 * KILLS):  # a kill that comes after the run's last step finishes it instead
        if sum(kills.values()) == KILLS:
            break
        kind = plan[sum(kills.values())]
        killer.prepare()
        if killer.node() if kind == "node" else killer.whole_fit(kind == "commit"):
            kills[kind] += 1
    else:
        pytest.fail(f"only {sum(kills.values())} of {KILLS} kills landed in {3 * KILLS} fits: {dict(kills)}")
    killer.prepare()
    result = _fit(resume_from=killer.run) if killer.run is not None else _fit(run_dir=killer._fresh())
    killer.finished(result.model.state_dict(), result.history)
    print(f"kills {dict(kills)} in {attempt} fits; {dict(killer.seen)}")
    assert kills == Counter({"node": 14, "fit": 4, "commit": 2}) and killer.seen["resumed to the end"] >= 1
    assert node_pids() == []
