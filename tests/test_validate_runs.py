"""Calibrating from a recorded run: the run's own collective timings become measurements, then a scenario."""

from __future__ import annotations

import pytest

from exonet import LocalTrainer, Scenario, TraceError, simulate
from exonet.cli import main
from exonet.rundir import create_run, load_run, write_run
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import linear_regressor, synthetic_regression
from exonet.trace import Trace
from exonet.validate import calibrate as cal
from exonet.validate.runs import measurements_from_run, timed_collectives

# the cluster the synthetic run was timed on: 1 Gbit/s NICs, 85% of it left after the protocol, 300 us of host
# cost per message, and a 0.4 s set-up before each group's first collective
TRUE = cal.modelled(efficiency=0.85, message_overhead=300e-6).replace(bandwidth="1 Gbit/s")
SETUP = 0.4


def true_seconds(op: str, nodes: int, nbytes: int) -> float:
    return simulate(cal.burst_trace(op, nodes, nbytes, 1), TRUE).wall_clock_s


def synthetic_run(root, nodes: int = 4) -> str:
    """A run folder whose trace holds blocking collectives timed as the cluster above times them.

    Ranks enter each collective at skewed times on clocks of their own (offset per rank) and all leave at its
    end, so only the last to enter spans the collective's own time. An async all-reduce and a message are
    recorded too (they carry no time of their own).
    """
    t = Trace(nodes)
    clock = [0.0] * nodes
    for i, (op, nbytes) in enumerate([("all_reduce", 1_000_000), ("all_reduce", 4_000_000), ("all_gather", 500_000)]
                                     + [("all_reduce", 4_000_000), ("all_reduce", 16_000_000)] * 3):
        enter = [c + 0.01 * ((r + i) % nodes) for r, c in enumerate(clock)]  # the late rank changes each time
        last = max(enter)
        seconds = true_seconds(op, nodes, nbytes) + (SETUP if i == 0 else 0.0)
        for r in range(nodes):
            t.add_collective(r, op, nbytes, start_s=100.0 * r + enter[r], end_s=100.0 * r + last + seconds)
            t.add_compute(r, 0.05)
            clock[r] = last + seconds + 0.05
    for r in range(nodes):
        cid = t.add_collective(r, "all_reduce", 8_000_000, async_op=True, start_s=100.0 * r + clock[r])
        t.add_wait(r, cid)
    t.add_collective(0, "send", 1000, group=(0, 1), start_s=clock[0], end_s=clock[0] + 1)
    t.add_collective(1, "recv", 1000, group=(0, 1), start_s=101 + clock[1], end_s=102 + clock[1])
    path = create_run(root, "synthetic", {"num_nodes": nodes})
    write_run(path, {"train_loss": [1.0]}, t, True, 1.0)
    return str(path)


def test_timed_collectives_take_the_last_entrants_span_and_leave_async_ones_out(tmp_path):
    _, _, trace = load_run(synthetic_run(tmp_path))
    timed = timed_collectives(trace)
    assert sorted((key, len(times)) for key, times in timed.items()) == [
        (("all_gather", 4, 500_000, False), 1), (("all_reduce", 4, 1_000_000, True), 1),
        (("all_reduce", 4, 4_000_000, False), 4), (("all_reduce", 4, 16_000_000, False), 3)]
    assert timed["all_reduce", 4, 1_000_000, True] == [pytest.approx(true_seconds("all_reduce", 4, 1_000_000) + SETUP)]
    assert timed["all_reduce", 4, 16_000_000, False] == pytest.approx(
        [true_seconds("all_reduce", 4, 16_000_000)] * 3, rel=1e-9)


def test_a_run_calibrates_efficiency_overhead_and_setup(tmp_path):
    measured = measurements_from_run(synthetic_run(tmp_path), "1 Gbit/s")
    assert [(m.case.op, m.case.nbytes, m.first) for m in measured] == [
        ("all_gather", 500_000, False), ("all_reduce", 1_000_000, True), ("all_reduce", 4_000_000, False),
        ("all_reduce", 16_000_000, False)]
    params = cal.fit(measured)
    assert params["efficiency"] == pytest.approx(0.85, abs=3e-3)
    assert params["message_overhead"] == pytest.approx(300e-6, rel=0.05)
    assert params["setup"] == pytest.approx(SETUP, rel=0.01)


def test_validate_run_writes_a_scenario_and_bad_input_is_named(tmp_path, capsys):
    run = synthetic_run(tmp_path)
    out = tmp_path / "mine.toml"
    assert main(["validate", "--calibrate", "--run", run, "--bandwidth", "1 Gbit/s", "--link", "streams=1",
                 "--out", str(out), "--save", str(tmp_path / "m.csv")]) == 0
    assert "4 kinds of blocking collective timed" in capsys.readouterr().out
    fitted = Scenario.load(str(out)).to_dict()["network"]
    assert fitted["efficiency"] == pytest.approx(0.85, abs=3e-3) and "setup" in fitted
    assert len(cal.read_measurements(tmp_path / "m.csv")) == 4
    assert main(["validate", "--run", run]) == 2
    assert "--run needs --bandwidth" in capsys.readouterr().err
    assert main(["validate", "--run", run, "--bandwidth", "1 Gbit/s", "--link", "window=4MiB"]) == 2
    assert "unknown key 'window'" in capsys.readouterr().err
    assert main(["validate", "--run", str(tmp_path / "nowhere"), "--bandwidth", "1 Gbit/s"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_a_real_runs_blocking_all_reduces_become_measurements(tmp_path):
    data = synthetic_regression(n=64)
    LocalTrainer(linear_regressor(), data).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.05), overlap=False), num_nodes=2, max_steps=5, batch_size=4,
        progress=False, run_dir=tmp_path)
    (run,) = tmp_path.iterdir()
    measured = measurements_from_run(run, "10 Gbit/s")
    p = sum(t.numel() for t in linear_regressor().parameters())
    assert [(m.case.op, m.case.nodes, m.case.nbytes, m.first, m.case.repeats) for m in measured] == [
        ("all_reduce", 2, 4 * p, False, 4), ("all_reduce", 2, 4 * p, True, 1)]
    assert all(m.real > 0 for m in measured)


def test_a_run_of_async_collectives_only_says_so(tmp_path):
    data = synthetic_regression(n=64)
    LocalTrainer(linear_regressor(), data).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.05)), num_nodes=2, max_steps=2, batch_size=4, progress=False,
        run_dir=tmp_path)
    (run,) = tmp_path.iterdir()
    with pytest.raises(TraceError, match="no blocking collective timed"):
        measurements_from_run(run, "10 Gbit/s")
