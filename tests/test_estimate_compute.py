"""An estimate's compute: carried by its trace, honoured by ``simulate``, reported per step, checked up front."""

from __future__ import annotations

import json

import pytest

import exonet.estimate
from exonet import Scenario, simulate
from exonet.cli import in_flags, main
from exonet.estimate import estimate, simulate_estimate
from exonet.trace import Trace

SMALL = dict(params=1e6, num_nodes=2, max_steps=3, tokens_per_step=1000, tflops=989, mfu=0.4, layers=2)


def test_simulate_times_an_estimate_by_the_compute_it_was_given_and_says_so(tmp_path):
    """The README's tour: simulate(big.trace, "cross-region") timed compute at the preset's A100 (312 TFLOP/s),
    silently, where the estimate was given 989 TFLOP/s; the CLI used the 989."""
    est = estimate("diloco:H=2", **SMALL)
    assert est.trace.meta["compute"] == {"step_time_s": est.step_time_s, "tflops": 989, "mfu": 0.4}
    sim = simulate(est.trace, "cross-region")
    assert sim.per_node[0].compute_s == pytest.approx(3 * est.step_time_s)
    assert sim.wall_clock_s == pytest.approx(simulate_estimate(est, "cross-region").wall_clock_s)  # as the CLI
    assert any("as the estimate gave it" in c and "989 TFLOP/s" in c and "312 TFLOP/s" in c for c in sim.cautions)
    saved = simulate(Trace.load(est.trace.save(tmp_path / "t.jsonl")), "cross-region")  # it travels with the file
    assert saved.per_node[0].compute_s == pytest.approx(sim.per_node[0].compute_s)

    half = est.trace.scaled(compute=0.5)  # a device twice as fast: the stated compute follows
    assert half.meta["compute"] == {"step_time_s": est.step_time_s / 2, "tflops": 1978, "mfu": 0.4}
    assert simulate(half, "cross-region").per_node[0].compute_s == pytest.approx(1.5 * est.step_time_s)

    device = simulate(est.trace, "cross-region", given_compute=False)  # asked otherwise: the preset's device
    assert device.per_node[0].compute_s == pytest.approx(3 * est.step_time_s * 989 / 312)
    assert any("timed on the device of scenario 'cross-region'" in c for c in device.cautions)


def test_a_scenario_without_a_device_needs_no_word_and_a_recorded_trace_keeps_the_device():
    est = estimate("ddp", **SMALL)
    assert not simulate(est.trace, {"name": "lan", "network": {"bandwidth": "10 Gbit/s"}}).cautions
    recorded = Trace(2, events=[[], []])
    for r in range(2):
        recorded.add_compute(r, 1.0, flops=312e12 * 0.4 * 2)
        recorded.add_step(r)
    assert simulate(recorded, "cross-region").per_node[0].compute_s == pytest.approx(2.0)


@pytest.mark.parametrize(("kwargs", "keyword", "flag"), [
    ({"params": 1.5, "step_time": 1.0}, "params=1.5: 24 transformer-like blocks", "--model-params 1.5: 24"),
    ({"params": 1e6, "model": "exonet.toy:bench_mlp", "step_time": 1.0}, "give params= or model=, not both",
     "give --model-params or --model, not both"),
    ({"params": 1e6, "step_time": 1.0, "tflops": 100}, "give step_time=, or tokens_per_step= with tflops=",
     "give --step-time, or --tokens-per-step with --tflops"),
    ({"params": 1e6, "tokens_per_step": 1000}, "tokens_per_step= needs tflops= (and mfu=)",
     "--tokens-per-step needs --tflops (and --mfu)"),
])
def test_estimate_names_its_keywords_and_the_cli_its_flags(kwargs, keyword, flag):
    with pytest.raises(ValueError) as caught:
        estimate("ddp", num_nodes=2, max_steps=1, **kwargs)
    assert keyword in str(caught.value) and "--" not in str(caught.value)
    assert flag in in_flags(str(caught.value))


