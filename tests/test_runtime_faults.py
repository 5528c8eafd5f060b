"""Node faults end a fit promptly and name the node; Ctrl-C stops everything; nothing is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from exonet import LocalTrainer, NodeFailure
from exonet.rundir import load_run, run_status
from exonet.runtime.testing import DyingStrategy, FailingModel, SlowEvalModel
from exonet.runtime.watchdog import BEAT, CALL, CALL_ID, SLOTS, Heartbeat, Watchdog
from exonet.strategies import DDPStrategy, Strategy
from exonet.toy import synthetic_classification, tiny_mlp

DATA = synthetic_classification(256, dim=8, classes=4)


def shm_entries() -> set[str]:
    """Shared-memory segments, less multiprocessing's named semaphores: exonet creates none (its nodes
    report through pipes), while other test processes on a shared machine may."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if not n.startswith("sem.mp-")}


def assert_clean(node_pids, run_root: Path, shm_before: set[str]) -> None:
    """No node process, no new shared-memory segment, no temporary file in the run directory."""
    assert node_pids() == []
    assert shm_entries() - shm_before == set()
    assert [p for p in run_root.rglob("*") if ".tmp-" in p.name] == []


def fail(model, strategy=None, **kwargs) -> tuple[NodeFailure, float]:
    t0 = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        LocalTrainer(model, DATA).fit(strategy or DDPStrategy(), **{"num_nodes": 2, "max_steps": 40, "batch_size": 8,
                                                                     "progress": False, **kwargs})
    return info.value, time.monotonic() - t0


@pytest.mark.parametrize("rank", [0, 1])
def test_a_node_raising_names_its_rank_and_traceback(rank, node_pids, tmp_path, ceiling_s):
    shm = shm_entries()
    err, took = fail(FailingModel(fail_rank=rank, fail_step=4, message=f"raised on {rank}"), run_dir=tmp_path)
    assert took < ceiling_s and err.rank == rank
    assert f"raised on {rank}" in str(err) and "Traceback" in str(err)
    assert_clean(node_pids, tmp_path, shm)
    (run,) = tmp_path.iterdir()
    assert run_status(run)["complete"] is False
    _, history, trace = load_run(run)
    assert all(trace.num_steps(r) == len(history["train_loss"]) for r in range(2))


def test_sigkill_in_the_middle_of_a_collective_names_the_rank_and_signal(node_pids, tmp_path, ceiling_s):
    shm = shm_entries()
    err, took = fail(tiny_mlp(), DyingStrategy(kill_rank=1, kill_step=3), run_dir=tmp_path)
    assert took < ceiling_s and err.rank == 1
    assert "SIGKILL" in str(err)
    assert_clean(node_pids, tmp_path, shm)


def test_sigkill_of_a_computing_node_is_blamed_not_its_waiting_peer(node_pids, ceiling_s):
    err, took = fail(FailingModel(fail_rank=0, fail_step=4, how="kill"))
    assert took < ceiling_s and err.rank == 0 and "SIGKILL" in str(err)
    assert node_pids() == []


def test_a_node_that_exits_without_a_word_is_blamed_not_its_peer_whose_connection_reset(node_pids, ceiling_s):
    """os._exit(3) on rank 1 was reported as rank 0's "Connection reset by peer"; rank 1 was never named."""
    err, took = fail(FailingModel(fail_rank=1, fail_step=4, how="exit"))
    assert took < ceiling_s and err.rank == 1 and "exited with code 3 without reporting an error" in str(err)
    assert node_pids() == []


def test_a_hung_node_is_named_within_the_progress_timeout(node_pids, tmp_path, ceiling_s):
    shm = shm_entries()
    err, took = fail(FailingModel(fail_rank=1, fail_step=4, how="hang"), progress_timeout_s=2.0, run_dir=tmp_path)
    assert err.rank == 1
    assert "no progress for" in str(err) and "progress_timeout_s" in str(err)
    assert took < ceiling_s  # named by the 2 s progress timeout, not fit's default of 30 minutes
    assert_clean(node_pids, tmp_path, shm)


class _SendsAlone(Strategy):
    """Rank 0 sends to rank 1 in its first step; nobody receives: every node ends up waiting."""

    def step(self) -> None:
        if self.rank == 0:
            self.comm.send(torch.zeros(4), 1)
        self.optimizer_step()


@pytest.mark.slow
def test_a_stall_says_where_each_node_waits_and_names_the_odd_one_out(node_pids, tmp_path, ceiling_s):
    """An unmatched send named an innocent rank with "mismatched collectives?" and nothing of where
    anyone waited; now each node's call is in the message and the odd one out is named."""
    shm = shm_entries()
    err, took = fail(tiny_mlp(), _SendsAlone(), num_nodes=3, max_steps=2, progress_timeout_s=2.0, run_dir=tmp_path)
    assert err.rank == 0 and took < ceiling_s
    assert ("every node is blocked: rank 0 in send to 1 (call #0); ranks 1, 2 in all_reduce (evaluation or the "
            "final averaging); mismatched calls? rank 0 is the odd one out") in str(err)
    assert_clean(node_pids, tmp_path, shm)


def test_a_long_evaluation_on_rank_0_is_not_a_hang():
    """Rank 0 evaluates for ~1.6 s (longer than the 1.2 s timeout) while rank 1 waits in a collective."""
    result = LocalTrainer(SlowEvalModel(0.2), DATA, DATA).fit(
        DDPStrategy(), num_nodes=2, max_steps=3, batch_size=8, val_interval=2, val_size=32, progress=False,
        progress_timeout_s=1.2)
    assert [e["step"] for e in result.history["eval"]] == [0, 2, 3]


