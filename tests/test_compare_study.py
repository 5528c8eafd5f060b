"""The study loop: presets, simulate vs compare, run directories, the CLI, estimate."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from exonet import LocalTrainer, Trace, compare, simulate
from exonet.scenario import Scenario, list_presets
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.study.comparison import time_to_loss
from exonet.toy import synthetic_classification, tiny_mlp


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    result = LocalTrainer(tiny_mlp(), synthetic_classification(256, dim=8, classes=4),
                          synthetic_classification(64, dim=8, classes=4, train=False)).fit(
        DDPStrategy(OptimSpec("adam", lr=0.01)), num_nodes=2, max_steps=6, batch_size=8, val_interval=3, val_size=32,
        progress=False, run_dir=root)
    return result


def small_trace(n: int) -> Trace:
    """Seconds for "measured" presets, FLOPs for presets that name their devices."""
    t = Trace(n)
    for _ in range(3):
        for r in range(n):
            t.add_compute(r, 0.01 * (r + 1), flops=1e12 * (r + 1))
            cid = t.add_collective(r, "all_reduce", 1_000_000, async_op=True)
            t.add_compute(r, 0.005, flops=5e11)
            t.add_wait(r, cid)
            t.add_step(r)
    return t


@pytest.mark.parametrize("name", list_presets())
@pytest.mark.parametrize("n", [1, 3, 8])
def test_every_preset_simulates_a_small_trace(name, n):
    sim = simulate(small_trace(n), name)
    assert sim.wall_clock_s > 0 and len(sim.step_end_times) == 3 and len(sim.per_node) == n
    assert sim.step_end_times == sorted(sim.step_end_times)
    assert sim.scenario_name == Scenario.load(name).name


def test_compare_matches_simulate_on_the_same_trace(tiny_run):
    table = compare({"ddp": tiny_run, "from-dir": tiny_run.run_dir}, ["datacenter", "home-broadband"], target_loss=10.0)
    assert len(table.rows) == 4
    for row in table.rows:
        sim = simulate(tiny_run.trace, row["scenario"])
        assert row["wall_clock_s"] == sim.wall_clock_s
        assert row["wire_bytes_per_node"] == sum(sim.wire_bytes) / 2
        assert row["payload_bytes_per_node"] == tiny_run.payload_bytes(0)
        assert row["time_to_target_s"] == sim.step_end_times[2]  # first evaluation (step 3) is below 10
    md = table.to_markdown()
    assert md.count("\n") == 5 and "home-broadband" in md


def test_to_target_tells_not_reached_from_no_loss_to_judge_by(tiny_run):
    import math

    table = compare({"run": tiny_run, "bare": tiny_run.trace}, ["datacenter"], target_loss=1e-9)
    run, bare = table.rows
    assert run["time_to_target_s"] is None and math.isnan(bare["time_to_target_s"])
    lines = table.to_markdown().splitlines()
    assert "| not reached |" in lines[2] and "| not reached |" not in lines[3] and "| — |" in lines[3]

def test_final_loss_is_one_quantity_for_every_row(tiny_run):
    """A run without evaluations beside one with them: the column held a training mean on one row and a
    validation loss on the other; it follows "to target" and the curves, training loss for both."""
    import dataclasses

    train = tiny_run.history["train_loss"]
    bare = dataclasses.replace(tiny_run, history={"train_loss": train})
    mixed = compare({"evaluated": tiny_run, "not": bare}, ["datacenter"])
    assert mixed.loss == "train"
    assert [r["final_loss"] for r in mixed.rows] == [pytest.approx(sum(train[-10:]) / len(train[-10:]))] * 2
    alone = compare({"evaluated": tiny_run}, ["datacenter"])
    assert alone.loss == "validation" and alone.rows[0]["final_loss"] == tiny_run.history["eval"][-1]["loss"]


def test_compare_takes_a_folder_of_runs_or_a_list_as_well_as_a_mapping(tiny_run):
    from pathlib import Path

    from exonet.study.comparison import run_names

    folder = Path(tiny_run.run_dir).parent
    by_folder, by_list = compare(str(folder), "datacenter"), compare([tiny_run.run_dir], "datacenter")
    assert [r["run"] for r in by_list.rows] == run_names([Path(tiny_run.run_dir)])  # its run name, not its folder
    assert by_list.rows[0]["run"] == Path(tiny_run.run_dir).name.split("-", 2)[2]  # the folder less its start time
    assert len(by_folder.rows) == 1 and by_folder.rows[0]["wall_clock_s"] == by_list.rows[0]["wall_clock_s"]
    with pytest.raises(TypeError, match="compare: runs must map names to runs .* got int"):
        compare(42, "datacenter")

def test_fit_with_scenario_simulates_and_resimulates(tiny_run):
    sim = tiny_run.simulate("cross-region")
    assert sim.loss_vs_time()[-1] == (sim.step_end_times[-1], tiny_run.history["train_loss"][-1])


def test_time_to_loss_uses_evaluations_then_train_loss():
    times = [1.0, 2.0, 3.0, 4.0]
    assert time_to_loss({"eval": [{"step": 2, "loss": 0.9}, {"step": 4, "loss": 0.4}]}, times, 0.5) == 4.0
    assert time_to_loss({"train_loss": [1.0, 0.6, 0.2, 0.1]}, times, 0.5) == 4.0  # smoothed: 1, .8, .6, .475
    assert time_to_loss({"train_loss": [3, 2, 1, 1]}, times, 0.5) is None


def exonet_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exonet", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_simulate_compare_and_scenarios_on_a_run_directory(tiny_run, tmp_path):
    run_dir = str(tiny_run.run_dir)
    out = exonet_cli("simulate", run_dir, "--scenario", "datacenter", "--chrome-trace", str(tmp_path / "t.json"))
    assert out.returncode == 0, out.stderr
    assert f"{simulate(tiny_run.trace, 'datacenter').wall_clock_s:.3f}"[:4] in out.stdout
    assert json.loads((tmp_path / "t.json").read_text())
    out = exonet_cli("compare", f"ddp={run_dir}", "--scenario", "datacenter", "--scenario", "cross-region",
                     "--target-loss", "10", "--plot", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    assert "| ddp | cross-region |" in out.stdout and (tmp_path / "p.png").stat().st_size > 1000
    out = exonet_cli("scenarios")
    assert out.returncode == 0 and all(name in out.stdout for name in list_presets())
    out = exonet_cli("scenarios", "home-broadband")
    assert out.returncode == 0 and "home-broadband" in out.stdout


def test_cli_errors_name_the_problem(tmp_path):
    out = exonet_cli("simulate", str(tmp_path / "missing"), "--scenario", "datacenter")
    assert out.returncode == 2 and "missing" in out.stderr
    out = exonet_cli("scenarios", "home-broadbnd")
    assert out.returncode == 2 and "home-broadband" in out.stderr


def test_estimate_7b_diloco_is_fast_small_and_sends_4P_per_sync():
    code = (
        "import resource, time\n"
        "from exonet.estimate import estimate\n"
        "t = time.perf_counter()\n"
        "e = estimate('diloco:H=500', params=7e9, num_nodes=8, max_steps=10000, step_time=1.0)\n"
        "per_step = e.trace.payload_bytes_per_step(0)\n"
        "syncs = [b for b in per_step if b]\n"
        "print(e.params, len(syncs), set(syncs), time.perf_counter() - t,"
        " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fields = out.stdout.split()
    params, syncs, seconds, maxrss_kib = int(fields[0]), int(fields[1]), float(fields[-2]), int(fields[-1])
    assert abs(params - 7e9) / 7e9 < 1e-3
    assert syncs == 10000 // 500
    assert f"{{{4 * params}}}" in out.stdout
    assert seconds < 30
    assert maxrss_kib < 2 * 1024 * 1024


def test_cli_estimate_states_its_assumptions():
    out = exonet_cli("estimate", "--model-params", "1e9", "--strategy", "diloco:H=100", "--nodes", "4", "--steps",
                     "1000", "--scenario", "cross-region", "--tokens-per-step", "4096", "--tflops", "989",
                     "--mfu", "0.4")
    assert out.returncode == 0, out.stderr
    assert "assumptions:" in out.stdout and "cross-region: simulated wall-clock" in out.stdout


def test_wandb_offline_run_holds_the_loss_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = LocalTrainer(tiny_mlp(), synthetic_classification(128, dim=8, classes=4),
                          synthetic_classification(64, dim=8, classes=4, train=False)).fit(
        DDPStrategy(), num_nodes=2, max_steps=4, batch_size=8, val_interval=2, val_size=16, progress=False,
        run_dir=tmp_path / "runs", scenario="datacenter", wandb_project="exonet-test", wandb_run_name="offline")
    runs = list(tmp_path.rglob("run-*.wandb"))
    assert len(runs) == 1
    wanted = (b"train_loss", b"global_loss", b"drift", b"sim/wall_clock_s")
    deadline = time.monotonic() + 20  # wandb's service process may still be writing the file on a loaded machine
    while not all(w in runs[0].read_bytes() for w in wanted) and time.monotonic() < deadline:
        time.sleep(0.2)
    blob = runs[0].read_bytes()
    assert all(w in blob for w in wanted)
    assert len(result.history["train_loss"]) == 4


def test_compare_keeps_sweep_variants_apart_and_plots_bare_traces(tmp_path):
    base = Scenario.load("datacenter")
    table = compare({"run": small_trace(2)}, [base.replace(bandwidth="1 Gbit/s"), base.replace(bandwidth="10 Mbit/s")])
    assert [r["scenario"] for r in table.rows] == ["datacenter (bandwidth=1 Gbit/s)",
                                                   "datacenter (bandwidth=10 Mbit/s)"]
    assert len(table.results) == 2 and table.rows[0]["wall_clock_s"] < table.rows[1]["wall_clock_s"]
    assert table.plot(tmp_path / "p.png").stat().st_size > 1000


def test_time_to_target_without_evaluations_ignores_one_lucky_batch():
    times = [float(i) for i in range(1, 21)]
    losses = [2.0, 0.9] + [1.8] * 10 + [0.5] * 8
    assert time_to_loss({"train_loss": losses}, times, 1.0) > 2.0


def test_estimate_with_partial_participation_runs_every_rank():
    from exonet.estimate import estimate

    e = estimate("diloco:H=1,participation=0.25", params=1e5, num_nodes=8, max_steps=6, step_time=1.0)
    assert sum(e.trace.payload_bytes(r) for r in range(8)) > 0
    e.trace.validate()


def test_compare_warns_once_per_scenario_where_many_streams_overflow_a_queue():
    """A scenario whose phases overflow a shaped queue with 16 streams (1 MB all-reduces: 500 kB a ring phase
    between 2 nodes, a 10 ms queue at 10 Mbit/s holds 12.5 kB) is named once, whichever runs reach it; the
    ideal scenario is not."""
    base = Scenario.from_dict({"name": "shaped", "network": {"bandwidth": "10 Mbit/s", "queue": "10 ms",
                                                            "streams": 16}})
    with pytest.warns(UserWarning, match="scenario shaped: phases overflow the shaped queue with 16 TCP") as caught:
        ideal = base.replace(name="ideal", queue=None, streams=None)
        compare({"a": small_trace(2), "b": small_trace(2)}, [base, ideal])
    assert sum("overflow" in str(w.message) for w in caught) == 1
    assert not any("scenario ideal" in str(w.message) for w in caught)


def test_a_fit_result_prints_as_one_line_saying_what_ran_and_how_it_ended(tiny_run):
    text = repr(tiny_run)
    assert text.startswith("FitResult(DDPStrategy, K=2, 6 steps, val loss ") and "at step 6" in text
    assert "payload/node" in text and f"run_dir={str(tiny_run.run_dir)!r}" in text and "\n" not in text
    assert len(text) < 160 + len(str(tiny_run.run_dir))  # not every loss and the whole model


def _fake_run(root, folder: str, trace: Trace) -> None:
    """A complete run directory as fit writes it (``<time>-<run name>``), without training."""
    from exonet.rundir import create_run, write_run

    path = create_run(root, "x", {})
    path = path.rename(root / folder)
    write_run(path, {"train_loss": [2.0, 1.5, 1.0]}, trace, True, 0.1)


def test_compare_labels_runs_by_run_name_and_plots_itself(tmp_path):
    """Rows read "runs/20261202-101010-ddp-k2" where the run was named ddp-k2; compare had no plot=."""
    root = tmp_path / "runs"
    for folder in ("20261202-101010-ddp-k2", "20261202-101011-sparta-k2", "20261202-101012-sparta-k2"):
        _fake_run(root, folder, small_trace(2))
    table = compare({"runs": root}, ["datacenter"], plot=tmp_path / "p.png")
    assert [row["run"] for row in table.rows] == ["runs/ddp-k2", "runs/20261202-101011-sparta-k2",
                                                  "runs/20261202-101012-sparta-k2"]  # a shared name: the folders
    assert (tmp_path / "p.png").stat().st_size > 1000
    listed = compare([root / "20261202-101010-ddp-k2", root / "20261202-101011-sparta-k2"], ["datacenter"])
    assert [row["run"] for row in listed.rows] == ["ddp-k2", "sparta-k2"]
    with pytest.raises(ValueError, match=r"compare\(plot=\)"):
        compare({"r": small_trace(2)}, ["datacenter"], plot=tmp_path / "p.png" / "under-a-file.png")