def test_the_cli_rewords_a_keyword_error_in_its_flags(capsys):
    assert main(["estimate", "--strategy", "ddp", "--nodes", "2", "--steps", "1", "--scenario", "datacenter",
                 "--model-params", "1.5", "--step-time", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: --model-params 1.5: 24 transformer-like blocks" in err and "params=" not in err


@pytest.mark.parametrize("compute", [["--step-time", "0.25"], ["--tokens-per-step", "1000", "--tflops", "100"]])
def test_estimate_json_carries_one_nodes_compute_per_step(capsys, compute):
    args = ["estimate", "--model-params", "1e6", "--layers", "2", "--strategy", "diloco:H=2", "--nodes", "2",
            "--steps", "4", "--scenario", "datacenter", "--scenario", "cross-region", *compute, "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    step = 0.25 if "--step-time" in compute else 6 * 1e6 * 1000 / (100e12 * 0.4)
    assert report["compute_s_per_step"] == pytest.approx(step)
    assert [row["compute_s_per_step"] for row in report["scenarios"]] == pytest.approx([step, step])


def test_payload_and_wire_per_trainer_have_one_definition(monkeypatch):
    """The projection took the max over ranks where compare and the CLI took the mean over trainers."""
    trace = Trace(2, meta={"servers": 1}, events=[[], [], []])  # two trainers, then the server
    assert (trace.num_nodes, trace.num_ranks) == (2, 3)
    for rank, nbytes in enumerate((100, 300, 5000)):
        trace.add_collective(rank, "send", nbytes, group=(rank, 2) if rank < 2 else (0, 2))
    assert (trace.payload_per_trainer(), trace.payload_per_server()) == (200, 5000)
    assert Trace(1).payload_per_server() is None
    sim = simulate_estimate(estimate("async_diloco:H=2", **SMALL, scenario="datacenter"), "datacenter")
    assert sim.trainers == 2 and sim.wire_per_trainer() == pytest.approx(sum(sim.wire_bytes[:2]) / 2)
    # the summary counts the server apart and says its sends are in the per-trainer levels (they are: cross-region)
    text = simulate_estimate(estimate("async_diloco:H=2", **SMALL, scenario="cross-region"), "cross-region").summary()
    assert ": 2 nodes and 1 server, " in text
    assert [line.split()[0] for line in text.splitlines() if line.endswith("  server")] == ["2"]
    assert "wire bytes per trainer (the servers' sends included): inter-region" in text

    from exonet.strategies import DDPStrategy
    from exonet.study.projection import Scale, project

    monkeypatch.setattr(Trace, "payload_per_trainer", lambda self: 12345.0)
    scale = Scale(params=1e6, steps=2, per_steps=4)
    rows = project({"ddp": DDPStrategy()}, ["datacenter"], nodes=2, scale=scale)
    assert rows[0]["payload_bytes_per_node"] == 12345.0 * 2


HOSTED = '[network]\nbandwidth = "10 Gbit/s"\n[hosts]\ndevices = 8\nbandwidth = "100 GB/s"\n'


def test_estimate_checks_the_scenario_before_it_builds_a_trace(tmp_path, monkeypatch, capsys):
    """--nodes 3 with [hosts] devices = 8 was reported only after the trace was built (about 6 s in)."""
    path = tmp_path / "hosted.toml"
    path.write_text(HOSTED)

    def built(*args, **kwargs):
        raise AssertionError("a trace was built before the scenario was checked")

    monkeypatch.setattr(exonet.estimate, "run_rank", built)
    assert main(["estimate", "--model-params", "1e6", "--strategy", "ddp", "--nodes", "3", "--steps", "2",
                 "--step-time", "1", "--scenario", "datacenter", "--scenario", str(path)]) == 2
    assert "hosted" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hosted"):
        estimate("ddp", params=1e6, num_nodes=3, max_steps=2, step_time=1.0, scenario=Scenario.load(path))


@pytest.mark.parametrize("spec", ["ddp:bucket_cap_mb=1", "diloco:H=2", "demo"])
def test_on_another_device_an_estimate_is_the_one_made_there_without_running_the_strategy(spec, monkeypatch):
    """A projection prices one strategy on three presets' devices: ``on_device`` re-times rank 0's recorded spans
    (every node its own share of tokens) instead of running the strategy on meta tensors again."""
    kw = dict(SMALL, num_nodes=3, tokens_per_step=[1000, 500, 1000])
    first = estimate(spec, **kw)
    before = simulate_estimate(first, "cross-region")
    monkeypatch.setattr(exonet.estimate, "run_rank", lambda *a, **k: pytest.fail("the strategy ran again"))
    moved = first.on_device(312, 0.3).on_device(165, 0.3)  # and on again, from the moved one
    monkeypatch.undo()
    want = estimate(spec, **dict(kw, tflops=165, mfu=0.3))
    assert moved.step_time_s == want.step_time_s and moved.assumptions == want.assumptions
    assert moved.trace.meta == want.trace.meta
    assert moved.trace.events == want.trace.events
    got, made = simulate_estimate(moved, "cross-region"), simulate_estimate(want, "cross-region")
    assert got.wall_clock_s == made.wall_clock_s and got.per_node == made.per_node
    again = simulate_estimate(first, "cross-region")  # the estimate it came from is as it was
    assert again.wall_clock_s == before.wall_clock_s and first.trace.meta["compute"]["tflops"] == 989


def test_an_estimate_given_its_step_time_cannot_be_moved_to_another_device():
    with pytest.raises(ValueError, match="on_device: this estimate cannot be re-timed.*step_time="):
        estimate("ddp", params=1e6, layers=2, num_nodes=2, max_steps=2, step_time=0.1).on_device(312, 0.4)