class TestBlameRule:
    """The watchdog's rule on a hand-filled progress array (no processes)."""

    @staticmethod
    def dog(rows: list[tuple[float, bool, bool]], timeout: float = 10.0) -> Watchdog:
        """rows: (seconds since last beat, blocked, started) per rank."""
        array = [0.0, 0.0, 0.0, 0.0, -1.0, -1.0] * len(rows)  # no call, no peer, no number
        dog = Watchdog(array, len(rows), timeout)
        dog.t0 -= 1000  # the run started long ago
        now = time.monotonic()
        for rank, (age, blocked, started) in enumerate(rows):
            array[rank * SLOTS: rank * SLOTS + 3] = [now - age, float(blocked), float(started)]
        return dog

    def test_the_silent_computing_node_is_blamed_not_the_waiting_ones(self):
        failure = self.dog([(30, True, True), (25, False, True), (40, True, True)]).check(set())
        assert failure.rank == 1 and "no progress for 25" in str(failure)

    def test_oldest_of_several_hung_nodes_is_blamed(self):
        assert self.dog([(12, False, True), (20, False, True)]).check(set()).rank == 1

    def test_waiting_on_a_peer_that_still_computes_is_fine(self):
        assert self.dog([(60, True, True), (1, False, True)]).check(set()) is None

    def test_everyone_blocked_past_the_limit_names_the_longest_waiting(self):
        failure = self.dog([(11, True, True), (15, True, True)]).check(set())
        assert failure.rank == 1 and "every node is blocked" in str(failure)

    def test_everyone_blocked_in_one_call_is_said_without_an_odd_one(self):
        dog = self.dog([(11, True, True), (15, True, True)])
        beats = [Heartbeat(dog.array, r) for r in range(2)]
        with beats[0].blocked("wait", -1, 3):
            assert dog._waits_in(0) == "wait (call #3)"
        assert dog.array[CALL] == 0.0 and dog.array[CALL_ID] == -1.0  # restored on the way out
        with beats[0].blocked("all_gather", -1, 2), beats[1].blocked("all_gather", -1, 2):
            for r, age in ((0, 11), (1, 15)):
                dog.array[r * SLOTS + BEAT] = time.monotonic() - age
            failure = dog.check(set())
        assert failure.rank == 1 and "every node is blocked: ranks 0, 1 in all_gather (call #2))" in str(failure)

    def test_start_up_gets_a_larger_allowance(self):
        assert self.dog([(60, False, False), (1, True, True)]).check(set()) is None
        failure = self.dog([(200, False, False), (1, True, True)]).check(set())
        assert failure.rank == 0 and "start-up" in str(failure)

    def test_finished_nodes_are_not_watched(self):
        assert self.dog([(50, False, True), (1, True, True)]).check({0}) is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, *(pytest.param(s, marks=pytest.mark.slow)
                                                for s in (signal.SIGINT, signal.SIGHUP))], ids=lambda s: s.name)
def test_a_signal_stops_every_node_and_saves_an_incomplete_run(sig, running_fit, descendants, left_running,
                                                               ceiling_s):
    """Ctrl-C, ``docker stop``/``timeout`` (SIGTERM) and a closed terminal (SIGHUP) all keep the run so far.

    The test waits for the fit's exit, not for a time: a loaded machine took more than 5 s to get there."""
    proc, run = running_fit

    def streamed() -> int:
        return len((run / "metrics.jsonl").read_text().splitlines()) if (run / "metrics.jsonl").exists() else 0

    deadline = time.monotonic() + ceiling_s  # the parent writes as it goes; a loaded machine may lag the nodes
    while (streamed() < 20 or len(descendants(proc.pid)) < 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert streamed() >= 20, "metrics.jsonl is not written as the run goes"
    family = descendants(proc.pid)
    assert len(family) >= 3  # the forkserver and two nodes (and multiprocessing's resource tracker)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=ceiling_s)
    assert proc.returncode in (-sig, 128 + sig), stderr
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr
    assert left_running(family) == []
    assert run_status(run)["complete"] is False
    _, history, trace = load_run(run)
    assert len(history["train_loss"]) >= 20
    assert all(trace.num_steps(r) == len(history["train_loss"]) for r in range(2))
    trace.validate()
    assert [p for p in run.rglob("*") if ".tmp-" in p.name] == []
    assert not (run / "run.lock").exists()


def test_nodes_of_a_parent_killed_outright_end_though_nobody_reaps_it(running_fit, descendants, left_running):
    """SIGKILL leaves the fit a zombie until its own parent waits for it, and that parent may be reading the fit's
    output pipes, which the nodes hold open: if the nodes waited for the zombie to vanish, both would wait forever
    (a CI run hung so). The nodes take a zombie parent for a dead one and end."""
    proc, _ = running_fit
    family = descendants(proc.pid)
    assert len(family) >= 3  # the forkserver and two nodes
    os.kill(proc.pid, signal.SIGSTOP)  # a parent that hangs: the nodes fill the checkpoint queue and wait for room
    time.sleep(3)
    os.kill(proc.pid, signal.SIGKILL)  # and do not reap it: it stays a zombie while the test runs
    assert left_running(family) == []
    assert proc.poll() is not None


@pytest.mark.slow
def test_ten_concurrent_fits_all_succeed(node_pids):
    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}
    start = threading.Barrier(10)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = LocalTrainer(tiny_mlp(seed=i), DATA).fit(DDPStrategy(), num_nodes=2, max_steps=5,
                                                                   batch_size=8, progress=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == {}
    assert sorted(results) == list(range(10))
    assert all(len(r.history["train_loss"]) == 5 for r in results.values())
    assert node_pids() == []
